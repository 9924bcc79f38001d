//! A reranker's loaded classification head ([`crate::RankHeadFile`] and its `score` tensor):
//! what turns a model's final hidden states into a relevance score, as llama.cpp's rank pooling
//! computes it.

use crate::checkpoint::Checkpoint;
use crate::encoder::activation::round_activations;
use crate::error::{ModelError, Result};
use crate::gguf::GgmlType;
use crate::rank::{RANK_HEAD_FILE, RANK_HEAD_MODULE, RankHeadFile, RankToken};
use crate::safetensors_files::Dtype;

/// A loaded classification head.
#[derive(Debug, Clone, PartialEq)]
pub struct RankHead {
    pub file: RankHeadFile,
    /// `[outputs][hidden]`, row-major.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// A dense layer and tanh before the outputs (llama.cpp's `cls` tensors: a RoBERTa-style
    /// classification head, `[hidden][hidden]` row-major, and its bias).
    pooler: Option<(Vec<f32>, Option<Vec<f32>>)>,
    /// The weight types of the pooler and of the outputs, whose inputs llama.cpp rounds
    /// ([`crate::encoder::activation::round_activations`]); F32 (no rounding) unless a GGUF
    /// encoder's head says otherwise.
    input_types: [GgmlType; 2],
    outputs: usize,
    hidden: usize,
}

impl RankHead {
    /// The head of the checkpoint in `checkpoint`'s directory, or `None` when it has no
    /// [`RANK_HEAD_FILE`]. A file without its tensor, or a tensor of the wrong shape, is refused
    /// naming it.
    pub fn read(checkpoint: &Checkpoint) -> Result<Option<Self>> {
        let path = checkpoint.dir().join(RANK_HEAD_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let file: RankHeadFile =
            serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: path.clone(),
                source,
            })?;
        let hidden = checkpoint.config().hidden_size;
        let name = format!("{RANK_HEAD_MODULE}.weight");
        let view = checkpoint.tensor(&name).ok_or_else(|| {
            ModelError::invalid(
                &path,
                &name,
                format!("the checkpoint has no `{name}` tensor for the head this file describes"),
            )
        })?;
        let shape = view.shape.to_vec();
        let bad_shape = |what: String| ModelError::invalid(view.file, &name, what);
        let (outputs, weight) = match view.dtype {
            Dtype::U32 => {
                let spec = checkpoint
                    .config()
                    .quantization
                    .as_ref()
                    .and_then(|q| q.for_module(RANK_HEAD_MODULE))
                    .ok_or_else(|| bad_shape("packed u32 weights but no quantization".into()))?;
                let part = |suffix: &str| {
                    checkpoint
                        .tensor(&format!("{RANK_HEAD_MODULE}.{suffix}"))
                        .ok_or_else(|| {
                            bad_shape(format!(
                                "quantized, but `{RANK_HEAD_MODULE}.{suffix}` is missing"
                            ))
                        })
                };
                let (scales, biases) = (part("scales")?, part("biases")?);
                let rows = shape.first().copied().unwrap_or(0);
                let values = crate::quant::dequantize_affine(
                    spec,
                    rows,
                    hidden,
                    view.data,
                    (scales.dtype, scales.data),
                    (biases.dtype, biases.data),
                )
                .ok_or_else(|| {
                    bad_shape(format!(
                        "shape {shape:?} does not hold {rows} rows of {hidden} values quantized \
                         to {} bits in groups of {}",
                        spec.bits, spec.group_size
                    ))
                })?;
                (rows, values)
            }
            dtype => {
                if shape.len() != 2 || shape[1] != hidden {
                    return Err(bad_shape(format!(
                        "shape {shape:?}: expected [outputs, {hidden}] (the hidden size)"
                    )));
                }
                let values = floats(dtype, view.data).ok_or_else(|| {
                    bad_shape(format!("dtype {dtype:?}: expected f32, f16 or bf16"))
                })?;
                (shape[0], values)
            }
        };
        if outputs == 0 {
            return Err(bad_shape("the head has no outputs".into()));
        }
        if !file.labels.is_empty() && file.labels.len() != outputs {
            return Err(ModelError::invalid(
                &path,
                "labels",
                format!(
                    "{} labels for a head of {outputs} outputs",
                    file.labels.len()
                ),
            ));
        }
        let bias_name = format!("{RANK_HEAD_MODULE}.bias");
        let bias = match checkpoint.tensor(&bias_name) {
            None => None,
            Some(b) => {
                let values = floats(b.dtype, b.data).filter(|v| v.len() == outputs);
                Some(values.ok_or_else(|| {
                    ModelError::invalid(
                        b.file,
                        &bias_name,
                        format!("expected {outputs} f32, f16 or bf16 values"),
                    )
                })?)
            }
        };
        Ok(Some(Self {
            file,
            weight,
            bias,
            pooler: None,
            input_types: [GgmlType::F32; 2],
            outputs,
            hidden,
        }))
    }

    /// A head over `hidden` values from its parts (`weight` `[outputs][hidden]` row-major).
    pub fn new(
        file: RankHeadFile,
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
        hidden: usize,
    ) -> Self {
        assert!(hidden > 0 && weight.len().is_multiple_of(hidden) && !weight.is_empty());
        let outputs = weight.len() / hidden;
        assert!(bias.as_ref().is_none_or(|b| b.len() == outputs));
        Self {
            file,
            weight,
            bias,
            pooler: None,
            input_types: [GgmlType::F32; 2],
            outputs,
            hidden,
        }
    }

    /// The head with its inputs rounded as llama.cpp's CPU matmuls round them for weights of
    /// these types: the pooler's input for `pooler`, the outputs' input for `output`.
    pub fn with_input_types(mut self, pooler: GgmlType, output: GgmlType) -> Self {
        self.input_types = [pooler, output];
        self
    }

    /// The head with a dense layer and tanh before its outputs (`weight` `[hidden][hidden]`
    /// row-major), as llama.cpp's rank pooling applies a `cls` tensor.
    pub fn with_pooler(mut self, weight: Vec<f32>, bias: Option<Vec<f32>>) -> Self {
        assert_eq!(weight.len(), self.hidden * self.hidden);
        assert!(bias.as_ref().is_none_or(|b| b.len() == self.hidden));
        self.pooler = Some((weight, bias));
        self
    }

    /// How many outputs the head has.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// The head's outputs for one hidden state (softmaxed when the file says so), computed in
    /// f64.
    pub fn outputs_of(&self, state: &[f32]) -> Vec<f64> {
        assert_eq!(
            state.len(),
            self.hidden,
            "a hidden state of the model's size"
        );
        let pooled: Vec<f32>;
        let state: &[f32] = match &self.pooler {
            None => state,
            Some((weight, bias)) => {
                let mut input = state.to_vec();
                round_activations(self.input_types[0], &mut input);
                pooled = weight
                    .chunks_exact(self.hidden)
                    .enumerate()
                    .map(|(i, row)| {
                        let dot: f64 = row
                            .iter()
                            .zip(&input)
                            .map(|(&w, &x)| f64::from(w) * f64::from(x))
                            .sum();
                        let b = bias.as_ref().map_or(0.0, |b| f64::from(b[i]));
                        (dot + b).tanh() as f32
                    })
                    .collect();
                &pooled
            }
        };
        let mut rounded = state.to_vec();
        round_activations(self.input_types[1], &mut rounded);
        let state = &rounded;
        let mut out: Vec<f64> = self
            .weight
            .chunks_exact(self.hidden)
            .enumerate()
            .map(|(i, row)| {
                let dot: f64 = row
                    .iter()
                    .zip(state)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum();
                dot + self.bias.as_ref().map_or(0.0, |b| f64::from(b[i]))
            })
            .collect();
        if self.file.softmax {
            let max = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = out.iter().map(|x| (x - max).exp()).sum();
            for x in &mut out {
                *x = (*x - max).exp() / sum;
            }
        }
        out
    }

    /// The relevance score read from per-position final hidden states: the first output at the
    /// position the head reads. `None` for no positions.
    pub fn score(&self, states: &[Vec<f32>]) -> Option<f64> {
        let state = match self.file.token {
            RankToken::First => states.first()?,
            RankToken::Last => states.last()?,
        };
        self.outputs_of(state).first().copied()
    }

    /// The prompt of a pair, or `None` when the model has no rerank prompt: every `{query}`
    /// replaced, then every `{document}` (in that order, as llama-server does, so a query that
    /// spells `{document}` has it replaced too).
    pub fn prompt(&self, query: &str, document: &str) -> Option<String> {
        let template = self.file.prompt.as_deref()?;
        Some(
            template
                .replace("{query}", query)
                .replace("{document}", document),
        )
    }
}

