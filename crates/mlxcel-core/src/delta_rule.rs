//! The gated delta rule (the linear attention of gated-DeltaNet layers: Qwen3-Next, Qwen3.5) and
//! its short causal convolution, as host kernels over f32 slices.
//!
//! Per value head, with a matrix state `S` (`value_dim × key_dim`, f32), each token `t` does
//!
//! ```text
//! S ← g_t · S;   u_t = β_t · (v_t − S·k_t);   S ← S + u_t ⊗ k_t;   y_t = S·q_t
//! ```
//!
//! ([`recurrent`], one token after another: decode, and by default prefill too, see
//! [`PrefillForm`]). [`chunked`] gives the same outputs for a run of tokens in chunks of
//! [`CHUNK`], as the reference implementations (the
//! flash-linear-attention kernels, transformers' `torch_chunk_gated_delta_rule`) do: within a
//! chunk the deltas `u` are one triangular solve (the UT transform of the WY representation,
//! `T = (I + A)⁻¹` with `A` strictly lower triangular), split into the part that does not depend
//! on the chunk's incoming state and the part that does, so the state is read and written once
//! per chunk rather than once per token. Chunks lie on a fixed grid of absolute positions (a
//! chunk starts at a multiple of [`CHUNK`]), so a prompt prefilled in pieces that are multiples
//! of [`CHUNK`] long computes the same chunks as one prefilled whole.
//!
//! Every head is independent: the kernels (`cpp/kernels/delta_rule.inc`, compiled for the
//! scalar, AVX2 and AVX-512 paths and chosen by [`Kernels::isa`]) share the value heads out over
//! the kernel pool's threads.

use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::sys::ffi;

/// Tokens per chunk of [`chunked`] (the reference implementations' 64).
pub const CHUNK: usize = 64;

/// The form a run of several tokens (a prefill) takes (`MLXCEL_DELTA_PREFILL`). A single token
/// always takes the recurrent form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillForm {
    /// [`recurrent`], token by token: on the CPU the faster form at Qwen3.5's head sizes
    /// (128 × 128 states, which stay in the core's L2 cache), with half the multiply-adds of
    /// the chunked form, and bitwise the same wherever a run is cut.
    Recurrent,
    /// [`chunked`], the reference implementations' form for parallel hardware.
    Chunked,
}

impl PrefillForm {
    /// From `MLXCEL_DELTA_PREFILL` (`recurrent` or `chunked`); unset means recurrent.
    pub fn from_env() -> Result<PrefillForm> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`PrefillForm::from_env`] over any variable lookup (for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<PrefillForm> {
        match lookup("MLXCEL_DELTA_PREFILL").as_deref() {
            None | Some("recurrent") => Ok(PrefillForm::Recurrent),
            Some("chunked") => Ok(PrefillForm::Chunked),
            Some(other) => Err(Error::InvalidEnv {
                variable: "MLXCEL_DELTA_PREFILL",
                value: other.to_owned(),
                expected: "recurrent or chunked",
            }),
        }
    }
}

/// The sizes of one gated-DeltaNet layer's heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaShape {
    pub key_heads: usize,
    pub value_heads: usize,
    /// Values per key (and query) head.
    pub key_dim: usize,
    /// Values per value head.
    pub value_dim: usize,
    /// Value head `h` reads key head `h % key_heads` (llama.cpp's tiled order), not
    /// `h / (value_heads / key_heads)` (Hugging Face's grouped order).
    pub tiled: bool,
}

impl DeltaShape {
    /// f32 values of one sequence's matrix state: `[value_heads, value_dim, key_dim]`.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.value_dim * self.key_dim
    }

    /// The key head value head `h` reads (each key head serves `value_heads / key_heads`
    /// consecutive value heads, or every `key_heads`-th one when tiled; the kernels compute the
    /// same, this is the tests' reference).
    #[cfg(test)]
    fn key_head(&self, h: usize) -> usize {
        if self.tiled {
            h % self.key_heads
        } else {
            h / (self.value_heads / self.key_heads)
        }
    }
}

/// One run of tokens' inputs to the rule, row-major by token: `q` and `k` `[n, key_heads,
/// key_dim]` (q already scaled and normalised as the layer wants), `v` `[n, value_heads,
/// value_dim]`, `log_decay` (`ln g`) and `beta` `[n, value_heads]`.
#[derive(Debug, Clone, Copy)]
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub log_decay: &'a [f32],
    pub beta: &'a [f32],
}

