//! A hybrid model's linear-attention layer (gated DeltaNet: Qwen3-Next, Qwen3.5): its weights and
//! its step. The projections run on MLX over all of the step's tokens at once (each weight read
//! once per step, int8 activations where the kernels use them); their outputs are read back, and
//! each sequence's convolution, normalisation, delta rule and gated norm run on the host
//! ([`crate::delta_rule`]) against that sequence's recurrent state, which lives on the host
//! beside its KV cache. The result goes back through `out_proj` on MLX.

use mlxcel_model::GatedDeltaNet;

use super::linear::Linear;
use super::weights::Mlp;
use crate::array::Array;
use crate::delta_rule::{
    DeltaInputs, DeltaShape, PrefillForm, causal_conv_silu, chunked, recurrent, silu, softplus,
};
use crate::error::{Error, Result};
use crate::fast::rms_norm;
use crate::kernels::Kernels;
use crate::kv_cache::KvCache;
use crate::recurrent_state::{LayerState, LayerStateShape};

/// One sequence's part of a linear-attention step: the gated norm's output and the layer's
/// state after each cut (its index into the run).
type SequenceOutput = (Vec<f32>, Vec<(usize, LayerState)>);

/// The eps of the L2 normalisation of q and k (the reference implementations' 1e-6).
const QK_L2_EPS: f32 = 1e-6;

/// One linear-attention decoder layer: its norms and feed-forward block as any layer's, and the
/// gated DeltaNet in place of softmax attention.
#[derive(Debug)]
pub(super) struct LinearLayer {
    pub(super) input_norm: Array,
    pub(super) post_norm: Array,
    pub(super) mlp: Mlp,
    pub(super) net: DeltaNet,
}

/// A gated DeltaNet's weights.
#[derive(Debug)]
pub(super) struct DeltaNet {
    pub(super) spec: GatedDeltaNet,
    /// The input projections, their outputs side by side: `in_proj_qkvz` and `in_proj_ba`
    /// (grouped by key head) when the spec says fused, else `in_proj_qkv`, `in_proj_z`,
    /// `in_proj_b`, `in_proj_a`; one matrix of their rows stacked in that order where the
    /// loader could stack them (the same columns from one matmul).
    pub(super) projections: Vec<Linear>,
    /// The convolution's taps, `[channels, taps]` (host).
    pub(super) conv: Vec<f32>,
    /// `exp(A_log)` per value head (host).
    pub(super) decay_rate: Vec<f32>,
    /// `dt_bias` per value head (host).
    pub(super) dt_bias: Vec<f32>,
    /// The gated norm's weight, `[value_head_dim]` (host).
    pub(super) norm: Vec<f32>,
    pub(super) out: Linear,
}

impl DeltaNet {
    /// The shape of the delta rule's heads.
    fn shape(&self) -> DeltaShape {
        DeltaShape {
            key_heads: self.spec.key_heads,
            value_heads: self.spec.value_heads,
            key_dim: self.spec.key_head_dim,
            value_dim: self.spec.value_head_dim,
            tiled: self.spec.tiled_value_heads,
        }
    }

    /// The sizes of one sequence's state for this layer.
    pub(super) fn state_shape(&self) -> LayerStateShape {
        state_shape(&self.spec)
    }

    /// Columns of the projections' outputs side by side.
    fn width(&self) -> usize {
        self.spec.conv_dim() + self.spec.value_dim() + 2 * self.spec.value_heads
    }

