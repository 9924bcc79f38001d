//! `/completion`'s answer (also `/infill`'s): one object, or a stream of pieces then that
//! object, with llama-server's stop flags, timings and `completion_probabilities`.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::{Engine, FinishReason, Usage};
use serde::Serialize;

use crate::body::{Body, json};
use crate::generate::{Outcome, StreamFormat, Timings, TokenRecord, Tracked, token_piece};
use crate::handler::Reply;
use crate::progress::PromptProgress;
use crate::state::AppState;

/// The reply to one `/completion` or `/infill` request.
pub(super) struct CompletionReply {
    pub end: Final,
    /// `return_tokens`: the generated ids in `tokens` (not streamed).
    pub return_tokens: bool,
    /// `n_probs` > 0: `completion_probabilities` (a stream's pieces carry their token's).
    pub n_probs: bool,
    /// `post_sampling_probs`: those are probabilities after the sampler's chain, named `prob`
    /// and `top_probs` as llama-server names them.
    pub post_sampling: bool,
    /// `response_fields`: the final answer holds only these paths (empty: all of it).
    pub response_fields: Vec<String>,
}

/// The values at `paths` of `answer` (each a path of keys separated by `/`), keyed by the path,
/// as llama-server selects `response_fields`; a path that leads nowhere is left out.
pub(super) fn select_fields(paths: &[String], answer: &serde_json::Value) -> serde_json::Value {
    let mut selected = serde_json::Map::new();
    for path in paths {
        let found = path
            .split('/')
            .try_fold(answer, |value, key| value.as_object()?.get(key));
        if let Some(value) = found {
            selected.insert(path.clone(), value.clone());
        }
    }
    serde_json::Value::Object(selected)
}

impl Reply for CompletionReply {
    type Stream = CompletionStream;

    fn stream(self, tracked: &Tracked) -> CompletionStream {
        CompletionStream {
            end: self.end,
            last_token: None,
            slot: tracked.slot_handle(),
            n_probs: self.n_probs,
            post_sampling: self.post_sampling,
            response_fields: self.response_fields,
        }
    }

    fn whole(self, tracked: &Tracked, outcome: Outcome) -> Response<Body> {
        let engine = &self.end.engine;
        let stopped_eos = outcome.reason == FinishReason::Stop
            && outcome
                .tokens
                .last()
                .is_some_and(|t| engine.info().eos_token_ids.contains(&t.token));
        let mut body = self.end.body(
            tracked,
            outcome.reason,
            stopped_eos,
            outcome.usage.completion_tokens,
            outcome.text,
        );
        if self.return_tokens {
            body.tokens = outcome.tokens.iter().map(|t| t.token).collect();
        }
        if self.n_probs {
            body.completion_probabilities = Some(
                outcome
                    .tokens
                    .iter()
                    .map(|t| TokenProbs::new(engine, t).value(self.post_sampling))
                    .collect(),
            );
        }
        if self.response_fields.is_empty() {
            return json(StatusCode::OK, &body);
        }
        let whole = serde_json::to_value(&body).unwrap_or_default();
        json(
            StatusCode::OK,
            &select_fields(&self.response_fields, &whole),
        )
    }
}

/// One token of llama-server's `completion_probabilities`; `bytes` are the token's text as
/// UTF-8 bytes, as llama-server sends them beside `token`.
#[derive(Debug, Serialize)]
pub(super) struct TokenProbs {
    id: u32,
    token: String,
    bytes: Vec<u8>,
    logprob: Option<f32>,
    top_logprobs: Vec<TopProb>,
}

#[derive(Debug, Serialize)]
pub(super) struct TopProb {
    id: u32,
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
}

impl TokenProbs {
    /// The entry in llama-server's shape: log-probabilities, or with `post_sampling` the
    /// probabilities after the sampler's chain.
    fn value(self, post_sampling: bool) -> serde_json::Value {
        if post_sampling {
            self.post_sampling()
        } else {
            serde_json::json!(self)
        }
    }

    /// The entry as llama-server writes post-sampling probabilities: `prob` and `top_probs`,
    /// probabilities rather than their logarithms.
    fn post_sampling(self) -> serde_json::Value {
        let top: Vec<serde_json::Value> = self
            .top_logprobs
            .into_iter()
            .map(|a| {
                serde_json::json!({"id": a.id, "token": a.token, "bytes": a.bytes,
                                   "prob": a.logprob.exp()})
            })
            .collect();
        serde_json::json!({
            "id": self.id,
            "token": self.token,
            "bytes": self.bytes,
            "prob": self.logprob.map(f32::exp),
            "top_probs": top,
        })
    }

    fn new(engine: &Engine, t: &TokenRecord) -> Self {
        let token = token_piece(engine, t.token);
        Self {
            id: t.token,
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: t.logprob.map(|l| l.logprob),
            top_logprobs: t
                .top_logprobs
                .iter()
                .map(|a| {
                    let token = token_piece(engine, a.token);
                    TopProb {
                        id: a.token,
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob: a.logprob,
                    }
                })
                .collect(),
        }
    }
}

/// A streamed piece of a `/completion`.
#[derive(Debug, Serialize)]
pub(super) struct PartialCompletion {
    content: String,
    /// The token that released this piece, as llama-server sends it.
    tokens: Vec<u32>,
    stop: bool,
    id_slot: i64,
    index: u32,
    /// The request's timings so far, with `timings_per_token` (and on a progress report).
    #[serde(skip_serializing_if = "Option::is_none")]
    timings: Option<Timings>,
    /// A `return_progress` report (with no text).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_progress: Option<PromptProgress>,
    /// With `n_probs` > 0: this piece's token, as the whole answer lists each.
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_probabilities: Option<Vec<serde_json::Value>>,
}

