//! Writes a checkpoint directory (Hugging Face or mlx-lm layout, dense or MLX-quantized) as a GGUF
//! that llama.cpp loads: the inverse of our importer (`mlxcel_model::convert_gguf`), for
//! scripts/check-families-gguf. Weights are F32 (quantized ones dequantized), named, permuted and
//! offset as llama.cpp's converter writes them (q/k rows permuted for llama, Mistral and SmolLM3;
//! Gemma's and the hybrids' norms as `1 + w`; Phi-3's q/k/v and gate/up fused; experts stacked,
//! `export_gguf/experts.rs`; the hybrids' linear attention, `export_gguf/delta_net.rs`; LFM2's
//! short convolutions, `export_gguf/lfm2.rs`); the
//! vocabulary must be a byte-level BPE `tokenizer.json`.
//!
//! ```sh
//! cargo run -p mlxcel-model --example export-gguf -- CHECKPOINT_DIR OUT.gguf [--import DIR]
//! ```
//!
//! Prints one `lossy FIELD: why` line for each feature of the checkpoint that the GGUF, or
//! llama.cpp reading it, does not carry (a field of `ModelConfig`). With `--import DIR` it converts
//! the GGUF back with `convert_gguf` into DIR and checks the round trip: every tensor the same f32
//! values as the checkpoint's (Gemma's norms compared as the `1 + w` both sides compute with), and
//! every `ModelConfig` field the same unless a `lossy` line names it. It prints a `roundtrip` line
//! and exits 1 if the import fails or anything differs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use half::{bf16, f16};
use mlxcel_model::gguf::permute::permute_rows;
use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter, hf_name_in};
use mlxcel_model::{
    Architecture, Checkpoint, Dtype, ModelConfig, ModuleKind, RopeScaling, convert_gguf,
    dequantize_affine, expected_modules,
};
use serde_json::Value;

#[path = "export_gguf/delta_net.rs"]
mod delta_net;
#[path = "export_gguf/experts.rs"]
mod experts;
#[path = "export_gguf/gemma.rs"]
mod gemma;
#[path = "export_gguf/gpt_oss.rs"]
mod gpt_oss;
#[path = "export_gguf/lfm2.rs"]
mod lfm2;

type Error = Box<dyn std::error::Error>;

