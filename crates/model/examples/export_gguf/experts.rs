//! A mixture of experts as llama.cpp's converters write it: the `{arch}.expert_*` keys, each
//! layer's experts stacked into 3-D `ffn_{gate,up,down}_exps` (`[experts, out, in]`, biases
//! `[experts, out]`), the router `ffn_gate_inp`, and Qwen2-MoE's shared expert (`*_shexp`) with
//! its gate `ffn_gate_inp_shexp` (a vector).

use mlxcel_model::gguf::{GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, ModelConfig, RoutedExperts, Routing};

use super::{Error, Lossy, tensor_f32};

/// One tensor for the writer: its GGUF name, what our importer must read it back as
/// (`module.suffix`), its GGUF dims (innermost first) and f32 values.
pub struct Tensor {
    pub name: String,
    pub imported_as: String,
    pub dims: Vec<u64>,
    pub values: Vec<f32>,
}

/// Whether llama.cpp's graph for `arch` renormalises the top-k weights (it hard-codes it per
/// architecture), for the architectures with experts.
fn llama_renormalizes(arch: &str) -> Option<bool> {
    match arch {
        "qwen3moe" | "llama" | "qwen3next" | "qwen35moe" => Some(true),
        "qwen2moe" | "olmoe" => Some(false),
        // LFM2-MoE: the sigmoids of the picked experts over their sum.
        "lfm2moe" => Some(true),
        // gpt-oss: a softmax over the top-k logits, which sum to one.
        "gpt-oss" => Some(true),
        _ => None,
    }
}

/// The experts of `c` (`None`: a dense model). Every layer must route: llama.cpp's MoE
/// architectures have no dense layers.
pub fn routed(c: &ModelConfig) -> Result<Option<RoutedExperts>, Error> {
    let Some(first) = c.feed_forward.iter().find_map(|f| f.routed()).copied() else {
        return Ok(None);
    };
    // LFM2-MoE's leading dense layers are llama.cpp's `leading_dense_block_count`
    // (`export_gguf/lfm2.rs`, which refuses a dense layer after a routed one).
    let lead = if c.architecture.gguf_name() == "lfm2moe" {
        c.feed_forward
            .iter()
            .position(|f| f.routed().is_some())
            .unwrap_or(0)
    } else {
        0
    };
    if let Some(dense) = c.feed_forward[lead..]
        .iter()
        .position(|f| f.routed().is_none())
        .map(|i| i + lead)
    {
        return Err(format!(
            "layer {dense} is a dense MLP in a mixture of experts: llama.cpp's `{}` routes every \
             layer",
            c.architecture.gguf_name()
        )
        .into());
    }
    if c.feed_forward[lead..]
        .iter()
        .any(|f| f.routed() != Some(&first))
    {
        return Err("the layers' experts differ in shape: GGUF has one set of expert keys".into());
    }
    Ok(Some(first))
}

/// Refuses what llama.cpp's MoE graphs cannot hold: OLMoE's whole-projection k norm over fewer
/// key/value heads than query heads (llama.cpp's `olmoe` sizes it by the hidden size).
pub fn check(c: &ModelConfig, arch: &str) -> Result<(), Error> {
    if arch == "olmoe" && c.num_key_value_heads != c.num_attention_heads {
        return Err(format!(
            "{} key/value heads for {} query heads: llama.cpp's `olmoe` normalises k over the \
             hidden size, so its k_norm cannot hold grouped-query attention",
            c.num_key_value_heads, c.num_attention_heads
        )
        .into());
    }
    Ok(())
}

/// Writes the `{arch}.expert_*` keys, and names what llama.cpp computes differently.
pub fn write_metadata(
    w: &mut GgufWriter,
    c: &ModelConfig,
    moe: &RoutedExperts,
    arch: &str,
    lossy: &mut Vec<Lossy>,
) {
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = |v: usize| GgufValue::U32(v as u32);
    w.metadata(&key("expert_count"), u32v(moe.num_experts))
        .metadata(&key("expert_used_count"), u32v(moe.top_k))
        .metadata(
            &key("expert_feed_forward_length"),
            u32v(moe.expert_intermediate_size),
        );
    if let Some(shared) = moe.shared_expert_intermediate_size {
        w.metadata(&key("expert_shared_feed_forward_length"), u32v(shared));
    }
    let renormalized = match moe.routing {
        Routing::SoftmaxTopK { renormalize } => renormalize,
        Routing::TopKSoftmax => true,
        Routing::SigmoidTopK {
            renormalize,
            selection_bias,
        } => {
            // LFM2-MoE (`export_gguf/lfm2.rs` writes the sigmoid gating and the bias).
            if !selection_bias {
                lossy.push(Lossy {
                    field: "feed_forward",
                    why: "experts picked without a bias (`use_expert_bias: false`): llama.cpp's                           lfm2moe always adds `exp_probs_b`, written as zeros"
                        .to_string(),
                });
            }
            renormalize
        }
    };
    if let Some(theirs) = llama_renormalizes(arch)
        && theirs != renormalized
    {
        lossy.push(Lossy {
            field: "feed_forward",
            why: format!(
                "norm_topk_prob {renormalized}: llama.cpp's `{arch}` {} the top-k weights \
                 whatever the file says",
                if theirs {
                    "always renormalises"
                } else {
                    "never renormalises"
                }
            ),
        });
    }
    if c.intermediate_size != moe.expert_intermediate_size && arch == "llama" {
        // Mixtral's experts are sized by feed_forward_length in llama.cpp.
        w.metadata(
            &key("feed_forward_length"),
            u32v(moe.expert_intermediate_size),
        );
    }
}

/// The tensors of layer `layer`'s experts, written when the loop over modules reaches its first
/// expert's `proj` (`gate_proj`, `up_proj`, `down_proj`): all experts' `proj` stacked, and their
/// biases when the experts have them.
pub fn stacked(
    checkpoint: &Checkpoint,
    moe: &RoutedExperts,
    layer: usize,
    proj: &str,
) -> Result<Vec<Tensor>, Error> {
    let gguf = match proj {
        "gate_proj" => "ffn_gate_exps",
        "up_proj" => "ffn_up_exps",
        "down_proj" => "ffn_down_exps",
        other => return Err(format!("experts have no `{other}`").into()),
    };
    let p = format!("model.layers.{layer}.mlp");
    let suffixes: &[&str] = if moe.biases {
        &["weight", "bias"]
    } else {
        &["weight"]
    };
    let mut out = Vec::new();
    for &suffix in suffixes {
        let (mut values, mut shape) = (Vec::new(), Vec::new());
        for j in 0..moe.num_experts {
            let (v, s) = tensor_f32(checkpoint, &format!("{p}.experts.{j}.{proj}"), suffix)?;
            values.extend(v);
            shape = s;
        }
        let mut dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        dims.push(moe.num_experts as u64);
        out.push(Tensor {
            name: format!("blk.{layer}.{gguf}.{suffix}"),
            imported_as: format!("{p}.switch_mlp.{proj}.{suffix}"),
            dims,
            values,
        });
    }
    Ok(out)
}

/// llama.cpp's stem for a mixture of experts' module that is not an expert (`mlp.gate`, the
/// shared expert and its gate), under `blk.{layer}.`.
pub fn stem(part: &str) -> Option<&'static str> {
    Some(match part {
        "mlp.gate" => "ffn_gate_inp",
        "mlp.shared_expert.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" => "ffn_down_shexp",
        "mlp.shared_expert_gate" => "ffn_gate_inp_shexp",
        _ => return None,
    })
}
