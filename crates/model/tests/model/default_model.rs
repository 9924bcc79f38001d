//! The default model: one pin read by Rust, the script and the docs; and end-to-end checks on the
//! real model (downloaded once through the project's own provisioning, checksummed, cached).
//! Set `MLXCEL_SKIP_MODEL_TESTS=1` to skip the end-to-end tests (e.g. without a package index).

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_model::{DEFAULT_MODEL_PIN, DefaultModel, LoadedModel, Tokenizer, resolve_model};

use crate::fixtures::assert_lossless;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn skip_model_tests() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

#[test]
fn pin_parses() {
    let pin = DefaultModel::pinned();
    assert_eq!(
        pin.requirement(),
        format!("{}=={}", pin.package, pin.version)
    );
    assert!(
        pin.wheel.starts_with(&pin.package.replace('-', "_")) && pin.wheel.contains(&pin.version)
    );
    assert_eq!(pin.wheel_sha256.len(), 64);
    assert_eq!(pin.gguf_sha256.len(), 64);
    assert!(pin.gguf_member.ends_with(".gguf"));
}

#[test]
fn script_reads_the_same_pin() {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/fetch-default-model"))
        .arg("--print-pin")
        .output()
        .expect("run scripts/fetch-default-model");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_script =
        DefaultModel::parse(&String::from_utf8(out.stdout).unwrap()).expect("KEY=value lines");
    assert_eq!(from_script, DefaultModel::pinned());
    assert_eq!(
        DefaultModel::parse(DEFAULT_MODEL_PIN),
        Some(DefaultModel::pinned())
    );
}

#[test]
fn docs_quote_the_pin() {
    let docs = std::fs::read_to_string(repo_root().join("docs/model.md")).expect("docs/model.md");
    let pin = DefaultModel::pinned();
    for value in [&pin.requirement(), &pin.wheel_sha256, &pin.gguf_member] {
        assert!(
            docs.contains(value.as_str()),
            "docs/model.md does not mention {value}"
        );
    }
}

/// The default model (provisioned into the user's cache on first use), or `None` when skipped.
fn default_model_dir() -> Option<PathBuf> {
    if skip_model_tests() {
        eprintln!("skipped: MLXCEL_SKIP_MODEL_TESTS is set");
        return None;
    }
    Some(
        resolve_model(None)
            .expect("provision the default model (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)"),
    )
}

#[test]
fn default_model_tokenizes_the_reference_prompt() {
    let Some(dir) = default_model_dir() else {
        return;
    };
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.encode("The capital of France is", true, true).unwrap(),
        [504, 3575, 282, 4649, 314]
    );
    for text in crate::tokenizer::TRICKY {
        let ids = tok.encode(text, true, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), *text);
        let mut detok = tok.detokenizer(false);
        let mut out = String::new();
        for &id in &ids {
            out.extend(detok.push(id).unwrap());
        }
        out.extend(detok.flush().unwrap());
        assert_eq!(out, *text);
    }
}

#[test]
fn default_model_loads_with_chat_template_and_stop_tokens() {
    let Some(dir) = default_model_dir() else {
        return;
    };
    let model = LoadedModel::open(&dir).unwrap();
    let c = model.config();
    assert_eq!(
        (
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads
        ),
        (30, 576, 9, 3)
    );
    assert_eq!(c.window(), 8192);
    assert_eq!(c.name.as_deref(), Some("SmolLM2-135M-Instruct.Q4_1"));
    assert!(c.tie_word_embeddings);
    assert_eq!(model.eos_token_ids, [2]);
    let prompt = model
        .require_chat_template()
        .unwrap()
        .render(&[mlxcel_model::ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert!(
        prompt.starts_with("<|im_start|>system\n") && prompt.ends_with("<|im_start|>assistant\n")
    );
}

#[test]
fn default_model_conversion_is_exact() {
    let Some(dir) = default_model_dir() else {
        return;
    };
    let gguf = DefaultModel::pinned().gguf_path(&mlxcel_model::cache_dir().unwrap());
    let model = LoadedModel::open(&dir).unwrap();
    let compared = assert_lossless(&gguf, &model.checkpoint);
    assert_eq!(compared, 272);
}

/// `-m` with something that is not a model says what it found and what it expects.
#[test]
fn a_path_that_is_not_a_model_is_described() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, [0x3f, 0x8a, 0x00, 0x12, 0x55]).unwrap();
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, []).unwrap();
    let cases = [
        (garbage, "a file starting with bytes 3f 8a 00 12"),
        (empty, "an empty file"),
        (dir.path().join("missing.gguf"), "no such file or directory"),
        (dir.path().to_owned(), "a directory without config.json"),
    ];
    for (path, found) in cases {
        let err = resolve_model(Some(path.to_str().unwrap()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(found), "{err}");
        assert!(err.contains("expected a checkpoint directory"), "{err}");
    }
}
