//! Cache entries are written beside their destination under a *partial* name, then renamed into
//! place, so a reader sees the whole entry or none of it; [`sweep_partials`] removes what a killed
//! process left behind.
//!
//! A partial name is `<stem>.partial-<host>-<pid>-<n>`: the host and process that write it, and a
//! counter unique within the process. A later writer in the same directory removes the partials of
//! processes of its own host that no longer run (`/proc/<pid>` is gone), so a `kill -9` during a
//! download, a conversion or a compile costs disk space only until the next run writes there. The
//! host in the name keeps a cache shared between machines (or containers, which have their own
//! host names and process ids) from sweeping another machine's live writer.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What every partial name holds between its stem and its owner.
const MARKER: &str = ".partial-";

/// A name for a partial copy of `stem`, unique to this host, process and call.
pub fn partial_name(stem: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{stem}{MARKER}{}-{}-{}",
        host(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the partial files and directories in `dir` whose writer, a process of this host, is
/// no longer running; returns how many it removed. Best effort: an entry it cannot remove is left
/// (it is never read), and without `/proc` (not Linux) nothing is removed.
pub fn sweep_partials(dir: &Path) -> usize {
    if !Path::new("/proc/self").exists() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let here = host();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| owner(n, &here)) else {
            continue;
        };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The process id in a partial `name` written on host `here`; `None` for any other name.
fn owner(name: &str, here: &str) -> Option<u32> {
    let (_, owner) = name.rsplit_once(MARKER)?;
    let mut parts = owner.rsplitn(3, '-');
    let counter = parts.next()?;
    let pid = parts.next()?;
    let host = parts.next()?;
    if host != here || counter.is_empty() || !counter.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// This machine's host name, reduced to `[A-Za-z0-9-]` (anything else becomes `_`); `unknown`
/// where it cannot be read.
fn host() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = name.trim();
    if name.is_empty() {
        return "unknown".to_owned();
    }
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_name_names_its_host_and_process() {
        let name = partial_name("abc.gguf");
        assert!(name.starts_with("abc.gguf.partial-"), "{name}");
        assert_eq!(owner(&name, &host()), Some(std::process::id()));
        assert_eq!(owner(&name, "another-host"), None);
        assert_ne!(partial_name("abc.gguf"), name);
    }

    #[test]
    fn other_names_have_no_owner() {
        for name in [
            "config.json",
            "abc.partial-",
            "abc.partial-host-12",
            "abc.partial-host-x-1",
            "abc.partial-host-12-x",
            "abc.partial-host-12-",
        ] {
            assert_eq!(owner(name, "host"), None, "{name}");
        }
        assert_eq!(owner("abc.partial-my-host-12-3", "my-host"), Some(12));
    }

    #[test]
    fn the_sweep_removes_dead_writers_entries_only() {
        let dir = tempfile::tempdir().unwrap();
        // A process that has exited: its id is not running (until reused, which only delays).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let here = host();
        let dead_dir = dir.path().join(format!("model{MARKER}{here}-{dead}-0"));
        std::fs::create_dir_all(dead_dir.join("inner")).unwrap();
        std::fs::write(dead_dir.join("inner/weights"), b"half").unwrap();
        let dead_file = dir.path().join(format!(".k.vmfb{MARKER}{here}-{dead}-7"));
        std::fs::write(&dead_file, b"half").unwrap();
        let mine = dir.path().join(partial_name("mine"));
        std::fs::write(&mine, b"being written").unwrap();
        let foreign = dir.path().join(format!("x{MARKER}other-host-{dead}-0"));
        std::fs::write(&foreign, b"another machine's").unwrap();
        let finished = dir.path().join("model");
        std::fs::create_dir(&finished).unwrap();
        let removed = sweep_partials(dir.path());
        if !Path::new("/proc/self").exists() {
            assert_eq!(removed, 0);
            return;
        }
        if Path::new("/proc").join(dead.to_string()).exists() {
            return; // the id was reused at once: nothing to check
        }
        assert_eq!(removed, 2);
        assert!(!dead_dir.exists() && !dead_file.exists());
        assert!(mine.exists() && foreign.exists() && finished.exists());
    }
}