impl<'a> DeltaInputs<'a> {
    /// Tokens `start..end` of the run (a run cut where the state is recorded).
    pub fn rows(&self, shape: &DeltaShape, start: usize, end: usize) -> DeltaInputs<'a> {
        let key = shape.key_heads * shape.key_dim;
        let value = shape.value_heads * shape.value_dim;
        let heads = shape.value_heads;
        DeltaInputs {
            q: &self.q[start * key..end * key],
            k: &self.k[start * key..end * key],
            v: &self.v[start * value..end * value],
            log_decay: &self.log_decay[start * heads..end * heads],
            beta: &self.beta[start * heads..end * heads],
        }
    }

    /// Tokens in the run, after checking every slice against `shape`.
    fn tokens(&self, shape: &DeltaShape) -> usize {
        let n = self.beta.len() / shape.value_heads;
        assert_eq!(self.beta.len(), n * shape.value_heads, "beta's length");
        assert_eq!(self.log_decay.len(), self.beta.len(), "log_decay's length");
        assert_eq!(
            self.q.len(),
            n * shape.key_heads * shape.key_dim,
            "q's length"
        );
        assert_eq!(self.k.len(), self.q.len(), "k's length");
        assert_eq!(
            self.v.len(),
            n * shape.value_heads * shape.value_dim,
            "v's length"
        );
        n
    }
}

/// The causal depthwise convolution of `x` (`[n, channels]`) with `weight` (`[channels, taps]`,
/// tap `taps - 1` on the current row), then SiLU; `tail` holds the `taps - 1` rows before `x`
/// (`[taps - 1, channels]`, zeros for a new sequence) and becomes the last `taps - 1` rows of
/// `tail ‖ x`.
pub fn causal_conv_silu(
    x: &[f32],
    channels: usize,
    weight: &[f32],
    taps: usize,
    tail: &mut [f32],
    kernels: &Kernels,
) -> Result<Vec<f32>> {
    let n = x.len() / channels;
    let keep = taps - 1;
    let mut out = vec![0f32; x.len()];
    ffi::kernels_causal_conv_silu(
        x,
        &*tail,
        weight,
        channels as i32,
        taps as i32,
        &mut out,
        kernels.isa as u8,
        kernels.threads as i32,
    )
    .map_err(Error::mlx("causal_conv_silu"))?;
    // The new tail: the last `keep` rows of `tail ‖ x`.
    let from_x = n.min(keep);
    tail.copy_within(from_x * channels.., 0);
    let at = (keep - from_x) * channels;
    tail[at..].copy_from_slice(&x[(n - from_x) * channels..]);
    Ok(out)
}

/// `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ln(1 + eˣ)`, as MLX's `softplus` (`logaddexp(x, 0)`).
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The rule one token at a time over `inputs`, from and into `state` (`[value_heads, value_dim,
/// key_dim]`); returns `y`, `[n, value_heads, value_dim]`.
pub fn recurrent(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    state: &mut [f32],
    kernels: &Kernels,
) -> Result<Vec<f32>> {
    run(shape, inputs, state, None, kernels)
}

/// [`recurrent`]'s result computed in chunks of [`CHUNK`] tokens on the grid of absolute
/// positions: `position` is the first token's.
pub fn chunked(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    state: &mut [f32],
    position: usize,
    kernels: &Kernels,
) -> Result<Vec<f32>> {
    run(shape, inputs, state, Some(position), kernels)
}

