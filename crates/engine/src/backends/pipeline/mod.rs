//! Pipeline-parallel running over MLX's ring backend (docs/distributed.md): each rank holds a
//! contiguous range of the decoder layers; rank 0 runs the engine, whose MLX backend sends
//! each step down the pipe ([`pipe::Pipe`]), and every other rank runs a stage worker
//! ([`run_pipeline_stage`]).
//!
//! - `hosts.rs` reads and checks MLX's ring hostfile; `ring.rs` joins the ring with a deadline
//!   and fingerprints the model the ranks must share.
//! - `plan.rs` splits the layers over the ranks (by bytes, or as `--pipeline-layers` says).
//! - `wire.rs` is what the ranks say to each other; `link.rs` sends and receives it.
//! - `pipe.rs` is rank 0's end; `worker.rs` every other rank's loop.

mod hosts;
mod link;
pub(crate) mod pipe;
mod plan;
mod ring;
pub(crate) mod wire;
mod worker;

pub use link::PIPELINE_FAILURE;
pub use worker::run_pipeline_stage;

use crate::error::EngineError;
use crate::options::PipelineOptions;

/// Joins the pipeline's ring (checking the hostfile and the rank first, and failing with the
/// neighbours' addresses when they do not connect in time) and returns this process's rank:
/// rank 0 then runs the engine ([`crate::Engine::load`] with the same options), every other
/// rank [`run_pipeline_stage`].
pub fn join_pipeline(options: &PipelineOptions) -> Result<usize, EngineError> {
    ring::join_pipeline(options).map(|group| group.rank())
}
