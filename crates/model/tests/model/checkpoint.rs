//! Checkpoint directories: single and sharded safetensors, dense and quantized modules, and
//! validation errors (missing tensor, wrong shape, dtype, inconsistent quantization).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use mlxcel_model::{Checkpoint, Dtype, ModelConfig, ModelError, expected_modules};
use safetensors::{Dtype as StDtype, View};
use serde_json::{Value, json};

pub(crate) struct T(pub StDtype, pub Vec<usize>, pub Vec<u8>);

impl View for &T {
    fn dtype(&self) -> StDtype {
        self.0
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.2)
    }
    fn data_len(&self) -> usize {
        self.2.len()
    }
}

pub(crate) fn f32s(shape: &[usize]) -> T {
    let n: usize = shape.iter().product();
    T(
        StDtype::F32,
        shape.to_vec(),
        (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect(),
    )
}

fn config(quantization: Option<Value>) -> Value {
    let mut v = json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "max_position_embeddings": 512, "vocab_size": 40, "tie_word_embeddings": false
    });
    if let Some(q) = quantization {
        v["quantization"] = q;
    }
    v
}

/// Dense tensors for every module of `config`; with `quantize`, linears become 4-bit group 32.
pub(crate) fn tensors(config: &ModelConfig, quantize: bool) -> BTreeMap<String, T> {
    let mut out = BTreeMap::new();
    for module in expected_modules(config) {
        use mlxcel_model::ModuleKind::*;
        let name = module.name;
        match module.kind {
            Norm { dim } => {
                out.insert(format!("{name}.weight"), f32s(&[dim]));
            }
            Linear { out: o, inp: i, .. }
            | Embedding {
                vocab: o,
                hidden: i,
            } => {
                if quantize {
                    out.insert(
                        format!("{name}.weight"),
                        T(StDtype::U32, vec![o, i / 8], vec![0x11; o * i / 2]),
                    );
                    out.insert(format!("{name}.scales"), f32s(&[o, i / 32]));
                    out.insert(format!("{name}.biases"), f32s(&[o, i / 32]));
                } else {
                    out.insert(format!("{name}.weight"), f32s(&[o, i]));
                }
            }
        }
    }
    out
}

pub(crate) fn write_dir(dir: &Path, config: &Value, tensors: &BTreeMap<String, T>, shards: usize) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    if shards == 1 {
        safetensors::serialize_to_file(tensors.iter(), None, &dir.join("model.safetensors"))
            .unwrap();
        return;
    }
    let names: Vec<&String> = tensors.keys().collect();
    let mut weight_map = BTreeMap::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(shards)).enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
        let part: Vec<(&String, &T)> = chunk.iter().map(|n| (*n, &tensors[*n])).collect();
        safetensors::serialize_to_file(part, None, &dir.join(&file)).unwrap();
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone());
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

pub(crate) fn parsed(v: &Value) -> ModelConfig {
    ModelConfig::from_json(Path::new("config.json"), &v.to_string()).unwrap()
}

#[test]
fn dense_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let v = config(None);
    write_dir(dir.path(), &v, &tensors(&parsed(&v), false), 1);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let q = ckpt
        .tensor("model.layers.1.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!((q.dtype, q.shape), (Dtype::F32, &[32usize, 64][..]));
    assert_eq!(&q.data[4..8], &1f32.to_le_bytes());
    assert_eq!(ckpt.quantization_of("lm_head"), None);
    assert_eq!(ckpt.tensors().count(), 2 * 9 + 3);
}

#[test]
fn quantized_and_sharded() {
    let dir = tempfile::tempdir().unwrap();
    let v = config(Some(json!({"bits": 4, "group_size": 32})));
    write_dir(dir.path(), &v, &tensors(&parsed(&v), true), 3);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let spec = ckpt
        .quantization_of("model.layers.0.mlp.down_proj")
        .unwrap();
    assert_eq!((spec.bits, spec.group_size), (4, 32));
    let files: std::collections::BTreeSet<_> = ckpt.tensors().map(|t| t.file.to_owned()).collect();
    assert_eq!(files.len(), 3);
}

