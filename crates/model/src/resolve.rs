//! `-m MODEL`: the default model, a checkpoint directory, or a `.gguf` converted once into the cache.

use std::path::{Path, PathBuf};

use crate::default_model::{DefaultModel, cache_dir, sha256_file};
use crate::error::{ModelError, Result};
use crate::gguf::overrides::{KvOverride, OVERRIDE_KV_FLAG, fingerprint};
use crate::gguf::{GgufWeights, prepare_gguf_with};
use crate::partial::{partial_name, sweep_partials};

/// The checkpoint directory for a `-m` argument: `None` is the default model (downloaded and
/// converted on first use), a directory with `config.json` is used as is, and a GGUF file is
/// converted into `<cache>/converted/<version>/<sha256>` once.
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    resolve_model_with(arg, &[])
}

/// [`resolve_model`] with `--override-kv`'s `overrides` applied to a GGUF file's metadata (the
/// checkpoint prepared under them in a directory of its own, `<sha256>-kv-<fingerprint>`); a
/// checkpoint directory refuses them, naming the flag.
pub fn resolve_model_with(arg: Option<&str>, overrides: &[KvOverride]) -> Result<PathBuf> {
    let cache = cache_dir()?;
    match arg {
        None => {
            let pin = DefaultModel::pinned();
            let gguf = pin.ensure_gguf(&cache)?;
            converted_with(&cache, &gguf, &pin.gguf_sha256, overrides)
        }
        Some(arg) => {
            let path = Path::new(arg);
            if path.join("config.json").is_file() {
                if let Some(first) = overrides.first() {
                    return Err(ModelError::Override {
                        flag: format!("{OVERRIDE_KV_FLAG} {first}"),
                        reason: format!(
                            "{} is a checkpoint directory; metadata overrides apply to GGUF \
                             files (edit its config.json instead)",
                            path.display()
                        ),
                    });
                }
                Ok(path.to_owned())
            } else if path.is_file() {
                match gguf_magic(path)? {
                    Ok(()) => converted_with(&cache, path, &gguf_sha256(&cache, path)?, overrides),
                    Err(found) => Err(ModelError::NotAModel {
                        path: path.to_owned(),
                        found,
                    }),
                }
            } else {
                let found = if path.is_dir() {
                    "a directory without config.json"
                } else if path.exists() {
                    "neither a file nor a directory"
                } else {
                    "no such file or directory"
                };
                Err(ModelError::NotAModel {
                    path: path.to_owned(),
                    found: found.to_owned(),
                })
            }
        }
    }
}

/// Part of the cache key of converted checkpoints: bump it whenever the converter's output changes,
/// so that conversions made by an older mlxcel are not reused. (`v5`: the weights are no longer
/// written to the cache but converted from the GGUF file at each load.)
pub const CONVERTER_VERSION: &str = "v5";

/// The checkpoint directory of `gguf` (whose sha256 is `sha256`), prepared if absent: the config
/// and tokenizer files, and [`crate::GGUF_WEIGHTS_FILE`] pointing at the GGUF file, whose tensors
/// are converted as the model loads (no second copy of the weights on disk).
pub fn converted(cache: &Path, gguf: &Path, sha256: &str) -> Result<PathBuf> {
    converted_with(cache, gguf, sha256, &[])
}

/// [`converted`] under `--override-kv`'s `overrides`: in `<sha256>-kv-<fingerprint>` when there
/// are any. Each call names the overrides whose key the importer does not read, on stderr.
pub fn converted_with(
    cache: &Path,
    gguf: &Path,
    sha256: &str,
    overrides: &[KvOverride],
) -> Result<PathBuf> {
    let dir = prepared(cache, gguf, sha256, overrides)?;
    if !overrides.is_empty()
        && let Some(weights) = GgufWeights::read(&dir)?
    {
        for key in &weights.kv_overrides_unread {
            eprintln!(
                "mlxcel: {OVERRIDE_KV_FLAG}: the GGUF importer does not read `{key}`; its \
                 override changes nothing"
            );
        }
    }
    Ok(dir)
}

