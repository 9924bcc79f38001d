//! The loaded model: its weights and tables, what it reports about itself (bytes, how a step
//! runs, KV cache types), and which RoPE each layer rotates with.

use mlxcel_model::ModelConfig;

use super::control::ControlVectors;
use super::delta_net::LinearLayer;
use super::linear::{Linear, linear_arrays};
use super::lora::Adapters;
use super::short_conv::ConvLayer;
use super::stage::Stage;
use super::varied_layer::{StepContext, VariedLayers};
use super::weights::{Embedding, Layer, LayerFeatures, Mlp, QkvWeights};
use crate::array::{Array, eval};
use crate::error::{Error, Result};
use crate::fast::Rope;
use crate::kernels::{KernelBackend, Kernels};
use crate::kv_cache::{KvCache, KvType};
use crate::layer::LayerTensors;

/// Where a decoder layer's weights are: a softmax-attention layer or a linear-attention one.
#[derive(Debug, Clone, Copy)]
pub(super) enum LayerRef {
    Attention(usize),
    Linear(usize),
    /// A short-convolution layer (LFM2), an index into `conv_layers`.
    Conv(usize),
    /// A layer of a model whose layers vary in shape (Gemma 4), an index into `varied`'s.
    Varied(usize),
}

/// A llama-family model with its weights in MLX arrays.
#[derive(Debug)]
pub struct LlamaModel {
    pub(super) config: ModelConfig,
    /// The token embedding: `None` on a pipeline stage that neither looks tokens up nor
    /// projects with a tied table.
    pub(super) embed: Option<Embedding>,
    /// The stage's softmax-attention layers (all of the model's outside a pipeline), in order
    /// (layer `i` of these is layer `i` of each sequence's KV cache).
    pub(super) layers: Vec<Layer>,
    /// A hybrid model's linear-attention layers this stage holds, in order (each sequence's
    /// recurrent state holds one entry per layer here); empty for other models.
    pub(super) linear_layers: Vec<LinearLayer>,
    /// LFM2's short-convolution layers this stage holds, in order (each sequence's recurrent
    /// state holds one entry per layer here, after the linear-attention layers'); empty for
    /// other models.
    pub(super) conv_layers: Vec<ConvLayer>,
    /// The decoder layers and per-layer inputs of a model whose layers vary in shape (Gemma
    /// 4's released models: `varied_layer.rs`); `layers` is empty then.
    pub(super) varied: Option<VariedLayers>,
    /// The stage's decoder layers (the model's `stage.first..stage.end`) in the model's order,
    /// as an index into `layers`, `linear_layers` or `conv_layers`.
    pub(super) order: Vec<LayerRef>,
    /// The final norm: `None` on a pipeline stage other than the last.
    pub(super) norm: Option<Array>,
    /// The untied output projection (`None` when tied to the embedding, or on a stage that does
    /// not hold it).
    pub(super) lm_head: Option<Linear>,
    /// Which part of the model this process holds.
    pub(super) stage: Stage,
    pub(super) rope: Rope,
    /// RoPE's inverse frequencies for [`crate::fast::split_heads`] (`[head_dim / 2]`).
    pub(super) inv_freq: Array,
    /// The sliding layers' own RoPE and inverse frequencies (Gemma 3's local base).
    pub(super) local_rope: Option<(Rope, Array)>,
    /// LongRoPE's attention factor on the rotated features (`[head_dim]`: the factor, then ones
    /// past the rotary width), for the per-op graph.
    pub(super) rope_input_scale: Option<Array>,
    pub(super) attention_scale: f32,
    /// The factor on the embeddings (Gemma), a scalar array.
    pub(super) embedding_scale: Option<Array>,
    pub(super) features: LayerFeatures,
    pub(super) kernels: Kernels,
    /// The element types of new caches' keys and values.
    pub(super) kv_types: (KvType, KvType),
    /// Every layer is [`Layer::fusable`] (decided at load).
    pub(super) fusable: bool,
    /// The LoRA adapters a step may apply ([`LlamaModel::set_adapters`]); none at load.
    pub(super) adapters: Adapters,
    /// The control vectors added after decoder layers ([`LlamaModel::set_control_vector`]);
    /// none at load.
    pub(super) control: ControlVectors,
}

