//! OpenAI's answers: the [`Reply`] of both OpenAI routes, whole or as a stream of chunks (a role
//! delta first on chat, a chunk per token, the final chunk with the finish reason, the usage
//! chunk when asked for, then `[DONE]`).

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::{Engine, FinishReason, Usage};

use crate::body::Body;
use crate::chat;
use crate::generate::{Outcome, StreamFormat, Timings, TokenRecord, Tracked};
use crate::handler::Reply;
use crate::progress::PromptProgress;
use crate::reasoning::{ReasoningPlan, Split, SplitCall, Splitter, marker_text};
use crate::tools::{self, ToolCall, ToolFormat};

use super::response::{CompletionBody, Envelope, Kind};
use super::verbose::{Verbose, last_token};

/// An OpenAI reply: its envelope, and with tools the format calls are looked for in.
pub(super) struct OpenAiReply {
    pub envelope: Envelope,
    pub engine: Arc<Engine>,
    /// `None` without tools (or with the choice `none`).
    pub tools: Option<ToolFormat>,
    /// How a chat reply splits into reasoning and answer (`None` on `/v1/completions`).
    pub reasoning: Option<ReasoningPlan>,
    /// With llama-server's `verbose`: the prompt the model ran, for the answer's `__verbose`.
    pub verbose: Option<String>,
}

impl Reply for OpenAiReply {
    type Stream = OpenAiStream;

    fn stream(self, _: &Tracked) -> OpenAiStream {
        OpenAiStream {
            envelope: self.envelope,
            engine: self.engine,
            offset: 0,
            tools: self.tools.map(|format| (format, String::new())),
            splitter: self.reasoning.as_ref().and_then(ReasoningPlan::splitter),
            split_calls: Vec::new(),
            verbose: self.verbose.map(|prompt| (prompt, String::new(), None)),
        }
    }

    /// The reasoning is split from the answer (with a reasoning format), the answer is searched
    /// for calls when the request ends (with tools), and a reply that made some (in the tools'
    /// format, or in the model's own form the splitter reads) returns them as `tool_calls`.
    fn completion_id(&self) -> Option<&str> {
        Some(&self.envelope.id)
    }

    fn whole(self, tracked: &Tracked, outcome: Outcome) -> Response<Body> {
        let timings = tracked.timings_object(outcome.usage.completion_tokens);
        let envelope = &self.envelope;
        let verbose = self.verbose.as_ref().map(|prompt| {
            Verbose {
                prompt,
                content: &outcome.text,
                last_token: last_token(&outcome.tokens),
                reason: outcome.reason,
                completion_tokens: outcome.usage.completion_tokens,
                model: &envelope.model,
            }
            .value(&self.engine, tracked)
        });
        let (text, reasoning, split_calls) = match ReasoningPlan::split(
            self.reasoning.as_ref(),
            &self.engine,
            outcome.tokens.iter().map(|t| (t.token, t.text.as_str())),
            &outcome.text,
        ) {
            Some(split) => {
                let reasoning = (!split.reasoning.is_empty()).then_some(split.reasoning);
                (split.content, reasoning, split.calls)
            }
            None => (outcome.text, None, Vec::new()),
        };
        let calls = if split_calls.is_empty() {
            chat::calls_in(&text, outcome.reason, self.tools, &envelope.id)
        } else {
            Some((text.clone(), split_tool_calls(split_calls, &envelope.id)))
        };
        let body = match calls {
            Some((content, calls)) => envelope.whole_tool_calls(
                &self.engine,
                content,
                reasoning,
                calls,
                &outcome.tokens,
                outcome.usage,
            ),
            None => envelope.whole(
                &self.engine,
                text,
                reasoning,
                &outcome.tokens,
                outcome.reason,
                outcome.usage,
            ),
        }
        .with_timings(timings)
        .with_verbose(verbose);
        crate::body::json(StatusCode::OK, &body)
    }
}

/// OpenAI's stream. With tools, the text is held back until the end, then sent as tool-call
/// deltas or as content.
pub(super) struct OpenAiStream {
    envelope: Envelope,
    engine: Arc<Engine>,
    /// Bytes of text sent so far (legacy completion logprobs' `text_offset`).
    offset: usize,
    /// With tools: their format and the text held back until the end.
    tools: Option<(ToolFormat, String)>,
    /// With a reasoning format on a chat: the reply's splitter.
    splitter: Option<Splitter>,
    /// The calls the splitter has found so far (sent as tool-call deltas at the end).
    split_calls: Vec<SplitCall>,
    /// With `verbose`: the prompt, the text so far and the last token, for the last chunk's
    /// `__verbose`.
    verbose: Option<(String, String, Option<u32>)>,
}

/// The splitter's calls as OpenAI's.
fn split_tool_calls(calls: Vec<SplitCall>, id_prefix: &str) -> Vec<ToolCall> {
    tools::named_calls(calls.into_iter().map(|c| (c.name, c.arguments)), id_prefix)
}

impl StreamFormat for OpenAiStream {
    type Chunk = CompletionBody;
    const DONE_LINE: bool = true;

    fn opening(&mut self) -> Vec<CompletionBody> {
        (self.envelope.kind == Kind::Chat)
            .then(|| self.envelope.role_chunk())
            .into_iter()
            .collect()
    }

