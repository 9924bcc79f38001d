//! Where a tool's file and command operations run: on the host (paths resolved against the
//! request's working directory), or inside an isolate (a container through `docker|podman exec`,
//! a host through `ssh`), where every operation is a POSIX command (`sh`, `cat`, `wc`, `mkdir`,
//! `dirname`, `find`, `timeout`) built here, as llama-server builds them.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use super::process::{self, ExecResult, RunOptions};
use super::runtime::Transport;

/// Output kept from `git ls-files` or `find`.
pub const LIST_MAX_OUTPUT: usize = 8 * 1024 * 1024;
/// Time budget of one listing.
pub const LIST_TIMEOUT_SECS: u64 = 15;
/// Deadline of the helper commands an isolate runs (stat, cat, mkdir...).
const ISOLATE_EXEC_TIMEOUT_SECS: u64 = 15;
/// Largest file read from an isolate.
const ISOLATE_READ_MAX: usize = 64 * 1024 * 1024;

/// Directories a listing shows but never walks into.
pub const JUNK_DIRS: &[&str] = &[
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
];

/// What a listing returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Files,
    Dirs,
    All,
}

/// One listed entry, `/`-separated and relative to the listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub rel: String,
    pub is_dir: bool,
}

/// A listing.
#[derive(Debug, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    /// Set when the base is not a directory.
    pub err: Option<String>,
    /// Set when the walk ran out of time or met an unreadable directory.
    pub truncated: bool,
}

/// The place a tool call works in.
#[derive(Debug, Clone)]
pub struct ToolsIo {
    /// The working directory (`X-Tool-Cwd`); empty: the server's.
    pub cwd: String,
    /// `None`: the host.
    pub isolate: Option<Transport>,
}

fn home() -> Option<String> {
    std::env::var("HOME").ok().filter(|h| !h.is_empty())
}

/// `path` without `.` and `..` components (a `..` at the root stays at the root).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

impl ToolsIo {
    /// `path` resolved against the working directory. On the host a leading `~` is the home
    /// directory and the result is absolute and normalized; in an isolate a relative path is
    /// joined to the working directory (when there is one) with `/`.
    pub fn resolve(&self, path: &str) -> String {
        if self.isolate.is_some() {
            if self.cwd.is_empty() || path.starts_with('/') {
                return path.to_owned();
            }
            return format!("{}/{path}", self.cwd);
        }
        let expanded = match (path.strip_prefix('~'), home()) {
            (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
                format!("{home}{rest}")
            }
            _ => path.to_owned(),
        };
        let mut full = PathBuf::from(&expanded);
        if !full.is_absolute() {
            let base = if self.cwd.is_empty() {
                match std::env::current_dir() {
                    Ok(dir) => dir,
                    Err(_) => return expanded,
                }
            } else {
                PathBuf::from(&self.cwd)
            };
            full = base.join(full);
        }
        normalize(&full).to_string_lossy().into_owned()
    }

    /// Runs `inner` in the isolate (`needs_stdin`: `-i` for containers, no `-n` for ssh).
    fn isolate_run(
        &self,
        transport: &Transport,
        inner: &[String],
        needs_stdin: bool,
        opts: RunOptions<'_>,
    ) -> ExecResult {
        process::run(&transport.argv(inner, needs_stdin), opts)
    }

    fn exec(
        &self,
        transport: &Transport,
        inner: &[String],
        max: usize,
        combine: bool,
    ) -> ExecResult {
        let mut opts = RunOptions::new(max, ISOLATE_EXEC_TIMEOUT_SECS);
        opts.combine_stderr = combine;
        self.isolate_run(transport, inner, false, opts)
    }

    fn shell_test(&self, transport: &Transport, flag: &str, path: &str) -> bool {
        let res = self.exec(
            transport,
            &sv(&["sh", "-c", &format!("[ {flag} \"$1\" ]"), "_", path]),
            4096,
            true,
        );
        res.exit_code == 0 && !res.timed_out
    }

    pub fn is_directory(&self, path: &str) -> bool {
        match &self.isolate {
            Some(t) => self.shell_test(t, "-d", &self.resolve(path)),
            None => Path::new(&self.resolve(path)).is_dir(),
        }
    }

    pub fn is_regular_file(&self, path: &str) -> bool {
        match &self.isolate {
            Some(t) => self.shell_test(t, "-f", &self.resolve(path)),
            None => Path::new(&self.resolve(path)).is_file(),
        }
    }

    pub fn file_size(&self, path: &str) -> Option<u64> {
        match &self.isolate {
            Some(t) => {
                let res = self.exec(
                    t,
                    &sv(&["sh", "-c", "wc -c < \"$1\"", "_", &self.resolve(path)]),
                    64,
                    true,
                );
                if res.exit_code != 0 || res.timed_out {
                    return None;
                }
                res.output.trim().parse().ok()
            }
            None => std::fs::metadata(self.resolve(path)).ok().map(|m| m.len()),
        }
    }

