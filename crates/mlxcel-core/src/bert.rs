//! A BERT encoder on MLX ([`mlxcel_model::encoder::BertCheckpoint`]), computed in f32 as
//! llama.cpp's BERT graph computes it: token, position and token-type-0 embeddings, LayerNorm;
//! then per layer non-causal attention with biases, the residual, LayerNorm, a GELU
//! feed-forward, the residual, LayerNorm. No cache: every call runs the whole input.
//!
//! llama.cpp's CPU GELU reads a table over f16 inputs (`ggml_vec_gelu_f32`): the input rounded to
//! f16, the tanh approximation, the result rounded to f16. [`BertModel`] rounds the same way so
//! that its scores are llama.cpp's; the one place it differs is an input of 10 or more, which
//! llama.cpp passes through unrounded (an FFN pre-activation that large is rare).

use mlxcel_model::encoder::activation::{round_activations, rounds_activations};
use mlxcel_model::encoder::{BertCheckpoint, Dense};
use mlxcel_model::gguf::GgmlType;

use crate::{Array, Dtype, Error, Result};

/// A linear layer: `x · Wᵀ + b`, its input rounded first as llama.cpp's CPU matmul rounds it for
/// the weight's type (f16 for F16 weights, Q8_0 blocks for Q8_0 ones:
/// [`mlxcel_model::encoder::activation::round_activations`]).
struct Linear {
    /// `Wᵀ`, `[in, out]`.
    weight_t: Array,
    bias: Option<Array>,
    /// The weight's type in the file.
    ggml_type: GgmlType,
    inputs: usize,
}

impl Linear {
    fn new(weight: &Dense, bias: Option<&Dense>) -> Result<Self> {
        let [rows, cols] = weight.shape[..] else {
            return Err(shape_error("a linear weight is two-dimensional"));
        };
        let w = Array::from_f32(&weight.data, &[dim(rows)?, dim(cols)?])?;
        Ok(Self {
            weight_t: w.transpose(&[1, 0])?,
            bias: bias.map(vector).transpose()?,
            ggml_type: weight.ggml_type,
            inputs: cols,
        })
    }

