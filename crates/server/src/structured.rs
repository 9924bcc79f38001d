//! The request fields that ask for structured output, on every generating route: OpenAI's
//! `response_format` (`text`, `json_object`, `json_schema`), llama-server's `json_schema` and
//! `grammar` (GBNF), and vLLM's `guided_json`, `guided_regex` and `guided_grammar` (a Lark
//! grammar in llguidance's dialect). At most one may be given; each becomes an engine
//! [`Constraint`], enforced token by token, or a 400 naming the field.

use mlxcel_engine::Constraint;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// The structured-output fields of a request (declared inline in each route's request body, so
/// that a type error names the field, and gathered here).
#[derive(Debug, Default)]
pub(crate) struct ConstraintFields {
    pub response_format: Option<ResponseFormat>,
    pub json_schema: Option<Value>,
    pub grammar: Option<String>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_grammar: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<JsonSchemaFormat>,
    /// llama-server also accepts the schema directly under `response_format`.
    schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct JsonSchemaFormat {
    #[allow(dead_code)]
    name: Option<String>,
    schema: Option<Value>,
    /// OpenAI's `strict`: the output always follows the schema here, strict or not.
    #[allow(dead_code)]
    strict: Option<bool>,
}

impl ConstraintFields {
    /// The constraint the request asks for, if any.
    pub(crate) fn constraint(self) -> Result<Option<Constraint>, ApiError> {
        let mut given: Vec<(&'static str, Constraint)> = Vec::new();
        if let Some(format) = self.response_format {
            match format.kind.as_str() {
                "text" => {}
                "json_object" => given.push((
                    "response_format",
                    match format.schema {
                        Some(schema) => Constraint::JsonSchema(schema),
                        None => Constraint::JsonObject,
                    },
                )),
                "json_schema" => {
                    let schema = format
                        .json_schema
                        .and_then(|j| j.schema)
                        .or(format.schema)
                        .ok_or_else(|| {
                            ApiError::invalid_param(
                                "response_format",
                                "response_format type `json_schema` needs `json_schema.schema`",
                            )
                        })?;
                    given.push(("response_format", Constraint::JsonSchema(schema)));
                }
                other => {
                    return Err(ApiError::invalid_param(
                        "response_format",
                        format!(
                            "response_format type `{other}` is unknown: expected text, \
                             json_object or json_schema"
                        ),
                    ));
                }
            }
        }
        if let Some(schema) = self.json_schema.filter(|v| !v.is_null()) {
            given.push(("json_schema", Constraint::JsonSchema(schema)));
        }
        if let Some(schema) = self.guided_json.filter(|v| !v.is_null()) {
            given.push(("guided_json", Constraint::JsonSchema(schema)));
        }
        if let Some(rx) = self.guided_regex {
            given.push(("guided_regex", Constraint::Regex(rx)));
        }
        if let Some(lark) = self.guided_grammar {
            given.push(("guided_grammar", Constraint::Lark(lark)));
        }
        if let Some(gbnf) = self.grammar.filter(|g| !g.trim().is_empty()) {
            let lark = mlxcel_engine::gbnf_to_lark(&gbnf)
                .map_err(|e| ApiError::invalid_param("grammar", format!("grammar: {e}")))?;
            given.push(("grammar", Constraint::Lark(lark)));
        }
        match given.len() {
            0 => Ok(None),
            1 => Ok(given.pop().map(|(_, c)| c)),
            _ => Err(ApiError::invalid_param(
                given[1].0,
                format!(
                    "{} and {} both constrain the output: give one",
                    given[0].0, given[1].0
                ),
            )),
        }
    }
}
