//! llama-server's generation fields that every generating route reads (llama-server hands the
//! body of its OpenAI, Responses and Anthropic routes to the same task schema as `/completion`):
//! `ignore_eos`, `t_max_predict_ms`, `n_indent`, `samplers`, `logit_bias`, `cache_prompt`, and the output
//! fields `n_probs` and `return_tokens`, which each route answers in its own shape. The sampling
//! fields (`temperature`, `top_p` ...) are read beside them ([`crate::read::GenerationBody`]).

use std::time::Duration;

use mlxcel_engine::SamplerStage;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::reasoning::BudgetFields;
use crate::request::{BiasTarget, Params};

/// The fields, as sent; `null` is absent.
#[derive(Debug, Default, Deserialize)]
pub struct LlamaFields {
    /// Generation continues past end-of-sequence tokens (their logits become -inf).
    pub ignore_eos: Option<bool>,
    /// After this many ms since the first token, stop at the next newline (`-1`/`0`: no limit).
    pub t_max_predict_ms: Option<i64>,
    /// Once the output has a newline, a line indented by fewer spaces or tabs ends it (`0`:
    /// no rule).
    pub n_indent: Option<i64>,
    /// The sampler chain's order and subset: names, or one character per sampler.
    pub samplers: Option<SamplersField>,
    /// `/completion`: the generated token ids in `tokens`.
    pub return_tokens: Option<bool>,
    /// `/completion` and `/infill`: the answer holds only these fields, each a path of keys
    /// separated by `/` (`generation_settings/n_predict`), keyed by its path.
    pub response_fields: Option<Vec<String>>,
    /// Log-probabilities of this many alternatives per token (on the OpenAI routes, read when
    /// their own `logprobs` does not ask).
    pub n_probs: Option<usize>,
    /// Added to the logits of tokens before sampling ([`read_logit_bias`]).
    pub logit_bias: Option<Value>,
    /// `false`: the prompt is computed whole, never from the prefix cache.
    pub cache_prompt: Option<bool>,
    /// The LoRA adapters' scales for this request (`[{"id", "scale"}]`; adapters left out are
    /// at 0); absent, the server's (`POST /lora-adapters`).
    pub lora: Option<Value>,
    /// `n_probs` reports the distribution the sampler drew from, after its chain, instead of
    /// the model's.
    pub post_sampling_probs: Option<bool>,
    /// Each streamed token carries the request's timings so far.
    pub timings_per_token: Option<bool>,
    /// A stream reports the prompt's processing before the first token.
    pub return_progress: Option<bool>,
    /// The `/slots` id the request must run in (`-1`: any).
    pub id_slot: Option<i64>,
    /// llama-server's chat-parser fields: on the routes that answer raw text (`/completion`,
    /// `/infill`, `/v1/completions`) llama-server reads them into a parser whose result those
    /// answers never show, so there they are checked and have no effect ([`PARSER_FIELDS`]);
    /// the chat route acts on them itself.
    pub reasoning_format: Option<String>,
    pub continue_final_message: Option<Value>,
    /// Lazy grammars' fields ([`crate::lazy_grammar`]).
    #[serde(flatten)]
    pub lazy: crate::lazy_grammar::LazyFields,
    /// The reasoning budget's fields ([`crate::reasoning::BudgetFields`]).
    #[serde(flatten)]
    pub budget: BudgetFields,
    /// The OpenAI routes' answer carries `__verbose` (the prompt after the template ...).
    pub verbose: Option<bool>,
    /// Seconds of silence after which a stream sends an SSE comment (-1: none).
    pub sse_ping_interval: Option<i64>,
    /// llama-server samples inside the backend's graph; this engine always samples on the host
    /// after the forward, with the same chain, so either value gives the same tokens and
    /// probabilities (accepted, no effect; docs/server.md).
    #[expect(
        dead_code,
        reason = "accepted for llama-server's clients; no effect here"
    )]
    pub backend_sampling: Option<bool>,
}