    /// `x` (`[tokens, in]`) rounded as llama.cpp rounds a matmul's input for this weight type.
    fn round_input(&self, x: &Array) -> Result<Array> {
        match self.ggml_type {
            GgmlType::F16 => x.astype(Dtype::F16)?.astype(Dtype::F32),
            // Per block of 32 with an f16 scale: on the host, one row at a time.
            ty if rounds_activations(ty) => {
                let mut values = x.to_vec_f32()?;
                for row in values.chunks_exact_mut(self.inputs) {
                    round_activations(ty, row);
                }
                Array::from_f32(&values, &x.shape())
            }
            _ => Ok(x.clone()),
        }
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.round_input(x)?.matmul(&self.weight_t)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

/// LayerNorm over the last axis: `(x − mean) / √(var + eps) · w + b`, as MLX's RMS norm of the
/// centred values plus the bias.
struct LayerNorm {
    weight: Array,
    bias: Array,
    /// `[hidden, 1]` of `1 / hidden`: the mean as a product.
    averager: Array,
    eps: f32,
}

impl LayerNorm {
    fn new((weight, bias): &(Dense, Dense), eps: f32) -> Result<Self> {
        let hidden = weight.data.len();
        Ok(Self {
            weight: vector(weight)?,
            bias: vector(bias)?,
            averager: Array::from_f32(&vec![1.0 / hidden as f32; hidden], &[dim(hidden)?, 1])?,
            eps,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let mean = x.matmul(&self.averager)?;
        let centred = x.subtract(&mean)?;
        crate::fast::rms_norm(&centred, &self.weight, self.eps)?.add(&self.bias)
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

/// A BERT's weights on MLX.
pub struct BertModel {
    tok_embd: Array,
    pos_embd: Array,
    /// Token type 0's row, `[hidden]`, when the model has token types.
    type_row: Option<Array>,
    embd_norm: LayerNorm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    positions: usize,
    vocab: usize,
}

impl std::fmt::Debug for BertModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertModel")
            .field("layers", &self.layers.len())
            .field("hidden", &self.hidden)
            .field("heads", &self.heads)
            .field("positions", &self.positions)
            .finish_non_exhaustive()
    }
}

fn shape_error(message: &str) -> Error {
    Error::Mlx {
        op: "BertModel::new",
        message: message.into(),
    }
}

fn dim(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| shape_error("a dimension over i32"))
}

fn vector(d: &Dense) -> Result<Array> {
    Array::from_f32(&d.data, &[dim(d.data.len())?])
}

fn matrix(d: &Dense) -> Result<Array> {
    let [rows, cols] = d.shape[..] else {
        return Err(shape_error("an embedding table is two-dimensional"));
    };
    Array::from_f32(&d.data, &[dim(rows)?, dim(cols)?])
}

/// llama.cpp's CPU GELU: the tanh approximation over the input rounded to f16, rounded to f16.
fn gelu_as_llama_cpp(x: &Array) -> Result<Array> {
    x.astype(Dtype::F16)?
        .astype(Dtype::F32)?
        .gelu_tanh()?
        .astype(Dtype::F16)?
        .astype(Dtype::F32)
}

impl BertModel {
    /// Moves `checkpoint`'s weights onto MLX.
    pub fn new(checkpoint: &BertCheckpoint) -> Result<Self> {
        let c = &checkpoint.config;
        let w = &checkpoint.weights;
        let type_row = match &w.type_embd {
            Some(t) => Some(Array::from_f32(&t.data[..c.hidden], &[dim(c.hidden)?])?),
            None => None,
        };
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    q: Linear::new(&l.q.0, Some(&l.q.1))?,
                    k: Linear::new(&l.k.0, Some(&l.k.1))?,
                    v: Linear::new(&l.v.0, Some(&l.v.1))?,
                    o: Linear::new(&l.o.0, l.o.1.as_ref())?,
                    attn_norm: LayerNorm::new(&l.attn_norm, c.eps)?,
                    up: Linear::new(&l.up.0, l.up.1.as_ref())?,
                    down: Linear::new(&l.down.0, l.down.1.as_ref())?,
                    out_norm: LayerNorm::new(&l.out_norm, c.eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            tok_embd: matrix(&w.tok_embd)?,
            pos_embd: matrix(&w.pos_embd)?,
            type_row,
            embd_norm: LayerNorm::new(&w.embd_norm, c.eps)?,
            layers,
            hidden: c.hidden,
            heads: c.heads,
            positions: c.positions,
            vocab: c.vocab,
        })
    }

    /// The longest input (the learned positions).
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// The final hidden state of every position of `tokens`.
    pub fn forward(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let n = tokens.len();
        if n == 0 || n > self.positions {
            return Err(Error::Mlx {
                op: "BertModel::forward",
                message: format!("{n} tokens: 1 to {} fit", self.positions),
            });
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Error::Mlx {
                op: "BertModel::forward",
                message: format!("token {bad} is outside the vocabulary of {}", self.vocab),
            });
        }
        let (t, h, heads) = (dim(n)?, dim(self.hidden)?, dim(self.heads)?);
        let head_dim = h / heads;
        let ids = Array::from_u32(tokens, &[t])?;
        let positions: Vec<u32> = (0..n as u32).collect();
        let pos = Array::from_u32(&positions, &[t])?;
        let mut x = self.tok_embd.take(&ids, 0)?;
        if let Some(row) = &self.type_row {
            x = x.add(row)?;
        }
        x = self.pos_embd.take(&pos, 0)?.add(&x)?;
        x = self.embd_norm.forward(&x)?;
        let scale = Array::scalar_f32(1.0 / (head_dim as f32).sqrt());
        for layer in &self.layers {
            let split = |a: Array| a.reshape(&[t, heads, head_dim])?.transpose(&[1, 0, 2]);
            let q = split(layer.q.forward(&x)?)?;
            let k = split(layer.k.forward(&x)?)?;
            let v = split(layer.v.forward(&x)?)?;
            let scores = q.matmul(&k.transpose(&[0, 2, 1])?)?.multiply(&scale)?;
            let probs = scores.softmax(-1, true)?;
            let attended = probs.matmul(&v)?.transpose(&[1, 0, 2])?.reshape(&[t, h])?;
            let attn = layer.o.forward(&attended)?.add(&x)?;
            let ffn_in = layer.attn_norm.forward(&attn)?;
            let up = gelu_as_llama_cpp(&layer.up.forward(&ffn_in)?)?;
            let out = layer.down.forward(&up)?.add(&ffn_in)?;
            x = layer.out_norm.forward(&out)?;
        }
        x.to_rows_f32(self.hidden)
    }
}
