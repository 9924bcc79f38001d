//! The llama-family program at one static context capacity.
//!
//! One module per capacity holds two functions over the same weights and KV caches:
//!
//! - `prefill`: one chunk of `chunk` tokens of one sequence (cache row `row`, starting at
//!   position `start`); returns the logits of the chunk's token `last` and the updated caches.
//! - `decode`: one token for every one of the `batch` cache rows, each at its own position;
//!   returns `batch` logits rows and the updated caches.
//!
//! Weights come first in the argument list (the ABI of `abi.rs`: `weight_specs` fixes the order), then the caches
//! (keys then values, one `[batch, kv_heads, capacity + chunk, head_dim]` tensor per layer), then
//! the step's indices. The caches are returned in the same order and replace the arguments (IREE
//! may write the argument buffers in place: they are donated). Positions and masks are computed
//! in the graph from the start positions; the host bounds-checks every index, because StableHLO's
//! scatter and dynamic slices clamp out-of-range indices silently.
//!
//! Each cache row has `chunk` scratch positions past the capacity: a prefill chunk's padding
//! tokens and the decode rows that no sequence occupies write there, so no write ever lands on a
//! position a live sequence reads.
//!
//! - `module.rs`: the module for one capacity ([`emit_llama`]) and the weight format checks
//!   ([`check_packed`], [`default_format`]).
//! - `step.rs`: one function of the module (prefill, or decode of the first rows): its
//!   arguments, the decoder layers (attention, MLP) and the logits; the decode functions a module
//!   holds ([`decode_batches`], [`decode_function`]).
//! - `linear.rs`: matrix products of the step's activations by weights, dense, blocked or packed
//!   (dequantized in the graph, or dispatched to mlxcel's kernels).
//! - `emitter.rs`: the emitter a function is built with, and its element-wise building blocks
//!   (RMSNorm, soft-cap, GELU, RoPE, softmax).

mod emitter;
mod linear;
mod module;
mod step;
#[cfg(test)]
pub(crate) mod tests;

pub use module::{check_packed, default_format, emit_llama};
pub use step::{decode_batches, decode_function};
