//! Submission and following: a request's [`Params`] into a [`GenerationRequest`] submitted off
//! the async threads, and its events followed while they are measured ([`Tracked`]), collected
//! or streamed in a wire format's [`StreamFormat`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlxcel_engine::{
    Engine, EngineError, Event, FinishReason, GenerationRequest, GenerationStream, MaxNewTokens,
    RequestProgress, SamplingParams, TokenLogprob, Usage,
};

use crate::body::StreamSender;
use crate::error::ApiError;
use crate::progress::{ProgressReporter, PromptProgress};
use crate::request::{BiasTarget, Params, PromptInput, PromptPiece};
use crate::request_log::{GenerationSummary, RequestLog};
use crate::state::{ActiveRequest, AppState};

/// How long a cancelled request may take to report its end before the server stops waiting.
const CANCEL_DRAIN: Duration = Duration::from_secs(30);

/// How often a `return_progress` stream reads its prefill's progress while it waits for the first
/// token (the engine publishes it after each step).
const PROGRESS_POLL: Duration = Duration::from_millis(5);

/// The request's sampling settings over the server's defaults (`--temp`, `--seed`, `--top-k`
/// ...) over the engine's.
fn sampling(state: &AppState, params: &Params, eos: &[u32]) -> SamplingParams {
    let config = state.config();
    let server = config.sampling_defaults.over(SamplingParams {
        temperature: config.default_temperature,
        seed: config.default_seed,
        ..SamplingParams::default()
    });
    // As llama-server: a `dry_base` below 1 takes the server's.
    let mut request = params.sampling.clone();
    if request.dry_base.is_some_and(|base| base < 1.0) {
        request.dry_base = None;
    }
    let chain = &config.sampling_chain;
    // `--logit-bias` applies to requests that send no `logit_bias` of their own.
    let mut logit_bias = if params.logit_bias.is_empty() {
        chain.logit_bias.clone()
    } else {
        Vec::new()
    };
    // As llama-server: every end-of-sequence token biased to -inf.
    if params.ignore_eos.unwrap_or(chain.ignore_eos) {
        logit_bias.extend(eos.iter().map(|&t| (t, f32::NEG_INFINITY)));
    }
    SamplingParams {
        samplers: params
            .samplers
            .clone()
            .or_else(|| chain.samplers.clone())
            .unwrap_or(server.samplers.clone()),
        logit_bias,
        ..request.over(server)
    }
}

/// A request's settings as `/slots` shows them (llama-server's `params` of a slot, its names).
fn slot_params(request: &GenerationRequest, ignore_eos: bool) -> serde_json::Value {
    let s = &request.sampling;
    let dry_penalty_last_n = i64::try_from(s.dry_penalty_last_n).unwrap_or(-1);
    serde_json::json!({
        "n_predict": match request.max_new_tokens {
            MaxNewTokens::Limited(n) => n as i64,
            MaxNewTokens::Unlimited => -1,
        },
        "seed": s.seed.map_or(-1, |seed| seed as i64),
        "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": dry_penalty_last_n,
        "dry_sequence_breakers": s.dry_sequence_breakers,
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "min_keep": s.min_keep,
        "stop": request.stop,
        "ignore_eos": ignore_eos,
        // llama-server's shape: `{"bias", "token"}`, -infinity (a forbidden token) as null.
        "logit_bias": s.logit_bias.iter().map(|&(t, b)| {
            serde_json::json!({"bias": if b.is_finite() { b.into() } else { serde_json::Value::Null }, "token": t})
        }).collect::<Vec<_>>(),
        "n_probs": request.logprobs.unwrap_or(0),
        "post_sampling_probs": request.post_sampling_probs,
        "samplers": s.samplers.iter().map(|stage| stage.name()).collect::<Vec<_>>(),
        "adaptive_target": s.adaptive_target,
        "adaptive_decay": s.adaptive_decay,
        // The LoRA scales the request ran with, by adapter id.
        "lora": request.lora.iter().enumerate().map(|(id, &scale)| {
            serde_json::json!({"id": id, "scale": scale})
        }).collect::<Vec<_>>(),
    })
}

