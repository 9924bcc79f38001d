//! `-hf <user>/<model>[:quant]`: a repository of the Hugging Face Hub (or a mirror at
//! `MODEL_ENDPOINT`/`HF_ENDPOINT`) resolved to its files, and the ones to load fetched into the
//! Hub's own cache layout, shared with llama.cpp and Hugging Face's tools:
//! `<cache>/models--<user>--<model>/{refs/<branch>, blobs/<sha256>, snapshots/<commit>/<path>}`
//! (the snapshot entry a relative symbolic link to its blob). Offline, or when the Hub cannot be
//! reached, the files of the cached snapshot are used instead.

use std::path::{Component, Path, PathBuf};

use super::env::Env;
use super::error::DownloadError;
use super::file::{FetchOptions, fetch};
use super::names::{best_model, is_valid_repo_id, split_parts};
use super::transport::{Transport, get_json};

/// The Hub's base URL, with a trailing `/`: `MODEL_ENDPOINT`, else `HF_ENDPOINT`, else
/// `https://huggingface.co/`.
pub fn endpoint(env: &Env) -> String {
    let mut base = env
        .get("MODEL_ENDPOINT")
        .or_else(|| env.get("HF_ENDPOINT"))
        .unwrap_or_else(|| "https://huggingface.co/".to_owned());
    if !base.ends_with('/') {
        base.push('/');
    }
    base
}

/// The Hub cache: `LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`,
/// `XDG_CACHE_HOME/huggingface/hub`, `HOME/.cache/huggingface/hub`, the first that is set.
pub fn cache_dir(env: &Env) -> Result<PathBuf, DownloadError> {
    for (var, below) in [
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
        ("HOME", ".cache/huggingface/hub"),
    ] {
        if let Some(base) = env.get(var) {
            return Ok(PathBuf::from(base).join(below));
        }
    }
    Err(DownloadError::NoCacheDir)
}

/// One file of a repository at a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// Its path in the repository.
    pub path: String,
    /// Its URL at the commit.
    pub url: String,
    /// Where the snapshot shows it.
    pub snapshot_path: PathBuf,
    /// Where it is written: its blob (named by its hash) when the Hub gave one, else the snapshot
    /// path.
    pub local_path: PathBuf,
    /// The SHA-256 a large (LFS) file is named by, to check it against.
    pub sha256: Option<String>,
}

fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// A relative path that stays below its base (no `..`, no root).
fn is_inside(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit of the repository's `main` branch (else its first branch), recorded under
/// `refs/`.
fn commit(
    transport: &dyn Transport,
    base: &str,
    cache: &Path,
    repo: &str,
    headers: &[(String, String)],
) -> Result<String, DownloadError> {
    let url = format!("{base}api/models/{repo}/refs");
    let json = get_json(transport, &url, headers)?;
    let branches = json
        .get("branches")
        .and_then(|b| b.as_array())
        .ok_or_else(|| DownloadError::Protocol {
            url: url.clone(),
            detail: "no `branches` in the answer".into(),
        })?;
    let mut chosen: Option<(String, String)> = None;
    for branch in branches {
        let (Some(name), Some(commit)) = (
            branch.get("name").and_then(|v| v.as_str()),
            branch.get("targetCommit").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        if !is_hex(commit, 40) || !is_inside(name) {
            continue;
        }
        if name == "main" {
            chosen = Some((name.into(), commit.into()));
            break;
        }
        chosen.get_or_insert_with(|| (name.into(), commit.into()));
    }
    let (name, commit) = chosen.ok_or_else(|| DownloadError::Protocol {
        url,
        detail: "no branch with a valid commit".into(),
    })?;
    let refs = repo_dir(cache, repo).join("refs").join(&name);
    if let Some(dir) = refs.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DownloadError::io(dir, e))?;
    }
    std::fs::write(&refs, &commit).map_err(|e| DownloadError::io(&refs, e))?;
    Ok(commit)
}

