//! A checkpoint directory checked against its config: every tensor the architecture needs is
//! present with the right shape and dtype, and quantized modules agree with the metadata.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::config::blocks::{FeedForward, Routing};
use crate::error::{ModelError, Result};
use crate::families::{FusedProjection, Rows};
use crate::gguf::{GgufWeights, open_gguf_weights};
use crate::quant::QuantSpec;
use crate::safetensors_files::{Dtype, SafetensorsFiles, TensorInfo, TensorView};

/// What a module is, with its logical (dequantized) shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleKind {
    /// `weight` is `[out, in]` (or packed), optional `bias` `[out]`.
    Linear { out: usize, inp: usize, bias: bool },
    /// `weight` is `[vocab, hidden]` (or packed).
    Embedding { vocab: usize, hidden: usize },
    /// `weight` is `[dim]`.
    Norm { dim: usize },
}

/// One module of the architecture, named as in Hugging Face checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub name: String,
    pub kind: ModuleKind,
}

/// The modules a config calls for, in forward order.
pub fn expected_modules(config: &ModelConfig) -> Vec<Module> {
    let linear = |name: String, out, inp, bias| Module {
        name,
        kind: ModuleKind::Linear { out, inp, bias },
    };
    let norm = |name: String, dim| Module {
        name,
        kind: ModuleKind::Norm { dim },
    };
    let hidden = config.hidden_size;
    let mut modules = vec![Module {
        name: "model.embed_tokens".into(),
        kind: ModuleKind::Embedding {
            vocab: config.vocab_size,
            hidden,
        },
    }];
    for layer in 0..config.num_hidden_layers {
        let p = format!("model.layers.{layer}");
        let qkv_bias = config.attention_qkv_bias;
        if config.layers[layer].conv.is_some() {
            modules.extend([
                norm(format!("{p}.input_layernorm"), hidden),
                linear(format!("{p}.conv.in_proj"), 3 * hidden, hidden, false),
                linear(format!("{p}.conv.out_proj"), hidden, hidden, false),
            ]);
        } else if let Some(net) = config.layers[layer].linear {
            modules.push(norm(format!("{p}.input_layernorm"), hidden));
            let a = format!("{p}.linear_attn");
            let heads = net.value_heads;
            if net.fused_projections {
                modules.extend([
                    linear(
                        format!("{a}.in_proj_qkvz"),
                        net.conv_dim() + net.value_dim(),
                        hidden,
                        false,
                    ),
                    linear(format!("{a}.in_proj_ba"), 2 * heads, hidden, false),
                ]);
            } else {
                modules.extend([
                    linear(format!("{a}.in_proj_qkv"), net.conv_dim(), hidden, false),
                    linear(format!("{a}.in_proj_z"), net.value_dim(), hidden, false),
                    linear(format!("{a}.in_proj_b"), heads, hidden, false),
                    linear(format!("{a}.in_proj_a"), heads, hidden, false),
                ]);
            }
            modules.extend([
                norm(format!("{a}.norm"), net.value_head_dim),
                linear(format!("{a}.out_proj"), hidden, net.value_dim(), false),
            ]);
        } else {
            let (q_dim, kv_dim) = (config.layer_q_dim(layer), config.layer_kv_dim(layer));
            let q_rows = if config.attention_output_gate {
                2 * q_dim
            } else {
                q_dim
            };
            // A layer that reuses an earlier layer's keys and values has no k or v of its own.
            let own_kv = config.kv_source(layer).is_none();
            modules.extend([
                norm(format!("{p}.input_layernorm"), hidden),
                linear(format!("{p}.self_attn.q_proj"), q_rows, hidden, qkv_bias),
                linear(
                    format!("{p}.self_attn.o_proj"),
                    hidden,
                    q_dim,
                    config.attention_out_bias,
                ),
            ]);
            if own_kv {
                // Keys as values: no v projection.
                let own = if config.layer_keys_as_values(layer) {
                    &["k_proj"][..]
                } else {
                    &["k_proj", "v_proj"][..]
                };
                modules.extend(
                    own.iter()
                        .map(|m| linear(format!("{p}.self_attn.{m}"), kv_dim, hidden, qkv_bias)),
                );
            }
            if config.qk_norm {
                let head_dim = config.layer_head_dim(layer);
                let (q, k) = if config.qk_norm_whole {
                    (q_dim, kv_dim)
                } else {
                    (head_dim, head_dim)
                };
                modules.push(norm(format!("{p}.self_attn.q_norm"), q));
                if own_kv {
                    modules.push(norm(format!("{p}.self_attn.k_norm"), k));
                }
            }
            if let Some(per_layer) = config.per_layer_input {
                modules.extend([
                    linear(
                        format!("{p}.per_layer_input_gate"),
                        per_layer.hidden,
                        hidden,
                        false,
                    ),
                    linear(
                        format!("{p}.per_layer_projection"),
                        hidden,
                        per_layer.hidden,
                        false,
                    ),
                    norm(format!("{p}.post_per_layer_input_norm"), hidden),
                ]);
            }
        }
        if config.sandwich_norms {
            modules.push(norm(format!("{p}.pre_feedforward_layernorm"), hidden));
            modules.push(norm(format!("{p}.post_feedforward_layernorm"), hidden));
        }
        modules.push(norm(format!("{p}.post_attention_layernorm"), hidden));
        match config.layer_spec(layer).ffn {
            FeedForward::Dense {
                intermediate_size: ffn,
                ..
            } => modules.extend([
                linear(format!("{p}.mlp.gate_proj"), ffn, hidden, false),
                linear(format!("{p}.mlp.up_proj"), ffn, hidden, false),
                linear(format!("{p}.mlp.down_proj"), hidden, ffn, false),
            ]),
            FeedForward::RoutedExperts(moe) => {
                let ffn = moe.expert_intermediate_size;
                let bias = moe.biases;
                modules.push(linear(
                    format!("{p}.mlp.gate"),
                    moe.num_experts,
                    hidden,
                    bias,
                ));
                for j in 0..moe.num_experts {
                    let e = format!("{p}.mlp.experts.{j}");
                    modules.extend([
                        linear(format!("{e}.gate_proj"), ffn, hidden, bias),
                        linear(format!("{e}.up_proj"), ffn, hidden, bias),
                        linear(format!("{e}.down_proj"), hidden, ffn, bias),
                    ]);
                }
                if let Some(dense) = moe.parallel_dense {
                    modules.extend([
                        linear(format!("{p}.mlp.gate_proj"), dense, hidden, false),
                        linear(format!("{p}.mlp.up_proj"), dense, hidden, false),
                        linear(format!("{p}.mlp.down_proj"), hidden, dense, false),
                        norm(format!("{p}.post_feedforward_layernorm_1"), hidden),
                        norm(format!("{p}.pre_feedforward_layernorm_2"), hidden),
                        norm(format!("{p}.post_feedforward_layernorm_2"), hidden),
                    ]);
                }
                if let Some(shared) = moe.shared_expert_intermediate_size {
                    let e = format!("{p}.mlp.shared_expert");
                    modules.extend([
                        linear(format!("{e}.gate_proj"), shared, hidden, false),
                        linear(format!("{e}.up_proj"), shared, hidden, false),
                        linear(format!("{e}.down_proj"), hidden, shared, false),
                        linear(format!("{p}.mlp.shared_expert_gate"), 1, hidden, false),
                    ]);
                }
            }
        }
    }
    modules.push(norm("model.norm".into(), hidden));
    if let Some(per_layer) = config.per_layer_input {
        let width = config.num_hidden_layers * per_layer.hidden;
        modules.extend([
            Module {
                name: "model.embed_tokens_per_layer".into(),
                kind: ModuleKind::Embedding {
                    vocab: per_layer.vocab,
                    hidden: width,
                },
            },
            linear(
                "model.per_layer_model_projection".into(),
                width,
                hidden,
                false,
            ),
            norm("model.per_layer_projection_norm".into(), per_layer.hidden),
        ]);
    }
    if !config.tie_word_embeddings {
        modules.push(linear("lm_head".into(), config.vocab_size, hidden, false));
    }
    modules
}

