//! Fuzz targets: every parser of untrusted input in mlxcel, each a plain function of bytes.
//!
//! A target may see any bytes. The code under test may refuse them with an error; it must never
//! panic, hang, allocate without bound or read outside its input. Each function here returns
//! nothing and panics only where the code under test does. `tests/replay.rs` runs every file of
//! `corpus/<target>/` and `regressions/<target>/` through its target (an ordinary test);
//! `libfuzzer/` wraps each in a `fuzz_target!` for coverage-guided runs (`scripts/fuzz`,
//! docs/reliability.md).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use mlxcel_engine::{Constraint, StopMatcher};
use mlxcel_model::gguf::{GgufFile, dequant};
use mlxcel_model::{
    ChatTemplate, Checkpoint, LoadedModel, ModelConfig, SafetensorsFiles, Tokenizer, convert_gguf,
    expected_modules, prepare_gguf,
};

/// A target: its name (the corpus directory) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("safetensors_index", safetensors_index),
    ("config", config),
    ("tokenizer", tokenizer),
    ("chat_template", chat_template),
    ("http_body", http_body),
    ("stop", stop),
    ("detokenize", detokenize),
    ("gbnf", gbnf),
    ("constraint", constraint),
    ("capacity_env", capacity_env),
    ("slot_file", slot_file),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
}

thread_local! {
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// A fresh empty directory for this input (one per thread, emptied each time).
fn scratch() -> PathBuf {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let dir = s
            .get_or_insert_with(|| tempfile::tempdir().expect("a temporary directory"))
            .path()
            .to_owned();
        for entry in std::fs::read_dir(&dir)
            .expect("the scratch directory")
            .flatten()
        {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
        dir
    })
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write into the scratch directory");
}

/// Splits `data` at the first NUL byte: (before, after).
fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// A GGUF file of arbitrary bytes: the header, metadata and tensor table, every readable tensor
/// dequantized, then the conversion the loader runs and the converted checkpoint opened with its
/// tokenizer and chat template.
pub fn gguf(data: &[u8]) {
    let dir = scratch();
    let path = dir.join("model.gguf");
    write(&path, data);
    if let Ok(file) = GgufFile::open(&path) {
        for info in &file.tensors {
            let _ = info.shape();
            if let Ok(bytes) = file.tensor_data(info) {
                let _ = dequant::dequantize_reference(info.ggml_type, bytes);
            }
        }
    }
    let out = dir.join("converted");
    if convert_gguf(&path, &out).is_ok()
        && let Ok(model) = LoadedModel::open(&out)
    {
        exercise_tokenizer(&model.tokenizer, "Hello, world! ¿Qué tal? 你好 <s>");
        if let Some(template) = &model.chat_template {
            let _ = template.render(&[mlxcel_model::ChatMessage::new("user", "Hi")], true);
        }
        // The loader's path for `-m FILE.gguf`: the weights stay in the file and are converted
        // as they are read; every tensor must come out as `convert_gguf` wrote it.
        let prepared = dir.join("prepared");
        if prepare_gguf(&path, &prepared, "fuzz").is_ok()
            && let Ok(on_demand) = Checkpoint::open(&prepared)
        {
            for written in model.checkpoint.tensors() {
                let read = on_demand.tensor(written.name).map(|t| t.data);
                assert_eq!(read, Some(written.data), "{}", written.name);
            }
        }
    }
}

/// A safetensors file of arbitrary bytes: its header, then every tensor's bytes.
pub fn safetensors(data: &[u8]) {
    let path = scratch().join("model.safetensors");
    write(&path, data);
    if let Ok(files) = SafetensorsFiles::open_files(&[path]) {
        for view in files.iter() {
            let _ = view.data.iter().map(|&b| b as u64).sum::<u64>();
        }
    }
}

