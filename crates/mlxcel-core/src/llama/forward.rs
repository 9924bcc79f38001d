//! The forward pass: one step over any mix of sequences, each with its own cache and its own
//! new tokens, through the fused decoder-layer node or a per-op graph per layer.

use mlxcel_model::LoraTarget;

use super::linear::{GateUp, Linear, combine};
use super::lora::{SeqScales, StepAdapters};
use super::model::{LayerRef, LlamaModel};
use super::weights::{Layer, Mlp, QkvWeights};
use super::window::window_mask;
use crate::array::{Array, eval};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::fast::{
    AttentionMask, HeadSlice, Scores, attention_native_blocks, rms_norm,
    scaled_dot_product_attention_with_sinks, split_heads,
};
use crate::kernels::{Activations, KernelBackend};
use crate::kv_cache::KvCache;
use crate::layer::{LayerSeq, LayerShape, Qkv};
use crate::quantized::{Epilogue, QuantizedWeight};

/// What a forward pass returns per selected row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Logits,
    Hidden,
}

/// One sequence's part of a step.
#[derive(Debug)]
pub struct ForwardSeq<'a> {
    /// The sequence's cache; the new tokens start at position `cache.len()`.
    pub cache: &'a mut KvCache,
    /// The new tokens, at least one.
    pub tokens: &'a [u32],
}

