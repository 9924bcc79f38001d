//! The llama-family program at one static context capacity.
//!
//! One module per capacity holds two functions over the same weights and KV caches:
//!
//! - `prefill`: one chunk of `chunk` tokens of one sequence (cache row `row`, starting at
//!   position `start`); returns the logits of the chunk's token `last` and the updated caches.
//! - `decode`: one token for every one of the `batch` cache rows, each at its own position;
//!   returns `batch` logits rows and the updated caches.
//!
//! Weights come first in the argument list (the ABI of `abi.rs`: `weight_specs` fixes the order), then the caches
//! (keys then values, one `[batch, kv_heads, capacity + chunk, head_dim]` tensor per layer), then
//! the step's indices. The caches are returned in the same order and replace the arguments (IREE
//! may write the argument buffers in place: they are donated). Positions and masks are computed
//! in the graph from the start positions; the host bounds-checks every index, because StableHLO's
//! scatter and dynamic slices clamp out-of-range indices silently.
//!
//! Each cache row has `chunk` scratch positions past the capacity: a prefill chunk's padding
//! tokens and the decode rows that no sequence occupies write there, so no write ever lands on a
//! position a live sequence reads.

use std::collections::BTreeMap;

use crate::abi::{
    Layout, LlamaDims, ProgramShape, WeightFormat, cache_type, weight_specs, weight_types,
};
use crate::error::EmitError;
use crate::hlo::{
    Binary, Compare, DotDims, ElementType, FunctionBuilder, Module, Reduce, TensorType, Unary,
    Value,
};
use crate::kernels;

/// Emits the module for one capacity.
pub fn emit_llama(
    d: &LlamaDims,
    shape: &ProgramShape,
    format: WeightFormat,
) -> Result<String, EmitError> {
    if !d.heads.is_multiple_of(d.kv_heads.max(1))
        || d.inv_freq.len() * 2 != d.rotary_dim
        || d.rotary_dim > d.head_dim
    {
        return Err(EmitError::Shape {
            op: "llama",
            detail: format!(
                "{} heads over {} kv heads, {} rotary frequencies for {} rotated of head_dim {}",
                d.heads,
                d.kv_heads,
                d.inv_freq.len(),
                d.rotary_dim,
                d.head_dim
            ),
        });
    }
    check_packed(d, format)?;
    let mut module = Module::new(&shape.module_name(format));
    if format.uses_kernels() {
        let object = kernels::object_file_name().ok_or_else(|| EmitError::Shape {
            op: "llama",
            detail: "the kernel weight format needs the kernels object, which this build (not \
                     x86-64) does not have"
                .to_owned(),
        })?;
        module.push_text(&kernels::executable_text(&object));
    }
    for window in shape.windows() {
        module.push(emit_step(d, shape, format, Step::Prefill, window)?);
        for rows in decode_batches(shape.batch) {
            module.push(emit_step(d, shape, format, Step::Decode(rows), window)?);
        }
    }
    Ok(module.to_text())
}

/// Whether every packed weight of `d` can be passed under `format` (for a format that packs:
/// 4- or 8-bit codes whose groups divide the rows, f16 or f32 scales, and, for the kernel
/// formats, groups the kernels take); the error names the first weight that cannot.
pub fn check_packed(d: &LlamaDims, format: WeightFormat) -> Result<(), EmitError> {
    if !format.is_packed() {
        return Ok(());
    }
    for spec in weight_specs(d) {
        let Some(p) = spec.packed else { continue };
        let in_dim = match spec.layout {
            Layout::AsIs => spec.dims.get(1),
            Layout::Transposed => spec.dims.first(),
        };
        let fits = spec.dims.len() == 2
            && matches!(p.bits, 4 | 8)
            && p.group > 0
            && in_dim.is_some_and(|&i| i % p.group as i64 == 0)
            && matches!(p.scales, ElementType::F16 | ElementType::F32)
            && match format {
                WeightFormat::Kernel => kernels::fits(&p),
                WeightFormat::KernelInt8 => kernels::fits_int8(&p),
                _ => true,
            };
        if !fits {
            return Err(EmitError::Shape {
                op: "llama",
                detail: format!(
                    "{}: cannot pass {} under the {} weight format ({}-bit, groups of {}, \
                     {:?} scales)",
                    spec.name,
                    TensorType::new(&spec.dims, ElementType::F32),
                    format.name(),
                    p.bits,
                    p.group,
                    p.scales
                ),
            });
        }
    }
    Ok(())
}

/// The weight format when `MLXCEL_XLA_WEIGHTS` does not choose one: where mlxcel's kernels run
/// ([`kernels::supported`]) and take every packed weight of `d`, [`WeightFormat::Kernel`], or
/// [`WeightFormat::KernelInt8`] for int8 activations; otherwise [`WeightFormat::F16`]. Int8
/// activations without the kernels are an error that says why.
pub fn default_format(d: &LlamaDims, int8: bool) -> Result<WeightFormat, String> {
    if !kernels::supported() {
        return if int8 {
            Err(
                "int8 activations on the OpenXLA backend need mlxcel's kernels (an x86-64 CPU \
                 with AVX-512 F/BW/VL/VNNI, FMA and F16C); use f32 activations"
                    .to_owned(),
            )
        } else {
            Ok(WeightFormat::F16)
        };
    }
    let format = if int8 {
        WeightFormat::KernelInt8
    } else {
        WeightFormat::Kernel
    };
    match check_packed(d, format) {
        Ok(()) => Ok(format),
        Err(e) if int8 => Err(format!(
            "int8 activations on the OpenXLA backend: {e}; use f32 activations"
        )),
        Err(_) => Ok(WeightFormat::F16),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Prefill,
    /// Decode of the first `n` cache rows.
    Decode(usize),
}

/// The decode functions of a module of `batch` cache rows, by the rows they decode: every power
/// of two from 2 below `batch`, then `batch`. A step decodes with the smallest one that covers its
/// highest row, so that a lone sequence does not pay for every row's attention. There is no
/// one-row function (unless `batch` is 1): IREE compiles one-row matmuls as vector-matrix
/// products that measured several times slower than two rows (docs/xla.md).
pub fn decode_batches(batch: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(2usize), |n| n.checked_mul(2))
        .take_while(|&n| n < batch)
        .collect();
    sizes.push(batch.max(1));
    sizes
}

/// The name of the decode function over the first `rows` of `batch` cache rows: `decode` for all
/// of them, else `decode_<rows>`.
pub fn decode_function(rows: usize, batch: usize) -> String {
    if rows == batch {
        "decode".to_owned()
    } else {
        format!("decode_{rows}")
    }
}

