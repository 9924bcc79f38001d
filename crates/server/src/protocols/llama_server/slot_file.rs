//! The file a saved slot is written to (docs/server.md, "Saving and restoring slots"),
//! little-endian:
//!
//! ```text
//! "MLXCSLOT"            8 bytes: magic
//! u32                   format version (1; 2 when the file holds a recurrent state)
//! u32                   H: the header's length
//! H bytes               the header, JSON: mlxcel version, model name and fingerprint, backend,
//!                       n_tokens N, floats_per_position F, kv_dtype "f32", and in version 2
//!                       state_floats S
//! N u32                 the token ids
//! N·F f32               their keys and values, in the backend's layout
//! S f32                 version 2: a hybrid model's recurrent state after the tokens
//! 32 bytes              SHA-256 of every byte before it
//! ```
//!
//! A model without recurrent state writes version 1, byte for byte what mlxcel wrote before
//! hybrid models could save slots, so files of either age read back.

use std::io::Read;
use std::path::Path;

use mlxcel_engine::{CachedPrefix, Engine};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

const MAGIC: &[u8; 8] = b"MLXCSLOT";
const VERSION: u32 = 1;
/// The version of a file that holds a recurrent state (`state_floats` in its header).
const VERSION_WITH_STATE: u32 = 2;
/// The longest header read back: far over any real one, so a corrupt length is refused before
/// anything is allocated for it.
const MAX_HEADER: u32 = 64 * 1024;
/// Bytes around the header: magic, version, header length, checksum.
const FRAME: u64 = 8 + 4 + 4 + 32;

/// What the header of a slot file says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotFileHeader {
    /// The mlxcel version that wrote it.
    pub mlxcel: String,
    /// The model's name, for messages.
    pub model: String,
    /// [`crate::fingerprint::model_fingerprint`] of the model whose keys and values these are.
    pub model_fingerprint: String,
    /// The backend that computed them (its layout).
    pub backend: String,
    pub n_tokens: usize,
    pub floats_per_position: usize,
    pub kv_dtype: String,
    /// f32 values of the recurrent state after the tokens (a hybrid model's linear-attention
    /// layers); absent, 0, in a file of a model without one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub state_floats: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The file name of `path`, as the answers and errors name it.
