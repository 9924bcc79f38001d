//! The model's weights in the layout the backend reads: the token embedding, and one decoder
//! layer's weights (its linear layers from `linear.rs`, its MLP dense or routed, `experts.rs`)
//! with how they are rewritten for the int8 kernels and the view the fused decoder-layer node
//! takes of them. Loading builds these (`load.rs`); the forward pass reads them (`forward.rs`).

use mlxcel_model::{HiddenActivation, LayerAttention};

use super::experts::RoutedMlp;
use super::linear::{GateUp, Linear, prepare_in_place};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::kernels::{Kernels, Matrix};
use crate::layer::{LayerMlp, LayerTensors, Qkv};
use crate::quantized::QuantizedWeight;

/// The token embedding, which doubles as the output projection when tied.
#[derive(Debug)]
pub(super) enum Embedding {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Embedding {
    /// Rows of `ids` (`[tokens]`, u32) as `[tokens, hidden]` f32.
    pub(super) fn lookup(&self, ids: &Array) -> Result<Array> {
        match self {
            Self::Dense(table) => table.take(ids, 0),
            // A tied table kept in the int8 layout only (its output projection's).
            Self::Quantized(q) if q.int8 => q.int8_rows(ids),
            Self::Quantized(q) => QuantizedWeight {
                weight: q.weight.take(ids, 0)?,
                // MLX dequantizes in the scales' dtype: widen the picked rows first, so that
                // f16-stored scales still give f32 embeddings.
                scales: q.scales.take(ids, 0)?.astype(Dtype::F32)?,
                biases: q.biases.take(ids, 0)?.astype(Dtype::F32)?,
                group_size: q.group_size,
                bits: q.bits,
                int8: false,
                activations: None,
            }
            .dequantize()?
            .astype(Dtype::F32),
        }
    }

    /// `x · tableᵀ`: logits over the vocabulary.
    pub(super) fn project(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
        match self {
            Self::Dense(table) => x.matmul(&table.transpose(&[1, 0])?),
            Self::Quantized(q) => q.linear(x, kernels),
        }
    }
}

#[derive(Debug)]
pub(super) struct Layer {
    pub(super) input_norm: Array,
    pub(super) qkv: QkvWeights,
    /// The q, k and v biases stacked as `qkv`'s rows (f32; Qwen2), when `qkv` is stacked from
    /// weights with biases.
    pub(super) qkv_bias: Option<Array>,
    pub(super) o: Linear,
    /// The MLP's input norm (`post_attention_layernorm` in llamas, `pre_feedforward_layernorm`
    /// in Gemma).
    pub(super) post_norm: Array,
    /// Gemma: the norms of the attention's output and of the MLP's output before their residual
    /// adds (`post_attention_layernorm`, `post_feedforward_layernorm`).
    pub(super) sandwich: Option<(Array, Array)>,
    pub(super) mlp: Mlp,
    /// The RMSNorm weights of q and k: per head (Qwen3), `[head_dim]` each, or with
    /// `qk_norm_whole` over the whole projections (OLMoE), `[q_dim]` and `[kv_dim]`.
    pub(super) qk_norm: Option<(Array, Array)>,
    /// `qk_norm` normalizes the whole q and k projections before the heads are split.
    pub(super) qk_norm_whole: bool,
    /// RoPE or not, and the sliding window.
    pub(super) attention: LayerAttention,
    /// Whether the layer rotates with the model's local RoPE (Gemma 3's sliding layers).
    pub(super) local_rope: bool,
    /// Each head's attention-sink logit (`self_attn.sinks`, gpt-oss), f32, when the model has
    /// them.
    pub(super) sinks: Option<Vec<f32>>,
    /// The output gate's projection (the gate rows of a gated `q_proj`, Qwen3-Next and
    /// Qwen3.5): the attention's output is multiplied by `sigmoid(gate)` before `o`.
    pub(super) output_gate: Option<Linear>,
    /// Ones of `[head_dim]`: each head of v is RMS-normalised without weights (Gemma 4's
    /// `v_norm`), on the per-op graph.
    pub(super) value_norm: Option<Array>,
    /// The factor on the layer's output (Gemma 4's `layer_scalar`, `[1]`), on the per-op graph.
    pub(super) scalar: Option<Array>,
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(super) enum Mlp {
    /// The gated MLP.
    Dense { gate_up: GateUp, down: Linear },
    /// A mixture of experts (inside the fused layer when its routed-expert node was prepared,
    /// else on the per-op graph).
    Routed(Box<RoutedMlp>),
}

/// A layer's q, k and v projections.
#[derive(Debug)]
pub(super) enum QkvWeights {
    /// Stacked into one matrix, when mlxcel's kernels run and they share a layout: one matmul,
    /// then [`crate::fast::split_heads`] per sequence (rotating q and k), instead of three matmuls and eleven
    /// shape and RoPE ops. The separate matrices are not kept.
    Stacked(QuantizedWeight),
    /// Apart: MLX's kernels (`MLXCEL_KERNELS=mlx`), dense weights, or quantized in different
    /// layouts (the fused layer then takes them as three matrices).
    Separate(Linear, Linear, Linear),
}

impl Layer {
    /// Every quantized weight the native kernels read, readied for the activations it
    /// multiplies ([`Kernels::matrix_activations`]): rewritten for the int8 kernels where its
    /// activations read that layout, and told its own under a per-matrix policy (separate q, k
    /// and v only when they are not stacked: the stacked copy is what the native path reads).
    pub(super) fn prepare_matrices(&mut self, kernels: &Kernels) -> Result<()> {
        let attention = kernels.matrix_activations(Matrix::Attention);
        self.o.prepare_for(kernels, attention)?;
        if let Some(gate) = &mut self.output_gate {
            gate.prepare_for(kernels, attention)?;
        }
        match &mut self.qkv {
            QkvWeights::Stacked(qkv) => prepare_in_place(qkv, kernels, attention)?,
            QkvWeights::Separate(q, k, v) => {
                for linear in [q, k, v] {
                    linear.prepare_for(kernels, attention)?;
                }
            }
        }
        match &mut self.mlp {
            Mlp::Dense { gate_up, down } => {
                gate_up.prepare_for(kernels, kernels.matrix_activations(Matrix::GateUp))?;
                down.prepare_for(kernels, kernels.matrix_activations(Matrix::Down))
            }
            // Routed experts multiply what the kernels' own choice says (f32 under `mixed`).
            Mlp::Routed(moe) if kernels.int8_layout_weights() => {
                moe.interleave_int8(kernels.int8_layout, kernels.threads)
            }
            Mlp::Routed(_) => Ok(()),
        }
    }

