//! The model's weights in the layout the backend reads: each kind of weight (a linear layer,
//! the MLP's gate and up projections, the token embedding) with how it multiplies and how it is
//! rewritten for the int8 kernels, and one decoder layer's weights with the view the fused
//! decoder-layer node takes of them. Loading builds these (`load.rs`); the forward pass reads
//! them (`forward.rs`).

use mlxcel_model::{HiddenActivation, LayerAttention};

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::fast::rms_norm;
use crate::kernels::{Int8Layout, Kernels};
use crate::layer::{LayerTensors, Qkv};
use crate::quantized::{Epilogue, QuantizedWeight};

/// A linear layer, dense or affine-quantized, with an optional bias.
#[derive(Debug)]
pub(super) enum Linear {
    /// `weight_t` is the `[in, out]` view of the checkpoint's `[out, in]` weight.
    Dense {
        weight_t: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: QuantizedWeight,
        bias: Option<Array>,
    },
}

impl Linear {
    pub(super) fn forward(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
        let (y, bias) = match self {
            Self::Dense { weight_t, bias } => (x.matmul(weight_t)?, bias),
            Self::Quantized { weight, bias } => (weight.linear(x, kernels)?, bias),
        };
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

impl Linear {
    /// `forward(x) + residual`; one op on mlxcel's kernels.
    pub(super) fn forward_add(
        &self,
        x: &Array,
        residual: &Array,
        kernels: &Kernels,
    ) -> Result<Array> {
        match self {
            Self::Quantized { weight, bias: None } => {
                weight.linear_then(x, kernels, Epilogue::Residual(residual))
            }
            _ => self.forward(x, kernels)?.add(residual),
        }
    }

    /// Rewrites a quantized weight for the int8 kernels when they take its layout.
    pub(super) fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        if let Self::Quantized { weight, .. } = self {
            interleave_in_place(weight, layout, threads)?;
        }
        Ok(())
    }
}

fn interleave_in_place(
    weight: &mut QuantizedWeight,
    layout: Int8Layout,
    threads: usize,
) -> Result<()> {
    if weight.int8_capable() {
        *weight = weight.interleave_int8_on(layout, threads)?;
    }
    Ok(())
}

/// The MLP's gate and up projections: stacked into one quantized matrix when they share a
/// layout (one matmul with a SwiGLU epilogue instead of four ops), separate otherwise.
#[derive(Debug)]
pub(super) enum GateUp {
    Stacked(QuantizedWeight),
    Separate { gate: Linear, up: Linear },
}

impl GateUp {
    pub(super) fn new(gate: Linear, up: Linear) -> Result<Self> {
        match (&gate, &up) {
            (
                Linear::Quantized {
                    weight: g,
                    bias: None,
                },
                Linear::Quantized {
                    weight: u,
                    bias: None,
                },
            ) if g.group_size == u.group_size && g.bits == u.bits => {
                Ok(Self::Stacked(QuantizedWeight::concat_rows(&[g, u])?))
            }
            _ => Ok(Self::Separate { gate, up }),
        }
    }

    /// `act(h · gateᵀ) · (h · upᵀ)` where `h = rms_norm(x, norm, eps)` and `act` is SiLU or
    /// GELU-tanh.
    pub(super) fn forward_normed(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        activation: HiddenActivation,
        kernels: &Kernels,
    ) -> Result<Array> {
        let epilogue = match activation {
            HiddenActivation::Silu => Epilogue::Swiglu,
            HiddenActivation::GeluTanh => Epilogue::Geglu,
        };
        match self {
            Self::Stacked(w) => w.linear_normed_then(x, norm, eps, kernels, epilogue),
            Self::Separate { gate, up } => {
                let h = rms_norm(x, norm, eps)?;
                let g = gate.forward(&h, kernels)?;
                let activated = match activation {
                    HiddenActivation::Silu => g.silu()?,
                    HiddenActivation::GeluTanh => g.gelu_tanh()?,
                };
                activated.multiply(&up.forward(&h, kernels)?)
            }
        }
    }
}

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
    pub(super) gate_up: GateUp,
    pub(super) down: Linear,
    /// The per-head RMSNorm weights of q and k (Qwen3), `[head_dim]` each.
    pub(super) qk_norm: Option<(Array, Array)>,
    /// RoPE or not, and the sliding window.
    pub(super) attention: LayerAttention,
    /// Whether the layer rotates with the model's local RoPE (Gemma 3's sliding layers).
    pub(super) local_rope: bool,
    /// Each head's attention-sink logit (`self_attn.sinks`, gpt-oss), f32, when the model has
    /// them.
    pub(super) sinks: Option<Vec<f32>>,
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
    /// Every quantized weight the native kernels read, rewritten for the int8 kernels where
    /// they take its layout (separate q, k and v only when they are not stacked: the stacked
    /// copy is what the native path reads).
    pub(super) fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        for linear in [&mut self.o, &mut self.down] {
            linear.interleave_int8(layout, threads)?;
        }
        match &mut self.qkv {
            QkvWeights::Stacked(qkv) => interleave_in_place(qkv, layout, threads)?,
            QkvWeights::Separate(q, k, v) => {
                for linear in [q, k, v] {
                    linear.interleave_int8(layout, threads)?;
                }
            }
        }
        match &mut self.gate_up {
            GateUp::Stacked(w) => interleave_in_place(w, layout, threads),
            GateUp::Separate { gate, up } => {
                gate.interleave_int8(layout, threads)?;
                up.interleave_int8(layout, threads)
            }
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
            t.qkv
                .all()
                .into_iter()
                .chain([t.gate_up, t.o, t.down])
                .all(QuantizedWeight::native_layout)
        })
    }

    /// The layer's tensors for the fused decoder-layer node, when its structure allows it:
    /// stacked q/k/v (with their biases, if any) and gate/up, and o and down, all quantized, o,
    /// gate/up and down without biases ([`Layer::fusable`] also checks their layouts).
    pub(super) fn fused_tensors<'a>(
        &'a self,
        inv_freq: &'a Array,
        features: LayerFeatures,
    ) -> Option<LayerTensors<'a>> {
        let qkv = self.qkv_matrices()?;
        let GateUp::Stacked(gate_up) = &self.gate_up else {
            return None;
        };
        let Linear::Quantized {
            weight: o,
            bias: None,
        } = &self.o
        else {
            return None;
        };
        let Linear::Quantized {
            weight: down,
            bias: None,
        } = &self.down
        else {
            return None;
        };
        Some(LayerTensors {
            input_norm: &self.input_norm,
            qkv,
            qkv_bias: self.qkv_bias.as_ref(),
            o,
            post_norm: &self.post_norm,
            gate_up,
            down,
            inv_freq,
            qk_norm: self.qk_norm.as_ref().map(|(q, k)| (q, k)),
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

pub(super) fn linear_arrays<'a>(linear: &'a Linear, arrays: &mut Vec<&'a Array>) {
    match linear {
        Linear::Dense { weight_t, bias } => {
            arrays.push(weight_t);
            arrays.extend(bias);
        }
        Linear::Quantized { weight, bias } => {
            arrays.extend([&weight.weight, &weight.scales, &weight.biases]);
            arrays.extend(bias);
        }
    }
}
