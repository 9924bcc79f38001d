//! Gemma 4's GGUF side, as llama.cpp's `gemma4` holds it: its tensor names beyond Gemma's
//! (`layer_output_scale`, the per-layer inputs, the mixture of experts' router scales and norms)
//! and the config.json keys its header implies (head sizes per layer type, shared KV layers,
//! per-layer inputs, the proportional RoPE from `rope_freqs`, the experts).

use serde_json::{Value, json};

use super::gemma2::gemma_tensor_name;
use crate::gguf::header::{GgufHeader, shortest};

/// A `rope_freqs` factor at least this large marks a pair that does not rotate (llama.cpp's
/// converter writes 1e30 there).
const UNROTATED: f32 = 1e29;

/// The Hugging Face module and suffix of a `gemma4` tensor.
pub(super) fn gguf_tensor(gguf_name: &str) -> Option<(String, &str)> {
    match gguf_name {
        "per_layer_token_embd.weight" => {
            return Some(("model.embed_tokens_per_layer".into(), "weight"));
        }
        "per_layer_model_proj.weight" => {
            return Some(("model.per_layer_model_projection".into(), "weight"));
        }
        "per_layer_proj_norm.weight" => {
            return Some(("model.per_layer_projection_norm".into(), "weight"));
        }
        _ => {}
    }
    if let Some(rest) = gguf_name.strip_prefix("blk.")
        && let Some((layer, part)) = rest.split_once('.')
        && let Ok(layer) = layer.parse::<usize>()
    {
        let p = format!("model.layers.{layer}");
        // Tensors that are not a module's `weight`: the layer scalar and the router's scales.
        match part {
            "layer_output_scale.weight" => return Some((p, "layer_scalar")),
            "ffn_gate_inp.scale" => return Some((format!("{p}.router"), "scale")),
            "ffn_down_exps.scale" => return Some((format!("{p}.router"), "per_expert_scale")),
            _ => {}
        }
        let (stem, suffix) = part.rsplit_once('.')?;
        let module = match stem {
            "inp_gate" => "per_layer_input_gate",
            "proj" => "per_layer_projection",
            "post_norm" => "post_per_layer_input_norm",
            "pre_ffw_norm_2" => "pre_feedforward_layernorm_2",
            "post_ffw_norm_1" => "post_feedforward_layernorm_1",
            "post_ffw_norm_2" => "post_feedforward_layernorm_2",
            _ => return gemma_tensor_name(gguf_name),
        };
        return (suffix == "weight").then(|| (format!("{p}.{module}"), suffix));
    }
    gemma_tensor_name(gguf_name)
}

/// config.json's Gemma 4 keys from a `gemma4` header.
pub(super) fn gguf_config(header: &GgufHeader, config: &mut Value) {
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["hidden_act"] = json!("gelu_pytorch_tanh");
    config["final_logit_softcapping"] = json!(header.final_softcap);
    // The full layers' head is the key length, the sliding layers' `key_length_swa`.
    let global = header.head_dim;
    let local = header.key_length_swa.map_or(global, |d| d as usize);
    config["head_dim"] = json!(local);
    config["global_head_dim"] = json!(global);
    let sliding = |i: usize| header.sliding_layers.get(i).copied().unwrap_or(false);
    config["sliding_window"] = json!(header.sliding_window);
    config["layer_types"] = json!(
        (0..header.block_count as usize)
            .map(|i| if sliding(i) {
                "sliding_attention"
            } else {
                "full_attention"
            })
            .collect::<Vec<_>>()
    );
    // Per-layer key/value heads: the sliding layers' and the full layers' counts.
    if let Some(counts) = &header.head_count_kv_per_layer {
        let of = |slides: bool| {
            (0..counts.len())
                .find(|&i| sliding(i) == slides)
                .map(|i| counts[i])
        };
        if let Some(n) = of(true) {
            config["num_key_value_heads"] = json!(n);
        }
        if let (Some(full), Some(local)) = (of(false), of(true))
            && full != local
        {
            config["num_global_key_value_heads"] = json!(full);
        }
    }
    config["num_kv_shared_layers"] = json!(header.shared_kv_layers.unwrap_or(0));
    config["hidden_size_per_layer_input"] = json!(header.embedding_length_per_layer.unwrap_or(0));
    config["vocab_size_per_layer_input"] = json!(header.vocab_size);
    // The shared layers' MLP twice as wide as the others' (`use_double_wide_mlp`), as
    // llama.cpp's converter writes it: one width per layer.
    let shared = header.shared_kv_layers.unwrap_or(0) as usize;
    let first_shared = (header.block_count as usize).saturating_sub(shared);
    let n = header.feed_forward_length;
    let double_wide = header
        .feed_forward_length_per_layer
        .as_ref()
        .is_some_and(|widths| {
            shared > 0
                && widths
                    .iter()
                    .enumerate()
                    .all(|(i, &w)| w == if i < first_shared { n } else { 2 * n })
        });
    config["use_double_wide_mlp"] = json!(double_wide);
    config["attention_k_eq_v"] = json!(header.keys_as_values);
    // The full layers' proportional RoPE: llama.cpp's `rope_freqs` has factor 1 (or the
    // scaling's factor) on the pairs that rotate and 1e30 on the others.
    let factors = header.long_factors.clone().unwrap_or_default();
    let rotated = factors.iter().take_while(|&&f| f < UNROTATED).count();
    let factor = factors
        .first()
        .copied()
        .filter(|&f| f < UNROTATED)
        .unwrap_or(1.0);
    let pairs = (global / 2).max(1);
    config["rope_theta"] = Value::Null;
    config["rope_parameters"] = json!({
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": shortest(header.rope_theta_swa.unwrap_or(10_000.0)),
        },
        "full_attention": {
            "rope_type": "proportional",
            "rope_theta": shortest(header.rope_theta),
            "partial_rotary_factor": if factors.is_empty() { 1.0 } else { rotated as f64 / pairs as f64 },
            "factor": shortest(factor),
        },
    });
    if let Some(experts) = header.experts {
        config["enable_moe_block"] = json!(true);
        config["num_experts"] = json!(experts.count);
        config["top_k_experts"] = json!(experts.used);
        config["moe_intermediate_size"] = json!(
            experts
                .feed_forward_length
                .unwrap_or(header.feed_forward_length)
        );
    }
}
