//! Request bodies in: read within the size limit, parsed as JSON, with errors that name the field.

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::llama_fields::LlamaFields;

/// Reads a JSON request body of at most `limit` bytes into `T`; errors name the field.
pub async fn read_json<T: DeserializeOwned>(body: Incoming, limit: usize) -> Result<T, ApiError> {
    parse_json(&read_bytes(body, limit).await?)
}

/// Reads a generation request: as [`read_json`], after refusing llama-server fields this server
/// does not act on ([`crate::inert`]), with the llama-server fields every generating route reads
/// ([`LlamaFields`], with the sampling fields).
pub async fn read_generation_json<T: DeserializeOwned>(
    body: Incoming,
    limit: usize,
) -> Result<(T, LlamaFields), ApiError> {
    let bytes = read_bytes(body, limit).await?;
    crate::inert::refuse_inert_fields(&bytes)?;
    let request = parse_json(&bytes)?;
    Ok((request, read_llama_fields(&bytes)?))
}

/// The llama-server fields and the sampling fields of a generation request's body, each parsed
/// from it whole (not `#[serde(flatten)]`ed into the route's own type, which would lose the
/// field's name from type errors).
pub fn read_llama_fields(bytes: &[u8]) -> Result<LlamaFields, ApiError> {
    let mut llama: LlamaFields = parse_json(bytes)?;
    llama.sampling = parse_json(bytes)?;
    Ok(llama)
}

/// The body's bytes, within `limit`.
pub(crate) async fn read_bytes(body: Incoming, limit: usize) -> Result<bytes::Bytes, ApiError> {
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
