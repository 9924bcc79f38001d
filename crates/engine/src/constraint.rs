//! Structured output: what a request's output must match (a JSON Schema, any JSON object, a Lark
//! grammar, a regular expression), enforced token by token with llguidance.
//!
//! Before each sampled token, the sequence's matcher computes which tokens can continue a valid
//! output; every other logit becomes −∞, so the sampler (greedy or not) can only pick a valid one,
//! and the model's end-of-sequence tokens are allowed exactly when the output is complete. The mask
//! is computed per sequence in the engine, so it works on every backend and with batching:
//! constrained and free sequences share a step.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use mlxcel_model::Tokenizer;
use serde_json::Value;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::EngineError;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON value valid under this JSON Schema (`response_format` `json_schema`, llama-server's
    /// `json_schema`).
    JsonSchema(Value),
    /// Any JSON object (`response_format` `json_object`).
    JsonObject,
    /// A Lark grammar in llguidance's dialect (its `start` rule is the output).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

impl Constraint {
    pub(crate) fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            Self::JsonObject => TopLevelGrammar::from_json_schema(serde_json::json!({
                "type": "object"
            })),
            Self::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }

    /// The name used in errors: the request field's kind.
    fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "JSON schema",
            Self::JsonObject => "JSON object",
            Self::Lark(_) => "grammar",
            Self::Regex(_) => "regex",
        }
    }
}

/// Compiles constraints for one model's vocabulary (built once, on the first constrained
/// request: the token trie of the whole vocabulary).
pub(crate) struct Constraints {
    factory: ParserFactory,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints").finish_non_exhaustive()
    }
}

/// The vocabulary as llguidance sees it: each token's bytes (special tokens behind the trie's
/// marker byte, so that no text matches them) and our tokenizer for the few strings it encodes.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false, false)
                .unwrap_or_default()
        })
    }
}

impl Constraints {
    /// The trie of `tokenizer`'s vocabulary padded to the model's `vocab_size` (rows past the
    /// tokenizer's are never allowed); `eos` is the token that ends a complete output.
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        eos: u32,
        vocab_size: usize,
    ) -> Result<Self, EngineError> {
        let mut words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .into_iter()
            .map(|t| {
                if t.special {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend(t.bytes);
                    marked
                } else {
                    t.bytes
                }
            })
            .collect();
        words.resize(vocab_size.max(words.len()), Vec::new());
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::InvalidConstraint {
                kind: "vocabulary",
                message: format!("cannot build the token trie: {e}"),
            })?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A fresh matcher for `constraint`, or the reason llguidance refuses it.
    pub(crate) fn matcher(
        &self,
        constraint: &Constraint,
    ) -> Result<ConstrainedOutput, EngineError> {
        let parser = self
            .factory
            .create_parser(constraint.grammar())
            .map_err(|e| EngineError::InvalidConstraint {
                kind: constraint.kind(),
                message: e.to_string(),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(EngineError::InvalidConstraint {
                kind: constraint.kind(),
                message: error,
            });
        }
        Ok(ConstrainedOutput { matcher })
    }
}

/// One sequence's constraint in progress.
pub(crate) struct ConstrainedOutput {
    matcher: Matcher,
}

impl std::fmt::Debug for ConstrainedOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstrainedOutput").finish_non_exhaustive()
    }
}

impl ConstrainedOutput {
    /// Sets every logit the constraint forbids to −∞; `stop_tokens` (the model's end tokens)
    /// are allowed exactly when the output so far is complete.
    pub(crate) fn mask(&mut self, logits: &mut [f32], stop_tokens: &[u32]) -> Result<(), String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let accepting = self.matcher.is_accepting().map_err(|e| e.to_string())?;
        // Usually few tokens are allowed: copy those into a row of −∞ (the mask's set bits are
        // visited a machine word at a time) rather than testing every token.
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        let mut any = false;
        mask.iter_set_entries(|token| {
            if token < logits.len() && !stop_tokens.contains(&(token as u32)) {
                masked[token] = logits[token];
                any = true;
            }
        });
        if accepting {
            for &token in stop_tokens {
                if let Some(&logit) = logits.get(token as usize) {
                    masked[token as usize] = logit;
                    any = true;
                }
            }
        }
        if !any {
            return Err("the constraint allows no token here".into());
        }
        logits.copy_from_slice(&masked);
        Ok(())
    }

    /// Advances past the sampled `token` (not a stop token); `true` when the constraint can
    /// take nothing more (the output is complete).
    pub(crate) fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        Ok(self.matcher.is_stopped())
    }
}
