//! OpenAI's response bodies as serde types: whole completions, stream chunks, logprobs and usage,
//! for `/v1/completions` and `/v1/chat/completions`. [`Envelope`] holds what every body of one
//! request shares and builds each of them.

use std::collections::BTreeMap;

use mlxcel_engine::{Engine, FinishReason, TokenLogprob, Usage};
use serde::Serialize;

use crate::generate::{Timings, TokenRecord, token_piece};
use crate::progress::PromptProgress;
use crate::tools::ToolCall;

/// `system_fingerprint` of every body: the server build.
const FINGERPRINT: &str = concat!("mlxcel-", env!("CARGO_PKG_VERSION"));

/// Which of the two routes a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

impl Kind {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Self::Completion, _) => "text_completion",
            (Self::Chat, false) => "chat.completion",
            (Self::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// A completion, a chat completion, or one chunk of either's stream.
#[derive(Debug, Serialize)]
pub struct CompletionBody {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    system_fingerprint: &'static str,
    choices: Vec<Choice>,
    /// Whole bodies always carry usage; stream chunks carry `null` when the client asked for
    /// usage (`stream_options.include_usage`) and nothing otherwise, and the last chunk the usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageBody>>,
    /// llama-server's extension: the request's timings, on a whole body and on a stream's last
    /// chunk (and on every token's with `timings_per_token`, and on a progress report).
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<Timings>,
    /// llama-server's extension: a `return_progress` report, on a chunk without choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_progress: Option<PromptProgress>,
    /// llama-server's `verbose` request field: the answer as `/completion` would give it, with
    /// the prompt the model ran (a whole body, and a stream's last chunk).
    #[serde(rename = "__verbose", skip_serializing_if = "Option::is_none")]
    verbose: Option<serde_json::Value>,
}

impl CompletionBody {
    /// This body with llama-server's `timings`.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = Some(timings);
        self
    }

    /// This body with llama-server's `__verbose` object.
    pub fn with_verbose(mut self, verbose: Option<serde_json::Value>) -> Self {
        self.verbose = verbose;
        self
    }
}

impl Envelope {
    /// A stream's chunk reporting the prompt's processing (`return_progress`): no choices, the
    /// report and the timings at it.
    pub fn progress_chunk(&self, progress: PromptProgress) -> CompletionBody {
        let mut chunk = self
            .body(true, Vec::new(), None)
            .with_timings(Timings::at_progress(&progress));
        chunk.prompt_progress = Some(progress);
        chunk
    }
}

/// One choice: whole (`message` or `text`) or a stream delta.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Choice {
    Chat {
        index: u32,
        message: Message,
        logprobs: Option<Logprobs>,
        finish_reason: &'static str,
    },
    ChatDelta {
        index: u32,
        delta: Delta,
        logprobs: Option<Logprobs>,
        finish_reason: Option<&'static str>,
    },
    Text {
        index: u32,
        text: String,
        logprobs: Option<Logprobs>,
        finish_reason: Option<&'static str>,
    },
}

#[derive(Debug, Serialize)]
struct Message {
    role: &'static str,
    /// `null` when the reply is tool calls only.
    content: Option<String>,
    /// llama-server's reasoning, split from the reply (`reasoning_format`); absent without.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall>>,
}

/// A streamed tool call: the first delta of a call carries its index, id, type and name with
/// empty arguments; later ones the index and a piece of the arguments.
#[derive(Debug, Serialize)]
struct ToolCallDelta {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta,
}

#[derive(Debug, Serialize)]
struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    arguments: String,
}

/// A chat stream's delta: the role (first chunk only) and the content (absent in a final chunk
/// with no text left, which is `{}`).
#[derive(Debug, Serialize)]
struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    /// Absent, `null` (the role delta, as llama-server sends it) or a piece of text.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Option<String>>,
    /// A piece of the reasoning (llama-server's `reasoning_format`).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct UsageBody {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's `usage.prompt_tokens_details`: the prompt tokens the prefix cache held.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PromptTokensDetails {
    cached_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        Self {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
        }
    }
}

/// Logprobs in the chat shape (`content`, one entry per token) or the legacy completion shape
/// (parallel arrays).
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Logprobs {
    Chat {
        content: Vec<ChatTokenLogprob>,
    },
    Completion {
        tokens: Vec<String>,
        token_logprobs: Vec<Option<f32>>,
        top_logprobs: Vec<BTreeMap<String, f32>>,
        text_offset: Vec<usize>,
    },
}

