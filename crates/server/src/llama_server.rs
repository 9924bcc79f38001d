//! llama-server's routes: `/completion`, `/infill`, `/tokenize`, `/detokenize`,
//! `/apply-template`, `/health`, `/props`, `/slots`, `/metrics`.

use crate::structured::{ConstraintFields, ResponseFormat};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use mlxcel_engine::{Engine, FinishReason, Usage};
use serde::{Deserialize, Serialize};

use crate::body::{Body, event_stream, full, json};
use crate::error::ApiError;
use crate::generate::{
    Params, PromptInput, StreamFormat, Timings, TokenRecord, Tracked, budget, collect, stream,
    submit, token_piece,
};
use crate::llama_fields::LlamaFields;
use crate::openai::{MessageField, StopField, chat_messages};
use crate::read::{read_generation_json, read_json};
use crate::state::AppState;

/// A llama-server prompt: text, or token ids (llama-server also mixes them; ids only here).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LlamaPrompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// A text llama-server tokenizes "mixed": a string, or a list of strings and token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MixedText {
    Text(String),
    Pieces(Vec<MixedPiece>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MixedPiece {
    Text(String),
    Token(u32),
}

/// One file of `/infill`'s `input_extra`.
#[derive(Debug, Deserialize)]
struct ExtraChunk {
    text: String,
    /// llama-server's default when absent.
    #[serde(default = "default_filename")]
    filename: String,
}

fn default_filename() -> String {
    "tmp".to_owned()
}

/// The body of `/completion` and `/infill` (which reads every `/completion` field too).
#[derive(Debug, Deserialize)]
struct CompletionRequest {
    /// `/completion`: the prompt (required). `/infill`: text typed right before the cursor,
    /// after `input_prefix` (optional, a string).
    prompt: Option<LlamaPrompt>,
    /// `/infill` only: the text before the cursor, and after it.
    input_prefix: Option<MixedText>,
    input_suffix: Option<MixedText>,
    /// `/infill` only: other files of the project, as context before the prefix.
    input_extra: Option<Vec<ExtraChunk>>,
    n_predict: Option<i64>,
    /// llama-server's aliases of `n_predict`, read when it is absent.
    max_completion_tokens: Option<i64>,
    max_tokens: Option<i64>,
    /// One completion per request (llama-server's `n_cmpl`, alias `n`).
    n_cmpl: Option<u32>,
    n: Option<u32>,
    #[serde(default)]
    stream: bool,
    stop: Option<StopField>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<usize>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    n_probs: Option<usize>,
    // Structured output (structured.rs): llama-server's own fields, and the OpenAI and vLLM
    // spellings it also reads.
    json_schema: Option<serde_json::Value>,
    grammar: Option<String>,
    response_format: Option<ResponseFormat>,
    guided_json: Option<serde_json::Value>,
    guided_regex: Option<String>,
    guided_grammar: Option<String>,
}

/// llama-server's request bodies through the checks their handlers make before they need the
/// model (for the fuzz targets; see `crate::fuzzing`): `endpoint` is `completion`, `infill`,
/// `tokenize`, `detokenize` or `apply-template`.
pub(crate) fn check_body(endpoint: &str, bytes: &[u8]) -> Result<(), ApiError> {
    match endpoint {
        "completion" | "infill" => {
            let mut request: CompletionRequest = read_inert_then_parse(bytes)?;
            let prompt = request.prompt.take();
            if endpoint == "infill" {
                if request.input_prefix.is_none() || request.input_suffix.is_none() {
                    return Err(ApiError::invalid_param(
                        "input_prefix",
                        "input_prefix and input_suffix are required",
                    ));
                }
                if let Some(LlamaPrompt::Tokens(_)) = prompt {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        "prompt must be a string on /infill",
                    ));
                }
            } else if prompt.is_none()
                || request.input_prefix.is_some()
                || request.input_suffix.is_some()
                || request.input_extra.is_some()
            {
                return Err(ApiError::invalid_param("prompt", "refused by /completion"));
            }
            for n in [request.n_cmpl, request.n].into_iter().flatten() {
                if n != 1 {
                    return Ok(());
                }
            }
            let budget_value = [
                request.n_predict,
                request.max_completion_tokens,
                request.max_tokens,
            ]
            .into_iter()
            .flatten()
            .next();
            budget("n_predict", budget_value)?;
            ConstraintFields {
                response_format: request.response_format,
                json_schema: request.json_schema,
                grammar: request.grammar,
                guided_json: request.guided_json,
                guided_regex: request.guided_regex,
                guided_grammar: request.guided_grammar,
            }
            .constraint()?;
            // llama-server's fields every generating route reads (`logit_bias`, `samplers` ...).
            let llama: LlamaFields = crate::read::parse_json(bytes)?;
            llama.apply(&mut crate::generate::Params::default())?;
            Ok(())
        }
        "tokenize" => crate::read::parse_json::<TokenizeRequest>(bytes).map(drop),
        "detokenize" => crate::read::parse_json::<DetokenizeRequest>(bytes).map(drop),
        _ => {
            let request: ApplyTemplateRequest = crate::read::parse_json(bytes)?;
            chat_messages(request.messages).map(drop)
        }
    }
}

