//! What a request asks of the sampler: the chain's stages under llama.cpp's names, every
//! setting with llama.cpp's default, the overrides a request or a server sends, and the range
//! check that names the setting a caller got wrong.

use crate::error::EngineError;

/// One stage of the sampling chain ([`SamplingParams::samplers`]), under llama.cpp's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerStage {
    /// Repetition, presence and frequency penalties (`penalties`).
    Penalties,
    /// "Don't repeat yourself": penalises tokens that extend a repeated sequence (`dry`).
    Dry,
    /// Top-n-sigma: keeps logits within `n` standard deviations of the largest (`top_n_sigma`).
    TopNSigma,
    /// Top-k (`top_k`).
    TopK,
    /// Locally typical sampling (`typ_p`).
    TypicalP,
    /// Nucleus, top-p (`top_p`).
    TopP,
    /// Min-p (`min_p`).
    MinP,
    /// Exclude top choices: sometimes removes the likeliest tokens but the least of them (`xtc`).
    Xtc,
    /// Temperature, dynamic when `dynatemp_range` > 0 (`temperature`); at zero or below, only
    /// the most likely survivor is kept.
    Temperature,
    /// Adaptive-p (`adaptive_p`): not in the default order; named anywhere in the chain, it
    /// replaces the draw at its end, as in llama.cpp (it picks the token, as the draw does).
    AdaptiveP,
}

impl SamplerStage {
    /// llama.cpp's default order (`common_params_sampling::samplers`).
    pub const DEFAULT_ORDER: [SamplerStage; 9] = [
        Self::Penalties,
        Self::Dry,
        Self::TopNSigma,
        Self::TopK,
        Self::TypicalP,
        Self::TopP,
        Self::MinP,
        Self::Xtc,
        Self::Temperature,
    ];

    /// Every stage, the default order's then adaptive-p.
    pub const ALL: [SamplerStage; 10] = [
        Self::Penalties,
        Self::Dry,
        Self::TopNSigma,
        Self::TopK,
        Self::TypicalP,
        Self::TopP,
        Self::MinP,
        Self::Xtc,
        Self::Temperature,
        Self::AdaptiveP,
    ];

    /// llama.cpp's canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Penalties => "penalties",
            Self::Dry => "dry",
            Self::TopNSigma => "top_n_sigma",
            Self::TopK => "top_k",
            Self::TypicalP => "typ_p",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::Xtc => "xtc",
            Self::Temperature => "temperature",
            Self::AdaptiveP => "adaptive_p",
        }
    }

    /// The stage `name` names as llama.cpp reads it (`common_sampler_types_from_names`):
    /// case-insensitive, each canonical name also with `-` for `_` and without `_`, and the
    /// aliases `nucleus`, `temp`, `typ`.
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "nucleus" => return Some(Self::TopP),
            "temp" => return Some(Self::Temperature),
            "typ" => return Some(Self::TypicalP),
            _ => {}
        }
        Self::ALL.into_iter().find(|stage| {
            let n = stage.name();
            n == lower
                || n.replace('_', "-") == lower
                || (n.contains('_') && n.replace('_', "") == lower)
        })
    }

    /// A chain from llama.cpp's `--samplers` (names separated by `;`) or `--sampler-seq` (one
    /// letter each, `letters`); the error names what is not a stage of this chain.
    pub fn parse_chain(text: &str, letters: bool) -> Result<Vec<Self>, String> {
        let (items, stages): (Vec<String>, Vec<Option<Self>>) = if letters {
            text.chars()
                .map(|c| {
                    (
                        c.to_string(),
                        Self::ALL.into_iter().find(|s| s.letter() == c),
                    )
                })
                .unzip()
        } else {
            text.split(';')
                .filter(|n| !n.trim().is_empty())
                .map(|n| (n.trim().to_owned(), Self::from_name(n.trim())))
                .unzip()
        };
        let unknown: Vec<String> = items
            .iter()
            .zip(&stages)
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| format!("`{i}`"))
            .collect();
        if !unknown.is_empty() {
            let known: Vec<String> = Self::ALL
                .iter()
                .map(|s| format!("{} ({})", s.name(), s.letter()))
                .collect();
            return Err(format!(
                "unknown sampler {}; known: {}",
                unknown.join(", "),
                known.join(", ")
            ));
        }
        Ok(stages.into_iter().flatten().collect())
    }

    /// llama.cpp's one-character name (`common_sampler_type_to_chr`).
    pub fn letter(self) -> char {
        match self {
            Self::Penalties => 'e',
            Self::Dry => 'd',
            Self::TopNSigma => 's',
            Self::TopK => 'k',
            Self::TypicalP => 'y',
            Self::TopP => 'p',
            Self::MinP => 'm',
            Self::Xtc => 'x',
            Self::Temperature => 't',
            Self::AdaptiveP => 'a',
        }
    }
}

