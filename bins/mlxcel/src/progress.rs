//! The elapsed time of a wait the user sits through (hashing and preparing a GGUF on its first
//! run, loading a model's weights): one line on stderr, rewritten each half second, once the wait
//! passes [`AFTER`], and only when stderr is a terminal, so that logs and pipes never see it.

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a wait runs before it is shown.
pub const AFTER: Duration = Duration::from_secs(2);

/// How often the line is rewritten.
const TICK: Duration = Duration::from_millis(500);

/// Runs `work`, showing `what` and the seconds it has taken on stderr while it runs past
/// [`AFTER`] (stderr a terminal only). The line is cleared when `work` returns.
pub fn while_waiting<T>(what: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    waiting(what, AFTER, TICK, std::io::stderr(), work)
}

/// [`while_waiting`] with its delays and its writer given.
fn waiting<T, W: Write + Send + 'static>(
    what: &str,
    after: Duration,
    tick: Duration,
    mut writer: W,
    work: impl FnOnce() -> T,
) -> T {
    let (done, finished) = mpsc::channel::<()>();
    let what = what.to_owned();
    let started = Instant::now();
    let ticker = std::thread::spawn(move || {
        if finished.recv_timeout(after) != Err(RecvTimeoutError::Timeout) {
            return;
        }
        loop {
            // The cursor goes back to the line's start, so that a line another part prints
            // meanwhile (`mlxcel: preparing …`) writes over this one instead of after it.
            let _ = write!(
                writer,
                "\r\x1b[K{what} … {} s\r",
                started.elapsed().as_secs()
            );
            let _ = writer.flush();
            if finished.recv_timeout(tick) != Err(RecvTimeoutError::Timeout) {
                break;
            }
        }
        let _ = write!(writer, "\r\x1b[K");
        let _ = writer.flush();
    });
    let output = work();
    // The ticker may have stopped already (a write failed); either way it is done after this.
    let _ = done.send(());
    let _ = ticker.join();
    output
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the ticker wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A wait longer than the threshold shows its name and seconds, and is cleared at the end.
    #[test]
    fn a_long_wait_is_shown_then_cleared() {
        let captured = Captured::default();
        let answer = waiting(
            "loading model",
            Duration::from_millis(20),
            Duration::from_millis(10),
            captured.clone(),
            || {
                std::thread::sleep(Duration::from_millis(200));
                42
            },
        );
        assert_eq!(answer, 42);
        let text = captured.text();
        assert!(
            text.starts_with("\r\x1b[Kloading model … 0 s\r"),
            "{text:?}"
        );
        assert!(text.matches("loading model").count() >= 2, "{text:?}");
        assert!(text.ends_with("\r\x1b[K"), "{text:?}");
    }

    /// A wait shorter than the threshold writes nothing at all.
    #[test]
    fn a_short_wait_is_not_shown() {
        let captured = Captured::default();
        waiting(
            "loading model",
            Duration::from_secs(5),
            Duration::from_millis(10),
            captured.clone(),
            || (),
        );
        assert_eq!(captured.text(), "");
    }
}
