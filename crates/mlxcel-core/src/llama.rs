//! The llama-family forward pass on MLX: Llama 2/3, SmolLM/SmolLM2, Mistral and Qwen2 (with
//! q/k/v biases; sliding windows where configured), Qwen3 (per-head q/k norms) and SmolLM3
//! (layers without RoPE), Gemma 2/3 (scaled embeddings, `1 + w` norms before and after attention
//! and MLP, GeGLU, soft-capping, local RoPE bases). Each layer reads its features from the
//! config, never the family name.
//!
//! A step takes any mix of sequences, each with its own cache and its own new tokens (a prefill
//! chunk or one decode token). The linear layers run once over all the step's tokens flattened
//! together, so each weight is read once per step however many sequences there are; rotary
//! embedding and attention run per sequence, at that sequence's own positions. Only each
//! sequence's last position goes through the output projection.
//!
//! Activations stay in f32: MLX's CPU kernels are 15–70× slower in f16.

use mlxcel_model::{Checkpoint, HiddenActivation, LayerAttention, ModelConfig, TensorView};

use crate::array::{Array, eval};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::fast::{
    AttentionMask, HeadSlice, Rope, RopeFrequencies, attention_native_tokens_major, rms_norm,
    scaled_dot_product_attention, split_heads,
};
use crate::kernels::{Int8Layout, KernelBackend, Kernels};
use crate::kv_cache::{KvCache, KvType};
use crate::layer::{LayerSeq, LayerShape, LayerTensors, Qkv, decoder_stack};
use crate::quantized::{Epilogue, QuantizedWeight};