/// A validated checkpoint: config plus memory-mapped tensors.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    files: SafetensorsFiles,
    /// Quantization actually found, per weight-bearing module (`None` = dense).
    quant: BTreeMap<String, Option<QuantSpec>>,
}

impl Checkpoint {
    /// Opens and validates the checkpoint in `dir` (config.json + safetensors).
    ///
    /// A directory prepared from a GGUF file ([`crate::gguf::prepare_gguf`], what `-m FILE.gguf`
    /// resolves to) has no safetensors: its tensors are converted from the GGUF file when a
    /// loader first reads them.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let files = match GgufWeights::read(dir)? {
            Some(weights) => open_gguf_weights(dir, &weights)?,
            None => SafetensorsFiles::open_dir(dir)?,
        };
        Self::new(dir, config, files)
    }

    /// Validates `files` against `config`.
    pub fn new(dir: &Path, mut config: ModelConfig, mut files: SafetensorsFiles) -> Result<Self> {
        if config.multimodal {
            let dropped = files.rename(text_model_name)?;
            if !dropped.is_empty() {
                eprintln!(
                    "mlxcel: {}: skipping {} tensors of the vision tower and projector ({}, ...): \
                     mlxcel runs the text model",
                    dir.display(),
                    dropped.len(),
                    dropped[0]
                );
            }
        }
        // mlx-lm saves a Qwen3.5 under its wrapper's names (`language_model.model.…`); the
        // Hugging Face one is `model.language_model.…`. Read as the text model's.
        if !config.multimodal
            && files.info("model.embed_tokens.weight").is_none()
            && (files
                .info("language_model.model.embed_tokens.weight")
                .is_some()
                || files
                    .info("model.language_model.embed_tokens.weight")
                    .is_some())
        {
            let dropped = files.rename(text_model_name)?;
            if !dropped.is_empty() {
                eprintln!(
                    "mlxcel: {}: skipping {} tensors outside the text model ({}, ...)",
                    dir.display(),
                    dropped.len(),
                    dropped[0]
                );
            }
        }
        let family = config.architecture.family();
        // Families that name their modules their own way (LFM2) are read under llama's names,
        // the quantization's per-module overrides too.
        if files
            .infos()
            .any(|info| family.canonical_name(info.name).is_some())
        {
            files.rename(|name| {
                Some(
                    family
                        .canonical_name(name)
                        .unwrap_or_else(|| name.to_owned()),
                )
            })?;
            if let Some(q) = &mut config.quantization {
                q.overrides = std::mem::take(&mut q.overrides)
                    .into_iter()
                    .map(|(m, s)| (family.canonical_name(&m).unwrap_or(m), s))
                    .collect();
            }
        }
        if config.layers.iter().any(|l| l.conv.is_some()) {
            short_conv_tensors(&config, &files)?;
        }
        expert_bias_tensors(&config, &files)?;
        if config.layers.iter().any(|l| l.linear.is_some()) {
            split_linear_projections(&mut config, &files);
            config.norm_weight_offset = linear_attention_tensors(&config, &files)?;
        }
        if config.tie_word_embeddings && own_output_projection(&files) {
            // transformers ties only what the checkpoint leaves untied: a stored `lm_head` that
            // differs from the embeddings is the output projection (mlx-lm, too, uses any
            // `lm_head` it finds, whatever config.json says).
            eprintln!(
                "mlxcel: {}: config.json ties the output projection to the embeddings (or leaves \
                 `tie_word_embeddings` to the family's default, true), but the checkpoint has its \
                 own `lm_head`: using it, as transformers and mlx-lm do",
                dir.display()
            );
            config.tie_word_embeddings = false;
        }
        if config.feed_forward.iter().any(|f| f.routed().is_some()) {
            crate::experts::per_expert_views(&mut config, &mut files)?;
        }
        let fused = config.architecture.fused_projections();
        if !fused.is_empty() {
            split_fused(&config, fused, &mut files)?;
            // A per-module quantization override of a fused module applies to its parts.
            if let Some(q) = &mut config.quantization {
                let overridden: Vec<(String, _)> = q
                    .overrides
                    .iter()
                    .filter(|(m, _)| fused.iter().any(|f| m.ends_with(f.module)))
                    .map(|(m, s)| (m.clone(), *s))
                    .collect();
                for (module, spec) in overridden {
                    let Some(projection) = fused.iter().find(|f| module.ends_with(f.module)) else {
                        continue;
                    };
                    let stem = module.strip_suffix(projection.module).unwrap_or("");
                    for (part, _) in projection.parts {
                        q.overrides.insert(format!("{stem}{part}"), spec);
                    }
                }
            }
        }
        let mut quant = BTreeMap::new();
        for module in expected_modules(&config) {
            let spec = validate_module(&config, &files, &module)?;
            if !matches!(module.kind, ModuleKind::Norm { .. }) {
                quant.insert(module.name, spec);
            }
        }
        if config.layer_scalars {
            for layer in 0..config.num_hidden_layers {
                let name = format!("model.layers.{layer}.layer_scalar");
                float_tensor(&files, &name, &[1])?;
            }
        }
        if config.attention_sinks {
            for layer in 0..config.num_hidden_layers {
                let name = format!("model.layers.{layer}.self_attn.sinks");
                float_tensor(&files, &name, &[config.num_attention_heads])?;
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            config,
            files,
            quant,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Applies llama.cpp's RoPE overrides to the config, before a backend reads it
    /// ([`crate::RopeOverrides::apply`]).
    pub fn apply_rope_overrides(&mut self, overrides: &crate::RopeOverrides) -> Result<()> {
        overrides.apply(&mut self.config)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tensor called `name` (e.g. `model.layers.0.self_attn.q_proj.scales`).
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.files.get(name)
    }

    /// The name, dtype, shape and byte length of the tensor called `name`, without reading its
    /// bytes (which, read from a GGUF file, would convert it).
    pub fn tensor_info(&self, name: &str) -> Option<TensorInfo<'_>> {
        self.files.info(name)
    }

    /// Lets go of the memory that `name`'s bytes occupy, once a loader has copied them
    /// ([`SafetensorsFiles::release`]): the mapped file, or the tensor converted from a GGUF
    /// file, then does not double the load's peak memory.
    ///
    /// # Safety
    /// No [`TensorView::data`] of `name` obtained before may be read afterwards (see
    /// [`SafetensorsFiles::release`]).
    pub unsafe fn release_tensor(&self, name: &str) {
        // SAFETY: forwarded to the caller.
        unsafe { self.files.release(name) }
    }

    /// The GGUF blocks the quantized weight `name` (e.g. `model.layers.0.mlp.up_proj.weight`)
    /// is read from, for a checkpoint read straight from a GGUF file; `None` otherwise. A loader
    /// that writes its own layout from them converts nothing ([`Checkpoint::tensor`] would).
    pub fn gguf_blocks(&self, name: &str) -> Option<crate::gguf::GgufBlocks<'_>> {
        self.files.gguf_blocks(name)
    }

    /// Whether the checkpoint is read straight from a GGUF file (a directory prepared by
    /// [`crate::gguf::prepare_gguf`]): then [`Checkpoint::dir`] is mlxcel's own, the prepared
    /// directory, where a loader may keep what it derives from the file.
    pub fn is_from_gguf(&self) -> bool {
        self.files.any_on_demand()
    }

    /// Lets go of the resident pages of the GGUF file behind `name`, once a loader is done with
    /// [`Checkpoint::gguf_blocks`] (no-op for other checkpoints).
    pub fn release_gguf_blocks(&self, name: &str) {
        self.files.release_gguf_blocks(name)
    }

    /// Every tensor, sorted by name. Reading a GGUF-backed checkpoint this way converts every
    /// tensor; [`Checkpoint::tensor_infos`] does not.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.files.iter()
    }

    /// Every tensor's [`Checkpoint::tensor_info`], sorted by name.
    pub fn tensor_infos(&self) -> impl Iterator<Item = TensorInfo<'_>> {
        self.files.infos()
    }

    /// How the module at `module` (e.g. `model.embed_tokens`) is quantized; `None` when dense.
    pub fn quantization_of(&self, module: &str) -> Option<QuantSpec> {
        self.quant.get(module).copied().flatten()
    }
}

