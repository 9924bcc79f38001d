//! One function of the module: prefill of a chunk, or decode of the first rows. Its arguments
//! (weights, caches, step indices), the decoder layers (attention over the caches, the MLP) and
//! the logits.

use std::collections::BTreeMap;

use super::emitter::{Emitter, Weight};
use crate::abi::{LlamaDims, ProgramShape, WeightFormat, cache_type, weight_specs, weight_types};
use crate::error::EmitError;
use crate::hlo::{
    Binary, Compare, DotDims, ElementType, FunctionBuilder, TensorType, Unary, Value,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
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

/// The weights of one layer as function arguments.
pub(super) struct LayerArgs {
    pub(super) input_norm: Value,
    pub(super) q: (Weight, Option<Value>),
    pub(super) k: (Weight, Option<Value>),
    pub(super) v: (Weight, Option<Value>),
    pub(super) o: (Weight, Option<Value>),
    /// The per-head q and k norms, when the model has them.
    pub(super) qk_norm: Option<(Value, Value)>,
    pub(super) post_norm: Value,
    /// Gemma: `pre_feedforward_layernorm` and `post_feedforward_layernorm` (then `post_norm`
    /// is the attention output's norm).
    pub(super) feedforward_norms: Option<(Value, Value)>,
    pub(super) gate: Weight,
    pub(super) up: Weight,
    pub(super) down: Weight,
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
pub(super) fn emit_step(
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
