//! The backends the engine can run, one module each, each behind the cargo feature of its name.
//!
//! [`load`] is the only place that names a concrete backend: the engine and the benchmark harness
//! ask it for a `Box<dyn Backend>` and never see what is inside. A backend compiled out answers
//! with [`EngineError::BackendNotCompiled`], which names the feature to enable, so a program that
//! embeds the engine compiles the same whichever backends it builds.

#[cfg(feature = "mlx")]
mod encoder;
#[cfg(feature = "mlx")]
mod mlx;
#[cfg(feature = "mlx")]
mod pipeline;
#[cfg(feature = "mlx")]
mod stage_model;
#[cfg(feature = "xla")]
mod xla;

#[cfg(feature = "mlx")]
pub use pipeline::{PIPELINE_FAILURE, join_pipeline, run_pipeline_stage};

use mlxcel_model::Checkpoint;

use crate::backend::Backend;
use crate::error::EngineError;
use crate::options::{Activations, BackendKind, EngineOptions};

/// Hands the memory the backends' allocators keep freed for reuse back to the system: MLX's
/// buffer cache and the C heap's free pages (`mlxcel_core::release_unused_memory`). [`load`]
/// makes glibc keep freed pages so that each step does not fault them in again; kept without
/// end, they add up across requests (the soak saw 22 MiB more resident in its second minute with
/// the heap's live bytes flat: docs/reliability.md), so the engine calls this when it goes idle
/// and every 30 s while it stays busy.
pub(crate) fn release_unused_memory() {
    #[cfg(feature = "mlx")]
    mlxcel_core::release_unused_memory();
}

/// How long a worker (the engine's, or a pipeline stage's) steps before it hands freed memory
/// back to the system ([`release_unused_memory`]) while it stays busy; it also does when it goes
/// idle. One release costs a step's worth of page faults afterwards, a few milliseconds.
pub(crate) const RELEASE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Builds the backend `options.backend` names over `checkpoint`, as the engine does: for tools
/// and tests that drive a backend's [`Backend::step`] directly (logits, below the scheduler and
/// the sampler). Programs that generate text want [`crate::Engine`].
pub fn load_backend(
    checkpoint: &Checkpoint,
    options: &EngineOptions,
) -> Result<Box<dyn Backend>, EngineError> {
    load(checkpoint, options)
}

/// Builds the backend `options.backend` names over `checkpoint`. Either backend's steps
/// allocate and free their logits (and MLX's buffers) every step: the C heap keeps freed memory
/// for reuse from here on (`mlxcel_core::keep_freed_heap_memory`, unless the environment sets
/// glibc's malloc thresholds).
pub(crate) fn load(
    checkpoint: &Checkpoint,
    options: &EngineOptions,
) -> Result<Box<dyn Backend>, EngineError> {
    #[cfg(feature = "mlx")]
    mlxcel_core::keep_freed_heap_memory();
    // A small model under the applications' default runs the small-model activations (the
    // backend's description, which the applications print, names the ones it runs).
    let activations = options.activations_for(checkpoint.config().parameter_count());
    if options.pipeline.is_some() && options.backend != BackendKind::Mlx {
        return Err(EngineError::Unsupported {
            what: "a pipeline of ranks (--pipeline, --pipeline-hosts)".into(),
            backend: options.backend.as_str(),
            reason: "stages pass hidden states over MLX's distributed layer; use the mlx backend",
        });
    }
    if !options.lora_adapters.is_empty() && options.backend != BackendKind::Mlx {
        return Err(EngineError::Unsupported {
            what: "LoRA adapters (--lora, --lora-scaled)".into(),
            backend: options.backend.as_str(),
            reason: "its compiled programs hold no low-rank deltas; use the mlx backend",
        });
    }
    if !options.control_vector.is_empty() && options.backend != BackendKind::Mlx {
        return Err(EngineError::Unsupported {
            what: "control vectors (--control-vector, --control-vector-scaled, \
                   --control-vector-layer-range)"
                .into(),
            backend: options.backend.as_str(),
            reason: "its compiled programs add nothing between decoder layers; use the mlx backend",
        });
    }
    match options.backend {
        BackendKind::Mlx => load_mlx(checkpoint, options, activations),
        BackendKind::Xla => load_xla(checkpoint, options, activations),
    }
}

