//! `POST /completion` and `POST /infill`: llama-server's body, translated into the one request
//! and run by the one handler ([`crate::handler`]); answered as `/completion` (`answer.rs`).

use std::sync::Arc;

use hyper::Response;
use mlxcel_engine::{Engine, SamplingOverrides};
use serde::Deserialize;

use crate::body::Body;
use crate::error::ApiError;
use crate::fanout::{Join, generate_all, parts};
use crate::llama_fields::{LlamaFields, PARSER_FIELDS};
use crate::prompts::read_prompts;
use crate::protocols::openai::StopField;
use crate::read::RequestBody;
use crate::read::{
    GenerationBody, SamplingRanges, parse_generation_handling, read_generation_handling,
};
use crate::request::{Generation, Params, Prompt, PromptInput, budget};
use crate::state::AppState;
use crate::structured::{ConstraintFields, ResponseFormat};

use super::answer::{CompletionReply, Final};
use super::fim;

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
    /// `/completion`: the prompt or prompts (required; `crate::prompts`). `/infill`: text typed
    /// right before the cursor, after `input_prefix` (optional, a string).
    prompt: Option<serde_json::Value>,
    /// `/infill` only: the text before the cursor, and after it.
    input_prefix: Option<MixedText>,
    input_suffix: Option<MixedText>,
    /// `/infill` only: other files of the project, as context before the prefix.
    input_extra: Option<Vec<ExtraChunk>>,
    n_predict: Option<i64>,
    /// llama-server's aliases of `n_predict`, read when it is absent.
    max_completion_tokens: Option<i64>,
    max_tokens: Option<i64>,
    /// Completions of each prompt (llama-server's `n_cmpl`, alias `n`; `crate::fanout`).
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
            } = parse_generation_handling::<CompletionRequest>(
                bytes,
                &SamplingRanges::LLAMA_SERVER,
                PARSER_FIELDS,
            )?;
            let prompt = request.prompt.take();
            if endpoint == "infill" {
                if request.input_prefix.is_none() || request.input_suffix.is_none() {
                    return Err(ApiError::invalid_param(
                        "input_prefix",
                        "input_prefix and input_suffix are required",
                    ));
                }
                if prompt.as_ref().is_some_and(|p| !p.is_string()) {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        "prompt must be a string on /infill",
                    ));
                }
            } else if request.input_prefix.is_some()
                || request.input_suffix.is_some()
                || request.input_extra.is_some()
            {
                return Err(ApiError::invalid_param("prompt", "refused by /completion"));
            } else {
                let prompt = prompt.ok_or_else(|| ApiError::invalid_param("prompt", "missing"))?;
                read_prompts("prompt", &prompt)?;
            }
            request.completions()?;
            request.params(sampling, &llama).map(drop)
        }
        _ => super::tokens::check_body(endpoint, bytes),
    }
}

impl CompletionRequest {
    /// The completions asked of each prompt: `n_cmpl`, else its alias `n` (at least 1).
    fn completions(&self) -> Result<usize, ApiError> {
        match (self.n_cmpl, self.n) {
            (Some(0), _) => Err(ApiError::invalid_param(
                "n_cmpl",
                "n_cmpl=0: expected at least 1",
            )),
            (None, Some(0)) => Err(ApiError::invalid_param("n", "n=0: expected at least 1")),
            (Some(n), _) | (None, Some(n)) => Ok(n as usize),
            (None, None) => Ok(1),
        }
    }

    /// The sampling and stopping parameters, with `llama` (llama-server's task fields of the same
    /// body) applied.
    fn params(self, sampling: SamplingOverrides, llama: &LlamaFields) -> Result<Params, ApiError> {
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
    let mut body: GenerationBody<CompletionRequest> = read_generation_handling(
        body,
        state.config().body_limit,
        &SamplingRanges::LLAMA_SERVER,
        PARSER_FIELDS,
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
    let Some(prompt) = request.prompt.take() else {
        return Err(ApiError::invalid_param(
            "prompt",
            "prompt is required: text, token ids, or a list of prompts",
        ));
    };
    let prompts = read_prompts("prompt", &prompt)?
        .into_iter()
        .map(|input| {
            let text = match &input {
                PromptInput::Text(text) | PromptInput::Templated(text) => text.clone(),
                PromptInput::Tokens(_) | PromptInput::Mixed(_) => String::new(),
            };
            (input, text)
        })
        .collect();
    run(state, engine, body, prompts).await
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
    let mut body: GenerationBody<CompletionRequest> = read_generation_handling(
        body,
        state.config().body_limit,
        &SamplingRanges::LLAMA_SERVER,
        PARSER_FIELDS,
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
        Some(serde_json::Value::String(text)) => text,
        Some(_) => {
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
        vec![(PromptInput::Tokens(tokens), prompt_text)],
    )
    .await
}

/// `/completion`'s generations and answer, shared with `/infill`: each prompt with the text the
/// answer's `prompt` reports. Several prompts, or `n_cmpl` > 1, are answered as a list
/// ([`crate::fanout`]).
async fn run(
    state: &Arc<AppState>,
    engine: Arc<Engine>,
    body: GenerationBody<CompletionRequest>,
    prompts: Vec<(PromptInput, String)>,
) -> Result<Response<Body>, ApiError> {
    let GenerationBody {
        request,
        sampling,
        llama,
    } = body;
    let stream = request.stream;
    let n = request.completions()?;
    let n_probs = request.n_probs.is_some_and(|n| n > 0);
    let params = request.params(sampling, &llama)?;
    let (model, stop_words) = (state.model_name(engine.info()), params.stop.clone());
    let (return_tokens, post_sampling) = (llama.return_tokens(), params.post_sampling_probs);
    let response_fields = llama.response_fields();
    let (inputs, texts): (Vec<PromptInput>, Vec<String>) = prompts.into_iter().unzip();
    let generations = inputs
        .into_iter()
        .map(|input| Generation {
            prompt: Prompt::Input(input),
            params: params.clone(),
            stream,
        })
        .collect();
    let reply_engine = engine.clone();
    let reply = move |i: usize, _| CompletionReply {
        end: Final {
            model: model.clone(),
            prompt: texts.get(i / n).cloned().unwrap_or_default(),
            stop_words: stop_words.clone(),
            engine: reply_engine.clone(),
        },
        return_tokens,
        n_probs,
        post_sampling,
        response_fields: response_fields.clone(),
    };
    generate_all(state, &engine, parts(generations, n), Join::List, reply).await
}
