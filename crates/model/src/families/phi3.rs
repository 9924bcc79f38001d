//! Phi-3 (`Phi3ForCausalLM`: Phi-3, Phi-3.5, Phi-4-mini): q/k/v and gate/up fused in the
//! checkpoint (`qkv_proj`, `gate_up_proj`), partial rotary, LongRoPE scaling.
//!
//! Its `sliding_window` (2047 in Phi-3-mini-4k, 262144 in Phi-3.5) is ignored, as mlx-lm does and
//! as llama.cpp does (it disables Phi's window with a warning); Hugging Face applies it, which
//! differs only past 2047 positions of the 4k model.

use super::family::{Defaults, Family, FusedProjection, Rows, llama_tensor_name};

pub(super) struct Phi3;

/// `self_attn.qkv_proj` (q, k, v rows) and `mlp.gate_up_proj` (gate, then up rows).
const FUSED: &[FusedProjection] = &[
    FusedProjection {
        module: "self_attn.qkv_proj",
        label: "qkv",
        parts: &[
            ("self_attn.q_proj", Rows::Query),
            ("self_attn.k_proj", Rows::KeyValue),
            ("self_attn.v_proj", Rows::KeyValue),
        ],
    },
    FusedProjection {
        module: "mlp.gate_up_proj",
        label: "gate/up",
        parts: &[
            ("mlp.gate_proj", Rows::Intermediate),
            ("mlp.up_proj", Rows::Intermediate),
        ],
    },
];

impl Family for Phi3 {
    fn hf_name(&self) -> &'static str {
        "Phi3ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "phi3"
    }

    /// transformers' `Phi3Config` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 32_064,
            hidden_size: 3072,
            intermediate_size: 8192,
            max_position_embeddings: 4096,
            original_max_position_embeddings: Some(4096),
            rms_norm_eps: 1e-5,
            ..Defaults::LLAMA
        }
    }

    fn gguf_name(&self) -> &'static str {
        "phi3"
    }

    fn fused_projections(&self) -> &'static [FusedProjection] {
        FUSED
    }

    /// Phi-3's fused projections are `attn_qkv`, and `ffn_up` holding gate then up.
    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        let (stem, suffix) = gguf_name.rsplit_once('.')?;
        if let Some(layer) = stem.strip_prefix("blk.") {
            let (n, part) = layer.split_once('.')?;
            let n: usize = n.parse().ok()?;
            let fused = match part {
                "attn_qkv" => Some("self_attn.qkv_proj"),
                "ffn_up" => Some("mlp.gate_up_proj"),
                _ => None,
            };
            if let Some(module) = fused {
                return Some((format!("model.layers.{n}.{module}"), suffix));
            }
        }
        llama_tensor_name(gguf_name)
    }
}