/// The last (or only) object of a `/completion`.
#[derive(Debug, Serialize)]
pub(super) struct CompletionResult {
    content: String,
    /// The generated token ids with `return_tokens` on a request not streamed; empty otherwise
    /// (a stream sent them in its pieces), as llama-server.
    tokens: Vec<u32>,
    id_slot: i64,
    stop: bool,
    model: String,
    tokens_predicted: usize,
    tokens_evaluated: usize,
    prompt: String,
    truncated: bool,
    stopped_eos: bool,
    stopped_word: bool,
    stopped_limit: bool,
    /// `eos`, `word` or `limit`, as llama-server's `stop_type`.
    stop_type: &'static str,
    stopping_word: String,
    tokens_cached: usize,
    timings: Timings,
    /// The request's settings, as `/slots` shows them.
    generation_settings: serde_json::Value,
    /// With `n_probs` > 0, on a request that was not streamed.
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_probabilities: Option<Vec<serde_json::Value>>,
}

/// A `/completion` stream's chunk: a piece, then the result.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum CompletionChunk {
    Partial(Box<PartialCompletion>),
    Result(Box<CompletionResult>),
    /// The result's `response_fields` only.
    Selected(serde_json::Value),
}

/// What the last object of a `/completion` reports.
pub(super) struct Final {
    pub model: String,
    pub prompt: String,
    pub stop_words: Vec<String>,
    pub engine: Arc<Engine>,
}

impl Final {
    fn body(
        &self,
        tracked: &Tracked,
        reason: FinishReason,
        stopped_eos: bool,
        predicted: usize,
        content: String,
    ) -> CompletionResult {
        let stopped_word = reason == FinishReason::Stop && !stopped_eos;
        let prompt_n = tracked.prompt_tokens();
        CompletionResult {
            content,
            tokens: Vec::new(),
            id_slot: tracked.slot_id(),
            stop: true,
            model: self.model.clone(),
            tokens_predicted: predicted,
            tokens_evaluated: prompt_n,
            prompt: self.prompt.clone(),
            truncated: false,
            stopped_eos,
            stopped_word,
            stopped_limit: reason == FinishReason::Length,
            stop_type: if stopped_eos {
                "eos"
            } else if stopped_word {
                "word"
            } else if reason == FinishReason::Length {
                "limit"
            } else {
                "none"
            },
            stopping_word: if stopped_word {
                self.stop_words.first().cloned().unwrap_or_default()
            } else {
                String::new()
            },
            // The positions the request's cache holds (llama-server's `n_past`): the prompt and
            // every generated token but the last, which was never fed back.
            tokens_cached: prompt_n + predicted.saturating_sub(1),
            timings: tracked.timings_object(predicted),
            generation_settings: tracked.settings().clone(),
            completion_probabilities: None,
        }
    }
}

/// llama-server's `/completion` stream: `{"content", "stop": false}` per token with text, then the
/// final object (`stop: true`, the stop flags and timings); no `[DONE]` line.
pub(super) struct CompletionStream {
    end: Final,
    last_token: Option<u32>,
    /// Where its `/slots` id is read ([`Tracked::slot_handle`]).
    slot: (Arc<AppState>, u64),
    /// `n_probs` > 0, and whether after the sampler's chain ([`CompletionReply`]).
    n_probs: bool,
    post_sampling: bool,
    /// `response_fields` of the last object ([`CompletionReply`]).
    response_fields: Vec<String>,
}

impl StreamFormat for CompletionStream {
    type Chunk = CompletionChunk;
    const DONE_LINE: bool = false;

    fn token(&mut self, record: TokenRecord) -> Vec<CompletionChunk> {
        self.last_token = Some(record.token);
        if record.text.is_empty() && !self.n_probs {
            return Vec::new();
        }
        let completion_probabilities = self
            .n_probs
            .then(|| vec![TokenProbs::new(&self.end.engine, &record).value(self.post_sampling)]);
        vec![CompletionChunk::Partial(Box::new(PartialCompletion {
            content: record.text,
            tokens: vec![record.token],
            stop: false,
            id_slot: self.slot.0.id_slot(self.slot.1),
            index: 0,
            timings: None,
            prompt_progress: None,
            completion_probabilities,
        }))]
    }

    fn progress(&mut self, progress: PromptProgress) -> Option<CompletionChunk> {
        Some(CompletionChunk::Partial(Box::new(PartialCompletion {
            content: String::new(),
            tokens: Vec::new(),
            stop: false,
            id_slot: self.slot.0.id_slot(self.slot.1),
            index: 0,
            timings: Some(Timings::at_progress(&progress)),
            prompt_progress: Some(progress),
            completion_probabilities: None,
        })))
    }

    fn with_timings(chunk: CompletionChunk, timings: Timings) -> CompletionChunk {
        match chunk {
            CompletionChunk::Partial(mut partial) => {
                partial.timings = Some(timings);
                CompletionChunk::Partial(partial)
            }
            result => result,
        }
    }

    fn finish(
        &mut self,
        tracked: &Tracked,
        reason: FinishReason,
        text: String,
        usage: Usage,
    ) -> Vec<CompletionChunk> {
        let eos = &self.end.engine.info().eos_token_ids;
        let stopped_eos =
            reason == FinishReason::Stop && self.last_token.is_some_and(|t| eos.contains(&t));
        let result = self
            .end
            .body(tracked, reason, stopped_eos, usage.completion_tokens, text);
        if !self.response_fields.is_empty() {
            let whole = serde_json::to_value(&result).unwrap_or_default();
            return vec![CompletionChunk::Selected(select_fields(
                &self.response_fields,
                &whole,
            ))];
        }
        vec![CompletionChunk::Result(Box::new(result))]
    }
}
