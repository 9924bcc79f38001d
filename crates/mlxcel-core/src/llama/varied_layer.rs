//! Decoder layers that differ from one another in shape (Gemma 4's released models,
//! [`ModelConfig::has_varied_layers`]): each layer has its own head size (the full layers' may
//! be larger), the last layers may attend over an earlier layer's keys and values instead of
//! computing their own ([`ModelConfig::kv_source`]), and each may add its per-layer token input
//! after the MLP (`per_layer_inputs.rs`). Gemma's four norms, per-head q/k norms and the v norm
//! are part of every such layer. They run as a per-op graph.

use mlxcel_model::{HiddenActivation, ModelConfig};

use super::linear::{Linear, linear_arrays};
use super::per_layer_inputs::{PerLayerGate, PerLayerInputs, layer_part};
use super::weights::{Embedding, Mlp};
use super::window::window_mask;
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::fast::{
    AttentionMask, Rope, Scores, attention_native_scored, rms_norm, scaled_dot_product_attention,
};
use crate::kernels::{KernelBackend, Kernels};
use crate::kv_cache::KvCache;

/// Where a varied layer's weights come from: the checkpoint loader (`load.rs`), read through
/// this so that loading stays in one place.
pub(super) trait WeightSource {
    /// `{module}.weight` (quantized or dense, no bias) as a linear layer.
    fn linear(&self, module: &str) -> Result<Linear>;
    /// An RMSNorm weight as the norm multiplies by it.
    fn norm(&self, name: &str) -> Result<Array>;
    /// A tensor widened to f32.
    fn float(&self, name: &str) -> Result<Array>;
    /// `{module}` as an embedding table (quantized or dense).
    fn embedding(&self, module: &str) -> Result<Embedding>;
    /// Layer `layer`'s feed-forward block.
    fn mlp(&self, config: &ModelConfig, layer: usize) -> Result<Mlp>;
}

/// What a varied layer's step reads of the model beside its own weights.
pub(super) struct StepContext<'a> {
    pub(super) config: &'a ModelConfig,
    pub(super) kernels: &'a Kernels,
    /// The full layers' RoPE.
    pub(super) rope: &'a Rope,
    /// The sliding layers' RoPE, when the model rotates them with a base of their own.
    pub(super) local_rope: Option<&'a Rope>,
    pub(super) attention_scale: f32,
    pub(super) activation: HiddenActivation,
}

/// The model's varied layers and its per-layer inputs, if any.
#[derive(Debug)]
pub(super) struct VariedLayers {
    /// The stage's decoder layers, in order.
    pub(super) layers: Vec<VariedLayer>,
    pub(super) inputs: Option<PerLayerInputs>,
}

/// A layer's own k and v projections and k norm (absent on a layer that reuses another's).
#[derive(Debug)]
pub(super) struct OwnKv {
    k: Linear,
    /// `None` where the values are the keys' projection (`keys_as_values`).
    v: Option<Linear>,
    k_norm: Array,
}

/// One decoder layer with Gemma's four norms, per-head q/k norms, and a head of its own size.
#[derive(Debug)]
pub(super) struct VariedLayer {
    /// The model's index of the layer (its part of the per-layer inputs).
    index: usize,
    input_norm: Array,
    q: Linear,
    q_norm: Array,
    kv: Option<OwnKv>,
    o: Linear,
    post_attention_norm: Array,
    pre_feedforward_norm: Array,
    post_feedforward_norm: Array,
    mlp: Mlp,
    per_layer: Option<PerLayerGate>,
    /// `layer_scalar`, when the model has them.
    scalar: Option<Array>,
    /// Ones of `[head_dim]` when each head of v is RMS-normed without weights.
    value_norm: Option<Array>,
    head_dim: usize,
    kv_heads: usize,
    window: Option<usize>,
    /// The cache layer the layer writes (its own keys and values) or reads (another's).
    cache_layer: usize,
    /// Rotates with the model's local RoPE (a sliding layer of a model that has one).
    local_rope: bool,
}

