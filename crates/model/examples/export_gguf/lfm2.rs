//! LFM2 and LFM2-MoE as llama.cpp's converter writes them: `attention.head_count_kv` per layer
//! (0 for a short convolution), `shortconv.l_cache`, the convolution's taps as
//! `blk.{i}.shortconv.conv` (`[hidden, taps]`, the taps innermost) beside its `in_proj` and
//! `out_proj`, the final norm as `token_embd_norm`; LFM2-MoE's `leading_dense_block_count`,
//! `expert_gating_func` (sigmoid) and each routed layer's selection bias `exp_probs_b`.

use mlxcel_model::gguf::{GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, ModelConfig, Routing};

use super::experts::Tensor;
use super::{Error, tensor_f32};

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: u32 = 2;

/// Whether `c` has short-convolution layers (LFM2's families).
pub fn is_lfm2(c: &ModelConfig) -> bool {
    c.layers.iter().any(|l| l.conv.is_some())
}

/// The per-layer key/value head counts (0 for a convolution), the taps, and LFM2-MoE's dense
/// lead and sigmoid gating. `head_count_kv` is written here instead of as
/// one number.
pub fn write_metadata(w: &mut GgufWriter, c: &ModelConfig, arch: &str) -> Result<(), Error> {
    let key = |k: &str| format!("{arch}.{k}");
    let kv = c
        .layers
        .iter()
        .map(|l| {
            let heads = if l.conv.is_some() {
                0
            } else {
                c.num_key_value_heads
            };
            GgufValue::U32(heads as u32)
        })
        .collect();
    let taps = c
        .layers
        .iter()
        .find_map(|l| l.conv)
        .map_or(0, |conv| conv.kernel);
    if c.layers
        .iter()
        .any(|l| l.conv.is_some_and(|s| s.kernel != taps))
    {
        return Err("the convolutions differ in taps: GGUF has one `shortconv.l_cache`".into());
    }
    w.metadata(&key("attention.head_count_kv"), GgufValue::Array(kv))
        .metadata(&key("shortconv.l_cache"), GgufValue::U32(taps as u32));
    if let Some(first) = c.feed_forward.iter().position(|f| f.routed().is_some()) {
        if c.feed_forward[first..].iter().any(|f| f.routed().is_none()) {
            return Err(format!(
                "a dense layer after routed layer {first}: llama.cpp's `{arch}` keeps only the \
                 leading layers dense (`leading_dense_block_count`)"
            )
            .into());
        }
        w.metadata(
            &key("leading_dense_block_count"),
            GgufValue::U32(first as u32),
        )
        .metadata(&key("expert_gating_func"), GgufValue::U32(GATING_SIGMOID));
    }
    Ok(())
}

/// The tensors of layer `layer` that are not modules of `expected_modules`: a convolution's
/// taps (`shortconv.conv`, `[hidden, taps]` in ggml's order `[taps, hidden]`), and a routed
/// layer's selection bias (`exp_probs_b.bias`; zeros when the experts are picked without one,
/// since llama.cpp's `lfm2moe` always adds it).
pub fn layer_tensors(
    checkpoint: &Checkpoint,
    c: &ModelConfig,
    layer: usize,
) -> Result<Vec<Tensor>, Error> {
    let p = format!("model.layers.{layer}");
    let mut out = Vec::new();
    if let Some(conv) = c.layers[layer].conv {
        let (values, _) = tensor_f32(checkpoint, &format!("{p}.conv.conv"), "weight")?;
        // Every stored layout (`[hidden, 1, taps]`, `[hidden, taps, 1]`, `[hidden, taps]`) holds
        // each channel's taps together.
        out.push(Tensor {
            name: format!("blk.{layer}.shortconv.conv.weight"),
            imported_as: format!("{p}.conv.conv.weight"),
            dims: vec![conv.kernel as u64, c.hidden_size as u64],
            values,
        });
    }
    if let Some(moe) = c.feed_forward[layer].routed()
        && let Routing::SigmoidTopK { selection_bias, .. } = moe.routing
    {
        let values = if selection_bias {
            tensor_f32(checkpoint, &format!("{p}.mlp"), "expert_bias")?.0
        } else {
            vec![0.0; moe.num_experts]
        };
        out.push(Tensor {
            name: format!("blk.{layer}.exp_probs_b.bias"),
            imported_as: format!("{p}.mlp.expert_bias"),
            dims: vec![moe.num_experts as u64],
            values,
        });
    }
    Ok(out)
}
