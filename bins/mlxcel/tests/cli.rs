//! The `mlxcel` binary driven as a user drives it: arguments, environment, stdout, stderr, exit code.
//!
//! Modules: `capacity` (the `mlxcel capacity` planning subcommand).

use std::process::{Command, Output};

/// Runs `mlxcel` with `args` and the given extra environment, with the capacity variables cleared
/// so that the developer's own environment cannot leak into a test.
fn mlxcel(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel"));
    command
        .args(args)
        .env_remove("MLXCEL_XLA_CONTEXT_CAPACITY")
        .env_remove("MLXCEL_XLA_CONTEXT_BUCKETS");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("the mlxcel binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

mod capacity {
    use super::*;

    /// The seed's six acceptance rows through the binary.
    #[test]
    fn seed_table() {
        let rows: &[(&[&str], &str)] = &[
            (
                &["--prompt-tokens", "6"],
                "context capacity 1024 for 6 prompt + up to 1018",
            ),
            (
                &["--prompt-tokens", "6", "-n", "64"],
                "context capacity 256 for 6 prompt + up to 64",
            ),
            (
                &["--prompt-tokens", "553", "-n", "1"],
                "context capacity 1024 for 553 prompt + up to 1",
            ),
            (
                &["--prompt-tokens", "553"],
                "context capacity 2048 for 553 prompt + up to 1495",
            ),
            (
                &["--prompt-tokens", "6", "-n", "2000"],
                "context capacity 2048 for 6 prompt + up to 2000",
            ),
        ];
        for (args, line) in rows {
            let mut full = vec!["capacity"];
            full.extend_from_slice(args);
            let output = mlxcel(&full, &[]);
            assert!(output.status.success(), "{args:?}: {}", stderr(&output));
            assert!(
                stdout(&output).lines().any(|l| l == *line),
                "{args:?}: {}",
                stdout(&output)
            );
        }
    }

    #[test]
    fn pinned_capacity_refuses_with_the_numbers() {
        let output = mlxcel(
            &["capacity", "--prompt-tokens", "553", "-n", "1"],
            &[("MLXCEL_XLA_CONTEXT_CAPACITY", "300")],
        );
        assert!(!output.status.success());
        assert!(
            stderr(&output)
                .contains("effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300"),
            "{}",
            stderr(&output)
        );
        assert!(
            !stdout(&output).contains("context capacity"),
            "{}",
            stdout(&output)
        );
    }

    #[test]
    fn pinned_capacity_prints_no_sizing_line() {
        let output = mlxcel(
            &["capacity", "--prompt-tokens", "6"],
            &[("MLXCEL_XLA_CONTEXT_CAPACITY", "300")],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        assert!(!out.contains("context capacity 300 for"), "{out}");
        assert!(out.contains("pinned context capacity 300"), "{out}");
        assert!(out.contains("up to 294"), "{out}");
    }

    #[test]
    fn bad_environment_names_the_variable() {
        let output = mlxcel(
            &["capacity", "--prompt-tokens", "6"],
            &[("MLXCEL_XLA_CONTEXT_CAPACITY", "-3")],
        );
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("MLXCEL_XLA_CONTEXT_CAPACITY=\"-3\""),
            "{}",
            stderr(&output)
        );
    }

    #[test]
    fn bad_budget_says_what_to_give() {
        let output = mlxcel(&["capacity", "--prompt-tokens", "6", "-n", "-7"], &[]);
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("give -1 (unlimited)"),
            "{}",
            stderr(&output)
        );
    }

    #[test]
    fn buckets_mode_derives_and_routes() {
        let output = mlxcel(
            &["capacity", "--buckets", "--prompt-tokens", "415", "-n", "8"],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        assert!(
            out.contains("capacities=[256, 4096] (derived from window 131072)"),
            "{out}"
        );
        assert!(
            out.contains("bucket 4096 for 415 prompt + up to 8"),
            "{out}"
        );

        let output = mlxcel(
            &[
                "capacity",
                "--buckets",
                "--window",
                "8192",
                "--prompt-tokens",
                "6",
                "-n",
                "64",
            ],
            &[("MLXCEL_XLA_CONTEXT_BUCKETS", "1024,256,256")],
        );
        let out = stdout(&output);
        assert!(
            out.contains("capacities=[256, 1024] (from MLXCEL_XLA_CONTEXT_BUCKETS)"),
            "{out}"
        );
        assert!(out.contains("bucket 256 for 6 prompt + up to 64"), "{out}");
    }

    #[test]
    fn empty_bucket_list_is_an_error() {
        let output = mlxcel(
            &["capacity", "--buckets"],
            &[("MLXCEL_XLA_CONTEXT_BUCKETS", "")],
        );
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("MLXCEL_XLA_CONTEXT_BUCKETS=\"\""),
            "{}",
            stderr(&output)
        );
    }
}
