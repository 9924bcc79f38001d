//! Function calling on `/v1/chat/completions`: `tools`, `tool_choice`, `parallel_tool_calls` (and
//! the legacy `functions`/`function_call`), the conversation's tool calls and results passed to
//! the chat template, the model's tool calls parsed out of its text, and the output constrained to
//! a valid call when the request requires one.
//!
//! Tool calls are written in the format the model was trained on, told by its chat template:
//! Hermes/Qwen `<tool_call>{"name": …, "arguments": …}</tool_call>`, Mistral
//! `[TOOL_CALLS] [{"name": …, "arguments": …}]`, Llama 3.x `{"name": …, "parameters": …}` (after
//! `<|python_tag|>` or alone), or, for templates that know no format, a bare JSON object
//! `{"name": …, "arguments": …}`.

use mlxcel_engine::{Constraint, with_json_options};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ApiError;

/// One function the model may call.
#[derive(Debug, Clone)]
pub(crate) struct Tool {
    pub name: String,
    pub parameters: Value,
}

/// What the request allows or asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolChoice {
    /// Tools are shown to the model but its output is text.
    None,
    /// The model decides; calls in its output are parsed.
    Auto,
    /// The output is one or more calls to any of the tools.
    Required,
    /// The output is a call to this function.
    Named(String),
}

/// How the model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolFormat {
    Hermes,
    Mistral,
    Llama3,
    Json,
}

impl ToolFormat {
    /// The format the chat template's source shows.
    pub(crate) fn of_template(source: &str) -> Self {
        if source.contains("<tool_call>") {
            Self::Hermes
        } else if source.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            Self::Llama3
        } else {
            Self::Json
        }
    }
}

/// A parsed call, as OpenAI returns it (`arguments` a JSON string).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// The request's tools and choice: `tools` with `tool_choice`, or the legacy `functions` with
/// `function_call`.
pub(crate) fn read_tools(
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    functions: Option<Vec<Value>>,
    function_call: Option<Value>,
) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let (list, choice, field, choice_field) = match (tools, functions) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_param(
                "functions",
                "give `tools` or the legacy `functions`, not both",
            ));
        }
        (Some(tools), None) => (tools, tool_choice, "tools", "tool_choice"),
        (None, Some(functions)) => {
            // Legacy: each entry is the function itself.
            let tools = functions
                .into_iter()
                .map(|f| json!({"type": "function", "function": f}))
                .collect();
            let choice = function_call.map(|c| match c {
                Value::Object(ref m) if m.contains_key("name") => {
                    json!({"type": "function", "function": c})
                }
                other => other,
            });
            (tools, choice, "functions", "function_call")
        }
        (None, None) => {
            if tool_choice.is_some() {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "tool_choice needs `tools`",
                ));
            }
            return Ok((Vec::new(), ToolChoice::None));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let bad = |why: &str| ApiError::invalid_param(field, format!("{field}[{i}]: {why}"));
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("only tools of type `function` are supported"));
        }
        let function = tool
            .get("function")
            .ok_or_else(|| bad("missing `function`"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("missing `function.name`"))?;
        let parameters = function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return Err(bad("`function.parameters` must be a JSON schema object"));
        }
        out.push(Tool {
            name: name.to_owned(),
            parameters,
        });
    }
    let choice = match choice {
        None if out.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" | "any" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid_param(
                    choice_field,
                    format!("`{other}` is not one of none, auto, required or a named function"),
                ));
            }
        },
        Some(Value::Object(m)) => {
            let name = m
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        choice_field,
                        format!("{choice_field} must name a function: {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                    )
                })?;
            if !out.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid_param(
                    choice_field,
                    format!("{choice_field} names `{name}`, which is not among the tools"),
                ));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                choice_field,
                format!("{other} is not a valid {choice_field}"),
            ));
        }
    };
    Ok((out, choice))
}

