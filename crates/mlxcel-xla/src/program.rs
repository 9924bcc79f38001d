//! The llama-family program at one static context capacity.
//!
//! One module per capacity holds two functions over the same weights and KV caches:
//!
//! - `prefill`: one chunk of `chunk` tokens of one sequence (cache row `row`, starting at
//!   position `start`); returns the logits of the chunk's token `last` and the updated caches.
//! - `decode`: one token for every one of the `batch` cache rows, each at its own position;
//!   returns `batch` logits rows and the updated caches.
//!
//! Weights come first in the argument list ([`weight_specs`] fixes the order), then the caches
//! (keys then values, one `[batch, capacity + chunk, kv_heads, head_dim]` tensor per layer), then
//! the step's indices. The caches are returned in the same order and replace the arguments (IREE
//! may write the argument buffers in place: they are donated). Positions and masks are computed
//! in the graph from the start positions; the host bounds-checks every index, because StableHLO's
//! scatter and dynamic slices clamp out-of-range indices silently.
//!
//! Each cache row has `chunk` scratch positions past the capacity: a prefill chunk's padding
//! tokens and the decode rows that no sequence occupies write there, so no write ever lands on a
//! position a live sequence reads.

use std::collections::BTreeMap;

use crate::error::EmitError;
use crate::hlo::{
    Compare, DotDims, ElementType, FunctionBuilder, Module, Reduce, TensorType, Unary, Value,
};

/// The model's dimensions and the constants the graph bakes in.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaDims {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_norm_eps: f32,
    /// Rotary inverse frequencies, `head_dim / 2` of them (1 / period).
    pub inv_freq: Vec<f32>,
    pub qkv_bias: bool,
    pub out_bias: bool,
    pub tied_embeddings: bool,
    /// The checkpoint's quantized weights (by tensor name) that [`WeightFormat::Packed`] passes
    /// packed; every other weight is dense.
    pub packed: BTreeMap<String, Packing>,
}

/// How one quantized weight is packed: MLX affine quantization, `scale · q + bias` per group of
/// `group` consecutive input elements, `q` unsigned of `bits` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packing {
    /// 4 or 8.
    pub bits: u32,
    pub group: usize,
    /// The element type of the scales and biases arguments (f16 or f32).
    pub scales: ElementType,
}

/// The static shape of one compiled module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramShape {
    /// Positions each sequence may occupy.
    pub context_capacity: usize,
    /// Cache rows, and decode's batch size.
    pub batch: usize,
    /// Tokens per prefill call.
    pub chunk: usize,
}

impl ProgramShape {
    /// The IREE module name of this shape under `format`: `<name>.prefill`, `<name>.decode`.
    pub fn module_name(&self, format: WeightFormat) -> String {
        format!(
            "mlxcel_c{}_b{}_t{}_{}",
            self.context_capacity,
            self.batch,
            self.chunk,
            format.name()
        )
    }

    /// Positions per cache row, scratch included.
    pub fn cache_len(&self) -> usize {
        self.context_capacity + self.chunk
    }
}

/// How weights are stored in the argument buffers; the graph widens them to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Every weight dequantized on the host, stored as f32.
    F32,
    /// Every weight dequantized on the host, stored as f16.
    F16,
    /// Quantized weights stay packed (4- or 8-bit integers plus their scales and biases) and are
    /// dequantized in the graph, inside the matmul that reads them; dense weights are f16.
    Packed,
}

impl WeightFormat {
    /// The element type of dense (not packed) weights.
    pub fn element(self) -> ElementType {
        match self {
            Self::F32 => ElementType::F32,
            Self::F16 | Self::Packed => ElementType::F16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Packed => "packed",
        }
    }

    /// The format named `name` (`f32`, `f16` or `packed`).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::F32, Self::F16, Self::Packed]
            .into_iter()
            .find(|f| f.name() == name)
    }
}

/// How a weight argument is laid out relative to the checkpoint tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As stored.
    AsIs,
    /// Transposed: the checkpoint's `[out, in]` becomes `[in, out]`.
    Transposed,
}

/// One weight argument: the checkpoint tensor it comes from and its argument shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSpec {
    /// The checkpoint tensor name (for quantized modules, the module's `.weight`).
    pub name: String,
    pub dims: Vec<i64>,
    pub layout: Layout,
    /// Norm weights and biases stay f32 whatever the weight format: they are tiny.
    pub always_f32: bool,
    /// How the checkpoint packs it, if quantized (from [`LlamaDims::packed`]).
    pub packed: Option<Packing>,
}

