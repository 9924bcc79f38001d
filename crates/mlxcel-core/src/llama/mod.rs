//! The llama-family forward pass on MLX: Llama 2/3, SmolLM/SmolLM2, Mistral and Qwen2 (with
//! q/k/v biases; sliding windows where configured), Qwen3 (per-head q/k norms) and SmolLM3
//! (layers without RoPE), Gemma 2/3 (scaled embeddings, `1 + w` norms before and after attention
//! and MLP, GeGLU, soft-capping, local RoPE bases), and routed-expert MLPs (Qwen3-MoE; OLMoE's q/k
//! norms over whole projections). Each layer reads its features from the
//! config, never the family name.
//!
//! A step takes any mix of sequences, each with its own cache and its own new tokens (a prefill
//! chunk or one decode token). The linear layers run once over all the step's tokens flattened
//! together, so each weight is read once per step however many sequences there are; rotary
//! embedding and attention run per sequence, at that sequence's own positions. Only each
//! sequence's last position goes through the output projection.
//!
//! Activations stay in f32: MLX's CPU kernels are 15–70× slower in f16.
//!
//! - `load.rs` reads a checkpoint and packs its weights into the kernels' layout; one decoder
//!   layer is built from its weights in one function (`load::load_decoder_layer`), where a new
//!   kind of block would be chosen.
//! - `weights.rs` holds the packed weights' types: what loading builds and the forward pass reads;
//!   `linear.rs` the linear layers they are made of; `experts.rs` a routed-expert MLP (a mixture
//!   of experts), whose router and grouping of tokens by expert are in `routing.rs`.
//! - `delta_net.rs` is a hybrid model's linear-attention layer (gated DeltaNet: Qwen3-Next,
//!   Qwen3.5): its projections on MLX, its delta rule on the host against each sequence's
//!   recurrent state ([`crate::delta_rule`]).
//! - `short_conv.rs` is LFM2's short-convolution layer: `in_proj` on MLX, the gated causal
//!   convolution on the host against each sequence's tail of products.
//! - `varied_layer.rs` is a layer of a model whose layers vary in shape (Gemma 4's released
//!   models: a larger head on the full layers, layers that reuse an earlier layer's keys and
//!   values), with `per_layer_inputs.rs` its per-layer token inputs.
//! - `model.rs` is [`LlamaModel`]: the weights, the RoPE tables and what the model reports about
//!   itself.
//! - `stage.rs` is a pipeline stage's part of the model ([`Stage`]: a range of decoder layers,
//!   and which of the embedding, final norm and output projection it holds); `stage_step.rs` its
//!   step over hidden states another stage computed.
//! - `lora.rs` holds LoRA adapters' low-rank pairs and adds their deltas to a step's
//!   projections, each sequence at its own scales.
//! - `control.rs` holds control vectors (llama.cpp's `--control-vector`), added to decoder
//!   layers' outputs in both paths of `forward.rs`; `control_model.rs` sets them on the model
//!   and runs the fused node between them.
//! - `forward.rs` runs a step ([`ForwardSeq`] per sequence) through the fused decoder-layer node
//!   or a per-op graph.

mod control;
mod control_model;
mod delta_net;
mod experts;
mod forward;
mod linear;
mod load;
mod lora;
mod model;
mod per_layer_inputs;
mod routing;
mod short_conv;
mod stage;
mod stage_step;
mod varied_layer;
mod weights;
mod window;

pub use forward::ForwardSeq;
pub use model::LlamaModel;
pub use stage::Stage;
