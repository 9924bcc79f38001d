//! llama.cpp's tensor names and Hugging Face's, as for a llama (each family maps its own
//! differences, [`crate::families`]).

/// Maps a GGUF tensor name to its Hugging Face module and suffix (`weight` or `bias`), as for a
/// llama (each family maps what it names differently).
pub fn hf_name(gguf_name: &str) -> Option<(String, &str)> {
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let module = match stem {
        "token_embd" => "model.embed_tokens".to_owned(),
        "output_norm" => "model.norm".to_owned(),
        "output" => "lm_head".to_owned(),
        // A reranker's classification head (llama.cpp's rank pooling; `crate::RankHead`).
        "cls.output" => crate::RANK_HEAD_MODULE.to_owned(),
        _ => {
            let rest = stem.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let hf = match part {
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "post_attention_norm" => "post_attention_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                // A mixture of experts: the router, the experts stacked `[experts, out, in]`
                // (read as one view per expert, `mlp.experts.{j}.`), the shared expert and its
                // gate.
                "ffn_gate_inp" => "mlp.gate",
                "ffn_gate_exps" => "mlp.switch_mlp.gate_proj",
                "ffn_up_exps" => "mlp.switch_mlp.up_proj",
                "ffn_down_exps" => "mlp.switch_mlp.down_proj",
                "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
                "ffn_up_shexp" => "mlp.shared_expert.up_proj",
                "ffn_down_shexp" => "mlp.shared_expert.down_proj",
                "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
                _ => return None,
            };
            format!("model.layers.{layer}.{hf}")
        }
    };
    Some((module, suffix))
}