/// The token ids and biases of `logit_bias`: an id must be in the vocabulary, a text biases each
/// token of its tokenization (without special tokens, as llama-server tokenizes it).
pub(crate) fn resolve_logit_bias(
    engine: &Engine,
    entries: &[(BiasTarget, f32)],
) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::new();
    for (target, bias) in entries {
        match target {
            BiasTarget::Id(id) => {
                let vocab = engine.info().vocab_size;
                let token = u32::try_from(*id).ok().filter(|&t| (t as usize) < vocab);
                let Some(token) = token else {
                    return Err(ApiError::invalid_param(
                        "logit_bias",
                        format!("logit_bias: token id {id} is not in the vocabulary (0..{vocab})"),
                    ));
                };
                out.push((token, *bias));
            }
            BiasTarget::Text(text) => {
                let tokens = engine
                    .tokenizer()
                    .encode(text, false, false)
                    .map_err(EngineError::from)?;
                if tokens.is_empty() {
                    return Err(ApiError::invalid_param(
                        "logit_bias",
                        format!(
                            "logit_bias: {text:?} has no tokens; name a token id or a non-empty text"
                        ),
                    ));
                }
                out.extend(tokens.into_iter().map(|t| (t, *bias)));
            }
        }
    }
    Ok(out)
}

/// The prompt's tokens, as the engine will see them; an empty prompt is refused.
pub(crate) fn tokenize(engine: &Engine, prompt: PromptInput) -> Result<Vec<u32>, ApiError> {
    let tokens = match prompt {
        PromptInput::Text(text) => engine.tokenize(&text)?,
        PromptInput::Templated(text) => engine
            .tokenizer()
            .encode(&text, false, true)
            .map_err(EngineError::from)?,
        PromptInput::Tokens(tokens) => {
            engine.check_tokens(&tokens)?;
            tokens
        }
        PromptInput::Mixed(pieces) => {
            let mut tokens = Vec::new();
            for (i, piece) in pieces.into_iter().enumerate() {
                match piece {
                    PromptPiece::Text(text) => tokens.extend(
                        engine
                            .tokenizer()
                            .encode(&text, i == 0, true)
                            .map_err(EngineError::from)?,
                    ),
                    PromptPiece::Token(id) => tokens.push(id),
                }
            }
            engine.check_tokens(&tokens)?;
            tokens
        }
    };
    if tokens.is_empty() {
        return Err(EngineError::EmptyPrompt.into());
    }
    Ok(tokens)
}

