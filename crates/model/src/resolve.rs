//! `-m MODEL`: the default model, a checkpoint directory, or a `.gguf` converted once into the cache.

use std::path::{Path, PathBuf};

use crate::default_model::{DefaultModel, cache_dir, sha256_file, unique_suffix};
use crate::error::{ModelError, Result};
use crate::gguf::convert_gguf;

/// The checkpoint directory for a `-m` argument: `None` is the default model (downloaded and
/// converted on first use), a directory with `config.json` is used as is, and a GGUF file is
/// converted into `<cache>/converted/<version>/<sha256>` once.
pub fn resolve_model(arg: Option<&str>) -> Result<PathBuf> {
    let cache = cache_dir()?;
    match arg {
        None => {
            let pin = DefaultModel::pinned();
            let gguf = pin.ensure_gguf(&cache)?;
            converted(&cache, &gguf, &pin.gguf_sha256)
        }
        Some(arg) => {
            let path = Path::new(arg);
            if path.join("config.json").is_file() {
                Ok(path.to_owned())
            } else if path.is_file() {
                match gguf_magic(path)? {
                    Ok(()) => converted(&cache, path, &sha256_file(path)?),
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
/// so that conversions made by an older mlxcel are not reused.
pub const CONVERTER_VERSION: &str = "v2";

/// The cached conversion of `gguf` (whose sha256 is `sha256`), converting it if absent.
pub fn converted(cache: &Path, gguf: &Path, sha256: &str) -> Result<PathBuf> {
    let parent = cache.join("converted").join(CONVERTER_VERSION);
    let dir = parent.join(sha256);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&parent).map_err(|e| ModelError::io(&parent, e))?;
    // Convert beside the destination and rename, so an interrupted conversion is never used.
    let partial = parent.join(format!("{sha256}.partial-{}", unique_suffix()));
    let _ = std::fs::remove_dir_all(&partial);
    eprintln!(
        "mlxcel: converting {} into {}",
        gguf.display(),
        dir.display()
    );
    convert_gguf(gguf, &partial)?;
    match std::fs::rename(&partial, &dir) {
        Ok(()) => Ok(dir),
        // Another process finished the same conversion first; theirs is as good as ours.
        Err(_) if dir.join("config.json").is_file() => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(dir)
        }
        Err(e) => Err(ModelError::io(&dir, e)),
    }
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
