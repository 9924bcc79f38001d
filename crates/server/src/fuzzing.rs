//! Entry points for the fuzz targets (`fuzz/`, docs/reliability.md): every route's request body
//! parsed and checked as its handler does before it needs the model, and slot files as a restore
//! reads them, without a server or an engine. Not part of the stable API.

pub use crate::routes::{check_request_body, post_paths};

/// A slot file's bytes through the checks `POST /slots/{id_slot}?action=restore` makes before the
/// engine sees its contents: `Ok` with the tokens and floats it holds, or the error.
pub fn parse_slot_file(bytes: &[u8]) -> Result<(usize, usize), String> {
    crate::protocols::llama_server::parse_slot_file(bytes, bytes.len() as u64, "fuzz.bin")
        .map(|(_, prefix)| (prefix.tokens.len(), prefix.kv.len()))
        .map_err(|e| e.to_string())
}
