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
//! mirostat ... and post-sampling probabilities, their flags), `idle` (`--sleep-idle-seconds`,
//! `--cache-idle-slots` with `id_slot`, Vertex AI's prediction route), `rerank` (`--reranking`
//! and the rerank routes on a reranker made from the default model), `router` (many models
//! behind one server: `--models-dir`, `--models-preset`, `--models-max`).
//! Tests on the default model are skipped with `MLXCEL_SKIP_MODEL_TESTS=1`.

mod anthropic;
mod args;
mod auth;
mod compat;
mod concurrency;
mod cors;
mod edges;
mod embeddings;
mod errors;
mod idle;
mod infill;
mod lifecycle;
mod llama_fields;
mod reasoning;
mod rerank;
mod responses;
mod router;
mod routes;
mod sampler_chain;
mod slots;
mod suite_parity;
mod support;
mod tls;
mod webui;
