//! The `mlxcel` binary driven as a user drives it: arguments, environment, stdout, stderr, exit code.
//!
//! Modules: `capacity` (the `mlxcel capacity` planning subcommand), `generate` (text generation on
//! the default model, skipped with `MLXCEL_SKIP_MODEL_TESTS=1`), `bench` (llama-bench rows).

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

mod generate {
    use super::*;

    fn skip() -> bool {
        std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
    }

    #[test]
    fn greedy_text_streams_to_stdout_and_statistics_to_stderr() {
        if skip() {
            return;
        }
        let output = mlxcel(
            &[
                "generate",
                "-p",
                "The capital of France is",
                "--no-chat-template",
                "--temp",
                "0",
                "-n",
                "8",
            ],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(stdout(&output), " Paris.\n\nThe answer is:\n");
        let err = stderr(&output);
        assert!(err.contains("prompt: 5 tokens in "), "{err}");
        assert!(err.contains("Generated 8 tokens in "), "{err}");
        assert!(err.contains(" tok/s"), "{err}");
    }

    #[test]
    fn unlimited_budget_says_how_it_resolved() {
        if skip() {
            return;
        }
        let output = mlxcel(
            &[
                "generate", "-p", "Hi", "--temp", "0", "--stop", "\n", "--stop", ".",
            ],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let err = stderr(&output);
        assert!(err.contains("-n -1 resolved to "), "{err}");
        assert!(err.contains("(window 8192 - prompt "), "{err}");
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let output = mlxcel(&["generate", "-p", "x", "--backend", "tpu"], &[]);
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("unknown backend \"tpu\"; choose one of: mlx"),
            "{}",
            stderr(&output)
        );
        let output = mlxcel(&["generate", "-p", "x", "--top-p", "0"], &[]);
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("invalid top_p=0"),
            "{}",
            stderr(&output)
        );
        let output = mlxcel(&["generate", "-p", "x", "-n", "-5"], &[]);
        assert!(
            stderr(&output).contains("give -1 (unlimited)"),
            "{}",
            stderr(&output)
        );
    }

    #[test]
    fn interactive_chat_reads_turns_until_bye() {
        if skip() {
            return;
        }
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlxcel"))
            .args(["generate", "--temp", "0", "-n", "4"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"Hello\\\nthere\n/clear\nWhat is 2+2?\n/bye\nnever read\n")
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let err = stderr(&output);
        assert_eq!(err.matches("Generated 4 tokens").count(), 2, "{err}");
        assert!(err.contains("(conversation cleared)"), "{err}");
    }
}

mod bench {
    use super::*;

    fn skip() -> bool {
        std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
    }

    #[test]
    fn prints_llama_bench_rows() {
        if skip() {
            return;
        }
        let output = mlxcel(
            &["bench", "-p", "8", "-n", "4", "-r", "2", "--streams", "1,2"],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("| model "), "{out}");
        assert!(lines[0].ends_with("|                  t/s |"), "{out}");
        assert_eq!(lines[0].len(), lines[1].len(), "{out}");
        for (line, test) in lines[2..5].iter().zip(["pp8", "tg4", "tg4@2"]) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert_eq!(cells[1], "SmolLM2-135M-Instruct.Q4_1", "{line}");
            assert_eq!(cells[4], "mlx", "{line}");
            assert_eq!(cells[6], test, "{line}");
            let (mean, sd) = cells[7].split_once(" ± ").expect("mean ± sd");
            assert!(mean.parse::<f64>().unwrap() > 0.0, "{line}");
            assert!(sd.parse::<f64>().unwrap() >= 0.0, "{line}");
        }
        assert!(out.contains("GB/s read bandwidth measured now"), "{out}");
    }

    #[test]
    fn int8_activations_are_labelled_and_bad_values_named() {
        if skip() {
            return;
        }
        let output = mlxcel(
            &[
                "bench",
                "-p",
                "4",
                "-n",
                "2",
                "-r",
                "1",
                "--activations",
                "int8",
            ],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        for line in out.lines().skip(2).take(2) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert_eq!(cells[4], "mlx int8", "{line}");
        }
        let output = mlxcel(
            &["bench", "-p", "4", "-n", "0", "--activations", "int4"],
            &[],
        );
        assert!(!output.status.success());
        let err = stderr(&output);
        assert!(
            err.contains("--activations") && err.contains("int4"),
            "{err}"
        );
    }

    #[test]
    fn json_output_and_bad_flags() {
        if skip() {
            return;
        }
        let output = mlxcel(
            &["bench", "-p", "4", "-n", "0", "-r", "1", "-o", "json"],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        assert!(out.trim_start().starts_with('['), "{out}");
        assert!(out.contains("\"test\": \"pp4\""), "{out}");
        assert!(!out.contains("tg"), "{out}");
        // Depth rows: the test named `@ d<D>`, `n_depth` in the JSON, one row per depth.
        let output = mlxcel(
            &[
                "bench", "-p", "4", "-n", "2", "-d", "0,20", "-r", "1", "-u", "8", "-o", "json",
            ],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        for (test, depth) in [("pp4", 0), ("tg2", 0), ("pp4 @ d20", 20), ("tg2 @ d20", 20)] {
            let line = out
                .lines()
                .find(|l| l.contains(&format!("\"test\": \"{test}\"")))
                .unwrap_or_else(|| panic!("no {test} row in {out}"));
            assert!(line.contains(&format!("\"n_depth\": {depth},")), "{line}");
        }
        let output = mlxcel(&["bench", "-r", "0"], &[]);
        assert!(!output.status.success());
        assert!(
            stderr(&output).contains("-r must be at least 1"),
            "{}",
            stderr(&output)
        );
    }
}
