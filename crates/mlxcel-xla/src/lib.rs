//! The OpenXLA backend of mlxcel: the llama family as StableHLO, compiled by `iree-compile` into
//! static-shape modules (one per context capacity), run by the IREE runtime.
//!
//! - [`hlo`] emits StableHLO text with shapes checked at every op.
//! - [`abi`] fixes every function's arguments (weights in a [`WeightFormat`], KV caches, step
//!   indices): the emitter declares them and the host uploads them from the same lists.
//! - [`program`] emits the llama-family `prefill` and `decode` functions at one
//!   [`ProgramShape`](abi::ProgramShape).
//! - [`kernels`] holds mlxcel's own packed-weight matrix products, which `iree-compile` links
//!   into modules of the `kernel` weight format.
//! - [`compiler`] runs `iree-compile` (provisioned by `scripts/provision-iree`, pinned in
//!   `iree.pin`) and caches modules on disk by content hash.
//! - [`runtime`] (feature `runtime`) owns the IREE runtime on a dedicated thread;
//!   [`XlaModel`] uploads a checkpoint's weights once and runs prefill and decode per capacity.
//!
//! ```
//! use mlxcel_xla::hlo::{ElementType, FunctionBuilder, Module, TensorType};
//!
//! let mut f = FunctionBuilder::new("double");
//! let x = f.arg(TensorType::new(&[4], ElementType::F32));
//! let y = f.add(&x, &x).unwrap();
//! let mut module = Module::new("example");
//! module.push(f.finish(&[&y]));
//! assert!(module.to_text().contains("stablehlo.add %arg0, %arg0 : tensor<4xf32>"));
//!
//! // Ill-shaped ops are refused when emitted.
//! let mut g = FunctionBuilder::new("bad");
//! let a = g.arg(TensorType::new(&[2, 3], ElementType::F32));
//! let b = g.arg(TensorType::new(&[2, 4], ElementType::F32));
//! assert!(g.matmul(&a, &b).is_err());
//! ```

pub mod abi;
pub mod compiler;
mod error;
pub mod hlo;
pub mod kernels;
#[cfg(feature = "runtime")]
mod model;
pub mod pin;
pub mod program;
#[cfg(feature = "runtime")]
pub mod runtime;
pub mod weights;

pub use abi::{LlamaDims, ProgramShape, WeightFormat};
pub use compiler::{CompiledModule, Compiler, IREE_COMPILE_ENV};
pub use error::{EmitError, Error, Result};
#[cfg(feature = "runtime")]
pub use model::{DecodeEntry, MAX_BATCH_ENV, WEIGHTS_ENV, XlaModel, XlaOptions};
