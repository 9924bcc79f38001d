//! The wire formats, one folder (or file) per protocol. Each only parses its JSON into the one
//! request ([`crate::request::Generation`]) and formats the engine's events back (its
//! [`crate::handler::Reply`] and [`crate::generate::StreamFormat`]); the one handler
//! ([`crate::handler`]) runs everything between.
//!
//! - `openai/`: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.
//! - `responses/`: OpenAI's Responses API.
//! - `anthropic/`: Anthropic's Messages API.
//! - `llama_server/`: llama-server's native routes (completion, infill, tokens, status, slots).
//! - `embeddings.rs`: `/v1/embeddings` and llama-server's `/embedding(s)`.
//! - `rerank.rs`: llama-server's `/rerank` and its other spellings (`--reranking`).
//! - `transcriptions.rs`: the speech-to-text routes, answered as llama-server does for a text model.

pub mod anthropic;
pub mod embeddings;
pub mod llama_server;
pub mod openai;
pub mod rerank;
pub mod responses;
pub mod transcriptions;