/// Builds the backend of an encoder (a BERT GGUF, [`mlxcel_model::encoder::BertCheckpoint`]):
/// only the MLX backend runs one.
pub(crate) fn load_encoder(
    checkpoint: &mlxcel_model::encoder::BertCheckpoint,
    options: &EngineOptions,
) -> Result<Box<dyn Backend>, EngineError> {
    match options.backend {
        BackendKind::Mlx => load_mlx_encoder(checkpoint),
        BackendKind::Xla => Err(EngineError::Unsupported {
            what: "an encoder model (BERT)".into(),
            backend: BackendKind::Xla.as_str(),
            reason: "its programs are emitted for decoder families only; use the mlx backend",
        }),
    }
}

#[cfg(feature = "mlx")]
fn load_mlx_encoder(
    checkpoint: &mlxcel_model::encoder::BertCheckpoint,
) -> Result<Box<dyn Backend>, EngineError> {
    mlxcel_core::keep_freed_heap_memory();
    Ok(Box::new(encoder::EncoderBackend::load(checkpoint)?))
}

#[cfg(not(feature = "mlx"))]
fn load_mlx_encoder(
    _: &mlxcel_model::encoder::BertCheckpoint,
) -> Result<Box<dyn Backend>, EngineError> {
    Err(EngineError::BackendNotCompiled {
        backend: BackendKind::Mlx.as_str(),
        feature: "mlx",
    })
}

#[cfg(feature = "mlx")]
fn load_mlx(
    checkpoint: &Checkpoint,
    options: &EngineOptions,
    activations: Option<Activations>,
) -> Result<Box<dyn Backend>, EngineError> {
    // The activations the options choose for this model are the loader's to apply.
    let _ = activations;
    let backend = mlx::MlxBackend::load(checkpoint, options)?;
    Ok(Box::new(backend))
}

#[cfg(not(feature = "mlx"))]
fn load_mlx(
    _: &Checkpoint,
    _: &EngineOptions,
    _: Option<Activations>,
) -> Result<Box<dyn Backend>, EngineError> {
    Err(EngineError::BackendNotCompiled {
        backend: BackendKind::Mlx.as_str(),
        feature: "mlx",
    })
}

/// What every pipeline failure's message contains (there are none without the MLX backend).
#[cfg(not(feature = "mlx"))]
pub const PIPELINE_FAILURE: &str = "pipeline: ";

/// [`join_pipeline`] where the MLX backend is compiled out.
#[cfg(not(feature = "mlx"))]
pub fn join_pipeline(_: &crate::options::PipelineOptions) -> Result<usize, EngineError> {
    Err(EngineError::BackendNotCompiled {
        backend: BackendKind::Mlx.as_str(),
        feature: "mlx",
    })
}

/// [`run_pipeline_stage`] where the MLX backend is compiled out.
#[cfg(not(feature = "mlx"))]
pub fn run_pipeline_stage(_: Option<&str>, _: &EngineOptions) -> Result<(), EngineError> {
    Err(EngineError::BackendNotCompiled {
        backend: BackendKind::Mlx.as_str(),
        feature: "mlx",
    })
}

#[cfg(feature = "xla")]
fn load_xla(
    checkpoint: &Checkpoint,
    options: &EngineOptions,
    activations: Option<Activations>,
) -> Result<Box<dyn Backend>, EngineError> {
    use crate::options::KvType;
    if options.kv_types != (KvType::F32, KvType::F32) {
        return Err(EngineError::Unsupported {
            what: format!(
                "KV cache types {}/{} (keys/values; --cache-type-k/--cache-type-v)",
                options.kv_types.0.as_str(),
                options.kv_types.1.as_str()
            ),
            backend: BackendKind::Xla.as_str(),
            reason: "its compiled programs hold f32 keys and values; use f32, or the mlx backend",
        });
    }
    Ok(Box::new(xla::XlaBackend::load(
        checkpoint,
        options.shapes,
        activations,
    )?))
}

#[cfg(not(feature = "xla"))]
fn load_xla(
    _: &Checkpoint,
    _: &EngineOptions,
    _: Option<Activations>,
) -> Result<Box<dyn Backend>, EngineError> {
    Err(EngineError::BackendNotCompiled {
        backend: BackendKind::Xla.as_str(),
        feature: "xla",
    })
}
