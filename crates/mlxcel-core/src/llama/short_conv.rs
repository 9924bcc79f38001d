//! LFM2's short-convolution layer: its weights and its step. `in_proj` runs on MLX over all of
//! the step's tokens at once (each weight read once per step, int8 activations where the kernels
//! use them); its output is read back, and each sequence's gated causal convolution runs on the
//! host against that sequence's tail of products (kept in its [`crate::RecurrentState`], after
//! the gated-DeltaNet layers' states), a few multiply-adds per channel. The result goes back
//! through `out_proj` on MLX.

use super::linear::Linear;
use super::weights::Mlp;
use crate::array::Array;
use crate::error::{Error, Result};
use crate::fast::rms_norm;
use crate::kernels::Kernels;
use crate::kv_cache::KvCache;
use crate::recurrent_state::{LayerState, LayerStateShape};

/// One short-convolution decoder layer: its norms and feed-forward block as any layer's, and the
/// gated convolution in place of attention.
#[derive(Debug)]
pub(super) struct ConvLayer {
    pub(super) input_norm: Array,
    pub(super) post_norm: Array,
    pub(super) mlp: Mlp,
    /// `[3 · hidden, hidden]`: `B`, `C` and `x`, side by side.
    pub(super) in_proj: Linear,
    /// The convolution's taps, `[channels, kernel]` (host).
    pub(super) taps: Vec<f32>,
    pub(super) out: Linear,
    pub(super) channels: usize,
    pub(super) kernel: usize,
}

impl ConvLayer {
    /// The sizes of one sequence's state for this layer: the last `kernel - 1` products `B · x`.
    pub(super) fn state_shape(&self) -> LayerStateShape {
        LayerStateShape {
            conv: (self.kernel - 1) * self.channels,
            matrix: 0,
        }
    }

    /// The layer's convolution over the step (`x`: every sequence's rows, in order; `seqs` each
    /// sequence's cache and its count of new tokens), plus the residual: `x + out_proj(C ·
    /// conv(B · x))` of the normed input. `state` is the layer's place in each sequence's
    /// recurrent state.
    pub(super) fn attend(
        &self,
        state: usize,
        x: &Array,
        seqs: &mut [(&mut KvCache, usize)],
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        let h = rms_norm(x, &self.input_norm, eps)?;
        let projected = self.in_proj.forward(&h, kernels)?.to_vec_f32()?;
        let width = 3 * self.channels;
        let mut gated = Vec::with_capacity(projected.len() / 3);
        let mut row = 0;
        for (cache, n) in seqs.iter_mut() {
            let n = *n;
            let position = cache.len();
            let recurrent = cache
                .recurrent_mut()?
                .ok_or_else(|| Error::RecurrentState {
                    operation: "step",
                    reason: "the cache has no short-convolution state (it was not made by this \
                             model's new_cache)"
                        .into(),
                })?;
            let rows = &projected[row * width..(row + n) * width];
            // The tail after each cut the state asks for (a prefix-cache snapshot or a
            // speculative checkpoint), so that a resumed sequence starts from exact values.
            let (cuts, _) = recurrent.cuts(position, n);
            let (y, tails) = self.sequence(rows, &mut recurrent.layer_mut(state).conv, &cuts);
            for (cut, conv) in tails {
                let matrix = Vec::new();
                recurrent.record(state, position + cut, LayerState { conv, matrix });
            }
            gated.extend(y);
            row += n;
        }
        let gated = Array::from_f32(&gated, &[row as i32, self.channels as i32])?;
        self.out.forward_add(&gated, x, kernels)
    }

