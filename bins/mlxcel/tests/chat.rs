//! The interactive chat driven through standard input on the default model: the conversation's
//! KV reused between turns, `/save` and `/load`, and commands refused by name. Skipped with
//! `MLXCEL_SKIP_MODEL_TESTS=1`.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Greedy and exact arithmetic: the same text every run.
const EXACT: &[&str] = &["generate", "--temp", "0", "--activations", "f32"];

fn chat(extra: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(EXACT)
        .args(extra)
        .env_remove("MLXCEL_MODEL")
        .env_remove("MLXCEL_BACKEND")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the mlxcel binary runs");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("stdin is read");
    drop(input);
    let output = child.wait_with_output().expect("mlxcel finishes");
    assert!(output.status.success(), "{}", stderr(&output));
    output
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

/// The `(N reused)` count of each statistics line that has one, in order.
fn reused(err: &str) -> Vec<usize> {
    err.lines()
        .filter_map(|line| line.split_once(" new tokens (")?.1.split_once(" reused)"))
        .map(|(n, _)| n.parse().expect("a count"))
        .collect()
}

/// Turn 2 prefills only itself: its prompt starts with turn 1's prompt and answer token for
/// token (the template renders the answer as it was generated), so the line reports them reused;
/// `-n -1`'s resolution is printed once, not every turn.
#[test]
fn a_second_turn_reuses_the_first() {
    if skip() {
        return;
    }
    let output = chat(&[], "What is the capital of France?\nAnd of Germany?\n");
    let err = stderr(&output);
    let counts = reused(&err);
    assert_eq!(counts.len(), 2, "{err}");
    assert_eq!(counts[0], 0, "{err}");
    // The first turn's prompt and every answer token but the last (the end of turn the
    // template writes itself) are held: more than the first prompt alone.
    let first_prompt: usize = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("prompt: ")?
                .split_once(" tokens,")?
                .0
                .parse()
                .ok()
        })
        .expect("a prompt line");
    assert!(counts[1] > first_prompt, "{err}");
    assert!(!err.contains("differently from how it ran"), "{err}");
    assert_eq!(err.matches("-n -1 resolved to ").count(), 1, "{err}");
    assert_eq!(err.matches("Generated ").count(), 2, "{err}");

    // Without the cache every turn is prefilled whole, and says nothing of reuse.
    let output = chat(&["--cache-ram", "0"], "Hi\n");
    assert!(
        stderr(&output).contains("prompt: ") && reused(&stderr(&output)).is_empty(),
        "{}",
        stderr(&output)
    );
}

/// A conversation saved and loaded into a new chat gives the same next answer (greedy), its
/// loaded turns prefilled once at `/load`, so the next turn reuses them.
#[test]
fn save_then_load_gives_the_same_next_answer() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.json");
    let file = file.to_str().unwrap();
    let question = "And of Germany?\n";
    let first = chat(
        &["-n", "24"],
        &format!("What is the capital of France?\n/save {file}\n{question}"),
    );
    assert!(
        stderr(&first).contains(&format!("(saved 2 messages to {file})")),
        "{}",
        stderr(&first)
    );
    let saved = std::fs::read_to_string(file).unwrap();
    assert!(saved.contains("\"role\": \"assistant\""), "{saved}");

    let second = chat(&["-n", "24"], &format!("/load {file}\n{question}"));
    let err = stderr(&second);
    assert!(
        err.contains(&format!("(loaded 2 messages from {file})")),
        "{err}"
    );
    let answer = stdout(&second);
    assert!(!answer.trim().is_empty(), "{err}");
    assert!(
        stdout(&first).ends_with(&answer),
        "first chat:\n{}\nloaded chat:\n{answer}",
        stdout(&first)
    );
    // The load prefilled the conversation; the turn after it reused it.
    let counts = reused(&err);
    assert_eq!(counts.len(), 2, "{err}");
    assert!(counts[1] > 0, "{err}");
}

/// A line that begins with `/` and names no command is refused by name and not sent to the
/// model; `//` sends a message that begins with a slash.
#[test]
fn unknown_commands_are_refused() {
    if skip() {
        return;
    }
    let output = chat(&["-n", "4"], "/frobnicate now\n/save\n/help\n");
    let err = stderr(&output);
    assert!(
        err.contains("error: unknown command /frobnicate (not sent to the model)"),
        "{err}"
    );
    assert!(err.contains("error: /save needs a file"), "{err}");
    assert!(err.contains("/load FILE"), "{err}");
    assert!(!err.contains("Generated "), "{err}");
    assert_eq!(stdout(&output), "");

    let output = chat(&["-n", "4"], "//frobnicate\n");
    assert_eq!(stderr(&output).matches("Generated 4 tokens").count(), 1);
}
