//! Integration tests of mlxcel-model, one module per concern. Fixtures are generated in the tests;
//! only `default_model` touches the real default model (skippable with `MLXCEL_SKIP_MODEL_TESTS`).

mod chat;
mod checkpoint;
mod config;
mod default_model;
mod experts;
mod fixtures;
mod gguf;
mod gguf_experts;
mod gguf_hybrids;
mod gguf_lfm2;
mod gpt_oss;
mod lfm2;
mod mxfp4;
mod properties;
mod rank;
mod spm;
mod tokenizer;