/// Tokenizes and sizes against `--ctx-size` on a blocking thread, then submits with
/// [`Engine::submit_async`] (the engine answers between steps; no thread waits for it).
pub async fn submit(
    state: &Arc<AppState>,
    prompt: PromptInput,
    params: Params,
) -> Result<Tracked, ApiError> {
    let pinned = params.id_slot;
    if let Some(slot) = pinned
        && slot >= state.config().parallel
    {
        return Err(ApiError::invalid_param(
            "id_slot",
            format!(
                "id_slot={slot}: this server has {} slots (ids 0 to {}; --parallel)",
                state.config().parallel,
                state.config().parallel.saturating_sub(1)
            ),
        ));
    }
    let engine = state.awake_engine().await?;
    let sampling = sampling(state, &params, &engine.info().eos_token_ids);
    let ignore_eos = params
        .ignore_eos
        .unwrap_or(state.config().sampling_chain.ignore_eos);
    let requested = params
        .max_new_tokens
        .unwrap_or(state.config().default_max_new_tokens);
    let limit = state.context_limit(engine.info());
    let default_constraint = state.config().default_constraint.clone();
    let cap_by_ctx = limit < engine.info().window;
    // The request's `lora`, else the server's scales (`--lora`, `POST /lora-adapters`).
    let lora = match &params.lora {
        Some(list) => crate::lora::scales_of(list, engine.lora_adapters().len(), "lora")?,
        None => state.lora_scales(),
    };
    let (timings_per_token, return_progress) = (params.timings_per_token, params.return_progress);
    // The request's `sse_ping_interval`, else `--sse-ping-interval`; 0 or -1: no pings.
    let ping = params
        .sse_ping_interval
        .unwrap_or(state.config().sse_ping_interval)
        .try_into()
        .ok()
        .filter(|&seconds: &u64| seconds > 0)
        .map(Duration::from_secs);
    // Tokenizing (and templating) is CPU work, done off the async threads; the submission itself
    // is awaited without holding a thread.
    let request = tokio::task::spawn_blocking({
        let engine = engine.clone();
        move || {
            let mut sampling = sampling;
            sampling
                .logit_bias
                .extend(resolve_logit_bias(&engine, &params.logit_bias)?);
            let prompt = tokenize(&engine, prompt)?;
            let constraint_triggers = match &params.lazy_grammar {
                Some(lazy) => lazy.resolve(&engine)?,
                None => Vec::new(),
            };
            let reasoning_budget = params
                .reasoning_budget
                .as_ref()
                .map(|budget| budget.tokenize(&engine))
                .transpose()?;
            // `--ctx-size` below the window: refuse what it cannot hold, clamp an unlimited budget to
            // it. At the window the engine decides, so a static-shape backend still sees the budget.
            let max_new_tokens = if cap_by_ctx {
                MaxNewTokens::Limited(
                    mlxcel_capacity::admit(prompt.len(), requested, limit)
                        .map_err(EngineError::from)?,
                )
            } else {
                requested
            };
            Ok::<_, ApiError>(GenerationRequest {
                prompt,
                max_new_tokens,
                sampling,
                stop: params.stop,
                stop_token_ids: Vec::new(),
                logprobs: params.logprobs,
                post_sampling_probs: params.post_sampling_probs,
                constraint: params.constraint.or(default_constraint),
                constraint_triggers,
                // The engine's default (`EngineOptions::speculative`).
                speculative: None,
                predict_time_limit: params.predict_time_limit,
                min_indent: params.min_indent,
                reuse_cached_prefix: params.cache_prompt.unwrap_or(true),
                reasoning_budget,
                lora,
            })
        }
    })
    .await
    .map_err(|err| ApiError::Internal(format!("tokenizing task failed: {err}")))??;
    let prompt_len = request.prompt.len();
    let slot_params = slot_params(&request, ignore_eos);
    let budget = match request.max_new_tokens {
        MaxNewTokens::Limited(n) => Some(n),
        MaxNewTokens::Unlimited => None,
    };
    let prompt = request.prompt.clone();
    if request.reuse_cached_prefix && engine.metrics().prefix.budget > 0 {
        tracing::debug!(
            prompt_tokens = prompt_len,
            "updating prompt cache: the prompt is looked up in the prefix cache (--cache-ram)"
        );
    }
    // As llama-server defers a task pinned to a busy slot until the slot's task ends: wait
    // while a request holds it (a client that gives up drops this future).
    if let Some(slot) = pinned {
        while state.slot_is_busy(slot) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let stream = engine
        .submit_async(request)
        .await
        .map_err(|err| match ApiError::from(err) {
            ApiError::QueueFull { message, .. } => {
                state.metrics().observe_queue_full();
                ApiError::QueueFull {
                    message,
                    retry_after: state.metrics().retry_after(engine.metrics().waiting),
                }
            }
            other => other,
        })?;
    let key = state.register(ActiveRequest {
        request_id: stream.id(),
        slot: None,
        prompt,
        prompt_tokens: prompt_len,
        budget,
        generated: 0,
        text: String::new(),
        params: slot_params.clone(),
        started: Instant::now(),
        pinned,
        completion_id: None,
    });
    Ok(Tracked {
        settings: slot_params,
        engine: engine.clone(),
        timings_per_token,
        return_progress,
        ping,
        stream,
        state: state.clone(),
        key,
        prompt_tokens: prompt_len,
        submitted: Instant::now(),
        first_token: None,
        last_token: None,
        generated: 0,
        cached_tokens: 0,
        drafted_tokens: 0,
        accepted_tokens: 0,
        finished: None,
        log: RequestLog::take_over(),
    })
}

/// A submitted request whose events are measured as they pass; dropping it cancels the request.
#[derive(Debug)]
pub struct Tracked {
    stream: GenerationStream,
    state: Arc<AppState>,
    key: u64,
    prompt_tokens: usize,
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    generated: usize,
    /// Prompt tokens the prefix cache held (known at the end).
    cached_tokens: usize,
    /// Speculative decoding's proposals for this request and those accepted (known at the end).
    drafted_tokens: usize,
    accepted_tokens: usize,
    /// How it ended, once it has.
    finished: Option<FinishReason>,
    /// The request's log line, written when the request ends (or is dropped).
    log: Option<RequestLog>,
    /// Its settings as `/slots` shows them (llama-server's `generation_settings`).
    settings: serde_json::Value,
    /// The engine it runs on (a stream reads its prefill's progress there).
    engine: Arc<Engine>,
    /// llama-server's `timings_per_token` and `return_progress`, for a stream.
    timings_per_token: bool,
    return_progress: bool,
    /// A stream silent this long sends an SSE comment (`:`), as llama-server's
    /// `sse_ping_interval` keeps idle connections alive; `None`: never.
    ping: Option<Duration>,
}

impl Tracked {
    /// The engine's request id.
    pub fn id(&self) -> u64 {
        self.stream.id()
    }

    /// Names this request by the id its reply carries ([`AppState::name_request`]).
    pub(crate) fn name(&self, completion_id: &str) {
        self.state.name_request(self.key, completion_id);
    }

    /// Prompt tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The `/slots` id the request holds (or held last), for llama-server's `id_slot`; -1 while
    /// it waits for one.
    pub fn slot_id(&self) -> i64 {
        self.state.id_slot(self.key)
    }

    /// The request's settings, in llama-server's names (`/slots`' `params`, `/completion`'s
    /// `generation_settings`).
    pub fn settings(&self) -> &serde_json::Value {
        &self.settings
    }

    /// What [`Tracked::slot_id`] reads, for a format that outlives its borrow of the request.
    pub fn slot_handle(&self) -> (Arc<AppState>, u64) {
        (self.state.clone(), self.key)
    }

    /// Milliseconds from submission to the first token, and from there to the last.
    pub fn timings(&self) -> (f64, f64) {
        let first = self.first_token.unwrap_or(self.submitted);
        let last = self.last_token.unwrap_or(first);
        (
            (first - self.submitted).as_secs_f64() * 1e3,
            (last - first).as_secs_f64() * 1e3,
        )
    }

    /// llama-server's `timings` object of this request, `generated` tokens having been
    /// generated.
    pub fn timings_object(&self, generated: usize) -> Timings {
        Timings::new(
            self.prompt_tokens,
            self.cached_tokens,
            generated,
            self.timings(),
        )
        .with_drafts(self.drafted_tokens, self.accepted_tokens)
    }

    /// How far the engine has got with this request's prompt, while it runs there.
    fn engine_progress(&self) -> Option<RequestProgress> {
        let id = self.id();
        self.engine
            .metrics()
            .running_requests
            .into_iter()
            .find(|p| p.id == id)
    }

    /// The next event; `None` after the end.
    pub async fn next(&mut self) -> Option<Event> {
        let event = self.stream.next_event().await?;
        let now = Instant::now();
        match &event {
            Event::Token { text, .. } => {
                self.first_token.get_or_insert(now);
                self.last_token = Some(now);
                self.generated += 1;
                self.state.note_generated(self.key, self.generated, text);
            }
            Event::Finished { reason, usage, .. } => {
                self.finished = Some(*reason);
                self.cached_tokens = usage.cached_tokens;
                self.drafted_tokens = usage.drafted_tokens;
                self.accepted_tokens = usage.accepted_tokens;
                self.state.metrics().observe_finished(*reason);
            }
        }
        Some(event)
    }

    /// Cancels the request and waits (bounded) for the engine to confirm, so that the metrics
    /// and `/slots` reflect it.
    pub async fn cancel(mut self) {
        self.stream.cancel();
        let _ = tokio::time::timeout(CANCEL_DRAIN, async { while self.next().await.is_some() {} })
            .await;
    }
}

impl Drop for Tracked {
    /// Dropped before its end (a non-streamed request whose connection went away, or a task
    /// aborted at the shutdown deadline): the stream's own drop cancels it in the engine.
    fn drop(&mut self) {
        if self.finished.is_none() {
            self.state
                .metrics()
                .observe_finished(FinishReason::Cancelled);
        }
        self.state.unregister(self.key);
        if let Some(log) = &self.log {
            log.generation_finished(&GenerationSummary {
                engine_id: self.stream.id(),
                prompt_tokens: self.prompt_tokens,
                cached_tokens: self.cached_tokens,
                generated_tokens: self.generated,
                ttft_ms: self.first_token.map(|_| self.timings().0),
                tok_s: self.timings_object(self.generated).predicted_per_second,
                finish_reason: self.finished.unwrap_or(FinishReason::Cancelled).as_str(),
            });
        }
    }
}

/// llama-server's `timings` object: prompt processing from submission to the first token (queueing
/// included), generation from the first token to the last. As llama-server, the generation rates
/// count the decode steps after the first token (which comes with the prompt), `cache_n` is the
/// prompt tokens the prefix cache held and `prompt_n` the ones computed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Timings {
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Speculative decoding's proposals and those accepted, as llama-server reports them: only
    /// when the request speculated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<usize>,
}

