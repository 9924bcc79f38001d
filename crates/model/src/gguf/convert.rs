//! `mlxcel convert`: a GGUF file becomes an ordinary MLX checkpoint directory.
//!
//! Every block type mlxcel reads becomes affine groups without loss: of 32 elements (Q4_0, Q4_1,
//! Q8_0, Q5_0, Q5_1, Q4_K, Q5_K), or of 16 (Q6_K, Q3_K, Q2_K; recorded per module, under
//! `quantization.mode` [`GROUP16_AFFINE_MODE`], which only mlxcel reads); F32/F16/BF16 tensors are
//! copied; llama.cpp's q/k row permutation is undone; the tokenizer is rebuilt from metadata.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::gguf::tensors::{GgufBlocks, Output, plan};
use crate::gguf::vocab::GgufVocab;
use crate::quant::{GROUP16_AFFINE_MODE, QuantSpec, Quantization};
use crate::safetensors_files::{Dtype, PlannedBytes, SafetensorsFiles};
use crate::safetensors_writer::{PlannedTensor, write_streaming};

/// What a conversion produced.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub out_dir: PathBuf,
    pub config: ModelConfig,
    pub tensors: usize,
    /// Quantized tensors written as affine groups of 16 (GGUF Q6_K, Q3_K, Q2_K).
    pub group16: usize,
}

impl ConvertSummary {
    /// A line for the user when the checkpoint has groups of 16, which mlx-lm cannot read; else
    /// `None`.
    pub fn group16_note(&self) -> Option<String> {
        (self.group16 > 0).then(|| {
            format!(
                "{} tensors are Q6_K/Q3_K/Q2_K, written as affine groups of 16 (exact; \
                 quantization mode `{GROUP16_AFFINE_MODE}`): mlxcel reads this checkpoint, \
                 mlx-lm cannot (MLX's group sizes start at 32)",
                self.group16
            )
        })
    }
}

/// A GGUF file planned as an MLX checkpoint: what each output tensor is and how its bytes come
/// from the file, and the quantization found per module.
struct Planned {
    gguf: GgufFile,
    header: Header,
    outputs: Vec<Output>,
    module_specs: BTreeMap<String, Option<QuantSpec>>,
}

/// Plans the conversion of `gguf_path`. `known_scales` (output name → dtype) gives the scale and
/// bias dtypes an earlier plan chose, so that planning does not read every block again.
fn plan_checkpoint(
    gguf_path: &Path,
    known_scales: Option<&BTreeMap<String, safetensors::Dtype>>,
) -> Result<Planned> {
    let gguf = GgufFile::open(gguf_path)?;
    let header = Header::read(&gguf)?;
    // Refuse unsupported tensors before anything else.
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
    let mut module_specs: BTreeMap<String, Option<QuantSpec>> = BTreeMap::new();
    for info in &gguf.tensors {
        // RoPE factors (Phi-3's LongRoPE, Llama 3.1's `rope_freqs`) are config, read into the
        // header, not weights.
        if header.long_factors.is_some()
            && (info.name.starts_with("rope_factors_") || info.name == "rope_freqs.weight")
        {
            continue;
        }
        let (module, suffix) =
            hf_name_in(header.architecture, &info.name).ok_or_else(|| ModelError::GgufTensor {
                path: gguf_path.to_owned(),
                tensor: info.name.clone(),
                reason: "has no Hugging Face llama counterpart (not supported for import)".into(),
            })?;
        let rows_per_head = match (header.architecture, module.rsplit('.').next()) {
            // llama.cpp's converter permutes q and k for the families it converts as llamas.
            (Architecture::Llama | Architecture::SmolLm3, Some("q_proj" | "k_proj")) => {
                Some(header.head_dim)
            }
            _ => None,
        };
        // llama.cpp stores Gemma's norm weights with the one added.
        let norm_offset = header.gemma() && suffix == "weight" && module.ends_with("norm");
        let known = known_scales.and_then(|k| k.get(&format!("{module}.scales")).copied());
        let planned = plan(
            &gguf,
            info,
            &module,
            suffix,
            rows_per_head,
            norm_offset,
            known,
        )?;
        if suffix == "weight" && info.dims.len() == 2 {
            let spec = planned
                .iter()
                .find_map(|o| o.quantized_spec())
                .map(|(bits, group_size)| QuantSpec { bits, group_size });
            module_specs.insert(module.clone(), spec);
        }
        outputs.extend(planned);
    }
    Ok(Planned {
        gguf,
        header,
        outputs,
        module_specs,
    })
}

