//! Fill-in-the-middle tokens: the special tokens a code model was trained to complete the text
//! between a prefix and a suffix with (llama-server's `/infill`).
//!
//! A checkpoint names them in two ways, read in this order for each role:
//!
//! 1. GGUF metadata (`tokenizer.ggml.fim_pre_token_id` ... and the older `prefix_token_id`,
//!    `suffix_token_id`, `middle_token_id`), which the GGUF converter records in the converted
//!    checkpoint's `tokenizer_config.json` under [`FIM_CONFIG_KEY`];
//! 2. the token's text, as llama.cpp recognises it in any vocabulary (`<fim_prefix>`,
//!    `<|fim_prefix|>`, `<PRE>`, `▁<PRE>` ...; [`FIM_TEXTS`]).

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// The key of `tokenizer_config.json` under which the GGUF converter records the FIM token ids
/// the GGUF's metadata declares: `{"pre": id, "suf": id, ...}`, only the roles it declares.
pub const FIM_CONFIG_KEY: &str = "mlxcel_fim_token_ids";

/// The roles, with their GGUF metadata keys (llama.cpp's `LLM_KV_TOKENIZER_FIM_*_ID` and, for
/// the first three, the deprecated `PREFIX`/`SUFFIX`/`MIDDLE` keys, read when the new one is
/// absent).
pub const FIM_GGUF_KEYS: [(FimRole, &[&str]); 6] = [
    (
        FimRole::Pre,
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
    ),
    (
        FimRole::Suf,
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
    ),
    (
        FimRole::Mid,
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
    ),
    (FimRole::Pad, &["tokenizer.ggml.fim_pad_token_id"]),
    (FimRole::Rep, &["tokenizer.ggml.fim_rep_token_id"]),
    (FimRole::Sep, &["tokenizer.ggml.fim_sep_token_id"]),
];

/// The texts llama.cpp's vocabulary loader takes for each role when the metadata names no id
/// (the first one the vocabulary has wins here; llama.cpp's order among several is its hash
/// map's).
pub const FIM_TEXTS: [(FimRole, &[&str]); 6] = [
    (
        FimRole::Pre,
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        FimRole::Suf,
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        FimRole::Mid,
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        FimRole::Pad,
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        FimRole::Rep,
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    (FimRole::Sep, &["<|file_sep|>"]),
];

/// One fill-in-the-middle role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FimRole {
    /// Starts the prefix (llama.cpp's `FIM_PRE`).
    Pre,
    /// Starts the suffix (`FIM_SUF`).
    Suf,
    /// Asks for the middle (`FIM_MID`).
    Mid,
    /// Padding (`FIM_PAD`).
    Pad,
    /// Starts a repository's name in repo-level context (`FIM_REP`).
    Rep,
    /// Separates files in repo-level context (`FIM_SEP`).
    Sep,
}

impl FimRole {
    /// The short name used in [`FIM_CONFIG_KEY`]'s object: `pre`, `suf`, `mid`, `pad`, `rep`,
    /// `sep`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pre => "pre",
            Self::Suf => "suf",
            Self::Mid => "mid",
            Self::Pad => "pad",
            Self::Rep => "rep",
            Self::Sep => "sep",
        }
    }
}

/// A vocabulary's fill-in-the-middle tokens; `None` where it has none for a role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: Option<u32>,
    pub suf: Option<u32>,
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

impl FimTokens {
    /// The id of `role`.
    pub fn get(&self, role: FimRole) -> Option<u32> {
        match role {
            FimRole::Pre => self.pre,
            FimRole::Suf => self.suf,
            FimRole::Mid => self.mid,
            FimRole::Pad => self.pad,
            FimRole::Rep => self.rep,
            FimRole::Sep => self.sep,
        }
    }

    /// These tokens with `role` set to `id`.
    pub fn with(mut self, role: FimRole, id: Option<u32>) -> Self {
        self.set(role, id);
        self
    }

    fn set(&mut self, role: FimRole, id: Option<u32>) {
        let slot = match role {
            FimRole::Pre => &mut self.pre,
            FimRole::Suf => &mut self.suf,
            FimRole::Mid => &mut self.mid,
            FimRole::Pad => &mut self.pad,
            FimRole::Rep => &mut self.rep,
            FimRole::Sep => &mut self.sep,
        };
        *slot = id;
    }

    /// The tokens found by their text ([`FIM_TEXTS`]) through `lookup` (text → id).
    pub fn by_text(lookup: impl Fn(&str) -> Option<u32>) -> Self {
        let mut tokens = Self::default();
        for (role, texts) in FIM_TEXTS {
            tokens.set(role, texts.iter().find_map(|t| lookup(t)));
        }
        tokens
    }

    /// These tokens, with each role they lack taken from `fallback`.
    pub fn or(self, fallback: Self) -> Self {
        let mut tokens = self;
        for (role, _) in FIM_TEXTS {
            tokens.set(role, self.get(role).or(fallback.get(role)));
        }
        tokens
    }

