//! llama-server's slot actions, `POST /slots/{id}?action=save|restore|erase` with
//! `--slot-save-path DIR`.
//!
//! A slot's cache is what the engine's prefix cache holds for the last request that slot ran
//! (its prompt and the tokens it generated, but the last, with their keys and values). Saving
//! writes it to `DIR/filename`; restoring reads such a file back into the prefix cache, where the
//! next request starting with its tokens reuses them (in this server or a restarted one, on the
//! same model); erasing drops the slot's entry from the cache.
//!
//! The file's format is in `slot_file.rs`.

use std::sync::Arc;
use std::time::Instant;

use hyper::{Response, StatusCode};
use mlxcel_engine::{CachedPrefix, EngineError};
use serde::{Deserialize, Serialize};

use crate::body::{Body, json};
use crate::error::ApiError;
use crate::read::RequestBody;
use crate::state::AppState;

use super::slot_file::{check_header, filename_of, header_for, read_slot_file, write_slot_file};

/// The body of `POST /slots/{id}` (none for `erase`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotActionBody {
    filename: Option<String>,
}

#[derive(Debug, Serialize)]
struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    save_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restore_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ActionResponse {
    Saved {
        id_slot: usize,
        filename: String,
        n_saved: usize,
        n_written: u64,
        timings: Timings,
    },
    Restored {
        id_slot: usize,
        filename: String,
        n_restored: usize,
        n_read: u64,
        timings: Timings,
    },
    Erased {
        id_slot: usize,
        n_erased: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Save,
    Restore,
    Erase,
}

/// `action` from the query string.
fn action(query: &str) -> Result<Action, ApiError> {
    let value = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "action")
        .map(|(_, value)| value);
    match value {
        Some("save") => Ok(Action::Save),
        Some("restore") => Ok(Action::Restore),
        Some("erase") => Ok(Action::Erase),
        Some(other) => Err(ApiError::invalid_param(
            "action",
            format!("invalid action `{other}`: expected save, restore or erase"),
        )),
        None => Err(ApiError::invalid_param(
            "action",
            "the query needs ?action=save, restore or erase",
        )),
    }
}

/// The body's checks that need no model (the fuzz target's view): JSON with at most `filename`,
/// a plain file name.
pub fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    let body = parse_body(bytes)?;
    if let Some(name) = &body.filename {
        check_filename(name)?;
    }
    Ok(())
}

fn parse_body(bytes: &[u8]) -> Result<SlotActionBody, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(SlotActionBody::default());
    }
    crate::read::parse_json(bytes)
}

/// A file name inside `--slot-save-path`: no directory part, no parent or hidden name, no control
/// characters, at most 255 bytes (llama-server's rule is the same in spirit).
fn check_filename(name: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        Err(ApiError::invalid_param(
            "filename",
            format!(
                "invalid filename {name:?}: {why}; give a plain file name inside --slot-save-path"
            ),
        ))
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 255 {
        return bad("it is longer than 255 bytes");
    }
    if name.contains(['/', '\\']) {
        return bad("it has a directory part");
    }
    if name.starts_with('.') {
        return bad("it starts with a dot");
    }
    if name.chars().any(char::is_control) {
        return bad("it has control characters");
    }
    Ok(())
}

