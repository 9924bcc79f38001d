//! Anthropic's answers: a message of `text` and `tool_use` content blocks with Anthropic's
//! `stop_reason`, whole or as Anthropic's named stream events.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::{Engine, FinishReason, Usage};
use serde::Serialize;
use serde_json::{Value, json};

use crate::body::Body;
use crate::chat;
use crate::error::ApiError;
use crate::generate::{Outcome, StreamFormat, TokenRecord, Tracked};
use crate::handler::Reply;
use crate::tools::{ToolCall, ToolFormat};

/// Characters of a call's JSON input per `input_json_delta`.
const INPUT_PIECE: usize = 16;

/// The reply to one `/v1/messages` request.
pub(super) struct MessagesReply {
    pub meta: ReplyMeta,
    pub engine: Arc<Engine>,
}

impl Reply for MessagesReply {
    type Stream = MessagesStream;

    fn stream(self, tracked: &Tracked) -> MessagesStream {
        MessagesStream {
            input_tokens: tracked.prompt_tokens(),
            reply: self.meta,
            engine: self.engine,
            tokens: Vec::new(),
            text: String::new(),
        }
    }

    fn whole(self, _: &Tracked, outcome: Outcome) -> Response<Body> {
        let reply = self.meta;
        let tokens: Vec<u32> = outcome.tokens.iter().map(|t| t.token).collect();
        let ending = reply.ending(&self.engine, &outcome.text, outcome.reason, &tokens);
        let mut content = Vec::new();
        if !ending.text.is_empty() || ending.calls.is_empty() {
            content.push(ContentBlock::Text { text: ending.text });
        }
        content.extend(ending.calls.iter().map(|call| ContentBlock::ToolUse {
            id: call.id.clone(),
            name: call.function.name.clone(),
            input: chat::arguments_value(call),
        }));
        let body = reply.message(
            content,
            Some(ending.stop_reason),
            ending.stop_sequence,
            outcome.usage.into(),
        );
        crate::body::json(StatusCode::OK, &body)
    }
}

/// A message, whole or (empty, in `message_start`) streamed.
#[derive(Debug, Serialize)]
pub(super) struct MessageBody {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: String,
    content: Vec<ContentBlock>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: UsageBody,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ContentBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct UsageBody {
    /// Prompt tokens computed; with `cache_read_input_tokens`, the whole prompt (Anthropic's
    /// split: the tokens read from a cache are not input tokens).
    input_tokens: usize,
    cache_read_input_tokens: usize,
    output_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens - usage.cached_tokens,
            cache_read_input_tokens: usage.cached_tokens,
            output_tokens: usage.completion_tokens,
        }
    }
}

/// How a reply ended, in Anthropic's terms.
pub(super) struct Ending {
    /// The text (around the calls, when there are calls).
    text: String,
    calls: Vec<ToolCall>,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// What every body of one reply shares.
pub(super) struct ReplyMeta {
    pub id: String,
    pub model: String,
    /// The format calls are looked for in; `None` without tools.
    pub tools: Option<ToolFormat>,
    pub stops: Vec<String>,
}

impl ReplyMeta {
    /// The reply's calls and stop reason: `tool_use` when it made calls, `max_tokens` when the
    /// budget ran out, `stop_sequence` (with the one that matched) or `end_turn`.
    fn ending(&self, engine: &Engine, text: &str, reason: FinishReason, tokens: &[u32]) -> Ending {
        if let Some((text, calls)) = chat::calls_in(text, reason, self.tools, &self.id) {
            return Ending {
                text,
                calls,
                stop_reason: "tool_use",
                stop_sequence: None,
            };
        }
        let stop_sequence = (reason == FinishReason::Stop)
            .then(|| chat::matched_stop(engine, tokens, text, &self.stops))
            .flatten();
        let stop_reason = match reason {
            FinishReason::Length => "max_tokens",
            _ if stop_sequence.is_some() => "stop_sequence",
            _ => "end_turn",
        };
        Ending {
            text: text.to_owned(),
            calls: Vec::new(),
            stop_reason,
            stop_sequence,
        }
    }

