//! A BERT encoder read straight from a GGUF file (`general.architecture = "bert"`, as llama.cpp's
//! convert_hf_to_gguf.py writes one): its hyperparameters, every weight widened to f32 (any type
//! [`dequantize_reference`] reads: F32, F16, BF16, Q8_0, Q4_0 and the K-quants, bit for bit
//! llama.cpp's values), its WordPiece vocabulary and, for a reranker, its classification head
//! (`cls` dense + tanh, then `cls.output`, llama.cpp's rank pooling). A missing tensor, a tensor
//! of the wrong shape and a metadata key out of range are refused naming them, before any backend
//! state exists.

use std::path::{Path, PathBuf};

use crate::encoder::wpm::{WpmOptions, WpmVocab};
use crate::error::{ModelError, Result};
use crate::gguf::dequant::dequantize_reference;
use crate::gguf::{GgmlType, GgufFile, GgufValue};
use crate::rank::{RankHeadFile, RankToken};
use crate::rank_head::RankHead;

/// The GGUF architectures read as encoders.
pub const ENCODER_ARCHITECTURES: &[&str] = &["bert"];

/// llama.cpp's pooling types (`{arch}.pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderPooling {
    None,
    Mean,
    Cls,
    Last,
    Rank,
}

/// A BERT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub eps: f32,
    /// Learned positions (`{arch}.context_length`): the longest input.
    pub positions: usize,
    pub vocab: usize,
    /// Rows of `token_types.weight` (`tokenizer.ggml.token_type_count`).
    pub token_types: usize,
    /// `{arch}.pooling_type`, when the file says.
    pub pooling: Option<EncoderPooling>,
}

/// A weight widened to f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// Row-major (PyTorch) shape: `[rows, row length]` or `[n]`.
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The type the file stores it in: what llama.cpp rounds a matmul's input to
    /// ([`crate::encoder::activation::round_activations`]).
    pub ggml_type: GgmlType,
}

/// One encoder layer: attention with biases, post-norm, GELU feed-forward, post-norm.
#[derive(Debug, Clone, PartialEq)]
pub struct BertLayer {
    pub q: (Dense, Dense),
    pub k: (Dense, Dense),
    pub v: (Dense, Dense),
    pub o: (Dense, Option<Dense>),
    pub attn_norm: (Dense, Dense),
    pub up: (Dense, Option<Dense>),
    pub down: (Dense, Option<Dense>),
    pub out_norm: (Dense, Dense),
}

/// A BERT's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct BertWeights {
    pub tok_embd: Dense,
    /// Only its first row is read: llama.cpp gives every token type 0 ("sentence A").
    pub type_embd: Option<Dense>,
    pub pos_embd: Dense,
    pub embd_norm: (Dense, Dense),
    pub layers: Vec<BertLayer>,
}

/// A BERT GGUF, read and checked.
#[derive(Debug, Clone)]
pub struct BertCheckpoint {
    pub path: PathBuf,
    pub name: String,
    pub config: BertConfig,
    pub weights: BertWeights,
    pub vocab: WpmVocab,
    /// The classification head of a reranker (`cls.output`); `None` for an embedding model.
    pub head: Option<RankHead>,
    /// llama.cpp's name of the file's weight type (`general.file_type`), e.g. `F16`.
    pub ftype: String,
}

/// Whether `path` is a GGUF file of an encoder architecture ([`ENCODER_ARCHITECTURES`]). A file
/// that cannot be read as GGUF is not one (the decoder importer reports why).
pub fn is_encoder_gguf(path: &Path) -> bool {
    path.is_file()
        && GgufFile::open(path).is_ok_and(|gguf| {
            gguf.get("general.architecture")
                .and_then(GgufValue::as_str)
                .is_some_and(|arch| ENCODER_ARCHITECTURES.contains(&arch))
        })
}

