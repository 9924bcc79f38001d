//! The Responses API's stream: `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its parts and deltas and `response.output_item.done`, then
//! `response.completed` (or `response.incomplete`) with the whole response.

use mlxcel_engine::{FinishReason, Usage};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::generate::{StreamFormat, Timings, TokenRecord, Tracked};
use crate::progress::PromptProgress;

use super::reply::{OutputItem, OutputText, ReplyMeta, ResponseObject};

/// Characters of a call's arguments per `response.function_call_arguments.delta`.
const ARGUMENTS_PIECE: usize = 16;

/// One event of the stream, numbered.
#[derive(Debug, Serialize)]
pub(super) struct StreamEvent {
    #[serde(flatten)]
    event: Event,
    sequence_number: u64,
    /// llama-server's extension: the request's timings (on a delta with `timings_per_token`, on
    /// a progress report, on the last event).
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<Timings>,
    /// llama-server's extension: a `return_progress` report, on a `response.in_progress` event.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_progress: Option<PromptProgress>,
}

/// The events of the Responses API's stream; `type` is also the SSE event's name.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub(super) enum Event {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
        }
    }
}

/// The Responses API's stream: `response.created`, `response.in_progress`, then per output item
/// `response.output_item.added`, its parts and deltas and `response.output_item.done`, then
/// `response.completed` (or `response.incomplete`) with the whole response. Without tools the
/// message item opens at once and its text deltas follow the tokens; with tools the text is held
/// back until the end, then sent as the items of the finished response.
pub(super) struct ResponsesStream {
    reply: ReplyMeta,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// The reply's text so far.
    text: String,
}

impl ResponsesStream {
    pub(super) fn new(reply: ReplyMeta) -> Self {
        Self {
            reply,
            sequence: 0,
            text: String::new(),
        }
    }

    fn numbered(&mut self, event: Event) -> StreamEvent {
        let sequence_number = self.sequence;
        self.sequence += 1;
        StreamEvent {
            event,
            sequence_number,
            timings: None,
            prompt_progress: None,
        }
    }

    fn text_part_events(&self, index: usize, opening: bool, text: &str) -> Vec<Event> {
        let item_id = self.reply.message_id.clone();
        if opening {
            return vec![
                Event::OutputItemAdded {
                    output_index: index,
                    item: OutputItem::Message {
                        id: item_id.clone(),
                        status: "in_progress",
                        role: "assistant",
                        content: Vec::new(),
                    },
                },
                Event::ContentPartAdded {
                    item_id,
                    output_index: index,
                    content_index: 0,
                    part: OutputText::new(String::new()),
                },
            ];
        }
        vec![
            Event::OutputTextDone {
                item_id: item_id.clone(),
                output_index: index,
                content_index: 0,
                text: text.to_owned(),
                logprobs: Vec::new(),
            },
            Event::ContentPartDone {
                item_id,
                output_index: index,
                content_index: 0,
                part: OutputText::new(text.to_owned()),
            },
        ]
    }

    fn delta(&self, index: usize, delta: String) -> Event {
        Event::OutputTextDelta {
            item_id: self.reply.message_id.clone(),
            output_index: index,
            content_index: 0,
            delta,
            logprobs: Vec::new(),
        }
    }
}

impl StreamFormat for ResponsesStream {
    type Chunk = StreamEvent;
    const DONE_LINE: bool = false;

    fn opening(&mut self) -> Vec<StreamEvent> {
        let mut events = vec![
            Event::Created {
                response: self.reply.skeleton.clone(),
            },
            Event::InProgress {
                response: self.reply.skeleton.clone(),
            },
        ];
        if self.reply.tools.is_none() {
            events.extend(self.text_part_events(0, true, ""));
        }
        events.into_iter().map(|e| self.numbered(e)).collect()
    }

    fn event_name(chunk: &StreamEvent) -> Option<&'static str> {
        Some(chunk.event.name())
    }

    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, Value) {
        let body = err.body();
        let error = &body["error"];
        let sequence_number = self.sequence;
        self.sequence += 1;
        let data = json!({
            "type": "error", "code": error["code"], "message": error["message"],
            "param": error["param"], "sequence_number": sequence_number,
        });
        (Some("error"), data)
    }

    fn progress(&mut self, progress: PromptProgress) -> Option<StreamEvent> {
        let event = Event::InProgress {
            response: self.reply.skeleton.clone(),
        };
        let mut event = self.numbered(event);
        event.timings = Some(Timings::at_progress(&progress));
        event.prompt_progress = Some(progress);
        Some(event)
    }

    fn with_timings(mut chunk: StreamEvent, timings: Timings) -> StreamEvent {
        chunk.timings = Some(timings);
        chunk
    }

    fn token(&mut self, record: TokenRecord) -> Vec<StreamEvent> {
        self.text.push_str(&record.text);
        if self.reply.tools.is_some() || record.text.is_empty() {
            return Vec::new();
        }
        let event = self.delta(0, record.text);
        vec![self.numbered(event)]
    }

    fn finish(
        &mut self,
        tracked: &Tracked,
        reason: FinishReason,
        tail: String,
        usage: Usage,
    ) -> Vec<StreamEvent> {
        self.text.push_str(&tail);
        let response = self.reply.finished(&self.text, reason, usage);
        let mut events = Vec::new();
        let streamed = self.reply.tools.is_none();
        if streamed && !tail.is_empty() {
            events.push(self.delta(0, tail));
        }
        for (index, item) in response.output.iter().enumerate() {
            match item {
                OutputItem::Message { content, .. } => {
                    let text = content.first().map_or("", |part| part.text.as_str());
                    if !streamed {
                        events.extend(self.text_part_events(index, true, text));
                        if !text.is_empty() {
                            events.push(self.delta(index, text.to_owned()));
                        }
                    }
                    events.extend(self.text_part_events(index, false, text));
                }
                OutputItem::FunctionCall {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    let mut added = item.clone();
                    if let OutputItem::FunctionCall {
                        arguments, status, ..
                    } = &mut added
                    {
                        arguments.clear();
                        *status = "in_progress";
                    }
                    events.push(Event::OutputItemAdded {
                        output_index: index,
                        item: added,
                    });
                    let chars: Vec<char> = arguments.chars().collect();
                    for piece in chars.chunks(ARGUMENTS_PIECE) {
                        events.push(Event::FunctionCallArgumentsDelta {
                            item_id: id.clone(),
                            output_index: index,
                            delta: piece.iter().collect(),
                        });
                    }
                    events.push(Event::FunctionCallArgumentsDone {
                        item_id: id.clone(),
                        output_index: index,
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            events.push(Event::OutputItemDone {
                output_index: index,
                item: item.clone(),
            });
        }
        let timings = tracked.timings_object(usage.completion_tokens);
        events.push(if response.status == "incomplete" {
            Event::Incomplete { response }
        } else {
            Event::Completed { response }
        });
        let mut events: Vec<StreamEvent> = events.into_iter().map(|e| self.numbered(e)).collect();
        // As llama-server: the timings ride on the stream's last event.
        if let Some(last) = events.last_mut() {
            last.timings = Some(timings);
        }
        events
    }
}