    fn message(
        &self,
        content: Vec<ContentBlock>,
        stop_reason: Option<&'static str>,
        stop_sequence: Option<String>,
        usage: UsageBody,
    ) -> MessageBody {
        MessageBody {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage,
        }
    }
}

/// One event of Anthropic's stream; its `type` is also the SSE event's name.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum StreamEvent {
    MessageStart {
        message: MessageBody,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: UsageBody,
    },
    MessageStop,
}

impl StreamEvent {
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::Ping => "ping",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Serialize)]
pub(super) struct MessageDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// Anthropic's stream: `message_start`, then per content block `content_block_start`, its
/// deltas and `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`.
/// Without tools the text block opens at once and its deltas follow the tokens; with tools the
/// text is held back until the end, then sent as a text block and a `tool_use` block per call.
pub(super) struct MessagesStream {
    reply: ReplyMeta,
    engine: Arc<Engine>,
    input_tokens: usize,
    /// Every generated token (to tell which stop sequence ended the reply).
    tokens: Vec<u32>,
    /// The reply's text so far.
    text: String,
}

impl StreamFormat for MessagesStream {
    type Chunk = StreamEvent;
    const DONE_LINE: bool = false;

    fn opening(&mut self) -> Vec<StreamEvent> {
        // What the prefix cache held is known at the end: `message_delta` carries the split.
        let usage = UsageBody {
            input_tokens: self.input_tokens,
            cache_read_input_tokens: 0,
            output_tokens: 0,
        };
        let mut events = vec![StreamEvent::MessageStart {
            message: self.reply.message(Vec::new(), None, None, usage),
        }];
        if self.reply.tools.is_none() {
            events.push(StreamEvent::ContentBlockStart {
                index: 0,
                content_block: ContentBlock::Text {
                    text: String::new(),
                },
            });
        }
        events.push(StreamEvent::Ping);
        events
    }

    fn event_name(chunk: &StreamEvent) -> Option<&'static str> {
        Some(chunk.name())
    }

    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, Value) {
        (Some("error"), err.anthropic_body())
    }

    fn token(&mut self, record: TokenRecord) -> Option<StreamEvent> {
        self.tokens.push(record.token);
        self.text.push_str(&record.text);
        (self.reply.tools.is_none() && !record.text.is_empty()).then(|| {
            StreamEvent::ContentBlockDelta {
                index: 0,
                delta: BlockDelta::TextDelta { text: record.text },
            }
        })
    }

    fn finish(
        &mut self,
        _: &Tracked,
        reason: FinishReason,
        tail: String,
        usage: Usage,
    ) -> Vec<StreamEvent> {
        self.text.push_str(&tail);
        let ending = self
            .reply
            .ending(&self.engine, &self.text, reason, &self.tokens);
        let mut events = Vec::new();
        let text_delta = |index, text| StreamEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::TextDelta { text },
        };
        if self.reply.tools.is_none() {
            if !tail.is_empty() {
                events.push(text_delta(0, tail));
            }
            events.push(StreamEvent::ContentBlockStop { index: 0 });
        } else {
            let mut index = 0;
            if !ending.text.is_empty() || ending.calls.is_empty() {
                events.push(StreamEvent::ContentBlockStart {
                    index,
                    content_block: ContentBlock::Text {
                        text: String::new(),
                    },
                });
                if !ending.text.is_empty() {
                    events.push(text_delta(index, ending.text.clone()));
                }
                events.push(StreamEvent::ContentBlockStop { index });
                index += 1;
            }
            for call in &ending.calls {
                events.push(StreamEvent::ContentBlockStart {
                    index,
                    content_block: ContentBlock::ToolUse {
                        id: call.id.clone(),
                        name: call.function.name.clone(),
                        input: json!({}),
                    },
                });
                let input = chat::arguments_value(call).to_string();
                let chars: Vec<char> = input.chars().collect();
                for piece in chars.chunks(INPUT_PIECE) {
                    events.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJsonDelta {
                            partial_json: piece.iter().collect(),
                        },
                    });
                }
                events.push(StreamEvent::ContentBlockStop { index });
                index += 1;
            }
        }
        events.push(StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: ending.stop_reason,
                stop_sequence: ending.stop_sequence,
            },
            usage: usage.into(),
        });
        events.push(StreamEvent::MessageStop);
        events
    }
}