#[test]
fn validation_errors_name_file_and_tensor() {
    type Edit = fn(&mut BTreeMap<String, T>);
    let cases: [(&str, Option<Value>, Edit, &str); 5] = [
        (
            "missing",
            None,
            |t| {
                t.remove("model.norm.weight");
            },
            "missing tensor `model.norm.weight`",
        ),
        (
            "shape",
            None,
            |t| {
                t.insert("model.layers.0.input_layernorm.weight".into(), f32s(&[63]));
            },
            "tensor `model.layers.0.input_layernorm.weight` has shape [63], expected [64]",
        ),
        (
            "dtype",
            None,
            |t| {
                t.insert(
                    "model.norm.weight".into(),
                    T(StDtype::I32, vec![64], vec![0; 256]),
                );
            },
            "tensor `model.norm.weight` has unsupported dtype I32",
        ),
        (
            "scales without metadata",
            None,
            |t| {
                t.insert("lm_head.scales".into(), f32s(&[40, 2]));
            },
            "module `lm_head`: inconsistent quantization: has `scales` but there is no config.json `quantization`",
        ),
        (
            "packed width",
            Some(json!({"bits": 8, "group_size": 32})),
            |_| {},
            "does not match 8 bits",
        ),
    ];
    for (what, quant, edit, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let v = config(quant.clone());
        let mut t = tensors(&parsed(&v), quant.is_some());
        edit(&mut t);
        write_dir(dir.path(), &v, &t, 1);
        let err = Checkpoint::open(dir.path()).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("model.safetensors"), "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message}");
        assert!(!matches!(err, ModelError::Io { .. }), "{what}");
    }
}

#[test]
fn index_naming_a_missing_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let v = config(None);
    write_dir(dir.path(), &v, &tensors(&parsed(&v), false), 2);
    let index_path = dir.path().join("model.safetensors.index.json");
    let mut index: Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    index["weight_map"]["ghost.weight"] = json!("model-00001-of-00002.safetensors");
    std::fs::write(&index_path, index.to_string()).unwrap();
    let message = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains("missing tensor `ghost.weight`"),
        "{message}"
    );
}

/// An index is untrusted: a shard outside the checkpoint directory (an absolute path, `..`, a
/// subdirectory) is refused before any file is opened (found by the `safetensors_index` fuzz
/// target's review).
#[test]
fn index_naming_a_shard_outside_the_directory_is_refused() {
    for outside in [
        "/etc/passwd",
        "../model-00001-of-00002.safetensors",
        "sub/x.safetensors",
        "",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let v = config(None);
        write_dir(dir.path(), &v, &tensors(&parsed(&v), false), 2);
        let index_path = dir.path().join("model.safetensors.index.json");
        let mut index: Value =
            serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
        index["weight_map"]["model.norm.weight"] = json!(outside);
        std::fs::write(&index_path, index.to_string()).unwrap();
        let message = Checkpoint::open(dir.path()).unwrap_err().to_string();
        assert!(
            message.contains(&format!(
                "`weight_map` puts `model.norm.weight` in `{outside}`, which is not a file name"
            )),
            "{outside}: {message}"
        );
    }
}

#[test]
fn missing_tensor_of_a_sharded_checkpoint_names_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let v = config(None);
    let mut t = tensors(&parsed(&v), false);
    t.remove("model.layers.1.mlp.up_proj.weight");
    write_dir(dir.path(), &v, &t, 2);
    let message = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains(
            "model.safetensors.index.json: missing tensor `model.layers.1.mlp.up_proj.weight`"
        ),
        "{message}"
    );
}

