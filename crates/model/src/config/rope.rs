//! `rope_scaling`: linear, Llama 3.1 and YaRN scaling, and LongRoPE's per-pair factors.

use std::path::Path;

use serde_json::Value;

use super::raw::RawConfig;
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
    /// YaRN ("NTK by parts"): pairs that turn more than `beta_fast` times over the original
    /// window keep their period, pairs that turn fewer than `beta_slow` times are stretched by
    /// `factor`, the band between is interpolated linearly in the pair index; the rotated
    /// features of q and k are multiplied by [`RopeScaling::attention_factor`].
    Yarn(Yarn),
}

/// YaRN's parameters (`rope_scaling` of type `yarn`), as Hugging Face transformers reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub original_max_position_embeddings: usize,
    /// Whether the band's edges are rounded to whole pairs (floor, ceil): transformers' default
    /// and what mlx-lm and llama.cpp always do; gpt-oss sets `truncate: false`.
    pub truncate: bool,
    /// The factor on the rotated features of q and k (`attention_factor`, else
    /// `m(factor, mscale) / m(factor, mscale_all_dim)` with m(s, k) = 0.1·k·ln s + 1, 1 for s ≤ 1).
    pub attention_factor: f32,
    /// How much of the extrapolation the band's ramp mixes in (llama.cpp's `yarn_ext_factor`):
    /// 1, what every checkpoint's YaRN is, keeps the fast pairs' periods; 0 stretches every pair
    /// by `factor` (linear scaling); between, a pair's inverse period is the ramp's mix scaled
    /// by it. Only `--yarn-ext-factor` sets another value ([`super::rope_override`]).
    pub ext_factor: f32,
}