impl LlamaModel {
    /// Every array the model holds: weights, norms, RoPE tables.
    fn arrays(&self) -> Vec<&Array> {
        let mut arrays: Vec<&Array> = self.norm.iter().collect();
        for layer in &self.layers {
            arrays.extend([&layer.input_norm, &layer.post_norm]);
            if let Some((a, m)) = &layer.sandwich {
                arrays.extend([a, m]);
            }
            if let Some((q, k)) = &layer.qk_norm {
                arrays.extend([q, k]);
            }
            linear_arrays(&layer.o, &mut arrays);
            layer.mlp.arrays(&mut arrays);
            match &layer.qkv {
                QkvWeights::Stacked(w) => arrays.extend([&w.weight, &w.scales, &w.biases]),
                QkvWeights::Separate(q, k, v) => {
                    for linear in [q, k, v] {
                        linear_arrays(linear, &mut arrays);
                    }
                }
            }
            arrays.extend(&layer.qkv_bias);
            if let Some(gate) = &layer.output_gate {
                linear_arrays(gate, &mut arrays);
            }
        }
        for layer in &self.linear_layers {
            arrays.extend([&layer.input_norm, &layer.post_norm]);
            layer.mlp.arrays(&mut arrays);
            for linear in layer.net.projections.iter().chain([&layer.net.out]) {
                linear_arrays(linear, &mut arrays);
            }
        }
        for layer in &self.conv_layers {
            arrays.extend([&layer.input_norm, &layer.post_norm]);
            layer.mlp.arrays(&mut arrays);
            for linear in [&layer.in_proj, &layer.out] {
                linear_arrays(linear, &mut arrays);
            }
        }
        if let Some(varied) = &self.varied {
            varied.arrays(&mut arrays);
        }
        if let Some(head) = &self.lm_head {
            linear_arrays(head, &mut arrays);
        }
        if let Some((_, inv)) = &self.local_rope {
            arrays.push(inv);
        }
        match &self.embed {
            Some(Embedding::Dense(table)) => arrays.push(table),
            Some(Embedding::Quantized(q)) => arrays.extend([&q.weight, &q.scales, &q.biases]),
            None => {}
        }
        arrays
    }

    /// Evaluates every weight now, so that load errors surface here and the first step does not
    /// pay for the conversions.
    pub(super) fn materialize(&self) -> Result<()> {
        eval(&self.arrays())
    }

    /// Bytes of the arrays the model holds (its weights in the layout its kernels read, e.g.
    /// the compact int8 layout, and its norms and RoPE tables).
    pub fn weight_bytes(&self) -> u64 {
        let routers: u64 = self
            .layers
            .iter()
            .map(|layer| &layer.mlp)
            .chain(self.linear_layers.iter().map(|layer| &layer.mlp))
            .chain(self.conv_layers.iter().map(|layer| &layer.mlp))
            .filter_map(|mlp| match mlp {
                Mlp::Routed(moe) => Some(moe.host_bytes()),
                Mlp::Dense { .. } => None,
            })
            .sum();
        let linear: u64 = self
            .linear_layers
            .iter()
            .map(|layer| {
                let net = &layer.net;
                4 * (net.conv.len() + net.decay_rate.len() + net.dt_bias.len() + net.norm.len())
                    as u64
            })
            .sum::<u64>()
            + self
                .conv_layers
                .iter()
                .map(|layer| 4 * layer.taps.len() as u64)
                .sum::<u64>();
        self.arrays()
            .iter()
            .map(|a| (a.size() * a.dtype().size_in_bytes()) as u64)
            .sum::<u64>()
            + routers
            + linear
    }

    /// Bytes of weights one decode token reads: [`LlamaModel::weight_bytes`] less the routed
    /// experts it is not sent to (a mixture of experts reads `top_k` of them a layer) and, when
    /// the output projection has its own matrix, the embedding table (a token reads one row).
    pub fn token_read_bytes(&self) -> u64 {
        let unread_experts: u64 = self
            .layers
            .iter()
            .map(|layer| &layer.mlp)
            .chain(self.linear_layers.iter().map(|layer| &layer.mlp))
            .chain(self.conv_layers.iter().map(|layer| &layer.mlp))
            .filter_map(|mlp| match mlp {
                Mlp::Routed(moe) => Some(moe.unread_bytes()),
                Mlp::Dense { .. } => None,
            })
            .sum();
        let unread_table = match (&self.lm_head, &self.embed) {
            (None, _) | (Some(_), None) => 0,
            (Some(_), Some(Embedding::Dense(table))) => {
                table.size() * table.dtype().size_in_bytes()
            }
            (Some(_), Some(Embedding::Quantized(q))) => [&q.weight, &q.scales, &q.biases]
                .iter()
                .map(|a| a.size() * a.dtype().size_in_bytes())
                .sum(),
        } as u64;
        let unread_per_layer_table = self.varied.as_ref().map_or(0, VariedLayers::table_bytes);
        self.weight_bytes()
            .saturating_sub(unread_experts + unread_table + unread_per_layer_table)
    }