#[derive(Debug, Serialize)]
struct ChatTokenLogprob {
    token: String,
    logprob: Option<f32>,
    bytes: Vec<u8>,
    top_logprobs: Vec<Alternative>,
}

#[derive(Debug, Serialize)]
struct Alternative {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
}

impl Alternative {
    fn new(engine: &Engine, lp: &TokenLogprob) -> Self {
        let token = token_piece(engine, lp.token);
        Self {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: lp.logprob,
        }
    }
}

impl Logprobs {
    /// The logprobs of `tokens` in `kind`'s shape; `offset` is where their text starts in the
    /// whole output (the legacy shape's `text_offset`).
    fn new(kind: Kind, engine: &Engine, tokens: &[TokenRecord], offset: usize) -> Self {
        match kind {
            Kind::Chat => Self::Chat {
                content: tokens
                    .iter()
                    .map(|t| {
                        let token = token_piece(engine, t.token);
                        ChatTokenLogprob {
                            bytes: token.as_bytes().to_vec(),
                            token,
                            logprob: t.logprob.map(|l| l.logprob),
                            top_logprobs: t
                                .top_logprobs
                                .iter()
                                .map(|a| Alternative::new(engine, a))
                                .collect(),
                        }
                    })
                    .collect(),
            },
            Kind::Completion => {
                let mut text_offset = Vec::with_capacity(tokens.len());
                let mut at = offset;
                for t in tokens {
                    text_offset.push(at);
                    at += t.text.len();
                }
                Self::Completion {
                    tokens: tokens
                        .iter()
                        .map(|t| token_piece(engine, t.token))
                        .collect(),
                    token_logprobs: tokens
                        .iter()
                        .map(|t| t.logprob.map(|l| l.logprob))
                        .collect(),
                    top_logprobs: tokens
                        .iter()
                        .map(|t| {
                            t.top_logprobs
                                .iter()
                                .map(|a| (token_piece(engine, a.token), a.logprob))
                                .collect()
                        })
                        .collect(),
                    text_offset,
                }
            }
        }
    }
}

/// The per-request constants of every body, and the builders of those bodies.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    /// Whether the request asked for logprobs.
    pub logprobs: bool,
    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
}

impl Envelope {
    fn body(
        &self,
        chunk: bool,
        choices: Vec<Choice>,
        usage: Option<Option<UsageBody>>,
    ) -> CompletionBody {
        CompletionBody {
            id: self.id.clone(),
            object: self.kind.object(chunk),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: FINGERPRINT,
            choices,
            usage,
            timings: None,
            prompt_progress: None,
            verbose: None,
        }
    }

    fn logprobs_of(
        &self,
        engine: &Engine,
        tokens: &[TokenRecord],
        offset: usize,
    ) -> Option<Logprobs> {
        (self.logprobs && !tokens.is_empty())
            .then(|| Logprobs::new(self.kind, engine, tokens, offset))
    }