/// Whether the checkpoint stores an `lm_head` that is not the embedding table itself (the
/// same bytes, which tied PyTorch checkpoints may store twice).
fn own_output_projection(files: &SafetensorsFiles) -> bool {
    ["weight", "scales", "biases"].iter().any(|suffix| {
        let head = files.get(&format!("lm_head.{suffix}"));
        let table = files.get(&format!("model.embed_tokens.{suffix}"));
        match (head, table) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(head), Some(table)) => {
                head.dtype != table.dtype || head.shape != table.shape || head.data != table.data
            }
        }
    })
}

/// A multimodal checkpoint's tensor under its text model's name (`language_model.model.…`,
/// `model.language_model.…`, `language_model.lm_head.…` become `model.…`, `lm_head.…`), or `None`
/// for the other towers' tensors.
fn text_model_name(name: &str) -> Option<String> {
    for (prefix, to) in [
        ("language_model.model.", "model."),
        ("model.language_model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return Some(format!("{to}{rest}"));
        }
    }
    (name.starts_with("lm_head.")).then(|| name.to_owned())
}

/// Fused projections (Phi-3's `qkv_proj`, `gate_up_proj`) become views of their rows under
/// their parts' names (`q_proj`, …), so that everything downstream sees a llama.
fn split_fused(
    config: &ModelConfig,
    fused: &[FusedProjection],
    files: &mut SafetensorsFiles,
) -> Result<()> {
    let rows = |rows: Rows| match rows {
        Rows::Query => config.q_dim(),
        Rows::KeyValue => config.kv_dim(),
        Rows::Intermediate => config.intermediate_size,
    };
    for layer in 0..config.num_hidden_layers {
        let p = format!("model.layers.{layer}");
        for suffix in ["weight", "scales", "biases", "bias"] {
            for projection in fused {
                let parts: Vec<(String, usize)> = projection
                    .parts
                    .iter()
                    .map(|&(part, n)| (format!("{p}.{part}.{suffix}"), rows(n)))
                    .collect();
                files.split_rows(&format!("{p}.{}.{suffix}", projection.module), &parts)?;
            }
        }
    }
    Ok(())
}

