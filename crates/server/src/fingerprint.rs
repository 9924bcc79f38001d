//! The model's fingerprint, which slot files carry so that a restore refuses another model's
//! keys and values.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A fingerprint of the model's files: SHA-256 over `config.json` and, for each weight file
/// (`*.safetensors`, by name), its name, size, first and last 64 KiB. Two checkpoints that
/// differ in any weight file's header (tensor names, shapes, dtypes) or in the bytes sampled
/// get different fingerprints; a fine-tune of the same shape differs in its sampled values.
/// A checkpoint whose weights are read from a GGUF file adds that file's SHA-256.
pub fn model_fingerprint(dir: &Path) -> std::io::Result<String> {
    const SAMPLE: u64 = 64 * 1024;
    let mut digest = Sha256::new();
    digest.update(b"mlxcel model fingerprint v1\n");
    digest.update(std::fs::read(dir.join("config.json"))?);
    // Weights read from a GGUF file: the file's sha256 names them.
    if let Ok(Some(gguf)) = mlxcel_model::GgufWeights::read(dir) {
        digest.update(b"gguf ");
        digest.update(gguf.sha256.as_bytes());
    }
    let mut weights: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    weights.sort();
    for path in weights {
        let mut file = std::fs::File::open(&path)?;
        let size = file.metadata()?.len();
        digest.update(
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
                .as_bytes(),
        );
        digest.update(size.to_le_bytes());
        let mut buf = vec![0u8; SAMPLE.min(size) as usize];
        file.read_exact(&mut buf)?;
        digest.update(&buf);
        if size > SAMPLE {
            use std::io::Seek;
            let tail = SAMPLE.min(size - SAMPLE);
            file.seek(std::io::SeekFrom::Start(size - tail))?;
            let mut buf = vec![0u8; tail as usize];
            file.read_exact(&mut buf)?;
            digest.update(&buf);
        }
    }
    Ok(digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// `fingerprint` of a model that runs with the control vectors of `digest`
/// (`mlxcel_engine::Engine::control_vector_digest`): unchanged without, else a SHA-256 over
/// both, so that slot files saved under one vector (or none) are not restored under another.
pub fn with_control_vector(fingerprint: &str, digest: Option<&str>) -> String {
    let Some(digest) = digest else {
        return fingerprint.to_owned();
    };
    let mut sha = Sha256::new();
    sha.update(b"mlxcel model fingerprint with a control vector v1\n");
    sha.update(fingerprint.as_bytes());
    sha.update(b"\n");
    sha.update(digest.as_bytes());
    sha.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_vector_changes_the_fingerprint_and_none_keeps_it() {
        let base = "ab".repeat(32);
        assert_eq!(with_control_vector(&base, None), base);
        let one = with_control_vector(&base, Some("11"));
        let other = with_control_vector(&base, Some("22"));
        assert_ne!(one, base);
        assert_ne!(one, other);
        assert_eq!(one.len(), 64);
        assert_eq!(one, with_control_vector(&base, Some("11")));
    }

    #[test]
    fn the_fingerprint_follows_the_weights() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let weights = dir.path().join("model.safetensors");
        std::fs::write(&weights, vec![1u8; 200_000]).unwrap();
        let a = model_fingerprint(dir.path()).unwrap();
        assert_eq!(a, model_fingerprint(dir.path()).unwrap());
        let mut changed = vec![1u8; 200_000];
        changed[199_000] = 2;
        std::fs::write(&weights, changed).unwrap();
        assert_ne!(a, model_fingerprint(dir.path()).unwrap());
    }
}