impl Timings {
    /// From the counts (prompt tokens, of them cached, generated) and the two durations
    /// (milliseconds) of [`Tracked::timings`].
    pub fn new(
        prompt_tokens: usize,
        cached: usize,
        predicted_n: usize,
        (prompt_ms, predicted_ms): (f64, f64),
    ) -> Self {
        let prompt_n = prompt_tokens.saturating_sub(cached);
        let steps = predicted_n.saturating_sub(1);
        let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        Self {
            cache_n: cached,
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: per(prompt_ms, prompt_n),
            prompt_per_second: rate(prompt_n, prompt_ms),
            predicted_n,
            predicted_ms,
            predicted_per_token_ms: per(predicted_ms, steps),
            predicted_per_second: rate(steps, predicted_ms),
            draft_n: None,
            draft_n_accepted: None,
        }
    }

    /// The request's timings at a prompt-progress report: the prompt computed so far (beyond
    /// the cache), nothing generated.
    pub fn at_progress(progress: &PromptProgress) -> Self {
        Self::new(
            progress.processed,
            progress.cache,
            0,
            (progress.time_ms, 0.0),
        )
    }

    /// With the request's speculative proposals (`drafted`) and accepted ones, when it had any.
    pub fn with_drafts(mut self, drafted: usize, accepted: usize) -> Self {
        if drafted > 0 {
            self.draft_n = Some(drafted);
            self.draft_n_accepted = Some(accepted);
        }
        self
    }
}

