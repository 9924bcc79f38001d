//! The mlxcel HTTP server: OpenAI's (chat completions, Responses), Anthropic's (Messages) and
//! llama-server's wire formats over the engine, so that existing clients work unchanged. It holds
//! wire formats only; scheduling stays in the engine.
//!
//! - [`ServerArgs`] is the one flag parser (llama-server's spellings and `LLAMA_ARG_*` twins)
//!   shared by `mlxcel serve` and `mlxcel-server`; it yields a [`ServerConfig`] and the engine's
//!   options. [`normalize_llama_args`] rewrites llama-server's multi-letter short options
//!   (`-ngl`, `-np`), which clap cannot declare; options without effect here are accepted with
//!   one warning line each ([`IgnoredOptions`]).
//! - [`Server`] binds a listener (port 0 in tests) and serves HTTP/1.1 until a shutdown future
//!   resolves; [`AppState`] is what handlers share: settings, the engine once loaded (`/health`
//!   is 503 before), metrics, and requests in flight.
//! - Each request gets one log line when it ends (with its tokens and timings for a
//!   generation), as text or, with `--log-format json`, JSON ([`log_subscriber`], [`LogFormat`]).
//! - Router mode (`--models-dir`, `--models-preset`: [`RouterArgs`]) serves many models from one
//!   server, each loaded model with its own engine and state, the request's `model` picking one;
//!   [`build_router`] reads the catalog and [`AppState::set_router`] makes a server route by it.
//! - A `prompt` is read in llama-server's forms (`prompts.rs`: text, token ids, both mixed, its
//!   JSON prompt object, a list of prompts); several prompts or `n` > 1 completions run as
//!   several generations joined into one answer (`fanout.rs`). `--chat-template` names a
//!   built-in template or gives a Jinja one (`chat_templates.rs`).
//! - Every failure of a request is an [`ApiError`], turned into a response in one place, in the
//!   route's [`ErrorShape`] (OpenAI's, or Anthropic's on its routes). [`run`] is the whole
//!   program both binaries call.
//!
//! ```no_run
//! use std::sync::Arc;
//! use mlxcel_engine::{Engine, EngineOptions};
//! use mlxcel_server::{Server, ServerConfig};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ServerConfig { addr: "127.0.0.1:0".parse()?, ..ServerConfig::default() };
//! let server = Server::bind(config).await?;
//! println!("listening on {}", server.local_addr());
//! server.state().set_engine(Arc::new(Engine::load(None, EngineOptions::default())?));
//! server.run(mlxcel_server::shutdown_signal()).await?;
//! # Ok(())
//! # }
//! ```

pub mod agent;
mod api_prefix;
mod args;
mod body;
mod chat;
mod chat_templates;
mod config;
pub mod constraint_args;
pub mod control_vector_args;
mod cors;
mod download;
mod error;
mod fanout;
mod fingerprint;
#[doc(hidden)]
pub mod fuzzing;
mod gcp;
mod generate;
mod handler;
mod inert;
mod lazy_grammar;
mod llama_fields;
mod llama_flags;
mod logging;
mod lora;
pub mod lora_args;
mod metrics;
pub mod model_args;
pub mod outbound;
mod progress;
mod prompt_log;
mod prompts;
mod protocols;
mod read;
mod reasoning;
mod reasoning_args;
mod request;
mod request_log;
mod router;
mod routes;
mod run;
pub mod sampling_args;
mod serve;
pub mod spec_args;
mod state;
mod static_files;
mod streams;
mod structured;
mod tls;
mod tools;
mod webui;

pub use args::{ServerArgs, accepted_spellings};
pub use config::{ApiKeys, ServerConfig};
pub use cors::CorsConfig;
pub use download::{DockerHub, DownloadArgs, DownloadError, Env as DownloadEnv, Resolved};
pub use error::{ApiError, ErrorShape, ServerError};
pub use gcp::GcpConfig;
pub use llama_flags::{IgnoredOptions, normalize_llama_args};
pub use logging::{
    LogFormat, init_logging, init_logging_as, init_logging_with, log_subscriber, open_log_file,
    tee_writer,
};
pub use metrics::Metrics;
pub use protocols::rerank::can_rerank;
pub use reasoning::{ReasoningDefaults, ReasoningFormat};
pub use router::args::RouterArgs;
pub use router::start::router as build_router;
pub use run::{init_server_logging, run, run_with};
pub use serve::{Server, shutdown_signal};
pub use state::{ActiveRequest, AppState};
pub use tls::TlsFiles;
/// The chat page's files under `/webui/` (name, content type, text), for tests that fetch each.
pub use webui::FILES as WEBUI_FILES;
