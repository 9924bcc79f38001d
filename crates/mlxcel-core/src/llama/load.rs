//! Loading: reads a checkpoint's tensors into MLX arrays and packs them into the layout the
//! kernels read (q/k/v and gate/up stacked, int8 rewrites), one decoder layer at a time
//! ([`load_decoder_layer`]), then the RoPE tables.

use mlxcel_model::{
    Checkpoint, FeedForward, GatedDeltaNet, ModelConfig, RoutedExperts, Routing, ShortConv,
    TensorView,
};

use super::delta_net::{DeltaNet, LinearLayer};
use super::experts::{Expert, ParallelDense, RoutedMlp};
use super::linear::{GateUp, Linear, prepare_in_place};
use super::model::{LayerRef, LlamaModel};
use super::routing::Router;
use super::short_conv::ConvLayer;
use super::stage::Stage;
use super::varied_layer::{VariedLayers, WeightSource};
use super::weights::{Embedding, Layer, LayerFeatures, Mlp, QkvWeights};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::fast::{Rope, RopeFrequencies};
use crate::kernels::{Int8Layout, KernelBackend, Kernels, Matrix};
use crate::kv_cache::KvType;
use crate::layout_cache::LayoutCache;
use crate::quantized::QuantizedWeight;
use crate::sys::copy_tensor_then_release;

impl LlamaModel {
    /// Builds the model from a validated checkpoint, copying each tensor once into MLX memory.
    /// Dense weights are widened to f32; quantized weights stay packed, with f32 scales and biases.
    /// The kernels come from the environment ([`Kernels::from_env`]).
    pub fn load(checkpoint: &Checkpoint) -> Result<Self> {
        Self::load_with(checkpoint, Kernels::from_env()?)
    }

    /// [`LlamaModel::load`] with an explicit choice of kernels.
    pub fn load_with(checkpoint: &Checkpoint, kernels: Kernels) -> Result<Self> {
        let stage = Stage::whole(checkpoint.config());
        Self::load_stage(checkpoint, kernels, stage)
    }

