//! Gemma's GGUF keys (the soft-caps) and what llama.cpp computes differently from the
//! checkpoint (the query scale, the embedding scale).

use mlxcel_model::ModelConfig;
use mlxcel_model::gguf::{GgufValue, GgufWriter};

use super::Lossy;

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
