//! A reranker's classification head: what turns a model's final hidden state into a relevance
//! score, as llama.cpp's rank pooling computes it.
//!
//! A checkpoint directory is a reranker when it holds [`RANK_HEAD_FILE`] beside its weights and
//! a `score.weight` tensor `[outputs, hidden]` (llama.cpp's `cls.output.weight`, which
//! [`crate::convert_gguf`] imports under that name and for which it writes the file). The file
//! says which position's state the head reads (a causal decoder's last), whether the outputs are
//! turned into probabilities (llama.cpp applies a softmax for Qwen3's yes/no head), the outputs'
//! labels and the prompt that puts a query and a document together (GGUF's
//! `tokenizer.chat_template.rerank`, with `{query}` and `{document}` in it).
//!
//! The score of a (query, document) pair is the head's first output: for Qwen3-Reranker the
//! probability of "yes" against "no" at the last position.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// The file in a checkpoint directory that describes its classification head.
pub const RANK_HEAD_FILE: &str = "rank_head.json";

/// The tensor of the head's weights (`[outputs, hidden]`), and its optional bias (`[outputs]`).
pub const RANK_HEAD_MODULE: &str = "score";

/// Which position's final hidden state the head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankToken {
    /// The first position (a bidirectional encoder's `[CLS]`).
    First,
    /// The last position (a causal decoder, which has read the whole pair there).
    Last,
}

/// What [`RANK_HEAD_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankHeadFile {
    pub token: RankToken,
    /// Whether the outputs go through a softmax before the first is taken as the score.
    pub softmax: bool,
    /// The outputs' labels (GGUF `{arch}.classifier.output_labels`), when the file names them.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The prompt of a pair, with `{query}` and `{document}` (GGUF
    /// `tokenizer.chat_template.rerank`); `None` when the model has none.
    #[serde(default)]
    pub prompt: Option<String>,
}

impl RankHeadFile {
    /// Writes the file into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RANK_HEAD_FILE);
        let mut text = serde_json::to_string_pretty(self).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, e))
    }
}