/// Either form over every value head (`chunked_from`: the chunked form's first position).
fn run(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    state: &mut [f32],
    chunked_from: Option<usize>,
    kernels: &Kernels,
) -> Result<Vec<f32>> {
    let n = inputs.tokens(shape);
    assert_eq!(state.len(), shape.state_len(), "state's length");
    let mut y = vec![0f32; n * shape.value_heads * shape.value_dim];
    ffi::kernels_delta_rule(
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.log_decay,
        inputs.beta,
        state,
        &mut y,
        shape.key_heads as i32,
        shape.value_heads as i32,
        shape.key_dim as i32,
        shape.value_dim as i32,
        shape.tiled,
        chunked_from.unwrap_or(0) as i64,
        chunked_from.is_some(),
        kernels.isa as u8,
        kernels.threads as i32,
    )
    .map_err(Error::mlx("delta_rule"))?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Isa;

    /// Each path this CPU has, on `threads` threads.
    fn paths(threads: usize) -> Vec<Kernels> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&isa| isa <= Isa::best())
            .map(|isa| Kernels {
                isa,
                threads,
                ..Kernels::native()
            })
            .collect()
    }

    fn key_row<'a>(shape: &DeltaShape, x: &'a [f32], t: usize, h: usize) -> &'a [f32] {
        let at = (t * shape.key_heads + shape.key_head(h)) * shape.key_dim;
        &x[at..at + shape.key_dim]
    }

    fn value_row<'a>(shape: &DeltaShape, v: &'a [f32], t: usize, h: usize) -> &'a [f32] {
        let at = (t * shape.value_heads + h) * shape.value_dim;
        &v[at..at + shape.value_dim]
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// A deterministic stream of values in [-1, 1).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }

        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    /// Rows of `dim` L2-normalised, times `scale` (what the layer feeds the rule).
    fn normalised(mut x: Vec<f32>, dim: usize, scale: f32) -> Vec<f32> {
        for row in x.chunks_mut(dim) {
            let norm = dot(row, row).sqrt();
            for value in row.iter_mut() {
                *value *= scale / norm;
            }
        }
        x
    }

    struct Case {
        shape: DeltaShape,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        log_decay: Vec<f32>,
        beta: Vec<f32>,
        state: Vec<f32>,
    }

    impl Case {
        fn new(n: usize, seed: u64) -> Self {
            let shape = DeltaShape {
                key_heads: 2,
                value_heads: 4,
                key_dim: 32,
                value_dim: 16,
                tiled: false,
            };
            let mut rng = Lcg(seed);
            let keys = n * shape.key_heads * shape.key_dim;
            let q = normalised(rng.vec(keys), shape.key_dim, 1.0 / (32f32).sqrt());
            let k = normalised(rng.vec(keys), shape.key_dim, 1.0);
            let v = rng.vec(n * shape.value_heads * shape.value_dim);
            // The layer's decay: -exp(A_log) · softplus(a + dt_bias), A in (0, 16).
            let log_decay = (0..n * shape.value_heads)
                .map(|_| -(8.0 + 8.0 * rng.next()) * softplus(2.0 * rng.next()) * 0.1)
                .collect();
            let beta = (0..n * shape.value_heads)
                .map(|_| 1.0 / (1.0 + (-3.0 * rng.next()).exp()))
                .collect();
            let state = rng.vec(shape.state_len());
            Self {
                shape,
                q,
                k,
                v,
                log_decay,
                beta,
                state,
            }
        }

        fn inputs(&self, from: usize, to: usize) -> DeltaInputs<'_> {
            let (kh, vh) = (
                self.shape.key_heads * self.shape.key_dim,
                self.shape.value_heads,
            );
            let vd = vh * self.shape.value_dim;
            DeltaInputs {
                q: &self.q[from * kh..to * kh],
                k: &self.k[from * kh..to * kh],
                v: &self.v[from * vd..to * vd],
                log_decay: &self.log_decay[from * vh..to * vh],
                beta: &self.beta[from * vh..to * vh],
            }
        }
    }

    /// The plain per-token recurrence in f64, the reference both kernels are held to.
    fn reference(case: &Case, n: usize) -> (Vec<f64>, Vec<f64>) {
        let sh = case.shape;
        let (dk, dv) = (sh.key_dim, sh.value_dim);
        let mut state: Vec<f64> = case.state.iter().map(|&x| x as f64).collect();
        let mut y = vec![0f64; n * sh.value_heads * dv];
        for t in 0..n {
            for h in 0..sh.value_heads {
                let q = key_row(&sh, &case.q, t, h);
                let k = key_row(&sh, &case.k, t, h);
                let v = value_row(&sh, &case.v, t, h);
                let g = (case.log_decay[t * sh.value_heads + h] as f64).exp();
                let beta = case.beta[t * sh.value_heads + h] as f64;
                let s = &mut state[h * dv * dk..(h + 1) * dv * dk];
                for i in 0..dv {
                    let row = &mut s[i * dk..(i + 1) * dk];
                    let mut mem = 0.0;
                    for j in 0..dk {
                        row[j] *= g;
                        mem += row[j] * k[j] as f64;
                    }
                    let delta = (v[i] as f64 - mem) * beta;
                    let mut out = 0.0;
                    for j in 0..dk {
                        row[j] += k[j] as f64 * delta;
                        out += row[j] * q[j] as f64;
                    }
                    y[(t * sh.value_heads + h) * dv + i] = out;
                }
            }
        }
        (y, state)
    }

    /// max |a − b| / max |b|.
    fn relative(a: &[f32], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        let diff = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y).abs())
            .fold(0.0, f64::max);
        let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
        diff / scale
    }

    #[test]
    fn both_forms_agree_with_the_per_token_recurrence_over_4096_tokens() {
        let n = 4096;
        let case = Case::new(n, 7);
        let (want_y, want_state) = reference(&case, n);

        for kernels in paths(4) {
            let isa = kernels.isa;
            let mut state = case.state.clone();
            let y = recurrent(&case.shape, &case.inputs(0, n), &mut state, &kernels).unwrap();
            let (ry, rs) = (relative(&y, &want_y), relative(&state, &want_state));
            assert!(
                ry < 1e-5 && rs < 1e-5,
                "recurrent {isa:?}: y {ry:e}, state {rs:e}"
            );

            let mut state = case.state.clone();
            let y = chunked(&case.shape, &case.inputs(0, n), &mut state, 0, &kernels).unwrap();
            let (cy, cs) = (relative(&y, &want_y), relative(&state, &want_state));
            eprintln!(
                "{isa:?}: recurrent y {ry:.1e} state {rs:.1e}, chunked y {cy:.1e} state {cs:.1e}"
            );
            assert!(
                cy < 1e-5 && cs < 1e-5,
                "chunked {isa:?}: y {cy:e}, state {cs:e}"
            );
        }
    }

    /// Rows of `per_head` values per value head of each of `rows`, moved from grouped order (head
    /// `g·per + i` of key head `g`) to tiled order (`i·key_heads + g`).
    fn tile(x: &[f32], shape: &DeltaShape, per_head: usize) -> Vec<f32> {
        let (kh, vh) = (shape.key_heads, shape.value_heads);
        let per = vh / kh;
        let mut out = vec![0.0; x.len()];
        for (src, dst) in x.chunks(vh * per_head).zip(out.chunks_mut(vh * per_head)) {
            for h in 0..vh {
                let t = (h % per) * kh + h / per;
                dst[t * per_head..(t + 1) * per_head]
                    .copy_from_slice(&src[h * per_head..(h + 1) * per_head]);
            }
        }
        out
    }

    #[test]
    fn tiled_value_heads_compute_the_grouped_rule_with_the_heads_moved() {
        let n = 100;
        let case = Case::new(n, 5);
        let sh = case.shape;
        let tiled_shape = DeltaShape { tiled: true, ..sh };
        let v = tile(&case.v, &sh, sh.value_dim);
        let log_decay = tile(&case.log_decay, &sh, 1);
        let beta = tile(&case.beta, &sh, 1);
        let tiled_inputs = DeltaInputs {
            q: &case.q,
            k: &case.k,
            v: &v,
            log_decay: &log_decay,
            beta: &beta,
        };
        let state_len = sh.value_dim * sh.key_dim;
        for kernels in paths(2) {
            for chunk in [false, true] {
                let mut grouped_state = case.state.clone();
                let mut tiled_state = tile(&case.state, &sh, state_len);
                let (grouped, tiled) = if chunk {
                    (
                        chunked(&sh, &case.inputs(0, n), &mut grouped_state, 0, &kernels),
                        chunked(&tiled_shape, &tiled_inputs, &mut tiled_state, 0, &kernels),
                    )
                } else {
                    (
                        recurrent(&sh, &case.inputs(0, n), &mut grouped_state, &kernels),
                        recurrent(&tiled_shape, &tiled_inputs, &mut tiled_state, &kernels),
                    )
                };
                let (grouped, tiled) = (grouped.unwrap(), tiled.unwrap());
                assert_eq!(tiled, tile(&grouped, &sh, sh.value_dim), "chunked: {chunk}");
                assert_eq!(tiled_state, tile(&grouped_state, &sh, state_len));
            }
        }
    }

    #[test]
    fn chunks_follow_the_grid_of_absolute_positions_and_resume_from_any_split() {
        let n = 300;
        let case = Case::new(n, 11);
        let (want_y, want_state) = reference(&case, n);
        // Prefilled in uneven pieces (a partial chunk first, then pieces across the grid), with
        // a decode step between: the same outputs as the whole run.
        for kernels in paths(2) {
            let one = Kernels {
                threads: 1,
                ..kernels
            };
            let three = Kernels {
                threads: 3,
                ..kernels
            };
            let mut state = case.state.clone();
            let mut y = Vec::new();
            let mut at = 0;
            for piece in [37, 1, 90, 128, 44] {
                let inputs = case.inputs(at, at + piece);
                y.extend(if piece == 1 {
                    recurrent(&case.shape, &inputs, &mut state, &kernels).unwrap()
                } else {
                    chunked(&case.shape, &inputs, &mut state, at, &kernels).unwrap()
                });
                at += piece;
            }
            assert_eq!(at, n);
            let (ry, rs) = (relative(&y, &want_y), relative(&state, &want_state));
            assert!(ry < 1e-5 && rs < 1e-5, "pieces: y {ry:e}, state {rs:e}");
            // Aligned pieces compute the very chunks the whole run does: the same bits.
            let mut whole_state = case.state.clone();
            let whole =
                chunked(&case.shape, &case.inputs(0, 256), &mut whole_state, 0, &one).unwrap();
            let mut split_state = case.state.clone();
            let mut split =
                chunked(&case.shape, &case.inputs(0, 128), &mut split_state, 0, &one).unwrap();
            split.extend(
                chunked(
                    &case.shape,
                    &case.inputs(128, 256),
                    &mut split_state,
                    128,
                    &three,
                )
                .unwrap(),
            );
            assert_eq!(whole, split);
            assert_eq!(whole_state, split_state);
        }
    }

    #[test]
    fn the_prefill_form_comes_from_its_variable() {
        let form = |value: Option<&str>| {
            PrefillForm::from_lookup(|name| {
                assert_eq!(name, "MLXCEL_DELTA_PREFILL");
                value.map(str::to_owned)
            })
        };
        assert_eq!(form(None).unwrap(), PrefillForm::Recurrent);
        assert_eq!(form(Some("recurrent")).unwrap(), PrefillForm::Recurrent);
        assert_eq!(form(Some("chunked")).unwrap(), PrefillForm::Chunked);
        let err = form(Some("wy")).unwrap_err().to_string();
        assert!(
            err.contains("MLXCEL_DELTA_PREFILL") && err.contains("wy"),
            "{err}"
        );
    }

    #[test]
    fn the_convolution_carries_its_tail_across_steps() {
        let (channels, taps, n) = (3, 4, 7);
        let mut rng = Lcg(3);
        let x = rng.vec(n * channels);
        let weight = rng.vec(channels * taps);
        for kernels in paths(2) {
            // Whole, from zeros.
            let mut tail = vec![0f32; (taps - 1) * channels];
            let whole = causal_conv_silu(&x, channels, &weight, taps, &mut tail, &kernels).unwrap();
            // The definition: out[t][c] = silu(Σ_j w[c][j] · x[t + j − (taps − 1)][c]).
            for t in 0..n {
                for c in 0..channels {
                    let mut acc = 0f32;
                    for j in 0..taps {
                        if let Some(r) = (t + j).checked_sub(taps - 1) {
                            acc += weight[c * taps + j] * x[r * channels + c];
                        }
                    }
                    assert!((whole[t * channels + c] - silu(acc)).abs() < 1e-6);
                }
            }
            // In steps (one shorter than the tail, then one, then the rest), the tail carried:
            // the same values.
            let mut tail2 = vec![0f32; (taps - 1) * channels];
            let mut parts = Vec::new();
            for (from, to) in [(0, 2), (2, 3), (3, n)] {
                parts.extend(
                    causal_conv_silu(
                        &x[from * channels..to * channels],
                        channels,
                        &weight,
                        taps,
                        &mut tail2,
                        &kernels,
                    )
                    .unwrap(),
                );
            }
            assert_eq!(whole, parts);
            assert_eq!(tail, tail2);
            assert_eq!(&tail[..], &x[(n - 3) * channels..]);
        }
    }
}
