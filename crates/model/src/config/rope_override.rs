//! llama.cpp's RoPE overrides (`--rope-scaling`, `--rope-scale`, `--rope-freq-base`,
//! `--rope-freq-scale`, `--yarn-orig-ctx`, `--yarn-ext-factor`, `--yarn-attn-factor`,
//! `--yarn-beta-slow`, `--yarn-beta-fast`), applied to a validated [`ModelConfig`] before a
//! backend builds its rotary tables from [`ModelConfig::rope_periods`] and
//! [`ModelConfig::rope_attention_factor`].
//!
//! The semantics are llama.cpp's (`llama_context`'s parameters over the model's hyperparameters,
//! and ggml's `rope_yarn`): the scaling type is the model's unless given; the frequency scale is
//! `1/--rope-scale` or `--rope-freq-scale`, else the model's (`1/factor`), and 1 with type `none`;
//! YaRN's extrapolation mix (`ext_factor`) is 1 with type `yarn` and 0 otherwise unless given;
//! where the mix is not 0, a pair's inverse period is `(s·(1 − r·e) + r·e) / p` (r the YaRN ramp
//! between the `beta_fast` and `beta_slow` pairs over the original window, e the mix, s the
//! frequency scale) and q and k are multiplied by `1 + 0.1·ln(1/s)` for s < 1 (llama.cpp replaces
//! `--yarn-attn-factor` there, so that flag is refused with a nonzero mix); with a zero mix the
//! periods are divided by s and q and k multiplied by `--yarn-attn-factor` (1).

use std::fmt;
use std::str::FromStr;

use super::ModelConfig;
use super::rope::{RopeScaling, Yarn};
use crate::error::{ModelError, Result};

/// `--rope-scaling`: llama.cpp's scaling types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingType {
    None,
    Linear,
    Yarn,
}

impl FromStr for RopeScalingType {
    type Err = String;

    fn from_str(value: &str) -> std::result::Result<Self, String> {
        match value {
            "none" => Ok(Self::None),
            "linear" => Ok(Self::Linear),
            "yarn" => Ok(Self::Yarn),
            other => Err(format!(
                "`{other}` is not a RoPE scaling type (expected none, linear or yarn)"
            )),
        }
    }
}

impl fmt::Display for RopeScalingType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Linear => "linear",
            Self::Yarn => "yarn",
        })
    }
}

/// The RoPE flags as given (llama.cpp's `common_params`): `None` where a flag is absent. The
/// values llama.cpp reads as "from the model" (0 for `--rope-freq-base`, `--rope-freq-scale` and
/// `--yarn-orig-ctx`, -1 for the YaRN factors) are accepted as such; other values outside a
/// flag's range are refused naming it ([`RopeOverrides::apply`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RopeOverrides {
    pub scaling: Option<RopeScalingType>,
    /// `--rope-scale N`: the frequency scale 1/N.
    pub rope_scale: Option<f32>,
    pub freq_base: Option<f32>,
    pub freq_scale: Option<f32>,
    pub yarn_orig_ctx: Option<i64>,
    pub yarn_ext_factor: Option<f32>,
    pub yarn_attn_factor: Option<f32>,
    pub yarn_beta_slow: Option<f32>,
    pub yarn_beta_fast: Option<f32>,
}

/// The overrides after llama.cpp's "from the model" values are dropped and the ranges checked.
#[derive(Debug, Clone, Copy, Default)]
struct Checked {
    scaling: Option<RopeScalingType>,
    freq_base: Option<f32>,
    freq_scale: Option<f32>,
    orig_ctx: Option<usize>,
    ext_factor: Option<f32>,
    attn_factor: Option<f32>,
    beta_slow: Option<f32>,
    beta_fast: Option<f32>,
}

fn refuse(flag: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Override {
        flag: flag.to_owned(),
        reason: reason.into(),
    }
}

/// A flag's value: `unset` (llama.cpp's "from the model") as `None`, else finite and `ok`.
fn number(
    flag: &str,
    value: Option<f32>,
    unset: f32,
    ok: impl Fn(f32) -> bool,
    expected: &str,
) -> Result<Option<f32>> {
    match value {
        None => Ok(None),
        Some(v) if v == unset => Ok(None),
        Some(v) if v.is_finite() && ok(v) => Ok(Some(v)),
        Some(v) => Err(refuse(
            &format!("{flag} {v}"),
            format!("expected {expected}"),
        )),
    }
}

/// llama.cpp's YaRN magnitude for a context `scale` (`get_mscale(scale, 1)`).
fn mscale(scale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * scale.ln() + 1.0
    }
}