impl VariedLayers {
    /// Loads the stage's layers `first..end` (the whole model: a stage boundary could fall
    /// between a layer and the layer whose keys and values it reads), and the per-layer inputs.
    pub(super) fn load(
        loader: &impl WeightSource,
        config: &ModelConfig,
        kernels: &Kernels,
        (first, end): (usize, usize),
        embeds: bool,
    ) -> Result<Self> {
        if first != 0 || end != config.num_hidden_layers || !embeds {
            return Err(Error::Mlx {
                op: "pipeline stage",
                message: "a model whose layers reuse earlier layers' keys and values, or take \
                          per-layer token inputs (Gemma 4), runs in one process: it cannot be \
                          split into pipeline stages"
                    .into(),
            });
        }
        if !config.sandwich_norms || !config.qk_norm || config.qk_norm_whole {
            return Err(Error::Mlx {
                op: "load",
                message: "layers of varied head sizes, shared keys and values or per-layer \
                          inputs are built with Gemma's four norms and per-head q/k norms, which \
                          this config does not have"
                    .into(),
            });
        }
        let layers = (0..config.num_hidden_layers)
            .map(|i| load_layer(loader, config, kernels, i))
            .collect::<Result<Vec<_>>>()?;
        let inputs = match config.per_layer_input {
            Some(spec) => {
                let table = loader.embedding("model.embed_tokens_per_layer")?;
                let mut projection = loader.linear("model.per_layer_model_projection")?;
                if kernels.int8_layout_weights() {
                    projection.interleave_int8(kernels.int8_layout, kernels.threads)?;
                }
                Some(PerLayerInputs {
                    table,
                    projection,
                    norm: loader.norm("model.per_layer_projection_norm.weight")?,
                    spec,
                    layers: config.num_hidden_layers,
                })
            }
            None => None,
        };
        Ok(Self { layers, inputs })
    }

    /// Every array held, pushed onto `arrays`.
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        for layer in &self.layers {
            arrays.extend([
                &layer.input_norm,
                &layer.q_norm,
                &layer.post_attention_norm,
                &layer.pre_feedforward_norm,
                &layer.post_feedforward_norm,
            ]);
            arrays.extend(&layer.scalar);
            arrays.extend(&layer.value_norm);
            linear_arrays(&layer.q, arrays);
            linear_arrays(&layer.o, arrays);
            if let Some(own) = &layer.kv {
                linear_arrays(&own.k, arrays);
                if let Some(v) = &own.v {
                    linear_arrays(v, arrays);
                }
                arrays.push(&own.k_norm);
            }
            layer.mlp.arrays(arrays);
            if let Some(gate) = &layer.per_layer {
                gate.arrays(arrays);
            }
        }
        if let Some(inputs) = &self.inputs {
            inputs.arrays(arrays);
        }
    }

    /// Bytes of the per-layer input table, of which a token reads one row.
    pub(super) fn table_bytes(&self) -> u64 {
        let Some(inputs) = &self.inputs else {
            return 0;
        };
        let arrays: Vec<&Array> = match &inputs.table {
            Embedding::Dense(table) => vec![table],
            Embedding::Quantized(q) => vec![&q.weight, &q.scales, &q.biases],
        };
        arrays
            .iter()
            .map(|a| (a.size() * a.dtype().size_in_bytes()) as u64)
            .sum()
    }
}

