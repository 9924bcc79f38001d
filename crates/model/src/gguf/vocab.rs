//! The vocabulary and special tokens of a GGUF file's tokenizer metadata, shared by the two
//! `tokenizer.json` builders (byte-level BPE in `tokenizer_json.rs`, SentencePiece in `spm.rs`).
//! A leaf: it knows neither builder.

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};
use crate::fim::{FIM_GGUF_KEYS, FimTokens};
use crate::gguf::reader::{GgufFile, GgufValue};

/// llama.cpp's token types (`tokenizer.ggml.token_type`, its `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0, or any value llama.cpp does not define.
    Undefined,
    /// 1: an ordinary piece (the default when a file has no types).
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, EOS, chat markers): special, never merged.
    Control,
    /// 4: a user-defined token, matched before the model splits text.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte-fallback piece (`<0x0A>`).
    Byte,
}

impl TokenType {
    /// The type of a GGUF integer value.
    pub fn from_gguf(value: f64) -> Self {
        match value as i64 {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// The vocabulary and special tokens read from GGUF metadata.
#[derive(Debug)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE).
    pub model: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<TokenType>,
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
    /// The fill-in-the-middle tokens the metadata declares (`tokenizer.ggml.fim_*_token_id`);
    /// the converter records them in `tokenizer_config.json` ([`crate::FIM_CONFIG_KEY`]).
    pub fim: FimTokens,
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
                    v.as_f64().map(TokenType::from_gguf).ok_or_else(|| {
                        missing("tokenizer.ggml.token_type", "not an array of integers")
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![TokenType::Normal; tokens.len()],
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
        let mut fim = FimTokens::default();
        for (role, keys) in FIM_GGUF_KEYS {
            let mut declared = None;
            for key in keys {
                if let Some(found) = id(key)? {
                    declared = Some(found);
                    break;
                }
            }
            fim = fim.with(role, declared);
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
            fim,
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

    /// The vocabulary (token → id, first id wins for duplicates) and the added tokens: control and
    /// unknown tokens as special, user-defined ones as plain added tokens.
    pub(crate) fn vocab_and_added_tokens(&self) -> (Map<String, Value>, Vec<Value>) {
        let mut vocab = Map::new();
        let mut added = Vec::new();
        for (id, (token, &ty)) in self.tokens.iter().zip(&self.token_types).enumerate() {
            vocab.entry(token.clone()).or_insert(json!(id));
            let special = matches!(ty, TokenType::Control | TokenType::Unknown);
            if special || ty == TokenType::UserDefined {
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
}