    pub fn read_file(&self, path: &str) -> Option<Vec<u8>> {
        match &self.isolate {
            Some(t) => {
                let res = self.exec(
                    t,
                    &sv(&["cat", "--", &self.resolve(path)]),
                    ISOLATE_READ_MAX,
                    false,
                );
                (res.exit_code == 0 && !res.timed_out).then(|| res.output.into_bytes())
            }
            None => std::fs::read(self.resolve(path)).ok(),
        }
    }

    pub fn write_file(&self, path: &str, content: &[u8]) -> bool {
        match &self.isolate {
            Some(t) => {
                let inner = sv(&[
                    "sh",
                    "-c",
                    "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"",
                    "_",
                    &self.resolve(path),
                ]);
                let mut opts = RunOptions::new(4096, ISOLATE_EXEC_TIMEOUT_SECS);
                opts.stdin = Some(content);
                let res = self.isolate_run(t, &inner, true, opts);
                res.exit_code == 0 && !res.timed_out
            }
            None => {
                let full = PathBuf::from(self.resolve(path));
                if let Some(parent) = full.parent()
                    && std::fs::create_dir_all(parent).is_err()
                {
                    return false;
                }
                std::fs::write(full, content).is_ok()
            }
        }
    }

    /// Runs a tool's command (in the working directory; inside an isolate under its own
    /// `timeout`, with a 5 s margin before the host kills the client).
    pub fn run(&self, args: &[String], mut opts: RunOptions<'_>) -> ExecResult {
        match &self.isolate {
            None => {
                if !self.cwd.is_empty() {
                    opts.cwd = Some(self.cwd.clone());
                }
                process::run(args, opts)
            }
            Some(t) => {
                let mut inner = sv(&["timeout", &format!("{}s", opts.timeout_secs)]);
                inner.extend_from_slice(args);
                let inner = self.with_cwd(inner);
                opts.timeout_secs += 5;
                self.isolate_run(t, &inner, true, opts)
            }
        }
    }

    /// `inner` run from the working directory (127 when it cannot be entered).
    fn with_cwd(&self, inner: Vec<String>) -> Vec<String> {
        if self.cwd.is_empty() {
            return inner;
        }
        let mut out = sv(&[
            "sh",
            "-c",
            "cd \"$1\" || exit 127; shift; exec \"$@\"",
            "_",
            &self.cwd,
        ]);
        out.extend(inner);
        out
    }

    /// The entries under `base` (already resolved): `max_depth` 0 is unlimited, 1 the direct
    /// children. Files come from `git ls-files` where `base` is in a repository (so `.gitignore`
    /// applies), else from a walk that lists junk directories without entering them.
    pub fn list_entries(&self, base: &str, max_depth: usize, kind: ListKind) -> Listing {
        let mut out = Listing::default();
        if !self.is_directory(base) {
            out.err = Some("path does not exist or is not a directory".into());
            return out;
        }
        let depth_ok = |rel: &str| max_depth == 0 || rel.matches('/').count() < max_depth;
        if kind == ListKind::Files {
            let res = match &self.isolate {
                Some(t) => self.exec(
                    t,
                    &sv(&[
                        "sh",
                        "-c",
                        "cd \"$1\" && git ls-files --cached --others --exclude-standard",
                        "_",
                        base,
                    ]),
                    LIST_MAX_OUTPUT,
                    true,
                ),
                None => process::run(
                    &sv(&[
                        "git",
                        "-C",
                        base,
                        "ls-files",
                        "--cached",
                        "--others",
                        "--exclude-standard",
                    ]),
                    RunOptions::new(LIST_MAX_OUTPUT, LIST_TIMEOUT_SECS),
                ),
            };
            if res.exit_code == 0 && !res.timed_out {
                for line in split_lines(&res.output, false) {
                    if !depth_ok(&line) {
                        continue;
                    }
                    if self.isolate.is_some() || Path::new(base).join(&line).is_file() {
                        out.entries.push(Entry {
                            rel: line,
                            is_dir: false,
                        });
                    }
                }
                return out;
            }
        }
        match &self.isolate {
            Some(t) => {
                for dirs in [true, false] {
                    let wanted = if dirs {
                        kind != ListKind::Files
                    } else {
                        kind != ListKind::Dirs
                    };
                    if wanted {
                        let (rels, truncated) = self.find_entries(t, base, max_depth, dirs);
                        out.truncated |= truncated;
                        out.entries
                            .extend(rels.into_iter().map(|rel| Entry { rel, is_dir: dirs }));
                    }
                }
            }
            None => walk(base, max_depth, kind, &mut out),
        }
        out
    }