/// How to pick the next token from a sequence's logits.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Dynamic temperature: the temperature moves within `temperature ± dynatemp_range` with
    /// the normalised entropy of the candidates; `0` disables.
    pub dynatemp_range: f32,
    /// How the normalised entropy maps to the dynamic temperature (`entropy^exponent`).
    pub dynatemp_exponent: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`; `1.0` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0.0` disables.
    pub min_p: f32,
    /// Locally typical sampling: keep the tokens whose surprisal (`-ln p`) is closest to the
    /// distribution's entropy until their mass exceeds `typical_p`; `>= 1.0` disables.
    pub typical_p: f32,
    /// Keep the tokens whose logit is within `top_n_sigma` standard deviations of the largest;
    /// `<= 0` disables.
    pub top_n_sigma: f32,
    /// XTC: the chance, per token, that the tokens above `xtc_threshold` are removed but the
    /// least likely of them; `0` disables.
    pub xtc_probability: f32,
    /// XTC's probability threshold; above `0.5` disables.
    pub xtc_threshold: f32,
    /// The fewest candidates top-p, min-p, typical-p and XTC leave (`0`: no floor beyond one).
    pub min_keep: usize,
    /// Divide positive (multiply negative) logits of recently seen tokens; `1.0` disables.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recently seen token (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per recent occurrence (OpenAI semantics).
    pub frequency_penalty: f32,
    /// DRY: a token that would extend a sequence already seen `n` tokens long (`n` at least
    /// `dry_allowed_length`) loses `dry_multiplier * dry_base^(n - dry_allowed_length)` from its
    /// logit; `0` disables.
    pub dry_multiplier: f32,
    /// DRY's base; below `1` disables DRY, as in llama.cpp.
    pub dry_base: f32,
    /// The longest repetition DRY lets pass unpenalised.
    pub dry_allowed_length: usize,
    /// How many recent tokens DRY scans (`usize::MAX`: the whole sequence; `0` disables).
    pub dry_penalty_last_n: usize,
    /// Texts that end a repetition for DRY (a sequence that crosses one is not penalised).
    pub dry_sequence_breakers: Vec<String>,
    /// Mirostat (`1`: v1, `2`: v2, `0`: off); on, it replaces the chain after the logit bias
    /// with temperature then mirostat, as in llama.cpp.
    pub mirostat: u8,
    /// Mirostat's target surprise (`tau`, in bits).
    pub mirostat_tau: f32,
    /// Mirostat's learning rate (`eta`).
    pub mirostat_eta: f32,
    /// Adaptive-p's target probability (negative: the stage does not reshape); the stage runs
    /// only when [`SamplingParams::samplers`] names [`SamplerStage::AdaptiveP`], as in llama.cpp.
    pub adaptive_target: f32,
    /// Adaptive-p's decay of its average of the drawn tokens' probabilities, in [0, 0.99]
    /// (a history of about `1 / (1 - decay)` tokens).
    pub adaptive_decay: f32,
    /// Added to tokens' logits before anything else (`f32::NEG_INFINITY` bans a token, as
    /// llama-server's `ignore_eos` does with the end-of-sequence tokens).
    pub logit_bias: Vec<(u32, f32)>,
    /// The chain's stages in order ([`SamplerStage::DEFAULT_ORDER`] by default); a stage left out
    /// does not run. Without [`SamplerStage::Temperature`] the draw is at temperature 1, as in
    /// llama.cpp.
    pub samplers: Vec<SamplerStage>,
    /// Seed of the request's own random stream; `None` draws a fresh one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults (`common_params_sampling`).
    fn default() -> Self {
        Self {
            temperature: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            min_keep: 0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            adaptive_target: -1.0,
            adaptive_decay: 0.9,
            logit_bias: Vec::new(),
            samplers: SamplerStage::DEFAULT_ORDER.to_vec(),
            seed: None,
        }
    }
}

