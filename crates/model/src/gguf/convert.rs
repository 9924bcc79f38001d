//! `mlxcel convert`: a GGUF file becomes an ordinary MLX checkpoint directory.
//!
//! Q4_0, Q4_1 and Q8_0 blocks become MLX affine groups of 32 without loss; F32/F16/BF16 tensors
//! are copied; llama.cpp's q/k row permutation is undone; the tokenizer is rebuilt from metadata.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::gguf::tensors::plan;
use crate::gguf::vocab::GgufVocab;
use crate::quant::{QuantSpec, Quantization};
use crate::safetensors_writer::{PlannedTensor, write_streaming};

/// The group size of every GGUF block type we import.
const GROUP_SIZE: usize = 32;

/// What a conversion produced.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub out_dir: PathBuf,
    pub config: ModelConfig,
    pub tensors: usize,
    /// Tensors whose GGUF type has no affine form (Q6_K, Q3_K, Q2_K), written as f32, and their
    /// bytes: exact, but larger and slower than their GGUF form.
    pub widened: usize,
    pub widened_bytes: u64,
}

impl ConvertSummary {
    /// A line for the user when tensors were widened, else `None`.
    pub fn widened_note(&self) -> Option<String> {
        (self.widened > 0).then(|| {
            format!(
                "{} tensors ({:.1} MB) are Q6_K/Q3_K/Q2_K, which mlxcel has no kernels for yet: \
                 widened to f32 (exact, but larger and slower than in the GGUF)",
                self.widened,
                self.widened_bytes as f64 / 1e6
            )
        })
    }
}

/// Converts `gguf_path` into an MLX checkpoint in `out_dir` (created if needed; files overwritten).
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path) -> Result<ConvertSummary> {
    let gguf = GgufFile::open(gguf_path)?;
    let header = Header::read(&gguf)?;
    let vocab = GgufVocab::read(&gguf)?;
    // Refuse unsupported tensors before writing anything.
    for info in &gguf.tensors {
        if !info.ggml_type.is_supported() {
            return Err(ModelError::UnsupportedGgmlType {
                path: gguf_path.to_owned(),
                tensor: info.name.clone(),
                ggml_type: info.ggml_type.to_string(),
            });
        }
    }
    let mut outputs = Vec::new();
    let mut module_bits: BTreeMap<String, Option<u32>> = BTreeMap::new();
    for info in &gguf.tensors {
        let (module, suffix) = hf_name(&info.name).ok_or_else(|| ModelError::GgufTensor {
            path: gguf_path.to_owned(),
            tensor: info.name.clone(),
            reason: "has no Hugging Face llama counterpart (not supported for import)".into(),
        })?;
        let rows_per_head = match (header.architecture, module.rsplit('.').next()) {
            (Architecture::Llama, Some("q_proj" | "k_proj")) => Some(header.head_dim),
            _ => None,
        };
        let planned = plan(&gguf, info, &module, suffix, rows_per_head)?;
        if suffix == "weight" && info.dims.len() == 2 {
            let bits = planned.iter().find_map(|o| o.quantized_bits());
            module_bits.insert(module.clone(), bits);
        }
        outputs.extend(planned);
    }
    let tie_word_embeddings = gguf.tensor_info("output.weight").is_none();
    let quantization = quantization(&module_bits);
    let mut config_json = header.config_json(&vocab, tie_word_embeddings, quantization.as_ref());
    // The model's name, for logs, `/v1/models` and benchmark tables (the converted directory itself
    // is named by a hash): the file's stem, which usually names the model and its quantization
    // (`SmolLM2-135M-Instruct.Q4_1`), else GGUF's `general.name`.
    let name = gguf_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .or_else(|| {
            gguf.get("general.name")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        });
    if let Some(name) = name {
        config_json["_name_or_path"] = Value::String(name);
    }

    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    let config_path = out_dir.join("config.json");
    let config = ModelConfig::from_json(&config_path, &config_json.to_string())?;
    write_json(&config_path, &config_json)?;
    let planned: Vec<PlannedTensor> = outputs.iter().map(|o| o.planned.clone()).collect();
    let metadata = BTreeMap::from([("format".to_owned(), "mlx".to_owned())]);
    write_streaming(
        &out_dir.join("model.safetensors"),
        &metadata,
        &planned,
        |i, out| outputs[i].write(&gguf, out),
    )?;
    let count = planned.len();
    let widened: Vec<&PlannedTensor> = outputs
        .iter()
        .filter(|o| o.is_widened())
        .map(|o| &o.planned)
        .collect();
    let widened_bytes = widened
        .iter()
        .map(|t| 4 * t.shape.iter().product::<usize>() as u64)
        .sum();

    let tokenizer_path = out_dir.join("tokenizer.json");
    write_json(&tokenizer_path, &vocab.tokenizer_json(&gguf)?)?;
    // Load what we wrote, so a vocabulary the tokenizers crate rejects fails here, not at first use.
    crate::tokenizer::Tokenizer::from_file(&tokenizer_path)?;
    write_json(
        &out_dir.join("tokenizer_config.json"),
        &vocab.tokenizer_config_json(header.context_length),
    )?;
    write_json(
        &out_dir.join("generation_config.json"),
        &json!({"bos_token_id": vocab.bos, "eos_token_id": vocab.eos_token_ids()}),
    )?;
    Ok(ConvertSummary {
        out_dir: out_dir.to_owned(),
        config,
        tensors: count,
        widened: widened.len(),
        widened_bytes,
    })
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|source| ModelError::Json {
        path: path.to_owned(),
        source,
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| ModelError::io(path, e))
}