pub(super) fn filename_of(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

pub(super) fn header_for(
    engine: &Engine,
    fingerprint: &str,
    prefix: &CachedPrefix,
) -> SlotFileHeader {
    let n = prefix.tokens.len();
    SlotFileHeader {
        mlxcel: env!("CARGO_PKG_VERSION").to_owned(),
        model: engine.info().name.clone(),
        model_fingerprint: fingerprint.to_owned(),
        backend: engine.info().backend.as_str().to_owned(),
        n_tokens: n,
        floats_per_position: prefix.kv.len().checked_div(n).unwrap_or(0),
        kv_dtype: "f32".to_owned(),
        state_floats: prefix.state.len(),
    }
}

/// A file of another model, backend or dtype is refused with what it holds and what this
/// server serves.
pub(super) fn check_header(
    engine: &Engine,
    fingerprint: &str,
    header: &SlotFileHeader,
    filename: &str,
) -> Result<(), ApiError> {
    let refuse = |why: String| {
        Err(ApiError::invalid_param(
            "filename",
            format!("cannot restore slot file {filename}: {why}"),
        ))
    };
    let info = engine.info();
    if header.model_fingerprint != fingerprint {
        return refuse(format!(
            "it was saved from model `{}` (fingerprint {}), and this server serves `{}` \
             (fingerprint {fingerprint}); keys and values are only valid for the model that \
             computed them",
            header.model,
            short(&header.model_fingerprint),
            info.name
        ));
    }
    if header.backend != info.backend.as_str() {
        return refuse(format!(
            "it was saved by the {} backend, and this server runs the {} backend",
            header.backend,
            info.backend.as_str()
        ));
    }
    if header.kv_dtype != "f32" {
        return refuse(format!(
            "its keys and values are {}, and this server keeps f32",
            header.kv_dtype
        ));
    }
    Ok(())
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

/// Writes a slot file atomically (a partial file renamed into place); returns its size.
pub fn write_slot_file(
    path: &Path,
    header: &SlotFileHeader,
    prefix: &CachedPrefix,
) -> std::io::Result<u64> {
    let header_json = serde_json::to_vec(header).map_err(std::io::Error::other)?;
    let mut bytes = Vec::with_capacity(
        FRAME as usize
            + header_json.len()
            + 4 * (prefix.tokens.len() + prefix.kv.len() + prefix.state.len()),
    );
    let version = if prefix.state.is_empty() {
        VERSION
    } else {
        VERSION_WITH_STATE
    };
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&(header_json.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&header_json);
    for token in &prefix.tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    for value in prefix.kv.iter().chain(&prefix.state) {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    let digest = Sha256::digest(&bytes);
    bytes.extend_from_slice(&digest);
    let dir = path.parent().unwrap_or(Path::new("."));
    mlxcel_model::sweep_partials(dir);
    let partial = dir.join(mlxcel_model::partial_name(&filename_of(path)));
    let written = std::fs::write(&partial, &bytes).and_then(|()| std::fs::rename(&partial, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.map(|()| bytes.len() as u64)
}

/// Reads and checks a slot file: magic, version, a header that parses, a length that matches it,
/// and the checksum. Nothing is allocated for the contents before the length is known to match
/// the file's.
pub fn read_slot_file(
    path: &Path,
    filename: &str,
) -> Result<(SlotFileHeader, CachedPrefix, u64), ApiError> {
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => invalid_file(
            filename,
            format!(
                "no such file in --slot-save-path {}",
                path.parent().unwrap_or(Path::new("")).display()
            ),
        ),
        _ => invalid_file(filename, e.to_string()),
    })?;
    let size = file
        .metadata()
        .map_err(|e| invalid_file(filename, e.to_string()))?
        .len();
    let (header, prefix) = parse_slot_file(file, size, filename)?;
    Ok((header, prefix, size))
}

fn invalid_file(filename: &str, why: String) -> ApiError {
    ApiError::invalid_param(
        "filename",
        format!("cannot restore slot file {filename}: {why}"),
    )
}

/// [`read_slot_file`]'s checks over `size` bytes from `input` (the fuzz target's entry).
pub fn parse_slot_file(
    mut input: impl Read,
    size: u64,
    filename: &str,
) -> Result<(SlotFileHeader, CachedPrefix), ApiError> {
    let corrupt = |why: String| invalid_file(filename, why);
    let mut head = [0u8; 16];
    if size < FRAME || input.read_exact(&mut head).is_err() {
        return Err(corrupt(format!(
            "it is {size} bytes, too short for a slot file"
        )));
    }
    if &head[..8] != MAGIC {
        return Err(corrupt("it is not a slot file (wrong magic bytes)".into()));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if version != VERSION && version != VERSION_WITH_STATE {
        return Err(corrupt(format!(
            "format version {version}; this mlxcel reads versions {VERSION} and \
             {VERSION_WITH_STATE}"
        )));
    }
    let header_len = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
    if header_len > MAX_HEADER || u64::from(header_len) + FRAME > size {
        return Err(corrupt(format!(
            "a header length of {header_len} bytes in a {size}-byte file: the file is corrupt"
        )));
    }
    let mut header_bytes = vec![0u8; header_len as usize];
    input
        .read_exact(&mut header_bytes)
        .map_err(|e| corrupt(e.to_string()))?;
    let header: SlotFileHeader = serde_json::from_slice(&header_bytes)
        .map_err(|e| corrupt(format!("its header is not valid: {e}")))?;
    if (version == VERSION_WITH_STATE) != (header.state_floats > 0) {
        return Err(corrupt(format!(
            "format version {version} with a header of {} recurrent-state floats: the file is \
             corrupt",
            header.state_floats
        )));
    }
    let expected = (header.n_tokens as u64)
        .checked_mul(4 * (1 + header.floats_per_position as u64))
        .and_then(|body| body.checked_add(4 * header.state_floats as u64))
        .and_then(|body| body.checked_add(FRAME + u64::from(header_len)));
    if expected != Some(size) {
        return Err(corrupt(format!(
            "its header describes {} tokens of {} floats each and {} floats of recurrent \
             state, which is not its size of {size} bytes: the file is truncated or corrupt",
            header.n_tokens, header.floats_per_position, header.state_floats
        )));
    }
    let remaining = size - 16 - u64::from(header_len);
    let mut rest = Vec::with_capacity(remaining as usize);
    input
        .take(remaining + 1)
        .read_to_end(&mut rest)
        .map_err(|e| corrupt(e.to_string()))?;
    if rest.len() as u64 != remaining {
        return Err(corrupt("it changed while being read".into()));
    }
    let (contents, checksum) = rest.split_at(rest.len() - 32);
    let mut digest = Sha256::new();
    digest.update(head);
    digest.update(&header_bytes);
    digest.update(contents);
    if digest.finalize().as_slice() != checksum {
        return Err(corrupt(
            "its checksum does not match its contents: the file is corrupt".into(),
        ));
    }
    let (tokens, values) = contents.split_at(4 * header.n_tokens);
    let (kv, state) = values.split_at(values.len() - 4 * header.state_floats);
    let floats = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    };
    let prefix = CachedPrefix {
        tokens: tokens
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect(),
        kv: floats(kv),
        state: floats(state),
    };
    Ok((header, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n: usize, f: usize) -> SlotFileHeader {
        SlotFileHeader {
            mlxcel: "0.1.0".into(),
            model: "m".into(),
            model_fingerprint: "ab".repeat(32),
            backend: "mlx".into(),
            n_tokens: n,
            floats_per_position: f,
            kv_dtype: "f32".into(),
            state_floats: 0,
        }
    }

    fn message(err: ApiError) -> String {
        err.to_string()
    }

    #[test]
    fn a_slot_file_reads_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        let prefix = CachedPrefix {
            tokens: vec![1, 2, 70000],
            kv: (0..12).map(|i| i as f32 * 0.5 - 1.0).collect(),
            state: Vec::new(),
        };
        let written = write_slot_file(&path, &header(3, 4), &prefix).unwrap();
        assert_eq!(written, std::fs::metadata(&path).unwrap().len());
        let (h, p, read) = read_slot_file(&path, "a.bin").unwrap();
        assert_eq!((h, p, read), (header(3, 4), prefix, written));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file is left");
    }

    #[test]
    fn corrupt_truncated_and_foreign_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        let prefix = CachedPrefix {
            tokens: vec![5, 6],
            kv: vec![0.25; 8],
            state: Vec::new(),
        };
        write_slot_file(&path, &header(2, 4), &prefix).unwrap();
        let good = std::fs::read(&path).unwrap();
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            message(read_slot_file(&path, "s.bin").unwrap_err())
        };
        // A flipped bit in the keys and values.
        let mut flipped = good.clone();
        let at = flipped.len() - 40;
        flipped[at] ^= 1;
        assert!(
            refused(&flipped).contains("checksum"),
            "{}",
            refused(&flipped)
        );
        // Truncated, and extended.
        assert!(refused(&good[..good.len() - 1]).contains("truncated or corrupt"));
        let mut longer = good.clone();
        longer.push(0);
        assert!(refused(&longer).contains("truncated or corrupt"));
        // Not a slot file at all, too short, another version, an absurd header length.
        assert!(refused(&[b'x'; 100]).contains("wrong magic"));
        assert!(refused(b"MLXC").contains("too short"));
        let mut version = good.clone();
        version[8] = 9;
        assert!(refused(&version).contains("format version 9"));
        let mut header_len = good.clone();
        header_len[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(refused(&header_len).contains("header length"));
        // A header claiming a billion tokens is refused before anything is allocated for them.
        let mut big = header(1_000_000_000, 4096);
        big.model = "m".into();
        write_slot_file(&path, &big, &prefix).unwrap();
        let err = message(read_slot_file(&path, "s.bin").unwrap_err());
        assert!(err.contains("1000000000 tokens"), "{err}");
        // No such file names the directory.
        let err = message(read_slot_file(&dir.path().join("none"), "none").unwrap_err());
        assert!(err.contains("no such file in --slot-save-path"), "{err}");
    }

    #[test]
    fn a_hybrid_slot_file_carries_its_state_and_a_dense_one_stays_version_1() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.bin");
        let version = |path: &Path| {
            let bytes = std::fs::read(path).unwrap();
            let v = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
            (v, String::from_utf8_lossy(&bytes).contains("state_floats"))
        };
        let hybrid = CachedPrefix {
            tokens: vec![3, 4],
            kv: vec![0.5; 8],
            state: (0..6).map(|i| i as f32 - 2.5).collect(),
        };
        let mut with_state = header(2, 4);
        with_state.state_floats = 6;
        write_slot_file(&path, &with_state, &hybrid).unwrap();
        assert_eq!(version(&path), (2, true));
        let (h, p, _) = read_slot_file(&path, "h.bin").unwrap();
        assert_eq!((h, p), (with_state.clone(), hybrid));
        // Without a state: version 1, the header without the key (what older mlxcel wrote and
        // reads).
        let dense = CachedPrefix {
            tokens: vec![3, 4],
            kv: vec![0.5; 8],
            state: Vec::new(),
        };
        write_slot_file(&path, &header(2, 4), &dense).unwrap();
        assert_eq!(version(&path), (1, false));
        assert_eq!(read_slot_file(&path, "h.bin").unwrap().1, dense);
        // A header that claims a state the version does not have is refused.
        write_slot_file(&path, &with_state, &dense).unwrap();
        let err = message(read_slot_file(&path, "h.bin").unwrap_err());
        assert!(err.contains("6 recurrent-state floats"), "{err}");
    }

    /// The fuzz target's seeds (written by hand in Python, not by this code) parse as meant.
    #[test]
    fn the_fuzz_seeds_are_a_reader_written_elsewhere_agrees_with() {
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/slot_file");
        let parse = |name: &str| {
            let bytes = std::fs::read(seeds.join(name)).unwrap();
            parse_slot_file(bytes.as_slice(), bytes.len() as u64, name)
        };
        let (header, prefix) = parse("three-tokens").unwrap();
        assert_eq!(prefix.tokens, vec![1, 9906, 28]);
        assert_eq!((header.n_tokens, prefix.kv.len()), (3, 12));
        assert_eq!(prefix.kv[1], ((37 % 17) as f32 - 8.0) / 4.0);
        assert_eq!(parse("empty").unwrap().1.tokens, Vec::<u32>::new());
        assert_eq!(parse("one-token-wide").unwrap().1.kv.len(), 64);
        let err = message(parse("bad-checksum").unwrap_err());
        assert!(err.contains("checksum"), "{err}");
    }
}