/// The JSON schema of one call in `format`'s key names.
fn call_schema(tool: &Tool, format: ToolFormat) -> Value {
    let arguments = match format {
        ToolFormat::Llama3 => "parameters",
        _ => "arguments",
    };
    json!({
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            arguments: tool.parameters,
        },
        "required": ["name", arguments],
        "additionalProperties": false,
    })
}

/// The constraint that makes the output a valid call (or calls, `parallel`) when `choice`
/// requires one; `None` for `auto` and `none`.
pub(crate) fn constraint(
    tools: &[Tool],
    choice: &ToolChoice,
    format: ToolFormat,
    parallel: bool,
) -> Option<Constraint> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
    };
    let calls = json!({"anyOf": chosen.iter().map(|t| call_schema(t, format)).collect::<Vec<_>>()});
    // The engine's JSON options (bounded whitespace) on each `%json` schema's root.
    let one = with_json_options(calls.clone());
    let lark = match format {
        ToolFormat::Hermes => {
            let repeat = if parallel { r#" ("\n" call)*"# } else { "" };
            format!(
                "start: call{repeat}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {one}\n"
            )
        }
        // Mistral's marker is a special token the grammar cannot write as text: the calls are
        // their JSON list (parsed as Mistral's too).
        ToolFormat::Mistral => {
            let list = json!({"type": "array", "items": calls, "minItems": 1,
                              "maxItems": if parallel { Value::Null } else { json!(1) }});
            let list = with_json_options(strip_nulls(list));
            format!("start: %json {list}\n")
        }
        ToolFormat::Llama3 | ToolFormat::Json => format!("start: %json {one}\n"),
    };
    Some(Constraint::Lark(lark))
}

