//! Router mode: many models behind one server (llama-server's `--models-dir`,
//! `--models-preset`, `--models-max`, `--models-autoload`).
//!
//! - [`args`]: the flags. [`catalog`]: the models they name, each a [`spec::ModelSpec`]
//!   ([`ini`] reads a preset file).
//! - [`registry`]: which models are loaded, least-recently-used eviction of idle ones when
//!   `--models-max` is reached, the FIFO queue of models waiting for a place, status events.
//! - [`child`]: one loaded model, its own engine and server state (slots, metrics), in process.
//! - [`http`]: the router's routes (`/models`, `/models/load`, `/models/unload`,
//!   `/models/sse`, the router's `/props`, `/health` and `/metrics`) and the forwarding of every
//!   other route to the model the request's `model` field names.
//! - [`start`]: the router's program: read the catalog, bind, serve.

pub mod args;
pub mod catalog;
pub mod child;
pub mod http;
pub mod ini;
pub mod registry;
pub mod spec;
pub mod start;
