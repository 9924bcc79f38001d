//! The emitter one function is built with, and its element-wise building blocks.

use std::collections::BTreeMap;

use crate::abi::{LlamaDims, WeightFormat};
use crate::error::EmitError;
use crate::hlo::{ElementType, FunctionBuilder, Reduce, Unary, Value};

/// One weight as function arguments.
#[derive(Debug, Clone)]
pub(super) enum Weight {
    /// A dense tensor (`[in, out]` for a linear).
    Dense(Value),
    /// Packed integers `[out, in / group, group]` with their scales and biases
    /// `[out, in / group]`.
    Packed {
        q: Value,
        scales: Value,
        biases: Value,
    },
}

impl Weight {
    pub(super) fn dense(self) -> Result<Value, EmitError> {
        match self {
            Self::Dense(v) => Ok(v),
            Self::Packed { q, .. } => Err(EmitError::Shape {
                op: "llama",
                detail: format!("a packed weight {} where a dense one belongs", q.ty()),
            }),
        }
    }
}

pub(super) struct Emitter<'a> {
    pub(super) b: FunctionBuilder,
    pub(super) d: &'a LlamaDims,
    pub(super) format: WeightFormat,
    /// Under [`WeightFormat::KernelInt8`], the quantized rows of each linear input already
    /// emitted (by the input's SSA name and the weights' bits): q, k and v share theirs.
    pub(super) quantized: BTreeMap<(String, u32), Value>,
}

impl Emitter<'_> {
    pub(super) fn widen(&mut self, w: &Value) -> Value {
        if w.element() == ElementType::F32 {
            w.clone()
        } else {
            self.b.convert(w, ElementType::F32)
        }
    }

    pub(super) fn rms_norm(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
        let [n, h] = [x.dims()[0], x.dims()[1]];
        let sq = self.b.mul(x, x)?;
        let sum = self.b.reduce(Reduce::Sum, &sq, &[1])?;
        let inv_h = self.b.splat_f32(1.0 / h as f32, &[n]);
        let mean = self.b.mul(&sum, &inv_h)?;
        let eps = self.b.splat_f32(self.d.rms_norm_eps, &[n]);
        let r = self.b.add(&mean, &eps)?;
        let r = self.b.unary(Unary::Rsqrt, &r)?;
        let r = self.b.broadcast_in_dim(&r, &[n, h], &[0])?;
        let w = if self.d.norm_offset {
            let one = self.b.splat_f32(1.0, &[h]);
            self.b.add(w, &one)?
        } else {
            w.clone()
        };
        let w = self.b.broadcast_in_dim(&w, &[n, h], &[1])?;
        let y = self.b.mul(x, &r)?;
        self.b.mul(&y, &w)
    }

    /// `cap · tanh(x / cap)`.
    pub(super) fn softcap(&mut self, x: &Value, cap: f32) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let inv = self.b.splat_f32(1.0 / cap, &dims);
        let c = self.b.splat_f32(cap, &dims);
        let scaled = self.b.mul(x, &inv)?;
        let t = self.b.unary(Unary::Tanh, &scaled)?;
        self.b.mul(&t, &c)
    }

    /// GELU's tanh form, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    pub(super) fn gelu_tanh(&mut self, x: &Value) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let x2 = self.b.mul(x, x)?;
        let x3 = self.b.mul(&x2, x)?;
        let k = self.b.splat_f32(0.044715, &dims);
        let inner = self.b.mul(&k, &x3)?;
        let inner = self.b.add(x, &inner)?;
        let c = self.b.splat_f32((2.0 / std::f32::consts::PI).sqrt(), &dims);
        let inner = self.b.mul(&c, &inner)?;
        let t = self.b.unary(Unary::Tanh, &inner)?;
        let one = self.b.splat_f32(1.0, &dims);
        let t = self.b.add(&one, &t)?;
        let half = self.b.splat_f32(0.5, &dims);
        let hx = self.b.mul(&half, x)?;
        self.b.mul(&hx, &t)
    }

    /// RMSNorm of each head of `x` (`[n, heads, head_dim]`) with the weight `w` (`[head_dim]`).
    pub(super) fn head_norm(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let rows = self.b.reshape(x, &[dims[0] * dims[1], dims[2]])?;
        let normed = self.rms_norm(&rows, w)?;
        self.b.reshape(&normed, &dims)
    }

    /// Hugging Face (non-interleaved) RoPE of `x` (`[n, heads, head_dim]`) given `cos`/`sin`
    /// (`[n, rotary_dim]`): the first `rotary_dim` features rotate, the rest pass.
    pub(super) fn rope(&mut self, x: &Value, cos: &Value, sin: &Value) -> Result<Value, EmitError> {
        let all = x.dims().to_vec();
        let rotary = cos.dims()[1];
        if rotary < all[2] {
            let (n, heads, hd) = (all[0], all[1], all[2]);
            let rotated = self.b.slice(x, &[0, 0, 0], &[n, heads, rotary])?;
            let passed = self.b.slice(x, &[0, 0, rotary], &[n, heads, hd])?;
            let rotated = self.rope(&rotated, cos, sin)?;
            return self.b.concatenate(&[&rotated, &passed], 2);
        }
        let dims = all;
        let (n, heads, hd) = (dims[0], dims[1], dims[2]);
        let half = hd / 2;
        let x1 = self.b.slice(x, &[0, 0, 0], &[n, heads, half])?;
        let x2 = self.b.slice(x, &[0, 0, half], &[n, heads, hd])?;
        let neg = self.b.unary(Unary::Negate, &x2)?;
        let rotated = self.b.concatenate(&[&neg, &x1], 2)?;
        let cos = self.b.broadcast_in_dim(cos, &dims, &[0, 2])?;
        let sin = self.b.broadcast_in_dim(sin, &dims, &[0, 2])?;
        let a = self.b.mul(x, &cos)?;
        let c = self.b.mul(&rotated, &sin)?;
        self.b.add(&a, &c)
    }

    /// Softmax over the last dimension.
    pub(super) fn softmax_last(&mut self, x: &Value) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let last = dims.len() as i64 - 1;
        let keep: Vec<i64> = (0..last).collect();
        let max = self.b.reduce(Reduce::Max, x, &[last])?;
        let max = self.b.broadcast_in_dim(&max, &dims, &keep)?;
        let shifted = self.b.sub(x, &max)?;
        let e = self.b.unary(Unary::Exp, &shifted)?;
        let sum = self.b.reduce(Reduce::Sum, &e, &[last])?;
        let sum = self.b.broadcast_in_dim(&sum, &dims, &keep)?;
        self.b.div(&e, &sum)
    }
}