/// A `model.safetensors.index.json` of arbitrary bytes beside two small valid shards.
pub fn safetensors_index(data: &[u8]) {
    let dir = scratch();
    for (file, name) in [("a.safetensors", "x"), ("b.safetensors", "y")] {
        write(&dir.join(file), &tiny_safetensors(name));
    }
    write(&dir.join("model.safetensors.index.json"), data);
    if let Ok(files) = SafetensorsFiles::open_dir(&dir) {
        for view in files.iter() {
            let _ = view.data.len();
        }
    }
}

/// A safetensors file holding one f32 tensor of two elements called `name`.
fn tiny_safetensors(name: &str) -> Vec<u8> {
    let header = format!(r#"{{"{name}":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out
}

/// A config.json of arbitrary bytes into a `ModelConfig`, then what the backends derive from it.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = ModelConfig::from_json(Path::new("config.json"), text) {
        let _ = config.describe();
        let _ = config.window();
        let _ = config.q_dim();
        let _ = config.kv_dim();
        let _ = config.rope_periods();
        let _ = config.sliding_window();
        for layer in 0..config.num_hidden_layers.min(4) {
            let _ = config.layer_rope_periods(layer);
        }
        let _ = expected_modules(&config);
    }
}

/// A tokenizer.json of arbitrary bytes (before the first NUL; after it, text to encode).
pub fn tokenizer(data: &[u8]) {
    let (json, sample) = split(data);
    let path = scratch().join("tokenizer.json");
    write(&path, json);
    if let Ok(tokenizer) = Tokenizer::from_file(&path) {
        exercise_tokenizer(&tokenizer, &text(sample));
    }
}

/// Encodes `sample`, decodes it back whole and token by token, and reads the vocabulary's bytes.
fn exercise_tokenizer(tokenizer: &Tokenizer, sample: &str) {
    let _ = tokenizer.token_bytes();
    let _ = tokenizer.vocab_size();
    for (add, parse) in [(true, true), (false, false)] {
        if let Ok(ids) = tokenizer.encode(sample, add, parse) {
            let _ = tokenizer.decode(&ids, false);
            let mut stream = tokenizer.detokenizer(true);
            for &id in &ids {
                let _ = stream.push(id);
            }
            let _ = stream.flush();
        }
    }
}

/// A chat template (before the first NUL) rendered with a JSON context (after it; a default
/// conversation when that is not a JSON object with `messages`).
pub fn chat_template(data: &[u8]) {
    let (source, context) = split(data);
    let Ok(template) = ChatTemplate::new(&text(source), "<s>", "</s>") else {
        return;
    };
    let context: serde_json::Value = serde_json::from_slice(context)
        .ok()
        .filter(|c: &serde_json::Value| c.get("messages").is_some())
        .unwrap_or_else(|| {
            serde_json::json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello", "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
                    ]},
                    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
                ],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                    "type": "object", "properties": {"a": {"type": "integer"}}
                }}}],
                "add_generation_prompt": true,
            })
        });
    let _ = template.render_with(&context);
}

/// A request body for one route: the first byte picks the `POST` route, the rest is the body.
pub fn http_body(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let paths = mlxcel_server::fuzzing::post_paths();
    let path = paths[pick as usize % paths.len()];
    let _ = mlxcel_server::fuzzing::check_request_body(path, body);
}

/// A slot file, as `POST /slots/{id_slot}?action=restore` reads it: refused or parsed into
/// exactly the tokens and floats its header claims.
pub fn slot_file(data: &[u8]) {
    if let Ok((tokens, floats)) = mlxcel_server::fuzzing::parse_slot_file(data) {
        assert!(4 * (tokens + floats) < data.len());
    }
}

/// Stop strings (lines before the first NUL) matched over text pushed in pieces (split at each
/// NUL after it), as the engine pushes each token's text.
pub fn stop(data: &[u8]) {
    let (stops, pieces) = split(data);
    let stops = text(stops);
    let mut matcher = StopMatcher::new(stops.split('\n').filter(|s| !s.is_empty()));
    let mut out = String::new();
    for piece in pieces.split(|&b| b == 0) {
        let scan = matcher.push(&text(piece));
        out.push_str(&scan.text);
        if scan.stopped {
            assert!(matcher.is_stopped());
            return;
        }
    }
    out.push_str(&matcher.finish());
}