/// Little-endian floats widened to f32.
fn floats(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    use half::{bf16, f16};
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(softmax: bool, token: RankToken) -> RankHead {
        let file = RankHeadFile {
            token,
            softmax,
            labels: vec!["yes".into(), "no".into()],
            prompt: Some("Q: {query} D: {document} {other}".into()),
        };
        RankHead::new(file, vec![1.0, 0.0, 0.0, 1.0], None, 2)
    }

    #[test]
    fn score_reads_the_right_position_and_softmaxes() {
        let states = vec![vec![2.0, 0.0], vec![0.0, 1.0]];
        let raw = head(false, RankToken::First);
        assert_eq!(raw.score(&states), Some(2.0));
        let last = head(true, RankToken::Last);
        // softmax([0, 1])[0] = 1 / (1 + e)
        let expected = 1.0 / (1.0 + std::f64::consts::E);
        assert!((last.score(&states).unwrap() - expected).abs() < 1e-12);
        assert_eq!(last.score(&[]), None);
        let with_bias = RankHead::new(
            RankHeadFile {
                labels: vec![],
                ..raw.file.clone()
            },
            vec![1.0, 1.0],
            Some(vec![0.5]),
            2,
        );
        assert_eq!(with_bias.score(&states), Some(2.5));
    }

    #[test]
    fn a_pooler_is_a_dense_layer_and_tanh_before_the_outputs() {
        let file = RankHeadFile {
            token: RankToken::First,
            softmax: false,
            labels: Vec::new(),
            prompt: None,
        };
        // Pooler: swap the two values, add [0, 1], tanh; output: 2 * first + 0.25.
        let head = RankHead::new(file, vec![2.0, 0.0], Some(vec![0.25]), 2)
            .with_pooler(vec![0.0, 1.0, 1.0, 0.0], Some(vec![0.0, 1.0]));
        let states = vec![vec![0.5, -1.5], vec![9.0, 9.0]];
        let expected = 2.0 * (-1.5f64).tanh() + 0.25;
        assert!((head.score(&states).unwrap() - expected).abs() < 1e-6);
    }

    #[test]
    fn prompt_fills_both_slots_as_llama_server_does() {
        let h = head(true, RankToken::Last);
        assert_eq!(h.prompt("a", "b").unwrap(), "Q: a D: b {other}");
        assert_eq!(
            h.prompt("a {document}", "b").unwrap(),
            "Q: a b D: b {other}"
        );
        let none = RankHead::new(
            RankHeadFile {
                prompt: None,
                ..h.file.clone()
            },
            vec![1.0, 0.0],
            None,
            2,
        );
        assert_eq!(none.prompt("q", "d"), None);
    }
}
