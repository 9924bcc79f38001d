//! mlxcel-core: the MLX backend's foundation — a safe Rust [`Array`] over MLX's C++ API.
//!
//! MLX (pinned in `mlx.pin`, provisioned from the `mlx-cpu` wheel by this crate's `provision-mlx` script,
//! or taken from `MLX_DIR`) is reached through a `cxx` bridge to concrete shims in `cpp/`. No
//! MLX type crosses this crate's public API: callers see [`Array`], [`Dtype`] and [`Error`].
//!
//! - [`Array`] is a lazily evaluated, refcounted MLX array with the general ops (shape, layout,
//!   arithmetic, gather, slicing) and read-back. [`eval`] evaluates several arrays at once.
//! - [`fast`] holds the fused transformer ops (RMS norm, RoPE, attention).
//! - [`QuantizedWeight`] is an affine-quantized matrix and its matmul, either MLX's or mlxcel's
//!   own multi-threaded CPU kernel ([`kernels`], chosen by [`Kernels`]).
//! - [`LlamaModel`] is the llama-family forward pass over a validated `mlxcel_model::Checkpoint`;
//!   each sequence keeps its keys and values in its own [`KvCache`], and one
//!   [`LlamaModel::forward`] runs any mix of prefill chunks and decode tokens.
//! - [`delta_rule`] holds the host kernels of hybrid models' linear attention (the gated delta
//!   rule, recurrent and chunked, and its causal convolution); a hybrid model's cache carries
//!   each sequence's [`RecurrentState`] beside its keys and values.
//! - [`Stage`] is one pipeline stage's part of a model (a range of its decoder layers), loaded by
//!   [`LlamaModel::load_stage`] and run over another stage's hidden states by
//!   [`LlamaModel::forward_stage`]; [`distributed::Group`] moves arrays between the stages over
//!   MLX's ring backend.
//! - Every MLX exception becomes [`Error::Mlx`] carrying MLX's message.
//!
//! On CPU keep activations in f32: MLX's CPU kernels are 15–70× slower in f16.
//!
//! Binaries of crates that depend on this one need an rpath to `libmlx.so`; see the
//! `build.rs` snippet in `docs/mlx.md`.
//!
//! ```
//! use mlxcel_core::Array;
//!
//! let a = Array::from_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = Array::from_f32(&[10.0, 20.0], &[2])?;
//! assert_eq!(a.add(&b)?.to_vec_f32()?, [11.0, 22.0, 13.0, 24.0]);
//! assert!(a.matmul(&Array::from_f32(&[1.0; 3], &[3, 1])?).is_err());
//! # Ok::<(), mlxcel_core::Error>(())
//! ```

mod array;
mod bert;
pub mod delta_rule;
mod device;
pub mod distributed;
mod dtype;
mod error;
pub mod fast;
mod int8_blocks;
pub mod kernels;
mod kv_cache;
mod layer;
mod layout_cache;
mod llama;
mod moe;
pub mod pin;
mod quantized;
mod recurrent_state;
mod sys;

pub use array::{Array, eval};
pub use bert::BertModel;
pub use device::{
    HEAP_MMAP_THRESHOLD, HEAP_TRIM_THRESHOLD, HeapSettings, MlxBuildInfo, keep_freed_heap_memory,
    mlx_build_info, mlx_memory, mlx_version, release_unused_memory, set_default_device_cpu,
    set_memory_limit,
};
pub use dtype::Dtype;
pub use error::{Error, Result};
pub use kernels::{
    Activations, F32Layout, Int8Layout, Isa, KernelBackend, Kernels, Matrix, f16_cache_bits,
};
pub use kv_cache::{KV_BLOCK, KV_CHUNK, KvCache, KvType, dequantize_q8_0, quantize_q8_0};
pub use llama::{ForwardSeq, LlamaModel, Stage};
pub use quantized::{Epilogue, QuantizedWeight};
pub use recurrent_state::RecurrentState;
pub use sys::wait_for_layout_moves;