    /// q, k and v as the fused layer takes them: stacked, or three quantized matrices whose
    /// layouts differ (llama.cpp's K-quant presets keep some v in Q6_K beside a Q4_K q and k),
    /// their biases (if any) stacked.
    pub(super) fn qkv_matrices(&self) -> Option<Qkv<'_>> {
        match &self.qkv {
            QkvWeights::Stacked(stacked) => Some(Qkv::Stacked(stacked)),
            QkvWeights::Separate(
                Linear::Quantized {
                    weight: q,
                    bias: bq,
                },
                Linear::Quantized { weight: k, .. },
                Linear::Quantized { weight: v, .. },
            ) if bq.is_none() || self.qkv_bias.is_some() => Some(Qkv::Split(q, k, v)),
            QkvWeights::Separate(..) => None,
        }
    }

    /// Whether the fused decoder-layer node can run this layer: [`Layer::fused_tensors`] finds
    /// its tensors and every matrix is in a layout mlxcel's kernels cover. Decided once at load
    /// (each check reads dtypes and shapes through MLX: ~0.15 ms a step on a 30-layer model).
    pub(super) fn fusable(&self, inv_freq: &Array, features: LayerFeatures) -> bool {
        self.fused_tensors(inv_freq, features).is_some_and(|t| {
            let mlp = match t.mlp {
                LayerMlp::Dense { gate_up, down } => vec![gate_up, down],
                // The routed-expert node checked its experts when it was made.
                LayerMlp::Routed(_) => Vec::new(),
            };
            t.qkv
                .all()
                .into_iter()
                .chain([t.o])
                .chain(mlp)
                .all(QuantizedWeight::native_layout)
        })
    }

    /// The layer's tensors for the fused decoder-layer node, when its structure allows it:
    /// stacked q/k/v (with their biases, if any) and gate/up, and o (with its bias, if any) and
    /// down, all quantized, gate/up and down without biases ([`Layer::fusable`] also checks their layouts); q/k
    /// norms, if any, per head or over the whole projections; routed experts when their node was prepared and the layer has
    /// no sandwich norms.
    pub(super) fn fused_tensors<'a>(
        &'a self,
        inv_freq: &'a Array,
        features: LayerFeatures,
    ) -> Option<LayerTensors<'a>> {
        // The fused node has no output gate, v norm or output factor.
        if self.output_gate.is_some() || self.value_norm.is_some() || self.scalar.is_some() {
            return None;
        }
        let qkv = self.qkv_matrices()?;
        let mlp = match &self.mlp {
            Mlp::Dense {
                gate_up: GateUp::Stacked(gate_up),
                down:
                    Linear::Quantized {
                        weight: down,
                        bias: None,
                    },
            } => LayerMlp::Dense { gate_up, down },
            // Routed experts whose node was prepared (the node's kernel runs inside the layer),
            // without Gemma's sandwich norms (the node adds its own residual).
            Mlp::Routed(moe) if self.sandwich.is_none() => LayerMlp::Routed(moe.node.as_ref()?),
            _ => return None,
        };
        let Linear::Quantized {
            weight: o,
            bias: o_bias,
        } = &self.o
        else {
            return None;
        };
        Some(LayerTensors {
            input_norm: &self.input_norm,
            qkv,
            qkv_bias: self.qkv_bias.as_ref(),
            o,
            o_bias: o_bias.as_ref(),
            post_norm: &self.post_norm,
            mlp,
            inv_freq,
            qk_norm: self.qk_norm.as_ref().map(|(q, k)| (q, k)),
            qk_norm_whole: self.qk_norm_whole,
            rope: self.attention.rope,
            window: self.attention.window,
            sandwich: self.sandwich.as_ref().map(|(a, m)| (a, m)),
            gelu: features.activation == HiddenActivation::GeluTanh,
            softcap: features.softcap,
            sinks: self.sinks.as_deref(),
        })
    }
}

/// What every layer of a model shares beyond the shape: the MLP's activation and the attention
/// scores' soft-cap.
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerFeatures {
    pub(super) activation: HiddenActivation,
    pub(super) softcap: Option<f32>,
}

impl Mlp {
    /// Every array the block holds, pushed onto `arrays`.
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        match self {
            Self::Dense { gate_up, down } => {
                gate_up.arrays(arrays);
                super::linear::linear_arrays(down, arrays);
            }
            Self::Routed(moe) => moe.arrays(arrays),
        }
    }
}