/// One generated token with what the wire formats report about it.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub token: u32,
    pub text: String,
    pub logprob: Option<TokenLogprob>,
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Everything a finished request produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub text: String,
    pub tokens: Vec<TokenRecord>,
    pub reason: FinishReason,
    pub usage: Usage,
}

/// Follows a request to its end and gathers its output.
pub async fn collect(tracked: &mut Tracked) -> Result<Outcome, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = tracked.next().await {
        match event {
            Event::Token {
                token,
                text: piece,
                logprob,
                top_logprobs,
            } => {
                text.push_str(&piece);
                tokens.push(TokenRecord {
                    token,
                    text: piece,
                    logprob,
                    top_logprobs,
                });
            }
            Event::Finished {
                reason,
                text: tail,
                usage,
                error,
            } => {
                text.push_str(&tail);
                if reason == FinishReason::Error {
                    return Err(ApiError::generation_failed(error.unwrap_or_default()));
                }
                return Ok(Outcome {
                    text,
                    tokens,
                    reason,
                    usage,
                });
            }
        }
    }
    Err(ApiError::Unavailable)
}

/// The text of one token, for logprobs.
pub fn token_piece(engine: &Engine, token: u32) -> String {
    engine
        .tokenizer()
        .decode(&[token], false)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A process-unique id with some entropy from the clock, for the ids of replies.
pub(crate) fn rand_id() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos << 16) ^ u128::from(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// How one wire format writes a streamed request. [`stream`] owns everything else: waiting for
/// the next event or the client's departure, cancelling when the client goes, and reporting a
/// failure mid-stream in the error shape every route shares.
pub trait StreamFormat: Send + 'static {
    /// One server-sent event's data.
    type Chunk: serde::Serialize + Send + Sync;
    /// Whether the stream ends with OpenAI's `data: [DONE]` line (after a failure too).
    const DONE_LINE: bool;

    /// What goes before the first token, if anything.
    fn opening(&mut self) -> Vec<Self::Chunk> {
        Vec::new()
    }

    /// The SSE `event:` name of a chunk, for formats that name their events; `None` sends a bare
    /// `data:` line.
    fn event_name(_chunk: &Self::Chunk) -> Option<&'static str> {
        None
    }

    /// The event that reports a failure mid-stream, as its name and data: by default OpenAI's
    /// error object, unnamed.
    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, serde_json::Value) {
        (None, err.body())
    }

    /// The chunks for one generated token (none to send nothing for it; several where the
    /// token also opens or closes a part of the reply, as Anthropic's content blocks).
    fn token(&mut self, token: TokenRecord) -> Vec<Self::Chunk>;

    /// A `return_progress` report (with the request's timings at it), or `None` where the format
    /// sends none (its route refuses the field).
    fn progress(&mut self, _progress: PromptProgress) -> Option<Self::Chunk> {
        None
    }

    /// A token's chunk with the request's timings so far (`timings_per_token`); unchanged where
    /// the format carries none (its route refuses the field).
    fn with_timings(chunk: Self::Chunk, _timings: Timings) -> Self::Chunk {
        chunk
    }

    /// The chunks that end a stream that finished without error; `text` is the held-back tail.
    fn finish(
        &mut self,
        tracked: &Tracked,
        reason: FinishReason,
        text: String,
        usage: Usage,
    ) -> Vec<Self::Chunk>;
}