/// The repository's files at its current commit, as the Hub lists them.
pub fn remote_files(
    transport: &dyn Transport,
    base: &str,
    cache: &Path,
    repo: &str,
    headers: &[(String, String)],
) -> Result<Vec<RepoFile>, DownloadError> {
    let commit = commit(transport, base, cache, repo, headers)?;
    let url = format!("{base}api/models/{repo}/tree/{commit}?recursive=true");
    let json = get_json(transport, &url, headers)?;
    let items = json.as_array().ok_or_else(|| DownloadError::Protocol {
        url: url.clone(),
        detail: "the file list is not an array".into(),
    })?;
    let dir = repo_dir(cache, repo);
    let snapshot = dir.join("snapshots").join(&commit);
    let mut files = Vec::new();
    for item in items {
        if item.get("type").and_then(|t| t.as_str()) != Some("file") {
            continue;
        }
        let Some(path) = item.get("path").and_then(|p| p.as_str()) else {
            continue;
        };
        if !is_inside(path) {
            tracing::warn!(path, "skipping a file whose path leaves the repository");
            continue;
        }
        let oid = item
            .get("lfs")
            .and_then(|l| l.get("oid"))
            .or_else(|| item.get("oid"))
            .and_then(|o| o.as_str())
            .filter(|o| is_hex(o, 40) || is_hex(o, 64));
        let snapshot_path = snapshot.join(path);
        let local_path = match oid {
            Some(oid) if !snapshot_path.exists() => dir.join("blobs").join(oid),
            _ => snapshot_path.clone(),
        };
        files.push(RepoFile {
            path: path.to_owned(),
            url: format!("{base}{repo}/resolve/{commit}/{path}"),
            snapshot_path,
            local_path,
            // A 64-hex LFS id is the file's SHA-256; a 40-hex git id is not checked here.
            sha256: oid.filter(|o| o.len() == 64).map(str::to_owned),
        });
    }
    Ok(files)
}