/// Layer `i`: its projections (q always; k, v and the k norm unless it reuses another layer's
/// keys and values), its norms, its MLP and its per-layer gate, rewritten for the int8 kernels
/// when they take that layout.
fn load_layer(
    loader: &impl WeightSource,
    config: &ModelConfig,
    kernels: &Kernels,
    i: usize,
) -> Result<VariedLayer> {
    let p = format!("model.layers.{i}");
    let a = format!("{p}.self_attn");
    let head_dim = config.layer_head_dim(i);
    let kv = match config.kv_source(i) {
        Some(_) => None,
        None => Some(OwnKv {
            k: loader.linear(&format!("{a}.k_proj"))?,
            v: if config.layer_keys_as_values(i) {
                None
            } else {
                Some(loader.linear(&format!("{a}.v_proj"))?)
            },
            k_norm: loader.norm(&format!("{a}.k_norm.weight"))?,
        }),
    };
    // Cache layers are the layers that hold keys and values, in order.
    let source = config.kv_source(i).unwrap_or(i);
    let cache_layer = (0..source).filter(|&j| config.holds_kv(j)).count();
    let per_layer = match config.per_layer_input {
        Some(_) => Some(PerLayerGate {
            gate: loader.linear(&format!("{p}.per_layer_input_gate"))?,
            projection: loader.linear(&format!("{p}.per_layer_projection"))?,
            norm: loader.norm(&format!("{p}.post_per_layer_input_norm.weight"))?,
        }),
        None => None,
    };
    let window = config.layers[i].window;
    let mut layer = VariedLayer {
        index: i,
        input_norm: loader.norm(&format!("{p}.input_layernorm.weight"))?,
        q: loader.linear(&format!("{a}.q_proj"))?,
        q_norm: loader.norm(&format!("{a}.q_norm.weight"))?,
        kv,
        o: loader.linear(&format!("{a}.o_proj"))?,
        post_attention_norm: loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        pre_feedforward_norm: loader.norm(&format!("{p}.pre_feedforward_layernorm.weight"))?,
        post_feedforward_norm: loader.norm(&format!("{p}.post_feedforward_layernorm.weight"))?,
        mlp: loader.mlp(config, i)?,
        per_layer,
        scalar: if config.layer_scalars {
            Some(loader.float(&format!("{p}.layer_scalar"))?)
        } else {
            None
        },
        value_norm: if config.value_norm {
            Some(Array::from_f32(&vec![1.0; head_dim], &[head_dim as i32])?)
        } else {
            None
        },
        head_dim,
        kv_heads: config.layer_kv_heads(i),
        window,
        cache_layer,
        local_rope: config.has_local_rope() && window.is_some(),
    };
    if kernels.int8_layout_weights() {
        let (layout, threads) = (kernels.int8_layout, kernels.threads);
        let mut linears = vec![&mut layer.q, &mut layer.o];
        if let Some(own) = &mut layer.kv {
            linears.push(&mut own.k);
            linears.extend(own.v.as_mut());
        }
        if let Some(gate) = &mut layer.per_layer {
            linears.extend([&mut gate.gate, &mut gate.projection]);
        }
        for linear in linears {
            linear.interleave_int8(layout, threads)?;
        }
        match &mut layer.mlp {
            Mlp::Dense { gate_up, down } => {
                gate_up.interleave_int8(layout, threads)?;
                down.interleave_int8(layout, threads)?;
            }
            Mlp::Routed(moe) => moe.interleave_int8(layout, threads)?,
        }
    }
    if let Mlp::Routed(moe) = &mut layer.mlp {
        moe.prepare_node(kernels)?;
    }
    Ok(layer)
}

impl VariedLayers {
    /// The step's per-layer token inputs (`[tokens, layers, hidden]`), when the model has them:
    /// from the step's tokens `ids` (every sequence's, in order) and their scaled embeddings `x`.
    pub(super) fn per_layer_inputs(
        &self,
        ids: &[u32],
        x: &Array,
        cx: &StepContext<'_>,
    ) -> Result<Option<Array>> {
        let Some(inputs) = &self.inputs else {
            return Ok(None);
        };
        let c = cx.config;
        inputs
            .compute(ids, x, c.hidden_size, c.rms_norm_eps, cx.kernels)
            .map(Some)
    }

