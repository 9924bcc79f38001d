//! The `mlxcel-server` binary: flags and their environment twins reach the shared parser, and
//! refusals happen before any model is loaded.

use std::process::{Command, Output};

fn server(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-server"));
    command.args(args).env_remove("LLAMA_API_KEY");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run mlxcel-server")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_names_llama_server_flags_and_their_twins() {
    let output = server(&["--help"], &[]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "--ctx-size",
        "--parallel",
        "--n-predict",
        "--api-key-file",
        "LLAMA_ARG_CTX_SIZE",
        "LLAMA_ARG_N_PARALLEL",
        "LLAMA_API_KEY",
        "--backend",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[test]
fn the_xla_backend_is_accepted_by_flag_and_environment() {
    // `-np 0` is refused after the backend is read and before any model loads, so the server
    // does not start.
    for (args, env) in [
        (&["--backend", "xla", "-np", "0"][..], &[][..]),
        (&["-np", "0"][..], &[("MLXCEL_BACKEND", "xla")][..]),
    ] {
        let output = server(args, env);
        assert!(!output.status.success());
        let err = stderr(&output);
        assert!(err.contains("--parallel"), "{err}");
        assert!(!err.contains("backend"), "{err}");
    }
}

#[test]
fn environment_twins_are_read_and_validated() {
    let output = server(&[], &[("LLAMA_ARG_N_PREDICT", "-5")]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--n-predict -5"),
        "{}",
        stderr(&output)
    );
    let output = server(&["-np", "0"], &[]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--parallel"),
        "{}",
        stderr(&output)
    );
    let output = server(&[], &[("LLAMA_ARG_PORT", "eighty")]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("eighty"), "{}", stderr(&output));
}

/// A llama-server command line (llama.cpp's README flags) starts mlxcel-server: it listens, logs
/// one warning line per option without effect, and gets as far as loading the model.
#[test]
fn a_llama_server_command_line_starts_the_server() {
    let output = server(
        &[
            "-m",
            "/nonexistent/model.gguf",
            "-c",
            "2048",
            "-ngl",
            "99",
            "-fa",
            "on",
            "-np",
            "-1",
            "--host",
            "localhost",
            "--port",
            "0",
            "--jinja",
            "--no-webui",
            "-cb",
            "-ctk",
            "f16",
            "-ctv",
            "f16",
            "--threads-http",
            "4",
            "-b",
            "512",
            "-ub",
            "512",
        ],
        &[],
    );
    let err = stderr(&output);
    assert!(err.contains("listening on"), "{err}");
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let warnings = err.lines().filter(|l| l.contains("ignoring ")).count();
    // --no-webui turns the chat page off and -ctk/-ctv f16 make the KV cache f16: options with
    // effect, no warning.
    assert_eq!(warnings, 7, "one line per no-op option:\n{err}");
    // llama.cpp's quantized cache types are refused at start, naming the flag, rather than
    // ignored.
    let output = server(&["-m", "/nonexistent/model.gguf", "-ctk", "q4_0"], &[]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("--cache-type-k") && err.contains("q4_0") && err.contains("does not store"),
        "{err}"
    );
}

#[test]
fn help_usage_and_version_exit_zero() {
    for flag in ["-h", "--help", "--usage", "--version"] {
        let output = server(&[flag], &[]);
        assert!(output.status.success(), "{flag}");
        assert!(!output.stdout.is_empty(), "{flag}");
    }
    // `-hf` was read as `-h f` and printed the help; it is llama-server's --hf-repo: offline, a
    // repository never fetched is named, and the help is not printed.
    let output = server(&["-hf", "user/model", "--offline"], &[]);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert!(
        stderr(&output).contains("repository user/model: offline"),
        "{}",
        stderr(&output)
    );
}

/// Each `LLAMA_ARG_*` twin is read: a value its flag refuses is refused, naming the flag.
#[test]
fn environment_twins_reach_their_flags() {
    for (var, flag) in [
        ("LLAMA_ARG_THREADS", "--threads"),
        ("LLAMA_ARG_TEMPERATURE", "--temp"),
        ("LLAMA_ARG_TOP_K", "--top-k"),
        ("LLAMA_ARG_TOP_P", "--top-p"),
        ("LLAMA_ARG_MIN_P", "--min-p"),
        ("LLAMA_ARG_REPEAT_PENALTY", "--repeat-penalty"),
        ("LLAMA_ARG_PRESENCE_PENALTY", "--presence-penalty"),
        ("LLAMA_ARG_FREQUENCY_PENALTY", "--frequency-penalty"),
        ("LLAMA_ARG_TIMEOUT", "--timeout"),
        ("LLAMA_ARG_CACHE_RAM", "--cache-ram"),
        ("LLAMA_ARG_CACHE_TYPE_K", "--cache-type-k"),
        ("LLAMA_ARG_CACHE_TYPE_V", "--cache-type-v"),
        ("LLAMA_ARG_SPEC_TYPE", "--spec-type"),
        ("LLAMA_ARG_SPEC_DRAFT_N_MAX", "--spec-draft-n-max"),
        ("LLAMA_ARG_SPEC_DRAFT_N_MIN", "--spec-draft-n-min"),
        ("LLAMA_ARG_SPEC_DRAFT_P_MIN", "--spec-draft-p-min"),
        ("LLAMA_ARG_POOLING", "--pooling"),
        ("LLAMA_ARG_ROPE_SCALING_TYPE", "--rope-scaling"),
        ("LLAMA_ARG_ROPE_SCALE", "--rope-scale"),
        ("LLAMA_ARG_ROPE_FREQ_BASE", "--rope-freq-base"),
        ("LLAMA_ARG_ROPE_FREQ_SCALE", "--rope-freq-scale"),
        ("LLAMA_ARG_YARN_ORIG_CTX", "--yarn-orig-ctx"),
        ("LLAMA_ARG_YARN_EXT_FACTOR", "--yarn-ext-factor"),
        ("LLAMA_ARG_YARN_ATTN_FACTOR", "--yarn-attn-factor"),
        ("LLAMA_ARG_YARN_BETA_SLOW", "--yarn-beta-slow"),
        ("LLAMA_ARG_YARN_BETA_FAST", "--yarn-beta-fast"),
        ("LLAMA_ARG_EMBEDDINGS", "--embedding"),
        ("LLAMA_ARG_RERANKING", "--rerank"),
        ("LLAMA_ARG_HF_REPO", "--hf-repo"),
        ("LLAMA_ARG_SPEC_DRAFT_HF_REPO", "--spec-draft-hf"),
        ("LLAMA_ARG_MODEL_URL", "--model-url"),
        ("LLAMA_ARG_DOCKER_REPO", "--docker-repo"),
        ("LLAMA_ARG_HF_FILE", "--hf-file"),
        ("LLAMA_ARG_ENDPOINT_METRICS", "--metrics"),
        ("LLAMA_ARG_ENDPOINT_PROPS", "--props"),
        ("LLAMA_ARG_ENDPOINT_SLOTS", "--slots"),
        ("LLAMA_ARG_UI", "--webui"),
        ("LLAMA_ARG_HOST", "--host"),
        ("LLAMA_ARG_API_KEY_FILE", "--api-key-file"),
    ] {
        let output = server(&[], &[(var, "not a value!")]);
        assert!(!output.status.success(), "{var}");
        assert!(stderr(&output).contains(flag), "{var}: {}", stderr(&output));
    }
    // llama.cpp's booleans: LLAMA_ARG_ENDPOINT_METRICS=enabled turns metrics on.
    let output = server(
        &["-m", "/nonexistent/model.gguf", "--port", "0"],
        &[
            ("LLAMA_ARG_ENDPOINT_METRICS", "enabled"),
            ("LLAMA_ARG_ALIAS", "smol"),
        ],
    );
    assert!(
        stderr(&output).contains("metrics=true"),
        "{}",
        stderr(&output)
    );
    let output = server(
        &["--port", "0"],
        &[("LLAMA_ARG_MODEL", "/nonexistent/env.gguf")],
    );
    assert!(
        stderr(&output).contains("/nonexistent/env.gguf"),
        "{}",
        stderr(&output)
    );
    // A no-op option's twin is ignored with a warning too.
    let output = server(
        &["-m", "/nonexistent/model.gguf", "--port", "0"],
        &[("LLAMA_ARG_N_GPU_LAYERS", "99")],
    );
    assert!(
        stderr(&output).contains("ignoring LLAMA_ARG_N_GPU_LAYERS=99"),
        "{}",
        stderr(&output)
    );
}

/// The draft model of speculative decoding comes from `-md` or `LLAMA_ARG_SPEC_DRAFT_MODEL`; one
/// that does not exist stops the server with an error naming the path, before it serves.
#[test]
fn a_missing_draft_model_is_refused_at_start() {
    for (args, env) in [
        (&["-md", "/nonexistent/draft"][..], &[][..]),
        (
            &[][..],
            &[("LLAMA_ARG_SPEC_DRAFT_MODEL", "/nonexistent/draft")][..],
        ),
    ] {
        let mut argv = vec!["--port", "0"];
        argv.extend_from_slice(args);
        let output = server(&argv, env);
        assert!(!output.status.success(), "{args:?} {env:?}");
        assert!(
            stderr(&output).contains("/nonexistent/draft"),
            "{args:?} {env:?}: {}",
            stderr(&output)
        );
    }
}
