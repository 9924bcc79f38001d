//! Gemma's GGUF keys (the soft-caps) and what llama.cpp computes differently from the
//! checkpoint (the query scale, the embedding scale); Gemma 4's keys, `rope_freqs` and the
//! tensors of a layer that are not modules (its scalar, its router's scales).

use mlxcel_model::gguf::{GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, ModelConfig};

use super::experts::Tensor;
use super::{Lossy, tensor_f32};

/// Gemma's soft-caps, and what llama.cpp computes differently: the query scale (GGUF has no
/// `query_pre_attn_scalar`) and the embedding scale.
pub fn write_gemma(
    w: &mut GgufWriter,
    c: &ModelConfig,
    key: &dyn Fn(&str) -> String,
    lossy: &mut Vec<Lossy>,
) {
    let caps = [
        ("attn_logit_softcapping", c.attn_logit_softcapping),
        ("final_logit_softcapping", c.final_logit_softcapping),
    ];
    for (name, cap) in caps {
        if let Some(cap) = cap {
            w.metadata(&key(name), GgufValue::F32(cap));
        }
    }
    if c.architecture.gguf_name() == "gemma3" && c.attn_logit_softcapping.is_some() {
        lossy.push(Lossy {
            field: "attn_logit_softcapping",
            why: "llama.cpp's gemma3 does not soft-cap attention scores".into(),
        });
    }
    // llama.cpp scales queries by 1/√head_dim, except for the 27B models (by layer count), which
    // use hidden / heads.
    let big = match c.architecture.gguf_name() {
        "gemma2" => c.num_hidden_layers == 46,
        _ => c.num_hidden_layers == 62,
    };
    let denominator = if big {
        (c.hidden_size / c.num_attention_heads) as f32
    } else {
        c.head_dim as f32
    };
    if 1.0 / denominator.sqrt() != c.attention_scale {
        lossy.push(Lossy {
            field: "attention_scale",
            why: format!(
                "1/√{:.2} (query_pre_attn_scalar): GGUF has no key for it; llama.cpp scales by \
                 1/√{denominator}",
                1.0 / (c.attention_scale * c.attention_scale)
            ),
        });
    }
    if c.embedding_scale != Some((c.hidden_size as f32).sqrt()) {
        lossy.push(Lossy {
            field: "embedding_scale",
            why: format!(
                "{:?} (√hidden rounded to bf16); llama.cpp multiplies by √hidden unrounded",
                c.embedding_scale
            ),
        });
    }
}

/// llama.cpp's converter marks a pair of the full layers' head that does not rotate with this
/// factor on its period.
const UNROTATED: f32 = 1e30;

/// Gemma 4's keys (`gemma4`): the head sizes of each layer type, the key/value heads per layer
/// when the full layers have their own count, the shared KV layers, the per-layer inputs' width,
/// the RoPE widths, the MLP widths (per layer when the shared layers' are double) and the final
/// soft-cap.
pub fn write_gemma4(
    w: &mut GgufWriter,
    c: &ModelConfig,
    key: &dyn Fn(&str) -> String,
    lossy: &mut Vec<Lossy>,
) -> Result<(), Box<dyn std::error::Error>> {
    let u32v = |v: usize| GgufValue::U32(v as u32);
    // One value per layer where the layers differ (the full layers' key/value heads with keys
    // as values; the shared layers' double-wide MLP), else one number.
    let per_layer = |values: Vec<usize>| {
        if values.iter().all(|&v| v == values[0]) {
            u32v(values[0])
        } else {
            GgufValue::Array(values.into_iter().map(u32v).collect())
        }
    };
    let widths = c
        .feed_forward
        .iter()
        .map(|f| match f {
            mlxcel_model::FeedForward::Dense {
                intermediate_size, ..
            } => *intermediate_size,
            mlxcel_model::FeedForward::RoutedExperts(moe) => {
                moe.parallel_dense.unwrap_or(c.intermediate_size)
            }
        })
        .collect();
    let heads = (0..c.num_hidden_layers)
        .map(|i| c.layer_kv_heads(i))
        .collect();
    w.metadata(&key("feed_forward_length"), per_layer(widths))
        .metadata(&key("attention.head_count_kv"), per_layer(heads));
    let full = c.global_head_dim.unwrap_or(c.head_dim);
    w.metadata(&key("attention.key_length"), u32v(full))
        .metadata(&key("attention.value_length"), u32v(full))
        .metadata(&key("attention.key_length_swa"), u32v(c.head_dim))
        .metadata(&key("attention.value_length_swa"), u32v(c.head_dim))
        .metadata(&key("rope.dimension_count_swa"), u32v(c.head_dim))
        .metadata(&key("attention.shared_kv_layers"), u32v(c.kv_shared_layers))
        .metadata(
            &key("embedding_length_per_layer_input"),
            u32v(c.per_layer_input.map_or(0, |p| p.hidden)),
        );
    if let Some(cap) = c.final_logit_softcapping {
        w.metadata(&key("final_logit_softcapping"), GgufValue::F32(cap));
    }
    if c.embedding_scale != Some((c.hidden_size as f32).sqrt()) {
        lossy.push(Lossy {
            field: "embedding_scale",
            why: format!(
                "{:?}; llama.cpp multiplies by √hidden unrounded",
                c.embedding_scale
            ),
        });
    }
    Ok(())
}

/// Gemma 4's `rope_freqs`: the full layers' per-pair factors on their periods (1 where a pair
/// rotates, 1e30 where it does not, as llama.cpp's converter writes them).
pub fn gemma4_rope_freqs(c: &ModelConfig) -> Vec<f32> {
    let pairs = c.global_head_dim.unwrap_or(c.head_dim) / 2;
    match &c.rope_factors {
        Some(factors) => factors
            .iter()
            .map(|&f| if f.is_finite() { f } else { UNROTATED })
            .collect(),
        None => vec![1.0; pairs],
    }
}

/// Gemma 4's tensors of layer `layer` that are not modules of `expected_modules`: its scalar
/// (`layer_output_scale`, `[1]`) and, with experts, the router's input scale
/// (`ffn_gate_inp.scale`, `[hidden]`) and per-expert scales (`ffn_down_exps.scale`,
/// `[experts]`: llama.cpp scales each expert's output, the same product).
pub fn gemma4_layer_tensors(
    checkpoint: &Checkpoint,
    c: &ModelConfig,
    layer: usize,
) -> Result<Vec<Tensor>, Box<dyn std::error::Error>> {
    let p = format!("model.layers.{layer}");
    let mut out = Vec::new();
    if c.layer_scalars {
        out.push(Tensor {
            name: format!("blk.{layer}.layer_output_scale.weight"),
            imported_as: format!("{p}.layer_scalar"),
            dims: vec![1],
            values: tensor_f32(checkpoint, &p, "layer_scalar")?.0,
        });
    }
    if let Some(moe) = c.feed_forward[layer]
        .routed()
        .filter(|m| m.parallel_dense.is_some())
    {
        let router = format!("{p}.router");
        out.push(Tensor {
            name: format!("blk.{layer}.ffn_gate_inp.scale"),
            imported_as: format!("{router}.scale"),
            dims: vec![c.hidden_size as u64],
            values: tensor_f32(checkpoint, &router, "scale")?.0,
        });
        out.push(Tensor {
            name: format!("blk.{layer}.ffn_down_exps.scale"),
            imported_as: format!("{router}.per_expert_scale"),
            dims: vec![moe.num_experts as u64],
            values: tensor_f32(checkpoint, &router, "per_expert_scale")?.0,
        });
    }
    Ok(out)
}