/// A feature the GGUF does not carry: the `ModelConfig` field it shows in, and why.
struct Lossy {
    field: &'static str,
    why: String,
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let usage = "usage: export-gguf CHECKPOINT_DIR OUT.gguf [--import DIR]";
    let (Some(dir), Some(out)) = (args.next(), args.next()) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let import = match (args.next().as_deref(), args.next()) {
        (None, _) => None,
        (Some("--import"), Some(dir)) => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let (dir, out) = (PathBuf::from(dir), PathBuf::from(out));
    let checkpoint = match Checkpoint::open(&dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("export-gguf: {e}");
            return ExitCode::FAILURE;
        }
    };
    let lossy = match export(&checkpoint, &out) {
        Ok(lossy) => lossy,
        Err(e) => {
            eprintln!("export-gguf: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    for l in &lossy {
        println!("lossy {}: {}", l.field, l.why);
    }
    let Some(import) = import else {
        return ExitCode::SUCCESS;
    };
    match round_trip(&checkpoint, &out, &import, &lossy) {
        Ok(problems) if problems.is_empty() => ExitCode::SUCCESS,
        Ok(problems) => {
            for p in problems {
                println!("roundtrip FAIL {p}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("roundtrip FAIL import: {e}");
            ExitCode::FAILURE
        }
    }
}

/// llama.cpp's architecture name for ours, and the architecture our importer reads it back as
/// (llama.cpp converts Mistral as a llama).
fn gguf_architecture(architecture: Architecture) -> (&'static str, Architecture) {
    let name = architecture.gguf_name();
    (
        name,
        Architecture::from_gguf_name(name).unwrap_or(architecture),
    )
}

fn export(checkpoint: &Checkpoint, out: &Path) -> Result<Vec<Lossy>, Error> {
    let c = checkpoint.config();
    let moe = experts::routed(c)?;
    let raw = read_json(&checkpoint.dir().join("config.json"))?;
    let (arch, import_arch) = gguf_architecture(c.architecture);
    let mut w = GgufWriter::new();
    let mut lossy = Vec::new();
    let key = |k: &str| format!("{arch}.{k}");
    write_hyperparameters(&mut w, c, arch);
    if lfm2::is_lfm2(c) {
        lfm2::write_metadata(&mut w, c, arch)?;
    }
    if let Some(moe) = &moe {
        experts::check(c, arch)?;
        experts::write_metadata(&mut w, c, moe, arch, &mut lossy);
    }
    delta_net::write_metadata(&mut w, c, arch)?;
    let rope_tensors = if arch == "gemma4" {
        gemma::write_gemma4(&mut w, c, &key, &mut lossy)?;
        vec![("rope_freqs.weight".to_owned(), gemma::gemma4_rope_freqs(c))]
    } else {
        write_rope_scaling(&mut w, c, &raw, &key, &mut lossy)?
    };
    write_layer_attention(&mut w, c, &raw, arch, &mut lossy);
    if c.norm_weight_offset && !is_hybrid(c) {
        gemma::write_gemma(&mut w, c, &key, &mut lossy);
    }
    write_vocabulary(&mut w, checkpoint, c)?;
    let count = write_tensors(&mut w, checkpoint, import_arch, rope_tensors)?;

    let mut bytes = Vec::new();
    w.write(&mut bytes)?;
    type_empty_array_as_strings(&mut bytes, "tokenizer.ggml.merges");
    std::fs::write(out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "export-gguf: wrote {} ({arch}, {count} tensors, {:.1} MB)",
        out.display(),
        bytes.len() as f64 / 1e6
    );
    Ok(lossy)
}

/// The `general.*` keys and the shape: `{arch}.block_count`, head counts, head size, ...
fn write_hyperparameters(w: &mut GgufWriter, c: &ModelConfig, arch: &str) {
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = |v: usize| GgufValue::U32(v as u32);
    // general.name only when the checkpoint has one: llama.cpp keys vocabulary quirks on it (a
    // name with `phi3` in it requires Phi-3's `</s>` token).
    if let Some(name) = &c.name {
        w.metadata("general.name", GgufValue::String(name.clone()));
    }
    w.metadata("general.architecture", GgufValue::String(arch.into()))
        // LLAMA_FTYPE_ALL_F32.
        .metadata("general.file_type", GgufValue::U32(0))
        .metadata(&key("vocab_size"), u32v(c.vocab_size))
        .metadata(&key("context_length"), u32v(c.max_position_embeddings))
        .metadata(&key("embedding_length"), u32v(c.hidden_size))
        .metadata(&key("block_count"), u32v(c.num_hidden_layers))
        .metadata(&key("attention.head_count"), u32v(c.num_attention_heads))
        .metadata(
            &key("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(c.rms_norm_eps),
        )
        .metadata(&key("rope.freq_base"), GgufValue::F32(c.rope_theta))
        .metadata(&key("rope.dimension_count"), u32v(c.rotary_dim));
    // LFM2's key/value heads are per layer (`export_gguf/lfm2.rs`), and Gemma 4's may be, with
    // its MLP widths (`export_gguf/gemma.rs`).
    if !lfm2::is_lfm2(c) && arch != "gemma4" {
        w.metadata(&key("attention.head_count_kv"), u32v(c.num_key_value_heads));
    }
    if arch != "gemma4" {
        w.metadata(&key("feed_forward_length"), u32v(c.intermediate_size));
    }
    // llama.cpp's head size is hidden / heads unless the key length says otherwise.
    // Gemma 4's head sizes per layer type: `export_gguf/gemma.rs`.
    if (c.head_dim * c.num_attention_heads != c.hidden_size || c.norm_weight_offset || is_hybrid(c))
        && arch != "gemma4"
    {
        w.metadata(&key("attention.key_length"), u32v(c.head_dim))
            .metadata(&key("attention.value_length"), u32v(c.head_dim));
    }
}

/// A gated-DeltaNet hybrid (Qwen3-Next, Qwen3.5): norms as `1 + w` in the GGUF whatever the
/// checkpoint's layout, and llama.cpp's `post_attention_norm` for the MLP's input norm.
fn is_hybrid(c: &ModelConfig) -> bool {
    c.layers.iter().any(|l| l.linear.is_some())
}

/// Rotary scaling: linear as keys; Llama 3.1's as llama.cpp's per-pair `rope_freqs` factors and
/// Phi-3's LongRoPE as its `rope_factors_long`/`_short`, returned as tensors to write.
fn write_rope_scaling(
    w: &mut GgufWriter,
    c: &ModelConfig,
    raw: &Value,
    key: &dyn Fn(&str) -> String,
    lossy: &mut Vec<Lossy>,
) -> Result<Vec<(String, Vec<f32>)>, Error> {
    let mut tensors = Vec::new();
    match c.rope_scaling {
        Some(RopeScaling::Linear { factor }) => {
            w.metadata(
                &key("rope.scaling.type"),
                GgufValue::String("linear".into()),
            )
            .metadata(&key("rope.scaling.factor"), GgufValue::F32(factor));
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => tensors.push((
            "rope_freqs.weight".into(),
            llama3_rope_freqs(
                c.rope_theta,
                c.head_dim,
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            ),
        )),
        Some(RopeScaling::Yarn(_)) => gpt_oss::write_yarn(w, c, key, lossy)?,
        None => {}
    }
    let Some(long) = &c.rope_factors else {
        return Ok(tensors);
    };
    let scaling = &raw["rope_scaling"];
    let short: Vec<f32> = match scaling["short_factor"].as_array() {
        Some(list) => list
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or("rope_scaling.short_factor is not a list of numbers")?,
        None => long.clone(),
    };
    let original = scaling["original_max_position_embeddings"]
        .as_u64()
        .or_else(|| raw["original_max_position_embeddings"].as_u64())
        .ok_or("LongRoPE without original_max_position_embeddings")?;
    if &short != long {
        lossy.push(Lossy {
            field: "rope_factors",
            why: format!(
                "llama.cpp rotates with short_factor within {original} positions, mlxcel always \
                 with long_factor"
            ),
        });
    }
    w.metadata(
        &key("rope.scaling.attn_factor"),
        GgufValue::F32(c.rope_attention_factor),
    )
    .metadata(
        &key("rope.scaling.original_context_length"),
        GgufValue::U32(original as u32),
    );
    tensors.push(("rope_factors_long.weight".into(), long.clone()));
    tensors.push(("rope_factors_short.weight".into(), short));
    Ok(tensors)
}

/// Per-layer attention: sliding windows and NoPE layers, where llama.cpp can express them.
fn write_layer_attention(
    w: &mut GgufWriter,
    c: &ModelConfig,
    raw: &Value,
    arch: &str,
    lossy: &mut Vec<Lossy>,
) {
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = |v: usize| GgufValue::U32(v as u32);
    let windows: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
    let window = windows.iter().flatten().next().copied();
    match arch {
        "gemma2" | "gemma3" | "gemma4" | "gpt-oss" => {
            if let Some(window) = window {
                let pattern = windows
                    .iter()
                    .map(|w| GgufValue::Bool(w.is_some()))
                    .collect();
                w.metadata(&key("attention.sliding_window"), u32v(window))
                    .metadata(
                        &key("attention.sliding_window_pattern"),
                        GgufValue::Array(pattern),
                    );
            } else if arch == "gemma2" {
                // llama.cpp's Gemma 2 slides every other layer unless told otherwise.
                let pattern = vec![GgufValue::Bool(false); c.num_hidden_layers];
                w.metadata(
                    &key("attention.sliding_window"),
                    u32v(c.max_position_embeddings),
                )
                .metadata(
                    &key("attention.sliding_window_pattern"),
                    GgufValue::Array(pattern),
                );
            }
            if let Some(theta) = c.rope_local_theta {
                w.metadata(&key("rope.freq_base_swa"), GgufValue::F32(theta));
            }
        }
        "phi3" => {
            // As llama.cpp's converter writes it (0 for none); llama.cpp disables it, as mlxcel.
            let window = raw["sliding_window"].as_u64().unwrap_or(0);
            w.metadata(
                &key("attention.sliding_window"),
                GgufValue::U32(window as u32),
            );
        }
        _ => {
            if let Some(window) = window {
                let sliding: Vec<usize> = (0..windows.len())
                    .filter(|&i| windows[i].is_some())
                    .collect();
                lossy.push(Lossy {
                    field: "layers",
                    why: format!(
                        "sliding window {window} on layers {sliding:?} dropped: llama.cpp's \
                         `{arch}` has none"
                    ),
                });
            }
        }
    }
    if arch == "smollm3" {
        let ours: Vec<usize> = (0..c.layers.len()).filter(|&i| !c.layers[i].rope).collect();
        let fixed: Vec<usize> = (0..c.layers.len()).filter(|i| (i + 1) % 4 == 0).collect();
        if ours != fixed {
            lossy.push(Lossy {
                field: "layers",
                why: format!(
                    "NoPE layers {ours:?}: llama.cpp's smollm3 has no key for them and \
                     hard-codes every fourth layer ({fixed:?})"
                ),
            });
        }
    }
}

/// Every weight as F32, named, permuted and offset as llama.cpp's converter writes it, after
/// `extra` (RoPE factors); returns the number of tensors.
fn write_tensors(
    w: &mut GgufWriter,
    checkpoint: &Checkpoint,
    import_arch: Architecture,
    extra: Vec<(String, Vec<f32>)>,
) -> Result<usize, Error> {
    let c = checkpoint.config();
    let hybrid = is_hybrid(c);
    // Gemma's four norms per layer (Gemma 4's are stored as `w`, not `1 + w`).
    let gemma = (c.norm_weight_offset && !hybrid) || c.sandwich_norms;
    let moe = experts::routed(c)?;
    let mut tensors = Tensors {
        writer: w,
        architecture: import_arch,
        count: 0,
    };
    for (name, values) in extra {
        let dims = [values.len() as u64];
        tensors.add(&name, None, &dims, &values)?;
    }
    // llama.cpp's converter permutes q and k for the families it converts as llamas.
    let permuted = c.architecture.gguf_permuted_qk();
    let phi3 = c.architecture.gguf_name() == "phi3";
    let lfm2 = lfm2::is_lfm2(c);
    for module in expected_modules(c) {
        let m = module.name.as_str();
        if let Some(more) = family_tensors(checkpoint, c, moe.as_ref(), m)? {
            for t in more {
                tensors.add_tensor(t)?;
            }
            continue;
        }
        if phi3 && (m.ends_with(".k_proj") || m.ends_with(".v_proj") || m.ends_with(".up_proj")) {
            continue; // written with q_proj and gate_proj, fused
        }
        let bias = matches!(module.kind, ModuleKind::Linear { bias: true, .. });
        let norm = matches!(module.kind, ModuleKind::Norm { .. });
        for suffix in ["weight", "bias"] {
            if suffix == "bias" && !bias {
                continue;
            }
            let (mut values, mut shape) = tensor_f32(checkpoint, m, suffix)?;
            let mut source = m.to_owned();
            if phi3 && (m.ends_with(".q_proj") || m.ends_with(".gate_proj")) {
                // Phi-3's `attn_qkv` (q, k, v rows) and `ffn_up` (gate, then up rows).
                let (fused, parts): (&str, &[&str]) = if m.ends_with(".q_proj") {
                    ("self_attn.qkv_proj", &["k_proj", "v_proj"])
                } else {
                    ("mlp.gate_up_proj", &["up_proj"])
                };
                let stem = m.rsplit_once('.').map_or("", |(s, _)| s);
                for part in parts {
                    let (more, more_shape) =
                        tensor_f32(checkpoint, &format!("{stem}.{part}"), suffix)?;
                    values.extend(more);
                    shape[0] += more_shape[0];
                }
                let layer = stem.rsplit_once('.').map_or("", |(s, _)| s);
                source = format!("{layer}.{fused}");
            }
            if permuted && (m.ends_with(".q_proj") || m.ends_with(".k_proj")) {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                values = permute_rows(&bytes, shape[0], c.head_dim)
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
            }
            if c.norm_weight_offset && norm {
                // llama.cpp stores Gemma's and the hybrids' norms with the one added (an mlx-lm
                // hybrid checkpoint stores them so already).
                values.iter_mut().for_each(|v| *v += 1.0);
            }
            let mut dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            if m.ends_with(".mlp.shared_expert_gate") {
                // llama.cpp's shared-expert gate is a vector.
                dims.truncate(1);
            }
            let post_attention_norm = gemma || hybrid || c.attention_sinks;
            let stem = match gguf_stem(post_attention_norm, &source) {
                // llama.cpp's LFM2 names its final norm so.
                Some(stem) if lfm2 && stem == "output_norm" => "token_embd_norm".to_owned(),
                Some(stem) => stem,
                None => return Err(format!("{source} has no GGUF name").into()),
            };
            tensors.add(&format!("{stem}.{suffix}"), Some(&source), &dims, &values)?;
        }
        if c.attention_sinks
            && let Some(layer) = m
                .strip_prefix("model.layers.")
                .and_then(|rest| rest.strip_suffix(".self_attn.o_proj"))
        {
            tensors.add_tensor(gpt_oss::sinks(checkpoint, c, layer.parse()?)?)?;
        }
    }
    if c.architecture.gguf_name() == "gemma4" {
        for layer in 0..c.num_hidden_layers {
            for t in gemma::gemma4_layer_tensors(checkpoint, c, layer)? {
                tensors.add_tensor(t)?;
            }
        }
    }
    if lfm2 {
        for layer in 0..c.num_hidden_layers {
            for t in lfm2::layer_tensors(checkpoint, c, layer)? {
                tensors.add_tensor(t)?;
            }
        }
    }
    Ok(tensors.count)
}

/// The tensors that a family's own exporter writes for module `m` (`Some(empty)`: written with
/// another module), or `None` for the generic path: a layer's stacked experts at its first
/// expert's projections, a linear-attention layer's tensors at its `out_proj`.
fn family_tensors(
    checkpoint: &Checkpoint,
    c: &ModelConfig,
    moe: Option<&mlxcel_model::RoutedExperts>,
    m: &str,
) -> Result<Option<Vec<experts::Tensor>>, Error> {
    let Some((layer, part)) = m
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return Ok(None);
    };
    let layer: usize = layer.parse()?;
    if let (Some(moe), Some(expert)) = (moe, part.strip_prefix("mlp.experts.")) {
        return match expert.split_once('.') {
            Some(("0", proj)) => experts::stacked(checkpoint, moe, layer, proj).map(Some),
            _ => Ok(Some(Vec::new())),
        };
    }
    if let Some(linear) = part.strip_prefix("linear_attn.") {
        let net = c.layers[layer]
            .linear
            .ok_or_else(|| format!("{m}: layer {layer} is not linear attention"))?;
        let arch = c.architecture.gguf_name();
        return match linear {
            "out_proj" => delta_net::layer_tensors(checkpoint, c, arch, layer, &net).map(Some),
            _ => Ok(Some(Vec::new())),
        };
    }
    Ok(None)
}

/// Collects tensors for the writer, each checked against our importer's name mapping.
struct Tensors<'a> {
    writer: &'a mut GgufWriter,
    architecture: Architecture,
    count: usize,
}

impl Tensors<'_> {
    /// Adds F32 tensor `name`; `source` is the Hugging Face module our importer must map it back
    /// to (`None` for tensors it reads as config, such as RoPE factors).
    fn add(
        &mut self,
        name: &str,
        source: Option<&str>,
        dims: &[u64],
        values: &[f32],
    ) -> Result<(), Error> {
        if let Some(source) = source {
            let back = hf_name_in(self.architecture, name).map(|(m, s)| format!("{m}.{s}"));
            let suffix = name.rsplit_once('.').map_or("", |(_, s)| s);
            let expected = format!("{source}.{suffix}");
            if back.as_deref() != Some(expected.as_str()) {
                return Err(format!(
                    "`{name}` would be imported as {back:?}, not `{expected}`: export and import disagree"
                )
                .into());
            }
        }
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.writer.tensor(name, dims, GgmlType::F32, data);
        self.count += 1;
        Ok(())
    }

    /// Adds a tensor a family's exporter made, checking that our importer reads it back as
    /// `imported_as`.
    fn add_tensor(&mut self, t: experts::Tensor) -> Result<(), Error> {
        let back = hf_name_in(self.architecture, &t.name).map(|(m, s)| format!("{m}.{s}"));
        let expected = &t.imported_as;
        if back.as_deref() != Some(expected.as_str()) {
            return Err(format!(
                "`{}` would be imported as {back:?}, not `{expected}`: export and import disagree",
                t.name
            )
            .into());
        }
        self.add(&t.name, None, &t.dims, &t.values)
    }
}

/// llama.cpp's tensor stem for a Hugging Face module (its `tensor_mapping`), as our importer's
/// `hf_name_in` reads it back; `gemma`: the MLP's input norm follows attention as
/// `post_attention_norm` (Gemma, the hybrids).
fn gguf_stem(gemma: bool, module: &str) -> Option<String> {
    match module {
        "model.embed_tokens" => return Some("token_embd".into()),
        // Gemma 4's per-layer inputs.
        "model.embed_tokens_per_layer" => return Some("per_layer_token_embd".into()),
        "model.per_layer_model_projection" => return Some("per_layer_model_proj".into()),
        "model.per_layer_projection_norm" => return Some("per_layer_proj_norm".into()),
        "model.norm" => return Some("output_norm".into()),
        "lm_head" => return Some("output".into()),
        _ => {}
    }
    let (layer, part) = module.strip_prefix("model.layers.")?.split_once('.')?;
    let gguf = match part {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        // Gemma's `post_attention_layernorm` follows attention; its MLP's input norm is
        // `pre_feedforward_layernorm`, which llama.cpp calls `ffn_norm`.
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" | "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        // Phi-3's fused projections.
        "self_attn.qkv_proj" => "attn_qkv",
        "mlp.gate_up_proj" => "ffn_up",
        // Gemma 4's per-layer inputs and the norms of its experts' block.
        "per_layer_input_gate" => "inp_gate",
        "per_layer_projection" => "proj",
        "post_per_layer_input_norm" => "post_norm",
        "post_feedforward_layernorm_1" => "post_ffw_norm_1",
        "pre_feedforward_layernorm_2" => "pre_ffw_norm_2",
        "post_feedforward_layernorm_2" => "post_ffw_norm_2",
        // LFM2's short convolution.
        "conv.in_proj" => "shortconv.in_proj",
        "conv.out_proj" => "shortconv.out_proj",
        other => experts::stem(other)?,
    };
    Some(format!("blk.{layer}.{gguf}"))
}

/// llama.cpp converter's `rope_freqs` for Llama 3.1 scaling: per rotated pair, the factor its
/// period is multiplied by (`LlamaModel.generate_extra_tensors`).
fn llama3_rope_freqs(
    theta: f32,
    dim: usize,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original: usize,
) -> Vec<f32> {
    let (factor, low, high) = (
        f64::from(factor),
        f64::from(low_freq_factor),
        f64::from(high_freq_factor),
    );
    let original = original as f64;
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..dim / 2)
        .map(|i| {
            // As torch computes it, in f32.
            let freq = 1.0f32 / theta.powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * std::f64::consts::PI / f64::from(freq);
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// The byte-level BPE vocabulary of `tokenizer.json` as llama.cpp's `gpt2` tokenizer metadata.
fn write_vocabulary(
    w: &mut GgufWriter,
    checkpoint: &Checkpoint,
    c: &ModelConfig,
) -> Result<(), Error> {
    let tokenizer = read_json(&checkpoint.dir().join("tokenizer.json"))?;
    let model = &tokenizer["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err("tokenizer.json: only a BPE model can be exported".into());
    }
    // Byte-level BPE with GPT-2's split is llama.cpp's `default` pre-tokenizer; others would need
    // their own name (`llama3`, `qwen2`, `smollm`, ...), which this example does not map.
    let pre = &tokenizer["pre_tokenizer"];
    if pre["type"].as_str() != Some("ByteLevel") || pre["use_regex"].as_bool() == Some(false) {
        return Err(format!(
            "tokenizer.json: pre-tokenizer {pre} is not a plain ByteLevel one (llama.cpp's `default`)"
        )
        .into());
    }
    let mut tokens: BTreeMap<usize, (String, i32)> = BTreeMap::new();
    let vocab = model["vocab"]
        .as_object()
        .ok_or("tokenizer.json: model.vocab is not an object")?;
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or("tokenizer.json: a vocab id is not a number")? as usize;
        // llama.cpp's token types: 1 normal.
        tokens.insert(id, (token.clone(), 1));
    }
    for added in tokenizer["added_tokens"].as_array().into_iter().flatten() {
        let id = added["id"]
            .as_u64()
            .ok_or("tokenizer.json: an added token has no id")? as usize;
        let content = added["content"]
            .as_str()
            .ok_or("tokenizer.json: an added token has no content")?;
        // 3 control (special), 4 user-defined.
        let ty = if added["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        tokens.insert(id, (content.to_owned(), ty));
    }
    let size = tokens.keys().next_back().map_or(0, |&id| id + 1);
    if size > c.vocab_size {
        return Err(format!(
            "tokenizer.json has ids up to {} but vocab_size is {}",
            size - 1,
            c.vocab_size
        )
        .into());
    }
    // Unused embedding rows get placeholder pieces (5: unused), as llama.cpp's converter writes.
    let (pieces, types): (Vec<GgufValue>, Vec<GgufValue>) = (0..c.vocab_size)
        .map(|id| {
            let (piece, ty) = tokens
                .get(&id)
                .cloned()
                .unwrap_or_else(|| (format!("[PAD{id}]"), 5));
            (GgufValue::String(piece), GgufValue::I32(ty))
        })
        .unzip();
    let merges: Vec<GgufValue> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Value::String(a)), Some(Value::String(b))) => Ok(format!("{a} {b}")),
                _ => Err("tokenizer.json: a merge is not a pair of strings"),
            },
            _ => Err("tokenizer.json: a merge is not a string or a pair"),
        })
        .map(|m| m.map(GgufValue::String))
        .collect::<Result<_, _>>()?;
    let add_bos = read_json(&checkpoint.dir().join("tokenizer_config.json"))
        .ok()
        .and_then(|t| t["add_bos_token"].as_bool())
        .unwrap_or(false);
    w.metadata("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", GgufValue::String("default".into()))
        .metadata("tokenizer.ggml.tokens", GgufValue::Array(pieces))
        .metadata("tokenizer.ggml.token_type", GgufValue::Array(types))
        .metadata("tokenizer.ggml.merges", GgufValue::Array(merges))
        .metadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(add_bos));
    if let Some(bos) = c.bos_token_id {
        w.metadata("tokenizer.ggml.bos_token_id", GgufValue::U32(bos));
    }
    if let Some(&eos) = c.eos_token_ids.first() {
        w.metadata("tokenizer.ggml.eos_token_id", GgufValue::U32(eos));
    }
    Ok(())
}

