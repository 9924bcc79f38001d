//! Everything a backend and the engine need from one checkpoint directory, loaded together.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat::{ChatTemplate, TokenizerConfig};
use crate::checkpoint::Checkpoint;
use crate::config::{ModelConfig, token_ids};
use crate::error::{ModelError, Result};
use crate::fim::FimTokens;
use crate::rank_head::RankHead;
use crate::tokenizer::Tokenizer;

/// A validated checkpoint with its tokenizer, chat template and stop tokens.
#[derive(Debug)]
pub struct LoadedModel {
    pub checkpoint: Checkpoint,
    pub tokenizer: Tokenizer,
    /// `None` when the checkpoint has no chat template.
    pub chat_template: Option<ChatTemplate>,
    pub eos_token_ids: Vec<u32>,
    /// The fill-in-the-middle tokens (GGUF metadata, else llama.cpp's texts).
    pub fim_tokens: FimTokens,
    /// A reranker's classification head ([`crate::RANK_HEAD_FILE`]); `None` for other models.
    pub rank_head: Option<RankHead>,
}

impl LoadedModel {
    /// Opens the checkpoint directory `dir` (see [`crate::resolve_model`] for `-m` arguments).
    pub fn open(dir: &Path) -> Result<Self> {
        let checkpoint = Checkpoint::open(dir)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let chat_template = ChatTemplate::from_dir(dir)?;
        let eos_token_ids = eos_token_ids(dir, checkpoint.config(), &tokenizer)?;
        let fim_tokens = FimTokens::read(dir, &tokenizer)?;
        let rank_head = RankHead::read(&checkpoint)?;
        Ok(Self {
            checkpoint,
            tokenizer,
            chat_template,
            eos_token_ids,
            fim_tokens,
            rank_head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.checkpoint.config()
    }

    pub fn dir(&self) -> &Path {
        self.checkpoint.dir()
    }

    /// The chat template, or the error telling the user to pass `--no-chat-template`.
    pub fn require_chat_template(&self) -> Result<&ChatTemplate> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| ModelError::NoChatTemplate {
                dir: PathBuf::from(self.dir()),
            })
    }
}

/// Stop tokens: `generation_config.json` `eos_token_id` if present, else config.json's, plus the
/// id of `tokenizer_config.json`'s `eos_token`; de-duplicated, in that order.
pub fn eos_token_ids(dir: &Path, config: &ModelConfig, tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    let mut ids = Vec::new();
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        ids = token_ids(&path, "eos_token_id", json.get("eos_token_id"))?;
    }
    if ids.is_empty() {
        ids = config.eos_token_ids.clone();
    }
    let eos = TokenizerConfig::from_dir(dir)?.eos_token;
    ids.extend(eos.and_then(|t| tokenizer.token_to_id(&t)));
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}
