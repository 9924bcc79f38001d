//! llama-server's flags that change the model as it loads: the RoPE overrides (`--rope-scaling`,
//! `--rope-scale`, `--rope-freq-base`, `--rope-freq-scale`, `--yarn-*`), flattened into
//! [`crate::ServerArgs`] and applied by the engine to the model's config before a backend builds
//! its rotary tables (`mlxcel_model::RopeOverrides`), and `--override-kv`, which the GGUF
//! importer applies to the file's metadata (`mlxcel_model::KvOverride`).

use clap::Args;
use mlxcel_model::{KvOverride, RopeOverrides, RopeScalingType};

use crate::error::ServerError;

#[derive(Debug, Clone, PartialEq, Args)]
pub struct ModelOverrideArgs {
    /// RoPE frequency scaling: `none`, `linear` or `yarn` (default: the model's; linear with
    /// factor 1 where it has none).
    #[arg(long = "rope-scaling", env = "LLAMA_ARG_ROPE_SCALING_TYPE")]
    pub rope_scaling: Option<RopeScalingType>,

    /// RoPE context scaling factor: positions are stretched N times (`--rope-freq-scale 1/N`).
    #[arg(
        long = "rope-scale",
        env = "LLAMA_ARG_ROPE_SCALE",
        allow_negative_numbers = true
    )]
    pub rope_scale: Option<f32>,

    /// RoPE base frequency (default, or 0: the model's).
    #[arg(
        long = "rope-freq-base",
        env = "LLAMA_ARG_ROPE_FREQ_BASE",
        allow_negative_numbers = true
    )]
    pub rope_freq_base: Option<f32>,

    /// RoPE frequency scaling factor: the context expands by 1/N (default, or 0: the model's).
    #[arg(
        long = "rope-freq-scale",
        env = "LLAMA_ARG_ROPE_FREQ_SCALE",
        allow_negative_numbers = true
    )]
    pub rope_freq_scale: Option<f32>,

    /// YaRN: the model's original context (default, or 0: the model's training context).
    #[arg(
        long = "yarn-orig-ctx",
        env = "LLAMA_ARG_YARN_ORIG_CTX",
        allow_negative_numbers = true
    )]
    pub yarn_orig_ctx: Option<i64>,

    /// YaRN: extrapolation mix factor (-1: 1 with YaRN scaling, else 0; 0 = full
    /// interpolation).
    #[arg(
        long = "yarn-ext-factor",
        env = "LLAMA_ARG_YARN_EXT_FACTOR",
        allow_negative_numbers = true
    )]
    pub yarn_ext_factor: Option<f32>,

    /// YaRN: factor on q and k's rotated features where the extrapolation mix is 0 (-1: the
    /// model's, 1).
    #[arg(
        long = "yarn-attn-factor",
        env = "LLAMA_ARG_YARN_ATTN_FACTOR",
        allow_negative_numbers = true
    )]
    pub yarn_attn_factor: Option<f32>,

    /// YaRN: rotations over the original context below which a pair is fully interpolated
    /// (-1: the model's, 1).
    #[arg(
        long = "yarn-beta-slow",
        env = "LLAMA_ARG_YARN_BETA_SLOW",
        allow_negative_numbers = true
    )]
    pub yarn_beta_slow: Option<f32>,

    /// YaRN: rotations over the original context above which a pair keeps its period (-1: the
    /// model's, 32).
    #[arg(
        long = "yarn-beta-fast",
        env = "LLAMA_ARG_YARN_BETA_FAST",
        allow_negative_numbers = true
    )]
    pub yarn_beta_fast: Option<f32>,

    /// GGUF metadata overrides, `KEY=TYPE:VALUE[,...]` with TYPE int, float, bool or str
    /// (`tokenizer.ggml.add_bos_token=bool:false`); repeatable. A GGUF model only.
    #[arg(long = "override-kv", action = clap::ArgAction::Append)]
    pub override_kv: Vec<String>,
}

impl ModelOverrideArgs {
    /// The RoPE overrides, their ranges checked (what needs the model is checked at load).
    pub fn rope(&self) -> Result<RopeOverrides, ServerError> {
        let rope = RopeOverrides {
            scaling: self.rope_scaling,
            rope_scale: self.rope_scale,
            freq_base: self.rope_freq_base,
            freq_scale: self.rope_freq_scale,
            yarn_orig_ctx: self.yarn_orig_ctx,
            yarn_ext_factor: self.yarn_ext_factor,
            yarn_attn_factor: self.yarn_attn_factor,
            yarn_beta_slow: self.yarn_beta_slow,
            yarn_beta_fast: self.yarn_beta_fast,
        };
        rope.validate()
            .map_err(|err| ServerError::Flag(err.to_string()))?;
        Ok(rope)
    }

    /// The `--override-kv` overrides, in order.
    pub fn kv_overrides(&self) -> Result<Vec<KvOverride>, ServerError> {
        let mut all = Vec::new();
        for value in &self.override_kv {
            all.extend(
                KvOverride::parse_list(value).map_err(|err| ServerError::Flag(err.to_string()))?,
            );
        }
        Ok(all)
    }
}