/// Reads `logit_bias` as llama-server does, on every generating route (OpenAI's object of
/// token-id strings is one of its forms): an object from a token id (as a string) or a text to
/// a bias, or a list of `[token id or text, bias]` pairs. A bias is a number, or `false` for
/// -infinity (the token is never sampled). A text key biases every token of its tokenization.
/// Where llama-server skips an entry it cannot read (an id outside the vocabulary, a bias that is
/// neither), this server refuses the request with a 400 naming `logit_bias`.
pub fn read_logit_bias(value: &Value) -> Result<Vec<(BiasTarget, f32)>, ApiError> {
    let bad = |message: String| ApiError::invalid_param("logit_bias", message);
    let bias = |key: &str, value: &Value| -> Result<f32, ApiError> {
        match value {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => {
                let b = n.as_f64().unwrap_or(f64::NAN) as f32;
                if b.is_finite() {
                    Ok(b)
                } else {
                    Err(bad(format!(
                        "logit_bias[{key}]: {n} is out of range; send a finite number, or false \
                         to forbid the token"
                    )))
                }
            }
            other => Err(bad(format!(
                "logit_bias[{key}]: expected a number, or false to forbid the token; got {other}"
            ))),
        }
    };
    let target = |key: &str| match key.trim().parse::<i64>() {
        Ok(id) if !key.trim().is_empty() => BiasTarget::Id(id),
        _ => BiasTarget::Text(key.to_owned()),
    };
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| Ok((target(key), bias(key, value)?)))
            .collect(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item.as_array().map(Vec::as_slice) {
                Some([Value::Number(id), value]) => {
                    let id = id.as_i64().ok_or_else(|| {
                        bad(format!("logit_bias[{i}]: token id {id} is not an integer"))
                    })?;
                    Ok((BiasTarget::Id(id), bias(&id.to_string(), value)?))
                }
                Some([Value::String(text), value]) => {
                    Ok((BiasTarget::Text(text.clone()), bias(text, value)?))
                }
                _ => Err(bad(format!(
                    "logit_bias[{i}]: expected a pair [token id or text, bias]; got {item}"
                ))),
            })
            .collect(),
        other => Err(bad(format!(
            "logit_bias: expected an object {{\"token id or text\": bias}} or a list of \
             [token, bias] pairs; got {other}"
        ))),
    }
}

/// The chat-parser fields the raw-text routes (`/completion`, `/infill`, `/v1/completions`)
/// accept at any valid value, as llama-server does: it parses their output for a chat message
/// that those routes' answers never show, so neither field changes what they answer.
pub const PARSER_FIELDS: &[&str] = &["reasoning_format", "continue_final_message"];

/// llama-server's `samplers`: a list of names, or a string of sampler characters.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SamplersField {
    Names(Vec<String>),
    Chars(String),
}

/// A sampler name or character: a stage of the engine's chain, or one it does not have.
enum Known {
    Stage(SamplerStage),
    /// `infill`: not implemented.
    Missing,
}

/// llama.cpp's canonical names (`common_sampler_types_from_names`), with their characters.
const SAMPLERS: &[(&str, char)] = &[
    ("dry", 'd'),
    ("top_k", 'k'),
    ("top_p", 'p'),
    ("top_n_sigma", 's'),
    ("typ_p", 'y'),
    ("min_p", 'm'),
    ("temperature", 't'),
    ("xtc", 'x'),
    ("infill", 'i'),
    ("penalties", 'e'),
    ("adaptive_p", 'a'),
];

fn known(canonical: &str) -> Known {
    SamplerStage::ALL
        .into_iter()
        .find(|stage| stage.name() == canonical)
        .map_or(Known::Missing, Known::Stage)
}

/// The canonical name of `name` as llama.cpp reads it: case-insensitive, each canonical name
/// also with `-` for `_` and without `_`, and `nucleus`, `temp`, `typ`.
fn canonical(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    match lower.as_str() {
        "nucleus" => return Some("top_p"),
        "temp" => return Some("temperature"),
        "typ" => return Some("typ_p"),
        _ => {}
    }
    SAMPLERS.iter().map(|(n, _)| *n).find(|n| {
        *n == lower
            || n.replace('_', "-") == lower
            || (n.contains('_') && n.replace('_', "") == lower)
    })
}