/// Token ids (little-endian u16s) decoded by the engine's detokenizing stream over a small
/// byte-level vocabulary (ids past it included): the text must be whole UTF-8, and the same as
/// decoding all the ids at once (special tokens skipped) once the stream is flushed.
pub fn detokenize(data: &[u8]) {
    let tokenizer = tiny_tokenizer();
    let ids: Vec<u32> = data
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) % 300)
        .collect();
    let streamed = mlxcel_engine::fuzzing::decode_stream(tokenizer.clone(), &ids);
    // `vocab_size` copies the vocabulary (the `tokenizers` crate builds it as a map): once.
    let vocab = tokenizer.vocab_size();
    let known: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|&id| (id as usize) < vocab)
        .collect();
    if let Ok(whole) = tokenizer.decode(&known, true) {
        assert_eq!(streamed, whole, "ids {ids:?}");
    }
}

/// A byte-level BPE tokenizer: the 256 bytes, a few merges (multi-byte characters among them)
/// and two special tokens.
pub fn tiny_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let path = dir.path().join("tokenizer.json");
            write(&path, tiny_tokenizer_json().to_string().as_bytes());
            Arc::new(Tokenizer::from_file(&path).expect("the tiny tokenizer loads"))
        })
        .clone()
}

/// The JSON of [`tiny_tokenizer`] (also the `tokenizer` target's seed).
pub fn tiny_tokenizer_json() -> serde_json::Value {
    // GPT-2's printable alphabet for bytes.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut chars = Vec::new();
    let mut next = 256u32;
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        chars.push(char::from_u32(c).expect("a code point"));
    }
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), (i + 2).into());
    }
    // Merges that build each word left to right; multi-byte characters among them, so that one
    // token can be a whole character and a character can span tokens.
    let mut merges = Vec::new();
    let mut id = 258;
    for word in ["hello", "é", "你好", "😀"] {
        let mut prefix = String::new();
        for b in word.bytes() {
            let c = chars[b as usize];
            if !prefix.is_empty() {
                merges.push(format!("{prefix} {c}"));
            }
            prefix.push(c);
            if !vocab.contains_key(&prefix) {
                vocab.insert(prefix.clone(), id.into());
                id += 1;
            }
        }
    }
    serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    })
}

/// A GBNF grammar converted to Lark, and the Lark compiled as a request's grammar would be.
pub fn gbnf(data: &[u8]) {
    if let Ok(lark) = mlxcel_engine::gbnf_to_lark(&text(data)) {
        let _ = mlxcel_engine::fuzzing::compile_constraint(&Constraint::Lark(lark));
    }
}

/// A constraint compiled over a tiny vocabulary: the first byte picks the kind (JSON schema,
/// Lark, regex), the rest is its text.
pub fn constraint(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let constraint = match kind % 3 {
        0 => match serde_json::from_slice(rest) {
            Ok(schema) => Constraint::JsonSchema(schema),
            Err(_) => return,
        },
        1 => Constraint::Lark(text(rest)),
        _ => Constraint::Regex(text(rest)),
    };
    let _ = mlxcel_engine::fuzzing::compile_constraint(&constraint);
}

/// The capacity environment variables (the context capacity, then after the first NUL the server's
/// buckets) as the CLI and the server read them.
pub fn capacity_env(data: &[u8]) {
    let (capacity, buckets) = split(data);
    let (capacity, buckets) = (text(capacity), text(buckets));
    let _ = mlxcel_capacity::parse_context_capacity(&capacity);
    let _ = mlxcel_capacity::parse_context_buckets(&buckets);
    let _ = mlxcel_capacity::CapacityOverrides::from_lookup(|name| match name {
        n if n == mlxcel_capacity::CONTEXT_CAPACITY_ENV => Some(capacity.clone()),
        n if n == mlxcel_capacity::CONTEXT_BUCKETS_ENV => Some(buckets.clone()),
        _ => None,
    });
}