    /// The whole response of a request that was not streamed; `reasoning` is the reasoning split
    /// from the reply (chat only).
    pub fn whole(
        &self,
        engine: &Engine,
        text: String,
        reasoning: Option<String>,
        tokens: &[TokenRecord],
        reason: FinishReason,
        usage: Usage,
    ) -> CompletionBody {
        // A request that asked for logprobs gets the field even with no tokens.
        let logprobs = self
            .logprobs
            .then(|| Logprobs::new(self.kind, engine, tokens, 0));
        let finish_reason = reason.as_str();
        let choice = match self.kind {
            Kind::Chat => Choice::Chat {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: Some(text),
                    reasoning_content: reasoning,
                    tool_calls: None,
                },
                logprobs,
                finish_reason,
            },
            Kind::Completion => Choice::Text {
                index: 0,
                text,
                logprobs,
                finish_reason: Some(finish_reason),
            },
        };
        self.body(false, vec![choice], Some(Some(usage.into())))
    }

    /// A stream chunk carrying `text` (and the logprobs of `tokens`, whose text starts at byte
    /// `offset` of the output), or the final one with `finish`.
    pub fn chunk(
        &self,
        engine: &Engine,
        text: &str,
        tokens: &[TokenRecord],
        offset: usize,
        finish: Option<FinishReason>,
    ) -> CompletionBody {
        self.split_chunk(engine, None, text, tokens, offset, finish)
    }

    /// [`Envelope::chunk`] with a piece of reasoning before the text (a chat stream's
    /// `delta.reasoning_content`); an empty `text` beside reasoning is left out of the delta.
    pub fn split_chunk(
        &self,
        engine: &Engine,
        reasoning: Option<&str>,
        text: &str,
        tokens: &[TokenRecord],
        offset: usize,
        finish: Option<FinishReason>,
    ) -> CompletionBody {
        let logprobs = self.logprobs_of(engine, tokens, offset);
        let finish_reason = finish.map(FinishReason::as_str);
        let choice = match self.kind {
            Kind::Chat => Choice::ChatDelta {
                index: 0,
                delta: Delta {
                    role: None,
                    content: ((finish.is_none() && reasoning.is_none()) || !text.is_empty())
                        .then(|| Some(text.to_owned())),
                    reasoning_content: reasoning.map(str::to_owned),
                    tool_calls: None,
                },
                logprobs,
                finish_reason,
            },
            Kind::Completion => Choice::Text {
                index: 0,
                text: text.to_owned(),
                logprobs,
                finish_reason,
            },
        };
        self.body(true, vec![choice], self.include_usage.then_some(None))
    }

    /// A chat stream's first chunk: the assistant role with empty content.
    pub fn role_chunk(&self) -> CompletionBody {
        let choice = Choice::ChatDelta {
            index: 0,
            delta: Delta {
                role: Some("assistant"),
                content: Some(None),
                reasoning_content: None,
                tool_calls: None,
            },
            logprobs: None,
            finish_reason: None,
        };
        self.body(true, vec![choice], self.include_usage.then_some(None))
    }

    /// The whole chat response of a reply that made tool calls (`finish_reason: tool_calls`;
    /// `content` is the text around the calls, `null` when there is none).
    pub fn whole_tool_calls(
        &self,
        engine: &Engine,
        content: String,
        reasoning: Option<String>,
        calls: Vec<ToolCall>,
        tokens: &[TokenRecord],
        usage: Usage,
    ) -> CompletionBody {
        let logprobs = self
            .logprobs
            .then(|| Logprobs::new(self.kind, engine, tokens, 0));
        let choice = Choice::Chat {
            index: 0,
            message: Message {
                role: "assistant",
                content: (!content.is_empty()).then_some(content),
                reasoning_content: reasoning,
                tool_calls: Some(calls),
            },
            logprobs,
            finish_reason: "tool_calls",
        };
        self.body(false, vec![choice], Some(Some(usage.into())))
    }

    /// The chunks that stream tool calls as OpenAI does: per call, one with its index, id, type
    /// and name (empty arguments), then its arguments in pieces; then the final chunk with
    /// `finish_reason: tool_calls`.
    pub fn tool_call_chunks(&self, calls: &[ToolCall]) -> Vec<CompletionBody> {
        let delta = |tool_calls| Choice::ChatDelta {
            index: 0,
            delta: Delta {
                role: None,
                content: None,
                reasoning_content: None,
                tool_calls: Some(tool_calls),
            },
            logprobs: None,
            finish_reason: None,
        };
        let usage = self.include_usage.then_some(None);
        let mut chunks = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            chunks.push(self.body(
                true,
                vec![delta(vec![ToolCallDelta {
                    index,
                    id: Some(call.id.clone()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(call.function.name.clone()),
                        arguments: String::new(),
                    },
                }])],
                usage,
            ));
            let chars: Vec<char> = call.function.arguments.chars().collect();
            for piece in chars.chunks(16) {
                chunks.push(self.body(
                    true,
                    vec![delta(vec![ToolCallDelta {
                        index,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: piece.iter().collect(),
                        },
                    }])],
                    usage,
                ));
            }
        }
        let last = Choice::ChatDelta {
            index: 0,
            delta: Delta {
                role: None,
                content: None,
                reasoning_content: None,
                tool_calls: None,
            },
            logprobs: None,
            finish_reason: Some("tool_calls"),
        };
        chunks.push(self.body(true, vec![last], usage));
        chunks
    }

    /// The chunk after the final one when the client asked for usage: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> CompletionBody {
        self.body(true, Vec::new(), Some(Some(usage.into())))
    }
}
