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
