//! The mlxcel engine: what sits between a user's request and a backend's forward pass.
//!
//! - [`Backend`] is the seam: a backend owns weights, KV memory and the forward pass, and returns
//!   logits for the last new position of each sequence in a step. [`Backend::create_session_for_request`]
//!   sizes a request ([`SessionPlan`]); only static-shape backends override its default.
//! - [`Sampler`] turns logits into a token under [`SamplingParams`] with the request's own seeded
//!   stream, so a request's output never depends on its batch-mates.
//! - [`StopMatcher`] finds stop strings across token boundaries without ever releasing part of one.
//! - [`Scheduler`] is the continuous batcher: each [`Scheduler::step`] decodes one token for every
//!   running sequence, spends the rest of a token budget on chunked prefill, and reports
//!   [`Event`]s per request; a [`TextDecoder`] turns tokens into complete UTF-8 text.
//!
//! [`Engine`] is the embedding API: it loads a checkpoint, runs the scheduler on its own thread,
//! and hands out a [`GenerationStream`] per request (an `Iterator` of [`Event`]s, or
//! `next_event().await` in async code); dropping a stream cancels its request. With
//! [`Engine::sleep_when_idle`] it unloads the model after an idle time and loads it again on the
//! next request that needs it.
//!
//! ```no_run
//! use mlxcel_engine::{ChatMessage, Engine, EngineOptions, GenerationRequest, MaxNewTokens};
//!
//! let engine = Engine::load(None, EngineOptions::default())?; // the default model, on MLX
//! let request = GenerationRequest::new(Vec::new(), MaxNewTokens::Limited(32));
//! let reply = engine
//!     .chat(&[ChatMessage::new("user", "Hi!")], request)?
//!     .collect_completion()?;
//! println!("{}", reply.text);
//! # Ok::<(), mlxcel_engine::EngineError>(())
//! ```
//!
//! The pieces below the engine work on their own:
//!
//! ```
//! use mlxcel_engine::{Sampler, SamplingParams, StopMatcher};
//!
//! let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
//! let mut logits = vec![0.1, 2.5, -1.0];
//! assert_eq!(sampler.sample(&mut logits, &[]), 1);
//!
//! let mut stops = StopMatcher::new(["</s>"]);
//! assert_eq!(stops.push("Paris.</").text, "Paris.");
//! assert!(stops.push("s> more").stopped);
//! ```

mod backend;
mod backends;
mod bench;
mod constraint;
mod constraint_trigger;
mod decode;
mod embedding;
mod encoder;
mod engine;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod gbnf;
mod hashed_chain;
mod lora;
mod metrics;
mod ngram_map;
mod ngram_mod;
mod options;
mod perplexity;
mod reasoning_budget;
mod request;
mod resident;
mod rng;
mod sampling;
mod scheduler;
mod spec_types;
mod speculative;
mod stop;
mod text;

pub use backend::{
    Backend, Bucket, KvBlockUsage, RequestShape, SequenceStep, SessionPlan, ShapePolicy, SlotId,
};
pub use backends::{PIPELINE_FAILURE, join_pipeline, load_backend, run_pipeline_stage};
pub use bench::{BackendBench, measure_read_bandwidth};
pub use constraint::{Constraint, with_json_options};
pub use constraint_trigger::ConstraintTrigger;
pub use decode::{DecodeStream, TextDecoder};
pub use embedding::{Normalize, Pooling, pool};
pub use engine::{Completion, Engine, GenerationStream, ModelInfo};
pub use error::{BackendSource, EngineError};
pub use gbnf::gbnf_to_lark;
pub use hashed_chain::{HashedDraft, Source as HashedSource, hashed_drafts};
pub use lora::LoraInfo;
pub use metrics::{EngineMetrics, FinishCounts, Histogram, ITL_BOUNDS, TTFT_BOUNDS};
pub use mlxcel_capacity::MaxNewTokens;
pub use mlxcel_model::{ChatMessage, FimTokens};
pub use ngram_map::{NgramMap, NgramMapConfig};
pub use ngram_mod::{NgramModConfig, NgramModState, NgramModTable};
pub use options::{
    Activations, BackendKind, EngineOptions, KvType, PipelineOptions, SMALL_MODEL_PARAMETERS,
    ShapeMode,
};
pub use perplexity::{PerplexityOptions, PerplexityReport, perplexity};
pub use reasoning_budget::{ReasoningBudget, ReasoningEnd};
pub use request::{
    Event, FinishReason, GenerationRequest, RequestId, RequestStatus, TokenLogprob, Usage,
};
pub use sampling::{
    DryBreakers, Sampler, SamplerStage, SamplingOverrides, SamplingParams, argmax, resolve_breakers,
};
pub use scheduler::{
    BucketOccupancy, CachedPrefix, PrefixCacheStats, RequestProgress, Scheduler, SchedulerConfig,
    SchedulerStats,
};
pub use speculative::{Proposer, Replay, SpeculativeConfig};
pub use stop::{StopMatcher, StopScan};
