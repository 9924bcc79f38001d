//! The Responses API's answer: a response object whose `output` holds a message item and
//! `function_call` items, whole or (its parts) in the numbered stream events of `stream.rs`.

use mlxcel_engine::{FinishReason, Usage};
use serde::Serialize;
use serde_json::Value;

use crate::chat;
use crate::tools::{ToolCall, ToolFormat};

use super::wire::{FunctionTool, TextConfig};

/// The response object, whole or (in progress, without output) in the stream's first events.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub status: &'static str,
    pub error: Option<()>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<()>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// The request's, as given (`auto` when absent).
    pub tool_choice: Value,
    pub tools: Vec<FunctionTool>,
    pub text: TextConfig,
    pub store: bool,
    pub background: bool,
    pub truncation: &'static str,
    pub metadata: serde_json::Map<String, Value>,
    pub usage: Option<UsageBody>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

/// An `output_text` content part.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OutputText {
    #[serde(rename = "type")]
    kind: &'static str,
    pub text: String,
    annotations: Vec<Value>,
    logprobs: Vec<Value>,
}

impl OutputText {
    pub(super) fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct UsageBody {
    input_tokens: usize,
    input_tokens_details: InputTokensDetails,
    output_tokens: usize,
    output_tokens_details: OutputTokensDetails,
    total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct InputTokensDetails {
    cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct OutputTokensDetails {
    reasoning_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        }
    }
}

/// What every body of one response shares, and the builder of its output.
pub(super) struct ReplyMeta {
    pub skeleton: ResponseObject,
    pub message_id: String,
    /// The format calls are looked for in; `None` without tools.
    pub tools: Option<ToolFormat>,
}

impl ReplyMeta {
    pub(super) fn message(&self, text: String, status: &'static str) -> OutputItem {
        OutputItem::Message {
            id: self.message_id.clone(),
            status,
            role: "assistant",
            content: vec![OutputText::new(text)],
        }
    }

    fn function_call(&self, index: usize, call: &ToolCall) -> OutputItem {
        OutputItem::FunctionCall {
            id: format!("fc_{}_{index}", &self.skeleton.id["resp_".len()..]),
            call_id: call.id.clone(),
            name: call.function.name.clone(),
            arguments: call.function.arguments.clone(),
            status: "completed",
        }
    }

    /// The finished response: `completed` (its output a message, or the calls with the text
    /// around them in a message first), or `incomplete` when the budget ran out.
    pub(super) fn finished(
        &self,
        text: &str,
        reason: FinishReason,
        usage: Usage,
    ) -> ResponseObject {
        let mut response = self.skeleton.clone();
        response.usage = Some(usage.into());
        if let Some((text, calls)) = chat::calls_in(text, reason, self.tools, &self.skeleton.id) {
            if !text.is_empty() {
                response.output.push(self.message(text, "completed"));
            }
            for (i, call) in calls.iter().enumerate() {
                response.output.push(self.function_call(i, call));
            }
            response.status = "completed";
            return response;
        }
        let incomplete = reason == FinishReason::Length;
        response.status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        response.incomplete_details = incomplete.then_some(IncompleteDetails {
            reason: "max_output_tokens",
        });
        response
            .output
            .push(self.message(text.to_owned(), response.status));
        response
    }
}