    /// Layer `index` over `x` (the step's rows in sequence order; `parts`: each sequence's
    /// cache and its number of rows): attention with the layer's own head size over its own or
    /// another layer's keys and values, the MLP, the per-layer input's gate, the layer scalar.
    pub(super) fn step(
        &self,
        index: usize,
        mut x: Array,
        parts: &mut [(&mut KvCache, usize)],
        per_layer_inputs: Option<&Array>,
        cx: &StepContext<'_>,
    ) -> Result<Array> {
        let layer = self.layers.get(index).ok_or_else(|| Error::Mlx {
            op: "varied layer",
            message: format!("the model has no varied layer {index}"),
        })?;
        let (c, kn) = (cx.config, cx.kernels);
        let eps = c.rms_norm_eps;
        let (heads, kv_heads, d) = (
            c.num_attention_heads as i32,
            layer.kv_heads as i32,
            layer.head_dim as i32,
        );
        let h = rms_norm(&x, &layer.input_norm, eps)?;
        let q_all = layer.q.forward(&h, kn)?;
        let kv_all = match &layer.kv {
            Some(own) => {
                let k = own.k.forward(&h, kn)?;
                let v = match &own.v {
                    Some(v) => v.forward(&h, kn)?,
                    None => k.clone(),
                };
                Some((k, v))
            }
            None => None,
        };
        let rope = match (cx.local_rope, layer.local_rope) {
            (Some(local), true) => local,
            _ => cx.rope,
        };
        let mut outputs = Vec::with_capacity(parts.len());
        let mut row = 0i32;
        for (cache, rows) in parts.iter_mut() {
            let n = *rows as i32;
            let position = cache.len();
            let heads_first = |m: &Array, count: i32| -> Result<Array> {
                m.slice(&[row, 0], &[row + n, count * d])?
                    .reshape(&[1, n, count, d])?
                    .transpose(&[0, 2, 1, 3])
            };
            let q = rms_norm(&heads_first(&q_all, heads)?, &layer.q_norm, eps)?;
            let q = rope.apply(&q, position as i32)?;
            let (keys, values) = match (&kv_all, &layer.kv) {
                (Some((k, v)), Some(own)) => {
                    let k = rms_norm(&heads_first(k, kv_heads)?, &own.k_norm, eps)?;
                    let k = rope.apply(&k, position as i32)?;
                    let v = heads_first(v, kv_heads)?;
                    let v = match &layer.value_norm {
                        Some(ones) => rms_norm(&v, ones, eps)?,
                        None => v,
                    };
                    cache.append(layer.cache_layer, &k, &v, n as usize)?
                }
                // The earlier layer wrote this step's positions already.
                _ => cache.fetch(layer.cache_layer, position + n as usize)?,
            };
            outputs.push(layer.attend(&q, keys, values, position, n, cx)?);
            row += n;
        }
        let attended = match outputs.as_slice() {
            [one] => one.clone(),
            many => Array::concatenate(&many.iter().collect::<Vec<_>>(), 0)?,
        };
        let out = layer.o.forward(&attended, kn)?;
        x = x.add(&rms_norm(&out, &layer.post_attention_norm, eps)?)?;
        let out = match &layer.mlp {
            Mlp::Dense { gate_up, down } => {
                let gated = gate_up.forward_normed(
                    &x,
                    &layer.pre_feedforward_norm,
                    eps,
                    cx.activation,
                    kn,
                )?;
                down.forward(&gated, kn)?
            }
            Mlp::Routed(moe) => moe.forward(&x, &layer.pre_feedforward_norm, eps, kn)?,
        };
        x = x.add(&rms_norm(&out, &layer.post_feedforward_norm, eps)?)?;
        if let (Some(gate), Some(inputs)) = (&layer.per_layer, per_layer_inputs) {
            x = gate.apply(&x, &layer_part(inputs, layer.index)?, eps, kn)?;
        }
        if let Some(scalar) = &layer.scalar {
            x = x.multiply(scalar)?;
        }
        Ok(x)
    }
}

impl VariedLayer {
    /// One sequence's attention of `q` (`[1, heads, n, head_dim]`, at `position..`) over the
    /// `position + n` keys and values so far, as `[n, heads · head_dim]`.
    fn attend(
        &self,
        q: &Array,
        keys: Array,
        values: Array,
        position: usize,
        n: i32,
        cx: &StepContext<'_>,
    ) -> Result<Array> {
        let kn = cx.kernels;
        let heads = cx.config.num_attention_heads as i32;
        if kn.backend == KernelBackend::Native {
            let scores = Scores {
                scale: cx.attention_scale,
                causal: n > 1,
                window: self.window,
                softcap: None,
                sinks: &[],
            };
            return attention_native_scored(
                q,
                &keys,
                &values,
                position + n as usize,
                scores,
                kn.isa,
                kn.threads,
            );
        }
        // MLX's attention takes one dtype: f16 caches are widened (exactly) for it.
        let widen = |a: Array| -> Result<Array> {
            if a.dtype() == Dtype::F32 {
                Ok(a)
            } else {
                a.astype(Dtype::F32)
            }
        };
        let (keys, values) = (widen(keys)?, widen(values)?);
        let window_mask = self
            .window
            .map(|w| window_mask(position, n as usize, w))
            .transpose()?;
        let mask = match &window_mask {
            Some(m) => AttentionMask::Array(m),
            None if n > 1 => AttentionMask::Causal,
            None => AttentionMask::None,
        };
        scaled_dot_product_attention(q, &keys, &values, cx.attention_scale, mask)?
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[n, heads * self.head_dim as i32])
    }
}