impl SamplersField {
    /// The engine's chain, or a 400 naming every sampler that is unknown or not implemented.
    pub fn stages(&self) -> Result<Vec<SamplerStage>, ApiError> {
        let items: Vec<(String, Option<&'static str>)> = match self {
            Self::Names(names) => names.iter().map(|n| (n.clone(), canonical(n))).collect(),
            Self::Chars(chars) => chars
                .chars()
                .map(|c| {
                    let name = SAMPLERS.iter().find(|(_, ch)| *ch == c).map(|(n, _)| *n);
                    (c.to_string(), name)
                })
                .collect(),
        };
        let mut stages = Vec::new();
        let mut unknown = Vec::new();
        let mut missing = Vec::new();
        for (given, name) in items {
            match name.map(known) {
                Some(Known::Stage(stage)) => stages.push(stage),
                Some(Known::Missing) => missing.push(format!("`{given}`")),
                None => unknown.push(format!("`{given}`")),
            }
        }
        if !unknown.is_empty() {
            let names: Vec<String> = SAMPLERS.iter().map(|(n, c)| format!("{n} ({c})")).collect();
            return Err(ApiError::invalid_param(
                "samplers",
                format!(
                    "samplers: unknown sampler {}; known: {}",
                    unknown.join(", "),
                    names.join(", ")
                ),
            ));
        }
        if !missing.is_empty() {
            return Err(ApiError::unsupported(
                "samplers",
                format!(
                    "samplers: {} not supported by this server (it has penalties, dry, \
                     top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature)",
                    missing.join(", ")
                ),
            ));
        }
        Ok(stages)
    }
}