/// The weight arguments, in argument order.
pub fn weight_specs(d: &LlamaDims) -> Vec<WeightSpec> {
    let (h, q, kv, i) = (
        d.hidden as i64,
        (d.heads * d.head_dim) as i64,
        (d.kv_heads * d.head_dim) as i64,
        d.intermediate as i64,
    );
    let mut specs = vec![WeightSpec {
        name: "model.embed_tokens.weight".into(),
        dims: vec![d.vocab as i64, h],
        layout: Layout::AsIs,
        always_f32: false,
        packed: d.packed.get("model.embed_tokens.weight").copied(),
    }];
    let mut push = |name: String, dims: Vec<i64>, layout: Layout, always_f32: bool| {
        let packed = d.packed.get(&name).copied();
        specs.push(WeightSpec {
            name,
            dims,
            layout,
            always_f32,
            packed,
        })
    };
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        push(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Layout::AsIs,
            true,
        );
        for (m, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(
                format!("{p}.self_attn.{m}.weight"),
                vec![h, out],
                Layout::Transposed,
                false,
            );
            if d.qkv_bias {
                push(
                    format!("{p}.self_attn.{m}.bias"),
                    vec![out],
                    Layout::AsIs,
                    true,
                );
            }
        }
        push(
            format!("{p}.self_attn.o_proj.weight"),
            vec![q, h],
            Layout::Transposed,
            false,
        );
        if d.out_bias {
            push(
                format!("{p}.self_attn.o_proj.bias"),
                vec![h],
                Layout::AsIs,
                true,
            );
        }
        push(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Layout::AsIs,
            true,
        );
        push(
            format!("{p}.mlp.gate_proj.weight"),
            vec![h, i],
            Layout::Transposed,
            false,
        );
        push(
            format!("{p}.mlp.up_proj.weight"),
            vec![h, i],
            Layout::Transposed,
            false,
        );
        push(
            format!("{p}.mlp.down_proj.weight"),
            vec![i, h],
            Layout::Transposed,
            false,
        );
    }
    push("model.norm.weight".into(), vec![h], Layout::AsIs, true);
    if !d.tied_embeddings {
        push(
            "lm_head.weight".into(),
            vec![h, d.vocab as i64],
            Layout::Transposed,
            false,
        );
    }
    specs
}

/// The argument type of a weight under `format`.
pub fn weight_type(spec: &WeightSpec, format: WeightFormat) -> TensorType {
    let element = if spec.always_f32 {
        ElementType::F32
    } else {
        format.element()
    };
    TensorType::new(&spec.dims, element)
}

/// The argument types of a weight under `format`: one dense tensor, or, for a packed weight
/// under [`WeightFormat::Packed`], the integers `[rows, cols / group, group]` (the checkpoint's
/// `[out, in]` layout, never transposed), then the scales and the biases `[rows, cols / group]`.
pub fn weight_types(spec: &WeightSpec, format: WeightFormat) -> Vec<TensorType> {
    match (format, spec.packed) {
        (WeightFormat::Packed, Some(p)) => {
            let [a, b] = spec.dims[..] else {
                return vec![weight_type(spec, format)];
            };
            let (rows, cols) = match spec.layout {
                Layout::AsIs => (a, b),
                Layout::Transposed => (b, a),
            };
            let group = p.group as i64;
            let element = ElementType::unsigned(p.bits).unwrap_or(ElementType::U32);
            vec![
                TensorType::new(&[rows, cols / group, group], element),
                TensorType::new(&[rows, cols / group], p.scales),
                TensorType::new(&[rows, cols / group], p.scales),
            ]
        }
        _ => vec![weight_type(spec, format)],
    }
}

/// The type of one layer's key (or value) cache.
pub fn cache_type(d: &LlamaDims, shape: &ProgramShape) -> TensorType {
    TensorType::new(
        &[
            shape.batch as i64,
            shape.cache_len() as i64,
            d.kv_heads as i64,
            d.head_dim as i64,
        ],
        ElementType::F32,
    )
}

