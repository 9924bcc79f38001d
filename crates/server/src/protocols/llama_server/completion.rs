//! `POST /completion` and `POST /infill`: llama-server's body, translated into the one request
//! and run by the one handler ([`crate::handler`]); answered as `/completion` (`answer.rs`).

use std::sync::Arc;

use hyper::Response;
use mlxcel_engine::{Engine, SamplingOverrides};
use serde::Deserialize;

use crate::body::Body;
use crate::error::ApiError;
use crate::handler::generate;
use crate::llama_fields::LlamaFields;
use crate::protocols::openai::StopField;
use crate::read::RequestBody;
use crate::read::{GenerationBody, SamplingRanges, parse_generation, read_generation};
use crate::request::{Generation, Params, Prompt, PromptInput, budget};
use crate::state::AppState;
use crate::structured::{ConstraintFields, ResponseFormat};

use super::answer::{CompletionReply, Final};
use super::fim;

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
    // The sampling fields (`temperature`, `top_k`, `top_p`, `seed` ...) are read beside these,
    // with llama-server's other task fields (read.rs's `GenerationBody`).
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
            let GenerationBody {
                mut request,
                sampling,
                llama,
            } = parse_generation::<CompletionRequest>(bytes, &SamplingRanges::LLAMA_SERVER)?;
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
            request.params(sampling, &llama).map(drop)
        }
        _ => super::tokens::check_body(endpoint, bytes),
    }
}

impl CompletionRequest {
    /// The sampling and stopping parameters, with `llama` (llama-server's task fields of the same
    /// body) applied.
    fn params(self, sampling: SamplingOverrides, llama: &LlamaFields) -> Result<Params, ApiError> {
        for (field, value) in [("n_cmpl", self.n_cmpl), ("n", self.n)] {
            if let Some(n) = value.filter(|&n| n != 1) {
                return Err(ApiError::unsupported(
                    field,
                    format!("{field}={n} is not supported: one completion per request"),
                ));
            }
        }
        let (budget_field, budget_value) = [
            ("n_predict", self.n_predict),
            ("max_completion_tokens", self.max_completion_tokens),
            ("max_tokens", self.max_tokens),
        ]
        .into_iter()
        .find(|(_, v)| v.is_some())
        .unwrap_or(("n_predict", None));
        let mut params = Params {
            max_new_tokens: budget(budget_field, budget_value)?,
            stop: self.stop.map(StopField::into_vec).unwrap_or_default(),
            logprobs: self.n_probs.filter(|&n| n > 0),
            constraint: ConstraintFields {
                response_format: self.response_format,
                json_schema: self.json_schema,
                grammar: self.grammar,
                guided_json: self.guided_json,
                guided_regex: self.guided_regex,
                guided_grammar: self.guided_grammar,
            }
            .constraint()?,
            sampling,
            ..Params::default()
        };
        llama.apply(&mut params)?;
        Ok(params)
    }
}

/// `POST /completion`.
pub async fn completion(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let mut body: GenerationBody<CompletionRequest> = read_generation(
        body,
        state.config().body_limit,
        &SamplingRanges::LLAMA_SERVER,
    )
    .await?;
    let request = &mut body.request;
    let engine = state.awake_engine().await?;
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
    run(state, engine, body, prompt, prompt_text).await
}

/// `POST /infill`: the prefix, suffix and extra files arranged around the model's
/// fill-in-the-middle tokens as llama-server does (`fim.rs`), then generated and answered
/// as `/completion`. A model without those tokens is answered 501, as llama-server answers.
pub async fn infill(state: &Arc<AppState>, body: RequestBody) -> Result<Response<Body>, ApiError> {
    let engine = state.awake_engine().await?;
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
    let mut body: GenerationBody<CompletionRequest> = read_generation(
        body,
        state.config().body_limit,
        &SamplingRanges::LLAMA_SERVER,
    )
    .await?;
    let request = &mut body.request;
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
    let limits = fim::InfillLimits {
        n_batch: fim::N_BATCH,
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
            let frame = fim::FimFrame {
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
                    Ok(fim::ExtraTokens {
                        filename_line: plain(&format!("{}\n", chunk.filename))?,
                        text: plain(&chunk.text)?,
                    })
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            let extra = fim::extra_context(
                &frame,
                &plain("myproject\n")?,
                &chunks,
                &plain(fim::SNIPPET_SEPARATOR)?,
                &plain("filename\n")?,
            );
            // The text before the cursor is tokenized with special tokens parsed, as llama-server.
            let typed = engine
                .tokenizer()
                .encode(&typed, false, true)
                .map_err(mlxcel_engine::EngineError::from)?;
            Ok(fim::assemble(
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
    run(
        state,
        engine,
        body,
        PromptInput::Tokens(tokens),
        prompt_text,
    )
    .await
}

/// `/completion`'s generation and answer, shared with `/infill`: `prompt_text` is what the
/// answer's `prompt` reports; `llama` the task fields every generating route reads.
async fn run(
    state: &Arc<AppState>,
    engine: Arc<Engine>,
    body: GenerationBody<CompletionRequest>,
    prompt: PromptInput,
    prompt_text: String,
) -> Result<Response<Body>, ApiError> {
    let GenerationBody {
        request,
        sampling,
        llama,
    } = body;
    let stream = request.stream;
    let n_probs = request.n_probs.is_some_and(|n| n > 0);
    let params = request.params(sampling, &llama)?;
    let reply = CompletionReply {
        end: Final {
            model: state.model_name(engine.info()),
            prompt: prompt_text,
            stop_words: params.stop.clone(),
            engine: engine.clone(),
        },
        return_tokens: llama.return_tokens(),
        n_probs,
        post_sampling: params.post_sampling_probs,
    };
    let generation = Generation {
        prompt: Prompt::Input(prompt),
        params,
        stream,
    };
    generate(state, &engine, generation, |_| reply).await
}