    /// One projected row (`[width]`, the projections' columns) as q‖k‖v (the convolution's
    /// channels), z, b and a, each appended to its vector: the fused projections' per-key-head
    /// groups are put in head order.
    fn unpack(
        &self,
        row: &[f32],
        qkv: &mut Vec<f32>,
        z: &mut Vec<f32>,
        b: &mut Vec<f32>,
        a: &mut Vec<f32>,
    ) {
        let s = &self.spec;
        if !s.fused_projections {
            let (c, v) = (s.conv_dim(), s.value_dim());
            qkv.extend_from_slice(&row[..c]);
            z.extend_from_slice(&row[c..c + v]);
            b.extend_from_slice(&row[c + v..c + v + s.value_heads]);
            a.extend_from_slice(&row[c + v + s.value_heads..]);
            return;
        }
        let (dk, groups) = (s.key_head_dim, s.key_heads);
        let per = s.value_heads / groups;
        let vd = per * s.value_head_dim;
        let group = 2 * dk + 2 * vd;
        let ba = &row[groups * group..];
        let part =
            |g: usize, from: usize, len: usize| &row[g * group + from..g * group + from + len];
        for g in 0..groups {
            qkv.extend_from_slice(part(g, 0, dk));
        }
        for g in 0..groups {
            qkv.extend_from_slice(part(g, dk, dk));
        }
        for g in 0..groups {
            qkv.extend_from_slice(part(g, 2 * dk, vd));
        }
        for g in 0..groups {
            z.extend_from_slice(part(g, 2 * dk + vd, vd));
        }
        for g in 0..groups {
            b.extend_from_slice(&ba[g * 2 * per..g * 2 * per + per]);
        }
        for g in 0..groups {
            a.extend_from_slice(&ba[g * 2 * per + per..(g + 1) * 2 * per]);
        }
    }

    /// One sequence's part of a step: `rows` projected rows (`[n, width]`) against its state
    /// (`position`: the first token's absolute position), returning the gated norm's output
    /// `[n, value_dim]` and the layer's state after each of `cuts` tokens (ascending indices
    /// into the run; [`crate::recurrent_state::RecurrentState::cuts`]). The run is cut there on
    /// the delta rule's grid of absolute positions, so it computes the chunks an uncut run
    /// does (`token_by_token`: every token alone, decode's arithmetic).
    fn sequence(
        &self,
        rows: &[f32],
        state: &mut LayerState,
        position: usize,
        (cuts, token_by_token): (&[usize], bool),
        eps: f32,
        kernels: &Kernels,
    ) -> Result<SequenceOutput> {
        let s = &self.spec;
        let n = rows.len() / self.width();
        let (mut qkv, mut z, mut b, mut a) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for row in rows.chunks_exact(self.width()) {
            self.unpack(row, &mut qkv, &mut z, &mut b, &mut a);
        }
        let channels = s.conv_dim();
        let tail_before = if cuts.is_empty() {
            Vec::new()
        } else {
            state.conv.clone()
        };
        let mixed = causal_conv_silu(
            &qkv,
            channels,
            &self.conv,
            s.conv_kernel,
            &mut state.conv,
            kernels,
        )?;
        let (key_dim, dk) = (s.key_dim(), s.key_head_dim);
        let mut q = Vec::with_capacity(n * key_dim);
        let mut k = Vec::with_capacity(n * key_dim);
        let mut v = Vec::with_capacity(n * s.value_dim());
        for row in mixed.chunks_exact(channels) {
            q.extend_from_slice(&row[..key_dim]);
            k.extend_from_slice(&row[key_dim..2 * key_dim]);
            v.extend_from_slice(&row[2 * key_dim..]);
        }
        // mlx-lm's `normalize_qk`: an RMS norm with eps scaled by 1/dk (the L2 norm's eps on
        // the sum), q then scaled by 1/dk and k by 1/√dk.
        let rms_eps = QK_L2_EPS / dk as f32;
        normalise_rows(&mut q, dk, rms_eps, 1.0 / dk as f32);
        normalise_rows(&mut k, dk, rms_eps, (dk as f32).sqrt().recip());
        let heads = s.value_heads;
        let mut beta = Vec::with_capacity(n * heads);
        let mut log_decay = Vec::with_capacity(n * heads);
        for t in 0..n {
            for h in 0..heads {
                beta.push(1.0 / (1.0 + (-b[t * heads + h]).exp()));
                log_decay.push(-self.decay_rate[h] * softplus(a[t * heads + h] + self.dt_bias[h]));
            }
        }
        let inputs = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            log_decay: &log_decay,
            beta: &beta,
        };
        let shape = self.shape();
        // One token (a decode step), or every token alone, runs the recurrent form; a longer
        // run the form MLXCEL_DELTA_PREFILL names (the chunked one cut on its grid).
        let one_by_one =
            n == 1 || token_by_token || PrefillForm::from_env()? == PrefillForm::Recurrent;
        let run = |from: usize, to: usize, matrix: &mut Vec<f32>| {
            let part = inputs.rows(&shape, from, to);
            if one_by_one {
                recurrent(&shape, &part, matrix, kernels)
            } else {
                chunked(&shape, &part, matrix, position + from, kernels)
            }
        };
        let mut records = Vec::with_capacity(cuts.len());
        let mut y = Vec::with_capacity(n * s.value_dim());
        let mut from = 0;
        for &cut in cuts {
            y.extend(run(from, cut, &mut state.matrix)?);
            from = cut;
            records.push((
                cut,
                LayerState {
                    conv: tail_after(&tail_before, &qkv, channels, cut),
                    matrix: state.matrix.clone(),
                },
            ));
        }
        if from < n {
            y.extend(run(from, n, &mut state.matrix)?);
        }
        // The gated norm: RMS norm per value head with `norm`, times silu(z).
        let dv = s.value_head_dim;
        for (head, gate) in y.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            let mean = head.iter().map(|x| x * x).sum::<f32>() / dv as f32;
            let scale = (mean + eps).sqrt().recip();
            for ((x, w), g) in head.iter_mut().zip(&self.norm).zip(gate) {
                *x = silu(*g) * (*x * scale * w);
            }
        }
        Ok((y, records))
    }
}