    /// How a step runs: `fused layers` (the decoder layers as one MLX node on mlxcel's kernels), or
    /// the per-op graph and why (for `mlxcel bench`'s output).
    pub fn execution(&self) -> &'static str {
        if self.fused_layers().is_some() {
            if self
                .layers
                .iter()
                .any(|layer| matches!(layer.mlp, Mlp::Routed(_)))
            {
                "fused layers (routed-expert MLPs inside the fused layer node)"
            } else {
                "fused layers"
            }
        } else if self.kernels.backend != KernelBackend::Native {
            "per-op graph (MLX kernels)"
        } else if !self.kernels.fused_layers {
            "per-op graph (MLXCEL_FUSED_LAYERS=off)"
        } else if self.varied.is_some() {
            "per-op graph (layers of varied head sizes, shared keys and values or per-layer inputs)"
        } else if !self.linear_layers.is_empty() {
            "per-op graph (hybrid model: its linear-attention layers run the delta rule on the host)"
        } else if !self.conv_layers.is_empty() {
            "per-op graph (hybrid model: its short convolutions run on the host)"
        } else if self
            .layers
            .iter()
            .any(|layer| matches!(&layer.mlp, Mlp::Routed(moe) if !moe.fused()))
        {
            "per-op graph (routed-expert MLP: the router's choice is read back each layer)"
        } else if self
            .layers
            .iter()
            .any(|layer| matches!(layer.mlp, Mlp::Routed(_)))
        {
            "per-op graph (routed-expert MLP as one fused node per layer)"
        } else {
            "per-op graph (dense weights, or biases on o or the MLP: the fused layer takes quantized weights, biased only on q/k/v)"
        }
    }

    /// The kernels this model runs on.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// The model's description.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// An empty cache for a sequence of at most `max_positions` positions, its keys and values
    /// in the model's [`LlamaModel::kv_types`].
    ///
    /// A hybrid model's cache holds keys and values for its softmax-attention layers only, and
    /// a new sequence's recurrent state for its linear-attention layers.
    pub fn new_cache(&self, max_positions: usize) -> KvCache {
        let shapes: Vec<_> = self
            .linear_layers
            .iter()
            .map(|layer| layer.net.state_shape())
            .chain(self.conv_layers.iter().map(ConvLayer::state_shape))
            .collect();
        KvCache::new(
            &self.config.kv_shapes(self.stage.first..self.stage.end),
            max_positions.min(self.config.window()),
            self.kv_types,
        )
        .with_recurrent(&shapes)
    }

    /// Whether the model has recurrent layers (a hybrid: Qwen3-Next and Qwen3.5 with linear
    /// attention, LFM2 with short convolutions), whose per-sequence state is kept beside the
    /// keys and values. A pipeline stage answers for the whole model: its other stages may hold
    /// those layers.
    pub fn is_hybrid(&self) -> bool {
        self.config
            .layers
            .iter()
            .any(|l| l.linear.is_some() || l.conv.is_some())
    }

    /// Bytes of the recurrent state every sequence of this model carries, whatever its length
    /// (0 unless the model is a hybrid).
    pub fn recurrent_bytes_per_sequence(&self) -> usize {
        self.linear_layers
            .iter()
            .map(|layer| {
                let shape = layer.net.state_shape();
                4 * (shape.conv + shape.matrix)
            })
            .sum::<usize>()
            + self
                .conv_layers
                .iter()
                .map(|layer| 4 * layer.state_shape().conv)
                .sum::<usize>()
    }

    /// The element types of the keys and values of caches from [`LlamaModel::new_cache`]
    /// (f32 unless [`LlamaModel::set_kv_types`] chose otherwise).
    pub fn kv_types(&self) -> (KvType, KvType) {
        self.kv_types
    }

    /// Sets the element types of later caches' keys and values (llama.cpp's `--cache-type-k`
    /// and `--cache-type-v`); caches already made keep theirs. q8_0 needs the fused decoder
    /// layer (the only writer of its blocks) and a head size of whole 32-value blocks; refused
    /// otherwise, with the reason.
    pub fn set_kv_types(&mut self, keys: KvType, values: KvType) -> Result<()> {
        if keys == KvType::Q8_0 || values == KvType::Q8_0 {
            let head_dim = self.config.head_dim;
            let reason = if !KvType::Q8_0.holds_rows_of(head_dim) {
                Some(format!(
                    "the model's head size {head_dim} is not a multiple of 32 (use f16 or f32)"
                ))
            } else if self.fused_layers().is_none() {
                Some(format!(
                    "its blocks are written by mlxcel's fused decoder layer, and this model runs \
                     the {} (use f16 or f32)",
                    self.execution()
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::KvTypeUnsupported {
                    kind: KvType::Q8_0.as_str(),
                    reason,
                });
            }
        }
        self.kv_types = (keys, values);
        Ok(())
    }

    /// KV bytes one position takes over the layers this model holds (all of them outside a
    /// pipeline) in caches from [`LlamaModel::new_cache`].
    pub fn kv_bytes_per_position(&self) -> usize {
        self.config
            .kv_bytes_per_position(self.stage.first..self.stage.end, self.kv_types)
    }

    /// Per-layer tensors for the fused decoder-layer node, when the kernels and every layer's
    /// layout allow it.
    pub(super) fn fused_layers(&self) -> Option<Vec<LayerTensors<'_>>> {
        if self.kernels.backend != KernelBackend::Native
            || !self.kernels.fused_layers
            || !self.fusable
            || !self.linear_layers.is_empty()
            || !self.conv_layers.is_empty()
        {
            return None;
        }
        self.layers
            .iter()
            .map(|layer| layer.fused_tensors(self.rope_of(layer).1, self.features))
            .collect()
    }

    /// The RoPE and inverse frequencies `layer` rotates with.
    pub(super) fn rope_of(&self, layer: &Layer) -> (&Rope, &Array) {
        match (&self.local_rope, layer.local_rope) {
            (Some((rope, inv)), true) => (rope, inv),
            _ => (&self.rope, &self.inv_freq),
        }
    }
}

