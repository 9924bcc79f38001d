//! The llama-server request fields this server does not act on. llama-server reads them on
//! every generation route (its OpenAI routes hand their body to its own); here a request may
//! send one only at a value where llama-server does nothing either, and is refused with a 400
//! naming the field otherwise, so that no field is silently dropped
//! (`compat/llama-server/<build>/manifest.toml` gives each its reason).

use serde_json::Value;

use crate::error::ApiError;

/// llama-server request fields this server does not act on, each with the values at which
/// llama-server does nothing either (JSON). A request that sends one at another value is
/// refused with a 400 naming it, never silently served without it (the compatibility
/// manifest lists each with its reason).
pub const INERT_FIELDS: &[(&str, &[&str])] = &[
    ("n_keep", &["0", "-1"]),
    ("n_discard", &["0"]),
    ("n_cache_reuse", &["0"]),
    ("reasoning_format", &["\"none\"", "\"auto\""]),
    ("continue_final_message", &["false"]),
    ("echo", &["false"]),
    ("grammar_type", &["\"gbnf\""]),
    ("add_generation_prompt", &["true"]),
    ("chat_template_kwargs", &["{}"]),
    ("reasoning_effort", &["null"]),
    ("thinking_budget_tokens", &["-1"]),
];

/// Whether `value` is one of the `neutral` JSON values (numbers compared as numbers).
fn is_neutral(value: &Value, neutral: &[&str]) -> bool {
    neutral.iter().any(|text| {
        let Ok(expected) = serde_json::from_str::<Value>(text) else {
            return false;
        };
        match (value.as_f64(), expected.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => *value == expected,
        }
    })
}

/// Refuses the first inert field `body` sends at a value llama-server would act on; `null` is
/// taken as absent. `handled` are the fields the route acts on itself (the chat route's
/// reasoning fields), which other routes refuse.
pub fn refuse_inert_fields(body: &[u8], handled: &[&str]) -> Result<(), ApiError> {
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return Ok(()); // the typed parse reports malformed bodies
    };
    for (name, neutral) in INERT_FIELDS.iter().filter(|(n, _)| !handled.contains(n)) {
        if let Some(value) = fields.get(*name).filter(|v| !v.is_null())
            && !is_neutral(value, neutral)
        {
            return Err(ApiError::unsupported(
                name,
                format!(
                    "{name}={value} is not supported by this server (accepted only as {}); \
                     see docs/server.md",
                    neutral.join(" or ")
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_values_pass_and_others_are_named() {
        assert!(refuse_inert_fields(br#"{"n_keep": -1, "lora": null}"#, &[]).is_ok());
        let err = refuse_inert_fields(br#"{"n_discard": 5}"#, &[]).unwrap_err();
        assert!(format!("{err:?}").contains("n_discard"), "{err:?}");
        assert!(refuse_inert_fields(br#"{"n_cache_reuse": 4}"#, &[]).is_err());
        assert!(refuse_inert_fields(br#"{"lora": []}"#, &[]).is_ok());
        // A field a route handles itself passes there and is refused elsewhere.
        let thinking = br#"{"reasoning_format": "deepseek"}"#;
        assert!(refuse_inert_fields(thinking, &[]).is_err());
        assert!(refuse_inert_fields(thinking, &["reasoning_format"]).is_ok());
    }
}
