//! `mlxcel convert`: a GGUF file becomes an ordinary MLX checkpoint directory.
//!
//! Every block type mlxcel reads becomes affine groups without loss: of 32 elements (Q4_0, Q4_1,
//! Q8_0, Q5_0, Q5_1, Q4_K, Q5_K), or of 16 (Q6_K, Q3_K, Q2_K; recorded per module, under
//! `quantization.mode` [`GROUP16_AFFINE_MODE`], which only mlxcel reads); F32/F16/BF16 tensors are
//! copied; llama.cpp's q/k row permutation is undone; the tokenizer is rebuilt from metadata.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::ModelConfig;
use crate::config::blocks::Routing;
use crate::error::{ModelError, Result};
use crate::families::Architecture;
use crate::gguf::header::{GgufHeader, shortest};
use crate::gguf::overrides::KvOverride;
use crate::gguf::rank::write_rank_head;
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::gguf::tensors::{Destination, GgufBlocks, Output, RowOrder, Values, plan};
use crate::gguf::vocab::GgufVocab;
use crate::quant::{GROUP16_AFFINE_MODE, QuantSpec, Quantization};
use crate::safetensors_files::{ConvertedFrom, Dtype, PlannedBytes, SafetensorsFiles};
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
    family: Architecture,
    header: GgufHeader,
    outputs: Vec<Output>,
    module_specs: BTreeMap<String, Option<QuantSpec>>,
}