/// The files of the cached snapshot of `repo` (the `main` ref, else any), for offline use.
pub fn cached_files(cache: &Path, repo: &str) -> Vec<RepoFile> {
    let dir = repo_dir(cache, repo);
    let refs = dir.join("refs");
    let mut commit = None;
    if let Ok(entries) = std::fs::read_dir(&refs) {
        for entry in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            let text = text.trim().to_owned();
            if !is_hex(&text, 40) {
                continue;
            }
            if entry.file_name() == "main" {
                commit = Some(text);
                break;
            }
            commit.get_or_insert(text);
        }
    }
    let Some(commit) = commit else {
        return Vec::new();
    };
    let snapshot = dir.join("snapshots").join(commit);
    let mut files = Vec::new();
    let mut pending = vec![snapshot.clone()];
    while let Some(at) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.is_file()
                && let Ok(relative) = path.strip_prefix(&snapshot)
            {
                let relative = relative.to_string_lossy().replace('\\', "/");
                files.push(RepoFile {
                    url: String::new(),
                    path: relative,
                    snapshot_path: path.clone(),
                    local_path: path,
                    sha256: None,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// What `-hf` resolved to: the file to load (the first part of a split one) and every part.
#[derive(Debug, Clone)]
pub struct Plan {
    pub repo: String,
    pub primary: RepoFile,
    pub parts: Vec<RepoFile>,
}

/// Lists `repo` (the Hub's list, else the cached snapshot's) and picks the file: `file` exactly
/// when given (`-hff`), else by `tag` ([`best_model`]).
pub fn plan(
    transport: &dyn Transport,
    env: &Env,
    repo: &str,
    tag: &str,
    file: Option<&str>,
    headers: &[(String, String)],
    offline: bool,
) -> Result<Plan, DownloadError> {
    if !is_valid_repo_id(repo) {
        return Err(DownloadError::bad_reference(repo));
    }
    let cache = cache_dir(env)?;
    let mut files = Vec::new();
    if !offline {
        match remote_files(transport, &endpoint(env), &cache, repo, headers) {
            Ok(found) => files = found,
            Err(err) => {
                tracing::warn!(repo, error = %err, "could not list the repository; looking in the cache")
            }
        }
    }
    if files.is_empty() {
        files = cached_files(&cache, repo);
    }
    if files.is_empty() {
        return Err(DownloadError::NothingFound {
            repo: repo.to_owned(),
            detail: if offline {
                format!(
                    "offline, and nothing of it is cached in {}",
                    cache.display()
                )
            } else {
                "the Hub lists no files and nothing of it is cached".to_owned()
            },
        });
    }
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    if paths.contains(&"preset.ini") {
        // llama-server starts its router from such a repository's preset.
        return Err(DownloadError::NothingFound {
            repo: repo.to_owned(),
            detail: "it holds a router preset (preset.ini), which mlxcel does not start from the Hub: fetch preset.ini and pass it to --models-preset".to_owned(),
        });
    }
    let chosen = match file {
        Some(file) => paths.iter().copied().find(|p| *p == file),
        None => best_model(&paths, tag),
    };
    let Some(chosen) = chosen else {
        let ggufs: Vec<&str> = paths
            .iter()
            .copied()
            .filter(|p| p.ends_with(".gguf"))
            .collect();
        let wanted = match (file, tag) {
            (Some(file), _) => format!("no file `{file}`"),
            (None, "") => "no model GGUF".to_owned(),
            (None, tag) => format!("no model GGUF tagged {tag}"),
        };
        return Err(DownloadError::NothingFound {
            repo: repo.to_owned(),
            detail: format!(
                "{wanted}; its GGUF files: {}",
                if ggufs.is_empty() {
                    "none".to_owned()
                } else {
                    ggufs.join(", ")
                }
            ),
        });
    };
    let parts = split_parts(&paths, chosen);
    let by_path = |p: &str| files.iter().find(|f| f.path == p).cloned();
    Ok(Plan {
        repo: repo.to_owned(),
        primary: by_path(chosen).expect("chosen from the list"),
        parts: parts.into_iter().filter_map(by_path).collect(),
    })
}

/// Fetches every part of `plan` and links each into the snapshot; returns the primary file's
/// snapshot path.
pub fn fetch_plan(
    transport: &dyn Transport,
    plan: &Plan,
    headers: &[(String, String)],
    offline: bool,
) -> Result<PathBuf, DownloadError> {
    for part in &plan.parts {
        let options = FetchOptions {
            trust_existing: part.local_path != part.snapshot_path,
            sha256: part.sha256.clone(),
            ..FetchOptions::new(headers.to_vec(), offline)
        };
        if !part.snapshot_path.exists() {
            tracing::info!(repo = %plan.repo, file = %part.path, "fetching");
            fetch(transport, &part.url, &part.local_path, &options)?;
            link_into_snapshot(&part.local_path, &part.snapshot_path)?;
        }
    }
    Ok(plan.primary.snapshot_path.clone())
}

/// Makes `snapshot` show `blob`: a relative symbolic link, or the file moved there where links
/// cannot be made.
fn link_into_snapshot(blob: &Path, snapshot: &Path) -> Result<(), DownloadError> {
    if blob == snapshot || snapshot.exists() {
        return Ok(());
    }
    let dir = snapshot.parent().expect("a snapshot path has a directory");
    std::fs::create_dir_all(dir).map_err(|e| DownloadError::io(dir, e))?;
    let target = relative_to(blob, dir);
    #[cfg(unix)]
    if std::os::unix::fs::symlink(&target, snapshot).is_ok() {
        return Ok(());
    }
    std::fs::rename(blob, snapshot).map_err(|e| DownloadError::io(snapshot, e))
}

/// `path` relative to the directory `from` (both under one cache directory).
fn relative_to(path: &Path, from: &Path) -> PathBuf {
    let path: Vec<_> = path.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = path.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut relative = PathBuf::new();
    for _ in common..from.len() {
        relative.push("..");
    }
    for c in &path[common..] {
        relative.push(c);
    }
    relative
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_follows_llama_cpp_s_variables() {
        let env = Env::from_pairs(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(cache_dir(&env).unwrap(), Path::new("/x/huggingface/hub"));
        let env = Env::from_pairs(&[("HOME", "/h"), ("HF_HOME", "/hf")]);
        assert_eq!(cache_dir(&env).unwrap(), Path::new("/hf/hub"));
        let env = Env::from_pairs(&[("HOME", "/h"), ("LLAMA_CACHE", "/l")]);
        assert_eq!(cache_dir(&env).unwrap(), Path::new("/l"));
        let env = Env::from_pairs(&[("HOME", "/h")]);
        assert_eq!(
            cache_dir(&env).unwrap(),
            Path::new("/h/.cache/huggingface/hub")
        );
        assert!(cache_dir(&Env::from_pairs(&[])).is_err());
        assert_eq!(endpoint(&env), "https://huggingface.co/");
        let env = Env::from_pairs(&[("HF_ENDPOINT", "http://m:1")]);
        assert_eq!(endpoint(&env), "http://m:1/");
    }

    #[test]
    fn paths_stay_inside_and_links_are_relative() {
        assert!(is_inside("a/b.gguf"));
        for bad in ["", "../x", "/etc/passwd", "a/../../b"] {
            assert!(!is_inside(bad), "{bad}");
        }
        assert_eq!(
            relative_to(
                Path::new("/c/models--a--b/blobs/abc"),
                Path::new("/c/models--a--b/snapshots/123/sub")
            ),
            Path::new("../../../blobs/abc")
        );
    }
}