impl LlamaModel {
    /// What a varied layer's step reads of the model beside its own weights.
    pub(super) fn varied_context(&self) -> StepContext<'_> {
        StepContext {
            config: &self.config,
            kernels: &self.kernels,
            rope: &self.rope,
            local_rope: self.local_rope.as_ref().map(|(rope, _)| rope),
            attention_scale: self.attention_scale,
            activation: self.features.activation,
        }
    }

    /// Varied layer `index` over the step's rows `x` ([`VariedLayers::step`]).
    pub(super) fn varied_step(
        &self,
        index: usize,
        x: Array,
        parts: &mut [(&mut KvCache, usize)],
        per_layer_inputs: Option<&Array>,
    ) -> Result<Array> {
        let varied = self.varied.as_ref().ok_or_else(|| Error::Mlx {
            op: "varied layer",
            message: format!("layer {index} is a varied layer of a model that has none"),
        })?;
        varied.step(index, x, parts, per_layer_inputs, &self.varied_context())
    }
}

impl LlamaModel {
    /// Holds `adapters` (their ids are their places in the slice) for steps to apply
    /// ([`LlamaModel::forward_scored_with_adapters`]), replacing any held before. Refused on
    /// the models whose layers the LoRA path does not cover, saying which.
    pub fn set_adapters(&mut self, adapters: &[mlxcel_model::LoraAdapter]) -> Result<()> {
        let c = &self.config;
        let refusal = if self.varied.is_some() {
            Some("its layers vary in shape (Gemma 4)")
        } else if !self.linear_layers.is_empty() || !self.conv_layers.is_empty() {
            Some("it has linear-attention or convolution layers (a hybrid)")
        } else if self.stage.first != 0 || self.stage.end != c.num_hidden_layers {
            Some("this process holds one pipeline stage of it")
        } else if c.attention_output_gate {
            Some("its attention output is gated (q_proj holds the gate)")
        } else {
            None
        };
        if let (Some(why), false) = (refusal, adapters.is_empty()) {
            return Err(Error::Adapter {
                reason: format!("LoRA adapters are not supported on this model: {why}"),
            });
        }
        self.adapters = Adapters::new(adapters, self.layers.len())?;
        Ok(())
    }

    /// How many LoRA adapters the model holds.
    pub fn adapter_count(&self) -> usize {
        self.adapters.len()
    }
}
