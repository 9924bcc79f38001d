//! The reasoning budget as llama-server's fields and flags give it: a count of reasoning tokens
//! after which the engine writes the block's end itself ([`mlxcel_engine::ReasoningBudget`]),
//! and `reasoning_control`, which lets `POST /v1/chat/completions/control` end the block of a
//! running reply.
//!
//! The chat routes take the tags from the model's reasoning form (`<think>` … `</think>`;
//! gpt-oss's `<|channel|>analysis<|message|>` … `<|end|>`); the other routes from the request's
//! `reasoning_budget_start_tag` and `reasoning_budget_end_tags` (or `reasoning_budget_end_tag`),
//! as llama-server's `/completion` does. What is forced is `reasoning_budget_message` followed by
//! the first end tag.

use mlxcel_engine::{Engine, EngineError, ReasoningBudget};
use serde::Deserialize;

use super::format::Form;
use crate::error::ApiError;

/// The budget fields of a request (every generating route), as sent; `null` is absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct BudgetFields {
    pub reasoning_budget_tokens: Option<i64>,
    pub reasoning_budget_start_tag: Option<String>,
    pub reasoning_budget_end_tags: Option<Vec<String>>,
    pub reasoning_budget_end_tag: Option<String>,
    pub reasoning_budget_message: Option<String>,
    pub reasoning_control: Option<bool>,
}

/// A reasoning budget in text, before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetText {
    pub start: String,
    pub ends: Vec<String>,
    /// Written before the first end tag when the end is forced.
    pub message: String,
    /// `None`: no count (the end comes from the model, or from a control request).
    pub tokens: Option<usize>,
}

impl BudgetText {
    /// The budget in tokens: the tags tokenized with their special tokens (a reasoning model's
    /// `</think>` is one).
    pub fn tokenize(&self, engine: &Engine) -> Result<ReasoningBudget, ApiError> {
        let encode = |text: &str| -> Result<Vec<u32>, ApiError> {
            Ok(engine
                .tokenizer()
                .encode(text, false, true)
                .map_err(EngineError::from)?)
        };
        let ends = self
            .ends
            .iter()
            .map(|end| encode(end))
            .collect::<Result<Vec<_>, _>>()?;
        let mut forced = encode(&self.message)?;
        forced.extend(ends.first().into_iter().flatten());
        Ok(ReasoningBudget {
            start: encode(&self.start)?,
            ends,
            forced,
            tokens: self.tokens,
            inside: false,
        })
    }
}

/// A budget count as llama-server reads it: `-1` none, else a count of tokens.
fn budget_count(field: &str, value: i64) -> Result<Option<usize>, ApiError> {
    match value {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(n as usize)),
        n => Err(ApiError::invalid_param(
            field,
            format!("{field}={n}: expected -1 (no budget) or a count of tokens"),
        )),
    }
}

/// The budget of a reply on a route without a chat template (`/completion`, `/v1/completions`,
/// `/infill`): the request's own tags. `None` unless a count or `reasoning_control` asks for
/// one; refused when one is asked for without both tags.
pub fn completion_budget(fields: &BudgetFields) -> Result<Option<BudgetText>, ApiError> {
    let tokens = match fields.reasoning_budget_tokens {
        Some(n) => budget_count("reasoning_budget_tokens", n)?,
        None => None,
    };
    let control = fields.reasoning_control.unwrap_or(false);
    if tokens.is_none() && !control {
        return Ok(None);
    }
    let asked = if control {
        "reasoning_control"
    } else {
        "reasoning_budget_tokens"
    };
    let start = fields
        .reasoning_budget_start_tag
        .clone()
        .unwrap_or_default();
    let ends = end_tags(fields);
    if start.is_empty() || ends.is_empty() {
        let missing = if start.is_empty() {
            "reasoning_budget_start_tag"
        } else {
            "reasoning_budget_end_tags"
        };
        return Err(ApiError::invalid_param(
            missing,
            format!(
                "{asked} on this route needs the reasoning block's tags: send \
                 reasoning_budget_start_tag and reasoning_budget_end_tags (e.g. \"<think>\" and \
                 [\"</think>\"]); the chat routes take them from the model's template"
            ),
        ));
    }
    Ok(Some(BudgetText {
        start,
        ends,
        message: fields.reasoning_budget_message.clone().unwrap_or_default(),
        tokens,
    }))
}