/// A linear layer, dense or affine-quantized, with an optional bias.
#[derive(Debug)]
enum Linear {
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
    fn forward(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
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
    fn forward_add(&self, x: &Array, residual: &Array, kernels: &Kernels) -> Result<Array> {
        match self {
            Self::Quantized { weight, bias: None } => {
                weight.linear_then(x, kernels, Epilogue::Residual(residual))
            }
            _ => self.forward(x, kernels)?.add(residual),
        }
    }

    /// Rewrites a quantized weight for the int8 kernels when they take its layout.
    fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
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
enum GateUp {
    Stacked(QuantizedWeight),
    Separate { gate: Linear, up: Linear },
}

impl GateUp {
    fn new(gate: Linear, up: Linear) -> Result<Self> {
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
    fn forward_normed(
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
enum Embedding {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Embedding {
    /// Rows of `ids` (`[tokens]`, u32) as `[tokens, hidden]` f32.
    fn lookup(&self, ids: &Array) -> Result<Array> {
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
    fn project(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
        match self {
            Self::Dense(table) => x.matmul(&table.transpose(&[1, 0])?),
            Self::Quantized(q) => q.linear(x, kernels),
        }
    }
}

#[derive(Debug)]
struct Layer {
    input_norm: Array,
    qkv: QkvWeights,
    /// The q, k and v biases stacked as `qkv`'s rows (f32; Qwen2), when `qkv` is stacked from
    /// weights with biases.
    qkv_bias: Option<Array>,
    o: Linear,
    /// The MLP's input norm (`post_attention_layernorm` in llamas, `pre_feedforward_layernorm`
    /// in Gemma).
    post_norm: Array,
    /// Gemma: the norms of the attention's output and of the MLP's output before their residual
    /// adds (`post_attention_layernorm`, `post_feedforward_layernorm`).
    sandwich: Option<(Array, Array)>,
    gate_up: GateUp,
    down: Linear,
    /// The per-head RMSNorm weights of q and k (Qwen3), `[head_dim]` each.
    qk_norm: Option<(Array, Array)>,
    /// RoPE or not, and the sliding window.
    attention: LayerAttention,
    /// Whether the layer rotates with the model's local RoPE (Gemma 3's sliding layers).
    local_rope: bool,
}

/// A layer's q, k and v projections.
#[derive(Debug)]
enum QkvWeights {
    /// Stacked into one matrix, when mlxcel's kernels run and they share a layout: one matmul,
    /// then [`split_heads`] per sequence (rotating q and k), instead of three matmuls and eleven
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
    fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
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
    fn qkv_matrices(&self) -> Option<Qkv<'_>> {
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
    fn fusable(&self, inv_freq: &Array, features: LayerFeatures) -> bool {
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
    fn fused_tensors<'a>(
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
        })
    }
}

/// What every layer of a model shares beyond the shape: the MLP's activation and the attention
/// scores' soft-cap.
#[derive(Debug, Clone, Copy)]
struct LayerFeatures {
    activation: HiddenActivation,
    softcap: Option<f32>,
}

/// What a forward pass returns per selected row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Logits,
    Hidden,
}

/// One sequence's part of a step.
#[derive(Debug)]
pub struct ForwardSeq<'a> {
    /// The sequence's cache; the new tokens start at position `cache.len()`.
    pub cache: &'a mut KvCache,
    /// The new tokens, at least one.
    pub tokens: &'a [u32],
}

/// A llama-family model with its weights in MLX arrays.
#[derive(Debug)]
pub struct LlamaModel {
    config: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Option<Linear>,
    rope: Rope,
    /// RoPE's inverse frequencies for [`split_heads`] (`[head_dim / 2]`).
    inv_freq: Array,
    /// The sliding layers' own RoPE and inverse frequencies (Gemma 3's local base).
    local_rope: Option<(Rope, Array)>,
    /// LongRoPE's attention factor on the rotated features (`[head_dim]`: the factor, then ones
    /// past the rotary width), for the per-op graph.
    rope_input_scale: Option<Array>,
    attention_scale: f32,
    /// The factor on the embeddings (Gemma), a scalar array.
    embedding_scale: Option<Array>,
    features: LayerFeatures,
    kernels: Kernels,
    /// The element types of new caches' keys and values.
    kv_types: (KvType, KvType),
    /// Every layer is [`Layer::fusable`] (decided at load).
    fusable: bool,
}

impl LlamaModel {
    /// Builds the model from a validated checkpoint, copying each tensor once into MLX memory.
    /// Dense weights are widened to f32; quantized weights stay packed, with f32 scales and biases.
    /// The kernels come from the environment ([`Kernels::from_env`]).
    pub fn load(checkpoint: &Checkpoint) -> Result<Self> {
        Self::load_with(checkpoint, Kernels::from_env()?)
    }

    /// [`LlamaModel::load`] with an explicit choice of kernels.
    pub fn load_with(checkpoint: &Checkpoint, kernels: Kernels) -> Result<Self> {
        let config = checkpoint.config().clone();
        let loader = Loader {
            checkpoint,
            norm_offset: config.norm_weight_offset,
            // mlxcel's kernels read f16 scales and biases as stored (fewer bytes per weight to
            // stream); MLX's quantized_matmul wants them in the activations' dtype.
            keep_f16_scales: kernels.backend == KernelBackend::Native,
            int8_from_blocks: (kernels.int8_layout_weights()
                && kernels.int8_layout == Int8Layout::Compact)
                .then_some(kernels.threads),
        };
        // The table in the int8 layout, straight from a GGUF file's blocks when the kernels
        // take that layout and it is read from one: its lookups read rows back exactly
        // (`int8_rows`), and a tied table serves the output projection too. Otherwise a tied
        // table is interleaved below; an untied one stays in MLX's layout.
        let embed = match loader.int8_stack(&["model.embed_tokens"])? {
            Some(q) => Embedding::Quantized(q),
            None => match loader.quantized("model.embed_tokens")? {
                Some(q) => Embedding::Quantized(q),
                None => Embedding::Dense(loader.float("model.embed_tokens.weight")?),
            },
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let qkv_bias = config.attention_qkv_bias;
                let [q, k, v] =
                    ["q_proj", "k_proj", "v_proj"].map(|m| format!("{p}.self_attn.{m}"));
                let stacked = loader.int8_stack(&[&q, &k, &v])?;
                // Stacked when all three are quantized alike, with biases on all three or none;
                // the biases are stacked whenever the weights are quantized (the fused layer
                // takes q, k and v separately when their layouts differ).
                let (qkv, qkv_bias) = if let Some(w) = stacked {
                    let bias = if qkv_bias {
                        let [bq, bk, bv] = [&q, &k, &v].map(|m| loader.float(&format!("{m}.bias")));
                        Some(Array::concatenate(&[&bq?, &bk?, &bv?], 0)?)
                    } else {
                        None
                    };
                    (QkvWeights::Stacked(w), bias)
                } else {
                    let q = loader.linear(&q, qkv_bias)?;
                    let k = loader.linear(&k, qkv_bias)?;
                    let v = loader.linear(&v, qkv_bias)?;
                    match (&q, &k, &v) {
                        (
                            Linear::Quantized {
                                weight: wq,
                                bias: bq,
                            },
                            Linear::Quantized {
                                weight: wk,
                                bias: bk,
                            },
                            Linear::Quantized {
                                weight: wv,
                                bias: bv,
                            },
                        ) if kernels.backend == KernelBackend::Native => {
                            let bias = match (bq, bk, bv) {
                                (None, None, None) => Ok(None),
                                (Some(bq), Some(bk), Some(bv)) => {
                                    Array::concatenate(&[bq, bk, bv], 0)
                                        .and_then(|b| b.astype(Dtype::F32))
                                        .map(Some)
                                }
                                _ => Err(Error::Mlx {
                                    op: "qkv",
                                    message: "q, k and v differ in having biases".into(),
                                }),
                            };
                            match (QuantizedWeight::concat_rows(&[wq, wk, wv]), bias) {
                                (Ok(w), Ok(b)) => (QkvWeights::Stacked(w), b),
                                (Err(_), Ok(b)) => (QkvWeights::Separate(q, k, v), b),
                                _ => (QkvWeights::Separate(q, k, v), None),
                            }
                        }
                        _ => (QkvWeights::Separate(q, k, v), None),
                    }
                };
                let (post_norm, sandwich) = if config.sandwich_norms {
                    (
                        loader.norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
                        Some((
                            loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
                            loader.norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
                        )),
                    )
                } else {
                    (
                        loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
                        None,
                    )
                };
                let mut layer = Layer {
                    input_norm: loader.norm(&format!("{p}.input_layernorm.weight"))?,
                    qkv,
                    qkv_bias,
                    o: loader
                        .linear(&format!("{p}.self_attn.o_proj"), config.attention_out_bias)?,
                    post_norm,
                    sandwich,
                    gate_up: {
                        let [gate, up] = ["gate_proj", "up_proj"].map(|m| format!("{p}.mlp.{m}"));
                        match loader.int8_stack(&[&gate, &up])? {
                            Some(w) => GateUp::Stacked(w),
                            None => GateUp::new(
                                loader.linear(&gate, false)?,
                                loader.linear(&up, false)?,
                            )?,
                        }
                    },
                    down: loader.linear(&format!("{p}.mlp.down_proj"), false)?,
                    qk_norm: if config.qk_norm {
                        Some((
                            loader.norm(&format!("{p}.self_attn.q_norm.weight"))?,
                            loader.norm(&format!("{p}.self_attn.k_norm.weight"))?,
                        ))
                    } else {
                        None
                    },
                    attention: config.layers[i],
                    local_rope: config.has_local_rope() && config.layers[i].window.is_some(),
                };
                // Rewritten into the int8 layout as each layer loads (int8 activations, or f32
                // ones on AVX-512), so that the checkpoint's form of one layer at a time, not
                // of the whole model, sits beside the rewritten weights.
                if kernels.int8_layout_weights() {
                    layer.interleave_int8(kernels.int8_layout, kernels.threads)?;
                }
                Ok(layer)
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = loader.norm("model.norm.weight")?;
        let mut lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(loader.linear("lm_head", false)?)
        };
        let mut embed = embed;
        if kernels.int8_layout_weights() {
            if let Some(head) = &mut lm_head {
                head.interleave_int8(kernels.int8_layout, kernels.threads)?;
            }
            // A tied table: one copy in the int8 layout serves the projection and the lookups.
            if let (None, Embedding::Quantized(table)) = (&lm_head, &mut embed)
                && table.int8_capable()
            {
                *table = table.interleave_int8_on(kernels.int8_layout, kernels.threads)?;
            }
        }
        let rope = rope_for(&config)?;
        let inv_freq = inverse_frequencies(&rope)?;
        let local_rope = match config.rope_local_theta {
            Some(base) if config.has_local_rope() => {
                let local = Rope {
                    dims: config.rotary_dim as i32,
                    traditional: false,
                    scale: 1.0,
                    frequencies: RopeFrequencies::Base(base),
                };
                let inv = inverse_frequencies(&local)?;
                Some((local, inv))
            }
            _ => None,
        };
        let attention_scale = config.attention_scale;
        let rope_input_scale = if config.rope_attention_factor != 1.0 {
            let m: Vec<f32> = (0..config.head_dim)
                .map(|i| {
                    if i < config.rotary_dim {
                        config.rope_attention_factor
                    } else {
                        1.0
                    }
                })
                .collect();
            Some(Array::from_f32(&m, &[config.head_dim as i32])?)
        } else {
            None
        };
        let embedding_scale = config.embedding_scale.map(Array::scalar_f32);
        let features = LayerFeatures {
            activation: config.hidden_activation,
            softcap: config.attn_logit_softcapping,
        };
        let mut model = Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            inv_freq,
            local_rope,
            rope_input_scale,
            attention_scale,
            embedding_scale,
            features,
            kernels,
            kv_types: (KvType::F32, KvType::F32),
            fusable: false,
        };
        model.fusable = model
            .layers
            .iter()
            .all(|layer| layer.fusable(model.rope_of(layer).1, model.features));
        model.materialize()?;
        // Loading read the checkpoint and, for int8, rewrote it: hand back what that freed.
        crate::device::release_unused_memory();
        Ok(model)
    }

    /// Evaluates every weight now, so that load errors surface here and the first step does not
    /// pay for the conversions.
    /// Every array the model holds: weights, norms, RoPE tables.
    fn arrays(&self) -> Vec<&Array> {
        let mut arrays: Vec<&Array> = vec![&self.norm];
        for layer in &self.layers {
            arrays.extend([&layer.input_norm, &layer.post_norm]);
            if let Some((a, m)) = &layer.sandwich {
                arrays.extend([a, m]);
            }
            if let Some((q, k)) = &layer.qk_norm {
                arrays.extend([q, k]);
            }
            for linear in [&layer.o, &layer.down] {
                linear_arrays(linear, &mut arrays);
            }
            match &layer.qkv {
                QkvWeights::Stacked(w) => arrays.extend([&w.weight, &w.scales, &w.biases]),
                QkvWeights::Separate(q, k, v) => {
                    for linear in [q, k, v] {
                        linear_arrays(linear, &mut arrays);
                    }
                }
            }
            arrays.extend(&layer.qkv_bias);
            match &layer.gate_up {
                GateUp::Stacked(w) => arrays.extend([&w.weight, &w.scales, &w.biases]),
                GateUp::Separate { gate, up } => {
                    linear_arrays(gate, &mut arrays);
                    linear_arrays(up, &mut arrays);
                }
            }
        }
        if let Some(head) = &self.lm_head {
            linear_arrays(head, &mut arrays);
        }
        if let Some((_, inv)) = &self.local_rope {
            arrays.push(inv);
        }
        match &self.embed {
            Embedding::Dense(table) => arrays.push(table),
            Embedding::Quantized(q) => arrays.extend([&q.weight, &q.scales, &q.biases]),
        }
        arrays
    }

    fn materialize(&self) -> Result<()> {
        eval(&self.arrays())
    }

    /// Bytes of the arrays the model holds (its weights in the layout its kernels read, e.g.
    /// the compact int8 layout, and its norms and RoPE tables).
    pub fn weight_bytes(&self) -> u64 {
        self.arrays()
            .iter()
            .map(|a| (a.size() * a.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// How a step runs: `fused layers` (the decoder layers as one MLX node on mlxcel's kernels), or
    /// the per-op graph and why (for `mlxcel bench`'s output).
    pub fn execution(&self) -> &'static str {
        if self.fused_layers().is_some() {
            "fused layers"
        } else if self.kernels.backend != KernelBackend::Native {
            "per-op graph (MLX kernels)"
        } else if !self.kernels.fused_layers {
            "per-op graph (MLXCEL_FUSED_LAYERS=off)"
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
    pub fn new_cache(&self, max_positions: usize) -> KvCache {
        KvCache::new(
            self.config.num_hidden_layers,
            self.config.num_key_value_heads,
            self.config.head_dim,
            max_positions.min(self.config.window()),
            self.kv_types,
        )
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

    /// KV bytes one position takes over all layers in caches from [`LlamaModel::new_cache`].
    pub fn kv_bytes_per_position(&self) -> usize {
        let c = &self.config;
        c.num_hidden_layers
            * c.num_key_value_heads
            * (self.kv_types.0.row_bytes(c.head_dim) + self.kv_types.1.row_bytes(c.head_dim))
    }

    /// Runs one step and returns, per sequence and in order, the logits of its last new position.
    /// Each cache grows by its sequence's new tokens.
    pub fn forward(&self, seqs: &mut [ForwardSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_rows(seqs, None)
    }

    /// Runs one sequence's step and returns the logits of its new positions from `first` (an
    /// index into its new tokens) to the last, in order: what perplexity scores. The cache grows
    /// as with [`LlamaModel::forward`].
    pub fn forward_scores(&self, seq: ForwardSeq<'_>, first: usize) -> Result<Vec<Vec<f32>>> {
        let mut rows = self.forward_scored(&mut [seq], &[first])?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// Runs one step like [`LlamaModel::forward`] and returns, per sequence and in order, the
    /// logits of its new positions from `firsts[i]` (an index into its new tokens) to the last:
    /// `firsts[i] = tokens.len() - 1` is `forward`'s last position, smaller values score more
    /// positions (speculative verification beside other sequences' decode and prefill).
    pub fn forward_scored(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        if firsts.len() != seqs.len() {
            return Err(Error::Mlx {
                op: "forward_scored",
                message: format!("{} first rows for {} sequences", firsts.len(), seqs.len()),
            });
        }
        for (seq, &first) in seqs.iter().zip(firsts) {
            let n = seq.tokens.len();
            if first >= n {
                return Err(Error::Mlx {
                    op: "forward_scored",
                    message: format!("first row {first} is past the step's {n} tokens"),
                });
            }
        }
        let counts: Vec<usize> = seqs
            .iter()
            .zip(firsts)
            .map(|(seq, &first)| seq.tokens.len() - first)
            .collect();
        let mut rows = self.forward_rows(seqs, Some(firsts))?.into_iter();
        Ok(counts
            .into_iter()
            .map(|count| rows.by_ref().take(count).collect())
            .collect())
    }

    /// The final hidden states (after the last norm, `hidden_size` floats each) of every new
    /// position of one sequence's step: what embeddings pool. The cache grows as with
    /// [`LlamaModel::forward`].
    pub fn forward_hidden(&self, seq: ForwardSeq<'_>) -> Result<Vec<Vec<f32>>> {
        self.forward_rows_as(&mut [seq], Some(&[0]), Output::Hidden)
    }

    /// [`LlamaModel::forward`], or with `from: Some(firsts)` the logits of every row of
    /// sequence `i` from `firsts[i]` on, all sequences' rows in one list.
    fn forward_rows(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        from: Option<&[usize]>,
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_rows_as(seqs, from, Output::Logits)
    }

    fn forward_rows_as(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        from: Option<&[usize]>,
        output: Output,
    ) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = Vec::new();
        for seq in seqs.iter_mut() {
            if seq.tokens.is_empty() {
                return Err(Error::EmptyStep);
            }
            if let Some(&bad) = seq
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(Error::TokenOutOfRange {
                    token: bad,
                    vocab_size: self.config.vocab_size,
                });
            }
            seq.cache.reserve(seq.tokens.len())?;
            ids.extend_from_slice(seq.tokens);
        }
        let total = ids.len() as i32;
        let c = &self.config;
        let (heads, kv_heads, head_dim) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );

        let kn = &self.kernels;
        let mut x = self.embed.lookup(&Array::from_u32(&ids, &[total])?)?;
        if let Some(scale) = &self.embedding_scale {
            x = x.multiply(scale)?;
        }
        if let Some(fused) = self.fused_layers() {
            let shape = LayerShape {
                hidden: c.hidden_size as i32,
                heads,
                kv_heads,
                head_dim,
                intermediate: c.intermediate_size as i32,
                eps: c.rms_norm_eps,
                scale: self.attention_scale,
                rope_scale: self.rope.scale,
                rotary: c.rotary_dim as i32,
                rope_mscale: c.rope_attention_factor,
            };
            let layers = fused
                .into_iter()
                .enumerate()
                .map(|(index, tensors)| {
                    let layer_seqs = seqs
                        .iter()
                        .map(|seq| {
                            let (n, position) = (seq.tokens.len(), seq.cache.len());
                            let (keys, values) = seq.cache.layer_blocks(index, position + n);
                            LayerSeq {
                                n,
                                position,
                                keys,
                                values,
                            }
                        })
                        .collect::<Vec<_>>();
                    (tensors, layer_seqs)
                })
                .collect::<Vec<_>>();
            x = decoder_stack(&x, &layers, &shape, kn)?;
        } else {
            for (index, layer) in self.layers.iter().enumerate() {
                x = self.layer_per_op(index, layer, x, seqs)?;
            }
        }

        let mut last_rows = Vec::with_capacity(seqs.len());
        let mut start = 0u32;
        for (index, seq) in seqs.iter().enumerate() {
            let end = start + seq.tokens.len() as u32;
            let first = from.map_or(end - 1, |firsts| start + firsts[index] as u32);
            last_rows.extend(first..end);
            start = end;
        }
        let batch = last_rows.len() as i32;
        // Every row in order (a decode step: one new token per sequence) needs no gather node.
        let every_row =
            last_rows.len() == ids.len() && (0u32..).zip(&last_rows).all(|(i, &r)| i == r);
        let last = if every_row {
            x
        } else {
            x.take(&Array::from_u32(&last_rows, &[batch])?, 0)?
        };
        let last = rms_norm(&last, &self.norm, c.rms_norm_eps)?;
        if output == Output::Hidden {
            let hidden = last.astype(Dtype::F32)?;
            let mut to_eval: Vec<&Array> = vec![&hidden];
            for seq in seqs.iter() {
                to_eval.extend(seq.cache.pending_arrays());
            }
            eval(&to_eval)?;
            for seq in seqs.iter_mut() {
                seq.cache.advance(seq.tokens.len());
            }
            return hidden.to_rows_f32(self.config.hidden_size);
        }
        let logits = match &self.lm_head {
            Some(head) => head.forward(&last, kn)?,
            None => self.embed.project(&last, kn)?,
        }
        .astype(Dtype::F32)?;
        let logits = match self.config.final_logit_softcapping {
            Some(cap) => {
                let cap = Array::scalar_f32(cap);
                logits.divide(&cap)?.tanh()?.multiply(&cap)?
            }
            None => logits,
        };

        let mut to_eval: Vec<&Array> = vec![&logits];
        for seq in seqs.iter() {
            to_eval.extend(seq.cache.pending_arrays());
        }
        eval(&to_eval)?;
        for seq in seqs.iter_mut() {
            seq.cache.advance(seq.tokens.len());
        }
        // Each row read straight into its own vector: scoring a verification pass's 17 rows
        // through one whole-array copy and a split cost 1.9 ms more on the default model.
        logits.to_rows_f32(self.config.vocab_size)
    }

    /// Per-layer tensors for the fused decoder-layer node, when the kernels and every layer's
    /// layout allow it.
    fn fused_layers(&self) -> Option<Vec<LayerTensors<'_>>> {
        if self.kernels.backend != KernelBackend::Native
            || !self.kernels.fused_layers
            || !self.fusable
        {
            return None;
        }
        self.layers
            .iter()
            .map(|layer| layer.fused_tensors(self.rope_of(layer).1, self.features))
            .collect()
    }

    /// The RoPE and inverse frequencies `layer` rotates with.
    fn rope_of(&self, layer: &Layer) -> (&Rope, &Array) {
        match (&self.local_rope, layer.local_rope) {
            (Some((rope, inv)), true) => (rope, inv),
            _ => (&self.rope, &self.inv_freq),
        }
    }

    /// One decoder layer as a graph of per-op nodes (MLX's kernels, or mlxcel's where a
    /// layer's layout does not allow the fused node).
    fn layer_per_op(
        &self,
        index: usize,
        layer: &Layer,
        mut x: Array,
        seqs: &mut [ForwardSeq<'_>],
    ) -> Result<Array> {
        let c = &self.config;
        let kn = &self.kernels;
        let (heads, kv_heads, head_dim) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );
        let stacked_bias = |y: Array| match &layer.qkv_bias {
            Some(bias) => y.add(bias),
            None => Ok(y),
        };
        let normed = |w: &QuantizedWeight| {
            w.linear_normed_then(&x, &layer.input_norm, c.rms_norm_eps, kn, Epilogue::None)
        };
        let projections = match (&layer.qkv, layer.qkv_matrices()) {
            (QkvWeights::Stacked(stacked), _) => {
                Projections::Stacked(stacked_bias(normed(stacked)?)?)
            }
            // Quantized differently (not stacked): the fused layer's arithmetic, three matmuls
            // side by side then the stacked path, so that the per-op graph gives its bits.
            (_, Some(Qkv::Split(q, k, v))) if kn.backend == KernelBackend::Native => {
                let y = Array::concatenate(&[&normed(q)?, &normed(k)?, &normed(v)?], 1)?;
                Projections::Stacked(stacked_bias(y)?)
            }
            (QkvWeights::Separate(q, k, v), _) => {
                let h = rms_norm(&x, &layer.input_norm, c.rms_norm_eps)?;
                Projections::Separate(q.forward(&h, kn)?, k.forward(&h, kn)?, v.forward(&h, kn)?)
            }
        };
        let mut outputs = Vec::with_capacity(seqs.len());
        let mut row = 0i32;
        // The q/k norms come before RoPE: with them, or without RoPE, the heads are split first
        // and then normed and rotated by MLX ops.
        let plain = layer.qk_norm.is_none()
            && layer.attention.rope
            && c.rotary_dim == c.head_dim
            && self.rope_input_scale.is_none();
        let (rope, inv_freq) = self.rope_of(layer);
        let finish = |x: Array, norm: Option<&Array>, position: i32| -> Result<Array> {
            let x = match norm {
                Some(w) => rms_norm(&x, w, c.rms_norm_eps)?,
                None => x,
            };
            if layer.attention.rope {
                let x = match &self.rope_input_scale {
                    Some(m) => x.multiply(m)?,
                    None => x,
                };
                rope.apply(&x, position)
            } else {
                Ok(x)
            }
        };
        let (q_norm, k_norm) = match &layer.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        for seq in seqs.iter_mut() {
            let n = seq.tokens.len() as i32;
            let position = seq.cache.len() as i32;
            let (qi, ki, vi) = match &projections {
                Projections::Stacked(qkv) if !plain => {
                    let slice = |column: i32, count: i32| {
                        split_heads(
                            qkv,
                            HeadSlice {
                                row,
                                rows: n,
                                column,
                                heads: count,
                                head_dim,
                                inv_freq,
                                rope: None,
                            },
                        )
                    };
                    (
                        finish(slice(0, heads)?, q_norm, position)?,
                        finish(slice(heads * head_dim, kv_heads)?, k_norm, position)?,
                        slice((heads + kv_heads) * head_dim, kv_heads)?,
                    )
                }
                Projections::Stacked(qkv) => {
                    let slice = |column: i32, count: i32, rope: bool| {
                        split_heads(
                            qkv,
                            HeadSlice {
                                row,
                                rows: n,
                                column,
                                heads: count,
                                head_dim,
                                inv_freq,
                                rope: rope.then_some((position, self.rope.scale)),
                            },
                        )
                    };
                    (
                        slice(0, heads, true)?,
                        slice(heads * head_dim, kv_heads, true)?,
                        slice((heads + kv_heads) * head_dim, kv_heads, false)?,
                    )
                }
                Projections::Separate(q, k, v) => {
                    let heads_first = |m: &Array, count: i32| -> Result<Array> {
                        m.slice(&[row, 0], &[row + n, count * head_dim])?
                            .reshape(&[1, n, count, head_dim])?
                            .transpose(&[0, 2, 1, 3])
                    };
                    (
                        finish(heads_first(q, heads)?, q_norm, position)?,
                        finish(heads_first(k, kv_heads)?, k_norm, position)?,
                        heads_first(v, kv_heads)?,
                    )
                }
            };
            // Soft-capped scores exist on mlxcel's attention kernel only, which then serves
            // `MLXCEL_KERNELS=mlx` too.
            let attended = if kn.backend == KernelBackend::Native || self.features.softcap.is_some()
            {
                let (keys, values) = seq.cache.append(index, &ki, &vi, n as usize)?;
                let len = seq.cache.len() + n as usize;
                attention_native_tokens_major(
                    &qi,
                    &keys,
                    &values,
                    len,
                    self.attention_scale,
                    n > 1,
                    layer.attention.window,
                    self.features.softcap,
                    kn.isa,
                    kn.threads,
                )?
            } else {
                let (keys, values) = seq.cache.append(index, &ki, &vi, n as usize)?;
                // MLX's attention takes one dtype: f16 caches are widened (exactly) for it.
                let widen = |a: Array| -> Result<Array> {
                    if a.dtype() == Dtype::F32 {
                        Ok(a)
                    } else {
                        a.astype(Dtype::F32)
                    }
                };
                let (keys, values) = (widen(keys)?, widen(values)?);
                let window_mask = layer
                    .attention
                    .window
                    .map(|w| window_mask(position as usize, n as usize, w))
                    .transpose()?;
                let mask = match &window_mask {
                    Some(m) => AttentionMask::Array(m),
                    None if n > 1 => AttentionMask::Causal,
                    None => AttentionMask::None,
                };
                scaled_dot_product_attention(&qi, &keys, &values, self.attention_scale, mask)?
                    .transpose(&[0, 2, 1, 3])?
                    .reshape(&[n, heads * head_dim])?
            };
            outputs.push(attended);
            row += n;
        }
        let attended = match outputs.as_slice() {
            [one] => one.clone(),
            many => Array::concatenate(&many.iter().collect::<Vec<_>>(), 0)?,
        };
        let activation = self.features.activation;
        match &layer.sandwich {
            None => {
                x = layer.o.forward_add(&attended, &x, kn)?;
                let gated = layer.gate_up.forward_normed(
                    &x,
                    &layer.post_norm,
                    c.rms_norm_eps,
                    activation,
                    kn,
                )?;
                x = layer.down.forward_add(&gated, &x, kn)?;
            }
            Some((post_attention, post_feedforward)) => {
                let out = layer.o.forward(&attended, kn)?;
                x = x.add(&rms_norm(&out, post_attention, c.rms_norm_eps)?)?;
                let gated = layer.gate_up.forward_normed(
                    &x,
                    &layer.post_norm,
                    c.rms_norm_eps,
                    activation,
                    kn,
                )?;
                let out = layer.down.forward(&gated, kn)?;
                x = x.add(&rms_norm(&out, post_feedforward, c.rms_norm_eps)?)?;
            }
        }
        Ok(x)
    }
}

fn linear_arrays<'a>(linear: &'a Linear, arrays: &mut Vec<&'a Array>) {
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

/// The additive mask (`0` keeps, `-inf` drops) of `n` queries at positions `position..` over the
/// `position + n` keys of their cache, causal and within a sliding `window`.
fn window_mask(position: usize, n: usize, window: usize) -> Result<Array> {
    let keys = position + n;
    let mut mask = vec![f32::NEG_INFINITY; n * keys];
    for i in 0..n {
        let query = position + i;
        let first = (query + 1).saturating_sub(window);
        mask[i * keys + first..=i * keys + query].fill(0.0);
    }
    Array::from_f32(&mask, &[n as i32, keys as i32])
}

/// A layer's q, k and v projections of the step's tokens: stacked side by side, or three.
enum Projections {
    Stacked(Array),
    Separate(Array, Array, Array),
}

/// `1 / period` per rotated pair: `base^(-2i/dims)` (computed in f64, rounded once) or the
/// reciprocal of llama3's custom periods.
fn inverse_frequencies(rope: &Rope) -> Result<Array> {
    let half = rope.dims / 2;
    let values: Vec<f32> = match &rope.frequencies {
        RopeFrequencies::Base(base) => (0..half)
            .map(|i| (*base as f64).powf(-2.0 * i as f64 / rope.dims as f64) as f32)
            .collect(),
        RopeFrequencies::Custom(periods) => periods.to_vec_f32()?.iter().map(|p| 1.0 / p).collect(),
    };
    Array::from_f32(&values, &[half])
}

/// RoPE in the Hugging Face (non-interleaved) layout, with llama3 frequency scaling if configured.
fn rope_for(config: &ModelConfig) -> Result<Rope> {
    let dims = config.rotary_dim;
    // The plain schedule is MLX's `base` form; scaled schedules pass the model's periods.
    let frequencies = match config.rope_scaling {
        None if config.rope_factors.is_none() => RopeFrequencies::Base(config.rope_theta),
        None => {
            let periods = config.rope_periods();
            RopeFrequencies::Custom(Array::from_f32(&periods, &[periods.len() as i32])?)
        }
        Some(_) => {
            let periods = config.rope_periods();
            RopeFrequencies::Custom(Array::from_f32(&periods, &[periods.len() as i32])?)
        }
    };
    Ok(Rope {
        dims: dims as i32,
        traditional: false,
        scale: 1.0,
        frequencies,
    })
}

/// Reads tensors out of a checkpoint into MLX arrays.
struct Loader<'a> {
    checkpoint: &'a Checkpoint,
    /// Norm weights are stored as offsets from one (Gemma): [`Loader::norm`] adds it.
    norm_offset: bool,
    keep_f16_scales: bool,
    /// Quantized weights go straight into the compact int8 layout, written on this many
    /// threads from the blocks of a GGUF file when the checkpoint is read from one.
    int8_from_blocks: Option<usize>,
}

impl Loader<'_> {
    /// `modules`' weights stacked (rows in order) in the compact int8 layout, written straight
    /// from the GGUF blocks they are read from ([`QuantizedWeight::int8_from_gguf_blocks`]);
    /// `None` when the kernels take another layout, a weight is not read from GGUF blocks, or
    /// the blocks cannot be written so (the caller loads the general way).
    fn int8_stack(&self, modules: &[&str]) -> Result<Option<QuantizedWeight>> {
        let Some(threads) = self.int8_from_blocks else {
            return Ok(None);
        };
        let names: Vec<String> = modules.iter().map(|m| format!("{m}.weight")).collect();
        let Some(parts) = names
            .iter()
            .map(|name| self.checkpoint.gguf_blocks(name))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        let weight = QuantizedWeight::int8_from_gguf_blocks(&parts, threads)?;
        if weight.is_some() {
            for name in &names {
                self.checkpoint.release_gguf_blocks(name);
            }
        }
        Ok(weight)
    }

    fn view(&self, name: &str) -> Result<TensorView<'_>> {
        self.checkpoint
            .tensor(name)
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_owned(),
            })
    }