    /// One `find` in the isolate (junk directories pruned but printed when directories are
    /// wanted; `-mindepth`/`-maxdepth` so that busybox works too).
    fn find_entries(
        &self,
        transport: &Transport,
        base: &str,
        max_depth: usize,
        dirs: bool,
    ) -> (Vec<String>, bool) {
        let cmd = find_command(max_depth, dirs);
        let res = self.exec(
            transport,
            &sv(&["sh", "-c", &cmd, "_", base]),
            LIST_MAX_OUTPUT,
            true,
        );
        (split_lines(&res.output, true), res.timed_out)
    }
}

/// The shell command of [`ToolsIo::find_entries`].
pub fn find_command(max_depth: usize, dirs: bool) -> String {
    let prune = JUNK_DIRS
        .iter()
        .map(|n| format!("-name {n}"))
        .collect::<Vec<_>>()
        .join(" -o ");
    let mut cmd = "cd \"$1\" && find . -mindepth 1".to_owned();
    if max_depth > 0 {
        cmd.push_str(&format!(" -maxdepth {max_depth}"));
    }
    cmd.push_str(&format!(" \\( {prune} \\) -prune"));
    cmd.push_str(if dirs {
        " -print -o -type d -print"
    } else {
        " -o -type f -print"
    });
    cmd
}

fn split_lines(text: &str, strip_dot_slash: bool) -> Vec<String> {
    text.lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty())
        .map(|l| {
            let l = if strip_dot_slash {
                l.strip_prefix("./").unwrap_or(l)
            } else {
                l
            };
            l.replace('\\', "/")
        })
        .collect()
}

/// The host's walk: depth-first, links never followed, junk directories listed but not entered,
/// stopped after [`LIST_TIMEOUT_SECS`].
fn walk(base: &str, max_depth: usize, kind: ListKind, out: &mut Listing) {
    let deadline = Instant::now() + Duration::from_secs(LIST_TIMEOUT_SECS);
    let mut stack = vec![(PathBuf::from(base), String::new(), 0usize)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        if Instant::now() >= deadline {
            out.truncated = true;
            return;
        }
        let Ok(read) = std::fs::read_dir(&dir) else {
            out.truncated = true;
            continue;
        };
        for entry in read {
            let Ok(entry) = entry else {
                out.truncated = true;
                break;
            };
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() {
                name.clone()
            } else {
                format!("{rel_dir}/{name}")
            };
            // A link to a directory is listed as one but never entered.
            let is_dir = file_type.is_dir() || (file_type.is_symlink() && entry.path().is_dir());
            if is_dir {
                if kind != ListKind::Files {
                    out.entries.push(Entry {
                        rel: rel.clone(),
                        is_dir: true,
                    });
                }
                if JUNK_DIRS.contains(&name.as_str()) || file_type.is_symlink() {
                    continue;
                }
                if max_depth == 0 || depth + 1 < max_depth {
                    stack.push((entry.path(), rel, depth + 1));
                }
            } else if entry.path().is_file() && kind != ListKind::Dirs {
                out.entries.push(Entry { rel, is_dir: false });
            }
        }
    }
}

pub fn sv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_resolve_against_the_cwd_and_normalize() {
        let io = ToolsIo {
            cwd: "/a/b".into(),
            isolate: None,
        };
        assert_eq!(io.resolve("c/./d/../e"), "/a/b/c/e");
        assert_eq!(io.resolve("/x/y"), "/x/y");
        assert_eq!(io.resolve(".."), "/a");
        if let Some(home) = home() {
            assert_eq!(io.resolve("~/z"), format!("{home}/z"));
        }
        assert_eq!(io.resolve("~z"), "/a/b/~z");
    }

    #[test]
    fn the_find_command_prunes_junk_and_caps_depth() {
        let cmd = find_command(2, false);
        assert!(cmd.starts_with(
            "cd \"$1\" && find . -mindepth 1 -maxdepth 2 \\( -name .git -o -name .svn"
        ));
        assert!(cmd.ends_with("-name .vscode \\) -prune -o -type f -print"));
        assert!(find_command(0, true).ends_with("\\) -prune -print -o -type d -print"));
        assert!(!find_command(0, true).contains("maxdepth"));
    }

    #[test]
    fn the_walk_lists_junk_dirs_without_entering_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("build/nested")).unwrap();
        std::fs::write(dir.path().join("build/artifact.txt"), "x").unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/main.cpp"), "x").unwrap();
        let io = ToolsIo {
            cwd: String::new(),
            isolate: None,
        };
        let base = dir.path().to_string_lossy().into_owned();
        let listing = io.list_entries(&base, 0, ListKind::All);
        let mut rels: Vec<_> = listing
            .entries
            .iter()
            .map(|e| (e.rel.as_str(), e.is_dir))
            .collect();
        rels.sort();
        assert_eq!(
            rels,
            [("build", true), ("src", true), ("src/main.cpp", false)]
        );
        let listing = io.list_entries(&format!("{base}/missing"), 0, ListKind::All);
        assert!(listing.err.is_some());
    }
}
