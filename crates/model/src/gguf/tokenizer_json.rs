//! Builds Hugging Face `tokenizer.json` and `tokenizer_config.json` from GGUF tokenizer metadata:
//! the byte-level BPE builder here, the SentencePiece one in `spm.rs`, over the vocabulary of
//! `vocab.rs`.

use serde_json::{Value, json};

use crate::error::{ModelError, Result};
use crate::fim::FimTokens;
use crate::gguf::reader::GgufFile;
use crate::gguf::spm;
use crate::gguf::vocab::GgufVocab;

/// Llama 3's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl GgufVocab {
    /// The `tokenizer.json` document.
    pub fn tokenizer_json(&self, gguf: &GgufFile) -> Result<Value> {
        if self.model == "llama" {
            return Ok(spm::tokenizer_json(self));
        }
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
        let pre_tokenizer = match self.pre.as_str() {
            "default" | "gpt2" | "gpt-2" | "olmo" | "poro-chat" | "viking" | "jais" => {
                byte_level(true)
            }
            "smollm" | "starcoder" | "refact" | "codeshell" | "exaone" | "minerva"
            | "command-r" => json!({
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]
            }),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
            }
            "qwen2" | "deepseek-r1-qwen" => {
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
            }
            other => {
                return Err(ModelError::GgufMetadata {
                    path: gguf.path().to_owned(),
                    key: "tokenizer.ggml.pre".into(),
                    reason: format!(
                        "pre-tokenizer `{other}` is not supported (supported: default/gpt2, smollm/starcoder, llama3, qwen2)"
                    ),
                });
            }
        };
        let (vocab, added) = self.vocab_and_added_tokens();
        let post_processor = self.bos_template().unwrap_or_else(|| {
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
        });
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": self.merges,
            }
        }))
    }

    /// The `tokenizer_config.json` document (special tokens and chat template).
    pub fn tokenizer_config_json(&self, window: usize) -> Value {
        let token = |id: Option<u32>| id.map(|id| self.tokens[id as usize].clone());
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": false,
            "add_bos_token": self.add_bos,
            "add_eos_token": false,
            "model_max_length": window,
            "bos_token": token(self.bos),
            "eos_token": token(self.eos),
            "unk_token": token(self.unk),
            "pad_token": token(self.pad),
        });
        if let Some(template) = &self.chat_template {
            config["chat_template"] = json!(template);
        }
        if self.fim != FimTokens::default() {
            config[crate::FIM_CONFIG_KEY] = self.fim.to_json();
        }
        config
    }
}
