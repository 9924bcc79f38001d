//! llama.cpp's sampling flags beyond the common ones (`--temp`, `--top-k`, `--typical` ... in
//! `args.rs`): the chain's order, DRY, XTC, top-n-sigma, dynamic temperature, mirostat, logit
//! biases and `--ignore-eos`. In the server each is a default that a request's own field
//! replaces; `mlxcel generate` and `run` take the same flags for their one request.

use clap::Args;
use mlxcel_engine::{SamplerStage, SamplingOverrides};

use crate::error::ServerError;

/// The flags, as given.
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct SamplingArgs {
    /// The chain's stages in order, separated by `;` (llama.cpp's names: penalties, dry,
    /// top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature, adaptive_p).
    #[arg(long = "samplers")]
    pub samplers: Option<String>,

    /// The chain as one letter per stage (`edskypmxt` is the default order).
    #[arg(long = "sampler-seq", alias = "sampling-seq")]
    pub sampler_seq: Option<String>,

    /// Requests generate past the end-of-sequence tokens unless they send `ignore_eos: false`.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,

    /// Default top-n-sigma (-1: off).
    #[arg(
        long = "top-nsigma",
        alias = "top-n-sigma",
        allow_negative_numbers = true
    )]
    pub top_n_sigma: Option<f32>,

    /// Default XTC probability (0: off).
    #[arg(long = "xtc-probability")]
    pub xtc_probability: Option<f32>,

    /// Default XTC threshold (above 0.5: off).
    #[arg(long = "xtc-threshold")]
    pub xtc_threshold: Option<f32>,

    /// Default DRY multiplier (0: off).
    #[arg(long = "dry-multiplier")]
    pub dry_multiplier: Option<f32>,

    /// Default DRY base.
    #[arg(long = "dry-base")]
    pub dry_base: Option<f32>,

    /// Default DRY allowed length.
    #[arg(long = "dry-allowed-length")]
    pub dry_allowed_length: Option<usize>,

    /// Default DRY window in tokens (0: off; -1: the whole sequence).
    #[arg(long = "dry-penalty-last-n", allow_negative_numbers = true)]
    pub dry_penalty_last_n: Option<i64>,

    /// A DRY sequence breaker; repeatable, replaces the defaults (`none`: no breakers).
    #[arg(long = "dry-sequence-breaker", action = clap::ArgAction::Append)]
    pub dry_sequence_breaker: Vec<String>,

    /// Default dynamic temperature range (0: off).
    #[arg(long = "dynatemp-range")]
    pub dynatemp_range: Option<f32>,

    /// Default dynamic temperature exponent.
    #[arg(long = "dynatemp-exp")]
    pub dynatemp_exponent: Option<f32>,

    /// Default mirostat version (0 off, 1, 2).
    #[arg(long = "mirostat")]
    pub mirostat: Option<u8>,

    /// Default mirostat learning rate (eta).
    #[arg(long = "mirostat-lr")]
    pub mirostat_eta: Option<f32>,

    /// Default mirostat target entropy (tau).
    #[arg(long = "mirostat-ent")]
    pub mirostat_tau: Option<f32>,

    /// Default adaptive-p target probability (negative: off); the stage runs when the chain
    /// names `adaptive_p`.
    #[arg(long = "adaptive-target", allow_negative_numbers = true)]
    pub adaptive_target: Option<f32>,

    /// Default adaptive-p decay, in [0, 0.99].
    #[arg(long = "adaptive-decay")]
    pub adaptive_decay: Option<f32>,

    /// A bias on one token for every request, `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS` (`-inf` bans
    /// it); repeatable.
    #[arg(short = 'l', long = "logit-bias", action = clap::ArgAction::Append, allow_hyphen_values = true)]
    pub logit_bias: Vec<String>,
}

/// What the flags set in the server's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    /// The chain of requests that send no `samplers`.
    pub samplers: Option<Vec<SamplerStage>>,
    /// `ignore_eos` of requests that send none.
    pub ignore_eos: bool,
    /// Biases every request gets (a request's own `logit_bias` replaces them).
    pub logit_bias: Vec<(u32, f32)>,
}

impl SamplingArgs {
    /// The sampling settings these flags give, over `base` (the common flags').
    pub fn overrides(&self, base: SamplingOverrides) -> SamplingOverrides {
        SamplingOverrides {
            top_n_sigma: self.top_n_sigma,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: self.dry_penalty_last_n,
            dry_sequence_breakers: (!self.dry_sequence_breaker.is_empty()).then(|| {
                self.dry_sequence_breaker
                    .iter()
                    .filter(|b| *b != "none")
                    .cloned()
                    .collect()
            }),
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exponent,
            mirostat: self.mirostat,
            mirostat_eta: self.mirostat_eta,
            mirostat_tau: self.mirostat_tau,
            adaptive_target: self.adaptive_target,
            adaptive_decay: self.adaptive_decay,
            ..base
        }
    }

    /// The chain, the `--ignore-eos` default and the biases; errors name the flag.
    pub fn defaults(&self) -> Result<SamplingDefaults, ServerError> {
        let samplers = match (&self.samplers, &self.sampler_seq) {
            (Some(names), _) => Some(
                SamplerStage::parse_chain(names, false)
                    .map_err(|e| ServerError::Flag(format!("--samplers {names}: {e}")))?,
            ),
            (None, Some(letters)) => Some(
                SamplerStage::parse_chain(letters, true)
                    .map_err(|e| ServerError::Flag(format!("--sampler-seq {letters}: {e}")))?,
            ),
            (None, None) => None,
        };
        let logit_bias = self
            .logit_bias
            .iter()
            .map(|entry| {
                parse_logit_bias(entry)
                    .ok_or_else(|| ServerError::Flag(format!(
                        "--logit-bias {entry}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 2-inf)"
                    )))
            })
            .collect::<Result<_, _>>()?;
        Ok(SamplingDefaults {
            samplers,
            ignore_eos: self.ignore_eos,
            logit_bias,
        })
    }
}

/// llama.cpp's `TOKEN_ID(+/-)BIAS`: a token id, a sign, a number (`inf` allowed).
pub fn parse_logit_bias(entry: &str) -> Option<(u32, f32)> {
    let at = entry.find(['+', '-'])?;
    let token: u32 = entry[..at].trim().parse().ok()?;
    let magnitude: f32 = entry[at + 1..].trim().parse().ok()?;
    if magnitude.is_nan() {
        return None;
    }
    let sign = if entry[at..].starts_with('-') {
        -1.0
    } else {
        1.0
    };
    Some((token, sign * magnitude))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_entries_read_as_llama_cpp_writes_them() {
        assert_eq!(parse_logit_bias("15043+1"), Some((15043, 1.0)));
        assert_eq!(parse_logit_bias("15043-0.5"), Some((15043, -0.5)));
        assert_eq!(parse_logit_bias("2-inf"), Some((2, f32::NEG_INFINITY)));
        for bad in ["15043", "x+1", "+1", "1+", "1+nan"] {
            assert_eq!(parse_logit_bias(bad), None, "{bad}");
        }
    }
}