impl BertCheckpoint {
    /// Reads the BERT GGUF at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let gguf = GgufFile::open(path)?;
        let arch = gguf
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or("");
        if arch != "bert" {
            return Err(ModelError::UnsupportedArchitecture {
                path: path.to_owned(),
                architecture: arch.to_owned(),
                supported: "bert".into(),
            });
        }
        let reader = Reader { gguf: &gguf, path };
        let config = reader.config()?;
        let vocab = reader.vocab(&config)?;
        let weights = reader.weights(&config)?;
        let head = reader.head(&config)?;
        let name = gguf
            .get("general.name")
            .and_then(GgufValue::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                path.file_stem()
                    .map_or_else(|| "bert".into(), |s| s.to_string_lossy().into_owned())
            });
        let ftype = gguf
            .get("general.file_type")
            .and_then(GgufValue::as_u64)
            .map_or_else(
                || "unknown".into(),
                |t| crate::ftype::llama_ftype_name(t).to_owned(),
            );
        Ok(Self {
            path: path.to_owned(),
            name,
            config,
            weights,
            vocab,
            head,
            ftype,
        })
    }

    /// Parameters, the embeddings included.
    pub fn parameters(&self) -> u64 {
        let w = &self.weights;
        let mut n = w.tok_embd.data.len() + w.pos_embd.data.len() + 2 * self.config.hidden;
        n += w.type_embd.as_ref().map_or(0, |t| t.data.len());
        for l in &w.layers {
            for (a, b) in [&l.q, &l.k, &l.v, &l.attn_norm, &l.out_norm] {
                n += a.data.len() + b.data.len();
            }
            for (a, b) in [&l.o, &l.up, &l.down] {
                n += a.data.len() + b.as_ref().map_or(0, |b| b.data.len());
            }
        }
        n as u64
    }
}

struct Reader<'a> {
    gguf: &'a GgufFile,
    path: &'a Path,
}

