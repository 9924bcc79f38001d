//! `config.json` of the llama family, validated into a [`ModelConfig`].
//!
//! The raw JSON is read leniently (Hugging Face and MLX write the same keys with small variations)
//! and then checked once here, so that backends can trust every number they are handed.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::quant::Quantization;

/// The architectures we can run, all decoder-only llamas with small variations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`: Llama 2/3, SmolLM/SmolLM2; also `MistralForCausalLM` without a sliding window.
    Llama,
    /// `Qwen2ForCausalLM`: a llama with biases on the q/k/v projections.
    Qwen2,
}

impl Architecture {
    pub const SUPPORTED: &'static str =
        "LlamaForCausalLM, MistralForCausalLM (no sliding window), Qwen2ForCausalLM";

    /// The `architectures[0]` string Hugging Face writes for this architecture.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// The `model_type` Hugging Face writes for this architecture.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// Rotary-embedding frequency scaling (`rope_scaling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1's piecewise scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// A validated llama-family model description.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// The checkpoint's context window (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    /// Whether q/k/v projections carry a bias (always for Qwen2; `attention_bias` for llama).
    pub attention_qkv_bias: bool,
    /// Whether the output projection carries a bias (`attention_bias` for llama).
    pub attention_out_bias: bool,
    /// MLX quantization (`quantization`), `None` for a dense checkpoint.
    pub quantization: Option<Quantization>,
    /// `eos_token_id` from config.json, if any.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// The model's name (`_name_or_path`), when the checkpoint records one.
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<Value>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    vocab_size: Option<usize>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    sliding_window: Option<Value>,
    use_sliding_window: Option<bool>,
    quantization: Option<Value>,
    eos_token_id: Option<Value>,
    bos_token_id: Option<u32>,
    #[serde(rename = "_name_or_path")]
    name_or_path: Option<String>,
}

impl ModelConfig {
    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        Self::from_json(&path, &text)
    }

    /// Parses and validates config.json text; `path` is only used in errors.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_owned(),
            source,
        })?;
        Self::from_raw(path, raw)
    }

    /// The context window the checkpoint was trained for (`max_position_embeddings`).
    pub fn window(&self) -> usize {
        self.max_position_embeddings
    }

    /// Rows of the q projection (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Rotary-embedding periods, one per rotated pair (`head_dim / 2`): `rope_theta^(2i/head_dim)`,
    /// with Llama 3.1's scaling when configured (long wavelengths stretched by `factor`, short ones
    /// kept, the band between interpolated smoothly). Every backend derives its RoPE from these.
    pub fn rope_periods(&self) -> Vec<f32> {
        let dims = self.head_dim;
        let base = self.rope_theta;
        let plain = (0..dims / 2).map(move |i| base.powf((2 * i) as f32 / dims as f32));
        match self.rope_scaling {
            None => plain.collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let original = original_max_position_embeddings as f32;
                let low_wavelen = original / low_freq_factor;
                let high_wavelen = original / high_freq_factor;
                plain
                    .map(|period| {
                        let wavelen = 2.0 * std::f32::consts::PI * period;
                        if wavelen > low_wavelen {
                            period * factor
                        } else if wavelen < high_wavelen {
                            period
                        } else {
                            let smooth = (original / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            period / ((1.0 - smooth) / factor + smooth)
                        }
                    })
                    .collect()
            }
        }
    }

    /// Rows of each of the k and v projections (`num_key_value_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    fn from_raw(path: &Path, raw: RawConfig) -> Result<Self> {
        let architecture = architecture(path, &raw)?;
        let need = |value: Option<usize>, field: &str| -> Result<usize> {
            match value {
                None => Err(ModelError::MissingField {
                    path: path.to_owned(),
                    field: field.to_owned(),
                }),
                Some(0) => Err(ModelError::invalid(path, field, "must be at least 1")),
                Some(v) => Ok(v),
            }
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        let num_key_value_heads = need(
            raw.num_key_value_heads.or(Some(num_attention_heads)),
            "num_key_value_heads",
        )?;
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(ModelError::invalid(
                path,
                "num_key_value_heads",
                format!(
                    "{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"
                ),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(d) => need(Some(d), "head_dim")?,
            None if hidden_size.is_multiple_of(num_attention_heads) => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(ModelError::invalid(
                    path,
                    "hidden_size",
                    format!(
                        "{hidden_size} is not a multiple of num_attention_heads {num_attention_heads} and head_dim is absent"
                    ),
                ));
            }
        };
        if !head_dim.is_multiple_of(2) {
            return Err(ModelError::invalid(
                path,
                "head_dim",
                format!("{head_dim} is odd; rotary embeddings need pairs"),
            ));
        }
        if raw.mlp_bias == Some(true) {
            return Err(ModelError::invalid(
                path,
                "mlp_bias",
                "MLP biases are not supported",
            ));
        }
        let (attention_qkv_bias, attention_out_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            Architecture::Llama => {
                let bias = raw.attention_bias.unwrap_or(false);
                (bias, bias)
            }
        };
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(ModelError::invalid(
                path,
                "rms_norm_eps",
                format!("{rms_norm_eps} is not a positive number"),
            ));
        }
        let rope_theta = raw.rope_theta.unwrap_or(10_000.0);
        if !(rope_theta > 0.0 && rope_theta.is_finite()) {
            return Err(ModelError::invalid(
                path,
                "rope_theta",
                format!("{rope_theta} is not a positive number"),
            ));
        }
        let quantization = raw
            .quantization
            .as_ref()
            .map(|q| Quantization::from_json(path, q))
            .transpose()?;
        Ok(Self {
            architecture,
            hidden_size,
            num_hidden_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            rms_norm_eps,
            rope_theta,
            rope_scaling: rope_scaling(path, raw.rope_scaling.as_ref())?,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: need(raw.max_position_embeddings, "max_position_embeddings")?,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            attention_qkv_bias,
            attention_out_bias,
            quantization,
            eos_token_ids: token_ids(path, "eos_token_id", raw.eos_token_id.as_ref())?,
            bos_token_id: raw.bos_token_id,
            name: raw.name_or_path.filter(|n| !n.trim().is_empty()),
        })
    }
}