    fn progress(&mut self, progress: PromptProgress) -> Option<CompletionBody> {
        Some(self.envelope.progress_chunk(progress))
    }

    fn with_timings(chunk: CompletionBody, timings: Timings) -> CompletionBody {
        chunk.with_timings(timings)
    }

    fn token(&mut self, record: TokenRecord) -> Vec<CompletionBody> {
        self.token_chunk(record).into_iter().collect()
    }

    fn finish(
        &mut self,
        tracked: &Tracked,
        reason: FinishReason,
        text: String,
        usage: Usage,
    ) -> Vec<CompletionBody> {
        let timings = tracked.timings_object(usage.completion_tokens);
        let verbose = self.verbose.take().map(|(prompt, content, last_token)| {
            Verbose {
                prompt: &prompt,
                content: &content,
                last_token,
                reason,
                completion_tokens: usage.completion_tokens,
                model: &self.envelope.model,
            }
            .value(&self.engine, tracked)
        });
        let mut chunks = self.closing(reason, text, usage);
        // As llama-server: the timings (and `__verbose`) ride on the stream's last chunk.
        if let Some(last) = chunks.pop() {
            chunks.push(last.with_timings(timings).with_verbose(verbose));
        }
        chunks
    }
}

impl OpenAiStream {
    /// The chunk of one token, if any.
    fn token_chunk(&mut self, record: TokenRecord) -> Option<CompletionBody> {
        if let Some((_, content, last)) = &mut self.verbose {
            content.push_str(&record.text);
            *last = Some(record.token);
        }
        if let Some(splitter) = &mut self.splitter {
            let split = splitter.push(&marker_text(&self.engine, record.token, &record.text));
            return self.split_token(split, record);
        }
        if let Some((_, held)) = &mut self.tools {
            held.push_str(&record.text);
            return None;
        }
        if record.text.is_empty() && !self.envelope.logprobs {
            return None;
        }
        let chunk = self.envelope.chunk(
            &self.engine,
            &record.text,
            std::slice::from_ref(&record),
            self.offset,
            None,
        );
        self.offset += record.text.len();
        Some(chunk)
    }

    /// The chunk of one token whose text the splitter turned into `split`: its reasoning as
    /// `delta.reasoning_content`, its answer as `delta.content` (held back with tools).
    fn split_token(&mut self, split: Split, record: TokenRecord) -> Option<CompletionBody> {
        let Split {
            reasoning,
            mut content,
            calls,
        } = split;
        self.split_calls.extend(calls);
        if let Some((_, held)) = &mut self.tools {
            held.push_str(&content);
            content.clear();
        }
        if reasoning.is_empty() && content.is_empty() && !self.envelope.logprobs {
            return None;
        }
        let chunk = self.envelope.split_chunk(
            &self.engine,
            (!reasoning.is_empty()).then_some(reasoning.as_str()),
            &content,
            std::slice::from_ref(&record),
            self.offset,
            None,
        );
        self.offset += record.text.len();
        Some(chunk)
    }

    /// The chunks that end a stream: the held-back reasoning, text or calls, the finish reason,
    /// the usage.
    fn closing(&mut self, reason: FinishReason, text: String, usage: Usage) -> Vec<CompletionBody> {
        let mut chunks = Vec::new();
        let mut text = text;
        if let Some(mut splitter) = self.splitter.take() {
            let mut split = splitter.push(&text);
            split.extend(splitter.finish());
            self.split_calls.append(&mut split.calls);
            if !split.reasoning.is_empty() {
                chunks.push(self.envelope.split_chunk(
                    &self.engine,
                    Some(&split.reasoning),
                    "",
                    &[],
                    0,
                    None,
                ));
            }
            text = split.content;
        }
        if !self.split_calls.is_empty() {
            // Calls in the model's own form: whatever answer text was held comes first.
            let calls = split_tool_calls(std::mem::take(&mut self.split_calls), &self.envelope.id);
            let mut content = self.tools.take().map(|(_, held)| held).unwrap_or_default();
            content.push_str(&text);
            if !content.is_empty() {
                chunks.push(self.envelope.chunk(&self.engine, &content, &[], 0, None));
            }
            chunks.extend(self.envelope.tool_call_chunks(&calls));
            if self.envelope.include_usage {
                chunks.push(self.envelope.usage_chunk(usage));
            }
            return chunks;
        }
        if let Some((format, mut held)) = self.tools.take() {
            held.push_str(&text);
            if let Some((content, calls)) =
                chat::calls_in(&held, reason, Some(format), &self.envelope.id)
            {
                if !content.is_empty() {
                    chunks.push(self.envelope.chunk(&self.engine, &content, &[], 0, None));
                }
                chunks.extend(self.envelope.tool_call_chunks(&calls));
                if self.envelope.include_usage {
                    chunks.push(self.envelope.usage_chunk(usage));
                }
                return chunks;
            }
            // No call: the held text is the content.
            if !held.is_empty() {
                chunks.push(self.envelope.chunk(&self.engine, &held, &[], 0, None));
            }
            text = String::new();
        }
        let last = self
            .envelope
            .chunk(&self.engine, &text, &[], self.offset, Some(reason));
        chunks.push(last);
        if self.envelope.include_usage {
            chunks.push(self.envelope.usage_chunk(usage));
        }
        chunks
    }
}
