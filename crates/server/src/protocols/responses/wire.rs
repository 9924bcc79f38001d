//! The Responses API's request and its translation into the one request: `instructions` and the
//! message items become typed turns, `function_call` items their calls and
//! `function_call_output` items `tool` turns, function tools the tools, and `text.format` a
//! structured-output constraint. What needs a stored response is refused.

use std::collections::HashMap;

use mlxcel_engine::{Constraint, SamplingOverrides};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::llama_fields::LlamaFields;
use crate::request::{
    Call, Chat, Generation, Params, Prompt, ToolRequest, Turn, budget, function_tool,
};
use crate::tools::read_tools;

#[derive(Debug, Deserialize)]
pub(super) struct ResponsesRequest {
    pub model: Option<String>,
    input: Input,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    // The sampling fields (`temperature`, `top_p` ...) are read beside these, with llama-server's
    // fields (read.rs's `GenerationBody`).
    #[serde(default)]
    pub stream: bool,
    pub text: Option<TextConfig>,
    pub tools: Option<Vec<FunctionTool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    // Refused: they need responses stored on the server.
    previous_response_id: Option<String>,
    store: Option<bool>,
    background: Option<bool>,
    conversation: Option<Value>,
    prompt: Option<Value>,
    include: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item; which fields it has depends on `type` (a message when absent).
#[derive(Debug, Deserialize)]
pub(super) struct InputItem {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<ItemContent>,
    /// `function_call` and `function_call_output`: the call.
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    output: Option<ItemContent>,
}

/// A message's content (or a call's output): a string or content parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ItemContent {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub(super) struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub(super) struct FunctionTool {
    #[serde(rename = "type")]
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub(super) struct TextConfig {
    pub format: Option<TextFormat>,
}

/// `text.format`: `text`, `json_object`, or `json_schema` with the schema inline.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub(super) struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// The output always follows the schema here, strict or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl TextFormat {
    /// The structured-output constraint it asks for (structured.rs's, for `response_format`).
    fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        match self.kind.as_str() {
            "text" => Ok(None),
            "json_object" => Ok(Some(Constraint::JsonObject)),
            "json_schema" => match &self.schema {
                Some(schema) => Ok(Some(Constraint::JsonSchema(schema.clone()))),
                None => Err(ApiError::invalid_param(
                    "text.format.schema",
                    "text.format of type `json_schema` needs `schema`",
                )),
            },
            other => Err(ApiError::invalid_param(
                "text.format.type",
                format!(
                    "text.format type `{other}` is unknown: expected text, json_object or \
                     json_schema"
                ),
            )),
        }
    }
}

/// Refuses what needs stored responses or is not served.
fn refuse_unserved(request: &ResponsesRequest) -> Result<(), ApiError> {
    let stored = |field: &str| {
        Err(ApiError::unsupported(
            field,
            format!(
                "{field} is not supported: this server stores no responses; send the whole \
                 conversation in `input`"
            ),
        ))
    };
    if request.previous_response_id.is_some() {
        return stored("previous_response_id");
    }
    if request.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return stored("conversation");
    }
    if request.store == Some(true) {
        return stored("store");
    }
    if request.background == Some(true) {
        return stored("background");
    }
    if request.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::unsupported(
            "prompt",
            "prompt (a stored prompt template) is not supported; send `instructions` and `input`",
        ));
    }
    if let Some(first) = request.include.as_ref().and_then(|i| i.first()) {
        return Err(ApiError::unsupported(
            "include",
            format!("include `{first}` is not supported: the output has no extra data to include"),
        ));
    }
    Ok(())
}

