//! `rope_scaling`: linear and Llama 3.1 scaling, and LongRoPE's per-pair factors.

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Rotary-embedding frequency scaling (`rope_scaling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (every period multiplied by it).
    Linear { factor: f32 },
    /// Llama 3.1's piecewise scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// LongRoPE (`rope_scaling.type` `longrope` or `su`): the `long_factor` list (one per rotated pair)
/// and the attention factor (`attention_factor`, else √(1 + ln s / ln L₀) with
/// s = max_position_embeddings / L₀ and L₀ = `original_max_position_embeddings`, as Hugging Face
/// and mlx-lm compute it). `(None, 1)` for any other scaling.
pub(crate) fn long_rope(
    path: &Path,
    value: Option<&Value>,
    rotary_dim: usize,
    max_positions: usize,
    original: Option<usize>,
) -> Result<(Option<Vec<f32>>, f32)> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok((None, 1.0));
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if !matches!(kind, "longrope" | "su") {
        return Ok((None, 1.0));
    }
    let factors = value
        .get("long_factor")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::MissingField {
            path: path.to_owned(),
            field: "rope_scaling.long_factor".into(),
        })?;
    let factors: Vec<f32> = factors
        .iter()
        .map(|f| {
            f.as_f64()
                .filter(|f| *f > 0.0 && f.is_finite())
                .map(|f| f as f32)
        })
        .collect::<Option<_>>()
        .ok_or_else(|| {
            ModelError::invalid(
                path,
                "rope_scaling.long_factor",
                "expected positive numbers",
            )
        })?;
    if factors.len() != rotary_dim / 2 {
        return Err(ModelError::invalid(
            path,
            "rope_scaling.long_factor",
            format!(
                "has {} factors; the {rotary_dim} rotated features make {} pairs",
                factors.len(),
                rotary_dim / 2
            ),
        ));
    }
    let attention = match value.get("attention_factor").and_then(Value::as_f64) {
        Some(f) => f as f32,
        None => {
            let original = value
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .or(original)
                .ok_or_else(|| ModelError::MissingField {
                    path: path.to_owned(),
                    field: "original_max_position_embeddings".into(),
                })?;
            let scale = max_positions as f64 / original.max(1) as f64;
            if scale <= 1.0 {
                1.0
            } else {
                (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32
            }
        }
    };
    Ok((Some(factors), attention))
}

pub(crate) fn rope_scaling(path: &Path, value: Option<&Value>) -> Result<Option<RopeScaling>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let number = |key: &str| -> Result<f64> {
        value
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| ModelError::MissingField {
                path: path.to_owned(),
                field: format!("rope_scaling.{key}"),
            })
    };
    match kind {
        "default" => Ok(None),
        "linear" => {
            let factor = number("factor")? as f32;
            if !(factor > 0.0 && factor.is_finite()) {
                return Err(ModelError::invalid(
                    path,
                    "rope_scaling.factor",
                    format!("{factor} is not a positive number"),
                ));
            }
            Ok(Some(RopeScaling::Linear { factor }))
        }
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: number("factor")? as f32,
            low_freq_factor: number("low_freq_factor")? as f32,
            high_freq_factor: number("high_freq_factor")? as f32,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        })),
        other => Err(ModelError::invalid(
            path,
            "rope_scaling",
            format!("type `{other}` is not supported (supported: linear, llama3)"),
        )),
    }
}