/// Sampling settings each of which may be left out (`None` keeps the setting under it): what a
/// request asks for, or a server's defaults. This is the one declaration of the sampling fields
/// every wire format reads under these names (deserialized from the request body as it is), and
/// [`SamplingOverrides::over`] the one place they meet the defaults of [`SamplingParams`].
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct SamplingOverrides {
    /// [`SamplingParams::temperature`].
    pub temperature: Option<f32>,
    /// [`SamplingParams::dynatemp_range`].
    pub dynatemp_range: Option<f32>,
    /// [`SamplingParams::dynatemp_exponent`].
    pub dynatemp_exponent: Option<f32>,
    /// [`SamplingParams::top_k`].
    pub top_k: Option<usize>,
    /// [`SamplingParams::top_p`].
    pub top_p: Option<f32>,
    /// [`SamplingParams::min_p`].
    pub min_p: Option<f32>,
    /// [`SamplingParams::typical_p`] (llama-server's `typical_p`).
    pub typical_p: Option<f32>,
    /// [`SamplingParams::top_n_sigma`].
    pub top_n_sigma: Option<f32>,
    /// [`SamplingParams::xtc_probability`].
    pub xtc_probability: Option<f32>,
    /// [`SamplingParams::xtc_threshold`].
    pub xtc_threshold: Option<f32>,
    /// [`SamplingParams::min_keep`].
    pub min_keep: Option<usize>,
    /// [`SamplingParams::repeat_penalty`].
    pub repeat_penalty: Option<f32>,
    /// [`SamplingParams::repeat_last_n`].
    pub repeat_last_n: Option<usize>,
    /// [`SamplingParams::presence_penalty`].
    pub presence_penalty: Option<f32>,
    /// [`SamplingParams::frequency_penalty`].
    pub frequency_penalty: Option<f32>,
    /// [`SamplingParams::dry_multiplier`].
    pub dry_multiplier: Option<f32>,
    /// [`SamplingParams::dry_base`].
    pub dry_base: Option<f32>,
    /// [`SamplingParams::dry_allowed_length`].
    pub dry_allowed_length: Option<usize>,
    /// [`SamplingParams::dry_penalty_last_n`], as llama-server reads it: `-1` is the whole
    /// sequence, `0` disables, a count otherwise.
    pub dry_penalty_last_n: Option<i64>,
    /// [`SamplingParams::dry_sequence_breakers`]; when given, not empty.
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// [`SamplingParams::mirostat`].
    pub mirostat: Option<u8>,
    /// [`SamplingParams::mirostat_tau`].
    pub mirostat_tau: Option<f32>,
    /// [`SamplingParams::mirostat_eta`].
    pub mirostat_eta: Option<f32>,
    /// [`SamplingParams::adaptive_target`].
    pub adaptive_target: Option<f32>,
    /// [`SamplingParams::adaptive_decay`].
    pub adaptive_decay: Option<f32>,
    /// [`SamplingParams::seed`]; a negative seed draws a fresh one.
    pub seed: Option<i64>,
}

