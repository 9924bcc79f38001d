//! Request bodies in: read within the size limit, parsed as JSON, with errors that name the field.
//!
//! A generating route's body is read into a [`GenerationBody`]: the route's own fields, the
//! sampling fields (the engine's one declaration, [`SamplingOverrides`]) checked against the
//! ranges of the route's protocol ([`SamplingRanges`]), and llama-server's task fields
//! ([`LlamaFields`]). The sampling fields are read from the same body on their own rather than
//! `#[serde(flatten)]`ed into the route's type, which would lose the field's name from type errors.

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use mlxcel_engine::SamplingOverrides;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::llama_fields::LlamaFields;

/// A request body as a handler receives it: from the connection, or already read (an instance
/// of a Vertex AI prediction request, [`crate::gcp`], dispatched to the route it names).
#[derive(Debug)]
pub enum RequestBody {
    Incoming(Incoming),
    Bytes(bytes::Bytes),
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        Self::Incoming(body)
    }
}

/// A generating route's body, read and checked.
#[derive(Debug)]
pub struct GenerationBody<T> {
    /// The route's own fields.
    pub request: T,
    /// The sampling fields, within the protocol's ranges.
    pub sampling: SamplingOverrides,
    /// llama-server's task fields, which every generating route reads.
    pub llama: LlamaFields,
}

/// The ranges a protocol's official API accepts for the sampling fields, beyond the engine's own
/// checks (`SamplingParams::validate`, which every route gets at submission). `None`: no bound
/// of the protocol's own.
#[derive(Debug, Clone, Copy)]
pub struct SamplingRanges {
    pub temperature: Option<(f32, f32)>,
    pub top_p: Option<(f32, f32)>,
    pub penalties: Option<(f32, f32)>,
}

impl SamplingRanges {
    /// OpenAI's (chat completions, completions, Responses): temperature 0–2, top_p 0–1,
    /// presence and frequency penalties −2–2.
    pub const OPENAI: Self = Self {
        temperature: Some((0.0, 2.0)),
        top_p: Some((0.0, 1.0)),
        penalties: Some((-2.0, 2.0)),
    };

    /// Anthropic's Messages: temperature 0–1, top_p 0–1 (`top_k` is a count, so at least 0).
    pub const ANTHROPIC: Self = Self {
        temperature: Some((0.0, 1.0)),
        top_p: Some((0.0, 1.0)),
        penalties: None,
    };

    /// llama-server's native routes: its looser rules (a negative temperature is greedy), so only
    /// the engine's checks apply.
    pub const LLAMA_SERVER: Self = Self {
        temperature: None,
        top_p: None,
        penalties: None,
    };

    /// Refuses the first sampling field outside these ranges, naming it.
    pub fn check(&self, sampling: &SamplingOverrides) -> Result<(), ApiError> {
        let fields = [
            ("temperature", sampling.temperature, self.temperature),
            ("top_p", sampling.top_p, self.top_p),
            (
                "presence_penalty",
                sampling.presence_penalty,
                self.penalties,
            ),
            (
                "frequency_penalty",
                sampling.frequency_penalty,
                self.penalties,
            ),
        ];
        for (name, value, range) in fields {
            if let (Some(value), Some((low, high))) = (value, range)
                && !(low..=high).contains(&value)
            {
                return Err(ApiError::invalid_param(
                    name,
                    format!("{name}={value}: expected a number from {low} to {high}"),
                ));
            }
        }
        Ok(())
    }
}

/// Reads a JSON request body of at most `limit` bytes into `T`; errors name the field.
pub async fn read_json<T: DeserializeOwned>(
    body: RequestBody,
    limit: usize,
) -> Result<T, ApiError> {
    parse_json(&read_bytes(body, limit).await?)
}

/// Reads a generating route's body ([`parse_generation`]) of at most `limit` bytes.
pub async fn read_generation<T: DeserializeOwned>(
    body: RequestBody,
    limit: usize,
    ranges: &SamplingRanges,
) -> Result<GenerationBody<T>, ApiError> {
    parse_generation(&read_bytes(body, limit).await?, ranges)
}

/// [`read_generation`] for a route that acts on the llama-server fields `handled` itself
/// (the chat route's reasoning fields), which the inert-field check then leaves to it.
pub async fn read_generation_handling<T: DeserializeOwned>(
    body: RequestBody,
    limit: usize,
    ranges: &SamplingRanges,
    handled: &[&str],
) -> Result<GenerationBody<T>, ApiError> {
    parse_generation_handling(&read_bytes(body, limit).await?, ranges, handled)
}

/// Parses a generating route's body: refuses llama-server fields this server does not act on
/// ([`crate::inert`]), then reads the route's fields, the sampling fields (checked against
/// `ranges`) and llama-server's task fields, each from the body whole.
pub fn parse_generation<T: DeserializeOwned>(
    bytes: &[u8],
    ranges: &SamplingRanges,
) -> Result<GenerationBody<T>, ApiError> {
    parse_generation_handling(bytes, ranges, &[])
}

/// [`parse_generation`] for a route that acts on the llama-server fields `handled` itself.
pub fn parse_generation_handling<T: DeserializeOwned>(
    bytes: &[u8],
    ranges: &SamplingRanges,
    handled: &[&str],
) -> Result<GenerationBody<T>, ApiError> {
    crate::inert::refuse_inert_fields(bytes, handled)?;
    let request = parse_json(bytes)?;
    let llama = parse_json(bytes)?;
    let sampling: SamplingOverrides = parse_json(bytes)?;
    sampling.check()?;
    ranges.check(&sampling)?;
    Ok(GenerationBody {
        request,
        sampling,
        llama,
    })
}

/// The body's bytes, within `limit`.
pub(crate) async fn read_bytes(body: RequestBody, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let body = match body {
        RequestBody::Incoming(body) => body,
        RequestBody::Bytes(bytes) if bytes.len() > limit => {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        RequestBody::Bytes(bytes) => return Ok(bytes),
    };
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::PayloadTooLarge { limit })
        }
        Err(err) => Err(ApiError::bad_request(format!(
            "cannot read the body: {err}"
        ))),
    }
}

/// Parses JSON into `T`, naming the path of a field of the wrong type.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON: {inner}"))
        } else if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid field `{path}`: {inner}"))
        }
    })
}
