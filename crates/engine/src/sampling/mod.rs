//! Host-side sampling: llama.cpp's sampler chain over a step's logits, then a seeded draw.
//!
//! The chain and its default order follow llama.cpp's (`common_params_sampling::samplers`) so
//! that the same settings mean the same thing in both tools: logit bias → penalties → DRY →
//! top-n-sigma → top-k → typical-p → top-p → min-p → XTC → temperature (dynamic when
//! `dynatemp_range` > 0) → draw. The filters see the untempered distribution unless a temperature
//! stage comes before them; a temperature of zero or below keeps the most likely survivor.
//! [`SamplingParams::samplers`] reorders the chain or leaves stages out, as llama-server's
//! `samplers` field does (logit bias always comes first and the draw last; adaptive-p, named
//! anywhere in the chain, reshapes the survivors just before the draw, as llama.cpp puts it last). Mirostat, when on,
//! replaces the chain after the bias with temperature then mirostat, as in llama.cpp.
//!
//! - `params.rs`: [`SamplingParams`] (every setting, llama.cpp's defaults, the range checks),
//!   [`SamplerStage`], [`SamplingOverrides`] (the one declaration of the request fields).
//! - `sampler.rs`: [`Sampler`], one request's chain, draw, speculative acceptance and
//!   post-sampling probabilities.
//! - `filters.rs`: the filters over a candidate list, top-k over the vocabulary, [`argmax`].
//! - `dry.rs`: DRY's penalties and its sequence breakers as tokens ([`resolve_breakers`]).
//! - `mirostat.rs`: mirostat v1 and v2.
//! - `adaptive.rs`: adaptive-p, which (when the chain names it) reshapes the survivors toward a
//!   target probability and takes the draw's place, with its average across tokens.
//! - `vocabulary.rs`: the breakers resolved against the model's vocabulary, cached.
//!
//! Cost: every stage in the default order after top-k works on at most `top_k` candidates; the
//! stages before it are one pass over the vocabulary each when on (penalties and DRY touch only
//! the tokens of the history, top-n-sigma reads every logit twice).

mod adaptive;
mod dry;
mod filters;
mod mirostat;
mod params;
mod sampler;
mod vocabulary;

pub use dry::{DryBreakers, resolve_breakers};
pub use filters::argmax;
pub use params::{SamplerStage, SamplingOverrides, SamplingParams};
pub use sampler::Sampler;
pub(crate) use vocabulary::BreakerVocabulary;

#[cfg(test)]
mod adaptive_tests;
#[cfg(test)]
mod tests;
