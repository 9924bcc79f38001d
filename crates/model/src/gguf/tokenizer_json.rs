//! Builds Hugging Face `tokenizer.json` and `tokenizer_config.json` from GGUF tokenizer metadata.

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};
use crate::gguf::reader::{GgufFile, GgufValue};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The vocabulary and special tokens read from GGUF metadata.
#[derive(Debug)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE).
    pub model: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i64>,
    /// BPE merges (`gpt2`); SentencePiece vocabularies have none and use `scores` instead.
    pub merges: Vec<String>,
    /// Piece scores (`llama`): higher merges first.
    pub scores: Vec<f32>,
    /// Whether SentencePiece text gets a leading `▁` (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
    pub pre: String,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End-of-turn tokens (`eot`, `eom`) that also stop generation.
    pub extra_eos: Vec<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

impl GgufVocab {
    pub fn read(gguf: &GgufFile) -> Result<Self> {
        let missing = |key: &str, reason: &str| ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: key.to_owned(),
            reason: reason.to_owned(),
        };
        let model = gguf
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .unwrap_or("");
        if model != "gpt2" && model != "llama" {
            return Err(missing(
                "tokenizer.ggml.model",
                &format!(
                    "`{model}` is not supported (supported: gpt2, the byte-level BPE of GPT-2, \
                     Llama 3, Qwen2, SmolLM; llama, the SentencePiece BPE of Llama 2 and Mistral)"
                ),
            ));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            gguf.get(key)
                .and_then(GgufValue::as_array)
                .ok_or_else(|| missing(key, "missing or not an array"))?
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| missing(key, "not an array of strings"))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let token_types = match gguf
            .get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array)
        {
            Some(types) => types
                .iter()
                .map(|v| {
                    v.as_f64().map(|t| t as i64).ok_or_else(|| {
                        missing("tokenizer.ggml.token_type", "not an array of integers")
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![1; tokens.len()],
        };
        if token_types.len() != tokens.len() {
            return Err(missing(
                "tokenizer.ggml.token_type",
                "length differs from tokenizer.ggml.tokens",
            ));
        }
        let id = |key: &str| -> Result<Option<u32>> {
            match gguf.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .filter(|&id| (id as usize) < tokens.len())
                    .map(Some)
                    .ok_or_else(|| missing(key, "not a token id within the vocabulary")),
            }
        };
        let mut extra_eos = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            extra_eos.extend(id(key)?);
        }
        let is_spm = model == "llama";
        let scores = match gguf
            .get("tokenizer.ggml.scores")
            .and_then(GgufValue::as_array)
        {
            Some(scores) => scores
                .iter()
                .map(|v| {
                    v.as_f64()
                        .map(|s| s as f32)
                        .ok_or_else(|| missing("tokenizer.ggml.scores", "not an array of numbers"))
                })
                .collect::<Result<Vec<_>>>()?,
            None if is_spm => return Err(missing("tokenizer.ggml.scores", "missing")),
            None => Vec::new(),
        };
        if is_spm && scores.len() != tokens.len() {
            return Err(missing(
                "tokenizer.ggml.scores",
                "length differs from tokenizer.ggml.tokens",
            ));
        }
        Ok(Self {
            model: model.to_owned(),
            merges: if is_spm {
                Vec::new()
            } else {
                strings("tokenizer.ggml.merges")?
            },
            scores,
            add_space_prefix: gguf
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(GgufValue::as_bool)
                .unwrap_or(is_spm),
            pre: gguf
                .get("tokenizer.ggml.pre")
                .and_then(GgufValue::as_str)
                .unwrap_or("default")
                .to_owned(),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            extra_eos,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: gguf
                .get("tokenizer.ggml.add_bos_token")
                .and_then(GgufValue::as_bool)
                .unwrap_or(is_spm),
            chat_template: gguf
                .get("tokenizer.chat_template")
                .and_then(GgufValue::as_str)
                .map(str::to_owned),
            tokens,
            token_types,
        })
    }

    /// Stop tokens: `eos` then the end-of-turn tokens, without duplicates.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .eos
            .into_iter()
            .chain(self.extra_eos.iter().copied())
            .collect();
        ids.dedup();
        ids
    }

    /// The `tokenizer.json` document.
    pub fn tokenizer_json(&self, gguf: &GgufFile) -> Result<Value> {
        if self.model == "llama" {
            return Ok(crate::gguf::spm::tokenizer_json(self));
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

    /// The vocabulary (token → id, first id wins for duplicates) and the added tokens: control and
    /// unknown tokens as special, user-defined ones as plain added tokens.
    pub(crate) fn vocab_and_added_tokens(&self) -> (Map<String, Value>, Vec<Value>) {
        let mut vocab = Map::new();
        let mut added = Vec::new();
        for (id, (token, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            vocab.entry(token.clone()).or_insert(json!(id));
            let special = ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_UNKNOWN;
            if special || ty == TOKEN_TYPE_USER_DEFINED {
                added.push(json!({
                    "id": id, "content": token, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": special,
                }));
            }
        }
        (vocab, added)
    }

    /// A post-processor that prepends BOS, when the model wants one.
    pub(crate) fn bos_template(&self) -> Option<Value> {
        let bos = self.bos.filter(|_| self.add_bos)?;
        let bos_token = &self.tokens[bos as usize];
        let special = |seq: &str| json!({"Sequence": {"id": seq, "type_id": 0}});
        let bos_piece = json!({"SpecialToken": {"id": bos_token, "type_id": 0}});
        Some(json!({
            "type": "TemplateProcessing",
            "single": [bos_piece, special("A")],
            "pair": [bos_piece, special("A"), bos_piece, special("B")],
            "special_tokens": {bos_token: {"id": bos_token, "ids": [bos], "tokens": [bos_token]}}
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
        config
    }
}