impl LlamaModel {
    /// Runs one step and returns, per sequence and in order, the logits of its last new position.
    /// Each cache grows by its sequence's new tokens.
    pub fn forward(&self, seqs: &mut [ForwardSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        self.forward_rows(seqs, None)
    }

    /// Runs one sequence's step and returns the logits of its new positions from `first` (an
    /// index into its new tokens) to the last, in order: what perplexity scores. The cache grows
    /// as with [`LlamaModel::forward`].
    pub fn forward_scores(&self, seq: ForwardSeq<'_>, first: usize) -> Result<Vec<Vec<f32>>> {
        let mut rows = self.forward_scored(&mut [seq], &[first])?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// Runs one step like [`LlamaModel::forward`] and returns, per sequence and in order, the
    /// logits of its new positions from `firsts[i]` (an index into its new tokens) to the last:
    /// `firsts[i] = tokens.len() - 1` is `forward`'s last position, smaller values score more
    /// positions (speculative verification beside other sequences' decode and prefill).
    pub fn forward_scored(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        if firsts.len() != seqs.len() {
            return Err(Error::Mlx {
                op: "forward_scored",
                message: format!("{} first rows for {} sequences", firsts.len(), seqs.len()),
            });
        }
        for (seq, &first) in seqs.iter().zip(firsts) {
            let n = seq.tokens.len();
            if first >= n {
                return Err(Error::Mlx {
                    op: "forward_scored",
                    message: format!("first row {first} is past the step's {n} tokens"),
                });
            }
        }
        let counts: Vec<usize> = seqs
            .iter()
            .zip(firsts)
            .map(|(seq, &first)| seq.tokens.len() - first)
            .collect();
        let mut rows = self.forward_rows(seqs, Some(firsts))?.into_iter();
        Ok(counts
            .into_iter()
            .map(|count| rows.by_ref().take(count).collect())
            .collect())
    }

    /// The final hidden states (after the last norm, `hidden_size` floats each) of every new
    /// position of one sequence's step: what embeddings pool. The cache grows as with
    /// [`LlamaModel::forward`].
    pub fn forward_hidden(&self, seq: ForwardSeq<'_>) -> Result<Vec<Vec<f32>>> {
        self.forward_rows_as(&mut [seq], Some(&[0]), Output::Hidden, None)
    }

    /// [`LlamaModel::forward`], or with `from: Some(firsts)` the logits of every row of
    /// sequence `i` from `firsts[i]` on, all sequences' rows in one list.
    fn forward_rows(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        from: Option<&[usize]>,
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_rows_as(seqs, from, Output::Logits, None)
    }

    /// [`LlamaModel::forward_scored`] with LoRA adapters: `scales[i][j]` is sequence `i`'s scale
    /// for adapter `j` ([`LlamaModel::set_adapters`]'s order; missing entries are 0), so that
    /// sequences with different adapters share the step.
    pub fn forward_scored_with_adapters(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        firsts: &[usize],
        scales: &[&[f32]],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        if scales.len() != seqs.len() || firsts.len() != seqs.len() {
            return Err(Error::Adapter {
                reason: format!(
                    "{} scale lists and {} first rows for {} sequences",
                    scales.len(),
                    firsts.len(),
                    seqs.len()
                ),
            });
        }
        if let Some(bad) = scales.iter().find(|s| s.len() > self.adapters.len()) {
            return Err(Error::Adapter {
                reason: format!(
                    "{} scales given, the model holds {} adapters",
                    bad.len(),
                    self.adapters.len()
                ),
            });
        }
        let seq_scales: Vec<SeqScales<'_>> = seqs
            .iter()
            .zip(scales)
            .map(|(seq, &scales)| SeqScales {
                rows: seq.tokens.len(),
                scales,
            })
            .collect();
        let step = StepAdapters {
            adapters: &self.adapters,
            seqs: &seq_scales,
        };
        if !step.active() {
            return self.forward_scored(seqs, firsts);
        }
        for (seq, &first) in seqs.iter().zip(firsts) {
            if first >= seq.tokens.len() {
                return Err(Error::Mlx {
                    op: "forward_scored",
                    message: format!(
                        "first row {first} is past the step's {} tokens",
                        seq.tokens.len()
                    ),
                });
            }
        }
        let counts: Vec<usize> = seqs
            .iter()
            .zip(firsts)
            .map(|(seq, &first)| seq.tokens.len() - first)
            .collect();
        let mut rows = self
            .forward_rows_as(seqs, Some(firsts), Output::Logits, Some(&step))?
            .into_iter();
        Ok(counts
            .into_iter()
            .map(|count| rows.by_ref().take(count).collect())
            .collect())
    }

    fn forward_rows_as(
        &self,
        seqs: &mut [ForwardSeq<'_>],
        from: Option<&[usize]>,
        output: Output,
        lora: Option<&StepAdapters<'_>>,
    ) -> Result<Vec<Vec<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.begin_step(seqs)?;
        let x = self.embed_tokens(&ids)?;
        // The rows that leave the step: the last layer's MLP runs on them alone where it can
        // and where that changes no bit (int8 activations: every row's matmuls are a function
        // of that row alone; f32's kernels sum in another order for fewer rows).
        let rows = output_rows(seqs, from);
        let keep = (self.norm.is_some()
            && self.kernels.activations == Activations::Int8
            && rows.len() < ids.len())
        .then_some(rows.as_slice());
        let (x, kept) = self.run_layers_with(x, seqs, lora, keep)?;
        let last = if kept {
            let norm = self
                .norm
                .as_ref()
                .expect("kept rows only with the final norm");
            rms_norm(&x, norm, self.config.rms_norm_eps)?
        } else {
            self.final_rows(x, seqs, from)?
        };
        if output == Output::Hidden {
            let hidden = last.astype(Dtype::F32)?;
            self.end_step(seqs, &[&hidden])?;
            return hidden.to_rows_f32(self.config.hidden_size);
        }
        let logits = self.project(&last)?;
        self.end_step(seqs, &[&logits])?;
        // Each row read straight into its own vector: scoring a verification pass's 17 rows
        // through one whole-array copy and a split cost 1.9 ms more on the default model.
        logits.to_rows_f32(self.config.vocab_size)
    }

    /// Checks a step's sequences (new tokens, in the vocabulary) and makes room in their caches;
    /// returns every sequence's new tokens in order.
    pub(super) fn begin_step(&self, seqs: &mut [ForwardSeq<'_>]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for seq in seqs.iter_mut() {
            if seq.tokens.is_empty() {
                return Err(Error::EmptyStep);
            }
            if let Some(&bad) = seq
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(Error::TokenOutOfRange {
                    token: bad,
                    vocab_size: self.config.vocab_size,
                });
            }
            // A hybrid model's recurrent state must be the state after the positions the cache
            // holds: checked for every sequence before any layer changes any of them.
            seq.cache.recurrent_mut()?;
            seq.cache.reserve(seq.tokens.len())?;
            ids.extend_from_slice(seq.tokens);
        }
        Ok(ids)
    }

    /// The embeddings of `ids` (`[tokens, hidden]`), scaled where the model scales them.
    pub(super) fn embed_tokens(&self, ids: &[u32]) -> Result<Array> {
        let embed = self.embed.as_ref().ok_or_else(|| Error::Mlx {
            op: "embed",
            message: format!(
                "this pipeline stage (layers {}..{}) holds no embedding table",
                self.stage.first, self.stage.end
            ),
        })?;
        let mut x = embed.lookup(&Array::from_u32(ids, &[ids.len() as i32])?)?;
        if let Some(scale) = &self.embedding_scale {
            x = x.multiply(scale)?;
        }
        Ok(x)
    }

    /// The model's decoder layers (a stage's) over `x`, the step's rows in sequence order.
    pub(super) fn run_layers(&self, x: Array, seqs: &mut [ForwardSeq<'_>]) -> Result<Array> {
        Ok(self.run_layers_with(x, seqs, None, None)?.0)
    }

    /// [`LlamaModel::run_layers`] adding LoRA deltas where `lora` has an adapter at a non-zero
    /// scale: inside the fused node where the model runs it, else in the per-op graph. With
    /// `keep` (the step's rows that leave it, ascending; the stage holding the model's last
    /// layer), the fused node runs its last MLP on those rows only and returns them alone,
    /// said by the `true` beside the rows; otherwise every row is returned.
    fn run_layers_with(
        &self,
        mut x: Array,
        seqs: &mut [ForwardSeq<'_>],
        lora: Option<&StepAdapters<'_>>,
        keep: Option<&[u32]>,
    ) -> Result<(Array, bool)> {
        let c = &self.config;
        let kn = &self.kernels;
        let lora = lora.filter(|l| l.active());
        let fused = self.fused_layers();
        // The pairs the node adds; `None` in the outer option: they cannot go into it.
        let stack_lora = match (&fused, lora) {
            (Some(layers), Some(l)) => l.for_stack(layers).map(Some),
            _ => Some(None),
        };
        if let (Some(fused), Some(stack_lora)) = (fused, stack_lora) {
            let shape = LayerShape {
                hidden: c.hidden_size as i32,
                heads: c.num_attention_heads as i32,
                kv_heads: c.num_key_value_heads as i32,
                head_dim: c.head_dim as i32,
                intermediate: c.intermediate_size as i32,
                eps: c.rms_norm_eps,
                scale: self.attention_scale,
                rope_scale: self.rope.scale,
                rotary: c.rotary_dim as i32,
                rope_mscale: c.rope_attention_factor,
            };
            let layers = fused
                .into_iter()
                .enumerate()
                .map(|(index, tensors)| {
                    let layer_seqs = seqs
                        .iter()
                        .map(|seq| {
                            let (n, position) = (seq.tokens.len(), seq.cache.len());
                            let (keys, values) = seq.cache.layer_blocks(index, position + n);
                            LayerSeq {
                                n,
                                position,
                                keys,
                                values,
                            }
                        })
                        .collect::<Vec<_>>();
                    (tensors, layer_seqs)
                })
                .collect::<Vec<_>>();
            return self.fused_stack(x, &layers, &shape, stack_lora.as_ref(), keep.unwrap_or(&[]));
        } else {
            // Gemma 4's per-layer token inputs, made once per step for every layer.
            let per_layer_inputs = match &self.varied {
                Some(varied) => {
                    let ids: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.to_vec()).collect();
                    varied.per_layer_inputs(&ids, &x, &self.varied_context())?
                }
                None => None,
            };
            for (position, layer) in self.order.iter().enumerate() {
                x = match *layer {
                    LayerRef::Varied(index) => {
                        let mut parts: Vec<(&mut KvCache, usize)> = seqs
                            .iter_mut()
                            .map(|seq| (&mut *seq.cache, seq.tokens.len()))
                            .collect();
                        self.varied_step(index, x, &mut parts, per_layer_inputs.as_ref())?
                    }
                    LayerRef::Attention(index) => {
                        self.layer_per_op(index, &self.layers[index], x, seqs, lora)?
                    }
                    LayerRef::Linear(index) => {
                        let linear = &self.linear_layers[index];
                        let mut parts: Vec<(&mut KvCache, usize)> = seqs
                            .iter_mut()
                            .map(|seq| (&mut *seq.cache, seq.tokens.len()))
                            .collect();
                        let x = linear.attend(index, &x, &mut parts, c.rms_norm_eps, kn)?;
                        self.feed_forward(x, &linear.post_norm, &linear.mlp)?
                    }
                    LayerRef::Conv(index) => {
                        let conv = &self.conv_layers[index];
                        let mut parts: Vec<(&mut KvCache, usize)> = seqs
                            .iter_mut()
                            .map(|seq| (&mut *seq.cache, seq.tokens.len()))
                            .collect();
                        // Its state follows the linear-attention layers' in each sequence's.
                        let state = self.linear_layers.len() + index;
                        let x = conv.attend(state, &x, &mut parts, c.rms_norm_eps, kn)?;
                        self.feed_forward(x, &conv.post_norm, &conv.mlp)?
                    }
                };
                x = self.control.apply(x, self.stage.first + position)?;
            }
        }
        Ok((x, false))
    }

    /// The final norm over the rows that leave the step: each sequence's last row, or with
    /// `from: Some(firsts)` its rows from `firsts[i]` on.
    pub(super) fn final_rows(
        &self,
        x: Array,
        seqs: &[ForwardSeq<'_>],
        from: Option<&[usize]>,
    ) -> Result<Array> {
        let norm = self.norm.as_ref().ok_or_else(|| Error::Mlx {
            op: "final norm",
            message: format!(
                "this pipeline stage (layers {}..{}) is not the last: it holds no final norm",
                self.stage.first, self.stage.end
            ),
        })?;
        let last_rows = output_rows(seqs, from);
        let start: usize = seqs.iter().map(|seq| seq.tokens.len()).sum();
        let batch = last_rows.len() as i32;
        // Every row in order (a decode step: one new token per sequence) needs no gather node.
        let every_row = last_rows.len() == start && (0u32..).zip(&last_rows).all(|(i, &r)| i == r);
        let last = if every_row {
            x
        } else {
            x.take(&Array::from_u32(&last_rows, &[batch])?, 0)?
        };
        rms_norm(&last, norm, self.config.rms_norm_eps)
    }

    /// Logits (f32, soft-capped where the model caps them) of normed final rows.
    pub(super) fn project(&self, last: &Array) -> Result<Array> {
        let kn = &self.kernels;
        let logits = match (&self.lm_head, &self.embed) {
            (Some(head), _) => head.forward(last, kn)?,
            (None, Some(embed)) if self.config.tie_word_embeddings => embed.project(last, kn)?,
            _ => {
                return Err(Error::Mlx {
                    op: "output projection",
                    message: format!(
                        "this pipeline stage (layers {}..{}) holds no output projection",
                        self.stage.first, self.stage.end
                    ),
                });
            }
        }
        .astype(Dtype::F32)?;
        Ok(match self.config.final_logit_softcapping {
            Some(cap) => {
                let cap = Array::scalar_f32(cap);
                logits.divide(&cap)?.tanh()?.multiply(&cap)?
            }
            None => logits,
        })
    }

    /// Evaluates a step's `outputs` with the keys and values it wrote, then counts the new
    /// positions in every cache.
    pub(super) fn end_step(&self, seqs: &mut [ForwardSeq<'_>], outputs: &[&Array]) -> Result<()> {
        let mut to_eval: Vec<&Array> = outputs.to_vec();
        for seq in seqs.iter() {
            to_eval.extend(seq.cache.pending_arrays());
        }
        eval(&to_eval)?;
        for seq in seqs.iter_mut() {
            seq.cache.advance(seq.tokens.len());
        }
        Ok(())
    }

    /// One decoder layer as a graph of per-op nodes (MLX's kernels, or mlxcel's where a
    /// layer's layout does not allow the fused node).
    fn layer_per_op(
        &self,
        index: usize,
        layer: &Layer,
        mut x: Array,
        seqs: &mut [ForwardSeq<'_>],
        lora: Option<&StepAdapters<'_>>,
    ) -> Result<Array> {
        let c = &self.config;
        let kn = &self.kernels;
        let (heads, kv_heads, head_dim) = (
            c.num_attention_heads as i32,
            c.num_key_value_heads as i32,
            c.head_dim as i32,
        );
        let stacked_bias = |y: Array| match &layer.qkv_bias {
            Some(bias) => y.add(bias),
            None => Ok(y),
        };
        let normed = |w: &QuantizedWeight| {
            w.linear_normed_then(&x, &layer.input_norm, c.rms_norm_eps, kn, Epilogue::None)
        };
        let projections = match (&layer.qkv, layer.qkv_matrices()) {
            (QkvWeights::Stacked(stacked), _) => {
                Projections::Stacked(stacked_bias(normed(stacked)?)?)
            }
            // Quantized differently (not stacked): the fused layer's arithmetic, three matmuls
            // side by side then the stacked path, so that the per-op graph gives its bits.
            (_, Some(Qkv::Split(q, k, v))) if kn.backend == KernelBackend::Native => {
                let y = Array::concatenate(&[&normed(q)?, &normed(k)?, &normed(v)?], 1)?;
                Projections::Stacked(stacked_bias(y)?)
            }
            (QkvWeights::Separate(q, k, v), _) => {
                let h = rms_norm(&x, &layer.input_norm, c.rms_norm_eps)?;
                Projections::Separate(q.forward(&h, kn)?, k.forward(&h, kn)?, v.forward(&h, kn)?)
            }
        };
        let projections = match lora {
            Some(l)
                if [LoraTarget::Q, LoraTarget::K, LoraTarget::V]
                    .into_iter()
                    .any(|t| l.applies(index, t)) =>
            {
                self.qkv_deltas(index, l, &x, &layer.input_norm, projections)?
            }
            _ => projections,
        };
        // OLMoE's q/k norms span the whole projections: q and k are normed before the heads are
        // split, and the per-head norms below are skipped.
        let projections = match (&layer.qk_norm, layer.qk_norm_whole) {
            (Some((q_norm, k_norm)), true) => {
                let (q, k, v) = match projections {
                    Projections::Stacked(y) => {
                        let rows = y.shape()[0];
                        let (q_dim, kv_dim) = (heads * head_dim, kv_heads * head_dim);
                        (
                            y.slice(&[0, 0], &[rows, q_dim])?,
                            y.slice(&[0, q_dim], &[rows, q_dim + kv_dim])?,
                            y.slice(&[0, q_dim + kv_dim], &[rows, q_dim + 2 * kv_dim])?,
                        )
                    }
                    Projections::Separate(q, k, v) => (q, k, v),
                };
                Projections::Separate(
                    rms_norm(&q, q_norm, c.rms_norm_eps)?,
                    rms_norm(&k, k_norm, c.rms_norm_eps)?,
                    v,
                )
            }
            _ => projections,
        };
        let mut outputs = Vec::with_capacity(seqs.len());
        let mut row = 0i32;
        // The q/k norms come before RoPE: with them, or without RoPE, the heads are split first
        // and then normed and rotated by MLX ops.
        let plain = layer.qk_norm.is_none()
            && layer.attention.rope
            && c.rotary_dim == c.head_dim
            && self.rope_input_scale.is_none();
        let (rope, inv_freq) = self.rope_of(layer);
        let finish = |x: Array, norm: Option<&Array>, position: i32| -> Result<Array> {
            let x = match norm {
                Some(w) => rms_norm(&x, w, c.rms_norm_eps)?,
                None => x,
            };
            if layer.attention.rope {
                let x = match &self.rope_input_scale {
                    Some(m) => x.multiply(m)?,
                    None => x,
                };
                rope.apply(&x, position)
            } else {
                Ok(x)
            }
        };
        let (q_norm, k_norm) = match &layer.qk_norm {
            Some((q, k)) if !layer.qk_norm_whole => (Some(q), Some(k)),
            _ => (None, None),
        };
        for seq in seqs.iter_mut() {
            let n = seq.tokens.len() as i32;
            let position = seq.cache.len() as i32;
            let (qi, ki, vi) = match &projections {
                Projections::Stacked(qkv) if !plain => {
                    let slice = |column: i32, count: i32| {
                        split_heads(
                            qkv,
                            HeadSlice {
                                row,
                                rows: n,
                                column,
                                heads: count,
                                head_dim,
                                inv_freq,
                                rope: None,
                            },
                        )
                    };
                    (
                        finish(slice(0, heads)?, q_norm, position)?,
                        finish(slice(heads * head_dim, kv_heads)?, k_norm, position)?,
                        slice((heads + kv_heads) * head_dim, kv_heads)?,
                    )
                }
                Projections::Stacked(qkv) => {
                    let slice = |column: i32, count: i32, rope: bool| {
                        split_heads(
                            qkv,
                            HeadSlice {
                                row,
                                rows: n,
                                column,
                                heads: count,
                                head_dim,
                                inv_freq,
                                rope: rope.then_some((position, self.rope.scale)),
                            },
                        )
                    };
                    (
                        slice(0, heads, true)?,
                        slice(heads * head_dim, kv_heads, true)?,
                        slice((heads + kv_heads) * head_dim, kv_heads, false)?,
                    )
                }
                Projections::Separate(q, k, v) => {
                    let heads_first = |m: &Array, count: i32| -> Result<Array> {
                        m.slice(&[row, 0], &[row + n, count * head_dim])?
                            .reshape(&[1, n, count, head_dim])?
                            .transpose(&[0, 2, 1, 3])
                    };
                    (
                        finish(heads_first(q, heads)?, q_norm, position)?,
                        finish(heads_first(k, kv_heads)?, k_norm, position)?,
                        heads_first(v, kv_heads)?,
                    )
                }
            };
            // Gemma 4's v norm: each head of v RMS-normalised, without weights.
            let vi = match &layer.value_norm {
                Some(ones) => rms_norm(&vi, ones, c.rms_norm_eps)?,
                None => vi,
            };
            let sinks = layer.sinks.as_deref().unwrap_or_default();
            // Soft-capped scores exist on mlxcel's attention kernel only, which then serves
            // `MLXCEL_KERNELS=mlx` too.
            let attended = if kn.backend == KernelBackend::Native || self.features.softcap.is_some()
            {
                let len = seq.cache.len() + n as usize;
                let blocks = seq.cache.append_blocks(index, &ki, &vi, n as usize)?;
                let scores = Scores {
                    scale: self.attention_scale,
                    causal: n > 1,
                    window: layer.attention.window,
                    softcap: self.features.softcap,
                    sinks,
                };
                let blocks = (blocks.0.as_slice(), blocks.1.as_slice());
                attention_native_blocks(&qi, blocks, len, scores, kn.isa, kn.threads)?
            } else {
                let (keys, values) = seq.cache.append(index, &ki, &vi, n as usize)?;
                // MLX's attention takes one dtype: f16 caches are widened (exactly) for it.
                let widen = |a: Array| -> Result<Array> {
                    if a.dtype() == Dtype::F32 {
                        Ok(a)
                    } else {
                        a.astype(Dtype::F32)
                    }
                };
                let (keys, values) = (widen(keys)?, widen(values)?);
                let window_mask = layer
                    .attention
                    .window
                    .map(|w| window_mask(position as usize, n as usize, w))
                    .transpose()?;
                let mask = match &window_mask {
                    Some(m) => AttentionMask::Array(m),
                    None if n > 1 => AttentionMask::Causal,
                    None => AttentionMask::None,
                };
                scaled_dot_product_attention_with_sinks(
                    &qi,
                    &keys,
                    &values,
                    self.attention_scale,
                    mask,
                    sinks,
                )?
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[n, heads * head_dim])?
            };
            outputs.push(attended);
            row += n;
        }
        let attended = match outputs.as_slice() {
            [one] => one.clone(),
            many => Array::concatenate(&many.iter().collect::<Vec<_>>(), 0)?,
        };
        // A gated output (Qwen3-Next, Qwen3.5): times sigmoid(gate), the gate projected from the
        // normed input; sigmoid(g) as (1 + tanh(g/2)) / 2, which MLX has the ops for.
        let attended = match &layer.output_gate {
            Some(gate) => {
                let g = gate.forward(&rms_norm(&x, &layer.input_norm, c.rms_norm_eps)?, kn)?;
                let half = Array::scalar_f32(0.5);
                let sigmoid = g.multiply(&half)?.tanh()?.multiply(&half)?.add(&half)?;
                attended.multiply(&sigmoid)?
            }
            None => attended,
        };
        let activation = self.features.activation;
        let eps = c.rms_norm_eps;
        match (&layer.sandwich, &layer.mlp) {
            (None, mlp) => {
                x = layer.o.forward_add(&attended, &x, kn)?;
                if let Some(l) = lora {
                    x = l.add_to(index, LoraTarget::O, &attended, x)?;
                }
                x = match (lora, mlp) {
                    (Some(l), Mlp::Dense { gate_up, down }) if mlp_applies(l, index) => {
                        let out =
                            self.dense_mlp_with(index, l, &x, &layer.post_norm, (gate_up, down))?;
                        x.add(&out)?
                    }
                    _ => self.feed_forward(x, &layer.post_norm, mlp)?,
                };
            }
            (Some((post_attention, post_feedforward)), mlp) => {
                let mut out = layer.o.forward(&attended, kn)?;
                if let Some(l) = lora {
                    out = l.add_to(index, LoraTarget::O, &attended, out)?;
                }
                x = x.add(&rms_norm(&out, post_attention, eps)?)?;
                let out = match mlp {
                    Mlp::Dense { gate_up, down } if lora.is_some_and(|l| mlp_applies(l, index)) => {
                        let l = lora.expect("checked");
                        self.dense_mlp_with(index, l, &x, &layer.post_norm, (gate_up, down))?
                    }
                    Mlp::Dense { gate_up, down } => {
                        let gated =
                            gate_up.forward_normed(&x, &layer.post_norm, eps, activation, kn)?;
                        down.forward(&gated, kn)?
                    }
                    Mlp::Routed(moe) => moe.forward(&x, &layer.post_norm, eps, kn)?,
                };
                x = x.add(&rms_norm(&out, post_feedforward, eps)?)?;
            }
        }
        // Gemma 4 scales each layer's output, residual included.
        if let Some(scalar) = &layer.scalar {
            x = x.multiply(scalar)?;
        }
        Ok(x)
    }
}

impl LlamaModel {
    /// `x + mlp(norm(x))`: a layer's feed-forward block with its residual (the layers without
    /// Gemma's sandwich norms).
    fn feed_forward(&self, x: Array, post_norm: &Array, mlp: &Mlp) -> Result<Array> {
        let (eps, kn) = (self.config.rms_norm_eps, &self.kernels);
        match mlp {
            Mlp::Dense { gate_up, down } => {
                let gated =
                    gate_up.forward_normed(&x, post_norm, eps, self.features.activation, kn)?;
                down.forward_add(&gated, &x, kn)
            }
            // The fused routed-expert node adds its output to the residual itself.
            Mlp::Routed(moe) => moe.forward_add(&x, post_norm, eps, kn),
        }
    }
}

impl LlamaModel {
    /// `projections` plus the adapters' q/k/v deltas of the normed rows.
    fn qkv_deltas(
        &self,
        index: usize,
        l: &StepAdapters<'_>,
        x: &Array,
        norm: &Array,
        projections: Projections,
    ) -> Result<Projections> {
        let c = &self.config;
        let h = rms_norm(x, norm, c.rms_norm_eps)?;
        Ok(match projections {
            Projections::Separate(q, k, v) => Projections::Separate(
                l.add_to(index, LoraTarget::Q, &h, q)?,
                l.add_to(index, LoraTarget::K, &h, k)?,
                l.add_to(index, LoraTarget::V, &h, v)?,
            ),
            Projections::Stacked(y) => {
                let rows = y.shape()[0];
                let q_dim = (c.num_attention_heads * c.head_dim) as i32;
                let kv_dim = (c.num_key_value_heads * c.head_dim) as i32;
                let part = |target: LoraTarget, width: i32| -> Result<Array> {
                    match l.delta(index, target, &h)? {
                        Some(d) => Ok(d),
                        None => Array::zeros(&[rows, width], Dtype::F32),
                    }
                };
                let d = Array::concatenate(
                    &[
                        &part(LoraTarget::Q, q_dim)?,
                        &part(LoraTarget::K, kv_dim)?,
                        &part(LoraTarget::V, kv_dim)?,
                    ],
                    1,
                )?;
                Projections::Stacked(y.add(&d)?)
            }
        })
    }

    /// A dense MLP's output (without the residual) with the adapters' gate, up and down
    /// deltas: the gate and up projections apart, each with its delta, then the activation.
    fn dense_mlp_with(
        &self,
        index: usize,
        l: &StepAdapters<'_>,
        x: &Array,
        norm: &Array,
        (gate_up, down): (&GateUp, &Linear),
    ) -> Result<Array> {
        let kn = &self.kernels;
        let h = rms_norm(x, norm, self.config.rms_norm_eps)?;
        let (g, u) = gate_up.projections(&h, kn)?;
        let g = l.add_to(index, LoraTarget::Gate, &h, g)?;
        let u = l.add_to(index, LoraTarget::Up, &h, u)?;
        let gated = combine(&g, &u, self.features.activation)?;
        let y = down.forward(&gated, kn)?;
        l.add_to(index, LoraTarget::Down, &gated, y)
    }
}

/// Whether any of the MLP's projections in layer `index` gets a delta this step.
/// The step's rows that leave it, ascending: each sequence's last row, or with `from:
/// Some(firsts)` its rows from `firsts[i]` on.
fn output_rows(seqs: &[ForwardSeq<'_>], from: Option<&[usize]>) -> Vec<u32> {
    let mut rows = Vec::with_capacity(seqs.len());
    let mut start = 0u32;
    for (index, seq) in seqs.iter().enumerate() {
        let end = start + seq.tokens.len() as u32;
        let first = from.map_or(end - 1, |firsts| start + firsts[index] as u32);
        rows.extend(first..end);
        start = end;
    }
    rows
}

fn mlp_applies(l: &StepAdapters<'_>, index: usize) -> bool {
    [LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down]
        .into_iter()
        .any(|t| l.applies(index, t))
}

/// A layer's q, k and v projections of the step's tokens: stacked side by side, or three.
enum Projections {
    Stacked(Array),
    Separate(Array, Array, Array),
}