/// The text of `content`: a string, or its text parts concatenated; `at` names it in refusals.
fn text_of(content: ItemContent, at: &str) -> Result<String, ApiError> {
    match content {
        ItemContent::Text(text) => Ok(text),
        ItemContent::Parts(parts) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        let at = format!("{at}[{j}]");
                        return Err(ApiError::unsupported(
                            &at,
                            format!(
                                "{at}: content parts of type `{kind}` are not supported; send text"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

/// The conversation as the template takes it: plain text turns, or (with function calls)
/// turns in Hugging Face's shape with `tool_calls` and `tool` messages.
pub(super) fn turns(instructions: Option<String>, input: Input) -> Result<Vec<Turn>, ApiError> {
    let mut out: Vec<Turn> = Vec::new();
    if let Some(instructions) = instructions {
        out.push(Turn::text("system", instructions));
    }
    let items = match input {
        Input::Text(text) => vec![InputItem {
            kind: None,
            role: Some("user".into()),
            content: Some(ItemContent::Text(text)),
            call_id: None,
            name: None,
            arguments: None,
            output: None,
        }],
        Input::Items(items) if items.is_empty() => {
            return Err(ApiError::invalid_param(
                "input",
                "input is empty; send at least one item",
            ));
        }
        Input::Items(items) => items,
    };
    // The function each call went to, for the `name` of its output's turn.
    let mut called: HashMap<String, String> = HashMap::new();
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let missing = |field: &str| {
            ApiError::invalid_param(
                format!("{at}.{field}"),
                format!(
                    "{at}: a {} item needs `{field}`",
                    item.kind.as_deref().unwrap_or("message")
                ),
            )
        };
        match item.kind.as_deref() {
            None | Some("message") => {
                let role = match item.role.as_deref() {
                    Some(role @ ("user" | "assistant" | "system")) => role,
                    // Chat templates know `system`; the developer's instructions are that.
                    Some("developer") => "system",
                    Some(other) => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.role"),
                            format!(
                                "{at}.role: `{other}` is not user, assistant, system or developer"
                            ),
                        ));
                    }
                    None => return Err(missing("role")),
                };
                let content = match item.content {
                    Some(content) => text_of(content, &format!("{at}.content"))?,
                    None => return Err(missing("content")),
                };
                out.push(Turn::text(role, content));
            }
            Some("function_call") => {
                let (Some(call_id), Some(name)) = (item.call_id.clone(), item.name.clone()) else {
                    return Err(missing(if item.call_id.is_none() {
                        "call_id"
                    } else {
                        "name"
                    }));
                };
                let arguments = item.arguments.unwrap_or_else(|| "{}".into());
                called.insert(call_id.clone(), name.clone());
                let call = Call::new(Some(call_id), Some(name), Some(Value::String(arguments)));
                // Calls after an assistant message (or after other calls) belong to its turn.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    _ => out.push(Turn {
                        tool_calls: Some(vec![call]),
                        ..Turn::text("assistant", "")
                    }),
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item.call_id.clone() else {
                    return Err(missing("call_id"));
                };
                let output = match item.output {
                    Some(output) => text_of(output, &format!("{at}.output"))?,
                    None => return Err(missing("output")),
                };
                out.push(Turn {
                    name: called.get(&call_id).cloned(),
                    tool_call_id: Some(call_id),
                    ..Turn::text("tool", output)
                });
            }
            Some(other) => {
                return Err(ApiError::unsupported(
                    &at,
                    format!(
                        "{at}: items of type `{other}` are not supported; send messages, \
                         function_call and function_call_output items"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// The request's function tools in the chat shape templates take, and the server's tools and
/// choice.
fn read_function_tools(
    tools: &[FunctionTool],
    choice: Option<Value>,
    parallel: bool,
) -> Result<ToolRequest, ApiError> {
    let mut list = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::unsupported(
                "tools",
                format!(
                    "tools[{i}]: built-in tools (`{}`) are not supported; give function tools",
                    tool.kind
                ),
            ));
        }
        let name = tool
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid_param("tools", format!("tools[{i}]: missing `name`"))
            })?;
        list.push(function_tool(
            name,
            tool.description.as_deref(),
            tool.parameters.as_ref().filter(|p| !p.is_null()),
        ));
    }
    let choice = match choice {
        // The Responses shape names the function on the choice itself.
        Some(Value::Object(m)) => match m.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = m.get("name").cloned().unwrap_or(Value::Null);
                Some(json!({"type": "function", "function": {"name": name}}))
            }
            other => {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    format!(
                        "tool_choice of type `{}` is not supported: give none, auto, required \
                         or {{\"type\": \"function\", \"name\": …}}",
                        other.unwrap_or("")
                    ),
                ));
            }
        },
        other => other,
    };
    let given = (!list.is_empty()).then(|| list.clone());
    let (tools, choice) = read_tools(given, choice, None, None)?;
    Ok(ToolRequest {
        listed: list,
        tools,
        choice,
        parallel,
        other_constraint: "text.format",
    })
}

impl ResponsesRequest {
    /// The conversation and its tools (what `/v1/responses` renders and `input_tokens` counts);
    /// the fields the response echoes stay.
    pub(super) fn chat(&mut self) -> Result<Chat, ApiError> {
        refuse_unserved(self)?;
        let raw_tools = self.tools.clone().unwrap_or_default();
        let parallel = self.parallel_tool_calls.unwrap_or(true);
        let tools = read_function_tools(&raw_tools, self.tool_choice.clone(), parallel)?;
        let input = std::mem::replace(&mut self.input, Input::Items(Vec::new()));
        let turns = turns(self.instructions.clone(), input)?;
        Ok(Chat {
            turns,
            tools,
            reasoning: Default::default(),
            continuation: Default::default(),
        })
    }

    /// The one request, with the body's `sampling` fields and `llama` (llama-server's fields of
    /// the same body) applied; `n_probs` and `return_tokens` have no place in this shape (nor in
    /// llama-server's).
    pub(super) fn generation(
        &mut self,
        sampling: SamplingOverrides,
        llama: &LlamaFields,
    ) -> Result<Generation, ApiError> {
        if self.max_output_tokens.is_some_and(|n| n < 1) {
            return Err(ApiError::invalid_param(
                "max_output_tokens",
                "max_output_tokens: expected at least 1",
            ));
        }
        let chat = self.chat()?;
        let mut params = Params {
            max_new_tokens: budget("max_output_tokens", self.max_output_tokens)?,
            constraint: match self.text.as_ref().and_then(|t| t.format.as_ref()) {
                Some(format) => format.constraint()?,
                None => None,
            },
            sampling,
            ..Params::default()
        };
        llama.apply(&mut params)?;
        Ok(Generation {
            prompt: Prompt::Chat(chat),
            params,
            stream: self.stream,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_items_join_the_assistant_turn_and_answer_as_tool_turns() {
        let input: Input = serde_json::from_value(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]))
        .unwrap();
        let turns = turns(None, input).unwrap();
        assert!(
            turns.iter().any(Turn::is_tool_turn),
            "function items need the rich context"
        );
        let turns: Vec<Value> = turns.iter().map(Turn::template_value).collect();
        let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let calls = turns[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["arguments"], json!({"city": "Paris"}));
        assert_eq!(turns[3]["name"], "get_weather");
    }

    #[test]
    fn a_string_input_is_one_user_turn_after_the_instructions() {
        let turns = turns(Some("Be brief.".into()), Input::Text("Hi".into())).unwrap();
        assert!(!turns.iter().any(Turn::is_tool_turn), "text only is plain");
        let pairs: Vec<(&str, &str)> = turns
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(pairs, [("system", "Be brief."), ("user", "Hi")]);
    }
}