fn read_inert_then_parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    crate::inert::refuse_inert_fields(bytes)?;
    crate::read::parse_json(bytes)
}

/// `POST /completion`.
pub async fn completion(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let (mut request, llama): (CompletionRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    for (field, given) in [
        ("input_prefix", request.input_prefix.is_some()),
        ("input_suffix", request.input_suffix.is_some()),
        ("input_extra", request.input_extra.is_some()),
    ] {
        if given {
            return Err(ApiError::unsupported(
                field,
                format!("{field} is a field of /infill, not of /completion"),
            ));
        }
    }
    let (prompt, prompt_text) = match request.prompt.take() {
        Some(LlamaPrompt::Text(text)) => (PromptInput::Text(text.clone()), text),
        Some(LlamaPrompt::Tokens(tokens)) => (PromptInput::Tokens(tokens), String::new()),
        None => {
            return Err(ApiError::invalid_param(
                "prompt",
                "prompt is required: text or token ids",
            ));
        }
    };
    generate_completion(state, engine, (request, llama), prompt, prompt_text).await
}

/// `POST /infill`: the prefix, suffix and extra files arranged around the model's
/// fill-in-the-middle tokens as llama-server does ([`crate::infill`]), then generated and answered
/// as `/completion`. A model without those tokens is answered 501, as llama-server answers.
pub async fn infill(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?.clone();
    let (pre, suf, mid) = engine.info().fim_tokens.infill().map_err(|missing| {
        ApiError::NotImplemented(
            format!(
                "Infill is not supported by this model: it has no fill-in-the-middle {} token{} \
                 (GGUF metadata tokenizer.ggml.fim_*_token_id, or a vocabulary token such as \
                 <fim_prefix>, <|fim_prefix|> or <PRE>)",
                missing.join(", "),
                if missing.len() == 1 { "" } else { "s" }
            )
            .into(),
        )
    })?;
    let (mut request, llama): (CompletionRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let prefix = request
        .input_prefix
        .take()
        .ok_or_else(|| ApiError::invalid_param("input_prefix", "input_prefix is required"))?;
    let suffix = request
        .input_suffix
        .take()
        .ok_or_else(|| ApiError::invalid_param("input_suffix", "input_suffix is required"))?;
    let typed = match request.prompt.take() {
        None => String::new(),
        Some(LlamaPrompt::Text(text)) => text,
        Some(LlamaPrompt::Tokens(_)) => {
            return Err(ApiError::invalid_param(
                "prompt",
                "prompt must be a string on /infill",
            ));
        }
    };
    let extra = request.input_extra.take().unwrap_or_default();
    let fim = engine.info().fim_tokens;
    let config = state.config();
    let limits = crate::infill::InfillLimits {
        n_batch: crate::infill::N_BATCH,
        n_predict: match config.default_max_new_tokens {
            mlxcel_engine::MaxNewTokens::Unlimited => -1,
            mlxcel_engine::MaxNewTokens::Limited(n) => n as i64,
        },
        n_ctx: state.context_limit(engine.info()),
    };
    let spm = config.spm_infill;
    // Tokenizing is CPU work: off the async threads, like every prompt.
    let tokens = tokio::task::spawn_blocking({
        let engine = engine.clone();
        move || -> Result<Vec<u32>, ApiError> {
            let plain = |text: &str| -> Result<Vec<u32>, ApiError> {
                Ok(engine
                    .tokenizer()
                    .encode(text, false, false)
                    .map_err(mlxcel_engine::EngineError::from)?)
            };
            let mixed = |field: &str, text: MixedText| -> Result<Vec<u32>, ApiError> {
                match text {
                    MixedText::Text(text) => plain(&text),
                    MixedText::Pieces(pieces) => {
                        let mut out = Vec::new();
                        for piece in pieces {
                            match piece {
                                MixedPiece::Text(text) => out.extend(plain(&text)?),
                                MixedPiece::Token(id) => {
                                    engine.check_tokens(&[id]).map_err(|err| {
                                        ApiError::invalid_param(field, err.to_string())
                                    })?;
                                    out.push(id);
                                }
                            }
                        }
                        Ok(out)
                    }
                }
            };
            let frame = crate::infill::FimFrame {
                pre,
                suf,
                mid,
                rep: fim.rep,
                sep: fim.sep,
                bos: engine
                    .tokenizer()
                    .leading_special_tokens()
                    .map_err(mlxcel_engine::EngineError::from)?,
                spm,
            };
            let chunks = extra
                .iter()
                .map(|chunk| {
                    Ok(crate::infill::ExtraTokens {
                        filename_line: plain(&format!("{}\n", chunk.filename))?,
                        text: plain(&chunk.text)?,
                    })
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            let extra = crate::infill::extra_context(
                &frame,
                &plain("myproject\n")?,
                &chunks,
                &plain(crate::infill::SNIPPET_SEPARATOR)?,
                &plain("filename\n")?,
            );
            // The text before the cursor is tokenized with special tokens parsed, as llama-server.
            let typed = engine
                .tokenizer()
                .encode(&typed, false, true)
                .map_err(mlxcel_engine::EngineError::from)?;
            Ok(crate::infill::assemble(
                &frame,
                limits,
                &mixed("input_prefix", prefix)?,
                &mixed("input_suffix", suffix)?,
                &typed,
                &extra,
            ))
        }
    })
    .await
    .map_err(|err| ApiError::Internal(format!("tokenizing task failed: {err}")))??;
    // llama-server reports the prompt it ran: the tokens, detokenized with their special tokens.
    let prompt_text = engine
        .tokenizer()
        .decode(&tokens, false)
        .map_err(mlxcel_engine::EngineError::from)?;
    generate_completion(
        state,
        engine,
        (request, llama),
        PromptInput::Tokens(tokens),
        prompt_text,
    )
    .await
}

/// `/completion`'s generation and answer, shared with `/infill`: `prompt_text` is what the
/// answer's `prompt` reports; `llama` the task fields every generating route reads.
async fn generate_completion(
    state: &Arc<AppState>,
    engine: Arc<Engine>,
    (request, llama): (CompletionRequest, LlamaFields),
    prompt: PromptInput,
    prompt_text: String,
) -> Result<Response<Body>, ApiError> {
    for (field, value) in [("n_cmpl", request.n_cmpl), ("n", request.n)] {
        if let Some(n) = value.filter(|&n| n != 1) {
            return Err(ApiError::unsupported(
                field,
                format!("{field}={n} is not supported: one completion per request"),
            ));
        }
    }
    let (budget_field, budget_value) = [
        ("n_predict", request.n_predict),
        ("max_completion_tokens", request.max_completion_tokens),
        ("max_tokens", request.max_tokens),
    ]
    .into_iter()
    .find(|(_, v)| v.is_some())
    .unwrap_or(("n_predict", None));
    let mut params = Params {
        max_new_tokens: budget(budget_field, budget_value)?,
        temperature: request.temperature,
        top_k: request.top_k,
        top_p: request.top_p,
        min_p: request.min_p,
        repeat_penalty: request.repeat_penalty,
        repeat_last_n: request.repeat_last_n,
        presence_penalty: request.presence_penalty,
        frequency_penalty: request.frequency_penalty,
        seed: request.seed,
        stop: request.stop.map(StopField::into_vec).unwrap_or_default(),
        logprobs: request.n_probs.filter(|&n| n > 0),
        constraint: ConstraintFields {
            response_format: request.response_format,
            json_schema: request.json_schema,
            grammar: request.grammar,
            guided_json: request.guided_json,
            guided_regex: request.guided_regex,
            guided_grammar: request.guided_grammar,
        }
        .constraint()?,
        ..Params::default()
    };
    llama.apply(&mut params)?;
    let return_tokens = llama.return_tokens();
    let stop_words = params.stop.clone();
    let mut tracked = submit(state, prompt, params).await?;
    let model = state.model_name(engine.info());
    if request.stream {
        let (response, sender) = event_stream();
        let end = Final {
            model,
            prompt: prompt_text,
            stop_words,
            engine,
        };
        let format = CompletionStream {
            end,
            last_token: None,
            slot: tracked.slot_handle(),
        };
        tokio::spawn(stream(tracked, sender, format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    let stopped_eos = outcome.reason == FinishReason::Stop
        && outcome
            .tokens
            .last()
            .is_some_and(|t| engine.info().eos_token_ids.contains(&t.token));
    let end = Final {
        model,
        prompt: prompt_text,
        stop_words,
        engine: engine.clone(),
    };
    let mut body = end.body(
        &tracked,
        outcome.reason,
        stopped_eos,
        outcome.usage.completion_tokens,
        outcome.text,
    );
    if return_tokens {
        body.tokens = outcome.tokens.iter().map(|t| t.token).collect();
    }
    if request.n_probs.is_some_and(|n| n > 0) {
        body.completion_probabilities = Some(
            outcome
                .tokens
                .iter()
                .map(|t| TokenProbs::new(&engine, t))
                .collect(),
        );
    }
    Ok(json(StatusCode::OK, &body))
}

/// One token of llama-server's `completion_probabilities`.
#[derive(Debug, Serialize)]
struct TokenProbs {
    id: u32,
    token: String,
    logprob: Option<f32>,
    top_logprobs: Vec<TopProb>,
}

#[derive(Debug, Serialize)]
struct TopProb {
    id: u32,
    token: String,
    logprob: f32,
}

impl TokenProbs {
    fn new(engine: &Engine, t: &TokenRecord) -> Self {
        Self {
            id: t.token,
            token: token_piece(engine, t.token),
            logprob: t.logprob.map(|l| l.logprob),
            top_logprobs: t
                .top_logprobs
                .iter()
                .map(|a| TopProb {
                    id: a.token,
                    token: token_piece(engine, a.token),
                    logprob: a.logprob,
                })
                .collect(),
        }
    }
}

/// A streamed piece of a `/completion`.
#[derive(Debug, Serialize)]
struct PartialCompletion {
    content: String,
    /// The token that released this piece, as llama-server sends it.
    tokens: Vec<u32>,
    stop: bool,
    id_slot: i64,
    index: u32,
}

/// The last (or only) object of a `/completion`.
#[derive(Debug, Serialize)]
struct CompletionResult {
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
    /// With `n_probs` > 0, on a request that was not streamed.
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_probabilities: Option<Vec<TokenProbs>>,
}

/// A `/completion` stream's chunk: a piece, then the result.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum CompletionChunk {
    Partial(PartialCompletion),
    Result(Box<CompletionResult>),
}

/// What the last object of a `/completion` reports.
struct Final {
    model: String,
    prompt: String,
    stop_words: Vec<String>,
    engine: Arc<Engine>,
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
            completion_probabilities: None,
        }
    }
}

/// llama-server's `/completion` stream: `{"content", "stop": false}` per token with text, then the
/// final object (`stop: true`, the stop flags and timings); no `[DONE]` line.
struct CompletionStream {
    end: Final,
    last_token: Option<u32>,
    /// Where its `/slots` id is read ([`Tracked::slot_handle`]).
    slot: (Arc<AppState>, u64),
}

impl StreamFormat for CompletionStream {
    type Chunk = CompletionChunk;
    const DONE_LINE: bool = false;

    fn token(&mut self, record: TokenRecord) -> Option<CompletionChunk> {
        self.last_token = Some(record.token);
        if record.text.is_empty() {
            return None;
        }
        Some(CompletionChunk::Partial(PartialCompletion {
            content: record.text,
            tokens: vec![record.token],
            stop: false,
            id_slot: self.slot.0.id_slot(self.slot.1),
            index: 0,
        }))
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
        vec![CompletionChunk::Result(Box::new(result))]
    }
}

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    with_pieces: bool,
    /// Special tokens in the text are always parsed; `false` is refused, not ignored.
    parse_special: Option<bool>,
}

/// `POST /tokenize`.
pub async fn tokenize(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let request: TokenizeRequest = read_json(body, state.config().body_limit).await?;
    if request.parse_special == Some(false) {
        return Err(ApiError::unsupported(
            "parse_special",
            "parse_special=false is not supported: special tokens in the text are always parsed",
        ));
    }
    let engine = state.engine()?.clone();
    let tokens = engine
        .tokenizer()
        .encode(&request.content, request.add_special, true)
        .map_err(mlxcel_engine::EngineError::from)?;
    let tokens = if request.with_pieces {
        TokenList::WithPieces(
            tokens
                .iter()
                .map(|&id| TokenPiece {
                    id,
                    piece: token_piece(&engine, id),
                })
                .collect(),
        )
    } else {
        TokenList::Ids(tokens)
    };
    Ok(json(StatusCode::OK, &TokenizeResponse { tokens }))
}

#[derive(Debug, Serialize)]
struct TokenizeResponse {
    tokens: TokenList,
}

/// Ids alone, or (`with_pieces`) each id with its text.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum TokenList {
    Ids(Vec<u32>),
    WithPieces(Vec<TokenPiece>),
}

#[derive(Debug, Serialize)]
struct TokenPiece {
    id: u32,
    piece: String,
}

#[derive(Debug, Serialize)]
struct ContentResponse {
    content: String,
}

#[derive(Debug, Serialize)]
struct PromptResponse {
    prompt: String,
}

#[derive(Debug, Serialize)]
struct HealthResponse {
    status: &'static str,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /detokenize`.
pub async fn detokenize(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let request: DetokenizeRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    engine
        .check_tokens(&request.tokens)
        .map_err(|err| ApiError::invalid_param("tokens", err.to_string()))?;
    let content = engine
        .tokenizer()
        .decode(&request.tokens, false)
        .map_err(mlxcel_engine::EngineError::from)?;
    Ok(json(StatusCode::OK, &ContentResponse { content }))
}

#[derive(Debug, Deserialize)]
struct ApplyTemplateRequest {
    messages: Vec<MessageField>,
}

/// `POST /apply-template`.
pub async fn apply_template(
    state: &Arc<AppState>,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let request: ApplyTemplateRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    let prompt = engine.apply_chat_template(&chat_messages(request.messages)?)?;
    Ok(json(StatusCode::OK, &PromptResponse { prompt }))
}

/// `GET /health`, readiness: 503 while the model loads, and while the engine's queue is full
/// (`--max-queue-depth`; a load balancer sends the next request elsewhere), else 200. The error
/// bodies are llama-server's (the status as a number in `code`).
pub fn health(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let waiting = engine.metrics().waiting;
    let depth = engine.scheduler_config().max_waiting;
    if waiting >= depth {
        return Err(ApiError::QueueFull {
            message: format!(
                "the queue is full: {waiting} requests wait for a slot (--max-queue-depth {depth})"
            ),
            retry_after: state.metrics().retry_after(waiting),
        });
    }
    Ok(json(StatusCode::OK, &HealthResponse { status: "ok" }))
}

/// `GET /live`, liveness: 200 whenever the server answers HTTP, loading or not (a process
/// supervisor restarts a server that stops answering it, not one that is busy or loading).
pub fn live() -> Response<Body> {
    json(StatusCode::OK, &HealthResponse { status: "alive" })
}

#[derive(Debug, Serialize)]
struct Props {
    default_generation_settings: GenerationSettings,
    total_slots: usize,
    model_path: std::path::PathBuf,
    model_alias: String,
    n_ctx: usize,
    n_ctx_train: usize,
    /// The checkpoint's chat template, as written (empty when it has none).
    chat_template: String,
    /// The texts of the beginning- and end-of-sequence tokens (empty when there is none).
    bos_token: String,
    eos_token: String,
    /// Text only: no image or audio input.
    modalities: Modalities,
    /// The model is never unloaded while idle.
    is_sleeping: bool,
    build_info: &'static str,
    endpoint_slots: bool,
    endpoint_props: bool,
    endpoint_metrics: bool,
    backend: &'static str,
    threads: Option<usize>,
    /// The static-shape buckets; `null` on a dynamic backend.
    capacity_buckets: Option<Vec<usize>>,
}

#[derive(Debug, Serialize)]
struct Modalities {
    vision: bool,
    audio: bool,
}

#[derive(Debug, Serialize)]
struct GenerationSettings {
    n_ctx: usize,
    model: String,
    params: DefaultParams,
}

#[derive(Debug, Serialize)]
struct DefaultParams {
    /// -1: unlimited.
    n_predict: i64,
    temperature: f32,
    /// -1: a fresh seed per request.
    seed: i64,
}

/// The text of the model's beginning- (`bos`) or end-of-sequence token: the chat template's
/// (the tokenizer configuration's), else the tokenizer's own (the first token it prepends to a
/// prompt; the first end-of-sequence id).
fn special_token_text(engine: &mlxcel_engine::Engine, bos: bool) -> String {
    if let Some(template) = engine.chat_template() {
        let text = if bos {
            template.bos_token()
        } else {
            template.eos_token()
        };
        if !text.is_empty() {
            return text.to_owned();
        }
    }
    let tokenizer = engine.tokenizer();
    let id = if bos {
        tokenizer
            .leading_special_tokens()
            .ok()
            .and_then(|t| t.first().copied())
    } else {
        engine.info().eos_token_ids.first().copied()
    };
    id.and_then(|id| tokenizer.id_to_token(id))
        .unwrap_or_default()
}

/// `GET /props`.
pub fn props(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let info = engine.info();
    let config = state.config();
    let buckets = state.capacity_buckets(engine);
    let n_ctx = state.context_limit(info);
    let props = Props {
        default_generation_settings: GenerationSettings {
            n_ctx,
            model: state.model_name(info),
            params: DefaultParams {
                n_predict: match config.default_max_new_tokens {
                    mlxcel_engine::MaxNewTokens::Unlimited => -1,
                    mlxcel_engine::MaxNewTokens::Limited(n) => n as i64,
                },
                temperature: config.default_temperature,
                seed: config.default_seed.map_or(-1, |s| s as i64),
            },
        },
        total_slots: config.parallel,
        model_path: info.dir.clone(),
        model_alias: state.model_name(info),
        n_ctx,
        n_ctx_train: info.window,
        chat_template: engine.chat_template_source().unwrap_or_default(),
        bos_token: special_token_text(engine, true),
        eos_token: special_token_text(engine, false),
        modalities: Modalities {
            vision: false,
            audio: false,
        },
        is_sleeping: false,
        build_info: concat!("mlxcel-", env!("CARGO_PKG_VERSION")),
        endpoint_slots: config.slots,
        endpoint_props: config.props,
        endpoint_metrics: config.metrics,
        backend: info.backend.as_str(),
        threads: config.threads,
        capacity_buckets: (!buckets.is_empty()).then_some(buckets),
    };
    Ok(json(StatusCode::OK, &props))
}

/// One entry of `/slots`: a request holding the slot, or an idle slot.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Slot {
    Busy {
        id: usize,
        id_task: u64,
        n_ctx: usize,
        speculative: bool,
        is_processing: bool,
        params: serde_json::Value,
        /// The prompt, as text.
        prompt: String,
        /// The text generated so far.
        generated: String,
        n_prompt_tokens: usize,
        /// Prompt tokens this request's prefill has computed so far.
        n_prompt_tokens_processed: usize,
        /// Prompt tokens the prefix cache held.
        n_prompt_tokens_cache: usize,
        next_token: NextToken,
        t_elapsed_ms: f64,
    },
    Idle {
        id: usize,
        /// -1: no task.
        id_task: i64,
        n_ctx: usize,
        speculative: bool,
        is_processing: bool,
    },
}

#[derive(Debug, Serialize)]
struct NextToken {
    has_next_token: bool,
    /// Whether the generated text has a newline yet.
    has_new_line: bool,
    /// Tokens left in the budget; -1: unlimited.
    n_remain: i64,
    n_decoded: usize,
}

/// Whether a query string (`a=1&b`) sets `name` to a non-empty value, as llama-server reads
/// its `/slots` flags.
fn query_flag(query: &str, name: &str) -> bool {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| key == name && !value.is_empty())
}

/// `GET /slots`: one entry per `--parallel` slot, by a stable id a request holds from
/// submission to its end (requests beyond `--parallel` wait in the engine's queue without one,
/// as llama-server's deferred tasks do); 501 with `--no-slots`, as llama-server answers.
/// `?fail_on_no_slot=1` answers 503 while no slot is idle.
pub fn slots(state: &AppState, query: &str) -> Result<Response<Body>, ApiError> {
    if !state.config().slots {
        return Err(ApiError::NotImplemented(
            "This server does not support slots endpoint. Start it with `--slots`".into(),
        ));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        if key != "fail_on_no_slot" {
            return Err(ApiError::invalid_param(
                key,
                format!(
                    "GET /slots?{key}: unknown query parameter (this server reads \
                     fail_on_no_slot; slots are saved and restored with POST /slots/{{id}}?action=)"
                ),
            ));
        }
    }
    let engine = state.engine()?;
    let n_ctx = state.context_limit(engine.info());
    let speculative = engine.default_speculative().is_some();
    let active = state.active_requests();
    let progress = engine.metrics().running_requests;
    let parallel = state.config().parallel;
    if query_flag(query, "fail_on_no_slot")
        && active.iter().filter(|r| r.slot.is_some()).count() >= parallel
    {
        return Err(ApiError::NoSlotAvailable);
    }
    let slots: Vec<Slot> = (0..parallel)
        .map(|id| match active.iter().find(|r| r.slot == Some(id)) {
            Some(request) => Slot::Busy {
                id,
                id_task: request.request_id,
                n_ctx,
                speculative,
                is_processing: true,
                params: request.params.clone(),
                prompt: engine
                    .tokenizer()
                    .decode(&request.prompt, false)
                    .unwrap_or_default(),
                generated: request.text.clone(),
                n_prompt_tokens: request.prompt_tokens,
                n_prompt_tokens_processed: progress
                    .iter()
                    .find(|p| p.id == request.request_id)
                    .map_or(0, |p| p.prompt_processed),
                n_prompt_tokens_cache: progress
                    .iter()
                    .find(|p| p.id == request.request_id)
                    .map_or(0, |p| p.prompt_cached),
                next_token: NextToken {
                    has_next_token: true,
                    has_new_line: request.text.contains('\n'),
                    n_remain: request
                        .budget
                        .map_or(-1, |b| b.saturating_sub(request.generated) as i64),
                    n_decoded: request.generated,
                },
                t_elapsed_ms: request.started.elapsed().as_secs_f64() * 1e3,
            },
            None => Slot::Idle {
                id,
                id_task: -1,
                n_ctx,
                speculative,
                is_processing: false,
            },
        })
        .collect();
    Ok(json(StatusCode::OK, &slots))
}

#[derive(Debug, Serialize)]
struct SetPropsResponse {
    success: bool,
}

/// `POST /props` (with `--props`): llama-server changes no property through it yet, and
/// neither does mlxcel; without the flag, 501 as llama-server answers.
pub fn set_props(state: &AppState) -> Result<Response<Body>, ApiError> {
    if !state.config().props {
        return Err(ApiError::NotImplemented(
            "This server does not support changing global properties. Start it with `--props`"
                .into(),
        ));
    }
    Ok(json(StatusCode::OK, &SetPropsResponse { success: true }))
}

/// `GET /metrics` (with `--metrics`).
pub fn metrics(state: &AppState) -> Result<Response<Body>, ApiError> {
    if !state.config().metrics {
        return Err(ApiError::NotImplemented(
            "the metrics endpoint is off; start the server with --metrics".into(),
        ));
    }
    let text = state.render_metrics();
    Ok(full(StatusCode::OK, "text/plain; version=0.0.4", text))
}
