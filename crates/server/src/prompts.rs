//! llama-server's `prompt` field as `/completion` and `/v1/completions` read it: one prompt or a
//! list of them, each a text, token ids, text and token ids mixed in one sequence, or llama.cpp's
//! JSON prompt object (`{"prompt_string": ..., "multimodal_data": [...]}`). A list of prompts is
//! answered as a list (one generation each); this module only reads the field.

use serde_json::Value;

use crate::error::ApiError;
use crate::request::{PromptInput, PromptPiece};

/// The key of a JSON prompt object's text.
const PROMPT_STRING: &str = "prompt_string";
/// The key of a JSON prompt object's images or audio, base64 (llama.cpp's multimodal input).
const MULTIMODAL_DATA: &str = "multimodal_data";

/// The prompts of a `prompt` field, in order; `field` names it in errors. Read as llama-server
/// reads it: a list that holds a number anywhere is one prompt (token ids, or ids and texts
/// mixed); any other list is a list of prompts; an empty list is refused.
pub(crate) fn read_prompts(field: &str, value: &Value) -> Result<Vec<PromptInput>, ApiError> {
    let prompts = match value {
        Value::Array(items) if !items.iter().any(Value::is_number) => items
            .iter()
            .enumerate()
            .map(|(i, item)| read_one(&format!("{field}[{i}]"), item))
            .collect::<Result<Vec<_>, _>>()?,
        other => vec![read_one(field, other)?],
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid_param(
            field,
            format!("{field} must not be empty: send a text, token ids or a list of prompts"),
        ));
    }
    Ok(prompts)
}

/// One prompt: a text, token ids, ids and texts mixed, or a JSON prompt object.
fn read_one(field: &str, value: &Value) -> Result<PromptInput, ApiError> {
    match value {
        Value::String(text) => Ok(PromptInput::Text(text.clone())),
        Value::Array(items) => read_sequence(field, items),
        Value::Object(object) => {
            if object.contains_key(MULTIMODAL_DATA) {
                return Err(ApiError::unsupported(
                    &format!("{field}.{MULTIMODAL_DATA}"),
                    format!(
                        "{field}.{MULTIMODAL_DATA}: this server takes no multimodal input \
                         (images, audio); send {PROMPT_STRING} alone"
                    ),
                ));
            }
            let Some(inner) = object.get(PROMPT_STRING) else {
                return Err(bad_element(field, value));
            };
            if let Some(other) = object.keys().find(|k| *k != PROMPT_STRING) {
                return Err(ApiError::invalid_param(
                    field,
                    format!(
                        "{field}: a JSON prompt object takes {PROMPT_STRING} (and \
                         {MULTIMODAL_DATA}); `{other}` is not one of them"
                    ),
                ));
            }
            match inner {
                Value::String(text) => Ok(PromptInput::Text(text.clone())),
                Value::Array(items) => read_sequence(&format!("{field}.{PROMPT_STRING}"), items),
                other => Err(bad_element(&format!("{field}.{PROMPT_STRING}"), other)),
            }
        }
        other => Err(bad_element(field, other)),
    }
}

/// A sequence of token ids, or of ids and texts mixed (only the first piece, when a text, gets
/// the tokenizer's leading special tokens, as llama-server tokenizes it).
fn read_sequence(field: &str, items: &[Value]) -> Result<PromptInput, ApiError> {
    let mut pieces = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        pieces.push(match item {
            Value::String(text) => PromptPiece::Text(text.clone()),
            Value::Number(n) => {
                let id = n
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        ApiError::invalid_param(
                            field,
                            format!("{field}[{i}]: {n} is not a token id (an integer from 0)"),
                        )
                    })?;
                PromptPiece::Token(id)
            }
            other => return Err(bad_element(&format!("{field}[{i}]"), other)),
        });
    }
    if pieces.iter().all(|p| matches!(p, PromptPiece::Token(_))) {
        let ids = pieces
            .into_iter()
            .filter_map(|p| match p {
                PromptPiece::Token(id) => Some(id),
                PromptPiece::Text(_) => None,
            })
            .collect();
        return Ok(PromptInput::Tokens(ids));
    }
    Ok(PromptInput::Mixed(pieces))
}

fn bad_element(field: &str, value: &Value) -> ApiError {
    ApiError::invalid_param(
        field,
        format!(
            "{field}: expected a string, a list of token ids, a list of token ids and strings, \
             or a JSON object with {PROMPT_STRING}; got {value}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(value: Value) -> Result<Vec<PromptInput>, ApiError> {
        read_prompts("prompt", &value)
    }

    #[test]
    fn one_prompt_in_each_form() {
        assert!(matches!(&read(json!("hi")).unwrap()[..], [PromptInput::Text(t)] if t == "hi"));
        assert!(
            matches!(&read(json!([1, 2, 3])).unwrap()[..], [PromptInput::Tokens(t)] if t == &[1, 2, 3])
        );
        let mixed = read(json!([1, "a", 2])).unwrap();
        assert!(matches!(&mixed[..], [PromptInput::Mixed(p)] if p.len() == 3));
        let object = read(json!({"prompt_string": "hi"})).unwrap();
        assert!(matches!(&object[..], [PromptInput::Text(t)] if t == "hi"));
    }

    #[test]
    fn a_list_without_numbers_is_a_list_of_prompts() {
        let prompts = read(json!([[1, 2], "text", {"prompt_string": "x"}, [3, "y"]])).unwrap();
        assert_eq!(prompts.len(), 4);
        assert!(matches!(&prompts[0], PromptInput::Tokens(t) if t == &[1, 2]));
        assert!(matches!(&prompts[1], PromptInput::Text(t) if t == "text"));
        assert!(matches!(&prompts[2], PromptInput::Text(t) if t == "x"));
        assert!(matches!(&prompts[3], PromptInput::Mixed(_)));
    }

    #[test]
    fn refusals_name_what_to_change() {
        let err = format!("{:?}", read(json!([])).unwrap_err());
        assert!(err.contains("must not be empty"), "{err}");
        let err = format!(
            "{:?}",
            read(json!({"prompt_string": "a", "multimodal_data": ["AAAA"]})).unwrap_err()
        );
        assert!(err.contains("multimodal_data"), "{err}");
        let err = format!("{:?}", read(json!([1, -2])).unwrap_err());
        assert!(err.contains("token id"), "{err}");
        let err = format!("{:?}", read(json!({"text": "a"})).unwrap_err());
        assert!(err.contains("prompt_string"), "{err}");
        assert!(read(json!(5)).is_err());
        assert!(read(json!([[1], 2])).is_err());
    }
}
