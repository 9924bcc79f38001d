//! The habits people bring from llama-cli, llama-completion, mlx_lm and ollama, driven through
//! the binary: they do what mlxcel's own spellings do (the parse-level equivalence of every alias
//! is in the binary's unit tests, `habits_tests.rs`). Tests that load the default model are
//! skipped with `MLXCEL_SKIP_MODEL_TESTS=1`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn mlxcel_with(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel"));
    command
        .args(args)
        .env_remove("MLXCEL_MODEL")
        .env_remove("MLXCEL_BACKEND")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("the mlxcel binary runs");
    let mut input = child.stdin.take().expect("stdin");
    // A command that does not read its input may exit before it is written.
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("mlxcel finishes")
}

fn mlxcel(args: &[&str]) -> Output {
    mlxcel_with(args, &[], "")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Greedy and exact arithmetic: the same text every run.
const EXACT: &[&str] = &["--temp", "0", "--activations", "f32"];

/// `args`, exact, 8 tokens.
fn with_quick<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend_from_slice(EXACT);
    all.extend_from_slice(&["-n", "8"]);
    all
}

/// `args`, exact.
fn exact<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend_from_slice(EXACT);
    all
}

/// A llama.cpp option mlxcel lacks is an error naming it, exit code 2, before anything loads;
/// `-sys` is never read as `-s ys`.
#[test]
fn missing_options_are_named_not_misparsed() {
    let output = mlxcel(&["generate", "-hf", "user/model", "-p", "x"]);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(
        err.starts_with(
            "error: -hf/-hfr/--hf-repo is not an mlxcel option (in llama.cpp it downloads"
        ),
        "{err}"
    );
    // `serve` fetches with -hf as llama-server; offline, a repository never fetched is named.
    let output = mlxcel(&["serve", "-hf", "user/model", "--offline"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("repository user/model: offline, and nothing of it is cached"),
        "{}",
        stderr(&output)
    );
    let output = mlxcel(&["generate", "-mli"]);
    assert!(
        stderr(&output).contains("end a line with \\ to continue"),
        "{}",
        stderr(&output)
    );
    // A bad value of -sys's neighbour is about the seed only when the seed is given.
    let output = mlxcel(&["generate", "-sys", "x", "-s", "ys"]);
    assert!(
        stderr(&output).contains("'ys' for '--seed"),
        "{}",
        stderr(&output)
    );
}

/// mlx_lm's `--prompt -` reads standard input; with `--max-tokens`, `--system-prompt`, `--seed`,
/// `--top-p` it gives the text mlxcel's spellings give. `-ngl` is accepted with its warning.
#[test]
fn mlx_lm_and_llama_cli_spellings_answer_alike() {
    if skip() {
        return;
    }
    let question = "What is the capital of France?";
    let mlx_lm = mlxcel_with(
        &exact(&[
            "generate",
            "--prompt",
            "-",
            "--max-tokens",
            "12",
            "--system-prompt",
            "Answer in one word.",
            "--seed",
            "1",
            "--top-p",
            "0.9",
        ]),
        &[],
        question,
    );
    assert!(mlx_lm.status.success(), "{}", stderr(&mlx_lm));
    let llama = mlxcel(&exact(&[
        "generate",
        "-p",
        question,
        "-n",
        "12",
        "-sys",
        "Answer in one word.",
        "-s",
        "1",
        "--top-p",
        "0.9",
        "-ngl",
        "99",
    ]));
    assert!(llama.status.success(), "{}", stderr(&llama));
    assert_eq!(stdout(&mlx_lm), stdout(&llama));
    // -sysf reads the same system message from a file.
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("system.txt");
    std::fs::write(&system, "Answer in one word.").unwrap();
    let from_file = mlxcel(&exact(&[
        "generate",
        "-p",
        question,
        "-n",
        "12",
        "-sysf",
        system.to_str().unwrap(),
    ]));
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(stdout(&from_file), stdout(&llama));
    assert!(stdout(&llama).contains("Paris"), "{}", stdout(&llama));
    assert!(
        stderr(&llama).contains("ignoring -ngl/--gpu-layers/--n-gpu-layers 99: no effect here"),
        "{}",
        stderr(&llama)
    );
}

/// llama-completion's `-no-cnv` with `-f FILE` completes the file's text as written: the text of
/// `--no-chat-template -p TEXT`. `-e` reads the file's escapes.
#[test]
fn no_conversation_completes_a_file_as_written() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "The capital of France is").unwrap();
    let file = file.to_str().unwrap();
    let completion = mlxcel(&with_quick(&["generate", "-no-cnv", "-f", file]));
    assert!(completion.status.success(), "{}", stderr(&completion));
    let own = mlxcel(&with_quick(&[
        "generate",
        "--no-chat-template",
        "-p",
        "The capital of France is",
    ]));
    assert_eq!(stdout(&completion), stdout(&own));
    assert!(stdout(&own).starts_with(" Paris"), "{}", stdout(&own));
    // -e reads the escapes: `\x20` is the space.
    let escaped = mlxcel(&with_quick(&[
        "generate",
        "-no-cnv",
        "-e",
        "-p",
        "The capital\\x20of France is",
    ]));
    assert_eq!(stdout(&escaped), stdout(&own), "{}", stderr(&escaped));
    // -no-cnv without a prompt has nothing to complete.
    let output = mlxcel(&["generate", "-no-cnv"]);
    assert!(
        stderr(&output).contains("give -p or -f"),
        "{}",
        stderr(&output)
    );
}

