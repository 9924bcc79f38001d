//! `--log-prompts-dir`: each generation's prompt, as the model runs it (after the chat template),
//! written to a file of its own, as llama-server's debugging aid. A prompt that cannot be written
//! is a warning in the log; the request goes on.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::request::{PromptInput, PromptPiece};

/// Writes `prompt` to `dir`/`<ms since the epoch, 12 digits>.txt` (`-N` added when a file of
/// that name exists): text as it is, token ids (or ids and texts mixed) as JSON.
pub(crate) fn write_prompt(dir: &Path, prompt: &PromptInput) {
    let text = match prompt {
        PromptInput::Text(text) | PromptInput::Templated(text) => text.clone(),
        PromptInput::Tokens(ids) => Value::from(ids.clone()).to_string(),
        PromptInput::Mixed(pieces) => Value::Array(
            pieces
                .iter()
                .map(|piece| match piece {
                    PromptPiece::Text(text) => Value::from(text.clone()),
                    PromptPiece::Token(id) => Value::from(*id),
                })
                .collect(),
        )
        .to_string(),
    };
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    for n in 0..1000 {
        let name = if n == 0 {
            format!("{ms:012}.txt")
        } else {
            format!("{ms:012}-{n}.txt")
        };
        let path = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                if let Err(err) = file.write_all(text.as_bytes()) {
                    tracing::warn!("--log-prompts-dir: cannot write {}: {err}", path.display());
                }
                return;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(err) => {
                tracing::warn!("--log-prompts-dir: cannot create {}: {err}", path.display());
                return;
            }
        }
    }
}
