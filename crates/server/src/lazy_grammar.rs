//! llama-server's lazy grammars: `grammar_lazy`, `grammar_triggers` and `preserved_tokens`, as
//! its task schema reads them. With `grammar_lazy: true` the request's constraint (`grammar`,
//! `json_schema` ...) applies only once a trigger appears in the output
//! ([`mlxcel_engine::ConstraintTrigger`]); the triggers are `{"type", "value"}` objects: type 0 a
//! token (`"token": id`), 1 a word, 2 a pattern searched in the output, 3 a pattern the whole
//! output must match. A word that is one token must be among `preserved_tokens` (texts that are
//! one token each; others are skipped, as llama-server skips them) and then triggers as that
//! token; a longer word triggers as its text.

use mlxcel_engine::{ConstraintTrigger, Engine, EngineError};
use serde::Deserialize;

use crate::error::ApiError;

/// The fields, as sent; `null` is absent.
#[derive(Debug, Default, Deserialize)]
pub struct LazyFields {
    pub grammar_lazy: Option<bool>,
    pub grammar_triggers: Option<Vec<TriggerField>>,
    pub preserved_tokens: Option<Vec<String>>,
}

/// One trigger as llama-server writes it (`server_grammar_trigger`).
#[derive(Debug, Clone, Deserialize)]
pub struct TriggerField {
    #[serde(rename = "type")]
    kind: i64,
    value: String,
    token: Option<i64>,
}

/// The checked fields, resolved against the vocabulary at submission ([`LazyGrammar::resolve`]).
#[derive(Debug, Clone, Default)]
pub struct LazyGrammar {
    lazy: bool,
    triggers: Vec<TriggerField>,
    preserved: Vec<String>,
}

fn bad(field: &str, message: String) -> ApiError {
    ApiError::invalid_param(field, message)
}

impl LazyFields {
    /// The fields checked as far as they can be without the vocabulary: each trigger's type and
    /// its token, and that a lazy grammar has triggers.
    pub fn read(&self) -> Result<Option<LazyGrammar>, ApiError> {
        let lazy = self.grammar_lazy.unwrap_or(false);
        let triggers = self.grammar_triggers.clone().unwrap_or_default();
        for (i, trigger) in triggers.iter().enumerate() {
            match (trigger.kind, trigger.token) {
                (0, Some(token)) if token >= 0 => {}
                (0, _) => {
                    return Err(bad(
                        "grammar_triggers",
                        format!(
                            "grammar_triggers[{i}]: a token trigger (type 0) needs \"token\": \
                             a token id"
                        ),
                    ));
                }
                (1..=3, _) => {}
                (kind, _) => {
                    return Err(bad(
                        "grammar_triggers",
                        format!(
                            "grammar_triggers[{i}]: type {kind} is not a trigger type: 0 token, \
                             1 word, 2 pattern, 3 full pattern"
                        ),
                    ));
                }
            }
        }
        if lazy && triggers.is_empty() {
            return Err(bad(
                "grammar_lazy",
                "grammar_lazy: no triggers set for lazy grammar: send grammar_triggers".into(),
            ));
        }
        if triggers.is_empty() && self.preserved_tokens.as_ref().is_none_or(Vec::is_empty) {
            return Ok(None);
        }
        Ok(Some(LazyGrammar {
            lazy,
            triggers,
            preserved: self.preserved_tokens.clone().unwrap_or_default(),
        }))
    }
}

impl LazyGrammar {
    /// The engine's triggers (empty unless the grammar is lazy), with the words and token ids
    /// checked against `engine`'s vocabulary as llama-server checks them.
    pub fn resolve(&self, engine: &Engine) -> Result<Vec<ConstraintTrigger>, ApiError> {
        let one_token = |text: &str| -> Result<Option<u32>, ApiError> {
            let ids = engine
                .tokenizer()
                .encode(text, false, true)
                .map_err(EngineError::from)?;
            Ok(match ids.as_slice() {
                [id] => Some(*id),
                _ => None,
            })
        };
        let mut preserved = Vec::new();
        for text in &self.preserved {
            if let Some(id) = one_token(text)? {
                preserved.push(id);
            }
        }
        let vocab = engine.info().vocab_size;
        let mut out = Vec::new();
        for (i, trigger) in self.triggers.iter().enumerate() {
            out.push(match trigger.kind {
                0 => {
                    let token = trigger.token.unwrap_or(-1);
                    match u32::try_from(token).ok().filter(|&t| (t as usize) < vocab) {
                        Some(token) => ConstraintTrigger::Token(token),
                        None => {
                            return Err(bad(
                                "grammar_triggers",
                                format!(
                                    "grammar_triggers[{i}]: token {token} is not in the \
                                     vocabulary (0..{vocab})"
                                ),
                            ));
                        }
                    }
                }
                1 => match one_token(&trigger.value)? {
                    Some(token) if preserved.contains(&token) => ConstraintTrigger::Token(token),
                    Some(_) => {
                        return Err(bad(
                            "grammar_triggers",
                            format!(
                                "Grammar trigger word should be marked as preserved token: {} \
                                 (add it to preserved_tokens)",
                                trigger.value
                            ),
                        ));
                    }
                    None => ConstraintTrigger::Word(trigger.value.clone()),
                },
                2 => ConstraintTrigger::Pattern(trigger.value.clone()),
                _ => ConstraintTrigger::PatternFull(trigger.value.clone()),
            });
        }
        Ok(if self.lazy { out } else { Vec::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: serde_json::Value) -> Result<Option<LazyGrammar>, ApiError> {
        serde_json::from_value::<LazyFields>(value).unwrap().read()
    }

    #[test]
    fn triggers_are_checked_as_llama_server_checks_them() {
        assert!(read(json!({})).unwrap().is_none());
        assert!(read(json!({"grammar_lazy": false})).unwrap().is_none());
        let err = read(json!({"grammar_lazy": true})).unwrap_err();
        assert!(format!("{err:?}").contains("no triggers"), "{err:?}");
        let err = read(json!({"grammar_triggers": [{"type": 0, "value": "x"}]})).unwrap_err();
        assert!(
            format!("{err:?}").contains("grammar_triggers[0]"),
            "{err:?}"
        );
        let err = read(json!({"grammar_triggers": [{"type": 7, "value": "x"}]})).unwrap_err();
        assert!(format!("{err:?}").contains("type 7"), "{err:?}");
        let lazy = read(json!({
            "grammar_lazy": true,
            "grammar_triggers": [{"type": 1, "value": "<tool_call>"}, {"type": 0, "value": "", "token": 5}],
            "preserved_tokens": ["<tool_call>"],
        }))
        .unwrap()
        .unwrap();
        assert!(lazy.lazy);
        assert_eq!(lazy.triggers.len(), 2);
        assert_eq!(lazy.preserved, ["<tool_call>"]);
    }
}
