//! Encoders: bidirectional models read straight from a GGUF file, for llama.cpp's rank pooling
//! (a BERT cross-encoder reranker, such as the ms-marco MiniLM ones) and embeddings. They are not
//! decoder families: no KV cache, no generation, no config.json; a backend runs them whole over
//! one input (`mlxcel_core::BertModel`).
//!
//! - `activation.rs`: the rounding llama.cpp's CPU matmuls give a layer's input.
//! - `bert.rs`: BERT (`general.architecture = "bert"`): hyperparameters, weights, head.
//! - `wpm.rs`: its WordPiece vocabulary and llama.cpp's WPM tokenizer.
//! - `wordpiece_json.rs`: the vocabulary as a `tokenizer.json`, for decoding.
//! - `fixture.rs`: a tiny random BERT reranker GGUF for tests and tools.

pub mod activation;
mod bert;
mod fixture;
#[cfg(test)]
mod tests;
mod wordpiece_json;
mod wpm;

pub use bert::{
    BertCheckpoint, BertConfig, BertLayer, BertWeights, Dense, ENCODER_ARCHITECTURES,
    EncoderPooling, is_encoder_gguf,
};
pub use fixture::{TINY_BERT_TOKENS, TinyBert, write_tiny_bert};
pub use wordpiece_json::wordpiece_json;
pub use wpm::{WpmOptions, WpmVocab, words};