/// Reads a Qwen3-Next whose linear layers store their projections apart (`in_proj_qkv`,
/// `in_proj_z`, `in_proj_b`, `in_proj_a`, as llama.cpp's files give them) as such: its family
/// expects them fused, and the checkpoint's first linear layer tells which it has.
fn split_linear_projections(config: &mut ModelConfig, files: &SafetensorsFiles) {
    let Some((layer, net)) = config
        .layers
        .iter()
        .enumerate()
        .find_map(|(i, l)| l.linear.map(|net| (i, net)))
    else {
        return;
    };
    let a = format!("model.layers.{layer}.linear_attn");
    let stored = |module: &str| {
        ["weight", "scales"]
            .iter()
            .any(|suffix| files.info(&format!("{a}.{module}.{suffix}")).is_some())
    };
    if net.fused_projections && !stored("in_proj_qkvz") && stored("in_proj_qkv") {
        for attention in &mut config.layers {
            if let Some(net) = &mut attention.linear {
                net.fused_projections = false;
            }
        }
    }
}

/// Checks each linear-attention layer's tensors that are not modules (`conv1d.weight`, `A_log`,
/// `dt_bias`) and returns whether the norms are stored zero-centred: a checkpoint in Hugging
/// Face's layout (`conv1d.weight` `[channels, 1, taps]`) stores `w` and normalises by `1 + w`,
/// as transformers does; mlx-lm's converted checkpoints (`[channels, taps, 1]`) store `1 + w`
/// itself (its `sanitize` adds the one when it moves the axis). A mix of both is refused.
fn linear_attention_tensors(config: &ModelConfig, files: &SafetensorsFiles) -> Result<bool> {
    // The first linear layer's layout (Hugging Face's or mlx-lm's) and its tensor's name.
    let mut layout: Option<(bool, String)> = None;
    for (layer, attention) in config.layers.iter().enumerate() {
        let Some(net) = attention.linear else {
            continue;
        };
        let a = format!("model.layers.{layer}.linear_attn");
        for name in ["A_log", "dt_bias"] {
            float_tensor(files, &format!("{a}.{name}"), &[net.value_heads])?;
        }
        let name = format!("{a}.conv1d.weight");
        let (channels, taps) = (net.conv_dim(), net.conv_kernel);
        let t = tensor(files, &name)?;
        let hugging_face = if t.shape == [channels, 1, taps] {
            true
        } else {
            float_tensor(files, &name, &[channels, taps, 1])?;
            false
        };
        if !t.dtype.is_float() {
            float_tensor(files, &name, &[channels, 1, taps])?;
        }
        match &layout {
            Some((other, _)) if *other != hugging_face => {
                // Every layer in the first one's layout, or the norms' form is ambiguous.
                return Err(ModelError::TensorShape {
                    path: t.file.to_owned(),
                    tensor: name.clone(),
                    expected: if *other {
                        vec![channels, 1, taps]
                    } else {
                        vec![channels, taps, 1]
                    },
                    actual: t.shape.to_vec(),
                });
            }
            Some(_) => {}
            None => layout = Some((hugging_face, name)),
        }
    }
    Ok(layout.is_some_and(|(hf, _)| hf))
}

