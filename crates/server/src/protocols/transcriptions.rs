//! `POST /v1/audio/transcriptions` and `POST /audio/transcriptions`: OpenAI's speech-to-text
//! routes as llama-server answers them.
//!
//! llama-server turns a transcription upload into a chat request with the audio attached, which
//! only a model with an audio-input projector (`-mm`) can answer; for every other model it replies
//! 501 `not_supported_error`, "The current model does not support audio input.", before reading
//! the upload. Every model mlxcel-server loads is a text model (audio input belongs to the
//! multimodal work, deferred with `-mm`), so the routes give that reply, whatever the body, and
//! never read or buffer the upload (docs/server.md#speech-to-text).

use hyper::Response;

use crate::body::Body;
use crate::error::ApiError;

/// llama-server's message for a model without audio input, and what to use instead.
pub const NO_AUDIO_INPUT: &str = "The current model does not support audio input. \
    mlxcel-server serves text models: transcribe with a speech-to-text engine (such as \
    whisper.cpp) and send the text";

/// The route's answer: llama-server's 501 for a model without audio input.
pub async fn transcriptions() -> Result<Response<Body>, ApiError> {
    Err(ApiError::NotImplemented(NO_AUDIO_INPUT.into()))
}