/// The hyper-parameters from `{arch}.*` metadata.
#[derive(Debug)]
struct Header {
    architecture: Architecture,
    block_count: u64,
    context_length: usize,
    embedding_length: u64,
    feed_forward_length: u64,
    head_count: u64,
    head_count_kv: u64,
    head_dim: usize,
    rope_theta: f32,
    rms_norm_eps: f32,
    vocab_size: usize,
}

impl Header {
    fn read(gguf: &GgufFile) -> Result<Self> {
        let error = |key: &str, reason: String| ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: key.to_owned(),
            reason,
        };
        let arch = gguf
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| error("general.architecture", "missing".into()))?;
        let architecture = match arch {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: gguf.path().to_owned(),
                    architecture: other.to_owned(),
                    supported: "llama, qwen2 (GGUF general.architecture)",
                });
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let uint = |k: &str| -> Result<Option<u64>> {
            let k = key(k);
            gguf.get(&k)
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| error(&k, format!("{v:?} is not an unsigned integer")))
                })
                .transpose()
        };
        let need = |k: &str| uint(k)?.ok_or_else(|| error(&key(k), "missing".into()));
        let float = |k: &str, default: f64| -> Result<f64> {
            let k = key(k);
            gguf.get(&k).map_or(Ok(default), |v| {
                v.as_f64()
                    .ok_or_else(|| error(&k, format!("{v:?} is not a number")))
            })
        };
        if let Some(kind) = gguf
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
            && kind != "none"
        {
            return Err(error(
                &key("rope.scaling.type"),
                format!("rope scaling `{kind}` is not supported for GGUF import"),
            ));
        }
        let head_count = need("attention.head_count")?;
        let embedding_length = need("embedding_length")?;
        let head_dim = match uint("rope.dimension_count")?.or(uint("attention.key_length")?) {
            Some(d) => d,
            None => embedding_length / head_count.max(1),
        } as usize;
        let tokens = gguf
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map_or(0, <[GgufValue]>::len);
        Ok(Self {
            architecture,
            block_count: need("block_count")?,
            context_length: need("context_length")? as usize,
            embedding_length,
            feed_forward_length: need("feed_forward_length")?,
            head_count,
            head_count_kv: uint("attention.head_count_kv")?.unwrap_or(head_count),
            head_dim,
            rope_theta: float("rope.freq_base", 10_000.0)? as f32,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-5)? as f32,
            vocab_size: uint("vocab_size")?.map_or(tokens, |v| v as usize),
        })
    }

    fn config_json(
        &self,
        vocab: &GgufVocab,
        tie: bool,
        quantization: Option<&Quantization>,
    ) -> Value {
        let mut config = json!({
            "architectures": [self.architecture.hf_name()],
            "model_type": self.architecture.model_type(),
            "hidden_size": self.embedding_length,
            "num_hidden_layers": self.block_count,
            "num_attention_heads": self.head_count,
            "num_key_value_heads": self.head_count_kv,
            "head_dim": self.head_dim,
            "intermediate_size": self.feed_forward_length,
            "rms_norm_eps": shortest(self.rms_norm_eps),
            "rope_theta": shortest(self.rope_theta),
            "max_position_embeddings": self.context_length,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": tie,
            "hidden_act": "silu",
            "torch_dtype": "float16",
            "bos_token_id": vocab.bos,
            "eos_token_id": vocab.eos_token_ids(),
        });
        if let Some(q) = quantization {
            config["quantization"] = q.to_json();
            config["quantization_config"] = q.to_json();
        }
        config
    }
}

/// The f64 with the shortest decimal form that rounds to `v`: GGUF stores f32, and `1e-5` reads
/// better in config.json than its exact widening `9.999999747378752e-6`.
fn shortest(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(f64::from(v))
}

/// Maps a GGUF tensor name to its Hugging Face module and suffix (`weight` or `bias`).
pub fn hf_name(gguf_name: &str) -> Option<(String, &str)> {
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let module = match stem {
        "token_embd" => "model.embed_tokens".to_owned(),
        "output_norm" => "model.norm".to_owned(),
        "output" => "lm_head".to_owned(),
        _ => {
            let rest = stem.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let hf = match part {
                "attn_norm" => "input_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "ffn_gate" => "mlp.gate_proj",
                "ffn_up" => "mlp.up_proj",
                "ffn_down" => "mlp.down_proj",
                _ => return None,
            };
            format!("model.layers.{layer}.{hf}")
        }
    };
    Some((module, suffix))
}

/// The most common bit width becomes the default; other widths and dense modules are overrides.
fn quantization(module_bits: &BTreeMap<String, Option<u32>>) -> Option<Quantization> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for bits in module_bits.values().flatten() {
        *counts.entry(*bits).or_default() += 1;
    }
    let (&default_bits, _) = counts.iter().max_by_key(|&(bits, count)| (*count, *bits))?;
    let spec = |bits| QuantSpec {
        bits,
        group_size: GROUP_SIZE,
    };
    let overrides = module_bits
        .iter()
        .filter(|&(_, bits)| *bits != Some(default_bits))
        .map(|(module, bits)| (module.clone(), bits.map(spec)))
        .collect();
    Some(Quantization {
        default: spec(default_bits),
        overrides,
    })
}