/// One weight as function arguments.
#[derive(Debug, Clone)]
enum Weight {
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
    fn dense(self) -> Result<Value, EmitError> {
        match self {
            Self::Dense(v) => Ok(v),
            Self::Packed { q, .. } => Err(EmitError::Shape {
                op: "llama",
                detail: format!("a packed weight {} where a dense one belongs", q.ty()),
            }),
        }
    }
}

/// The weights of one layer as function arguments.
struct LayerArgs {
    input_norm: Value,
    q: (Weight, Option<Value>),
    k: (Weight, Option<Value>),
    v: (Weight, Option<Value>),
    o: (Weight, Option<Value>),
    /// The per-head q and k norms, when the model has them.
    qk_norm: Option<(Value, Value)>,
    post_norm: Value,
    /// Gemma: `pre_feedforward_layernorm` and `post_feedforward_layernorm` (then `post_norm`
    /// is the attention output's norm).
    feedforward_norms: Option<(Value, Value)>,
    gate: Weight,
    up: Weight,
    down: Weight,
}

struct Emitter<'a> {
    b: FunctionBuilder,
    d: &'a LlamaDims,
    format: WeightFormat,
    /// Under [`WeightFormat::KernelInt8`], the quantized rows of each linear input already
    /// emitted (by the input's SSA name and the weights' bits): q, k and v share theirs.
    quantized: BTreeMap<(String, u32), Value>,
}