fn prepared(cache: &Path, gguf: &Path, sha256: &str, overrides: &[KvOverride]) -> Result<PathBuf> {
    let parent = cache.join("converted").join(CONVERTER_VERSION);
    let name = match overrides {
        [] => sha256.to_owned(),
        _ => format!("{sha256}-kv-{}", fingerprint(overrides)),
    };
    let dir = parent.join(&name);
    let gguf = std::fs::canonicalize(gguf).map_err(|e| ModelError::io(gguf, e))?;
    // What a killed conversion left goes first, whether or not this one is already done.
    sweep_partials(&parent);
    if dir.join("config.json").is_file() {
        // The same bytes, perhaps at another path than when the directory was prepared.
        GgufWeights::repoint(&dir, &gguf)?;
        return Ok(dir);
    }
    std::fs::create_dir_all(&parent).map_err(|e| ModelError::io(&parent, e))?;
    // Convert beside the destination and rename, so an interrupted conversion is never used.
    let partial = parent.join(partial_name(&name));
    let _ = std::fs::remove_dir_all(&partial);
    eprintln!("mlxcel: preparing {} in {}", gguf.display(), dir.display());
    let summary = prepare_gguf_with(&gguf, &partial, sha256, overrides)?;
    if let Some(note) = summary.group16_note() {
        eprintln!("mlxcel: {note}");
    }
    match std::fs::rename(&partial, &dir) {
        Ok(()) => Ok(dir),
        // Another process finished the same conversion first; theirs is as good as ours.
        Err(_) if dir.join("config.json").is_file() => {
            let _ = std::fs::remove_dir_all(&partial);
            GgufWeights::repoint(&dir, &gguf)?;
            Ok(dir)
        }
        Err(e) => Err(ModelError::io(&dir, e)),
    }
}

/// The sha256 of a `-m` GGUF file, remembered in `<cache>/converted/<version>/by-path/` under a
/// hash of its canonical path together with its size and modification time: a multi-gigabyte
/// file is hashed once, not on every run, and hashed again as soon as either changes.
pub fn gguf_sha256(cache: &Path, path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let canonical = std::fs::canonicalize(path).map_err(|e| ModelError::io(path, e))?;
    let key: String = Sha256::digest(canonical.as_os_str().as_encoded_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let memo_dir = cache
        .join("converted")
        .join(CONVERTER_VERSION)
        .join("by-path");
    let memo = memo_dir.join(&key);
    let stamp = format!("{} {modified}", meta.len());
    if let Ok(text) = std::fs::read_to_string(&memo)
        && let Some((recorded, sha)) = text.trim().rsplit_once(' ')
        && recorded == stamp
        && sha.len() == 64
        && sha.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Ok(sha.to_owned());
    }
    let sha = sha256_file(path)?;
    // A failure to remember only costs a hash next time.
    sweep_partials(&memo_dir);
    let partial = memo_dir.join(partial_name(&key));
    let written = std::fs::create_dir_all(&memo_dir)
        .and_then(|()| std::fs::write(&partial, format!("{stamp} {sha}\n")))
        .and_then(|()| std::fs::rename(&partial, &memo));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    Ok(sha)
}

/// `Ok(Ok(()))` when the file starts with the GGUF magic, else `Ok(Err(what it starts with))`.
fn gguf_magic(path: &Path) -> Result<std::result::Result<(), String>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(path)
        .and_then(|file| file.take(4).read_to_end(&mut head))
        .map_err(|e| ModelError::io(path, e))?;
    if head == b"GGUF" {
        return Ok(Ok(()));
    }
    let bytes: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Err(match head.len() {
        0 => "an empty file".to_owned(),
        _ => format!(
            "a file starting with bytes {} where a GGUF file starts with 47 47 55 46 (\"GGUF\")",
            bytes.join(" ")
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is remembered by path, size and modification time, and recomputed when the file
    /// changes.
    #[test]
    fn gguf_hash_is_remembered_until_the_file_changes() {
        let cache = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.gguf");
        std::fs::write(&file, b"GGUF first contents").unwrap();
        let first = gguf_sha256(cache.path(), &file).unwrap();
        assert_eq!(first, sha256_file(&file).unwrap());

        // The memo is what a second call reads: doctor it and the doctored hash comes back.
        let memo_dir = cache
            .path()
            .join("converted")
            .join(CONVERTER_VERSION)
            .join("by-path");
        let memos: Vec<_> = std::fs::read_dir(&memo_dir).unwrap().collect();
        assert_eq!(memos.len(), 1, "one memo, no partial files left");
        let memo = memos[0].as_ref().unwrap().path();
        let text = std::fs::read_to_string(&memo).unwrap();
        let (stamp, _) = text.trim().rsplit_once(' ').unwrap();
        let doctored = "ab".repeat(32);
        std::fs::write(&memo, format!("{stamp} {doctored}\n")).unwrap();
        assert_eq!(gguf_sha256(cache.path(), &file).unwrap(), doctored);

        // A garbled memo is ignored.
        std::fs::write(&memo, "garbage").unwrap();
        assert_eq!(gguf_sha256(cache.path(), &file).unwrap(), first);

        // New contents (another size): hashed again.
        std::fs::write(&file, b"GGUF second, longer contents").unwrap();
        let second = gguf_sha256(cache.path(), &file).unwrap();
        assert_ne!(second, first);
        assert_eq!(second, sha256_file(&file).unwrap());
    }
}