/// `-cnv -p X -st`: the prompt is the first turn of a chat that ends after it, the answer of
/// a one-shot `-p X`; `-c` stops `-n -1` at the context and refuses a budget beyond it.
#[test]
fn conversation_and_context_size() {
    if skip() {
        return;
    }
    let once = mlxcel(&with_quick(&["generate", "-p", "Name a colour."]));
    assert!(once.status.success(), "{}", stderr(&once));
    let chat = mlxcel_with(
        &with_quick(&["generate", "-cnv", "-p", "Name a colour.", "-st"]),
        &[],
        "never read\n",
    );
    assert!(chat.status.success(), "{}", stderr(&chat));
    assert_eq!(stdout(&chat), stdout(&once));
    // Without a prompt, -st reads one turn and leaves; --color paints stderr only.
    let single = mlxcel_with(
        &with_quick(&["generate", "-cnv", "-st", "--color"]),
        &[],
        "Name a colour.\nnever read\n",
    );
    assert!(single.status.success(), "{}", stderr(&single));
    assert_eq!(stdout(&single), stdout(&once));
    assert!(
        stderr(&single).contains("\x1b[32m"),
        "{:?}",
        stderr(&single)
    );

    let output = mlxcel(&[
        "generate", "-p", "Hi", "--temp", "0", "-c", "40", "-n", "-1", "-t", "1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("-n -1 resolved to "), "{err}");
    // A pipe never sees the progress line of a terminal (`progress.rs`).
    assert!(!err.contains('\r') && !err.contains(" … "), "{err:?}");
    assert!(err.contains("(-c 40 - prompt "), "{err}");
    let output = mlxcel(&["generate", "-p", "Hi", "-c", "40", "-n", "100"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("> -c/--ctx-size 40: raise -c or lower -n"),
        "{}",
        stderr(&output)
    );
}

/// ollama's `run MODEL PROMPT` answers as `generate -m MODEL -p PROMPT`; `run default` is the
/// default model; without a prompt it chats.
#[test]
fn run_answers_like_generate() {
    if skip() {
        return;
    }
    let run = mlxcel(&with_quick(&["run", "default", "Name a fruit."]));
    assert!(run.status.success(), "{}", stderr(&run));
    let generate = mlxcel(&with_quick(&["generate", "-p", "Name a fruit."]));
    assert_eq!(stdout(&run), stdout(&generate));
    let chat = mlxcel_with(
        &with_quick(&["run", "default"]),
        &[],
        "Name a fruit.\n/bye\n",
    );
    assert!(chat.status.success(), "{}", stderr(&chat));
    assert_eq!(stdout(&chat), stdout(&generate));
    let output = mlxcel(&["run", "no-such-model", "hi"]);
    assert!(
        stderr(&output).contains("is neither a file, a directory nor a model in the cache"),
        "{}",
        stderr(&output)
    );
}

/// ollama's `show`: the default model's family, parameters, quantization, context and template.
#[test]
fn show_describes_the_default_model() {
    if skip() {
        return;
    }
    let output = mlxcel(&["show"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let out = stdout(&output);
    for line in [
        "family        llama (LlamaForCausalLM)",
        "parameters    134.5M (134515008)",
        "quantization  4 bits, group 32 (model.embed_tokens: 8 bits, group 32)",
        "context       8192 tokens",
        "chat template\n  {% for message in messages %}",
    ] {
        assert!(out.contains(line), "{line}:\n{out}");
    }
    assert_eq!(stdout(&mlxcel(&["show", "default"])), out);
}

/// A cache laid out as mlxcel lays it out: the default model's wheel, GGUF and prepared
/// directory, a GGUF prepared from elsewhere, and a preparation of an older converter.
fn fake_cache(cache: &Path, outside: &Path) -> (String, String) {
    let pin = mlxcel_model::DefaultModel::pinned();
    let gguf = pin.gguf_path(cache);
    std::fs::create_dir_all(gguf.parent().unwrap()).unwrap();
    std::fs::write(&gguf, vec![0u8; 1000]).unwrap();
    std::fs::create_dir_all(cache.join("downloads")).unwrap();
    std::fs::write(pin.wheel_path(cache), vec![0u8; 500]).unwrap();
    let converted = cache
        .join("converted")
        .join(mlxcel_model::CONVERTER_VERSION);
    let prepare = |sha: &str, gguf: &Path| {
        let dir = converted.join(sha);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let pointer = serde_json::json!({
            "gguf": gguf, "size": 1000, "sha256": sha, "scales": {}
        });
        std::fs::write(dir.join("gguf-weights.json"), pointer.to_string()).unwrap();
    };
    prepare(&pin.gguf_sha256, &gguf);
    let mine = outside.join("Mine-7B.Q4_K_M.gguf");
    std::fs::write(&mine, vec![0u8; 3000]).unwrap();
    let sha = "ab".repeat(32);
    prepare(&sha, &mine);
    let memo = converted.join("by-path");
    std::fs::create_dir_all(&memo).unwrap();
    std::fs::write(memo.join("key"), format!("3000 1 {sha}\n")).unwrap();
    let old = cache.join("converted").join("v1").join("cd".repeat(32));
    std::fs::create_dir_all(&old).unwrap();
    let config = serde_json::json!({
        "_name_or_path": "Old-1B", "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5
    });
    std::fs::write(old.join("config.json"), config.to_string()).unwrap();
    (pin.gguf_sha256, sha)
}

/// `list` names every model with its id, size and path; `rm` removes one by name or id, keeps
/// the GGUF outside the cache, and refuses a path outside the cache.
#[test]
fn list_and_rm_keep_to_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (default_sha, mine_sha) = fake_cache(cache.path(), outside.path());
    let env = [("MLXCEL_CACHE_DIR", cache.path().to_str().unwrap())];
    let list = || {
        let output = mlxcel_with(&["list"], &env, "");
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output)
    };
    let out = list();
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(rows[1].starts_with("NAME"), "{out}");
    assert!(
        rows[2].starts_with("SmolLM2-135M-Instruct.Q4_1 (default)"),
        "{out}"
    );
    assert!(rows[2].contains(&default_sha[..12]), "{out}");
    // 1000 + 500 bytes, and the prepared directory's two small files.
    assert!(
        rows[2].contains(" 1.6 kB ") || rows[2].contains(" 1.7 kB "),
        "{out}"
    );
    let mine = rows
        .iter()
        .find(|r| r.starts_with("Mine-7B.Q4_K_M "))
        .expect(&out);
    assert!(
        mine.contains(&mine_sha[..12]) && mine.contains("(reads "),
        "{out}"
    );
    assert!(
        rows.iter().any(|r| r.starts_with("Old-1B (stale)")),
        "{out}"
    );
    // A stale model cannot be run by name: it says how to prepare it again.
    let output = mlxcel_with(&["run", "Old-1B", "hi"], &env, "");
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("was prepared by an older mlxcel"),
        "{}",
        stderr(&output)
    );

    // A file outside the cache is refused, and stays.
    let mine_gguf = outside.path().join("Mine-7B.Q4_K_M.gguf");
    let stray = outside.path().join("notes.txt");
    std::fs::write(&stray, "keep").unwrap();
    let output = mlxcel_with(&["rm", stray.to_str().unwrap()], &env, "");
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("is outside the cache"),
        "{}",
        stderr(&output)
    );
    assert!(stray.exists());
    let output = mlxcel_with(&["rm", "nothing-like-it"], &env, "");
    assert!(stderr(&output).contains("is not a model in the cache"));

    // By name: the prepared directory and its remembered hash go, the GGUF stays.
    let output = mlxcel_with(&["rm", "Mine-7B.Q4_K_M.gguf"], &env, "");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("kept "), "{}", stdout(&output));
    assert!(mine_gguf.exists());
    let converted = cache
        .path()
        .join("converted")
        .join(mlxcel_model::CONVERTER_VERSION);
    assert!(!converted.join(&mine_sha).exists());
    assert!(!converted.join("by-path").join("key").exists());

    // By id prefix: the default model's wheel, GGUF and prepared directory.
    let output = mlxcel_with(&["rm", &default_sha[..8]], &env, "");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!converted.join(&default_sha).exists());
    let pin = mlxcel_model::DefaultModel::pinned();
    assert!(!pin.gguf_path(cache.path()).exists());
    assert!(!pin.wheel_path(cache.path()).exists());
    let out = list();
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("Old-1B (stale)"), "{out}");
}
