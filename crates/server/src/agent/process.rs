//! Running one command for a tool: output capped (the child's pipe is still drained, so it never
//! blocks on a full pipe), a deadline after which the child's whole process group is killed,
//! optional input on stdin (always closed), and each chunk passed on as it arrives.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What a command did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExecResult {
    /// Its output (stdout, with stderr when combined), capped, `\n[output truncated]` at the cut.
    pub output: String,
    /// Its exit status; -1 when it could not be spawned or was killed by a signal.
    pub exit_code: i32,
    /// Whether the deadline killed it.
    pub timed_out: bool,
}

/// How to run a command.
pub struct RunOptions<'a> {
    /// At most this many bytes of output are kept.
    pub max_output: usize,
    /// The deadline, in seconds.
    pub timeout_secs: u64,
    /// stderr joins stdout (else it is discarded).
    pub combine_stderr: bool,
    /// The working directory (the server's when `None`).
    pub cwd: Option<String>,
    /// Written to stdin before it is closed.
    pub stdin: Option<&'a [u8]>,
    /// Called with each chunk kept; `false` kills the command (the client went away).
    pub on_chunk: Option<&'a mut dyn FnMut(&str) -> bool>,
}

impl std::fmt::Debug for RunOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("max_output", &self.max_output)
            .field("timeout_secs", &self.timeout_secs)
            .finish_non_exhaustive()
    }
}

impl<'a> RunOptions<'a> {
    /// `max_output` bytes, `timeout_secs`, stderr combined, nothing else.
    pub fn new(max_output: usize, timeout_secs: u64) -> Self {
        RunOptions {
            max_output,
            timeout_secs,
            combine_stderr: true,
            cwd: None,
            stdin: None,
            on_chunk: None,
        }
    }
}

/// Kills the process group `pid` leads (the command and anything it started); a group already
/// gone is not an error.
pub fn kill_group(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Runs `args` (the program, searched on `PATH`, then its arguments).
pub fn run(args: &[String], mut opts: RunOptions<'_>) -> ExecResult {
    use std::os::unix::process::CommandExt;
    let mut res = ExecResult {
        exit_code: -1,
        ..Default::default()
    };
    let Some((program, rest)) = args.split_first() else {
        res.output = "failed to spawn process".into();
        return res;
    };
    let (reader, writer) = match std::io::pipe() {
        Ok(pair) => pair,
        Err(_) => {
            res.output = "failed to spawn process".into();
            return res;
        }
    };
    let mut command = Command::new(program);
    command.args(rest).process_group(0).stdin(Stdio::piped());
    if let Some(cwd) = &opts.cwd {
        command.current_dir(cwd);
    }
    let stderr = if opts.combine_stderr {
        match writer.try_clone() {
            Ok(w) => Stdio::from(w),
            Err(_) => Stdio::null(),
        }
    } else {
        Stdio::null()
    };
    command.stdout(writer).stderr(stderr);
    let child = command.spawn();
    // The write ends now live only in the child (and its children): EOF when they all exit.
    drop(command);
    let mut child = match child {
        Ok(child) => child,
        Err(_) => {
            res.output = "failed to spawn process".into();
            return res;
        }
    };
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (done, timed_out) = (done.clone(), timed_out.clone());
        let deadline = Instant::now() + Duration::from_secs(opts.timeout_secs);
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if Instant::now() >= deadline {
                    timed_out.store(true, Ordering::SeqCst);
                    kill_group(pid);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    if let Some(mut stdin) = child.stdin.take() {
        let data = opts.stdin.unwrap_or_default().to_vec();
        // A writer thread: a child that fills its stdout before it reads stdin must not deadlock.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let mut reader = reader;
    let mut output = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if truncated {
            continue;
        }
        let keep = n.min(opts.max_output - output.len());
        output.extend_from_slice(&buf[..keep]);
        if keep < n {
            truncated = true;
        }
        if let Some(on_chunk) = opts.on_chunk.as_mut()
            && keep > 0
            && !on_chunk(&String::from_utf8_lossy(&buf[..keep]))
        {
            kill_group(pid);
            break;
        }
    }
    let status = child.wait();
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    res.exit_code = status.ok().and_then(|s| s.code()).unwrap_or(-1);
    res.output = String::from_utf8_lossy(&output).into_owned();
    res.timed_out = timed_out.load(Ordering::SeqCst);
    if truncated {
        res.output.push_str("\n[output truncated]");
    }
    res
}

/// `argv` as one string a POSIX shell parses back into exactly `argv` (each word single-quoted).
pub fn shell_quote_join(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| format!("'{}'", arg.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn output_exit_code_and_stderr_are_captured() {
        let res = run(
            &sv(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            RunOptions::new(1024, 10),
        );
        assert_eq!(res.exit_code, 3);
        assert!(
            res.output.contains("out\n") && res.output.contains("err\n"),
            "{res:?}"
        );
        assert!(!res.timed_out);
    }

    #[test]
    fn output_is_capped_and_the_pipe_drained() {
        let res = run(
            &sv(&[
                "sh",
                "-c",
                "head -c 200000 /dev/zero | tr '\\0' a; echo done >&2",
            ]),
            RunOptions::new(100, 10),
        );
        assert_eq!(res.exit_code, 0, "{res:?}");
        assert_eq!(
            res.output,
            format!("{}\n[output truncated]", "a".repeat(100))
        );
    }

    #[test]
    fn the_deadline_kills_the_command_and_what_it_started() {
        let start = Instant::now();
        let res = run(
            &sv(&["sh", "-c", "sleep 30 & sleep 30; echo never"]),
            RunOptions::new(1024, 1),
        );
        assert!(res.timed_out, "{res:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
        assert!(!res.output.contains("never"));
    }

    #[test]
    fn stdin_is_written_then_closed() {
        let mut opts = RunOptions::new(1024, 10);
        opts.stdin = Some(b"abc");
        let res = run(&sv(&["cat"]), opts);
        assert_eq!(res.output, "abc");
        let res = run(&sv(&["cat"]), RunOptions::new(1024, 10));
        assert_eq!((res.output.as_str(), res.exit_code), ("", 0));
    }

    #[test]
    fn a_missing_program_is_reported() {
        let res = run(&sv(&["/nonexistent/program"]), RunOptions::new(1024, 10));
        assert_eq!(res.output, "failed to spawn process");
        assert_eq!(res.exit_code, -1);
    }

    #[test]
    fn quoting_survives_a_shell() {
        let argv = sv(&["printf", "%s|", "a b", "it's", "$HOME", ""]);
        let res = run(
            &sv(&["sh", "-c", &shell_quote_join(&argv)]),
            RunOptions::new(1024, 10),
        );
        assert_eq!(res.output, "a b|it's|$HOME||");
    }
}