/// Emits the module for one capacity.
pub fn emit_llama(
    d: &LlamaDims,
    shape: &ProgramShape,
    format: WeightFormat,
) -> Result<String, EmitError> {
    if !d.heads.is_multiple_of(d.kv_heads.max(1)) || d.inv_freq.len() * 2 != d.head_dim {
        return Err(EmitError::Shape {
            op: "llama",
            detail: format!(
                "{} heads over {} kv heads, {} rotary frequencies for head_dim {}",
                d.heads,
                d.kv_heads,
                d.inv_freq.len(),
                d.head_dim
            ),
        });
    }
    if format == WeightFormat::Packed {
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
                && matches!(p.scales, ElementType::F16 | ElementType::F32);
            if !fits {
                return Err(EmitError::Shape {
                    op: "llama",
                    detail: format!(
                        "{}: cannot pass {} packed ({}-bit, groups of {}, {:?} scales)",
                        spec.name,
                        TensorType::new(&spec.dims, ElementType::F32),
                        p.bits,
                        p.group,
                        p.scales
                    ),
                });
            }
        }
    }
    let mut module = Module::new(&shape.module_name(format));
    module.push(emit_step(d, shape, format, Step::Prefill)?);
    for rows in decode_batches(shape.batch) {
        module.push(emit_step(d, shape, format, Step::Decode(rows))?);
    }
    Ok(module.to_text())
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
    post_norm: Value,
    gate: Weight,
    up: Weight,
    down: Weight,
}