impl Yarn {
    /// The periods of `plain` (`base^(2i/dims)`, one per pair, `dims` rotated features).
    pub(crate) fn periods(
        &self,
        plain: impl Iterator<Item = f32>,
        base: f32,
        dims: usize,
    ) -> Vec<f32> {
        let (base, d) = (f64::from(base), dims as f64);
        let original = self.original_max_position_embeddings as f64;
        // The pair index at which a period turns `turns` times over the original window.
        let pair = |turns: f32| {
            d * (original / (f64::from(turns) * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (mut low, mut high) = (pair(self.beta_fast), pair(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
        if low == high {
            high += 0.001;
        }
        let factor = f64::from(self.factor);
        let ext = f64::from(self.ext_factor);
        plain
            .enumerate()
            .map(|(i, period)| {
                // 0 keeps the period (extrapolation), 1 stretches it by `factor` (interpolation).
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                // The share of extrapolation, as llama.cpp's `ramp_mix`.
                let mix = (1.0 - ramp) * ext;
                let period = f64::from(period);
                let inverse = mix / period + (1.0 - mix) / (factor * period);
                (1.0 / inverse) as f32
            })
            .collect()
    }
}

impl RopeScaling {
    /// The factor on the rotated features of q and k that this scaling asks for (YaRN's), 1 for
    /// the others.
    pub fn attention_factor(&self) -> f32 {
        match self {
            Self::Yarn(yarn) => yarn.attention_factor,
            Self::Linear { .. } | Self::Llama3 { .. } => 1.0,
        }
    }
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

/// `rope_scaling` as a [`RopeScaling`]. `original` is the config's top-level
/// `original_max_position_embeddings` and `max_positions` its `max_position_embeddings`: YaRN's
/// original window when `rope_scaling` names none, in that order (as transformers reads it).
pub(crate) fn rope_scaling(
    path: &Path,
    value: Option<&Value>,
    original: Option<usize>,
    max_positions: usize,
) -> Result<Option<RopeScaling>> {
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
        "yarn" => yarn(path, value, original, max_positions).map(|y| Some(RopeScaling::Yarn(y))),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: number("factor")? as f32,
            low_freq_factor: number("low_freq_factor")? as f32,
            high_freq_factor: number("high_freq_factor")? as f32,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        })),
        other => Err(ModelError::invalid(
            path,
            "rope_scaling",
            format!("type `{other}` is not supported (supported: linear, llama3, yarn, longrope)"),
        )),
    }
}

/// YaRN's keys: `factor` (required), `beta_fast` (32), `beta_slow` (1),
/// `original_max_position_embeddings`, `truncate` (true), `attention_factor`, else `mscale` (1)
/// and `mscale_all_dim` (0).
fn yarn(path: &Path, value: &Value, original: Option<usize>, max_positions: usize) -> Result<Yarn> {
    let number = |key: &str, default: Option<f64>| -> Result<f64> {
        match value.get(key).filter(|v| !v.is_null()) {
            None => default.ok_or_else(|| ModelError::MissingField {
                path: path.to_owned(),
                field: format!("rope_scaling.{key}"),
            }),
            Some(v) => v.as_f64().filter(|f| f.is_finite()).ok_or_else(|| {
                ModelError::invalid(path, format!("rope_scaling.{key}"), "expected a number")
            }),
        }
    };
    let positive = |key: &str, default: Option<f64>| -> Result<f64> {
        let v = number(key, default)?;
        if v > 0.0 {
            Ok(v)
        } else {
            Err(ModelError::invalid(
                path,
                format!("rope_scaling.{key}"),
                format!("{v} is not a positive number"),
            ))
        }
    };
    let factor = positive("factor", None)?;
    let original = match value.get("original_max_position_embeddings") {
        Some(v) if !v.is_null() => v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
            ModelError::invalid(
                path,
                "rope_scaling.original_max_position_embeddings",
                "expected a positive integer",
            )
        })? as usize,
        _ => original.unwrap_or(max_positions),
    };
    let truncate = match value.get("truncate") {
        None | Some(Value::Null) => true,
        Some(v) => v.as_bool().ok_or_else(|| {
            ModelError::invalid(path, "rope_scaling.truncate", "expected true or false")
        })?,
    };
    let m = |k: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * k * factor.ln() + 1.0
        }
    };
    let attention_factor = match value.get("attention_factor").filter(|v| !v.is_null()) {
        Some(_) => positive("attention_factor", None)?,
        None => m(number("mscale", Some(1.0))?) / m(number("mscale_all_dim", Some(0.0))?),
    };
    Ok(Yarn {
        factor: factor as f32,
        beta_fast: positive("beta_fast", Some(32.0))? as f32,
        beta_slow: positive("beta_slow", Some(1.0))? as f32,
        original_max_position_embeddings: original,
        truncate,
        attention_factor: attention_factor as f32,
        ext_factor: 1.0,
    })
}

/// Whether transformers 5's `rope_parameters` holds one set per layer type (`full_attention`,
/// `sliding_attention`) rather than one set for every layer.
pub(crate) fn per_layer_type(value: Option<&Value>) -> bool {
    value.and_then(Value::as_object).is_some_and(|map| {
        map.contains_key("full_attention") || map.contains_key("sliding_attention")
    })
}

/// transformers 5 writes `rope_theta`, the scaling and `partial_rotary_factor` into one
/// `rope_parameters` object (and may leave the old keys out): its values fill the old keys that
/// config.json leaves out, so that they are read as they always were. A per-layer-type
/// `rope_parameters` is left to the family that reads it (the others refuse it).
pub(crate) fn flat_rope_parameters(raw: &mut RawConfig) {
    let Some(params) = raw.rope_parameters.as_ref().filter(|v| v.is_object()) else {
        return;
    };
    if per_layer_type(Some(params)) {
        return;
    }
    let params = params.clone();
    if raw.rope_theta.is_none() {
        raw.rope_theta = params
            .get("rope_theta")
            .and_then(Value::as_f64)
            .map(|t| t as f32);
    }
    if raw.partial_rotary_factor.is_none() {
        raw.partial_rotary_factor = params.get("partial_rotary_factor").and_then(Value::as_f64);
    }
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if kind != "default" && raw.rope_scaling.as_ref().is_none_or(Value::is_null) {
        raw.rope_scaling = Some(params);
    }
}