    /// The three tokens infill needs (prefix, suffix, middle), or the names of those missing.
    pub fn infill(&self) -> std::result::Result<(u32, u32, u32), Vec<&'static str>> {
        match (self.pre, self.suf, self.mid) {
            (Some(pre), Some(suf), Some(mid)) => Ok((pre, suf, mid)),
            _ => Err([
                (self.pre, "prefix"),
                (self.suf, "suffix"),
                (self.mid, "middle"),
            ]
            .into_iter()
            .filter(|(id, _)| id.is_none())
            .map(|(_, name)| name)
            .collect()),
        }
    }

    /// The roles that have a token, as [`FIM_CONFIG_KEY`]'s object.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        for (role, _) in FIM_TEXTS {
            if let Some(id) = self.get(role) {
                map.insert(role.as_str().to_owned(), json!(id));
            }
        }
        Value::Object(map)
    }

    /// Reads [`FIM_CONFIG_KEY`]'s object (`path` names the file in errors): ids of the roles it
    /// names, each within `vocab_size`.
    pub fn from_json(path: &Path, value: &Value, vocab_size: usize) -> Result<Self> {
        let bad = |reason: String| ModelError::Tokenizer {
            path: path.to_owned(),
            reason: format!("{FIM_CONFIG_KEY}: {reason}"),
        };
        let map = value
            .as_object()
            .ok_or_else(|| bad("not an object".into()))?;
        let mut tokens = Self::default();
        for (role, _) in FIM_TEXTS {
            let Some(v) = map.get(role.as_str()) else {
                continue;
            };
            let id = v
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|&id| (id as usize) < vocab_size)
                .ok_or_else(|| {
                    bad(format!(
                        "`{}`: {v} is not a token id below the vocabulary size {vocab_size}",
                        role.as_str()
                    ))
                })?;
            tokens.set(role, Some(id));
        }
        Ok(tokens)
    }

    /// A checkpoint's FIM tokens: the ids its `tokenizer_config.json` records under
    /// [`FIM_CONFIG_KEY`] (from GGUF metadata), then, for the roles it does not name, the tokens
    /// of `tokenizer` found by their text.
    pub fn read(dir: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let by_text = Self::by_text(|t| tokenizer.token_to_id(t));
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(by_text);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        Ok(match json.get(FIM_CONFIG_KEY) {
            Some(value) => Self::from_json(&path, value, tokenizer.vocab_size())?.or(by_text),
            None => by_text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vocab: &'a [(&'a str, u32)]) -> impl Fn(&str) -> Option<u32> + 'a {
        |t| vocab.iter().find(|(s, _)| *s == t).map(|(_, id)| *id)
    }

    #[test]
    fn tokens_are_found_by_the_texts_llama_cpp_knows() {
        let qwen = [
            ("<|fim_prefix|>", 10),
            ("<|fim_middle|>", 11),
            ("<|fim_suffix|>", 12),
            ("<|fim_pad|>", 13),
            ("<|repo_name|>", 14),
            ("<|file_sep|>", 15),
        ];
        let tokens = FimTokens::by_text(lookup(&qwen));
        assert_eq!(
            tokens,
            FimTokens {
                pre: Some(10),
                suf: Some(12),
                mid: Some(11),
                pad: Some(13),
                rep: Some(14),
                sep: Some(15),
            }
        );
        assert_eq!(tokens.infill(), Ok((10, 12, 11)));
        let codellama = [("▁<PRE>", 32007), ("▁<SUF>", 32008), ("▁<MID>", 32009)];
        assert_eq!(
            FimTokens::by_text(lookup(&codellama)).infill(),
            Ok((32007, 32008, 32009))
        );
        // SmolLM2's vocabulary: a repository token, no prefix/suffix/middle.
        let smollm = [("<repo_name>", 3), ("<reponame>", 4), ("<file_sep>", 5)];
        let tokens = FimTokens::by_text(lookup(&smollm));
        assert_eq!(tokens.rep, Some(4));
        assert_eq!(tokens.sep, None);
        assert_eq!(tokens.infill(), Err(vec!["prefix", "suffix", "middle"]));
    }

    #[test]
    fn declared_ids_win_over_texts_and_round_trip_through_json() {
        let declared = FimTokens {
            pre: Some(1),
            mid: Some(3),
            ..FimTokens::default()
        };
        let by_text = FimTokens {
            pre: Some(7),
            suf: Some(8),
            ..FimTokens::default()
        };
        let merged = declared.or(by_text);
        assert_eq!(merged.infill(), Ok((1, 8, 3)));
        let json = declared.to_json();
        assert_eq!(json, json!({"pre": 1, "mid": 3}));
        let path = Path::new("tokenizer_config.json");
        assert_eq!(FimTokens::from_json(path, &json, 10).unwrap(), declared);
        let err = FimTokens::from_json(path, &json!({"pre": 10}), 10).unwrap_err();
        assert!(
            err.to_string().contains("`pre`: 10 is not a token id"),
            "{err}"
        );
        assert!(FimTokens::from_json(path, &json!([1]), 10).is_err());
    }
}
