//! gpt-oss as llama.cpp's converter writes it (beside its experts, `experts.rs`): YaRN as the
//! `rope.scaling.*` keys llama.cpp reads, and each layer's attention sinks (`self_attn.sinks`, a
//! parameter, not a module's weight) as `attn_sinks.weight`.

use mlxcel_model::gguf::{GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, ModelConfig, RopeScaling};

use super::experts::Tensor;
use super::{Error, Lossy, tensor_f32};

/// Writes YaRN scaling as llama.cpp reads it for `gpt-oss` (betas 32 and 1, the band's edges
/// rounded, the attention factor 0.1·ln(factor) + 1), naming what it cannot carry.
pub fn write_yarn(
    w: &mut GgufWriter,
    c: &ModelConfig,
    key: &dyn Fn(&str) -> String,
    lossy: &mut Vec<Lossy>,
) -> Result<(), Error> {
    let Some(RopeScaling::Yarn(y)) = c.rope_scaling else {
        return Ok(());
    };
    w.metadata(&key("rope.scaling.type"), GgufValue::String("yarn".into()))
        .metadata(&key("rope.scaling.factor"), GgufValue::F32(y.factor))
        .metadata(
            &key("rope.scaling.original_context_length"),
            GgufValue::U32(y.original_max_position_embeddings as u32),
        );
    let llama = if y.factor > 1.0 {
        0.1 * y.factor.ln() + 1.0
    } else {
        1.0
    };
    if y.beta_fast != 32.0 || y.beta_slow != 1.0 || !y.truncate {
        lossy.push(Lossy {
            field: "rope_scaling",
            why: format!(
                "YaRN betas {}/{} (truncate {}): llama.cpp computes betas 32/1 with the band's \
                 edges rounded",
                y.beta_fast, y.beta_slow, y.truncate
            ),
        });
    }
    if (y.attention_factor - llama).abs() > 1e-6 * llama {
        lossy.push(Lossy {
            field: "rope_scaling",
            why: format!(
                "YaRN attention factor {}: llama.cpp's is 0.1·ln(factor) + 1 = {llama}",
                y.attention_factor
            ),
        });
    }
    Ok(())
}

/// Layer `layer`'s sinks, written with its `o_proj`.
pub fn sinks(checkpoint: &Checkpoint, c: &ModelConfig, layer: usize) -> Result<Tensor, Error> {
    let attn = format!("model.layers.{layer}.self_attn");
    let (values, _) = tensor_f32(checkpoint, &attn, "sinks")?;
    Ok(Tensor {
        name: format!("blk.{layer}.attn_sinks.weight"),
        imported_as: format!("{attn}.sinks"),
        dims: vec![c.num_attention_heads as u64],
        values,
    })
}