impl SamplingOverrides {
    /// `base` with every setting given here replacing its own. A `dry_penalty_last_n` below -1
    /// is kept as the whole sequence here and refused by [`SamplingOverrides::check`].
    pub fn over(&self, base: SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            dynatemp_range: self.dynatemp_range.unwrap_or(base.dynatemp_range),
            dynatemp_exponent: self.dynatemp_exponent.unwrap_or(base.dynatemp_exponent),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            typical_p: self.typical_p.unwrap_or(base.typical_p),
            top_n_sigma: self.top_n_sigma.unwrap_or(base.top_n_sigma),
            xtc_probability: self.xtc_probability.unwrap_or(base.xtc_probability),
            xtc_threshold: self.xtc_threshold.unwrap_or(base.xtc_threshold),
            min_keep: self.min_keep.unwrap_or(base.min_keep),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(base.repeat_last_n),
            presence_penalty: self.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(base.frequency_penalty),
            dry_multiplier: self.dry_multiplier.unwrap_or(base.dry_multiplier),
            dry_base: self.dry_base.unwrap_or(base.dry_base),
            dry_allowed_length: self.dry_allowed_length.unwrap_or(base.dry_allowed_length),
            dry_penalty_last_n: match self.dry_penalty_last_n {
                Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                None => base.dry_penalty_last_n,
            },
            dry_sequence_breakers: self
                .dry_sequence_breakers
                .clone()
                .unwrap_or(base.dry_sequence_breakers),
            mirostat: self.mirostat.unwrap_or(base.mirostat),
            mirostat_tau: self.mirostat_tau.unwrap_or(base.mirostat_tau),
            mirostat_eta: self.mirostat_eta.unwrap_or(base.mirostat_eta),
            adaptive_target: self.adaptive_target.unwrap_or(base.adaptive_target),
            adaptive_decay: self.adaptive_decay.unwrap_or(base.adaptive_decay),
            seed: match self.seed {
                Some(seed) => u64::try_from(seed).ok(),
                None => base.seed,
            },
            ..base
        }
    }

    /// Refuses what [`SamplingParams::validate`] cannot see once the overrides are applied: a
    /// `dry_penalty_last_n` below -1 and an empty `dry_sequence_breakers`.
    pub fn check(&self) -> Result<(), EngineError> {
        if let Some(n) = self.dry_penalty_last_n.filter(|&n| n < -1) {
            return Err(EngineError::InvalidSampling {
                field: "dry_penalty_last_n",
                value: n.to_string(),
                expected: "-1 (the whole sequence), 0 (off) or a count of tokens",
            });
        }
        if self
            .dry_sequence_breakers
            .as_ref()
            .is_some_and(Vec::is_empty)
        {
            return Err(EngineError::InvalidSampling {
                field: "dry_sequence_breakers",
                value: "[]".into(),
                expected: "a non-empty list of strings",
            });
        }
        Ok(())
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether DRY changes anything (llama.cpp's test in `llama_sampler_init_dry`).
    pub fn dry_enabled(&self) -> bool {
        self.dry_multiplier != 0.0 && self.dry_base >= 1.0 && self.dry_penalty_last_n != 0
    }

    /// Whether XTC can remove anything.
    pub(crate) fn xtc_enabled(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    /// Whether adaptive-p picks the token: the chain names it and mirostat is off (mirostat
    /// replaces the chain, adaptive-p included, as in llama.cpp).
    pub(crate) fn adaptive_p_enabled(&self) -> bool {
        self.mirostat == 0 && self.samplers.contains(&SamplerStage::AdaptiveP)
    }

    /// Whether a temperature of zero or below is the argmax after bias, penalties and DRY: the
    /// default order with every stage that can drop the most likely token off (typical-p, XTC),
    /// no dynamic temperature and no mirostat. Top-n-sigma, top-k, top-p and min-p always keep it.
    pub(crate) fn is_plain_chain(&self) -> bool {
        self.samplers == SamplerStage::DEFAULT_ORDER
            && self.typical_p >= 1.0
            && !self.xtc_enabled()
            && self.dynatemp_range <= 0.0
            && self.mirostat == 0
    }

    /// Checks every field's range, naming the field and what is accepted.
    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |field: &'static str, value: f32, expected: &'static str| {
            Err(EngineError::InvalidSampling {
                field,
                value: value.to_string(),
                expected,
            })
        };
        let finite = |v: f32| v.is_finite();
        if !finite(self.temperature) {
            return invalid(
                "temperature",
                self.temperature,
                "a finite number (<= 0 is greedy)",
            );
        }
        if !(finite(self.dynatemp_range) && self.dynatemp_range >= 0.0) {
            return invalid(
                "dynatemp_range",
                self.dynatemp_range,
                "a number >= 0 (0 disables)",
            );
        }
        if !(finite(self.dynatemp_exponent) && self.dynatemp_exponent >= 0.0) {
            return invalid("dynatemp_exponent", self.dynatemp_exponent, "a number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", self.top_p, "a number in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid("min_p", self.min_p, "a number in [0, 1]");
        }
        if !(finite(self.typical_p) && self.typical_p >= 0.0) {
            return invalid(
                "typical_p",
                self.typical_p,
                "a number >= 0 (1 or more disables)",
            );
        }
        if !finite(self.top_n_sigma) {
            return invalid(
                "top_n_sigma",
                self.top_n_sigma,
                "a finite number (<= 0 disables)",
            );
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return invalid(
                "xtc_probability",
                self.xtc_probability,
                "a number in [0, 1] (0 disables)",
            );
        }
        if !(0.0..=1.0).contains(&self.xtc_threshold) {
            return invalid(
                "xtc_threshold",
                self.xtc_threshold,
                "a number in [0, 1] (above 0.5 disables)",
            );
        }
        if let Some(&(_, bias)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return invalid("logit_bias", bias, "a number or -inf");
        }
        if !(finite(self.repeat_penalty) && self.repeat_penalty > 0.0) {
            return invalid(
                "repeat_penalty",
                self.repeat_penalty,
                "a positive number (1 disables)",
            );
        }
        if !finite(self.presence_penalty) || self.presence_penalty.abs() > 2.0 {
            return invalid(
                "presence_penalty",
                self.presence_penalty,
                "a number in [-2, 2]",
            );
        }
        if !finite(self.frequency_penalty) || self.frequency_penalty.abs() > 2.0 {
            return invalid(
                "frequency_penalty",
                self.frequency_penalty,
                "a number in [-2, 2]",
            );
        }
        if !(finite(self.dry_multiplier) && self.dry_multiplier >= 0.0) {
            return invalid(
                "dry_multiplier",
                self.dry_multiplier,
                "a number >= 0 (0 disables)",
            );
        }
        if !(finite(self.dry_base) && self.dry_base >= 0.0) {
            return invalid(
                "dry_base",
                self.dry_base,
                "a number >= 0 (below 1 disables DRY)",
            );
        }
        if self.mirostat > 2 {
            return invalid(
                "mirostat",
                f32::from(self.mirostat),
                "0 (off), 1 (mirostat) or 2 (mirostat 2.0)",
            );
        }
        if !(finite(self.mirostat_tau) && self.mirostat_tau >= 0.0) {
            return invalid("mirostat_tau", self.mirostat_tau, "a number >= 0");
        }
        if !(finite(self.mirostat_eta) && self.mirostat_eta >= 0.0) {
            return invalid("mirostat_eta", self.mirostat_eta, "a number >= 0");
        }
        if !(finite(self.adaptive_target) && self.adaptive_target <= 1.0) {
            return invalid(
                "adaptive_target",
                self.adaptive_target,
                "a number <= 1 (0 to 1; negative disables)",
            );
        }
        if !(0.0..=0.99).contains(&self.adaptive_decay) {
            return invalid(
                "adaptive_decay",
                self.adaptive_decay,
                "a number in [0, 0.99]",
            );
        }
        Ok(())
    }
}
