//! Anthropic's answers: a message of `thinking`, `text` and `tool_use` content blocks with
//! Anthropic's `stop_reason`, whole or as Anthropic's named stream events. The reasoning a
//! reasoning model writes (split as the chat route's `reasoning_content` is) is the `thinking`
//! block, first, with an empty `signature` (Anthropic's check of its own models' reasoning, which
//! a local model cannot give).

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
use crate::reasoning::{ReasoningPlan, SplitCall, Splitter, marker_text};
use crate::tools::{self, ToolCall, ToolFormat};

/// Characters of a call's JSON input per `input_json_delta`.
const INPUT_PIECE: usize = 16;

/// The reply to one `/v1/messages` request.
pub(super) struct MessagesReply {
    pub meta: ReplyMeta,
    pub engine: Arc<Engine>,
    /// How the reply splits into reasoning and answer (`None`: left whole).
    pub reasoning: Option<ReasoningPlan>,
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
            splitter: self.reasoning.as_ref().and_then(ReasoningPlan::splitter),
            answer: String::new(),
            split_calls: Vec::new(),
            open: None,
            next_index: 0,
            text_opened: false,
            pinged: false,
        }
    }

    fn whole(self, _: &Tracked, outcome: Outcome) -> Response<Body> {
        let reply = self.meta;
        let tokens: Vec<u32> = outcome.tokens.iter().map(|t| t.token).collect();
        let (answer, reasoning, split_calls) = match ReasoningPlan::split(
            self.reasoning.as_ref(),
            &self.engine,
            outcome.tokens.iter().map(|t| (t.token, t.text.as_str())),
            &outcome.text,
        ) {
            Some(split) => (split.content, split.reasoning, split.calls),
            None => (outcome.text.clone(), String::new(), Vec::new()),
        };
        let ending = reply.ending(
            &self.engine,
            &outcome.text,
            answer,
            split_calls,
            outcome.reason,
            &tokens,
        );
        let mut content = Vec::new();
        if !reasoning.is_empty() {
            content.push(ContentBlock::Thinking {
                thinking: reasoning,
                signature: String::new(),
            });
        }
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
    Thinking {
        thinking: String,
        signature: String,
    },
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
    /// The reply's calls and stop reason: `tool_use` when it made calls (in the tools' format
    /// in `answer`, or `split_calls` in the model's own form), `max_tokens` when the budget ran
    /// out, `stop_sequence` (with the one that matched the whole reply `text`) or `end_turn`.
    fn ending(
        &self,
        engine: &Engine,
        text: &str,
        answer: String,
        split_calls: Vec<SplitCall>,
        reason: FinishReason,
        tokens: &[u32],
    ) -> Ending {
        if !split_calls.is_empty() {
            let calls = tools::named_calls(
                split_calls.into_iter().map(|c| (c.name, c.arguments)),
                &self.id,
            );
            return Ending {
                text: answer,
                calls,
                stop_reason: "tool_use",
                stop_sequence: None,
            };
        }
        if let Some((text, calls)) = chat::calls_in(&answer, reason, self.tools, &self.id) {
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
            text: answer,
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

/// A content block's delta; its `type` is the variant's name with `_delta` after it.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(super) enum BlockDelta {
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
}

#[derive(Debug, Serialize)]
pub(super) struct MessageDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// The kind of the content block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// Anthropic's stream: `message_start`, then per content block `content_block_start`, its
/// deltas and `content_block_stop`, then `message_delta` (stop reason, usage) and
/// `message_stop`; `ping` follows the first block's start. The reasoning (split as on the chat
/// route) streams as a `thinking` block of `thinking_delta`s, closed by an empty
/// `signature_delta`; the answer as a `text` block of `text_delta`s, which a reply without tools
/// always has (opened at once when nothing is split). With tools the answer is held back until
/// the end, then sent as a text block and a `tool_use` block per call.
pub(super) struct MessagesStream {
    reply: ReplyMeta,
    engine: Arc<Engine>,
    input_tokens: usize,
    /// Every generated token (to tell which stop sequence ended the reply).
    tokens: Vec<u32>,
    /// The reply's whole text so far.
    text: String,
    /// With a reasoning format: the reply's splitter.
    splitter: Option<Splitter>,
    /// The answer so far (the text past the reasoning).
    answer: String,
    /// The calls the splitter found (in the model's own form).
    split_calls: Vec<SplitCall>,
    /// The block open now, and its index.
    open: Option<(Open, usize)>,
    /// The index the next block gets.
    next_index: usize,
    /// Whether a text block was opened.
    text_opened: bool,
    /// Whether `ping` was sent.
    pinged: bool,
}

impl MessagesStream {
    /// Closes the open block (a thinking block after its empty signature).
    fn close(&mut self, events: &mut Vec<StreamEvent>) {
        if let Some((kind, index)) = self.open.take() {
            if kind == Open::Thinking {
                events.push(StreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::Signature {
                        signature: String::new(),
                    },
                });
            }
            events.push(StreamEvent::ContentBlockStop { index });
        }
    }

    /// Opens a block of `kind` (closing another one open); returns its index.
    fn enter(&mut self, kind: Open, events: &mut Vec<StreamEvent>) -> usize {
        if let Some((open, index)) = self.open
            && open == kind
        {
            return index;
        }
        self.close(events);
        let index = self.next_index;
        self.next_index += 1;
        let content_block = match kind {
            Open::Thinking => ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            },
            Open::Text => {
                self.text_opened = true;
                ContentBlock::Text {
                    text: String::new(),
                }
            }
        };
        events.push(StreamEvent::ContentBlockStart {
            index,
            content_block,
        });
        self.ping(events);
        self.open = Some((kind, index));
        index
    }

    fn ping(&mut self, events: &mut Vec<StreamEvent>) {
        if !self.pinged {
            self.pinged = true;
            events.push(StreamEvent::Ping);
        }
    }

    /// The events of a piece of reasoning and of answer (held back with tools).
    fn pieces(&mut self, reasoning: String, answer: String, events: &mut Vec<StreamEvent>) {
        if !reasoning.is_empty() {
            let index = self.enter(Open::Thinking, events);
            events.push(StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::Thinking {
                    thinking: reasoning,
                },
            });
        }
        if answer.is_empty() {
            return;
        }
        self.answer.push_str(&answer);
        if self.reply.tools.is_none() {
            let index = self.enter(Open::Text, events);
            events.push(StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::Text { text: answer },
            });
        }
    }

    /// A whole block: its start, one delta when `delta` is given, its stop.
    fn block(
        &mut self,
        content_block: ContentBlock,
        delta: Option<BlockDelta>,
        events: &mut Vec<StreamEvent>,
    ) {
        self.close(events);
        let index = self.next_index;
        self.next_index += 1;
        events.push(StreamEvent::ContentBlockStart {
            index,
            content_block,
        });
        self.ping(events);
        if let Some(delta) = delta {
            events.push(StreamEvent::ContentBlockDelta { index, delta });
        }
        events.push(StreamEvent::ContentBlockStop { index });
    }
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
        if self.splitter.is_none() {
            if self.reply.tools.is_none() {
                self.enter(Open::Text, &mut events);
            } else {
                self.ping(&mut events);
            }
        }
        events
    }

    fn event_name(chunk: &StreamEvent) -> Option<&'static str> {
        Some(chunk.name())
    }

    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, Value) {
        (Some("error"), err.anthropic_body())
    }

    fn token(&mut self, record: TokenRecord) -> Vec<StreamEvent> {
        self.tokens.push(record.token);
        self.text.push_str(&record.text);
        let (reasoning, answer) = match &mut self.splitter {
            Some(splitter) => {
                let split = splitter.push(&marker_text(&self.engine, record.token, &record.text));
                self.split_calls.extend(split.calls);
                (split.reasoning, split.content)
            }
            None => (String::new(), record.text),
        };
        let mut events = Vec::new();
        self.pieces(reasoning, answer, &mut events);
        events
    }

    fn finish(
        &mut self,
        _: &Tracked,
        reason: FinishReason,
        tail: String,
        usage: Usage,
    ) -> Vec<StreamEvent> {
        self.text.push_str(&tail);
        let mut events = Vec::new();
        let (reasoning, answer) = match self.splitter.take() {
            Some(mut splitter) => {
                let mut split = splitter.push(&tail);
                split.extend(splitter.finish());
                self.split_calls.append(&mut split.calls);
                (split.reasoning, split.content)
            }
            None => (String::new(), tail),
        };
        self.pieces(reasoning, answer, &mut events);
        let ending = self.reply.ending(
            &self.engine,
            &self.text,
            std::mem::take(&mut self.answer),
            std::mem::take(&mut self.split_calls),
            reason,
            &self.tokens,
        );
        if self.reply.tools.is_none() {
            // The answer went out as it came; a reply without calls has a text block, if empty.
            if !self.text_opened && ending.calls.is_empty() {
                self.enter(Open::Text, &mut events);
            }
            self.close(&mut events);
        } else if !ending.text.is_empty() || ending.calls.is_empty() {
            let delta = (!ending.text.is_empty()).then(|| BlockDelta::Text {
                text: ending.text.clone(),
            });
            let text = ContentBlock::Text {
                text: String::new(),
            };
            self.block(text, delta, &mut events);
        }
        for call in &ending.calls {
            self.close(&mut events);
            let index = self.next_index;
            self.next_index += 1;
            events.push(StreamEvent::ContentBlockStart {
                index,
                content_block: ContentBlock::ToolUse {
                    id: call.id.clone(),
                    name: call.function.name.clone(),
                    input: json!({}),
                },
            });
            self.ping(&mut events);
            let input = chat::arguments_value(call).to_string();
            let chars: Vec<char> = input.chars().collect();
            for piece in chars.chunks(INPUT_PIECE) {
                events.push(StreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::InputJson {
                        partial_json: piece.iter().collect(),
                    },
                });
            }
            events.push(StreamEvent::ContentBlockStop { index });
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