/// Writes everything of a checkpoint directory but the weights: config.json, the tokenizer's
/// files and generation_config.json.
fn write_checkpoint_files(
    gguf_path: &Path,
    planned: &Planned,
    out_dir: &Path,
) -> Result<ModelConfig> {
    let gguf = &planned.gguf;
    let vocab = GgufVocab::read(gguf)?;
    let tie_word_embeddings = gguf.tensor_info("output.weight").is_none();
    let quantization = quantization(&planned.module_specs);
    let mut config_json =
        planned
            .header
            .config_json(&vocab, tie_word_embeddings, quantization.as_ref());
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

    let tokenizer_path = out_dir.join("tokenizer.json");
    write_json(&tokenizer_path, &vocab.tokenizer_json(gguf)?)?;
    // Load what we wrote, so a vocabulary the tokenizers crate rejects fails here, not at first use.
    crate::tokenizer::Tokenizer::from_file(&tokenizer_path)?;
    write_json(
        &out_dir.join("tokenizer_config.json"),
        &vocab.tokenizer_config_json(planned.header.context_length),
    )?;
    write_json(
        &out_dir.join("generation_config.json"),
        &json!({"bos_token_id": vocab.bos, "eos_token_id": vocab.eos_token_ids()}),
    )?;
    Ok(config)
}

fn summary(planned: &Planned, out_dir: &Path, config: ModelConfig) -> ConvertSummary {
    let group16 = planned
        .outputs
        .iter()
        .filter(|o| o.quantized_spec().is_some_and(|(_, group)| group == 16))
        .count();
    ConvertSummary {
        out_dir: out_dir.to_owned(),
        config,
        tensors: planned.outputs.len(),
        group16,
    }
}

/// Converts `gguf_path` into an MLX checkpoint in `out_dir` (created if needed; files overwritten).
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path) -> Result<ConvertSummary> {
    let planned = plan_checkpoint(gguf_path, None)?;
    let config = write_checkpoint_files(gguf_path, &planned, out_dir)?;
    let tensors: Vec<PlannedTensor> = planned.outputs.iter().map(|o| o.planned.clone()).collect();
    let metadata = BTreeMap::from([("format".to_owned(), "mlx".to_owned())]);
    let path = out_dir.join("model.safetensors");
    let mut buf = Vec::new();
    write_streaming(&path, &metadata, &tensors, |i, out| {
        let output = &planned.outputs[i];
        buf.clear();
        buf.resize(output.planned.byte_len(), 0);
        output.fill(&planned.gguf, &mut buf)?;
        planned.gguf.release(output.source());
        out.write_all(&buf).map_err(|e| ModelError::io(&path, e))
    })?;
    Ok(summary(&planned, out_dir, config))
}

/// The file in a checkpoint directory that says its weights are a GGUF file's, converted as they
/// are loaded ([`prepare_gguf`]).
pub const GGUF_WEIGHTS_FILE: &str = "gguf-weights.json";

/// Prepares `out_dir` as a checkpoint whose weights stay in the GGUF file: config.json and the
/// tokenizer's files as [`convert_gguf`] writes them, and [`GGUF_WEIGHTS_FILE`] naming the file
/// (`gguf_path`, which must be absolute; its size and `sha256`) and the dtype chosen for each
/// quantized tensor's scales. No weight is written: [`Checkpoint::open`](crate::Checkpoint::open)
/// converts each tensor from the GGUF when a loader asks for it.
pub fn prepare_gguf(gguf_path: &Path, out_dir: &Path, sha256: &str) -> Result<ConvertSummary> {
    let planned = plan_checkpoint(gguf_path, None)?;
    let config = write_checkpoint_files(gguf_path, &planned, out_dir)?;
    let scales: BTreeMap<&str, String> = planned
        .outputs
        .iter()
        .filter(|o| o.planned.name.ends_with(".scales"))
        .map(|o| (o.planned.name.as_str(), dtype_name(o.planned.dtype)))
        .collect();
    let size = std::fs::metadata(gguf_path)
        .map_err(|e| ModelError::io(gguf_path, e))?
        .len();
    write_json(
        &out_dir.join(GGUF_WEIGHTS_FILE),
        &json!({
            "gguf": gguf_path,
            "size": size,
            "sha256": sha256,
            "scales": scales,
        }),
    )?;
    Ok(summary(&planned, out_dir, config))
}