/// Gemma 3's multimodal checkpoints: the text model (`text_config`, weights under
/// `language_model.`) loads; the vision tower and projector are skipped (one warning line).
#[test]
fn gemma3_multimodal_checkpoint_loads_its_text_model() {
    let dir = tempfile::tempdir().unwrap();
    let text = json!({
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "max_position_embeddings": 512, "vocab_size": 40, "sliding_window": 8,
        "model_type": "gemma3_text"
    });
    let v = json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": text, "vision_config": {"hidden_size": 32}, "eos_token_id": [1, 106]
    });
    let config = parsed(&v);
    assert!(config.multimodal && config.sandwich_norms && config.qk_norm);
    assert_eq!(config.eos_token_ids, [1, 106]);
    let mut files = BTreeMap::new();
    for (name, t) in tensors(&config, false) {
        files.insert(format!("language_model.{name}"), t);
    }
    files.insert("vision_tower.encoder.weight".into(), f32s(&[4, 4]));
    files.insert("multi_modal_projector.norm.weight".into(), f32s(&[4]));
    write_dir(dir.path(), &v, &files, 1);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(
        ckpt.tensor("model.layers.1.self_attn.q_norm.weight")
            .is_some()
    );
    assert!(ckpt.tensors().all(|t| t.name.starts_with("model.")));
    assert_eq!(ckpt.tensors().count(), files.len() - 2);
    // Any other multimodal checkpoint is refused naming the field.
    let mut other = config_value_with_vision();
    other["architectures"] = json!(["LlamaForCausalLM"]);
    let message = ModelConfig::from_json(Path::new("config.json"), &other.to_string())
        .unwrap_err()
        .to_string();
    assert!(message.contains("vision_config"), "{message}");
}

fn config_value_with_vision() -> Value {
    let mut v = config(None);
    v["vision_config"] = json!({"hidden_size": 32});
    v
}

/// This process's resident file-backed memory, in bytes (Linux `/proc/self/status`).
fn rss_file() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn a_released_tensor_leaves_resident_memory_and_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = config(None);
    v["vocab_size"] = json!(32768); // an 8 MiB f32 embedding table
    write_dir(dir.path(), &v, &tensors(&parsed(&v), false), 1);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let name = "model.embed_tokens.weight";
    let before: Vec<u8> = ckpt.tensor(name).unwrap().data.to_vec();
    assert_eq!(before.len(), 32768 * 64 * 4);
    let touched = rss_file();
    // SAFETY: no view of the table is read afterwards (`before` is a copy).
    unsafe { ckpt.release_tensor(name) };
    let released = rss_file();
    assert!(
        touched.saturating_sub(released) >= 6 << 20,
        "RssFile {touched} -> {released}: the table's pages stayed resident"
    );
    assert_eq!(ckpt.tensor(name).unwrap().data, &before[..]);
    // Every other tensor is untouched, and releasing a name that is not there does nothing.
    // SAFETY: there is no such tensor, so no view of it.
    unsafe { ckpt.release_tensor("no.such.tensor") };
    let k = ckpt
        .tensor("model.layers.1.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(&k.data[4..8], &1f32.to_le_bytes());
}

/// A config that ties the output projection (or leaves `tie_word_embeddings` to a family default
/// of true, as Gemma's) over a checkpoint that stores its own `lm_head`: the stored projection is
/// used, as transformers does when the two differ and mlx-lm does whenever it finds one. An
/// `lm_head` that is the embedding table's bytes keeps the model tied.
#[test]
fn a_stored_lm_head_unties_a_tied_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = config(None);
    v["architectures"] = json!(["Gemma3ForCausalLM"]);
    v["head_dim"] = json!(16);
    v.as_object_mut().unwrap().remove("tie_word_embeddings");
    assert!(parsed(&v).tie_word_embeddings);
    let mut files = tensors(&parsed(&v), false);
    let mut head = f32s(&[40, 64]);
    head.2.reverse();
    files.insert("lm_head.weight".into(), head);
    write_dir(dir.path(), &v, &files, 1);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(!ckpt.config().tie_word_embeddings);
    // The same bytes as the table: still tied.
    let dir = tempfile::tempdir().unwrap();
    files.insert("lm_head.weight".into(), f32s(&[40, 64]));
    write_dir(dir.path(), &v, &files, 1);
    assert!(
        Checkpoint::open(dir.path())
            .unwrap()
            .config()
            .tie_word_embeddings
    );
}