/// Plans the conversion of `gguf_path`. `known_scales` (output name → dtype) gives the scale and
/// bias dtypes an earlier plan chose, so that planning does not read every block again.
fn plan_checkpoint(
    gguf_path: &Path,
    known_scales: Option<&BTreeMap<String, safetensors::Dtype>>,
    overrides: &[KvOverride],
) -> Result<Planned> {
    let mut gguf = GgufFile::open(gguf_path)?;
    crate::gguf::overrides::apply(&mut gguf, overrides)?;
    let arch = gguf
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: "general.architecture".into(),
            reason: "missing".into(),
        })?;
    // llama.cpp writes Mixtral as a `llama` with experts: a file with `{arch}.expert_count` is
    // read by the family of that name that has experts.
    let experts = gguf
        .get(&format!("{arch}.expert_count"))
        .and_then(GgufValue::as_u64)
        .is_some_and(|n| n > 0);
    let family = Architecture::from_gguf_name_with_experts(arch, experts).ok_or_else(|| {
        ModelError::UnsupportedArchitecture {
            path: gguf.path().to_owned(),
            architecture: arch.to_owned(),
            supported: format!(
                "{} (GGUF general.architecture)",
                Architecture::supported_gguf_names()
            ),
        }
    })?;
    if let Some(reason) = family.gguf_refusal() {
        return Err(ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: "general.architecture".into(),
            reason: format!("`{arch}`: {reason}"),
        });
    }
    if experts && !family.family().has_experts() {
        return Err(ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: format!("{arch}.expert_count"),
            reason: format!(
                "a mixture of experts in a `{arch}` file is not supported (GGUF mixtures of \
                 experts mlxcel reads: qwen3moe, qwen2moe, olmoe, and llama as Mixtral)"
            ),
        });
    }
    let header = GgufHeader::read(&gguf, arch, family.family().gguf_sliding_period())?;
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
        // The multi-token-prediction layers after the model's own are not read.
        if header.nextn_layers > 0 && layer_of(&info.name).is_some_and(|l| l >= header.block_count)
        {
            continue;
        }
        // RoPE factors (Phi-3's LongRoPE, Llama 3.1's `rope_freqs`) are config, read into the
        // header, not weights.
        if header.long_factors.is_some()
            && (info.name.starts_with("rope_factors_") || info.name == "rope_freqs.weight")
        {
            continue;
        }
        let (module, suffix) =
            hf_name_in(family, &info.name).ok_or_else(|| ModelError::GgufTensor {
                path: gguf_path.to_owned(),
                tensor: info.name.clone(),
                reason: "has no Hugging Face llama counterpart (not supported for import)".into(),
            })?;
        let row_order = match module.rsplit('.').next() {
            Some("q_proj" | "k_proj") if family.gguf_permuted_qk() => RowOrder::PermutedHeads {
                head_dim: header.head_dim,
            },
            _ => RowOrder::Same,
        };
        // llama.cpp stores the norm weights of families whose norms multiply by `1 + w` (Gemma,
        // the hybrids but for their linear layers' gated norm) with the one added, and a gated
        // DeltaNet's `A_log` as `-exp(A_log)`.
        let values = if family.family().features().norm_weight_offset
            && suffix == "weight"
            && module.ends_with("norm")
            && !module.ends_with(".linear_attn.norm")
        {
            Values::NormOffset
        } else if suffix == "A_log" {
            Values::NegatedExp
        } else {
            Values::Kept
        };
        // A stack of experts (`ffn_*_exps`, `[experts, out, in]`) becomes one output per expert,
        // each a sub-range of the stack's rows; the scales' dtype is chosen once for the stack.
        let experts: Vec<(String, Option<usize>, RowOrder)> =
            match module.split_once(".switch_mlp.") {
                Some((stem, projection)) if info.dims.len() == 3 => (0..info.dims[2] as usize)
                    .map(|j| {
                        (
                            format!("{stem}.experts.{j}.{projection}"),
                            Some(j),
                            row_order,
                        )
                    })
                    .collect(),
                _ => match module.strip_suffix(".in_proj_ba") {
                    // Qwen3-Next's `ssm_ba`: per key head its value heads' b, then their a; read
                    // as the two projections Qwen3.5 stores apart.
                    Some(stem) => ba_parts(stem, header.linear_attention.as_ref()),
                    None => vec![(module.clone(), None, row_order)],
                },
            };
        let mut known =
            known_scales.and_then(|k| k.get(&format!("{}.scales", experts[0].0)).copied());
        for (module, expert, row_order) in experts {
            let destination = Destination {
                module: &module,
                suffix,
                expert,
            };
            let mut planned = plan(&gguf, info, destination, row_order, values, known)?;
            known = known.or_else(|| {
                planned
                    .iter()
                    .find(|o| o.planned.name.ends_with(".scales"))
                    .map(|o| o.planned.dtype)
            });
            // llama.cpp's shared-expert gate is a vector `[hidden]`; Hugging Face's a `[1, hidden]`
            // linear.
            if module.ends_with(".shared_expert_gate") && info.dims.len() == 1 {
                for output in &mut planned {
                    output.planned.shape.insert(0, 1);
                }
            }
            // llama.cpp's convolution taps are `[channels, taps]`; Hugging Face's
            // `[channels, 1, taps]` (the layout that says the norms are zero-centred, as the
            // one subtracted above leaves them).
            if module.ends_with(".linear_attn.conv1d") && info.dims.len() == 2 {
                for output in &mut planned {
                    output.planned.shape.insert(1, 1);
                }
            }
            if suffix == "weight" && (info.dims.len() == 2 || expert.is_some()) {
                let spec = planned
                    .iter()
                    .find_map(|o| o.quantized_spec())
                    .map(|(bits, group_size)| QuantSpec { bits, group_size });
                module_specs.insert(module.clone(), spec);
            }
            outputs.extend(planned);
        }
    }
    Ok(Planned {
        gguf,
        family,
        header,
        outputs,
        module_specs,
    })
}

