//! A reranker's head in a GGUF file: llama.cpp's `cls.output.weight` (imported as
//! [`crate::RANK_HEAD_MODULE`]) with the keys that say how llama.cpp's rank pooling reads it,
//! written as the converted checkpoint's [`crate::RANK_HEAD_FILE`].

use std::path::Path;

use crate::error::Result;
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::rank::{RankHeadFile, RankToken};

/// The head's tensor in a GGUF file.
pub const GGUF_RANK_HEAD: &str = "cls.output.weight";

/// What [`crate::RANK_HEAD_FILE`] says of `gguf` (whose `general.architecture` is `arch`), or
/// `None` when the file has no classification head.
pub fn rank_head_file(gguf: &GgufFile, arch: &str) -> Option<RankHeadFile> {
    gguf.tensor_info(GGUF_RANK_HEAD)?;
    let labels = gguf
        .get(&format!("{arch}.classifier.output_labels"))
        .and_then(GgufValue::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let prompt = gguf
        .get("tokenizer.chat_template.rerank")
        .and_then(GgufValue::as_str)
        .map(str::to_owned);
    Some(RankHeadFile {
        // Every family mlxcel reads from GGUF is a causal decoder: llama.cpp's rank pooling
        // reads its last position.
        token: RankToken::Last,
        // llama.cpp turns Qwen3's two outputs (yes, no) into probabilities; other heads' first
        // output is the score as it is.
        softmax: matches!(arch, "qwen3" | "qwen3vl"),
        labels,
        prompt,
    })
}

/// Writes [`crate::RANK_HEAD_FILE`] into `out_dir` when `gguf` has a classification head.
pub fn write_rank_head(gguf: &GgufFile, arch: &str, out_dir: &Path) -> Result<()> {
    match rank_head_file(gguf, arch) {
        Some(file) => file.write(out_dir),
        None => Ok(()),
    }
}