fn dtype_name(dtype: safetensors::Dtype) -> String {
    format!("{dtype:?}")
}

/// What [`GGUF_WEIGHTS_FILE`] holds.
#[derive(Debug, serde::Deserialize, serde::Serialize)]
pub struct GgufWeights {
    /// The GGUF file (absolute).
    pub gguf: PathBuf,
    pub size: u64,
    pub sha256: String,
    scales: BTreeMap<String, String>,
}

impl GgufWeights {
    /// Reads `dir`'s [`GGUF_WEIGHTS_FILE`], or `None` when it has none.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(GGUF_WEIGHTS_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| ModelError::Json { path, source })
    }

    /// Points the file at `gguf` (the same bytes found at another path), atomically.
    pub fn repoint(dir: &Path, gguf: &Path) -> Result<()> {
        let Some(mut weights) = Self::read(dir)? else {
            return Ok(());
        };
        if weights.gguf == gguf {
            return Ok(());
        }
        weights.gguf = gguf.to_owned();
        let path = dir.join(GGUF_WEIGHTS_FILE);
        let partial = dir.join(format!(".{GGUF_WEIGHTS_FILE}.{}", std::process::id()));
        let value = serde_json::to_value(&weights).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        write_json(&partial, &value)?;
        std::fs::rename(&partial, &path).map_err(|e| ModelError::io(&path, e))
    }
}

/// The weights of a checkpoint prepared by [`prepare_gguf`], read from its GGUF file: each tensor
/// is converted when it is first asked for (and again after it is released).
pub(crate) fn open_gguf_weights(dir: &Path, weights: &GgufWeights) -> Result<SafetensorsFiles> {
    let found = std::fs::metadata(&weights.gguf)
        .map_err(|e| ModelError::io(&weights.gguf, e))?
        .len();
    if found != weights.size {
        return Err(ModelError::GgufChanged {
            dir: dir.to_owned(),
            gguf: weights.gguf.clone(),
            reason: format!(
                "it is {found} bytes, not the {} it had when prepared",
                weights.size
            ),
        });
    }
    let mut known = BTreeMap::new();
    for (name, dtype) in &weights.scales {
        let dtype = match dtype.as_str() {
            "F16" => safetensors::Dtype::F16,
            "F32" => safetensors::Dtype::F32,
            other => {
                return Err(ModelError::invalid(
                    dir.join(GGUF_WEIGHTS_FILE),
                    "scales",
                    format!("`{name}`: {other} is not F16 or F32"),
                ));
            }
        };
        known.insert(name.clone(), dtype);
    }
    let planned = plan_checkpoint(&weights.gguf, Some(&known))?;
    let tensors: Vec<PlannedBytes> = planned
        .outputs
        .iter()
        .map(|o| {
            (
                o.planned.name.clone(),
                Dtype::from_safetensors(o.planned.dtype),
                o.planned.shape.clone(),
                o.planned.byte_len(),
            )
        })
        .collect();
    let Planned { gguf, outputs, .. } = planned;
    let source = std::sync::Arc::new(GgufSource { gguf, outputs });
    let fill_from = source.clone();
    SafetensorsFiles::converted_on_demand(
        &weights.gguf,
        tensors,
        Box::new(move |i, out| {
            let GgufSource { gguf, outputs } = &*fill_from;
            outputs[i]
                .fill(gguf, out)
                .expect("the plan checked every tensor's bytes lie within the file");
            gguf.release(outputs[i].source());
        }),
        source,
    )
}

/// The GGUF file behind a checkpoint read from it, and the planned output of each region.
#[derive(Debug)]
pub(crate) struct GgufSource {
    gguf: GgufFile,
    outputs: Vec<Output>,
}