/// Streams `tracked` to `sender` in `format` until the request ends or the client goes.
pub async fn stream<F: StreamFormat>(mut tracked: Tracked, sender: StreamSender, mut format: F) {
    for chunk in format.opening() {
        if !sender.named_event(F::event_name(&chunk), &chunk).await {
            return tracked.cancel().await;
        }
    }
    let mut reporter = tracked
        .return_progress
        .then(|| ProgressReporter::new(tracked.prompt_tokens, tracked.submitted));
    let ping = tracked.ping;
    loop {
        let reporting = reporter.as_ref().is_some_and(|r| !r.done());
        let event = tokio::select! {
            _ = sender.closed() => return tracked.cancel().await,
            event = tracked.next() => match event {
                Some(event) => event,
                None => return,
            },
            () = tokio::time::sleep(ping.unwrap_or(PROGRESS_POLL)), if ping.is_some() && !reporting => {
                // As llama-server: an SSE comment line, which clients skip, so that proxies and
                // clients with idle timeouts keep a silent stream (a long prefill) open.
                if !sender.raw(":\n\n".into()).await {
                    return tracked.cancel().await;
                }
                continue;
            }
            () = tokio::time::sleep(PROGRESS_POLL), if reporting => {
                let reports = match (&mut reporter, tracked.engine_progress()) {
                    (Some(reporter), Some(seen)) => reporter.observe(&seen, Instant::now()),
                    _ => Vec::new(),
                };
                for report in reports {
                    if let Some(chunk) = format.progress(report)
                        && !sender.named_event(F::event_name(&chunk), &chunk).await
                    {
                        return tracked.cancel().await;
                    }
                }
                continue;
            }
        };
        // The first token: the prompt is processed whole.
        if let Some(reporter) = reporter
            .as_mut()
            .filter(|r| !r.done() && matches!(event, Event::Token { .. }))
        {
            let seen = tracked.engine_progress();
            for report in reporter.finish(seen.as_ref(), Instant::now()) {
                if let Some(chunk) = format.progress(report)
                    && !sender.named_event(F::event_name(&chunk), &chunk).await
                {
                    return tracked.cancel().await;
                }
            }
        }
        match event {
            Event::Token {
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                let record = TokenRecord {
                    token,
                    text,
                    logprob,
                    top_logprobs,
                };
                for chunk in format.token(record) {
                    let chunk = if tracked.timings_per_token {
                        F::with_timings(chunk, tracked.timings_object(tracked.generated))
                    } else {
                        chunk
                    };
                    if !sender.named_event(F::event_name(&chunk), &chunk).await {
                        return tracked.cancel().await;
                    }
                }
            }
            Event::Finished {
                reason,
                text,
                usage,
                error,
            } => {
                if reason == FinishReason::Error {
                    tracing::error!(id = tracked.id(), error = ?error, "generation failed mid-stream");
                    let err = ApiError::generation_failed(error.unwrap_or_default());
                    let (name, data) = format.error_event(&err);
                    let _ = sender.named_event(name, &data).await;
                } else {
                    for chunk in format.finish(&tracked, reason, text, usage) {
                        let _ = sender.named_event(F::event_name(&chunk), &chunk).await;
                    }
                }
                if F::DONE_LINE {
                    let _ = sender.raw("data: [DONE]\n\n".into()).await;
                }
                return;
            }
        }
    }
}