/// Checks each short-convolution layer's taps (`conv.conv.weight`): `hidden` channels of
/// `kernel` taps, stored `[channels, 1, taps]` (Hugging Face), `[channels, taps, 1]` (mlx-lm)
/// or `[channels, taps]` (llama.cpp), the same values in the same order.
fn short_conv_tensors(config: &ModelConfig, files: &SafetensorsFiles) -> Result<()> {
    for (layer, attention) in config.layers.iter().enumerate() {
        let Some(conv) = attention.conv else {
            continue;
        };
        let name = format!("model.layers.{layer}.conv.conv.weight");
        let (channels, taps) = (config.hidden_size, conv.kernel);
        let t = tensor(files, &name)?;
        let shape = [[channels, 1, taps], [channels, taps, 1]]
            .into_iter()
            .find(|s| t.shape == s)
            .map_or_else(|| vec![channels, taps], |s| s.to_vec());
        float_tensor(files, &name, &shape)?;
    }
    Ok(())
}

/// Checks the per-expert selection bias (`mlp.expert_bias`, `[num_experts]`) of each routed
/// layer that picks its experts with one (LFM2-MoE), and Gemma 4's router scales
/// (`router.scale`, `[hidden]`; `router.per_expert_scale`, `[num_experts]`).
fn expert_bias_tensors(config: &ModelConfig, files: &SafetensorsFiles) -> Result<()> {
    for (layer, ffn) in config.feed_forward.iter().enumerate() {
        if let Some(moe) = ffn.routed()
            && let Routing::SigmoidTopK {
                selection_bias: true,
                ..
            } = moe.routing
        {
            let name = format!("model.layers.{layer}.mlp.expert_bias");
            float_tensor(files, &name, &[moe.num_experts])?;
        }
        // Gemma 4's router scales its normed input and each expert's weight.
        if let Some(moe) = ffn.routed().filter(|m| m.parallel_dense.is_some()) {
            let p = format!("model.layers.{layer}.router");
            float_tensor(files, &format!("{p}.scale"), &[config.hidden_size])?;
            float_tensor(files, &format!("{p}.per_expert_scale"), &[moe.num_experts])?;
        }
    }
    Ok(())
}

