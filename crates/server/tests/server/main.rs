//! The HTTP server, driven in-process on port 0, one module per concern.
//!
//! Modules: `args` (the shared flag parser), `compat` (the accepted spellings the compatibility
//! gate reads), `routes` (every route, streaming and not), `anthropic` (Anthropic's Messages API),
//! `responses` (OpenAI's Responses API),
//! `errors` (each error class, and that the server keeps serving), `edges` (the bad-input table,
//! model names, per-request log lines), `auth`, `lifecycle` (loading,
//! client disconnect, graceful shutdown), `concurrency` (parallel streams equal sequential runs),
//! `infill` (llama-server's `/infill`), `webui` (the chat page at `/` and `--no-webui`), `slots`
//! (saving, restoring and erasing slots with `--slot-save-path`), `sampler_chain` (DRY, XTC,
//! mirostat ... and post-sampling probabilities, their flags), `parity_fields` (adaptive-p,
//! `n_indent`, the parser fields on raw-text routes, accepted tokens per draft position),
//! `streams` (resumable streams: `X-Conversation-Id`, `/v1/stream`, `/v1/streams/lookup`), `idle` (`--sleep-idle-seconds`,
//! `--cache-idle-slots` with `id_slot`, Vertex AI's prediction route), `rerank` (`--reranking`
//! and the rerank routes on a reranker made from the default model), `rerank_bert` (a tiny BERT
//! cross-encoder written in the test), `router` (many models
//! behind one server: `--models-dir`, `--models-preset`, `--models-max`), `speculation`
//! (llama.cpp's hashed n-gram speculative types from its flags).
//! Tests on the default model are skipped with `MLXCEL_SKIP_MODEL_TESTS=1`.

mod agent;
mod anthropic;
mod apply_template;
mod args;
mod auth;
mod compat;
mod concurrency;
mod control_vector;
mod cors;
mod downloads;
mod edges;
mod embeddings;
mod errors;
mod idle;
mod infill;
mod lifecycle;
mod llama_fields;
mod lora;
mod model_overrides;
mod parity_fields;
mod reasoning;
mod rerank;
mod rerank_bert;
mod responses;
mod router;
mod routes;
mod sampler_chain;
mod slots;
mod speculation;
mod streams;
mod suite_parity;
mod support;
mod tls;
mod webui;