/// `GgufWriter` writes an empty array with u8 items; llama.cpp requires `tokenizer.ggml.merges`
/// to be an array of strings even when there are none, so its item type is set to string (8).
fn type_empty_array_as_strings(bytes: &mut [u8], key: &str) {
    let mut pattern = (key.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(key.as_bytes());
    pattern.extend_from_slice(&9u32.to_le_bytes()); // array
    pattern.extend_from_slice(&0u32.to_le_bytes()); // of u8
    pattern.extend_from_slice(&0u64.to_le_bytes()); // empty
    if let Some(at) = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
    {
        let item_type = at + 8 + key.len() + 4;
        bytes[item_type..item_type + 4].copy_from_slice(&8u32.to_le_bytes());
    }
}

/// A module's tensor (`weight` or `bias`) as f32 values and its logical shape; quantized weights
/// dequantized (`scale · q + bias` in f32).
fn tensor_f32(
    checkpoint: &Checkpoint,
    module: &str,
    suffix: &str,
) -> Result<(Vec<f32>, Vec<usize>), Error> {
    let name = format!("{module}.{suffix}");
    let view = checkpoint
        .tensor(&name)
        .ok_or_else(|| format!("tensor `{name}` is missing"))?;
    if suffix == "weight"
        && let Some(spec) = checkpoint.quantization_of(module)
    {
        let scales = checkpoint
            .tensor(&format!("{module}.scales"))
            .ok_or_else(|| format!("`{module}.scales` is missing"))?;
        let biases = checkpoint
            .tensor(&format!("{module}.biases"))
            .ok_or_else(|| format!("`{module}.biases` is missing"))?;
        let rows = view.shape[0];
        let cols = view.shape[1] * 32 / spec.bits as usize;
        let values = dequantize_affine(
            spec,
            rows,
            cols,
            view.data,
            (scales.dtype, scales.data),
            (biases.dtype, biases.data),
        )
        .ok_or_else(|| format!("`{module}`: quantized tensors do not fit their shape"))?;
        return Ok((values, vec![rows, cols]));
    }
    let values = match view.dtype {
        Dtype::F32 => view
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => view
            .data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => view
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(format!("`{name}` is {other}, not a float").into()),
    };
    Ok((values, view.shape.to_vec()))
}

fn read_json(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// Converts the GGUF back with our importer into `dir` and lists what differs from the checkpoint.
fn round_trip(
    checkpoint: &Checkpoint,
    gguf: &Path,
    dir: &Path,
    lossy: &[Lossy],
) -> Result<Vec<String>, Error> {
    convert_gguf(gguf, dir)?;
    let back = Checkpoint::open(dir)?;
    let (a, b) = (checkpoint.config(), back.config());
    let mut problems = Vec::new();
    let mut compared = 0;
    for module in expected_modules(a) {
        // A linear-attention layer's tensors are compared below, in the form the GGUF holds.
        if module.name.contains(".linear_attn.") {
            continue;
        }
        let bias = matches!(module.kind, ModuleKind::Linear { bias: true, .. });
        let norm = matches!(module.kind, ModuleKind::Norm { .. });
        for suffix in ["weight", "bias"] {
            if suffix == "bias" && !bias {
                continue;
            }
            let name = format!("{}.{suffix}", module.name);
            let (ours, _) = tensor_f32(checkpoint, &module.name, suffix)?;
            let theirs = match tensor_f32(&back, &module.name, suffix) {
                Ok((values, _)) => values,
                Err(e) => {
                    problems.push(format!("{name}: {e}"));
                    continue;
                }
            };
            // Norms compared as the weight each side multiplies by (`1 + w` where the layout
            // stores `w`), which is what the GGUF holds.
            let key = |v: f32, offset: bool| {
                if offset && norm {
                    (1.0 + v).to_bits()
                } else {
                    v.to_bits()
                }
            };
            let differ = ours.len() != theirs.len()
                || ours
                    .iter()
                    .zip(&theirs)
                    .any(|(x, y)| key(*x, a.norm_weight_offset) != key(*y, b.norm_weight_offset));
            if differ {
                problems.push(format!("{name}: values differ after import"));
            }
            compared += 1;
        }
    }
    let arch = a.architecture.gguf_name();
    for (layer, net) in a.layers.iter().enumerate() {
        let (Some(net), Some(net_b)) = (net.linear, b.layers[layer].linear) else {
            continue;
        };
        let ours = delta_net::layer_tensors(checkpoint, a, arch, layer, &net)?;
        let theirs = match delta_net::layer_tensors(&back, b, arch, layer, &net_b) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("layer {layer}'s linear attention: {e}"));
                continue;
            }
        };
        for (x, y) in ours.iter().zip(&theirs) {
            // `ssm_a` comes back through `ln(-ssm_a)` and `-exp` of it: within an ulp or two.
            let close = |p: f32, q: f32| {
                if x.name.ends_with(".ssm_a") {
                    (p - q).abs() <= 4.0 * f32::EPSILON * p.abs()
                } else {
                    p.to_bits() == q.to_bits()
                }
            };
            if x.name != y.name
                || x.dims != y.dims
                || x.values.iter().zip(&y.values).any(|(p, q)| !close(*p, *q))
            {
                problems.push(format!("{}: differs after import", x.name));
            }
            compared += 1;
        }
    }
    let mut lossy_fields: Vec<&str> = lossy.iter().map(|l| l.field).collect();
    // A hybrid comes back in the GGUF's layout (projections apart, value heads as llama.cpp
    // orders them, norms stored as `w`): compared above as what the GGUF holds.
    if is_hybrid(a) {
        lossy_fields.push("norm_weight_offset");
        let layout = |c: &ModelConfig| -> Vec<_> {
            c.layers
                .iter()
                .map(|l| {
                    let mut l = *l;
                    if let Some(net) = &mut l.linear {
                        net.fused_projections = false;
                        net.tiled_value_heads = false;
                    }
                    l
                })
                .collect()
        };
        if layout(a) == layout(b) {
            lossy_fields.push("layers");
        }
    }
    // Llama 3.1's scaling comes back as llama.cpp stores it: per-pair factors on the periods
    // (`rope_freqs`). Compare what RoPE computes, the periods, instead of the spelling.
    if matches!(a.rope_scaling, Some(RopeScaling::Llama3 { .. })) && b.rope_factors.is_some() {
        lossy_fields.extend(["rope_scaling", "rope_factors"]);
        let (pa, pb) = (a.rope_periods(), b.rope_periods());
        let close =
            pa.len() == pb.len() && pa.iter().zip(&pb).all(|(x, y)| ((x - y) / x).abs() <= 1e-6);
        if !close {
            problems.push(format!(
                "rope periods differ after import: {pa:?} in the checkpoint, {pb:?} after"
            ));
        }
    }
    for (field, ours, theirs) in config_fields(a, b) {
        // Mistral comes back as the llama it was written as.
        let renamed = field == "architecture"
            && format!("{:?}", gguf_architecture(a.architecture).1) == theirs;
        if ours != theirs && !renamed && !lossy_fields.contains(&field) {
            problems.push(format!(
                "config {field}: {ours} in the checkpoint, {theirs} after import"
            ));
        }
    }
    if problems.is_empty() {
        println!(
            "roundtrip: {compared} tensors equal, config equal{}",
            if lossy.is_empty() {
                ""
            } else {
                " but for the lossy fields"
            }
        );
    }
    Ok(problems)
}

/// Every `ModelConfig` field a GGUF can carry, as text, for both configs.
fn config_fields(a: &ModelConfig, b: &ModelConfig) -> Vec<(&'static str, String, String)> {
    macro_rules! fields {
        ($($field:ident),* $(,)?) => {
            vec![$((stringify!($field), format!("{:?}", a.$field), format!("{:?}", b.$field))),*]
        };
    }
    fields!(
        architecture,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        intermediate_size,
        rms_norm_eps,
        rope_theta,
        rope_scaling,
        tie_word_embeddings,
        max_position_embeddings,
        vocab_size,
        attention_qkv_bias,
        attention_out_bias,
        qk_norm,
        attention_sinks,
        layers,
        feed_forward,
        norm_weight_offset,
        sandwich_norms,
        hidden_activation,
        embedding_scale,
        attention_scale,
        attn_logit_softcapping,
        final_logit_softcapping,
        rope_local_theta,
        rotary_dim,
        rope_factors,
        rope_attention_factor,
        eos_token_ids,
        bos_token_id,
    )
}