impl Reader<'_> {
    fn meta_error(&self, key: &str, reason: impl Into<String>) -> ModelError {
        ModelError::GgufMetadata {
            path: self.path.to_owned(),
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    /// A positive integer key.
    fn count(&self, key: &str) -> Result<usize> {
        let value = self
            .gguf
            .get(key)
            .ok_or_else(|| self.meta_error(key, "missing (a BERT GGUF has it)"))?;
        value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .filter(|&v| v > 0 && v <= 1 << 24)
            .ok_or_else(|| self.meta_error(key, format!("{value:?} is not a positive count")))
    }

    fn id(&self, key: &str, default: Option<u32>, vocab: usize) -> Result<Option<u32>> {
        match self.gguf.get(key) {
            None => Ok(default),
            Some(v) => {
                let id = v.as_u64().filter(|&id| id < vocab as u64).ok_or_else(|| {
                    self.meta_error(key, format!("{v:?} is not a token id below {vocab}"))
                })?;
                Ok(Some(id as u32))
            }
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.gguf.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.meta_error(key, format!("{v:?} is not a boolean"))),
        }
    }

    fn config(&self) -> Result<BertConfig> {
        let hidden = self.count("bert.embedding_length")?;
        let heads = self.count("bert.attention.head_count")?;
        if !hidden.is_multiple_of(heads) {
            return Err(self.meta_error(
                "bert.attention.head_count",
                format!("{heads} heads do not divide the hidden size {hidden}"),
            ));
        }
        if let Some(kv) = self.gguf.get("bert.attention.head_count_kv")
            && kv.as_u64() != Some(heads as u64)
        {
            return Err(self.meta_error(
                "bert.attention.head_count_kv",
                format!("{kv:?}: a BERT's keys and values have as many heads as its queries"),
            ));
        }
        if self.flag("bert.attention.causal", false)? {
            return Err(self.meta_error(
                "bert.attention.causal",
                "true: a BERT encoder attends both ways",
            ));
        }
        let eps_key = "bert.attention.layer_norm_epsilon";
        let eps = self
            .gguf
            .get(eps_key)
            .ok_or_else(|| self.meta_error(eps_key, "missing (a BERT GGUF has it)"))?;
        let eps = eps
            .as_f64()
            .filter(|e| e.is_finite() && *e >= 0.0)
            .ok_or_else(|| self.meta_error(eps_key, format!("{eps:?} is not an epsilon")))?
            as f32;
        let pooling = match self.gguf.get("bert.pooling_type") {
            None => None,
            Some(v) => Some(match v.as_u64() {
                Some(0) => EncoderPooling::None,
                Some(1) => EncoderPooling::Mean,
                Some(2) => EncoderPooling::Cls,
                Some(3) => EncoderPooling::Last,
                Some(4) => EncoderPooling::Rank,
                _ => {
                    return Err(self.meta_error(
                        "bert.pooling_type",
                        format!("{v:?}: not one of llama.cpp's pooling types 0..=4"),
                    ));
                }
            }),
        };
        let vocab = self
            .gguf
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(<[GgufValue]>::len)
            .filter(|&n| n > 0)
            .ok_or_else(|| self.meta_error("tokenizer.ggml.tokens", "missing or empty"))?;
        Ok(BertConfig {
            hidden,
            layers: self.count("bert.block_count")?,
            heads,
            ffn: self.count("bert.feed_forward_length")?,
            eps,
            positions: self.count("bert.context_length")?,
            vocab,
            token_types: self.count("tokenizer.ggml.token_type_count")?,
            pooling,
        })
    }

    fn vocab(&self, config: &BertConfig) -> Result<WpmVocab> {
        let model_key = "tokenizer.ggml.model";
        match self.gguf.get(model_key).and_then(GgufValue::as_str) {
            Some("bert") => {}
            Some("t5") => {
                return Err(self.meta_error(
                    model_key,
                    "\"t5\": a Unigram (UGM) vocabulary, as XLM-RoBERTa's (bge-reranker-v2-m3), \
                     is not supported yet; only BERT's WordPiece vocabulary (\"bert\") is",
                ));
            }
            other => {
                return Err(self.meta_error(
                    model_key,
                    format!("{other:?}: a BERT encoder needs a WordPiece vocabulary (\"bert\")"),
                ));
            }
        }
        let tokens_key = "tokenizer.ggml.tokens";
        let tokens = self
            .gguf
            .get(tokens_key)
            .and_then(GgufValue::as_array)
            .unwrap_or(&[])
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| self.meta_error(tokens_key, "a token that is not a string"))
            })
            .collect::<Result<Vec<_>>>()?;
        let types_key = "tokenizer.ggml.token_type";
        let types: Vec<i32> = match self.gguf.get(types_key).and_then(GgufValue::as_array) {
            None => Vec::new(),
            Some(types) if types.len() == tokens.len() => types
                .iter()
                .map(|t| match t {
                    GgufValue::I32(v) => *v,
                    other => other.as_u64().map_or(1, |v| v as i32),
                })
                .collect(),
            Some(types) => {
                return Err(self.meta_error(
                    types_key,
                    format!("{} types for {} tokens", types.len(), tokens.len()),
                ));
            }
        };
        let n = config.vocab;
        let lowercase = self.flag("tokenizer.ggml.normalizer.lowercase", false)?;
        let options = WpmOptions {
            unk: self
                .id("tokenizer.ggml.unknown_token_id", Some(100), n)?
                .filter(|&id| (id as usize) < n)
                .ok_or_else(|| {
                    self.meta_error(
                        "tokenizer.ggml.unknown_token_id",
                        format!("missing, and the default 100 is not below {n}"),
                    )
                })?,
            bos: self
                .id("tokenizer.ggml.bos_token_id", Some(101), n)?
                .filter(|&id| (id as usize) < n),
            eos: self.id("tokenizer.ggml.eos_token_id", None, n)?,
            sep: self
                .id("tokenizer.ggml.seperator_token_id", Some(102), n)?
                .filter(|&id| (id as usize) < n),
            add_bos: self.flag("tokenizer.ggml.add_bos_token", true)?,
            add_eos: self.flag("tokenizer.ggml.add_eos_token", false)?,
            add_sep: self.flag("tokenizer.ggml.add_sep_token", true)?,
            lowercase,
            strip_accents: self.flag("tokenizer.ggml.normalizer.strip_accents", lowercase)?,
        };
        Ok(WpmVocab::new(tokens, &types, options))
    }

    /// The tensor `name` widened to f32, checked to have the row-major `shape`.
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Dense> {
        self.optional(name, shape)?
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.to_owned(),
                tensor: name.to_owned(),
            })
    }

    fn optional(&self, name: &str, shape: &[usize]) -> Result<Option<Dense>> {
        let Some(info) = self.gguf.tensor_info(name) else {
            return Ok(None);
        };
        let actual = info.shape();
        if actual != shape {
            return Err(ModelError::TensorShape {
                path: self.path.to_owned(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                actual,
            });
        }
        let bytes = self.gguf.tensor_data(info)?;
        let data = dequantize_reference(info.ggml_type, bytes)
            .filter(|d| d.len() == shape.iter().product::<usize>())
            .ok_or_else(|| ModelError::GgufTensor {
                path: self.path.to_owned(),
                tensor: name.to_owned(),
                reason: format!(
                    "{} data that is not whole blocks of its {shape:?} elements",
                    info.ggml_type
                ),
            })?;
        Ok(Some(Dense {
            shape: shape.to_vec(),
            data,
            ggml_type: info.ggml_type,
        }))
    }

    fn norm(&self, name: &str, hidden: usize) -> Result<(Dense, Dense)> {
        Ok((
            self.tensor(&format!("{name}.weight"), &[hidden])?,
            self.tensor(&format!("{name}.bias"), &[hidden])?,
        ))
    }

    fn weights(&self, c: &BertConfig) -> Result<BertWeights> {
        let h = c.hidden;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let t = |n: &str, shape: &[usize]| self.tensor(&format!("blk.{i}.{n}"), shape);
            let o = |n: &str, shape: &[usize]| self.optional(&format!("blk.{i}.{n}"), shape);
            if self
                .gguf
                .tensor_info(&format!("blk.{i}.attn_qkv.weight"))
                .is_some()
            {
                return Err(ModelError::GgufTensor {
                    path: self.path.to_owned(),
                    tensor: format!("blk.{i}.attn_qkv.weight"),
                    reason: "a fused query/key/value projection is not supported for BERT; \
                             convert the model with separate attn_q, attn_k and attn_v"
                        .into(),
                });
            }
            layers.push(BertLayer {
                q: (t("attn_q.weight", &[h, h])?, t("attn_q.bias", &[h])?),
                k: (t("attn_k.weight", &[h, h])?, t("attn_k.bias", &[h])?),
                v: (t("attn_v.weight", &[h, h])?, t("attn_v.bias", &[h])?),
                o: (
                    t("attn_output.weight", &[h, h])?,
                    o("attn_output.bias", &[h])?,
                ),
                attn_norm: self.norm(&format!("blk.{i}.attn_output_norm"), h)?,
                up: (
                    t("ffn_up.weight", &[c.ffn, h])?,
                    o("ffn_up.bias", &[c.ffn])?,
                ),
                down: (
                    t("ffn_down.weight", &[h, c.ffn])?,
                    o("ffn_down.bias", &[h])?,
                ),
                out_norm: self.norm(&format!("blk.{i}.layer_output_norm"), h)?,
            });
        }
        Ok(BertWeights {
            tok_embd: self.tensor("token_embd.weight", &[c.vocab, h])?,
            type_embd: self.optional("token_types.weight", &[c.token_types, h])?,
            pos_embd: self.tensor("position_embd.weight", &[c.positions, h])?,
            embd_norm: self.norm("token_embd_norm", h)?,
            layers,
        })
    }

    /// The classification head: `cls.output` (`[outputs, hidden]`, with its optional bias),
    /// after the optional `cls` dense layer and tanh. A `cls` without `cls.output` is refused.
    fn head(&self, c: &BertConfig) -> Result<Option<RankHead>> {
        let h = c.hidden;
        let labels: Vec<String> = self
            .gguf
            .get("bert.classifier.output_labels")
            .and_then(GgufValue::as_array)
            .map(|ls| {
                ls.iter()
                    .filter_map(|l| l.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let outputs = self
            .gguf
            .tensor_info("cls.output.weight")
            .map(|info| info.shape().first().copied().unwrap_or(0));
        let Some(outputs) = outputs else {
            if self.gguf.tensor_info("cls.weight").is_some() {
                return Err(ModelError::MissingTensor {
                    path: self.path.to_owned(),
                    tensor: "cls.output.weight (a `cls` layer without its output projection \
                             is not supported)"
                        .into(),
                });
            }
            return Ok(None);
        };
        if outputs == 0 || (!labels.is_empty() && labels.len() != outputs) {
            return Err(ModelError::GgufTensor {
                path: self.path.to_owned(),
                tensor: "cls.output.weight".into(),
                reason: format!(
                    "{outputs} outputs for {} labels (bert.classifier.output_labels)",
                    labels.len()
                ),
            });
        }
        let weight = self.tensor("cls.output.weight", &[outputs, h])?;
        let bias = self.optional("cls.output.bias", &[outputs])?;
        let output_type = weight.ggml_type;
        let file = RankHeadFile {
            token: RankToken::First,
            softmax: false,
            labels,
            prompt: None,
        };
        let mut head = RankHead::new(file, weight.data, bias.map(|b| b.data), h)
            .with_input_types(GgmlType::F32, output_type);
        if let Some(dense) = self.optional("cls.weight", &[h, h])? {
            let bias = self.optional("cls.bias", &[h])?;
            head = head
                .with_pooler(dense.data, bias.map(|b| b.data))
                .with_input_types(dense.ggml_type, output_type);
        }
        Ok(Some(head))
    }
}