/// `POST /slots/{id}?action=...`.
pub async fn slot_action(
    state: &Arc<AppState>,
    body: RequestBody,
    id: Option<&str>,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let Some(dir) = state.config().slot_save_path.clone() else {
        return Err(ApiError::NotImplemented(
            "This server does not support slots action. Start it with `--slot-save-path`".into(),
        ));
    };
    let parallel = state.config().parallel;
    let id_slot = id
        .and_then(|id| id.parse::<usize>().ok())
        .filter(|&id| id < parallel)
        .ok_or_else(|| {
            ApiError::invalid_param(
                "id_slot",
                format!(
                    "invalid slot id {:?}: this server has slots 0 to {}",
                    id.unwrap_or(""),
                    parallel - 1
                ),
            )
        })?;
    let action = action(query)?;
    let body = parse_body(&crate::read::read_bytes(body, state.config().body_limit).await?)?;
    let filename = match (action, body.filename) {
        (Action::Erase, _) => String::new(),
        (_, Some(name)) => {
            check_filename(&name)?;
            name
        }
        (_, None) => {
            return Err(ApiError::invalid_param(
                "filename",
                "saving and restoring need a body {\"filename\": \"...\"}",
            ));
        }
    };
    let engine = state.awake_engine().await?;
    // As llama-server defers a slot action until the slot's task ends: wait while a request
    // holds the slot (a client that gives up drops this future).
    while state.slot_is_busy(id_slot) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let elapsed_ms = || started.elapsed().as_secs_f64() * 1e3;
    let response = match action {
        Action::Save => {
            let entry = state.slot_entry(id_slot);
            let path = dir.join(&filename);
            let fingerprint = state.model_fingerprint()?;
            let (n_saved, n_written) = tokio::task::spawn_blocking(move || {
                let prefix = match entry {
                    Some(id) => engine.cached_prefix(id)?,
                    None => None,
                }
                .unwrap_or(CachedPrefix {
                    tokens: Vec::new(),
                    kv: Vec::new(),
                    state: Vec::new(),
                });
                let header = header_for(&engine, &fingerprint, &prefix);
                let written = write_slot_file(&path, &header, &prefix)
                    .map_err(|e| ApiError::Internal(format!("writing {}: {e}", path.display())))?;
                Ok::<_, ApiError>((prefix.tokens.len(), written))
            })
            .await
            .map_err(|e| ApiError::Internal(format!("slot save task failed: {e}")))??;
            ActionResponse::Saved {
                id_slot,
                filename,
                n_saved,
                n_written,
                timings: Timings {
                    save_ms: Some(elapsed_ms()),
                    restore_ms: None,
                },
            }
        }
        Action::Restore => {
            let path = dir.join(&filename);
            let fingerprint = state.model_fingerprint()?;
            let previous = state.slot_entry(id_slot);
            let (restored, n_restored, n_read) = tokio::task::spawn_blocking(move || {
                let (header, prefix, read) = read_slot_file(&path, &filename_of(&path))?;
                check_header(&engine, &fingerprint, &header, &filename_of(&path))?;
                let n = prefix.tokens.len();
                let restored = if n == 0 {
                    None
                } else {
                    Some(engine.restore_prefix(prefix).map_err(restore_error)?)
                };
                if let Some(old) = previous {
                    engine.erase_prefix(old)?;
                }
                Ok::<_, ApiError>((restored, n, read))
            })
            .await
            .map_err(|e| ApiError::Internal(format!("slot restore task failed: {e}")))??;
            state.set_slot_entry(id_slot, restored);
            ActionResponse::Restored {
                id_slot,
                filename,
                n_restored,
                n_read,
                timings: Timings {
                    save_ms: None,
                    restore_ms: Some(elapsed_ms()),
                },
            }
        }
        Action::Erase => {
            let entry = state.slot_entry(id_slot);
            let n_erased = match entry {
                Some(id) => tokio::task::spawn_blocking(move || engine.erase_prefix(id))
                    .await
                    .map_err(|e| ApiError::Internal(format!("slot erase task failed: {e}")))??,
                None => 0,
            };
            state.set_slot_entry(id_slot, None);
            ActionResponse::Erased { id_slot, n_erased }
        }
    };
    Ok(json(StatusCode::OK, &response))
}

/// What the file holds that the engine refuses (more tokens than the window or the prefix cache
/// takes, ids outside the vocabulary, a layout the backend cannot read) is a 400 naming the file;
/// the rest as usual.
fn restore_error(err: EngineError) -> ApiError {
    match err {
        EngineError::PrefixCache(_)
        | EngineError::Backend { .. }
        | EngineError::InputTooLong { .. }
        | EngineError::TokenOutOfVocabulary { .. } => {
            ApiError::invalid_param("filename", err.to_string())
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_stay_inside_the_save_directory() {
        for bad in [
            "",
            "../x",
            "a/b",
            "a\\b",
            ".hidden",
            "..",
            "a\nb",
            &"x".repeat(256),
        ] {
            assert!(check_filename(bad).is_err(), "{bad:?}");
        }
        for good in ["slot0.bin", "chat-2026 12 01.kv", "ünïcode"] {
            check_filename(good).unwrap();
        }
        assert!(check_body(br#"{"filename": "../../etc/passwd"}"#).is_err());
        assert!(check_body(br#"{"filename": 3}"#).is_err());
        assert!(check_body(br#"{"file": "x"}"#).is_err());
        check_body(b"").unwrap();
        check_body(br#"{"filename": "ok.bin"}"#).unwrap();
    }
}