fn validate_module(
    config: &ModelConfig,
    files: &SafetensorsFiles,
    module: &Module,
) -> Result<Option<QuantSpec>> {
    let name = &module.name;
    let (out, inp, bias) = match module.kind {
        ModuleKind::Norm { dim } => {
            float_tensor(files, &format!("{name}.weight"), &[dim])?;
            return Ok(None);
        }
        ModuleKind::Linear { out, inp, bias } => (out, inp, bias),
        ModuleKind::Embedding { vocab, hidden } => (vocab, hidden, false),
    };
    if bias {
        float_tensor(files, &format!("{name}.bias"), &[out])?;
    }
    let weight = tensor(files, &format!("{name}.weight"))?;
    let scales = files.info(&format!("{name}.scales"));
    let declared = config
        .quantization
        .as_ref()
        .map(|q| (q.overrides.contains_key(name.as_str()), q.for_module(name)));
    let inconsistent = |reason: String| ModelError::InconsistentQuantization {
        path: weight.file.to_owned(),
        module: name.clone(),
        reason,
    };
    let Some(scales) = scales else {
        if weight.dtype == Dtype::U32 {
            return Err(inconsistent(
                "weight is packed (U32) but there is no `scales` tensor".into(),
            ));
        }
        if let Some((true, Some(_))) = declared {
            return Err(inconsistent(
                "config.json quantizes it explicitly but there is no `scales` tensor".into(),
            ));
        }
        float_tensor(files, &format!("{name}.weight"), &[out, inp])?;
        return Ok(None);
    };
    let Some((_, Some(spec))) = declared else {
        return Err(inconsistent(format!(
            "has `scales` but {} config.json `quantization`",
            if declared.is_some() {
                "it is excluded by"
            } else {
                "there is no"
            }
        )));
    };
    if !inp.is_multiple_of(spec.group_size) {
        return Err(inconsistent(format!(
            "input size {inp} is not a multiple of group_size {}",
            spec.group_size
        )));
    }
    if weight.dtype != Dtype::U32 {
        return Err(ModelError::UnsupportedDtype {
            path: weight.file.to_owned(),
            tensor: weight.name.to_owned(),
            dtype: weight.dtype.to_string(),
            expected: "U32 (packed quantized weight)",
        });
    }
    let packed = [out, spec.packed_width(inp)];
    if weight.shape != packed {
        return Err(inconsistent(format!(
            "weight shape {:?} does not match {} bits for [{out}, {inp}] (expected {packed:?})",
            weight.shape, spec.bits
        )));
    }
    let groups = [out, inp / spec.group_size];
    float_tensor(files, scales.name, &groups)?;
    let biases = float_tensor(files, &format!("{name}.biases"), &groups)?;
    if biases.dtype != scales.dtype {
        return Err(inconsistent(format!(
            "scales are {} but biases are {}",
            scales.dtype, biases.dtype
        )));
    }
    Ok(Some(spec))
}

fn tensor<'a>(files: &'a SafetensorsFiles, name: &str) -> Result<TensorInfo<'a>> {
    files.info(name).ok_or_else(|| ModelError::MissingTensor {
        path: files.origin().to_owned(),
        tensor: name.to_owned(),
    })
}

fn float_tensor<'a>(
    files: &'a SafetensorsFiles,
    name: &str,
    shape: &[usize],
) -> Result<TensorInfo<'a>> {
    let t = tensor(files, name)?;
    if !t.dtype.is_float() {
        return Err(ModelError::UnsupportedDtype {
            path: t.file.to_owned(),
            tensor: name.to_owned(),
            dtype: t.dtype.to_string(),
            expected: "F32, F16 or BF16",
        });
    }
    if t.shape != shape {
        return Err(ModelError::TensorShape {
            path: t.file.to_owned(),
            tensor: name.to_owned(),
            expected: shape.to_vec(),
            actual: t.shape.to_vec(),
        });
    }
    Ok(t)
}
