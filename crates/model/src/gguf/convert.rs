//! `mlxcel convert`: a GGUF file becomes an ordinary MLX checkpoint directory.
//!
//! Q4_0, Q4_1 and Q8_0 blocks become MLX affine groups of 32 without loss; F32/F16/BF16 tensors
//! are copied; llama.cpp's q/k row permutation is undone; the tokenizer is rebuilt from metadata.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::f16;
use serde_json::{Value, json};

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::dequant::{affine_bits, to_affine};
use crate::gguf::permute::unpermute_rows;
use crate::gguf::reader::{GgufFile, GgufTensorInfo, GgufValue};
use crate::gguf::tokenizer_json::GgufVocab;
use crate::gguf::types::GgmlType;
use crate::quant::{QuantSpec, Quantization, pack};

/// The group size of every GGUF block type we import.
const GROUP_SIZE: usize = 32;

/// What a conversion produced.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub out_dir: PathBuf,
    pub config: ModelConfig,
    pub tensors: usize,
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
    let mut tensors = BTreeMap::new();
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
        let converted = convert_tensor(&gguf, info, rows_per_head)?;
        if suffix == "weight" && converted.len() == 3 {
            module_bits.insert(module.clone(), affine_bits(info.ggml_type));
        } else if suffix == "weight" && info.dims.len() == 2 {
            module_bits.insert(module.clone(), None);
        }
        for (part, tensor) in converted {
            let name = match part {
                "" => format!("{module}.{suffix}"),
                part => format!("{module}.{part}"),
            };
            tensors.insert(name, tensor);
        }
    }
    let tie_word_embeddings = gguf.tensor_info("output.weight").is_none();
    let quantization = quantization(&module_bits);
    let config_json = header.config_json(&vocab, tie_word_embeddings, quantization.as_ref());

    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, e))?;
    let config_path = out_dir.join("config.json");
    let config = ModelConfig::from_json(&config_path, &config_json.to_string())?;
    write_json(&config_path, &config_json)?;
    let weights_path = out_dir.join("model.safetensors");
    let count = tensors.len();
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);
    safetensors::serialize_to_file(tensors, Some(metadata), &weights_path).map_err(|e| {
        ModelError::Safetensors {
            path: weights_path.clone(),
            reason: e.to_string(),
        }
    })?;
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
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
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

/// An output tensor held in memory until the safetensors file is written.
#[derive(Debug)]
struct OwnedTensor {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for OwnedTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Converts one tensor: `[("", dense)]` or `[("weight", packed), ("scales", ..), ("biases", ..)]`.
fn convert_tensor(
    gguf: &GgufFile,
    info: &GgufTensorInfo,
    rows_per_head: Option<usize>,
) -> Result<Vec<(&'static str, OwnedTensor)>> {
    let raw = gguf.tensor_data(info)?;
    let shape = info.shape();
    let rows = if shape.len() >= 2 {
        shape[0]
    } else {
        shape.iter().product()
    };
    let data: Cow<'_, [u8]> = match rows_per_head {
        Some(head_dim) if rows.is_multiple_of(head_dim) && head_dim.is_multiple_of(2) => {
            Cow::Owned(unpermute_rows(raw, rows, head_dim))
        }
        Some(head_dim) => {
            return Err(ModelError::GgufTensor {
                path: gguf.path().to_owned(),
                tensor: info.name.clone(),
                reason: format!("{rows} rows are not whole heads of {head_dim}"),
            });
        }
        None => Cow::Borrowed(raw),
    };
    let dense = |dtype| {
        Ok(vec![(
            "",
            OwnedTensor {
                dtype,
                shape: shape.clone(),
                data: data.to_vec(),
            },
        )])
    };
    match info.ggml_type {
        GgmlType::F32 => dense(safetensors::Dtype::F32),
        GgmlType::F16 => dense(safetensors::Dtype::F16),
        GgmlType::BF16 => dense(safetensors::Dtype::BF16),
        ty => {
            let bits = affine_bits(ty).expect("only supported types reach here");
            if shape.len() != 2 {
                return Err(ModelError::GgufTensor {
                    path: gguf.path().to_owned(),
                    tensor: info.name.clone(),
                    reason: format!("quantized but not 2-D (shape {shape:?})"),
                });
            }
            Ok(block_quantized(ty, bits, &data, shape[0], shape[1]))
        }
    }
}

fn block_quantized(
    ty: GgmlType,
    bits: u32,
    data: &[u8],
    rows: usize,
    cols: usize,
) -> Vec<(&'static str, OwnedTensor)> {
    let (_, block_bytes) = ty.block().expect("block type");
    let groups = cols / GROUP_SIZE;
    let mut q = Vec::with_capacity(rows * cols);
    let mut scales = Vec::with_capacity(rows * groups);
    let mut biases = Vec::with_capacity(rows * groups);
    for block in data.chunks_exact(block_bytes) {
        let affine = to_affine(ty, block);
        q.extend_from_slice(&affine.q);
        scales.push(affine.scale);
        biases.push(affine.bias);
    }
    let words = pack(&q, bits);
    let weight = OwnedTensor {
        dtype: safetensors::Dtype::U32,
        shape: vec![rows, cols * bits as usize / 32],
        data: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
    };
    // Scales are f16 in GGUF and biases are f16 or small multiples of a power of two, so f16 is
    // lossless unless `-8 d`/`-128 d` overflows it; then this tensor keeps f32.
    let fits_f16 = biases.iter().all(|&b| f16::from_f32(b).to_f32() == b);
    let floats = |values: &[f32]| -> OwnedTensor {
        let (dtype, data) = if fits_f16 {
            (
                safetensors::Dtype::F16,
                values
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
            )
        } else {
            (
                safetensors::Dtype::F32,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        };
        OwnedTensor {
            dtype,
            shape: vec![rows, groups],
            data,
        }
    };
    vec![
        ("weight", weight),
        ("scales", floats(&scales)),
        ("biases", floats(&biases)),
    ]
}
