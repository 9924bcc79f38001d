//! The adapter's types: the projections it targets, its pairs, and the checks of a pair against
//! the model (shared by the GGUF and PEFT readers).

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::config::blocks::FeedForward;
use crate::error::{ModelError, Result};

/// The projection of a decoder layer an adapter tensor pair changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// Every target, in the order a layer runs them.
    pub const ALL: [LoraTarget; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// The Hugging Face module name under `model.layers.{i}.`.
    pub fn hf_module(self) -> &'static str {
        match self {
            Self::Q => "self_attn.q_proj",
            Self::K => "self_attn.k_proj",
            Self::V => "self_attn.v_proj",
            Self::O => "self_attn.o_proj",
            Self::Gate => "mlp.gate_proj",
            Self::Up => "mlp.up_proj",
            Self::Down => "mlp.down_proj",
        }
    }

    /// The target of Hugging Face module `module` (the part after `model.layers.{i}.`).
    pub fn from_hf_module(module: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.hf_module() == module)
    }

    /// `(out, in)` of this projection in layer `layer` of `config`; `None` where the layer has
    /// no such dense projection (a routed-expert MLP).
    pub fn shape(self, config: &ModelConfig, layer: usize) -> Option<(usize, usize)> {
        let hidden = config.hidden_size;
        let q = config.num_attention_heads * config.head_dim;
        let kv = config.num_key_value_heads * config.head_dim;
        let intermediate = match config.layer_spec(layer).ffn {
            FeedForward::Dense {
                intermediate_size, ..
            } => Some(intermediate_size),
            FeedForward::RoutedExperts(_) => None,
        };
        Some(match self {
            Self::Q => (q, hidden),
            Self::K | Self::V => (kv, hidden),
            Self::O => (hidden, q),
            Self::Gate | Self::Up => (intermediate?, hidden),
            Self::Down => (hidden, intermediate?),
        })
    }
}

/// One projection's low-rank pair.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraWeight {
    pub layer: usize,
    pub target: LoraTarget,
    pub rank: usize,
    /// `[rank, in]`, row-major.
    pub a: Vec<f32>,
    /// `[out, rank]`, row-major, in Hugging Face row order.
    pub b: Vec<f32>,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// A LoRA adapter checked against the model it will be applied to.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapter {
    /// The path it was loaded from, as given.
    pub path: PathBuf,
    /// `adapter.lora.alpha` (GGUF) or `lora_alpha` (PEFT); 0 means the scale is used as is.
    pub alpha: f32,
    /// GGUF `adapter.lora.task_name` (empty when absent), reported by `GET /lora-adapters`.
    pub task_name: String,
    /// GGUF `adapter.lora.prompt_prefix` (empty when absent).
    pub prompt_prefix: String,
    /// Sorted by layer, then target; one pair per (layer, target).
    pub weights: Vec<LoraWeight>,
}

impl LoraAdapter {
    /// The factor `B (A x)` is multiplied by for a user scale `scale` (llama.cpp's
    /// `get_scale`: `scale · alpha / rank`, or `scale` when alpha is 0).
    pub fn weight_scale(&self, weight: &LoraWeight, scale: f32) -> f32 {
        if self.alpha == 0.0 {
            scale
        } else {
            scale * self.alpha / weight.rank as f32
        }
    }
}

/// An adapter refused, with why.
pub(crate) fn refusal(path: &Path, reason: String) -> ModelError {
    ModelError::Adapter {
        path: path.to_path_buf(),
        reason,
    }
}

/// Checks one pair's shapes against the model and builds it. `name` is the tensor named in the
/// refusal; `a_shape` `[rank, in]`, `b_shape` `[out, rank]`.
pub(crate) fn checked_weight(
    path: &Path,
    config: &ModelConfig,
    name: &str,
    (layer, target): (usize, LoraTarget),
    (a_shape, a): (&[usize], Vec<f32>),
    (b_shape, b): (&[usize], Vec<f32>),
) -> Result<LoraWeight> {
    if layer >= config.num_hidden_layers {
        return Err(refusal(
            path,
            format!(
                "tensor `{name}` is for layer {layer}, but the model has {} layers (an adapter \
                 for another base model?)",
                config.num_hidden_layers
            ),
        ));
    }
    let Some((out_dim, in_dim)) = target.shape(config, layer) else {
        return Err(refusal(
            path,
            format!(
                "tensor `{name}`: layer {layer} has no dense {} (its MLP is routed experts)",
                target.hf_module()
            ),
        ));
    };
    let [rank, a_in] = *a_shape else {
        return Err(refusal(path, format!("tensor `{name}`: lora_a is not 2-D")));
    };
    let [b_out, b_rank] = *b_shape else {
        return Err(refusal(path, format!("tensor `{name}`: lora_b is not 2-D")));
    };
    if a_in != in_dim || b_out != out_dim || b_rank != rank || rank == 0 {
        return Err(refusal(
            path,
            format!(
                "tensor `{name}`: lora_a {a_shape:?} and lora_b {b_shape:?} do not fit the \
                 model's {} of [{out_dim}, {in_dim}] (expected [rank, {in_dim}] and \
                 [{out_dim}, rank]; an adapter for another base model?)",
                target.hf_module()
            ),
        ));
    }
    Ok(LoraWeight {
        layer,
        target,
        rank,
        a,
        b,
        in_dim,
        out_dim,
    })
}