    /// One sequence's rows (`[n, 3 · channels]`: `B`, `C`, `x`) against its tail (`[kernel -
    /// 1, channels]`, oldest first), returning `C · conv(B · x)` (`[n, channels]`) and the tail
    /// after each of `cuts` tokens (ascending), and leaving the last `kernel - 1` products in
    /// the tail.
    fn sequence(
        &self,
        rows: &[f32],
        tail: &mut [f32],
        cuts: &[usize],
    ) -> (Vec<f32>, Vec<(usize, Vec<f32>)>) {
        let (c, k) = (self.channels, self.kernel);
        let n = rows.len() / (3 * c);
        let mut products = Vec::with_capacity(tail.len() + n * c);
        products.extend_from_slice(tail);
        for row in rows.chunks_exact(3 * c) {
            products.extend(row[..c].iter().zip(&row[2 * c..]).map(|(b, x)| b * x));
        }
        let mut out = Vec::with_capacity(n * c);
        for (t, row) in rows.chunks_exact(3 * c).enumerate() {
            let gate = &row[c..2 * c];
            for (j, g) in gate.iter().enumerate() {
                let taps = &self.taps[j * k..(j + 1) * k];
                let sum: f32 = taps
                    .iter()
                    .enumerate()
                    .map(|(i, w)| w * products[(t + i) * c + j])
                    .sum();
                out.push(g * sum);
            }
        }
        let tails = cuts
            .iter()
            .map(|&cut| (cut, products[cut * c..cut * c + tail.len()].to_vec()))
            .collect();
        tail.copy_from_slice(&products[n * c..]);
        (out, tails)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(channels: usize, kernel: usize, taps: Vec<f32>) -> Result<ConvLayer> {
        let zero = Array::from_f32(&vec![0.0; channels], &[channels as i32])?;
        let linear = || -> Result<Linear> {
            Ok(Linear::Dense {
                weight_t: Array::from_f32(&[0.0], &[1, 1])?,
                bias: None,
            })
        };
        Ok(ConvLayer {
            input_norm: zero.clone(),
            post_norm: zero,
            mlp: Mlp::Dense {
                gate_up: super::super::linear::GateUp::new(linear()?, linear()?)?,
                down: linear()?,
            },
            in_proj: linear()?,
            taps,
            out: linear()?,
            channels,
            kernel,
        })
    }

    /// The step, token by token or all at once, is the plain causal convolution of `B · x`
    /// over the whole sequence (zeros before its start), times `C`.
    #[test]
    fn chunks_and_single_tokens_give_the_plain_convolution() -> Result<()> {
        let (c, k, n) = (2, 3, 5);
        let taps = vec![0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
        let l = layer(c, k, taps.clone())?;
        let rows: Vec<f32> = (0..n * 3 * c).map(|i| (i as f32 * 0.37).sin()).collect();
        let product = |t: usize, j: usize| rows[t * 3 * c + j] * rows[t * 3 * c + 2 * c + j];
        let mut expected = Vec::new();
        for t in 0..n {
            for j in 0..c {
                let mut sum = 0.0;
                for i in 0..k {
                    // Tap i reads position t - (k - 1) + i.
                    if let Some(p) = (t + i).checked_sub(k - 1) {
                        sum += taps[j * k + i] * product(p, j);
                    }
                }
                expected.push(rows[t * 3 * c + c + j] * sum);
            }
        }
        let mut tail = vec![0.0; (k - 1) * c];
        let (whole, cut_tails) = l.sequence(&rows, &mut tail, &[1, 2, 4]);
        let mut tail_steps = vec![0.0; (k - 1) * c];
        let mut tails_by_step = Vec::new();
        let (mut stepped, _) = l.sequence(&rows[..2 * 3 * c], &mut tail_steps, &[]);
        tails_by_step.push((2, tail_steps.clone()));
        for t in 2..n {
            let (y, _) = l.sequence(&rows[t * 3 * c..(t + 1) * 3 * c], &mut tail_steps, &[]);
            stepped.extend(y);
            tails_by_step.push((t + 1, tail_steps.clone()));
        }
        // A cut's tail is the tail of a run that stopped there (the snapshots and checkpoints
        // a resumed sequence starts from).
        for (cut, cut_tail) in &cut_tails[1..] {
            let (_, stopped) = tails_by_step.iter().find(|(t, _)| t == cut).unwrap();
            assert_eq!(cut_tail, stopped, "tail after {cut} tokens");
        }
        assert_eq!(cut_tails[0].1[..c], [0.0, 0.0]);
        assert_eq!(cut_tails[0].1[c..], [product(0, 0), product(0, 1)]);
        for (got, want) in whole
            .iter()
            .zip(&expected)
            .chain(stepped.iter().zip(&expected))
        {
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
        assert_eq!(tail, tail_steps);
        Ok(())
    }
}