struct Emitter<'a> {
    b: FunctionBuilder,
    d: &'a LlamaDims,
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

    /// Rows `ids` of an embedding table, as f32 `[n, hidden]`.
    fn embed(&mut self, table: &Weight, ids: &Value) -> Result<Value, EmitError> {
        match table {
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
            Weight::Dense(weight) => {
                let weight = self.widen(weight);
                self.b.matmul(x, &weight)?
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
        let w = self.b.broadcast_in_dim(w, &[n, h], &[1])?;
        let y = self.b.mul(x, &r)?;
        self.b.mul(&y, &w)
    }

    /// Hugging Face (non-interleaved) RoPE of `x` (`[n, heads, head_dim]`) given `cos`/`sin`
    /// (`[n, head_dim]`).
    fn rope(&mut self, x: &Value, cos: &Value, sin: &Value) -> Result<Value, EmitError> {
        let dims = x.dims().to_vec();
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

fn emit_step(
    d: &LlamaDims,
    shape: &ProgramShape,
    format: WeightFormat,
    step: Step,
) -> Result<crate::hlo::Function, EmitError> {
    let name = match step {
        Step::Prefill => "prefill".to_owned(),
        Step::Decode(rows) => decode_function(rows, shape.batch),
    };
    let mut e = Emitter {
        b: FunctionBuilder::new(&name),
        d,
    };
    // Weight arguments, in weight_specs order.
    let specs = weight_specs(d);
    let mut args = specs
        .iter()
        .map(|s| {
            let types = weight_types(s, format);
            let mut values = types.into_iter().map(|t| e.b.arg(t));
            match (values.next(), values.next(), values.next()) {
                (Some(q), Some(scales), Some(biases)) => Weight::Packed { q, scales, biases },
                (Some(v), _, _) => Weight::Dense(v),
                _ => unreachable!("weight_types gives one or three types"),
            }
        })
        .collect::<Vec<_>>()
        .into_iter();
    let mut next = || {
        args.next()
            .expect("weight_specs lists every argument taken")
    };
    let embed = next();
    let mut layers = Vec::with_capacity(d.layers);
    for _ in 0..d.layers {
        let input_norm = next().dense()?;
        let mut qkv = Vec::with_capacity(3);
        for _ in 0..3 {
            let w = next();
            let bias = d.qkv_bias.then(&mut next).map(Weight::dense).transpose()?;
            qkv.push((w, bias));
        }
        let o_w = next();
        let o = (
            o_w,
            d.out_bias.then(&mut next).map(Weight::dense).transpose()?,
        );
        let post_norm = next().dense()?;
        let (gate, up, down) = (next(), next(), next());
        let mut qkv = qkv.into_iter();
        let (q, k, v) = (
            qkv.next().expect("three projections"),
            qkv.next().expect("three projections"),
            qkv.next().expect("three projections"),
        );
        layers.push(LayerArgs {
            input_norm,
            q,
            k,
            v,
            o,
            post_norm,
            gate,
            up,
            down,
        });
    }
    let final_norm = next().dense()?;
    let lm_head = (!d.tied_embeddings).then(&mut next);

    let cache_ty = cache_type(d, shape);
    let k_caches: Vec<Value> = (0..d.layers).map(|_| e.b.arg(cache_ty.clone())).collect();
    let v_caches: Vec<Value> = (0..d.layers).map(|_| e.b.arg(cache_ty.clone())).collect();

    let i32_scalar = TensorType::new(&[], ElementType::I32);
    let (rows, t) = match step {
        Step::Prefill => (1i64, shape.chunk as i64),
        Step::Decode(rows) => (rows as i64, 1i64),
    };
    let n = rows * t;
    // Step inputs, and from them: per-token positions `[rows, t]` and scatter indices `[n, 2]`.
    let (tokens, positions, write_idx, row_arg, last_arg) = match step {
        Step::Prefill => {
            let tokens = e.b.arg(TensorType::new(&[t], ElementType::I32));
            let row = e.b.arg(i32_scalar.clone());
            let start = e.b.arg(i32_scalar.clone());
            let last = e.b.arg(i32_scalar.clone());
            let offsets = e.b.iota(&[1, t], 1, ElementType::I32)?;
            let start_b = e.b.broadcast_in_dim(&start, &[1, t], &[])?;
            let positions = e.b.add(&offsets, &start_b)?;
            let pos_col = e.b.reshape(&positions, &[n, 1])?;
            let row_col = e.b.broadcast_in_dim(&row, &[n, 1], &[])?;
            let idx = e.b.concatenate(&[&row_col, &pos_col], 1)?;
            (tokens, positions, idx, Some(row), Some(last))
        }
        Step::Decode(_) => {
            let tokens = e.b.arg(TensorType::new(&[rows], ElementType::I32));
            let starts = e.b.arg(TensorType::new(&[rows], ElementType::I32));
            let positions = e.b.reshape(&starts, &[rows, 1])?;
            let row_col = e.b.iota(&[n, 1], 0, ElementType::I32)?;
            let idx = e.b.concatenate(&[&row_col, &positions], 1)?;
            (tokens, positions, idx, None, None)
        }
    };

    let (heads, kv_heads, hd) = (d.heads as i64, d.kv_heads as i64, d.head_dim as i64);
    let group = heads / kv_heads;
    let cache_len = shape.cache_len() as i64;

    // Rotary tables for the step's tokens: `[n, head_dim]`.
    let pos_flat = e.b.reshape(&positions, &[n])?;
    let pos_f = e.b.convert(&pos_flat, ElementType::F32);
    let pos_f = e.b.broadcast_in_dim(&pos_f, &[n, hd / 2], &[0])?;
    let inv_freq = e.b.vector_f32(&d.inv_freq);
    let inv_freq = e.b.broadcast_in_dim(&inv_freq, &[n, hd / 2], &[1])?;
    let angles = e.b.mul(&pos_f, &inv_freq)?;
    let angles = e.b.concatenate(&[&angles, &angles], 1)?;
    let cos = e.b.unary(Unary::Cosine, &angles)?;
    let sin = e.b.unary(Unary::Sine, &angles)?;

    // The causal mask `[rows, kv_heads, t, group, cache_len]`: key position ≤ query position.
    let score_dims = [rows, kv_heads, t, group, cache_len];
    let key_pos = e.b.iota(&score_dims, 4, ElementType::I32)?;
    let query_pos = e.b.broadcast_in_dim(&positions, &score_dims, &[0, 2])?;
    let allowed = e.b.compare(Compare::Le, &key_pos, &query_pos)?;
    let neg_inf = e.b.splat_f32(f32::NEG_INFINITY, &score_dims);
    let scale = e.b.splat_f32(1.0 / (d.head_dim as f32).sqrt(), &score_dims);

    let mut x = e.embed(&embed, &tokens)?;
    let mut new_k = Vec::with_capacity(d.layers);
    let mut new_v = Vec::with_capacity(d.layers);
    for (l, layer) in layers.iter().enumerate() {
        let h = e.rms_norm(&x, &layer.input_norm)?;
        let q = e.linear(&h, &layer.q)?;
        let k = e.linear(&h, &layer.k)?;
        let v = e.linear(&h, &layer.v)?;
        let q = e.b.reshape(&q, &[n, heads, hd])?;
        let k = e.b.reshape(&k, &[n, kv_heads, hd])?;
        let v = e.b.reshape(&v, &[n, kv_heads, hd])?;
        let q = e.rope(&q, &cos, &sin)?;
        let k = e.rope(&k, &cos, &sin)?;
        let k_cache = e.b.scatter_rows2(&k_caches[l], &write_idx, &k)?;
        let v_cache = e.b.scatter_rows2(&v_caches[l], &write_idx, &v)?;
        let (keys, values) = match &row_arg {
            Some(row) => {
                let zero = e.b.splat_int(0, &[], ElementType::I32);
                let sizes = [1, cache_len, kv_heads, hd];
                let starts = [row, &zero, &zero, &zero];
                (
                    e.b.dynamic_slice(&k_cache, &starts, &sizes)?,
                    e.b.dynamic_slice(&v_cache, &starts, &sizes)?,
                )
            }
            // Decode reads the first `rows` cache rows.
            None if rows < shape.batch as i64 => {
                let limit = [rows, cache_len, kv_heads, hd];
                (
                    e.b.slice(&k_cache, &[0, 0, 0, 0], &limit)?,
                    e.b.slice(&v_cache, &[0, 0, 0, 0], &limit)?,
                )
            }
            None => (k_cache.clone(), v_cache.clone()),
        };
        new_k.push(k_cache);
        new_v.push(v_cache);

        let q = e.b.reshape(&q, &[rows, t, kv_heads, group, hd])?;
        let scores = e.b.dot_general(
            &q,
            &keys,
            &DotDims {
                lhs_batch: vec![0, 2],
                rhs_batch: vec![0, 2],
                lhs_contract: vec![4],
                rhs_contract: vec![3],
            },
        )?;
        let scores = e.b.mul(&scores, &scale)?;
        let scores = e.b.select(&allowed, &scores, &neg_inf)?;
        let probs = e.softmax_last(&scores)?;
        let attended = e.b.dot_general(
            &probs,
            &values,
            &DotDims {
                lhs_batch: vec![0, 1],
                rhs_batch: vec![0, 2],
                lhs_contract: vec![4],
                rhs_contract: vec![1],
            },
        )?;
        let attended = e.b.transpose(&attended, &[0, 2, 1, 3, 4])?;
        let attended = e.b.reshape(&attended, &[n, heads * hd])?;
        let o = e.linear(&attended, &layer.o)?;
        x = e.b.add(&x, &o)?;
        let h = e.rms_norm(&x, &layer.post_norm)?;
        let gate = e.linear(&h, &(layer.gate.clone(), None))?;
        let up = e.linear(&h, &(layer.up.clone(), None))?;
        let sig = e.b.unary(Unary::Logistic, &gate)?;
        let act = e.b.mul(&gate, &sig)?;
        let act = e.b.mul(&act, &up)?;
        let down = e.linear(&act, &(layer.down.clone(), None))?;
        x = e.b.add(&x, &down)?;
    }

    let last = match &last_arg {
        Some(last) => {
            let zero = e.b.splat_int(0, &[], ElementType::I32);
            e.b.dynamic_slice(&x, &[last, &zero], &[1, d.hidden as i64])?
        }
        None => x,
    };
    let last = e.rms_norm(&last, &final_norm)?;
    let logits = match (&lm_head, &embed) {
        (Some(head), _) => e.linear(&last, &(head.clone(), None))?,
        // Tied: the embedding table `[vocab, hidden]` is the output projection's `[out, in]`.
        (None, Weight::Dense(table)) => {
            let table = e.widen(table);
            e.b.dot_general(
                &last,
                &table,
                &DotDims {
                    lhs_contract: vec![1],
                    rhs_contract: vec![1],
                    ..DotDims::default()
                },
            )?
        }
        (None, Weight::Packed { .. }) => e.linear(&last, &(embed.clone(), None))?,
    };
    let mut results: Vec<&Value> = vec![&logits];
    results.extend(new_k.iter());
    results.extend(new_v.iter());
    Ok(e.b.finish(&results))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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
            packed: BTreeMap::new(),
        }
    }

    pub(crate) const TINY_SHAPE: ProgramShape = ProgramShape {
        context_capacity: 16,
        batch: 2,
        chunk: 4,
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
        let tied = weight_specs(&tiny_dims(true, false));
        assert_eq!(tied.len(), 1 + 2 * 9 + 1);
    }

    #[test]
    fn emits_prefill_and_decode_with_caches_threaded_through() {
        let d = tiny_dims(true, false);
        let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::F32).unwrap();
        assert!(text.contains("func.func @prefill("));
        assert!(text.contains("func.func @decode("));
        // Each function returns the logits and 2 layers × (keys, values).
        let cache = "tensor<2x20x2x8xf32>";
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
        assert!(text.contains("-> (tensor<2x64xf32>, tensor<4x20x2x8xf32>"));
        assert!(text.contains("[0:2:1, 0:20:1, 0:2:1, 0:8:1]"));
        assert!(!text.contains("func.func @decode_1("));
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