impl GgufSource {
    /// Rows `first_row .. first_row + rows` of region `region`'s blocks, if it is a quantized
    /// weight.
    pub(crate) fn blocks(
        &self,
        region: usize,
        first_row: usize,
        rows: usize,
    ) -> Option<GgufBlocks<'_>> {
        self.outputs
            .get(region)?
            .blocks(&self.gguf, first_row, rows)
    }

    /// The rows of region `region`'s output (its first dimension).
    pub(crate) fn rows(&self, region: usize) -> usize {
        self.outputs
            .get(region)
            .and_then(|o| o.planned.shape.first().copied())
            .unwrap_or(0)
    }

    /// Lets go of this process's resident pages of the GGUF tensor behind region `region`.
    pub(crate) fn release(&self, region: usize) {
        if let Some(output) = self.outputs.get(region) {
            self.gguf.release(output.source());
        }
    }
}

/// Writes `value` with every object's keys sorted, so that the bytes do not depend on whether
/// serde_json keeps insertion order (its `preserve_order` feature, which another crate of a build
/// can turn on).
fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut value = value.clone();
    value.sort_all_objects();
    let mut text = serde_json::to_string_pretty(&value).map_err(|source| ModelError::Json {
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
    /// `{arch}.attention.sliding_window`, and per layer whether it slides.
    sliding_window: Option<u64>,
    sliding_layers: Vec<bool>,
    attn_softcap: Option<f64>,
    final_softcap: Option<f64>,
    /// `{arch}.rope.freq_base_swa`: the sliding layers' RoPE base (Gemma 3).
    rope_theta_swa: Option<f32>,
    /// `{arch}.rope.scaling.factor` of linear scaling.
    rope_linear: Option<f64>,
    /// Features RoPE rotates (`rope.dimension_count`), and Phi-3's LongRoPE: the
    /// `rope_factors_long` tensor, `rope.scaling.attn_factor` and the original context length.
    rotary_dim: usize,
    long_factors: Option<Vec<f32>>,
    /// The file has `blk.0.attn_q.bias` (Hugging Face's `attention_bias`).
    attention_bias: bool,
    rope_attn_factor: Option<f64>,
    rope_original_context: Option<u64>,
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
            "qwen3" => Architecture::Qwen3,
            "smollm3" => Architecture::SmolLm3,
            "gemma2" => Architecture::Gemma2,
            "gemma3" => Architecture::Gemma3,
            "phi3" => Architecture::Phi3,
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: gguf.path().to_owned(),
                    architecture: other.to_owned(),
                    supported: "llama, qwen2, qwen3, smollm3, gemma2, gemma3, phi3 (GGUF general.architecture)",
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
        let mut rope_linear = None;
        if let Some(kind) = gguf
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
            && kind != "none"
        {
            if kind != "linear" {
                return Err(error(
                    &key("rope.scaling.type"),
                    format!(
                        "rope scaling `{kind}` is not supported for GGUF import (supported: linear)"
                    ),
                ));
            }
            let factor = float("rope.scaling.factor", 1.0)?;
            if factor != 1.0 {
                rope_linear = Some(factor);
            }
        }
        let block_count = need("block_count")?;
        // llama.cpp's sliding layers: a per-layer list, else a period (every `period`-th layer
        // global): 2 for Gemma 2, 6 for Gemma 3.
        let sliding_window = uint("attention.sliding_window")?.filter(|&w| w > 0);
        let pattern_key = key("attention.sliding_window_pattern");
        let sliding_layers: Vec<bool> = match (architecture, sliding_window) {
            (Architecture::Gemma2 | Architecture::Gemma3, Some(_)) => {
                match gguf.get(&pattern_key) {
                    Some(GgufValue::Array(items)) => items
                        .iter()
                        .map(|v| {
                            v.as_bool().ok_or_else(|| {
                                error(&pattern_key, "expected a list of booleans".into())
                            })
                        })
                        .collect::<Result<_>>()?,
                    other => {
                        let default = if architecture == Architecture::Gemma2 {
                            2
                        } else {
                            6
                        };
                        let period = match other {
                            Some(v) => v.as_u64().ok_or_else(|| {
                                error(&pattern_key, format!("{v:?} is not an integer"))
                            })?,
                            None => default,
                        }
                        .max(1);
                        (0..block_count).map(|i| i % period < period - 1).collect()
                    }
                }
            }
            _ => Vec::new(),
        };
        if !sliding_layers.is_empty() && sliding_layers.len() as u64 != block_count {
            return Err(error(
                &pattern_key,
                format!(
                    "lists {} layers, block_count is {block_count}",
                    sliding_layers.len()
                ),
            ));
        }
        let optional_float = |k: &str| -> Result<Option<f64>> {
            let k = key(k);
            gguf.get(&k)
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| error(&k, format!("{v:?} is not a number")))
                })
                .transpose()
        };
        let head_count = need("attention.head_count")?;
        let embedding_length = need("embedding_length")?;
        // The head size is the key length; RoPE may rotate fewer features (Phi-3/Phi-4-mini's
        // partial rotary writes those as `rope.dimension_count`).
        let rope_dims = uint("rope.dimension_count")?;
        // As llama.cpp reads them: the key length, else hidden / heads; RoPE's width, else the
        // head's.
        let head_dim = match uint("attention.key_length")? {
            Some(d) => d,
            None => embedding_length / head_count.max(1),
        } as usize;
        let rotary_dim = rope_dims.map_or(head_dim, |d| d as usize);
        if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
            return Err(error(
                &key("rope.dimension_count"),
                format!("{rotary_dim} rotated features for a head of {head_dim}"),
            ));
        }
        let tokens = gguf
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map_or(0, <[GgufValue]>::len);
        // Per-pair factors on the RoPE periods: Phi-3's LongRoPE (`rope_factors_long`), or
        // Llama 3.1's scaling, which llama.cpp's converter precomputes into `rope_freqs`.
        let factors_tensor = ["rope_factors_long.weight", "rope_freqs.weight"]
            .into_iter()
            .find_map(|name| gguf.tensor_info(name));
        let long_factors = match factors_tensor {
            None => None,
            Some(info) if info.ggml_type == crate::gguf::GgmlType::F32 => Some(
                gguf.tensor_data(info)?
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect::<Vec<f32>>(),
            ),
            Some(info) => {
                return Err(ModelError::GgufTensor {
                    path: gguf.path().to_owned(),
                    tensor: info.name.clone(),
                    reason: format!("is {}, expected F32", info.ggml_type),
                });
            }
        };
        Ok(Self {
            architecture,
            attention_bias: gguf.tensor_info("blk.0.attn_q.bias").is_some(),
            rotary_dim,
            long_factors,
            // rope_freqs carries no attention factor: 1.
            rope_attn_factor: optional_float("rope.scaling.attn_factor")?.or(factors_tensor
                .filter(|t| t.name == "rope_freqs.weight")
                .map(|_| 1.0)),
            rope_original_context: uint("rope.scaling.original_context_length")?,
            sliding_window,
            sliding_layers,
            attn_softcap: optional_float("attn_logit_softcapping")?,
            final_softcap: optional_float("final_logit_softcapping")?,
            rope_theta_swa: optional_float("rope.freq_base_swa")?.map(|v| v as f32),
            rope_linear,
            block_count,
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

    fn gemma(&self) -> bool {
        matches!(
            self.architecture,
            Architecture::Gemma2 | Architecture::Gemma3
        )
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
            // Llama-architecture files with biases on the attention projections (Qwen2's are
            // implied by its architecture).
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "torch_dtype": "float16",
            "bos_token_id": vocab.bos,
            "eos_token_id": vocab.eos_token_ids(),
        });
        if self.gemma() {
            config["hidden_activation"] = json!("gelu_pytorch_tanh");
            config["hidden_act"] = json!("gelu_pytorch_tanh");
            // GGUF has no query_pre_attn_scalar: llama.cpp scales by 1/√head_dim, except for the
            // 27B models (46 layers for Gemma 2, 62 for Gemma 3), which use hidden/heads.
            let big = match self.architecture {
                Architecture::Gemma2 => self.block_count == 46,
                _ => self.block_count == 62,
            };
            config["query_pre_attn_scalar"] = if big {
                json!(self.embedding_length / self.head_count.max(1))
            } else {
                json!(self.head_dim)
            };
            // Absent keys mean "none" in llama.cpp, not Hugging Face's Gemma 2 defaults.
            config["attn_logit_softcapping"] = json!(self.attn_softcap);
            config["final_logit_softcapping"] = json!(self.final_softcap);
            match self.sliding_window {
                Some(window) => {
                    config["sliding_window"] = json!(window);
                    config["layer_types"] = json!(
                        self.sliding_layers
                            .iter()
                            .map(|&s| if s {
                                "sliding_attention"
                            } else {
                                "full_attention"
                            })
                            .collect::<Vec<_>>()
                    );
                }
                None => {
                    config["sliding_window"] = Value::Null;
                    config["layer_types"] =
                        json!(vec!["full_attention"; self.block_count as usize]);
                }
            }
            if let Some(theta) = self.rope_theta_swa {
                config["rope_local_base_freq"] = json!(shortest(theta));
            }
        }
        if let Some(factor) = self.rope_linear {
            config["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
        }
        if self.rotary_dim < self.head_dim {
            config["partial_rotary_factor"] = json!(self.rotary_dim as f64 / self.head_dim as f64);
        }
        if let Some(factors) = &self.long_factors {
            let factors: Vec<f64> = factors.iter().map(|&f| shortest(f)).collect();
            let mut scaling = json!({"rope_type": "longrope", "long_factor": factors});
            if let Some(f) = self.rope_attn_factor {
                scaling["attention_factor"] = json!(f);
            }
            config["rope_scaling"] = scaling;
            if let Some(original) = self.rope_original_context {
                config["original_max_position_embeddings"] = json!(original);
            }
        }
        if self.architecture == Architecture::SmolLm3 {
            // llama.cpp runs every fourth SmolLM3 layer without RoPE and stores no key for it.
            config["no_rope_layer_interval"] = json!(4);
        }
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

/// [`hf_name`] for a given architecture: Gemma's `ffn_norm` is its `pre_feedforward_layernorm`
/// (its `post_attention_layernorm` is llama.cpp's `post_attention_norm`).
pub fn hf_name_in(architecture: Architecture, gguf_name: &str) -> Option<(String, &str)> {
    if architecture == Architecture::Phi3 {
        // Phi-3's fused projections: `attn_qkv`, and `ffn_up` holding gate then up.
        let (stem, suffix) = gguf_name.rsplit_once('.')?;
        if let Some(layer) = stem.strip_prefix("blk.") {
            let (n, part) = layer.split_once('.')?;
            let n: usize = n.parse().ok()?;
            let fused = match part {
                "attn_qkv" => Some("self_attn.qkv_proj"),
                "ffn_up" => Some("mlp.gate_up_proj"),
                _ => None,
            };
            if let Some(module) = fused {
                return Some((format!("model.layers.{n}.{module}"), suffix));
            }
        }
    }
    let (module, suffix) = hf_name(gguf_name)?;
    let gemma = matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3);
    if gemma && gguf_name.contains(".ffn_norm.") {
        let layer = module.strip_suffix(".post_attention_layernorm")?;
        return Some((format!("{layer}.pre_feedforward_layernorm"), suffix));
    }
    if !gemma && gguf_name.contains(".post_attention_norm.") {
        return None;
    }
    Some((module, suffix))
}

/// Maps a GGUF tensor name to its Hugging Face module and suffix (`weight` or `bias`), as for a
/// llama (see [`hf_name_in`] for the families that name norms differently).
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
                "post_attention_norm" => "post_attention_layernorm",
                "post_ffw_norm" => "post_feedforward_layernorm",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
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

/// The most common (bits, group size) becomes the default; other specs and dense modules are
/// overrides. Groups of 16 set `mode` to [`GROUP16_AFFINE_MODE`].
fn quantization(module_specs: &BTreeMap<String, Option<QuantSpec>>) -> Option<Quantization> {
    let mut counts: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    for spec in module_specs.values().flatten() {
        *counts.entry((spec.bits, spec.group_size)).or_default() += 1;
    }
    // The most common (bits, group) as the default; ties go to more bits, then larger groups.
    let (&(bits, group_size), _) = counts.iter().max_by_key(|&(key, count)| (*count, *key))?;
    let default = QuantSpec { bits, group_size };
    let overrides = module_specs
        .iter()
        .filter(|&(_, spec)| *spec != Some(default))
        .map(|(module, spec)| (module.clone(), *spec))
        .collect();
    Some(Quantization {
        default,
        overrides,
        mlxcel_affine: counts.keys().any(|&(_, group)| group == 16),
    })
}