impl Emitter<'_> {
    fn widen(&mut self, w: &Value) -> Value {
        if w.element() == ElementType::F32 {
            w.clone()
        } else {
            self.b.convert(w, ElementType::F32)
        }
    }

    /// `scale · q + bias` in f32 for packed `q` (`[rows, groups, group]`) with `scales` and
    /// `biases` (`[rows, groups]`): `[rows, groups, group]`.
    fn dequantize(
        &mut self,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let dims = q.dims().to_vec();
        let values = self.b.convert(q, ElementType::F32);
        let scales = self.widen(scales);
        let biases = self.widen(biases);
        let scales = self.b.broadcast_in_dim(&scales, &dims, &[0, 1])?;
        let biases = self.b.broadcast_in_dim(&biases, &dims, &[0, 1])?;
        let scaled = self.b.mul(&values, &scales)?;
        self.b.add(&scaled, &biases)
    }

    /// `x · wᵀ` for `x` `[n, in]` and a packed `w` (`[out, in]` as `[out, in / group, group]`):
    /// `[n, out]`.
    fn packed_matmul(
        &mut self,
        x: &Value,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let w = self.dequantize(q, scales, biases)?;
        let [out, groups, group] = [w.dims()[0], w.dims()[1], w.dims()[2]];
        let w = self.b.reshape(&w, &[out, groups * group])?;
        self.b.dot_general(
            x,
            &w,
            &DotDims {
                lhs_contract: vec![1],
                rhs_contract: vec![1],
                ..DotDims::default()
            },
        )
    }

    /// `x · wᵀ` as [`Self::packed_matmul`], by mlxcel's kernel (`kernels`): for 4-bit codes the
    /// input's blocks of 32 are reordered to `[evens, odds]` (the kernel reads a byte's two
    /// nibbles against the two halves), or, under [`WeightFormat::KernelInt8`], quantized by one
    /// more dispatch (once per input value and bits); the codes are reinterpreted as signless
    /// integers (a `ui4` operand of a dispatch would be rewritten by StableHLO's conversion), and
    /// one dispatch computes `[n, out]`.
    fn kernel_matmul(
        &mut self,
        x: &Value,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let y = self.kernel_matmuls(x, &[(q, scales, biases)])?;
        Ok(y.into_iter().next().expect("one product"))
    }

    /// The packing of a packed weight's arguments, if mlxcel's kernels under this format take it
    /// against an input of `input` values.
    fn kernel_packing(
        &self,
        input: i64,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Option<crate::abi::Packing> {
        let [out, groups, group] = [q.dims()[0], q.dims()[1], q.dims()[2]];
        let bits = match q.element() {
            ElementType::U4 => 4,
            ElementType::U8 => 8,
            _ => return None,
        };
        let packing = crate::abi::Packing {
            bits,
            group: group as usize,
            scales: scales.element(),
        };
        let fits = if self.format == WeightFormat::KernelInt8 {
            kernels::fits_int8(&packing)
        } else {
            kernels::fits(&packing)
        };
        (fits
            && input == groups * group
            && scales.dims() == [out, groups]
            && biases.ty() == scales.ty())
        .then_some(packing)
    }

    /// `x · wᵀ` for one to [`kernels::MAX_FUSED`] packed weights of the same packing over the
    /// same `x`, in one dispatch with a result per weight.
    fn kernel_matmuls(
        &mut self,
        x: &Value,
        weights: &[(&Value, &Value, &Value)],
    ) -> Result<Vec<Value>, EmitError> {
        let [n, input] = [x.dims()[0], x.dims()[1]];
        let packings: Vec<_> = weights
            .iter()
            .map(|(q, s, b)| self.kernel_packing(input, q, s, b))
            .collect();
        let packing = match packings[..] {
            [Some(first), ..]
                if packings.iter().all(|p| *p == Some(first))
                    && (1..=kernels::MAX_FUSED).contains(&weights.len()) =>
            {
                first
            }
            _ => {
                let (q, scales, biases) = weights[0];
                return Err(EmitError::Shape {
                    op: "kernel_matmul",
                    detail: format!(
                        "{} against {} weights, the first codes {}, scales {}, biases {}",
                        x.ty(),
                        weights.len(),
                        q.ty(),
                        scales.ty(),
                        biases.ty()
                    ),
                });
            }
        };
        let bits = packing.bits;
        let signless = if bits == 4 {
            ElementType::I4
        } else {
            ElementType::I8
        };
        let int8 = self.format == WeightFormat::KernelInt8;
        let x = if int8 {
            let key = (x.to_string(), bits);
            match self.quantized.get(&key) {
                Some(xq) => xq.clone(),
                None => {
                    let entry = format!(
                        "@{}::@{}",
                        kernels::EXECUTABLE,
                        kernels::quantize_export(bits)
                    );
                    let row = kernels::quantized_row_bytes(input as usize, bits) as i64;
                    let xq = self.b.dispatch(
                        &entry,
                        &[x],
                        &[n, input],
                        TensorType::new(&[n, row], ElementType::I8),
                    );
                    self.quantized.insert(key, xq.clone());
                    xq
                }
            }
        } else if bits == 4 {
            let pairs = self.b.reshape(x, &[n, input / 32, 16, 2])?;
            let halves = self.b.transpose(&pairs, &[0, 1, 3, 2])?;
            self.b.reshape(&halves, &[n, input])?
        } else {
            x.clone()
        };
        let mut operands = vec![x];
        let mut outs = Vec::with_capacity(weights.len());
        for (q, scales, biases) in weights {
            operands.push(self.b.bitcast_convert(q, signless)?);
            operands.push((*scales).clone());
            operands.push((*biases).clone());
            outs.push(q.dims()[0]);
        }
        let total: i64 = outs.iter().sum();
        let entry = format!(
            "@{}::@{}",
            kernels::EXECUTABLE,
            kernels::fused_export(&packing, int8, weights.len())
        );
        let per = kernels::columns_per_workgroup(total as usize) as i64;
        let mut constants = vec![n, input];
        constants.extend(&outs);
        constants.extend([packing.group as i64, per]);
        let refs: Vec<&Value> = operands.iter().collect();
        let results: Vec<TensorType> = outs
            .iter()
            .map(|&out| TensorType::new(&[n, out], ElementType::F32))
            .collect();
        Ok(self.b.dispatch_results(&entry, &refs, &constants, &results))
    }

    /// [`Self::linear`] of several weights over one `x`: under the kernel formats, weights packed
    /// alike go through one dispatch ([`Self::kernel_matmuls`]); otherwise one by one.
    fn linears<const K: usize>(
        &mut self,
        x: &Value,
        weights: [&(Weight, Option<Value>); K],
    ) -> Result<[Value; K], EmitError> {
        let packed: Vec<(&Value, &Value, &Value)> = weights
            .iter()
            .filter_map(|w| match &w.0 {
                Weight::Packed { q, scales, biases } => Some((q, scales, biases)),
                Weight::Dense(_) => None,
            })
            .collect();
        let input = x.dims()[1];
        let fused = self.format.uses_kernels()
            && K > 1
            && packed.len() == K
            && K <= kernels::MAX_FUSED
            && {
                let first = self.kernel_packing(input, packed[0].0, packed[0].1, packed[0].2);
                first.is_some()
                    && packed
                        .iter()
                        .all(|(q, s, b)| self.kernel_packing(input, q, s, b) == first)
            };
        let mut ys: Vec<Value> = if fused {
            self.kernel_matmuls(x, &packed)?
        } else {
            return weights
                .iter()
                .map(|w| self.linear(x, w))
                .collect::<Result<Vec<_>, _>>()
                .map(|v| v.try_into().expect("K results"));
        };
        for (y, w) in ys.iter_mut().zip(weights) {
            if let Some(bias) = &w.1 {
                let bias = self.b.broadcast_in_dim(bias, y.dims(), &[1])?;
                *y = self.b.add(y, &bias)?;
            }
        }
        Ok(ys.try_into().expect("K results"))
    }

    /// `x · w` for `x` `[n, in]` and a blocked `w` (`[out / block, in, block]`,
    /// `abi::WeightSpec::block`): `x` broadcast to every block, one batched matmul over the
    /// blocks, the blocks' columns put back in order. `[n, out]`.
    fn blocked_matmul(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
        let w = self.widen(w);
        let [blocks, input, block] = [w.dims()[0], w.dims()[1], w.dims()[2]];
        let n = x.dims()[0];
        let x = self.b.broadcast_in_dim(x, &[blocks, n, input], &[1, 2])?;
        let y = self.b.dot_general(
            &x,
            &w,
            &DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
        )?;
        let y = self.b.transpose(&y, &[1, 0, 2])?;
        self.b.reshape(&y, &[n, blocks * block])
    }

    /// Rows `ids` of an embedding table, as f32 `[n, hidden]`.
    fn embed(&mut self, table: &Weight, ids: &Value) -> Result<Value, EmitError> {
        match table {
            // A tied table is `[hidden, vocab]` (`abi::weight_specs`), blocked or not.
            Weight::Dense(t) if self.d.tied_embeddings && t.ty().rank() == 3 => {
                let t = self.widen(t);
                self.b.take_blocked_columns(&t, ids)
            }
            Weight::Dense(t) if self.d.tied_embeddings => {
                let t = self.widen(t);
                self.b.take_columns(&t, ids)
            }
            Weight::Dense(t) => {
                let t = self.widen(t);
                self.b.take_rows(&t, ids)
            }
            Weight::Packed { q, scales, biases } => {
                let [rows, groups, group] = [q.dims()[0], q.dims()[1], q.dims()[2]];
                let n = ids.dims()[0];
                let flat = self.b.reshape(q, &[rows, groups * group])?;
                let picked = self.b.take_rows(&flat, ids)?;
                let picked = self.b.reshape(&picked, &[n, groups, group])?;
                let s = self.b.take_rows(scales, ids)?;
                let b = self.b.take_rows(biases, ids)?;
                let x = self.dequantize(&picked, &s, &b)?;
                self.b.reshape(&x, &[n, groups * group])
            }
        }
    }

    fn linear(&mut self, x: &Value, w: &(Weight, Option<Value>)) -> Result<Value, EmitError> {
        let y = match &w.0 {
            Weight::Dense(weight) if weight.ty().rank() == 3 => self.blocked_matmul(x, weight)?,
            Weight::Dense(weight) => {
                let weight = self.widen(weight);
                self.b.matmul(x, &weight)?
            }
            Weight::Packed { q, scales, biases } if self.format.uses_kernels() => {
                self.kernel_matmul(x, q, scales, biases)?
            }
            Weight::Packed { q, scales, biases } => self.packed_matmul(x, q, scales, biases)?,
        };
        match &w.1 {
            Some(bias) => {
                let bias = self.b.broadcast_in_dim(bias, y.dims(), &[1])?;
                self.b.add(&y, &bias)
            }
            None => Ok(y),
        }
    }

    fn rms_norm(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
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
    fn softcap(&mut self, x: &Value, cap: f32) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let inv = self.b.splat_f32(1.0 / cap, &dims);
        let c = self.b.splat_f32(cap, &dims);
        let scaled = self.b.mul(x, &inv)?;
        let t = self.b.unary(Unary::Tanh, &scaled)?;
        self.b.mul(&t, &c)
    }

    /// GELU's tanh form, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    fn gelu_tanh(&mut self, x: &Value) -> Result<Value, EmitError> {
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
    fn head_norm(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
        let rows = self.b.reshape(x, &[dims[0] * dims[1], dims[2]])?;
        let normed = self.rms_norm(&rows, w)?;
        self.b.reshape(&normed, &dims)
    }

    /// Hugging Face (non-interleaved) RoPE of `x` (`[n, heads, head_dim]`) given `cos`/`sin`
    /// (`[n, rotary_dim]`): the first `rotary_dim` features rotate, the rest pass.
    fn rope(&mut self, x: &Value, cos: &Value, sin: &Value) -> Result<Value, EmitError> {
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
    fn softmax_last(&mut self, x: &Value) -> Result<Value, EmitError> {
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

/// A function's weight arguments, in `weight_specs` order.
struct ModelArgs {
    embed: Weight,
    layers: Vec<LayerArgs>,
    final_norm: Value,
    /// The output projection, unless the embedding is tied to it.
    lm_head: Option<Weight>,
}

/// A step's own inputs and what the graph derives from them once for every layer.
struct StepInputs {
    /// Sequences (cache rows) in the step, and new tokens per sequence.
    rows: i64,
    t: i64,
    tokens: Value,
    /// The position of every new token, `[rows, t]`.
    positions: Value,
    /// Where each new token's key and value go in the caches: `[rows · t · kv_heads, 3]`
    /// (row, kv head, position; `Emitter::write_indices`).
    write_idx: Value,
    /// Prefill only: the cache row of the sequence, and the chunk token whose logits to return.
    row: Option<Value>,
    last: Option<Value>,
    /// The positions attention reads, from 0 (`ProgramShape::windows`).
    window: i64,
}

/// What every layer's attention shares: the rotary tables and the masks.
struct AttentionTables {
    /// Rotary tables for the step's tokens: `[rows · t, head_dim]`.
    cos: Value,
    sin: Value,
    /// The sliding layers' own tables (Gemma 3's local base).
    local: Option<(Value, Value)>,
    /// Key position ≤ query position, over `[rows, kv_heads, t, group, cache_len]`.
    allowed: Value,
    /// Per sliding window of the model: also key position > query position − window.
    windowed: BTreeMap<usize, Value>,
    neg_inf: Value,
    /// `1 / sqrt(head_dim)`, over the same shape.
    scale: Value,
}

impl Emitter<'_> {
    /// Declares the weight arguments (one for a dense weight, three for a packed one).
    fn weight_args(&mut self, format: WeightFormat) -> Result<ModelArgs, EmitError> {
        let d = self.d;
        let mut args = Vec::new();
        for spec in weight_specs(d) {
            let mut values = weight_types(&spec, format)
                .into_iter()
                .map(|t| self.b.arg(t));
            args.push(match (values.next(), values.next(), values.next()) {
                (Some(q), Some(scales), Some(biases)) => Weight::Packed { q, scales, biases },
                (Some(v), _, _) => Weight::Dense(v),
                _ => unreachable!("weight_types gives one or three types"),
            });
        }
        let mut args = args.into_iter();
        let mut next = || {
            args.next()
                .expect("weight_specs lists every argument taken")
        };
        let mut projection = |bias: bool| -> Result<(Weight, Option<Value>), EmitError> {
            let w = next();
            Ok((w, bias.then(&mut next).map(Weight::dense).transpose()?))
        };
        let embed = projection(false)?.0;
        let mut layers = Vec::with_capacity(d.layers);
        for _ in 0..d.layers {
            let input_norm = projection(false)?.0.dense()?;
            let q = projection(d.qkv_bias)?;
            let k = projection(d.qkv_bias)?;
            let v = projection(d.qkv_bias)?;
            let o = projection(d.out_bias)?;
            let qk_norm = if d.qk_norm {
                Some((projection(false)?.0.dense()?, projection(false)?.0.dense()?))
            } else {
                None
            };
            let post_norm = projection(false)?.0.dense()?;
            let feedforward_norms = if d.sandwich_norms {
                Some((projection(false)?.0.dense()?, projection(false)?.0.dense()?))
            } else {
                None
            };
            let (gate, up, down) = (
                projection(false)?.0,
                projection(false)?.0,
                projection(false)?.0,
            );
            layers.push(LayerArgs {
                input_norm,
                q,
                k,
                v,
                o,
                qk_norm,
                post_norm,
                feedforward_norms,
                gate,
                up,
                down,
            });
        }
        let final_norm = projection(false)?.0.dense()?;
        let lm_head = (!d.tied_embeddings)
            .then(|| projection(false))
            .transpose()?
            .map(|(w, _)| w);
        Ok(ModelArgs {
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }

    /// Declares the step's index arguments and derives positions and cache write indices.
    fn step_inputs(
        &mut self,
        step: Step,
        shape: &ProgramShape,
        window: usize,
    ) -> Result<StepInputs, EmitError> {
        let window = window.min(shape.cache_len()) as i64;
        let i32_scalar = TensorType::new(&[], ElementType::I32);
        Ok(match step {
            Step::Prefill => {
                let t = shape.chunk as i64;
                let tokens = self.b.arg(TensorType::new(&[t], ElementType::I32));
                let row = self.b.arg(i32_scalar.clone());
                let start = self.b.arg(i32_scalar.clone());
                let last = self.b.arg(i32_scalar);
                let offsets = self.b.iota(&[1, t], 1, ElementType::I32)?;
                let start_b = self.b.broadcast_in_dim(&start, &[1, t], &[])?;
                let positions = self.b.add(&offsets, &start_b)?;
                let pos_col = self.b.reshape(&positions, &[t, 1])?;
                let row_col = self.b.broadcast_in_dim(&row, &[t, 1], &[])?;
                let write_idx = self.write_indices(&row_col, &pos_col)?;
                StepInputs {
                    rows: 1,
                    t,
                    tokens,
                    positions,
                    write_idx,
                    row: Some(row),
                    last: Some(last),
                    window,
                }
            }
            Step::Decode(rows) => {
                let rows = rows as i64;
                let tokens = self.b.arg(TensorType::new(&[rows], ElementType::I32));
                let starts = self.b.arg(TensorType::new(&[rows], ElementType::I32));
                let positions = self.b.reshape(&starts, &[rows, 1])?;
                let row_col = self.b.iota(&[rows, 1], 0, ElementType::I32)?;
                let write_idx = self.write_indices(&row_col, &positions)?;
                StepInputs {
                    rows,
                    t: 1,
                    tokens,
                    positions,
                    write_idx,
                    row: None,
                    last: None,
                    window,
                }
            }
        })
    }

    /// The cache writes of a step's `n` tokens, given each one's row and position (`[n, 1]`
    /// each): `(row, kv head, position)` triples, `[n × kv_heads, 3]`, token-major, addressing
    /// the leading dimensions of the `[batch, kv_heads, positions, head_dim]` caches (IREE lowers
    /// a scatter only over leading dimensions, so each head's `head_dim` values are one update).
    fn write_indices(&mut self, rows: &Value, positions: &Value) -> Result<Value, EmitError> {
        let n = rows.dims()[0];
        let heads = self.d.kv_heads as i64;
        let dims = [n, heads, 1];
        let rows = self.b.broadcast_in_dim(rows, &dims, &[0, 2])?;
        let head = self.b.iota(&dims, 1, ElementType::I32)?;
        let positions = self.b.broadcast_in_dim(positions, &dims, &[0, 2])?;
        let triples = self.b.concatenate(&[&rows, &head, &positions], 2)?;
        self.b.reshape(&triples, &[n * heads, 3])
    }

    /// The rotary tables and the causal mask, computed once from the step's positions.
    fn attention_tables(&mut self, inputs: &StepInputs) -> Result<AttentionTables, EmitError> {
        let d = self.d;
        let (rows, t) = (inputs.rows, inputs.t);
        let n = rows * t;
        let half = d.rotary_dim as i64 / 2;
        let pos_flat = self.b.reshape(&inputs.positions, &[n])?;
        let pos_f = self.b.convert(&pos_flat, ElementType::F32);
        let pos_f = self.b.broadcast_in_dim(&pos_f, &[n, half], &[0])?;
        let mut tables = |inv_freq: &[f32]| -> Result<(Value, Value), EmitError> {
            let inv_freq = self.b.vector_f32(inv_freq);
            let inv_freq = self.b.broadcast_in_dim(&inv_freq, &[n, half], &[1])?;
            let angles = self.b.mul(&pos_f, &inv_freq)?;
            let angles = self.b.concatenate(&[&angles, &angles], 1)?;
            let cos = self.b.unary(Unary::Cosine, &angles)?;
            let sin = self.b.unary(Unary::Sine, &angles)?;
            if d.rope_mscale == 1.0 {
                return Ok((cos, sin));
            }
            // LongRoPE's factor on the rotated features, folded into the tables.
            let m = self.b.splat_f32(d.rope_mscale, &[n, 2 * half]);
            Ok((self.b.mul(&cos, &m)?, self.b.mul(&sin, &m)?))
        };
        let (cos, sin) = tables(&d.inv_freq)?;
        let local = d.local_inv_freq.as_deref().map(&mut tables).transpose()?;

        let kv_heads = d.kv_heads as i64;
        let group = d.heads as i64 / kv_heads;
        let score_dims = [rows, kv_heads, t, group, inputs.window];
        let key_pos = self.b.iota(&score_dims, 4, ElementType::I32)?;
        let query_pos = self
            .b
            .broadcast_in_dim(&inputs.positions, &score_dims, &[0, 2])?;
        let allowed = self.b.compare(Compare::Le, &key_pos, &query_pos)?;
        let windows: std::collections::BTreeSet<usize> =
            d.layer_attention.iter().filter_map(|l| l.window).collect();
        let mut windowed = BTreeMap::new();
        for window in windows {
            // key > query − window, i.e. key + window > query (no negative positions).
            let w = self
                .b
                .splat_int(window as i64, &score_dims, ElementType::I32);
            let reach = self.b.add(&key_pos, &w)?;
            let recent = self.b.compare(Compare::Gt, &reach, &query_pos)?;
            windowed.insert(window, self.b.binary(Binary::And, &allowed, &recent)?);
        }
        let neg_inf = self.b.splat_f32(f32::NEG_INFINITY, &score_dims);
        let scale = self.b.splat_f32(d.attention_scale, &score_dims);
        Ok(AttentionTables {
            cos,
            sin,
            local,
            allowed,
            windowed,
            neg_inf,
            scale,
        })
    }

    /// The key and value cache rows a step attends over, their first `window` positions: the
    /// sequence's row (prefill), the first `rows` (decode of fewer rows than the module has), or
    /// all of them.
    fn attended_rows(
        &mut self,
        (keys, values): (&Value, &Value),
        inputs: &StepInputs,
        shape: &ProgramShape,
    ) -> Result<(Value, Value), EmitError> {
        let (kv_heads, hd) = (self.d.kv_heads as i64, self.d.head_dim as i64);
        let window = inputs.window;
        match &inputs.row {
            Some(row) => {
                let zero = self.b.splat_int(0, &[], ElementType::I32);
                let starts = [row, &zero, &zero, &zero];
                let sizes = [1, kv_heads, window, hd];
                Ok((
                    self.b.dynamic_slice(keys, &starts, &sizes)?,
                    self.b.dynamic_slice(values, &starts, &sizes)?,
                ))
            }
            None if inputs.rows < shape.batch as i64 || window < shape.cache_len() as i64 => {
                let limit = [inputs.rows, kv_heads, window, hd];
                Ok((
                    self.b.slice(keys, &[0, 0, 0, 0], &limit)?,
                    self.b.slice(values, &[0, 0, 0, 0], &limit)?,
                ))
            }
            None => Ok((keys.clone(), values.clone())),
        }
    }

    /// One layer's attention block: projections, RoPE, the cache writes, attention and the
    /// output projection. Returns the block's output and the layer's updated caches.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        h: &Value,
        layer: &LayerArgs,
        features: mlxcel_model::LayerAttention,
        caches: (&Value, &Value),
        inputs: &StepInputs,
        tables: &AttentionTables,
        shape: &ProgramShape,
    ) -> Result<(Value, Value, Value), EmitError> {
        let d = self.d;
        let (heads, kv_heads, hd) = (d.heads as i64, d.kv_heads as i64, d.head_dim as i64);
        let (rows, t) = (inputs.rows, inputs.t);
        let n = rows * t;
        let [q, k, v] = self.linears(h, [&layer.q, &layer.k, &layer.v])?;
        let q = self.b.reshape(&q, &[n, heads, hd])?;
        let k = self.b.reshape(&k, &[n, kv_heads, hd])?;
        let v = self.b.reshape(&v, &[n, kv_heads, hd])?;
        let (q, k) = match &layer.qk_norm {
            Some((q_norm, k_norm)) => (self.head_norm(&q, q_norm)?, self.head_norm(&k, k_norm)?),
            None => (q, k),
        };
        let (cos, sin) = match (&tables.local, features.window) {
            (Some((cos, sin)), Some(_)) => (cos, sin),
            _ => (&tables.cos, &tables.sin),
        };
        let (q, k) = if features.rope {
            (self.rope(&q, cos, sin)?, self.rope(&k, cos, sin)?)
        } else {
            (q, k)
        };
        let per_head = [n * kv_heads, hd];
        let (k_rows, v_rows) = (
            self.b.reshape(&k, &per_head)?,
            self.b.reshape(&v, &per_head)?,
        );
        let k_cache = self
            .b
            .scatter_leading(caches.0, &inputs.write_idx, &k_rows)?;
        let v_cache = self
            .b
            .scatter_leading(caches.1, &inputs.write_idx, &v_rows)?;
        let (keys, values) = self.attended_rows((&k_cache, &v_cache), inputs, shape)?;

        let q = self
            .b
            .reshape(&q, &[rows, t, kv_heads, heads / kv_heads, hd])?;
        // Scores `[rows, kv_heads, t, group, window]`. IREE computes a batched product whose
        // right operand is `[.., contracted, free]`, transposing whichever operand is not: in
        // decode that is the few query rows (keys times queries, then the small scores
        // transposed), in prefill the keys (their transpose is shared by the chunk's tokens).
        let scores = if t == 1 {
            let transposed = self.b.dot_general(
                &keys,
                &q,
                &DotDims {
                    lhs_batch: vec![0, 1],
                    rhs_batch: vec![0, 2],
                    lhs_contract: vec![3],
                    rhs_contract: vec![4],
                },
            )?;
            self.b.transpose(&transposed, &[0, 1, 3, 4, 2])?
        } else {
            self.b.dot_general(
                &q,
                &keys,
                &DotDims {
                    lhs_batch: vec![0, 2],
                    rhs_batch: vec![0, 1],
                    lhs_contract: vec![4],
                    rhs_contract: vec![3],
                },
            )?
        };
        let scores = self.b.mul(&scores, &tables.scale)?;
        let scores = match self.d.attn_softcap {
            Some(cap) => self.softcap(&scores, cap)?,
            None => scores,
        };
        let allowed = match features.window {
            Some(w) => &tables.windowed[&w],
            None => &tables.allowed,
        };
        let scores = self.b.select(allowed, &scores, &tables.neg_inf)?;
        let probs = self.softmax_last(&scores)?;
        let attended = self.b.dot_general(
            &probs,
            &values,
            &DotDims {
                lhs_batch: vec![0, 1],
                rhs_batch: vec![0, 1],
                lhs_contract: vec![4],
                rhs_contract: vec![2],
            },
        )?;
        let attended = self.b.transpose(&attended, &[0, 2, 1, 3, 4])?;
        let attended = self.b.reshape(&attended, &[n, heads * hd])?;
        let out = self.linear(&attended, &layer.o)?;
        Ok((out, k_cache, v_cache))
    }

    /// One layer's gated MLP: `down(silu(gate(h)) · up(h))`.
    fn mlp(&mut self, h: &Value, layer: &LayerArgs) -> Result<Value, EmitError> {
        let (gate, up) = ((layer.gate.clone(), None), (layer.up.clone(), None));
        let [gate, up] = self.linears(h, [&gate, &up])?;
        let act = if self.d.gelu {
            self.gelu_tanh(&gate)?
        } else {
            let sig = self.b.unary(Unary::Logistic, &gate)?;
            self.b.mul(&gate, &sig)?
        };
        let act = self.b.mul(&act, &up)?;
        self.linear(&act, &(layer.down.clone(), None))
    }

    /// The logits of the step's last positions: the chunk token `last` (prefill) or every row.
    fn logits(
        &mut self,
        x: Value,
        weights: &ModelArgs,
        inputs: &StepInputs,
    ) -> Result<Value, EmitError> {
        let last = match &inputs.last {
            Some(last) => {
                let zero = self.b.splat_int(0, &[], ElementType::I32);
                self.b
                    .dynamic_slice(&x, &[last, &zero], &[1, self.d.hidden as i64])?
            }
            None => x,
        };
        let last = self.rms_norm(&last, &weights.final_norm)?;
        // Tied, the embedding table is the output projection: dense `[hidden, vocab]` (blocked
        // or not) or packed `[vocab, hidden]`, each the layout `linear` multiplies.
        let head = weights.lm_head.as_ref().unwrap_or(&weights.embed);
        let logits = self.linear(&last, &(head.clone(), None))?;
        match self.d.final_softcap {
            Some(cap) => self.softcap(&logits, cap),
            None => Ok(logits),
        }
    }
}

/// One function of the module: its arguments (weights, caches, step inputs), then the layers,
/// then the logits and the updated caches as results.
fn emit_step(
    d: &LlamaDims,
    shape: &ProgramShape,
    format: WeightFormat,
    step: Step,
    window: usize,
) -> Result<crate::hlo::Function, EmitError> {
    let base = match step {
        Step::Prefill => "prefill".to_owned(),
        Step::Decode(rows) => decode_function(rows, shape.batch),
    };
    let name = shape.function(&base, window);
    let mut e = Emitter {
        b: FunctionBuilder::new(&name),
        d,
        format,
        quantized: BTreeMap::new(),
    };
    let weights = e.weight_args(format)?;
    let cache_ty = cache_type(d, shape);
    // Each cache argument is the storage of its updated cache (result 0 is the logits): the
    // cache is updated in place rather than copied into a new buffer every call.
    let mut cache_arg = |result: usize| {
        let attrs = format!("iree.abi.output = {result} : index");
        e.b.arg_with_attrs(cache_ty.clone(), Some(attrs))
    };
    let k_caches: Vec<Value> = (0..d.layers).map(|l| cache_arg(1 + l)).collect();
    let v_caches: Vec<Value> = (0..d.layers).map(|l| cache_arg(1 + d.layers + l)).collect();
    let inputs = e.step_inputs(step, shape, window)?;
    let tables = e.attention_tables(&inputs)?;

    let mut x = e.embed(&weights.embed, &inputs.tokens)?;
    if let Some(scale) = d.embedding_scale {
        let dims = x.dims().to_vec();
        let scale = e.b.splat_f32(scale, &dims);
        x = e.b.mul(&x, &scale)?;
    }
    let mut new_k = Vec::with_capacity(d.layers);
    let mut new_v = Vec::with_capacity(d.layers);
    for (l, layer) in weights.layers.iter().enumerate() {
        let h = e.rms_norm(&x, &layer.input_norm)?;
        let caches = (&k_caches[l], &v_caches[l]);
        let features = d.layer_attention[l];
        let (attended, k_cache, v_cache) =
            e.attention(&h, layer, features, caches, &inputs, &tables, shape)?;
        new_k.push(k_cache);
        new_v.push(v_cache);
        match &layer.feedforward_norms {
            None => {
                x = e.b.add(&x, &attended)?;
                let h = e.rms_norm(&x, &layer.post_norm)?;
                let down = e.mlp(&h, layer)?;
                x = e.b.add(&x, &down)?;
            }
            Some((pre, post)) => {
                let attended = e.rms_norm(&attended, &layer.post_norm)?;
                x = e.b.add(&x, &attended)?;
                let h = e.rms_norm(&x, pre)?;
                let down = e.mlp(&h, layer)?;
                let down = e.rms_norm(&down, post)?;
                x = e.b.add(&x, &down)?;
            }
        }
    }

    let logits = e.logits(x, &weights, &inputs)?;
    let mut results: Vec<&Value> = vec![&logits];
    results.extend(new_k.iter());
    results.extend(new_v.iter());
    Ok(e.b.finish(&results))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::abi::{Packing, weight_type};

    /// A two-layer model small enough to compile in seconds.
    pub(crate) fn tiny_dims(tied: bool, qkv_bias: bool) -> LlamaDims {
        let head_dim = 8;
        LlamaDims {
            layers: 2,
            hidden: 16,
            heads: 4,
            kv_heads: 2,
            head_dim,
            intermediate: 32,
            vocab: 64,
            rms_norm_eps: 1e-5,
            inv_freq: (0..head_dim / 2)
                .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / head_dim as f32))
                .collect(),
            qkv_bias,
            out_bias: false,
            tied_embeddings: tied,
            qk_norm: false,
            layer_attention: vec![
                mlxcel_model::LayerAttention {
                    rope: true,
                    window: None
                };
                2
            ],
            local_inv_freq: None,
            rotary_dim: head_dim,
            rope_mscale: 1.0,
            norm_offset: false,
            sandwich_norms: false,
            gelu: false,
            embedding_scale: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_softcap: None,
            final_softcap: None,
            packed: BTreeMap::new(),
        }
    }

    pub(crate) const TINY_SHAPE: ProgramShape = ProgramShape {
        context_capacity: 16,
        batch: 2,
        chunk: 4,
        min_window: 0,
    };

    #[test]
    fn weight_specs_cover_every_tensor_in_order() {
        let d = tiny_dims(false, true);
        let specs = weight_specs(&d);
        // embed, per layer (norm, 3 × (w, b), o, norm, gate, up, down), norm, lm_head.
        assert_eq!(specs.len(), 1 + 2 * 12 + 2);
        assert_eq!(specs[0].name, "model.embed_tokens.weight");
        assert_eq!(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
        assert_eq!(specs[2].dims, vec![16, 32]);
        assert_eq!(
            specs.last().map(|s| s.name.as_str()),
            Some("lm_head.weight")
        );
        assert_eq!(
            (specs[0].dims.clone(), specs[0].layout),
            (vec![64, 16], Layout::AsIs)
        );
        let tied = weight_specs(&tiny_dims(true, false));
        assert_eq!(tied.len(), 1 + 2 * 9 + 1);
        // A tied table is passed `[hidden, vocab]`: the output projection's `[in, out]`.
        assert_eq!(
            (tied[0].dims.clone(), tied[0].layout),
            (vec![16, 64], Layout::Transposed)
        );
        // Too narrow to be blocked: its columns gathered for the embedding, `[in, out]` for the
        // logits.
        assert_eq!(
            weight_type(&tied[0], WeightFormat::F16),
            TensorType::new(&[16, 64], ElementType::F16)
        );
        let text = emit_llama(&tiny_dims(true, false), &TINY_SHAPE, WeightFormat::F32).unwrap();
        assert!(text.contains("collapsed_slice_dims = [1]"));
        assert!(!text.contains("collapsed_slice_dims = [0]"));
        assert!(text.contains(
            "contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x64xf32>) -> tensor<2x64xf32>"
        ));
        // A vocabulary of 2048 is blocked like every wide transposed weight: `[2048 / 256,
        // hidden, 256]`, its (block, column) pairs gathered, one batched matmul for the logits.
        let wide = LlamaDims {
            vocab: 2048,
            ..tiny_dims(true, false)
        };
        let wide_specs = weight_specs(&wide);
        assert_eq!(
            weight_type(&wide_specs[0], WeightFormat::F16),
            TensorType::new(&[8, 16, 256], ElementType::F16)
        );
        assert_eq!(
            weight_type(&wide_specs[2], WeightFormat::F32),
            TensorType::new(&[16, 32], ElementType::F32)
        );
        let text = emit_llama(&wide, &TINY_SHAPE, WeightFormat::F32).unwrap();
        assert!(text.contains("collapsed_slice_dims = [0, 2], start_index_map = [0, 2]"));
        assert!(text.contains(
            "batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x2x16xf32>, \
             tensor<8x16x256xf32>) -> tensor<8x2x256xf32>"
        ));
    }

    #[test]
    fn wide_weights_are_blocked_by_the_widest_divisor_up_to_256_columns() {
        use crate::abi::block_columns;
        // Llama-3.2-1B / SmolLM2 / Qwen2.5-3B / Llama-3.1-8B widths and vocabularies.
        for (out, block) in [
            (1536, Some(256)),
            (1024, Some(256)),
            (49152, Some(256)),
            (11008, Some(256)),
            (128256, Some(256)),
            (151936, Some(128)),
            (1056, Some(176)),
        ] {
            assert_eq!(block_columns(out), block, "{out}");
        }
        // Narrower than 1024 columns, or no divisor of at least 32 columns: `[in, out]`.
        for out in [576, 192, 1000, 1031, 32003, 16] {
            assert_eq!(block_columns(out), None, "{out}");
        }
    }

    #[test]
    fn emits_prefill_and_decode_with_caches_threaded_through() {
        let d = tiny_dims(true, false);
        let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::F32).unwrap();
        assert!(text.contains("func.func @prefill("));
        assert!(text.contains("func.func @decode("));
        // Each function returns the logits and 2 layers × (keys, values), each
        // `[batch, kv_heads, positions, head_dim]`.
        let cache = "tensor<2x2x20x8xf32>";
        let returns = format!("(tensor<1x64xf32>, {cache}, {cache}, {cache}, {cache})");
        assert!(text.contains(&returns), "{text}");
        assert!(text.contains(&format!(
            "(tensor<2x64xf32>, {cache}, {cache}, {cache}, {cache})"
        )));
    }

    #[test]
    fn f16_weights_are_widened_in_the_graph() {
        let d = tiny_dims(false, false);
        let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::F16).unwrap();
        assert!(text.contains("tensor<64x16xf16>"));
        assert!(text.contains("-> tensor<64x16xf32>"));
    }

    fn packed_tiny(bits: u32, group: usize) -> LlamaDims {
        let mut d = tiny_dims(true, false);
        for spec in weight_specs(&d) {
            if !spec.always_f32 {
                let scales = ElementType::F16;
                d.packed.insert(
                    spec.name.clone(),
                    Packing {
                        bits,
                        group,
                        scales,
                    },
                );
            }
        }
        d
    }

    #[test]
    fn packed_weights_are_integers_scales_and_biases() {
        let d = packed_tiny(4, 8);
        let specs = weight_specs(&d);
        // The q projection `[in 16, out 32]` is passed as the checkpoint's `[32, 16]` in groups.
        let q = &specs[2];
        assert_eq!(q.name, "model.layers.0.self_attn.q_proj.weight");
        assert_eq!(
            weight_types(q, WeightFormat::Packed),
            [
                TensorType::new(&[32, 2, 8], ElementType::U4),
                TensorType::new(&[32, 2], ElementType::F16),
                TensorType::new(&[32, 2], ElementType::F16),
            ]
        );
        // Other formats ignore the packing; norms are never packed.
        assert_eq!(weight_types(q, WeightFormat::F16).len(), 1);
        assert_eq!(weight_types(&specs[1], WeightFormat::Packed).len(), 1);
        let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::Packed).unwrap();
        assert!(text.contains("%arg0: tensor<64x2x8xui4>, %arg1: tensor<64x2xf16>"));
        assert!(text.contains("(tensor<32x2x8xui4>) -> tensor<32x2x8xf32>"));
        assert!(!text.contains("ui4>) -> tensor<16x32xf32>"));
        let eight = emit_llama(&packed_tiny(8, 8), &TINY_SHAPE, WeightFormat::Packed).unwrap();
        assert!(eight.contains("tensor<64x2x8xui8>"));
    }

    /// Under the kernel formats (where the kernels exist) every packed linear is a dispatch to
    /// mlxcel's executable: q, k and v in one, gate and up in one; int8 activations quantize
    /// each distinct input once. Groups the int8 kernels do not take are refused by name.
    #[test]
    fn kernel_formats_dispatch_to_mlxcels_kernels() {
        let mut d = tiny_dims(true, true);
        // Inputs of 64 and 128 values, so that groups of 32 divide them.
        d.hidden = 64;
        d.intermediate = 128;
        d.heads = 8;
        d.kv_heads = 4;
        let mut packed = d.clone();
        for spec in weight_specs(&d) {
            if !spec.always_f32 {
                let p = Packing {
                    bits: 4,
                    group: 32,
                    scales: ElementType::F16,
                };
                packed.packed.insert(spec.name.clone(), p);
            }
        }
        if kernels::object_file_name().is_none() {
            assert!(emit_llama(&packed, &TINY_SHAPE, WeightFormat::Kernel).is_err());
            return;
        }
        let f32x = emit_llama(&packed, &TINY_SHAPE, WeightFormat::Kernel).unwrap();
        assert!(f32x.contains("stream.executable private @mlxcel_qmm"));
        assert!(f32x.contains("func.call @mlxcel_qmm4_f16_x3("));
        // Per function (prefill, two decodes): one q/k/v and one gate/up dispatch a layer, o
        // and down one each, and the tied head.
        let calls =
            |text: &str, export: &str| text.matches(&format!("@mlxcel_qmm::@{export}[")).count();
        let functions =
            f32x.matches("func.func @prefill").count() + f32x.matches("func.func @decode").count();
        assert!(functions >= 2);
        assert_eq!(calls(&f32x, "qmm4_f16_x3"), 2 * functions);
        assert_eq!(calls(&f32x, "qmm4_f16_x2"), 2 * functions);
        assert_eq!(calls(&f32x, "qmm4_f16"), (2 * 2 + 1) * functions);
        assert!(!f32x.contains("@quantize_x4["));
        let int8 = emit_llama(&packed, &TINY_SHAPE, WeightFormat::KernelInt8).unwrap();
        assert_eq!(calls(&int8, "qmm4i_f16_x3"), 2 * functions);
        // The inputs of q/k/v, o, gate/up, down per layer, and the head's.
        assert_eq!(
            int8.matches("@mlxcel_qmm::@quantize_x4[").count(),
            (2 * 4 + 1) * functions
        );
        // Groups of 16 fit neither kernel.
        for p in packed.packed.values_mut() {
            p.group = 16;
        }
        let err = emit_llama(&packed, &TINY_SHAPE, WeightFormat::KernelInt8).unwrap_err();
        assert!(
            err.to_string().contains("kernel-int8 weight format"),
            "{err}"
        );
    }

    #[test]
    fn refuses_packing_it_cannot_pass() {
        for (bits, group) in [(3, 8), (4, 5), (4, 0)] {
            assert!(
                matches!(
                    emit_llama(&packed_tiny(bits, group), &TINY_SHAPE, WeightFormat::Packed),
                    Err(EmitError::Shape { op: "llama", .. })
                ),
                "{bits} bits, groups of {group}"
            );
            // Widened formats dequantize on the host and need no packing.
            emit_llama(&packed_tiny(bits, group), &TINY_SHAPE, WeightFormat::F16).unwrap();
        }
    }

    #[test]
    fn decode_functions_cover_powers_of_two_then_the_batch() {
        assert_eq!(decode_batches(1), [1]);
        assert_eq!(decode_batches(2), [2]);
        assert_eq!(decode_batches(6), [2, 4, 6]);
        assert_eq!(decode_batches(8), [2, 4, 8]);
        assert_eq!(decode_function(8, 8), "decode");
        assert_eq!(decode_function(2, 8), "decode_2");
        let shape = ProgramShape {
            batch: 4,
            ..TINY_SHAPE
        };
        let text = emit_llama(&tiny_dims(true, false), &shape, WeightFormat::F32).unwrap();
        // Batch 4: `decode_2` reads the first two cache rows, `decode` all four.
        assert!(text.contains("func.func @decode_2("));
        assert!(text.contains("-> (tensor<2x64xf32>, tensor<4x2x20x8xf32>"));
        assert!(text.contains("[0:2:1, 0:2:1, 0:20:1, 0:8:1]"));
        assert!(!text.contains("func.func @decode_1("));
    }

    #[test]
    fn windowed_functions_attend_over_the_first_positions() {
        let shape = ProgramShape {
            min_window: 4,
            ..TINY_SHAPE
        };
        assert_eq!(shape.windows(), [4, 8, 20]);
        assert_eq!(TINY_SHAPE.windows(), [20]);
        let big = ProgramShape {
            context_capacity: 2048,
            batch: 8,
            chunk: 32,
            min_window: 256,
        };
        assert_eq!(big.windows(), [256, 512, 1024, 2080]);
        assert_eq!(big.window_for(1), 256);
        assert_eq!(big.window_for(257), 512);
        assert_eq!(big.window_for(2048), 2080);
        assert_eq!(big.function("decode_2", 512), "decode_2_w512");
        assert_eq!(big.function("prefill", 2080), "prefill");
        assert_eq!(
            big.module_name(WeightFormat::F16),
            "mlxcel_c2048_b8_t32_w256_f16"
        );
        let text = emit_llama(&tiny_dims(true, false), &shape, WeightFormat::F32).unwrap();
        for f in [
            "prefill",
            "decode",
            "prefill_w4",
            "decode_w4",
            "prefill_w8",
            "decode_w8",
        ] {
            assert!(text.contains(&format!("func.func @{f}(")), "{f}");
        }
        // Prefill reads the first 4 positions of its row; decode the first 8 of both rows.
        assert!(text.contains("tensor<1x2x4x8xf32>"));
        assert!(text.contains("[0:2:1, 0:2:1, 0:8:1, 0:8:1]"));
    }

    #[test]
    fn refuses_heads_that_do_not_group() {
        let mut d = tiny_dims(true, false);
        d.kv_heads = 3;
        assert!(matches!(
            emit_llama(&d, &TINY_SHAPE, WeightFormat::F32),
            Err(EmitError::Shape { op: "llama", .. })
        ));
    }
}