    fn raw(&self, name: &str) -> Result<Array> {
        let view = self.view(name)?;
        let dtype = match view.dtype {
            mlxcel_model::Dtype::F32 => Dtype::F32,
            mlxcel_model::Dtype::F16 => Dtype::F16,
            mlxcel_model::Dtype::BF16 => Dtype::BF16,
            mlxcel_model::Dtype::U32 => Dtype::U32,
            mlxcel_model::Dtype::Other(other) => {
                return Err(Error::UnsupportedTensor {
                    name: name.to_owned(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        let shape: Vec<i32> = view.shape.iter().map(|&d| d as i32).collect();
        let array = Array::from_bytes(view.data, &shape, dtype)?;
        // Copied: the mapped or converted bytes are not needed again (the load's peak is then
        // the arrays).
        // SAFETY: `view` is not read after this (the array holds a copy of its bytes).
        unsafe { self.checkpoint.release_tensor(name) };
        Ok(array)
    }

    /// A tensor widened to f32.
    fn float(&self, name: &str) -> Result<Array> {
        let array = self.raw(name)?;
        if array.dtype() == Dtype::F32 {
            Ok(array)
        } else {
            array.astype(Dtype::F32)
        }
    }

    /// An RMSNorm weight as the norm multiplies by it: `1 + w` for offset norms (in f32, as
    /// mlx-lm and Hugging Face compute it), else `w`.
    fn norm(&self, name: &str) -> Result<Array> {
        let w = self.float(name)?;
        if self.norm_offset {
            w.add(&Array::scalar_f32(1.0))
        } else {
            Ok(w)
        }
    }

    /// Quantization scales or biases: f16 as stored when the kernels take it, else f32.
    fn scales(&self, name: &str) -> Result<Array> {
        let array = self.raw(name)?;
        match array.dtype() {
            Dtype::F16 if self.keep_f16_scales => Ok(array),
            Dtype::F32 => Ok(array),
            _ => array.astype(Dtype::F32),
        }
    }

    /// The module's quantized weight, if the checkpoint stores it quantized.
    fn quantized(&self, module: &str) -> Result<Option<QuantizedWeight>> {
        let Some(spec) = self.checkpoint.quantization_of(module) else {
            return Ok(None);
        };
        if self
            .checkpoint
            .tensor_info(&format!("{module}.scales"))
            .is_none()
        {
            return Ok(None);
        }
        Ok(Some(QuantizedWeight {
            weight: self.raw(&format!("{module}.weight"))?,
            scales: self.scales(&format!("{module}.scales"))?,
            biases: self.scales(&format!("{module}.biases"))?,
            group_size: spec.group_size as i32,
            bits: spec.bits as i32,
            int8: false,
        }))
    }

    fn linear(&self, module: &str, has_bias: bool) -> Result<Linear> {
        let bias = if has_bias {
            Some(self.float(&format!("{module}.bias"))?)
        } else {
            None
        };
        if let Some(weight) = self.int8_stack(&[module])? {
            return Ok(Linear::Quantized { weight, bias });
        }
        Ok(match self.quantized(module)? {
            Some(weight) => Linear::Quantized { weight, bias },
            None => Linear::Dense {
                weight_t: self
                    .float(&format!("{module}.weight"))?
                    .transpose(&[1, 0])?,
                bias,
            },
        })
    }
}