    /// The part of the model one pipeline stage holds ([`Stage`]): its decoder layers, plus the
    /// embedding, the final norm and the output projection where the stage says. Only those
    /// tensors are read from the checkpoint (the rest of a mapped file is never touched, and
    /// no other tensor of a GGUF file is converted).
    pub fn load_stage(checkpoint: &Checkpoint, kernels: Kernels, stage: Stage) -> Result<Self> {
        let config = checkpoint.config().clone();
        stage.check(&config)?;
        let int8_from_blocks = (kernels.int8_layout_weights()
            && kernels.int8_layout == Int8Layout::Compact)
            .then_some(kernels.threads);
        // The layout those weights take, mapped from the prepared directory when an earlier
        // load kept it there (`layout_cache`): only for a checkpoint read from a GGUF file.
        let cache = if int8_from_blocks.is_some() && checkpoint.is_from_gguf() {
            LayoutCache::open(checkpoint.dir(), &stage.cache_name(&config))?
        } else {
            LayoutCache::off()
        };
        let loader = Loader {
            checkpoint,
            norm_offset: config.norm_weight_offset,
            // mlxcel's kernels read f16 scales and biases as stored (fewer bytes per weight to
            // stream); MLX's quantized_matmul wants them in the activations' dtype.
            keep_f16_scales: kernels.backend == KernelBackend::Native,
            int8_from_blocks,
            cache,
        };
        // The table in the int8 layout, straight from a GGUF file's blocks when the kernels
        // take that layout and it is read from one: its lookups read rows back exactly
        // (`int8_rows`), and a tied table serves the output projection too. Otherwise a tied
        // table is interleaved below; an untied one stays in MLX's layout.
        let embed = if stage.embeds || (stage.head && config.tie_word_embeddings) {
            Some(match loader.int8_stack(&["model.embed_tokens"])? {
                Some(q) => Embedding::Quantized(q),
                None => match loader.quantized("model.embed_tokens")? {
                    Some(q) => Embedding::Quantized(q),
                    None => Embedding::Dense(loader.float("model.embed_tokens.weight")?),
                },
            })
        } else {
            None
        };
        // A stage holds the model's layers `first..end` in the model's order; `layers`,
        // `linear_layers` and `order` index the stage's own, so a sequence's cache (keys and
        // values, recurrent state) covers exactly the layers this process runs.
        let (mut layers, mut linear_layers, mut order) = (Vec::new(), Vec::new(), Vec::new());
        let mut conv_layers = Vec::new();
        // Layers of varied shapes (Gemma 4's released models) are built apart.
        let varied = if config.has_varied_layers() {
            let range = (stage.first, stage.end);
            let varied = VariedLayers::load(&loader, &config, &kernels, range, stage.embeds)?;
            order.extend((0..varied.layers.len()).map(LayerRef::Varied));
            Some(varied)
        } else {
            None
        };
        for i in (stage.first..stage.end).filter(|_| varied.is_none()) {
            if let Some(spec) = config.layers[i].conv {
                order.push(LayerRef::Conv(conv_layers.len()));
                conv_layers.push(load_conv_layer(&loader, &config, &kernels, i, spec)?);
                continue;
            }
            match config.layers[i].linear {
                Some(spec) => {
                    order.push(LayerRef::Linear(linear_layers.len()));
                    linear_layers.push(load_linear_layer(&loader, &config, &kernels, i, spec)?);
                }
                None => {
                    order.push(LayerRef::Attention(layers.len()));
                    layers.push(load_decoder_layer(&loader, &config, &kernels, i)?);
                }
            }
        }
        let norm = if stage.norm {
            Some(loader.norm("model.norm.weight")?)
        } else {
            None
        };
        let mut lm_head = if config.tie_word_embeddings || !stage.head {
            None
        } else {
            Some(loader.linear("lm_head", false)?)
        };
        let mut embed = embed;
        let head_activations = kernels.matrix_activations(Matrix::Head);
        if let Some(head) = &mut lm_head {
            head.prepare_for(&kernels, head_activations)?;
        }
        // A tied table: one copy in the int8 layout serves the projection and the lookups.
        if let (true, Some(Embedding::Quantized(table))) =
            (config.tie_word_embeddings && stage.head, &mut embed)
        {
            prepare_in_place(table, &kernels, head_activations)?;
        }
        let rope = rope_for(&config)?;
        let inv_freq = inverse_frequencies(&rope)?;
        let local_rope = match config.rope_local_theta {
            Some(base) if config.has_local_rope() => {
                let local = Rope {
                    dims: config.local_rotary_dim() as i32,
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
            linear_layers,
            conv_layers,
            varied,
            order,
            norm,
            lm_head,
            stage,
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
            adapters: Default::default(),
            control: Default::default(),
        };
        model.fusable = model.varied.is_none()
            && model
                .layers
                .iter()
                .all(|layer| layer.fusable(model.rope_of(layer).1, model.features));
        model.materialize()?;
        loader.cache.finish();
        // Loading read the checkpoint and, for int8, rewrote it: hand back what that freed.
        crate::device::release_unused_memory();
        Ok(model)
    }
}

/// Decoder layer `i` built from its weights: q/k/v stacked where they share a layout, the norms
/// the config's features call for, the MLP's gate and up stacked, and the whole layer rewritten
/// for the int8 kernels when they take that layout. The place a new kind of block is chosen from
/// the config.
fn load_decoder_layer(
    loader: &Loader<'_>,
    config: &ModelConfig,
    kernels: &Kernels,
    i: usize,
) -> Result<Layer> {
    let p = format!("model.layers.{i}");
    let qkv_bias = config.attention_qkv_bias;
    let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|m| format!("{p}.self_attn.{m}"));
    // A gated q projection (Qwen3-Next, Qwen3.5) gives each head its queries, then as many gate
    // values: cut into the queries, which then load as any q, and the output gate.
    let (mut gated_q, output_gate) = if config.attention_output_gate {
        let full = loader.linear_from(&q, qkv_bias, false)?;
        let d = config.head_dim as u32;
        let heads = config.num_attention_heads as u32;
        let rows = |offset: u32| -> Vec<u32> {
            (0..heads)
                .flat_map(|h| (0..d).map(move |i| 2 * d * h + offset + i))
                .collect()
        };
        (Some(full.rows(&rows(0))?), Some(full.rows(&rows(d))?))
    } else {
        (None, None)
    };
    let stacked = match gated_q {
        Some(_) => None,
        None => loader.int8_stack(&[&q, &k, &v])?,
    };
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
        let q = match gated_q.take() {
            Some(q) => q,
            None => loader.linear(&q, qkv_bias)?,
        };
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
                    (Some(bq), Some(bk), Some(bv)) => Array::concatenate(&[bq, bk, bv], 0)
                        .and_then(|b| b.astype(Dtype::F32))
                        .map(Some),
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
    let input_norm = loader.norm(&format!("{p}.input_layernorm.weight"))?;
    let o = loader.linear(&format!("{p}.self_attn.o_proj"), config.attention_out_bias)?;
    let mlp = load_mlp(loader, config, i)?;
    let mut layer = Layer {
        input_norm,
        qkv,
        qkv_bias,
        o,
        post_norm,
        sandwich,
        mlp,
        qk_norm_whole: config.qk_norm && config.qk_norm_whole,
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
        output_gate,
        value_norm: if config.value_norm {
            Some(Array::from_f32(
                &vec![1.0; config.head_dim],
                &[config.head_dim as i32],
            )?)
        } else {
            None
        },
        scalar: if config.layer_scalars {
            Some(loader.float(&format!("{p}.layer_scalar"))?)
        } else {
            None
        },
        sinks: if config.attention_sinks {
            Some(
                loader
                    .float(&format!("{p}.self_attn.sinks"))?
                    .to_vec_f32()?,
            )
        } else {
            None
        },
    };
    // Rewritten into the int8 layout as each layer loads (int8 activations, or f32
    // ones on AVX-512), so that the checkpoint's form of one layer at a time, not
    // of the whole model, sits beside the rewritten weights.
    layer.prepare_matrices(kernels)?;
    // The fused routed-expert node holds the experts in their final layout.
    if let Mlp::Routed(moe) = &mut layer.mlp {
        moe.prepare_node(kernels)?;
    }
    Ok(layer)
}

/// Layer `i`'s feed-forward block by its kind: where a new kind of block is loaded.
fn load_mlp(loader: &Loader<'_>, config: &ModelConfig, i: usize) -> Result<Mlp> {
    let p = format!("model.layers.{i}.mlp");
    Ok(match config.layer_spec(i).ffn {
        FeedForward::Dense { .. } => {
            let (gate_up, down) = loader.gated_mlp(&p)?;
            Mlp::Dense { gate_up, down }
        }
        FeedForward::RoutedExperts(moe) => {
            Mlp::Routed(Box::new(loader.routed(&p, config.hidden_size, &moe)?))
        }
    })
}

/// Linear-attention (gated DeltaNet) layer `i`: its norms and feed-forward block as any layer's,
/// its input and output projections as linear layers, and the small per-channel and per-head
/// tensors (convolution taps, decay rates, `dt_bias`, the gated norm's weight) on the host,
/// where its delta rule runs. The gated norm's weight is not zero-centred in any checkpoint.
fn load_linear_layer(
    loader: &Loader<'_>,
    config: &ModelConfig,
    kernels: &Kernels,
    i: usize,
    spec: GatedDeltaNet,
) -> Result<LinearLayer> {
    let p = format!("model.layers.{i}");
    let a = format!("{p}.linear_attn");
    let modules: &[&str] = if spec.fused_projections {
        &["in_proj_qkvz", "in_proj_ba"]
    } else {
        &["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
    };
    let names: Vec<String> = modules.iter().map(|m| format!("{a}.{m}")).collect();
    let projections = delta_projections(loader, kernels, &names)?;
    let host = |name: &str| loader.float(&format!("{a}.{name}"))?.to_vec_f32();
    let conv = host("conv1d.weight")?;
    if conv.len() != spec.conv_dim() * spec.conv_kernel {
        return Err(Error::Mlx {
            op: "conv1d",
            message: format!(
                "{a}.conv1d.weight holds {} values, expected {} channels of {} taps",
                conv.len(),
                spec.conv_dim(),
                spec.conv_kernel
            ),
        });
    }
    let mut layer = LinearLayer {
        input_norm: loader.norm(&format!("{p}.input_layernorm.weight"))?,
        post_norm: loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        mlp: load_mlp(loader, config, i)?,
        net: DeltaNet {
            spec,
            projections,
            conv,
            decay_rate: host("A_log")?.into_iter().map(f32::exp).collect(),
            dt_bias: host("dt_bias")?,
            norm: host("norm.weight")?,
            out: loader.linear(&format!("{a}.out_proj"), false)?,
        },
    };
    if kernels.int8_layout_weights() {
        let (layout, threads) = (kernels.int8_layout, kernels.threads);
        for linear in layer.net.projections.iter_mut() {
            linear.interleave_int8(layout, threads)?;
        }
        layer.net.out.interleave_int8(layout, threads)?;
    }
    prepare_host_layer_mlp(&mut layer.mlp, kernels)?;
    Ok(layer)
}

/// A linear-attention layer's input projections (`names`, in the order their outputs sit side
/// by side): stacked into one matrix when mlxcel's kernels run and all are quantized alike, so
/// that one matmul (one quantisation of the normed input, one tile loop) computes the same
/// columns four (or two) would; apart otherwise. Each output column is the same product either
/// way, so the stack changes no value; it is made only where every part would take the same
/// kernel alone (the int8 layout wants whole tiles of 16 rows: `in_proj_b` and `in_proj_a` of a
/// tiny model may have fewer, and then stay apart rather than switch kernels).
fn delta_projections(
    loader: &Loader<'_>,
    kernels: &Kernels,
    names: &[String],
) -> Result<Vec<Linear>> {
    let modules: Vec<&str> = names.iter().map(String::as_str).collect();
    let tile = QuantizedWeight::INT8_TILE_ROWS as usize;
    let whole_tiles = modules.iter().all(|m| {
        loader
            .checkpoint
            .gguf_blocks(&format!("{m}.weight"))
            .is_some_and(|b| b.rows.is_multiple_of(tile))
    });
    if whole_tiles && let Some(weight) = loader.int8_stack(&modules)? {
        return Ok(vec![Linear::Quantized { weight, bias: None }]);
    }
    let parts = modules
        .iter()
        .map(|m| loader.linear(m, false))
        .collect::<Result<Vec<_>>>()?;
    if kernels.backend != KernelBackend::Native {
        return Ok(parts);
    }
    let weights: Option<Vec<&QuantizedWeight>> = parts
        .iter()
        .map(|p| match p {
            Linear::Quantized { weight, bias: None } if !weight.int8 => Some(weight),
            _ => None,
        })
        .collect();
    let Some(weights) = weights else {
        return Ok(parts);
    };
    match QuantizedWeight::concat_rows(&weights) {
        Ok(weight)
            if weights
                .iter()
                .all(|w| w.int8_capable() == weight.int8_capable()) =>
        {
            Ok(vec![Linear::Quantized { weight, bias: None }])
        }
        _ => Ok(parts),
    }
}

/// Short-convolution layer `i` (LFM2): its norms and feed-forward block as any layer's, its
/// projections as linear layers, and its taps on the host, where its convolution runs.
fn load_conv_layer(
    loader: &Loader<'_>,
    config: &ModelConfig,
    kernels: &Kernels,
    i: usize,
    spec: ShortConv,
) -> Result<ConvLayer> {
    let p = format!("model.layers.{i}");
    let taps = loader
        .float(&format!("{p}.conv.conv.weight"))?
        .to_vec_f32()?;
    let channels = config.hidden_size;
    if taps.len() != channels * spec.kernel {
        return Err(Error::Mlx {
            op: "short conv",
            message: format!(
                "{p}.conv.conv.weight holds {} values, expected {channels} channels of {} taps",
                taps.len(),
                spec.kernel
            ),
        });
    }
    let mut layer = ConvLayer {
        input_norm: loader.norm(&format!("{p}.input_layernorm.weight"))?,
        post_norm: loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
        mlp: load_mlp(loader, config, i)?,
        in_proj: loader.linear(&format!("{p}.conv.in_proj"), false)?,
        taps,
        out: loader.linear(&format!("{p}.conv.out_proj"), false)?,
        channels,
        kernel: spec.kernel,
    };
    if kernels.int8_layout_weights() {
        let (layout, threads) = (kernels.int8_layout, kernels.threads);
        layer.in_proj.interleave_int8(layout, threads)?;
        layer.out.interleave_int8(layout, threads)?;
    }
    prepare_host_layer_mlp(&mut layer.mlp, kernels)?;
    Ok(layer)
}

/// The MLP of a layer whose mixer runs on the host (linear attention, short convolution): its
/// matrices rewritten into the int8 layout where the kernels take it, and a routed-expert MLP's
/// fused node prepared, as a decoder layer's (`load_decoder_layer`): without it such a layer
/// routed its tokens on the host and ran each expert as its own graph.
fn prepare_host_layer_mlp(mlp: &mut Mlp, kernels: &Kernels) -> Result<()> {
    if kernels.int8_layout_weights() {
        let (layout, threads) = (kernels.int8_layout, kernels.threads);
        match mlp {
            Mlp::Dense { gate_up, down } => {
                gate_up.interleave_int8(layout, threads)?;
                down.interleave_int8(layout, threads)?;
            }
            Mlp::Routed(moe) => moe.interleave_int8(layout, threads)?,
        }
    }
    if let Mlp::Routed(moe) = mlp {
        moe.prepare_node(kernels)?;
    }
    Ok(())
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
    /// Those weights as an earlier load kept them, or the file this load keeps them in.
    cache: LayoutCache,
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
        let key = modules.join("+");
        let weight = match self.cache.get(&key, |w| w.is_int8_layout_of(&parts))? {
            Some(cached) => Some(cached),
            None => {
                let place = self.cache.place();
                let built = QuantizedWeight::int8_from_gguf_blocks_in(&parts, threads, &place)?;
                if let Some(w) = &built {
                    self.cache.record(&key, w)?;
                }
                built
            }
        };
        if weight.is_some() {
            for name in &names {
                self.checkpoint.release_gguf_blocks(name);
            }
        }
        Ok(weight)
    }

    fn raw(&self, name: &str) -> Result<Array> {
        // Copied, then the mapped or converted bytes let go: they are not needed again (the
        // load's peak is then the arrays).
        copy_tensor_then_release(self.checkpoint, name, |view| Self::copy(name, view))
            .unwrap_or_else(|| {
                Err(Error::MissingTensor {
                    name: name.to_owned(),
                })
            })
    }

    /// The tensor `view` (called `name`) copied into an MLX array of its own dtype.
    fn copy(name: &str, view: TensorView<'_>) -> Result<Array> {
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
        Array::from_bytes(view.data, &shape, dtype)
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
            activations: None,
        }))
    }

    /// The gated MLP under `prefix` (`{prefix}.gate_proj`, `up_proj`, `down_proj`): gate and up
    /// stacked where they share a layout, and down.
    fn gated_mlp(&self, prefix: &str) -> Result<(GateUp, Linear)> {
        let [gate, up] = ["gate_proj", "up_proj"].map(|m| format!("{prefix}.{m}"));
        let gate_up = match self.int8_stack(&[&gate, &up])? {
            Some(w) => GateUp::Stacked(w),
            None => GateUp::new(self.linear(&gate, false)?, self.linear(&up, false)?)?,
        };
        Ok((gate_up, self.linear(&format!("{prefix}.down_proj"), false)?))
    }

    /// The routed-expert MLP under `prefix`: the router (`gate`, in f32 on the host, with
    /// `shared_expert_gate`'s row after the experts' when there is a shared expert, and its
    /// bias when the block has biases), every expert's gated MLP (`experts.{j}`, its three
    /// projections apart when they have biases) and the shared expert's, each loaded as a dense
    /// layer's MLP is (so every weight format the dense MLP takes, experts take).
    fn routed(&self, prefix: &str, hidden: usize, moe: &RoutedExperts) -> Result<RoutedMlp> {
        let mut weights = self.matrix_f32(&format!("{prefix}.gate"))?;
        let bias = if moe.biases {
            Some(self.float(&format!("{prefix}.gate.bias"))?.to_vec_f32()?)
        } else {
            None
        };
        let experts = (0..moe.num_experts)
            .map(|j| {
                let e = format!("{prefix}.experts.{j}");
                if !moe.biases {
                    let (gate_up, down) = self.gated_mlp(&e)?;
                    return Ok(Expert { gate_up, down });
                }
                // Biased projections stay apart: each adds its own bias after its product.
                let [gate, up, down] = ["gate_proj", "up_proj", "down_proj"]
                    .map(|m| self.linear(&format!("{e}.{m}"), true));
                Ok(Expert {
                    gate_up: GateUp::Separate {
                        gate: gate?,
                        up: up?,
                    },
                    down: down?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match moe.shared_expert_intermediate_size {
            Some(_) => {
                weights.extend(self.matrix_f32(&format!("{prefix}.shared_expert_gate"))?);
                let (gate_up, down) = self.gated_mlp(&format!("{prefix}.shared_expert"))?;
                Some(Expert { gate_up, down })
            }
            None => None,
        };
        let selection_bias = match moe.routing {
            Routing::SigmoidTopK {
                selection_bias: true,
                ..
            } => Some(self.float(&format!("{prefix}.expert_bias"))?.to_vec_f32()?),
            _ => None,
        };
        let (parallel, expert_scales) = match moe.parallel_dense {
            Some(_) => {
                let (parallel, scales) = self.parallel_dense(prefix, hidden, moe)?;
                (Some(parallel), Some(scales))
            }
            None => (None, None),
        };
        let rows = moe.num_experts + usize::from(shared.is_some());
        if weights.len() != rows * hidden
            || bias.as_ref().is_some_and(|b| b.len() != moe.num_experts)
            || selection_bias
                .as_ref()
                .is_some_and(|b| b.len() != moe.num_experts)
        {
            return Err(Error::Mlx {
                op: "routed experts",
                message: format!(
                    "{prefix}.gate (and shared_expert_gate) hold {} values, expected {rows} rows \
                     of {hidden} (and a bias of {} values)",
                    weights.len(),
                    moe.num_experts
                ),
            });
        }
        Ok(RoutedMlp {
            router: Router {
                weights,
                hidden,
                num_experts: moe.num_experts,
                top_k: moe.top_k,
                routing: moe.routing,
                shared_gate: shared.is_some(),
                bias,
                selection_bias,
                expert_scales,
            },
            experts,
            shared,
            activation: moe.activation,
            node: None,
            parallel,
        })
    }

    /// Gemma 4's dense MLP beside the experts of the layer whose MLP is `prefix`
    /// (`model.layers.{i}.mlp`), with its norms and the router's input norm (`router.scale`
    /// times `1/√hidden`, in f32 as mlx-lm multiplies them), and the router's per-expert scales.
    fn parallel_dense(
        &self,
        prefix: &str,
        hidden: usize,
        moe: &RoutedExperts,
    ) -> Result<(Box<ParallelDense>, Vec<f32>)> {
        let layer = prefix.strip_suffix(".mlp").unwrap_or(prefix);
        let (gate_up, down) = self.gated_mlp(prefix)?;
        let router_norm = self
            .float(&format!("{layer}.router.scale"))?
            .multiply(&Array::scalar_f32((hidden as f32).powf(-0.5)))?;
        let scales = self
            .float(&format!("{layer}.router.per_expert_scale"))?
            .to_vec_f32()?;
        if scales.len() != moe.num_experts {
            return Err(Error::Mlx {
                op: "routed experts",
                message: format!(
                    "{layer}.router.per_expert_scale holds {} values, expected {}",
                    scales.len(),
                    moe.num_experts
                ),
            });
        }
        let norm = |name: &str| self.norm(&format!("{layer}.{name}.weight"));
        Ok((
            Box::new(ParallelDense {
                mlp: Expert { gate_up, down },
                dense_post_norm: norm("post_feedforward_layernorm_1")?,
                experts_norm: norm("pre_feedforward_layernorm_2")?,
                experts_post_norm: norm("post_feedforward_layernorm_2")?,
                router_norm,
            }),
            scales,
        ))
    }

    /// `module`'s weight as f32 values on the host, row-major (dequantized if stored quantized).
    fn matrix_f32(&self, module: &str) -> Result<Vec<f32>> {
        let array = match self.quantized(module)? {
            // Dequantized in f32 (MLX dequantizes in the scales' dtype, which may be f16).
            Some(q) => QuantizedWeight {
                scales: q.scales.astype(Dtype::F32)?,
                biases: q.biases.astype(Dtype::F32)?,
                ..q
            }
            .dequantize()?,
            None => self.float(&format!("{module}.weight"))?,
        };
        array.to_vec_f32()
    }

    fn linear(&self, module: &str, has_bias: bool) -> Result<Linear> {
        self.linear_from(module, has_bias, true)
    }

    /// `module` as a [`Linear`]; `int8_blocks`: whether a GGUF weight may go straight into the
    /// int8 layout (not for one cut by rows afterwards, which [`Linear::rows`] takes in the
    /// checkpoint's layout; the layer's int8 rewrite converts the parts).
    fn linear_from(&self, module: &str, has_bias: bool, int8_blocks: bool) -> Result<Linear> {
        let bias = if has_bias {
            Some(self.float(&format!("{module}.bias"))?)
        } else {
            None
        };
        if int8_blocks && let Some(weight) = self.int8_stack(&[module])? {
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

/// The loader as a varied layer's source of weights (`varied_layer.rs`).
impl WeightSource for Loader<'_> {
    fn linear(&self, module: &str) -> Result<Linear> {
        Loader::linear(self, module, false)
    }

    fn norm(&self, name: &str) -> Result<Array> {
        Loader::norm(self, name)
    }

    fn float(&self, name: &str) -> Result<Array> {
        Loader::float(self, name)
    }

    fn embedding(&self, module: &str) -> Result<Embedding> {
        Ok(match self.quantized(module)? {
            Some(q) => Embedding::Quantized(q),
            None => Embedding::Dense(Loader::float(self, &format!("{module}.weight"))?),
        })
    }

    fn mlp(&self, config: &ModelConfig, layer: usize) -> Result<Mlp> {
        load_mlp(self, config, layer)
    }
}