/// The budget of a chat reply in `form`: `tokens` from the chat's budget fields or the server's
/// `--reasoning-budget` (a count above 0; 0 switches thinking off in the template instead),
/// `message` over `--reasoning-budget-message`; the request's own tags override the form's.
pub fn chat_budget(
    fields: &BudgetFields,
    tokens: Option<usize>,
    default_message: &str,
    form: Form,
) -> Option<BudgetText> {
    let control = fields.reasoning_control.unwrap_or(false);
    let tokens = tokens.filter(|&n| n > 0);
    if tokens.is_none() && !control {
        return None;
    }
    let (start, end) = match form {
        Form::Think { .. } => ("<think>", "</think>"),
        Form::Harmony => ("<|channel|>analysis<|message|>", "<|end|>"),
    };
    let start = fields
        .reasoning_budget_start_tag
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| start.to_owned());
    let mut ends = end_tags(fields);
    if ends.is_empty() {
        ends.push(end.to_owned());
    }
    let message = fields
        .reasoning_budget_message
        .clone()
        .unwrap_or_else(|| default_message.to_owned());
    Some(BudgetText {
        start,
        ends,
        message,
        tokens,
    })
}

fn end_tags(fields: &BudgetFields) -> Vec<String> {
    let tags = match (
        &fields.reasoning_budget_end_tags,
        &fields.reasoning_budget_end_tag,
    ) {
        (Some(tags), _) => tags.clone(),
        (None, Some(tag)) => vec![tag.clone()],
        (None, None) => Vec::new(),
    };
    tags.into_iter().filter(|t| !t.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> BudgetFields {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_completion_budget_takes_the_requests_tags_and_refuses_without_them() {
        assert_eq!(completion_budget(&fields("{}")).unwrap(), None);
        assert_eq!(
            completion_budget(&fields(r#"{"reasoning_budget_tokens": -1}"#)).unwrap(),
            None
        );
        let budget = completion_budget(&fields(
            r#"{"reasoning_budget_tokens": 8, "reasoning_budget_start_tag": "<think>",
                "reasoning_budget_end_tag": "</think>", "reasoning_budget_message": "Done."}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            budget,
            BudgetText {
                start: "<think>".into(),
                ends: vec!["</think>".into()],
                message: "Done.".into(),
                tokens: Some(8),
            }
        );
        let err = completion_budget(&fields(r#"{"reasoning_budget_tokens": 8}"#)).unwrap_err();
        assert!(
            err.to_string().contains("reasoning_budget_start_tag"),
            "{err}"
        );
        let err = completion_budget(&fields(
            r#"{"reasoning_control": true, "reasoning_budget_start_tag": "<think>",
                "reasoning_budget_end_tags": [""]}"#,
        ))
        .unwrap_err();
        assert!(err.to_string().contains("reasoning_control on"), "{err}");
        let err = completion_budget(&fields(r#"{"reasoning_budget_tokens": -2}"#)).unwrap_err();
        assert!(err.to_string().contains("-2"), "{err}");
    }

    #[test]
    fn a_chat_budget_takes_the_forms_tags_unless_the_request_names_its_own() {
        let none = fields("{}");
        assert_eq!(
            chat_budget(&none, None, "", Form::Think { open: true }),
            None
        );
        assert_eq!(
            chat_budget(&none, Some(0), "", Form::Think { open: true }),
            None,
            "0 switches thinking off in the template"
        );
        let think = chat_budget(&none, Some(5), "Time's up.", Form::Think { open: false }).unwrap();
        assert_eq!(
            (
                think.start.as_str(),
                think.ends.clone(),
                think.message.as_str()
            ),
            ("<think>", vec!["</think>".to_owned()], "Time's up.")
        );
        let control = fields(r#"{"reasoning_control": true}"#);
        let harmony = chat_budget(&control, None, "", Form::Harmony).unwrap();
        assert_eq!(harmony.start, "<|channel|>analysis<|message|>");
        assert_eq!(harmony.ends, ["<|end|>"]);
        assert_eq!(harmony.tokens, None);
        let own = fields(
            r#"{"reasoning_budget_start_tag": "[THINK]", "reasoning_budget_end_tags": ["[/THINK]"],
                "reasoning_budget_message": ""}"#,
        );
        let own = chat_budget(&own, Some(3), "default", Form::Think { open: false }).unwrap();
        assert_eq!(
            (own.start.as_str(), own.ends.clone(), own.message.as_str()),
            ("[THINK]", vec!["[/THINK]".to_owned()], "")
        );
    }
}