/// The layer of a tensor named `blk.{layer}.…`.
fn layer_of(gguf_name: &str) -> Option<u64> {
    gguf_name
        .strip_prefix("blk.")?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// The two projections of Qwen3-Next's fused `in_proj_ba` under `stem` (`…linear_attn`): per key
/// head, its value heads' b rows, then their a rows. Without the file's linear-attention keys the
/// tensor is left whole (and the checkpoint refuses the module it does not expect).
fn ba_parts(
    stem: &str,
    linear: Option<&crate::gguf::linear_attention::GgufLinearAttention>,
) -> Vec<(String, Option<usize>, RowOrder)> {
    let Some(l) = linear.filter(|l| l.value_heads.is_multiple_of(l.key_heads)) else {
        return vec![(format!("{stem}.in_proj_ba"), None, RowOrder::Same)];
    };
    let per = (l.value_heads / l.key_heads) as usize;
    [("in_proj_b", 0), ("in_proj_a", per)]
        .into_iter()
        .map(|(part, offset)| {
            let order = RowOrder::Runs {
                run: per,
                stride: 2 * per,
                offset,
            };
            (format!("{stem}.{part}"), None, order)
        })
        .collect()
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
    let mut config_json = config_json(
        planned.family,
        &planned.header,
        &vocab,
        tie_word_embeddings,
        quantization.as_ref(),
    );
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
    check_weights_norm(gguf, &planned.header, &config)?;
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
    let arch = gguf
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or_default();
    write_rank_head(gguf, arch, out_dir)?;
    Ok(config)
}

/// llama.cpp renormalises the top-k weights or not by architecture (Qwen3-MoE and Mixtral do,
/// Qwen2-MoE and OLMoE do not), whatever the file's `expert_weights_norm` says; the families'
/// GGUF configs follow it. A file whose key contradicts that is refused, naming the key: the two
/// readings would compute different models.
fn check_weights_norm(gguf: &GgufFile, header: &GgufHeader, config: &ModelConfig) -> Result<()> {
    let Some(said) = header.experts.and_then(|e| e.weights_norm) else {
        return Ok(());
    };
    let Some(moe) = config.feed_forward.iter().find_map(|f| f.routed()) else {
        return Ok(());
    };
    let renormalized = match moe.routing {
        Routing::SoftmaxTopK { renormalize } | Routing::SigmoidTopK { renormalize, .. } => {
            renormalize
        }
        Routing::TopKSoftmax => true,
    };
    if said == renormalized {
        return Ok(());
    }
    let arch = config.architecture.gguf_name();
    Err(ModelError::GgufMetadata {
        path: gguf.path().to_owned(),
        key: format!("{arch}.expert_weights_norm"),
        reason: format!(
            "is {said}, but llama.cpp's `{arch}` {} the top-k expert weights whatever it says",
            if renormalized {
                "always renormalises"
            } else {
                "never renormalises"
            }
        ),
    })
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
    let planned = plan_checkpoint(gguf_path, None, &[])?;
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
    prepare_gguf_with(gguf_path, out_dir, sha256, &[])
}

/// [`prepare_gguf`] with `--override-kv`'s `overrides` applied to the file's metadata first;
/// [`GGUF_WEIGHTS_FILE`] records them (the tensors are planned under them again at each load)
/// and the keys among them that the importer never read ([`GgufWeights::kv_overrides_unread`]).
pub fn prepare_gguf_with(
    gguf_path: &Path,
    out_dir: &Path,
    sha256: &str,
    overrides: &[KvOverride],
) -> Result<ConvertSummary> {
    let planned = plan_checkpoint(gguf_path, None, overrides)?;
    let config = write_checkpoint_files(gguf_path, &planned, out_dir)?;
    let unread = crate::gguf::overrides::unread(&planned.gguf, overrides);
    let scales: BTreeMap<&str, String> = planned
        .outputs
        .iter()
        .filter(|o| o.planned.name.ends_with(".scales"))
        .map(|o| (o.planned.name.as_str(), dtype_name(o.planned.dtype)))
        .collect();
    let size = std::fs::metadata(gguf_path)
        .map_err(|e| ModelError::io(gguf_path, e))?
        .len();
    let mut weights = json!({
        "gguf": gguf_path,
        "size": size,
        "sha256": sha256,
        "scales": scales,
    });
    if !overrides.is_empty() {
        let specs: Vec<&str> = overrides.iter().map(|o| o.spec.as_str()).collect();
        weights["kv_overrides"] = json!(specs);
        weights["kv_overrides_unread"] = json!(unread);
    }
    write_json(&out_dir.join(GGUF_WEIGHTS_FILE), &weights)?;
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
    /// `--override-kv` overrides the checkpoint was prepared with (`KEY=TYPE:VALUE`), applied
    /// again when its tensors are planned at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_overrides: Vec<String>,
    /// The keys of `kv_overrides` that the importer never read: they changed nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_overrides_unread: Vec<String>,
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
    let overrides = weights
        .kv_overrides
        .iter()
        .map(|spec| KvOverride::parse(spec))
        .collect::<Result<Vec<_>>>()?;
    let planned = plan_checkpoint(&weights.gguf, Some(&known), &overrides)?;
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
struct GgufSource {
    gguf: GgufFile,
    outputs: Vec<Output>,
}

impl ConvertedFrom for GgufSource {
    fn blocks(&self, region: usize, first_row: usize, rows: usize) -> Option<GgufBlocks<'_>> {
        self.outputs
            .get(region)?
            .blocks(&self.gguf, first_row, rows)
    }

    fn rows(&self, region: usize) -> usize {
        self.outputs
            .get(region)
            .and_then(|o| o.planned.shape.first().copied())
            .unwrap_or(0)
    }

    fn release(&self, region: usize) {
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

/// config.json of a GGUF file's model: the llama keys, then what its family adds.
fn config_json(
    family: Architecture,
    header: &GgufHeader,
    vocab: &GgufVocab,
    tie: bool,
    quantization: Option<&Quantization>,
) -> Value {
    let mut config = json!({
        "architectures": [family.hf_name()],
        "model_type": family.model_type(),
        "hidden_size": header.embedding_length,
        "num_hidden_layers": header.block_count,
        "num_attention_heads": header.head_count,
        "num_key_value_heads": header.head_count_kv,
        "head_dim": header.head_dim,
        "intermediate_size": header.feed_forward_length,
        "rms_norm_eps": shortest(header.rms_norm_eps),
        "rope_theta": shortest(header.rope_theta),
        "max_position_embeddings": header.context_length,
        "vocab_size": header.vocab_size,
        "tie_word_embeddings": tie,
        // Llama-architecture files with biases on the attention projections (Qwen2's are
        // implied by its architecture).
        "attention_bias": header.attention_bias,
        "hidden_act": "silu",
        "torch_dtype": "float16",
        "bos_token_id": vocab.bos,
        "eos_token_id": vocab.eos_token_ids(),
    });
    family.family().gguf_config(header, &mut config);
    if let Some(factor) = header.rope_linear {
        config["rope_scaling"] = json!({"rope_type": "linear", "factor": factor});
    }
    if let Some(factor) = header.rope_yarn {
        // As llama.cpp computes it: the band's edges rounded to whole pairs, betas 32 and 1,
        // the attention factor 0.1·ln(factor) + 1 times `rope.scaling.attn_factor`.
        let mscale = if factor > 1.0 {
            0.1 * factor.ln() + 1.0
        } else {
            1.0
        };
        config["rope_scaling"] = json!({
            "rope_type": "yarn",
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": true,
            "original_max_position_embeddings":
                header.rope_original_context.unwrap_or(header.context_length as u64),
            "attention_factor": mscale * header.rope_attn_factor.unwrap_or(1.0),
        });
    }
    if header.rotary_dim < header.head_dim {
        config["partial_rotary_factor"] = json!(header.rotary_dim as f64 / header.head_dim as f64);
    }
    // Gemma 4's `rope_freqs` are its proportional RoPE, which its family writes as
    // `rope_parameters`.
    if let Some(factors) = header
        .long_factors
        .as_ref()
        .filter(|_| config["rope_parameters"].is_null())
    {
        let factors: Vec<f64> = factors.iter().map(|&f| shortest(f)).collect();
        let mut scaling = json!({"rope_type": "longrope", "long_factor": factors});
        if let Some(f) = header.rope_attn_factor {
            scaling["attention_factor"] = json!(f);
        }
        config["rope_scaling"] = scaling;
        if let Some(original) = header.rope_original_context {
            config["original_max_position_embeddings"] = json!(original);
        }
    }
    if let Some(q) = quantization {
        config["quantization"] = q.to_json();
        config["quantization_config"] = q.to_json();
    }
    config
}

/// The Hugging Face module and suffix (`weight` or `bias`) of GGUF tensor `gguf_name` in a file
/// of `architecture`: a llama's ([`hf_name`](crate::gguf::hf_name)) but for the family's own.
pub fn hf_name_in(architecture: Architecture, gguf_name: &str) -> Option<(String, &str)> {
    architecture.family().gguf_tensor_name(gguf_name)
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