impl LlamaFields {
    /// Sets the fields of `params` these fields steer (the sampler chain, biases, stopping, the
    /// prefix cache).
    pub fn apply(&self, params: &mut Params) -> Result<(), ApiError> {
        self.check_parser_fields()?;
        params.lazy_grammar = self.lazy.read()?;
        params.ignore_eos = self.ignore_eos;
        params.post_sampling_probs = self.post_sampling_probs.unwrap_or(false);
        params.cache_prompt = self.cache_prompt;
        params.lora = self
            .lora
            .as_ref()
            .map(|v| crate::lora::parse_lora_list(v, "lora"))
            .transpose()?;
        params.timings_per_token = self.timings_per_token.unwrap_or(false);
        params.return_progress = self.return_progress.unwrap_or(false);
        params.budget_fields = self.budget.clone();
        params.verbose = self.verbose.unwrap_or(false);
        params.sse_ping_interval = match self.sse_ping_interval {
            Some(seconds) if seconds < -1 => {
                return Err(ApiError::invalid_param(
                    "sse_ping_interval",
                    format!("sse_ping_interval={seconds}: expected -1 (no pings) or seconds"),
                ));
            }
            other => other,
        };
        if let Some(bias) = &self.logit_bias {
            params.logit_bias = read_logit_bias(bias)?;
        }
        if let Some(samplers) = &self.samplers {
            params.samplers = Some(samplers.stages()?);
        }
        params.id_slot = match self.id_slot {
            None | Some(-1) => None,
            Some(id) if id >= 0 => Some(id as usize),
            Some(id) => {
                return Err(ApiError::invalid_param(
                    "id_slot",
                    format!("id_slot={id}: expected -1 (any slot) or a slot id of /slots"),
                ));
            }
        };
        params.min_indent = match self.n_indent {
            None => 0,
            Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(ApiError::invalid_param(
                    "n_indent",
                    format!("n_indent={n}: expected 0 (no rule) or a count of spaces or tabs"),
                ));
            }
        };
        params.predict_time_limit = match self.t_max_predict_ms {
            None | Some(-1..=0) => None,
            Some(ms) if ms > 0 => Some(Duration::from_millis(ms as u64)),
            Some(ms) => {
                return Err(ApiError::invalid_param(
                    "t_max_predict_ms",
                    format!("t_max_predict_ms={ms}: expected -1 (no limit) or a count of ms"),
                ));
            }
        };
        Ok(())
    }

    /// `reasoning_format` must name a format llama-server knows (it refuses others too);
    /// `continue_final_message` must be a value its parser reads (`true`, `false`, `"content"`,
    /// `"reasoning_content"`; llama-server takes any other as `false`, here it is a 400).
    fn check_parser_fields(&self) -> Result<(), ApiError> {
        if let Some(name) = &self.reasoning_format {
            crate::reasoning::ReasoningFormat::parse("reasoning_format", name)?;
        }
        match &self.continue_final_message {
            None | Some(Value::Null | Value::Bool(_)) => Ok(()),
            Some(Value::String(s)) if s == "content" || s == "reasoning_content" => Ok(()),
            Some(other) => Err(ApiError::invalid_param(
                "continue_final_message",
                format!(
                    "continue_final_message: expected true, false, \"content\" or \
                     \"reasoning_content\"; got {other}"
                ),
            )),
        }
    }

    /// Whether `/completion` returns the token ids.
    pub fn return_tokens(&self) -> bool {
        self.return_tokens.unwrap_or(false)
    }

    /// `response_fields`, empty when absent (the whole answer).
    pub fn response_fields(&self) -> Vec<String> {
        self.response_fields.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn logit_bias_reads_every_llama_server_form() {
        let read = |v: Value| read_logit_bias(&v);
        assert_eq!(
            read(json!({"15": 2.5, " hi": false})).unwrap(),
            vec![
                (BiasTarget::Id(15), 2.5),
                (BiasTarget::Text(" hi".into()), f32::NEG_INFINITY),
            ]
        );
        assert_eq!(
            read(json!([[7, -1], ["x", false]])).unwrap(),
            vec![
                (BiasTarget::Id(7), -1.0),
                (BiasTarget::Text("x".into()), f32::NEG_INFINITY),
            ]
        );
        assert_eq!(read(json!({})).unwrap(), vec![]);
        assert_eq!(read(json!([])).unwrap(), vec![]);
        assert_eq!(read(Value::Null).unwrap(), vec![]);
        for bad in [
            json!({"1": true}),
            json!({"1": "2"}),
            json!([[1]]),
            json!([[1.5, 1]]),
            json!([1, 2]),
            json!(3),
            json!({"1": 1e300}),
        ] {
            let err = read(bad.clone()).unwrap_err();
            assert!(format!("{err:?}").contains("logit_bias"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn sampler_names_and_chars_read_as_llama_cpp_reads_them() {
        use SamplerStage::*;
        let names = SamplersField::Names(
            [
                "Top-K",
                "nucleus",
                "typ",
                "minp",
                "temp",
                "penalties",
                "dry",
                "xtc",
            ]
            .map(String::from)
            .to_vec(),
        );
        assert_eq!(
            names.stages().unwrap(),
            vec![TopK, TopP, TypicalP, MinP, Temperature, Penalties, Dry, Xtc]
        );
        let chars = SamplersField::Chars("edskypmxt".into());
        assert_eq!(
            chars.stages().unwrap(),
            SamplerStage::DEFAULT_ORDER.to_vec()
        );
        let names = SamplersField::Names(vec!["top-n-sigma".into(), "topnsigma".into()]);
        assert_eq!(names.stages().unwrap(), vec![TopNSigma, TopNSigma]);
        let err = SamplersField::Names(vec!["top_k".into(), "bogus".into(), "zz".into()])
            .stages()
            .unwrap_err();
        let text = format!("{err:?}");
        assert!(text.contains("`bogus`") && text.contains("`zz`"), "{text}");
        assert!(SamplersField::Chars("kq".into()).stages().is_err());
        assert!(
            SamplersField::Names(vec!["infill".into()])
                .stages()
                .is_err()
        );
    }
}