/// The convolution's tail after the first `r` rows of `x` (`[n, channels]`): the last
/// `taps - 1` rows of `tail ‖ x[..r]`, where `tail` is the tail before `x`.
fn tail_after(tail: &[f32], x: &[f32], channels: usize, r: usize) -> Vec<f32> {
    let keep = tail.len() / channels;
    (r..r + keep)
        .flat_map(|i| {
            if i < keep {
                &tail[i * channels..(i + 1) * channels]
            } else {
                &x[(i - keep) * channels..(i - keep + 1) * channels]
            }
        })
        .copied()
        .collect()
}

/// Rows of `dim` values RMS-normed (`x / √(mean x² + eps)`) and multiplied by `factor`, in place.
fn normalise_rows(x: &mut [f32], dim: usize, eps: f32, factor: f32) {
    for row in x.chunks_exact_mut(dim) {
        let mean = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = (mean + eps).sqrt().recip();
        for value in row.iter_mut() {
            *value = *value * scale * factor;
        }
    }
}

/// The sizes of one sequence's state for a layer of `spec`.
pub(super) fn state_shape(spec: &GatedDeltaNet) -> LayerStateShape {
    LayerStateShape {
        conv: (spec.conv_kernel - 1) * spec.conv_dim(),
        matrix: spec.value_heads * spec.value_head_dim * spec.key_head_dim,
    }
}

impl LinearLayer {
    /// The layer's linear attention over the step (`x`: every sequence's rows, in order; `seqs`
    /// each sequence's cache and its count of new tokens), plus the residual: `x +
    /// out_proj(gated DeltaNet(norm(x)))`. `index` is the layer's place among the linear layers
    /// (its state in each sequence's cache).
    pub(super) fn attend(
        &self,
        index: usize,
        x: &Array,
        seqs: &mut [(&mut KvCache, usize)],
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        let net = &self.net;
        let h = rms_norm(x, &self.input_norm, eps)?;
        let outputs = net
            .projections
            .iter()
            .map(|p| p.forward(&h, kernels))
            .collect::<Result<Vec<_>>>()?;
        let projected = match outputs.as_slice() {
            [one] => one.to_vec_f32()?,
            many => Array::concatenate(&many.iter().collect::<Vec<_>>(), 1)?.to_vec_f32()?,
        };
        let width = net.width();
        let mut gated = Vec::with_capacity(projected.len() / width * net.spec.value_dim());
        let mut row = 0;
        for (cache, n) in seqs.iter_mut() {
            let n = *n;
            let position = cache.len();
            let state = cache
                .recurrent_mut()?
                .ok_or_else(|| Error::RecurrentState {
                    operation: "step",
                    reason:
                        "the cache has no linear-attention state (it was not made by this model's \
                         new_cache)"
                            .into(),
                })?;
            let rows = &projected[row * width..(row + n) * width];
            let cuts = state.cuts(position, n);
            let (y, records) = net.sequence(
                rows,
                state.layer_mut(index),
                position,
                (&cuts.0, cuts.1),
                eps,
                kernels,
            )?;
            for (cut, layer) in records {
                state.record(index, position + cut, layer);
            }
            gated.extend(y);
            row += n;
        }
        let gated = Array::from_f32(&gated, &[row as i32, net.spec.value_dim() as i32])?;
        net.out.forward_add(&gated, x, kernels)
    }
}