impl RopeOverrides {
    /// Whether no RoPE flag was given.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The flags given, as typed (for messages).
    pub fn flags(&self) -> Vec<&'static str> {
        [
            ("--rope-scaling", self.scaling.is_some()),
            ("--rope-scale", self.rope_scale.is_some()),
            ("--rope-freq-base", self.freq_base.is_some()),
            ("--rope-freq-scale", self.freq_scale.is_some()),
            ("--yarn-orig-ctx", self.yarn_orig_ctx.is_some()),
            ("--yarn-ext-factor", self.yarn_ext_factor.is_some()),
            ("--yarn-attn-factor", self.yarn_attn_factor.is_some()),
            ("--yarn-beta-slow", self.yarn_beta_slow.is_some()),
            ("--yarn-beta-fast", self.yarn_beta_fast.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// Checks every value's range, without a model: what a command line can refuse at once.
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    fn checked(&self) -> Result<Checked> {
        if self.rope_scale.is_some() && self.freq_scale.is_some() {
            return Err(refuse(
                "--rope-scale/--rope-freq-scale",
                "both set the frequency scale (--rope-scale N is --rope-freq-scale 1/N); give one",
            ));
        }
        let rope_scale = number(
            "--rope-scale",
            self.rope_scale,
            f32::NAN,
            |v| v > 0.0,
            "a positive factor (the context is stretched N times)",
        )?;
        let freq_scale = number(
            "--rope-freq-scale",
            self.freq_scale,
            0.0,
            |v| v > 0.0,
            "a positive scale (0: the model's)",
        )?;
        let orig_ctx = match self.yarn_orig_ctx {
            None | Some(0) => None,
            Some(n) if n > 0 => Some(n as usize),
            Some(n) => {
                return Err(refuse(
                    &format!("--yarn-orig-ctx {n}"),
                    "expected a number of positions (0: the model's training context)",
                ));
            }
        };
        Ok(Checked {
            scaling: self.scaling,
            freq_base: number(
                "--rope-freq-base",
                self.freq_base,
                0.0,
                |v| v > 0.0,
                "a positive base (0: the model's)",
            )?,
            freq_scale: rope_scale.map(|n| 1.0 / n).or(freq_scale),
            orig_ctx,
            ext_factor: number(
                "--yarn-ext-factor",
                self.yarn_ext_factor,
                -1.0,
                |v| v >= 0.0,
                "a mix factor of at least 0 (-1: from the model)",
            )?,
            attn_factor: number(
                "--yarn-attn-factor",
                self.yarn_attn_factor,
                -1.0,
                |v| v > 0.0,
                "a positive factor (-1: from the model)",
            )?,
            beta_slow: number(
                "--yarn-beta-slow",
                self.yarn_beta_slow,
                -1.0,
                |v| v > 0.0,
                "a positive number of rotations (-1: from the model)",
            )?,
            beta_fast: number(
                "--yarn-beta-fast",
                self.yarn_beta_fast,
                -1.0,
                |v| v > 0.0,
                "a positive number of rotations (-1: from the model)",
            )?,
        })
    }

    /// Applies the overrides to `config` as llama.cpp applies them to a model's hyperparameters
    /// (module docs). Refuses a value out of range, a flag that would have no effect, and a
    /// model whose RoPE llama.cpp would apply them to differently (sliding-window layers keep
    /// their training RoPE there). A YaRN context or a linear stretch past the model's window
    /// widens [`ModelConfig::max_position_embeddings`] to the stretched window.
    pub fn apply(&self, config: &mut ModelConfig) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let given = self.flags().join(", ");
        let o = self.checked()?;
        if config.sliding_window().is_some() {
            return Err(refuse(
                &given,
                format!(
                    "{} has sliding-window layers, whose RoPE llama.cpp keeps at the model's \
                     training values while the others take the overrides; RoPE overrides are \
                     supported on models without sliding-window layers",
                    config.architecture
                ),
            ));
        }
        // Llama 3.1's schedule is per-pair factors on the plain periods, as llama.cpp's
        // converter stores it (`rope_freqs`), under which the overrides apply.
        if let Some(RopeScaling::Llama3 { .. }) = config.rope_scaling {
            let scaled = config.rope_periods();
            let (dims, base) = (config.rotary_dim, config.rope_theta);
            let factors = scaled
                .iter()
                .enumerate()
                .map(|(i, p)| p / base.powf((2 * i) as f32 / dims as f32))
                .collect();
            config.rope_factors = Some(factors);
            config.rope_scaling = None;
        }
        let window = config.max_position_embeddings;
        // The model's own values (llama.cpp's hyperparameters): type linear with scale 1 where
        // the model has no scaling, its beta defaults 32 and 1, and the factor on q and k that
        // comes on top of YaRN's magnitude (`rope.scaling.attn_factor`, LongRoPE's).
        let (kind, scale_train, orig_train, fast, slow, truncate, extra) = match config.rope_scaling
        {
            Some(RopeScaling::Yarn(y)) => (
                RopeScalingType::Yarn,
                1.0 / y.factor,
                y.original_max_position_embeddings,
                y.beta_fast,
                y.beta_slow,
                y.truncate,
                (f64::from(y.attention_factor) / mscale(f64::from(y.factor))) as f32,
            ),
            Some(RopeScaling::Linear { factor }) => (
                RopeScalingType::Linear,
                1.0 / factor,
                window,
                32.0,
                1.0,
                true,
                config.rope_attention_factor,
            ),
            _ => (
                RopeScalingType::Linear,
                1.0,
                window,
                32.0,
                1.0,
                true,
                config.rope_attention_factor,
            ),
        };
        let kind = o.scaling.unwrap_or(kind);
        let scale = match kind {
            RopeScalingType::None => {
                if o.freq_scale.is_some() {
                    return Err(refuse(
                        "--rope-scale/--rope-freq-scale",
                        "has no effect with --rope-scaling none (llama.cpp never scales then)",
                    ));
                }
                1.0
            }
            _ => o.freq_scale.unwrap_or(scale_train),
        };
        let ext = o.ext_factor.unwrap_or(match kind {
            RopeScalingType::Yarn => 1.0,
            _ => 0.0,
        });
        let orig = o.orig_ctx.unwrap_or(orig_train);
        let (beta_fast, beta_slow) = (o.beta_fast.unwrap_or(fast), o.beta_slow.unwrap_or(slow));
        if ext == 0.0 {
            for (flag, given) in [
                ("--yarn-orig-ctx", o.orig_ctx.is_some()),
                ("--yarn-beta-fast", o.beta_fast.is_some()),
                ("--yarn-beta-slow", o.beta_slow.is_some()),
            ] {
                if given {
                    return Err(refuse(
                        flag,
                        "has no effect without YaRN's extrapolation mix: add --rope-scaling yarn \
                         (or a --yarn-ext-factor above 0)",
                    ));
                }
            }
        } else {
            if o.attn_factor.is_some() {
                return Err(refuse(
                    "--yarn-attn-factor",
                    "has no effect while YaRN's extrapolation mix is on: llama.cpp replaces it \
                     by 1 + 0.1·ln(1/scale) there; pass --yarn-ext-factor 0 with it, or leave it \
                     out",
                ));
            }
            if beta_fast <= beta_slow {
                return Err(refuse(
                    "--yarn-beta-fast/--yarn-beta-slow",
                    format!(
                        "beta_fast {beta_fast} must exceed beta_slow {beta_slow}: pairs turning \
                         more than beta_fast times over the original window keep their period, \
                         fewer than beta_slow are stretched"
                    ),
                ));
            }
        }
        let factor = 1.0 / scale;
        let attention = if ext == 0.0 {
            o.attn_factor.unwrap_or(1.0) * extra
        } else {
            (mscale(f64::from(factor)) * f64::from(extra)) as f32
        };
        config.rope_theta = o.freq_base.unwrap_or(config.rope_theta);
        config.rope_scaling = if ext == 0.0 {
            (factor != 1.0).then_some(RopeScaling::Linear { factor })
        } else {
            Some(RopeScaling::Yarn(Yarn {
                factor,
                beta_fast,
                beta_slow,
                original_max_position_embeddings: orig,
                truncate,
                attention_factor: attention,
                ext_factor: ext,
            }))
        };
        config.rope_attention_factor = attention;
        // llama.cpp's training context under a custom YaRN scale is the original window
        // stretched by it; a linear stretch widens the window likewise (llama.cpp lets -c pass
        // the window there, mlxcel caps -c at it).
        if scale != scale_train {
            let stretched = if ext != 0.0 && kind == RopeScalingType::Yarn {
                (orig as f64 / f64::from(scale)) as usize
            } else {
                (window as f64 * f64::from(scale_train) / f64::from(scale)) as usize
            };
            config.max_position_embeddings = stretched.max(window);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "rope_override_tests.rs"]
mod tests;