fn strip_nulls(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// Splits the model's output into text and tool calls, if it made any: `None` when the text
/// holds no call (it is then the reply's content).
pub(crate) fn parse_calls(
    text: &str,
    format: ToolFormat,
    id_prefix: &str,
) -> Option<(String, Vec<ToolCall>)> {
    let mut calls = Vec::new();
    let mut content = String::new();
    let trimmed = text.trim();
    match format {
        ToolFormat::Hermes if text.contains("<tool_call>") => {
            let mut rest = text;
            while let Some(start) = rest.find("<tool_call>") {
                content.push_str(&rest[..start]);
                let after = &rest[start + "<tool_call>".len()..];
                let end = after.find("</tool_call>").unwrap_or(after.len());
                calls.extend(call_of(after[..end].trim(), "arguments"));
                rest = after.get(end + "</tool_call>".len()..).unwrap_or("");
            }
            content.push_str(rest);
        }
        ToolFormat::Mistral => {
            let body = trimmed
                .strip_prefix("[TOOL_CALLS]")
                .unwrap_or(trimmed)
                .trim();
            let Ok(Value::Array(items)) = serde_json::from_str::<Value>(body) else {
                return parse_json_object(trimmed, id_prefix);
            };
            calls.extend(items.iter().filter_map(|v| call_from_value(v, "arguments")));
        }
        ToolFormat::Llama3 => {
            let body = trimmed
                .strip_prefix("<|python_tag|>")
                .unwrap_or(trimmed)
                .trim();
            calls.extend(call_of(body, "parameters"));
            if calls.is_empty() {
                calls.extend(call_of(body, "arguments"));
            }
        }
        _ => return parse_json_object(trimmed, id_prefix),
    }
    if calls.is_empty() {
        return None;
    }
    Some((content.trim().to_owned(), with_ids(calls, id_prefix)))
}

/// The generic format: the whole output one JSON object with `name` and `arguments` (or
/// `parameters`).
fn parse_json_object(text: &str, id_prefix: &str) -> Option<(String, Vec<ToolCall>)> {
    let call = call_of(text, "arguments").or_else(|| call_of(text, "parameters"))?;
    Some((String::new(), with_ids(vec![call], id_prefix)))
}

fn call_of(json_text: &str, arguments_key: &str) -> Option<(String, Value)> {
    call_from_value(
        &serde_json::from_str::<Value>(json_text).ok()?,
        arguments_key,
    )
}

fn call_from_value(value: &Value, arguments_key: &str) -> Option<(String, Value)> {
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = value.get(arguments_key)?.clone();
    Some((name, arguments))
}

/// Calls the reply made in its own form (gpt-oss's harmony messages), each a function's name and
/// its arguments as written, with ids as [`parse_calls`] gives them.
pub(crate) fn named_calls(
    calls: impl IntoIterator<Item = (String, String)>,
    id_prefix: &str,
) -> Vec<ToolCall> {
    with_ids(
        calls
            .into_iter()
            .map(|(name, arguments)| (name, Value::String(arguments)))
            .collect(),
        id_prefix,
    )
}

fn with_ids(calls: Vec<(String, Value)>, id_prefix: &str) -> Vec<ToolCall> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, (name, arguments))| ToolCall {
            id: format!("call_{id_prefix}_{i}"),
            kind: "function",
            function: FunctionCall {
                name,
                // OpenAI sends the arguments as a JSON string; a string value stays as it is.
                arguments: match arguments {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Tool> {
        vec![Tool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}),
        }]
    }

    #[test]
    fn each_format_parses_its_calls() {
        let hermes = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_calls(hermes, ToolFormat::Hermes, "x").unwrap();
        assert_eq!(content, "Let me check.");
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
        let mistral = r#"[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]"#;
        let (_, calls) = parse_calls(mistral, ToolFormat::Mistral, "x").unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[1].id.as_str(), calls[1].function.arguments.as_str()),
            ("call_x_1", r#"{"x":1}"#)
        );
        let llama = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}"#;
        let (_, calls) = parse_calls(llama, ToolFormat::Llama3, "x").unwrap();
        assert_eq!(calls[0].function.arguments, r#"{"city":"Rome"}"#);
        assert!(parse_calls("Just text.", ToolFormat::Hermes, "x").is_none());
        assert!(parse_calls("Just text.", ToolFormat::Json, "x").is_none());
    }

    #[test]
    fn choices_are_read_and_checked() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        let (t, c) = read_tools(Some(tools.clone()), None, None, None).unwrap();
        assert_eq!((t.len(), c), (1, ToolChoice::Auto));
        let (_, c) = read_tools(Some(tools.clone()), Some(json!("required")), None, None).unwrap();
        assert_eq!(c, ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "f"}});
        let (_, c) = read_tools(Some(tools.clone()), Some(named), None, None).unwrap();
        assert_eq!(c, ToolChoice::Named("f".into()));
        let unknown = json!({"type": "function", "function": {"name": "g"}});
        assert!(read_tools(Some(tools.clone()), Some(unknown), None, None).is_err());
        // Legacy functions map to tools.
        let (t, c) = read_tools(
            None,
            None,
            Some(vec![json!({"name": "f"})]),
            Some(json!({"name": "f"})),
        )
        .unwrap();
        assert_eq!(
            (t[0].name.as_str(), c),
            ("f", ToolChoice::Named("f".into()))
        );
        assert!(read_tools(None, Some(json!("auto")), None, None).is_err());
    }

    #[test]
    fn required_calls_compile_to_grammars() {
        for format in [
            ToolFormat::Hermes,
            ToolFormat::Mistral,
            ToolFormat::Llama3,
            ToolFormat::Json,
        ] {
            let Some(Constraint::Lark(lark)) =
                constraint(&weather(), &ToolChoice::Required, format, true)
            else {
                panic!("a grammar");
            };
            assert!(lark.contains("get_weather"), "{lark}");
        }
        assert!(constraint(&weather(), &ToolChoice::Auto, ToolFormat::Hermes, true).is_none());
    }
}