fn architecture(path: &Path, raw: &RawConfig) -> Result<Architecture> {
    let name = raw
        .architectures
        .first()
        .cloned()
        .or_else(|| raw.model_type.clone())
        .ok_or_else(|| ModelError::MissingField {
            path: path.to_owned(),
            field: "architectures".into(),
        })?;
    let unsupported = |architecture: String| ModelError::UnsupportedArchitecture {
        path: path.to_owned(),
        architecture,
        supported: Architecture::SUPPORTED,
    };
    match name.as_str() {
        "LlamaForCausalLM" | "llama" => Ok(Architecture::Llama),
        "MistralForCausalLM" | "mistral" => {
            let window = raw.sliding_window.as_ref().filter(|v| !v.is_null());
            if window.is_some() && raw.use_sliding_window != Some(false) {
                return Err(unsupported(format!("{name} with sliding_window")));
            }
            Ok(Architecture::Llama)
        }
        "Qwen2ForCausalLM" | "qwen2" => {
            // Qwen2 only slides when `use_sliding_window` is set.
            if raw.use_sliding_window == Some(true) {
                return Err(unsupported(format!("{name} with use_sliding_window")));
            }
            Ok(Architecture::Qwen2)
        }
        _ => Err(unsupported(name)),
    }
}

fn rope_scaling(path: &Path, value: Option<&Value>) -> Result<Option<RopeScaling>> {
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
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: number("factor")? as f32,
            low_freq_factor: number("low_freq_factor")? as f32,
            high_freq_factor: number("high_freq_factor")? as f32,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        })),
        other => Err(ModelError::invalid(
            path,
            "rope_scaling",
            format!("type `{other}` is not supported (supported: llama3)"),
        )),
    }
}

/// Reads a token id field that may be a number or a list of numbers.
pub(crate) fn token_ids(path: &Path, field: &str, value: Option<&Value>) -> Result<Vec<u32>> {
    let bad = || ModelError::invalid(path, field, "expected a token id or a list of token ids");
    let one = |v: &Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(bad)
    };
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}
