//! The gated delta rule (the linear attention of gated-DeltaNet layers: Qwen3-Next, Qwen3.5) and
//! its short causal convolution, as host kernels over f32 slices.
//!
//! Per value head, with a matrix state `S` (`value_dim × key_dim`, f32), each token `t` does
//!
//! ```text
//! S ← g_t · S;   u_t = β_t · (v_t − S·k_t);   S ← S + u_t ⊗ k_t;   y_t = S·q_t
//! ```
//!
//! ([`recurrent`], one token after another: decode). [`chunked`] gives the same outputs for a
//! run of tokens in chunks of [`CHUNK`] (prefill), as the reference implementations (the
//! flash-linear-attention kernels, transformers' `torch_chunk_gated_delta_rule`) do: within a
//! chunk the deltas `u` are one triangular solve (the UT transform of the WY representation,
//! `T = (I + A)⁻¹` with `A` strictly lower triangular), split into the part that does not depend
//! on the chunk's incoming state and the part that does, so the state is read and written once
//! per chunk rather than once per token. Chunks lie on a fixed grid of absolute positions (a
//! chunk starts at a multiple of [`CHUNK`]), so a prompt prefilled in pieces that are multiples
//! of [`CHUNK`] long computes the same chunks as one prefilled whole.
//!
//! Every head is independent: the kernels split the value heads over threads.

/// Tokens per chunk of [`chunked`] (the reference implementations' 64).
pub const CHUNK: usize = 64;

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
    /// consecutive value heads, or every `key_heads`-th one when tiled).
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
) -> Vec<f32> {
    let n = x.len() / channels;
    assert_eq!(x.len(), n * channels, "x's length");
    assert_eq!(weight.len(), channels * taps, "weight's length");
    assert_eq!(tail.len(), (taps - 1) * channels, "tail's length");
    let keep = taps - 1;
    // Row r of `tail ‖ x`.
    let row = |r: usize| -> &[f32] {
        if r < keep {
            &tail[r * channels..(r + 1) * channels]
        } else {
            &x[(r - keep) * channels..(r - keep + 1) * channels]
        }
    };
    let mut out = vec![0f32; n * channels];
    for t in 0..n {
        let o = &mut out[t * channels..(t + 1) * channels];
        for j in 0..taps {
            let input = row(t + j);
            for c in 0..channels {
                o[c] += weight[c * taps + j] * input[c];
            }
        }
        for value in o.iter_mut() {
            *value = silu(*value);
        }
    }
    let rows: Vec<f32> = (n..n + keep).flat_map(|r| row(r).to_vec()).collect();
    tail.copy_from_slice(&rows);
    out
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
    threads: usize,
) -> Vec<f32> {
    let n = inputs.tokens(shape);
    per_head(shape, n, state, threads, |h, s, y| {
        recurrent_head(shape, inputs, n, h, s, y)
    })
}

/// [`recurrent`]'s result computed in chunks of [`CHUNK`] tokens on the grid of absolute
/// positions: `position` is the first token's.
pub fn chunked(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    state: &mut [f32],
    position: usize,
    threads: usize,
) -> Vec<f32> {
    let n = inputs.tokens(shape);
    per_head(shape, n, state, threads, |h, s, y| {
        let mut start = 0;
        while start < n {
            let end = n.min(start + CHUNK - (position + start) % CHUNK);
            chunk_head(
                shape,
                inputs,
                start,
                end,
                h,
                s,
                &mut y[start * shape.value_dim..],
            );
            start = end;
        }
    })
}

/// Runs `head(h, state of h, y of h as [n, value_dim])` for every value head, on up to `threads`
/// threads, and interleaves the heads' outputs into `[n, value_heads, value_dim]`.
fn per_head(
    shape: &DeltaShape,
    n: usize,
    state: &mut [f32],
    threads: usize,
    head: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    assert_eq!(state.len(), shape.state_len(), "state's length");
    let (heads, dv) = (shape.value_heads, shape.value_dim);
    let mut outputs = vec![0f32; heads * n * dv];
    let per_state = dv * shape.key_dim;
    let mut work: Vec<(usize, &mut [f32], &mut [f32])> = state
        .chunks_mut(per_state)
        .zip(outputs.chunks_mut(n * dv))
        .enumerate()
        .map(|(h, (s, y))| (h, s, y))
        .collect();
    let threads = threads.clamp(1, heads.max(1));
    if threads == 1 || n * per_state < 1 << 16 {
        for (h, s, y) in work.iter_mut() {
            head(*h, s, y);
        }
    } else {
        let per_thread = heads.div_ceil(threads);
        std::thread::scope(|scope| {
            for group in work.chunks_mut(per_thread) {
                let head = &head;
                scope.spawn(move || {
                    for (h, s, y) in group.iter_mut() {
                        head(*h, s, y);
                    }
                });
            }
        });
    }
    let mut y = vec![0f32; n * heads * dv];
    for (h, out) in outputs.chunks(n * dv).enumerate() {
        for t in 0..n {
            y[(t * heads + h) * dv..(t * heads + h + 1) * dv]
                .copy_from_slice(&out[t * dv..(t + 1) * dv]);
        }
    }
    y
}

/// Token `t`'s key-head row (`[key_dim]`) of `q` or `k` for value head `h`.
fn key_row<'a>(shape: &DeltaShape, x: &'a [f32], t: usize, h: usize) -> &'a [f32] {
    let at = (t * shape.key_heads + shape.key_head(h)) * shape.key_dim;
    &x[at..at + shape.key_dim]
}

/// Token `t`'s value row (`[value_dim]`) of value head `h`.
fn value_row<'a>(shape: &DeltaShape, v: &'a [f32], t: usize, h: usize) -> &'a [f32] {
    let at = (t * shape.value_heads + h) * shape.value_dim;
    &v[at..at + shape.value_dim]
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One value head, token by token (the state `s` is `[value_dim, key_dim]`; `y` `[n,
/// value_dim]`).
fn recurrent_head(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    n: usize,
    h: usize,
    s: &mut [f32],
    y: &mut [f32],
) {
    let (dk, dv) = (shape.key_dim, shape.value_dim);
    for t in 0..n {
        let (q, k) = (
            key_row(shape, inputs.q, t, h),
            key_row(shape, inputs.k, t, h),
        );
        let v = value_row(shape, inputs.v, t, h);
        let g = inputs.log_decay[t * shape.value_heads + h].exp();
        let beta = inputs.beta[t * shape.value_heads + h];
        for i in 0..dv {
            let row = &mut s[i * dk..(i + 1) * dk];
            for x in row.iter_mut() {
                *x *= g;
            }
            let delta = (v[i] - dot(row, k)) * beta;
            for (x, kj) in row.iter_mut().zip(k) {
                *x += kj * delta;
            }
            y[t * dv + i] = dot(row, q);
        }
    }
}

/// One value head over tokens `start..end` (one chunk, at most [`CHUNK`]); `y` starts at the
/// chunk's first row.
///
/// With `Γ_i = exp(Σ_{j≤i} ln g_j)` (the decay from the chunk's start through token `i`) and
/// `S₀` the incoming state, the deltas satisfy `u_i + Σ_{j<i} A_ij u_j = β_i v_i − β_i Γ_i S₀
/// k_i` with `A_ij = β_i (Γ_i/Γ_j) k_i·k_j`; with `T = (I + A)⁻¹` that is `U = T(βV) −
/// T(βΓK) S₀ᵀ`. Then `y_i = Γ_i S₀ q_i + Σ_{j≤i} (Γ_i/Γ_j)(k_j·q_i) u_j` and the outgoing state
/// is `Γ_L S₀ + Σ_j (Γ_L/Γ_j) u_j ⊗ k_j`. Ratios of `Γ` are taken as exponentials of
/// differences of the log sums, so no factor overflows.
fn chunk_head(
    shape: &DeltaShape,
    inputs: &DeltaInputs<'_>,
    start: usize,
    end: usize,
    h: usize,
    s: &mut [f32],
    y: &mut [f32],
) {
    let (dk, dv, len) = (shape.key_dim, shape.value_dim, end - start);
    let heads = shape.value_heads;
    let mut log_gamma = vec![0f32; len];
    let mut sum = 0f32;
    for (i, lg) in log_gamma.iter_mut().enumerate() {
        sum += inputs.log_decay[(start + i) * heads + h];
        *lg = sum;
    }
    let beta: Vec<f32> = (0..len)
        .map(|i| inputs.beta[(start + i) * heads + h])
        .collect();
    let q = |i: usize| key_row(shape, inputs.q, start + i, h);
    let k = |i: usize| key_row(shape, inputs.k, start + i, h);
    let v = |i: usize| value_row(shape, inputs.v, start + i, h);
    // T = (I + A)⁻¹, lower triangular with a unit diagonal, by forward substitution row by row:
    // T_ij = −Σ_{j≤m<i} A_im T_mj.
    let mut a = vec![0f32; len * len];
    for i in 0..len {
        for j in 0..i {
            a[i * len + j] = beta[i] * (log_gamma[i] - log_gamma[j]).exp() * dot(k(i), k(j));
        }
    }
    let mut t = vec![0f32; len * len];
    for i in 0..len {
        t[i * len + i] = 1.0;
        for j in 0..i {
            let mut acc = 0f32;
            for m in j..i {
                acc += a[i * len + m] * t[m * len + j];
            }
            t[i * len + j] = -acc;
        }
    }
    // U = T(βV) − T(βΓK) S₀ᵀ, row by row.
    let mut u = vec![0f32; len * dv];
    let mut kc = vec![0f32; dk];
    for i in 0..len {
        let ui = &mut u[i * dv..(i + 1) * dv];
        kc.fill(0.0);
        for j in 0..=i {
            let w = t[i * len + j] * beta[j];
            if w == 0.0 {
                continue;
            }
            for (x, vj) in ui.iter_mut().zip(v(j)) {
                *x += w * vj;
            }
            let wk = w * log_gamma[j].exp();
            for (x, kj) in kc.iter_mut().zip(k(j)) {
                *x += wk * kj;
            }
        }
        for (r, x) in ui.iter_mut().enumerate() {
            *x -= dot(&s[r * dk..(r + 1) * dk], &kc);
        }
    }
    // y_i = Γ_i S₀ q_i + Σ_{j≤i} (Γ_i/Γ_j)(k_j·q_i) u_j.
    for i in 0..len {
        let gamma = log_gamma[i].exp();
        let yi = &mut y[i * dv..(i + 1) * dv];
        for (r, x) in yi.iter_mut().enumerate() {
            *x = gamma * dot(&s[r * dk..(r + 1) * dk], q(i));
        }
        for j in 0..=i {
            let w = (log_gamma[i] - log_gamma[j]).exp() * dot(k(j), q(i));
            for (x, uj) in yi.iter_mut().zip(&u[j * dv..(j + 1) * dv]) {
                *x += w * uj;
            }
        }
    }
    // S ← Γ_L S₀ + Σ_j (Γ_L/Γ_j) u_j ⊗ k_j.
    let last = log_gamma[len - 1];
    let gamma = last.exp();
    for x in s.iter_mut() {
        *x *= gamma;
    }
    for j in 0..len {
        let w = (last - log_gamma[j]).exp();
        let kj = k(j);
        for r in 0..dv {
            let coefficient = w * u[j * dv + r];
            for (x, kv) in s[r * dk..(r + 1) * dk].iter_mut().zip(kj) {
                *x += coefficient * kv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

        let mut state = case.state.clone();
        let y = recurrent(&case.shape, &case.inputs(0, n), &mut state, 4);
        let (ry, rs) = (relative(&y, &want_y), relative(&state, &want_state));
        assert!(ry < 1e-5 && rs < 1e-5, "recurrent: y {ry:e}, state {rs:e}");

        let mut state = case.state.clone();
        let y = chunked(&case.shape, &case.inputs(0, n), &mut state, 0, 4);
        let (cy, cs) = (relative(&y, &want_y), relative(&state, &want_state));
        assert!(cy < 1e-5 && cs < 1e-5, "chunked: y {cy:e}, state {cs:e}");
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
        for chunk in [false, true] {
            let mut grouped_state = case.state.clone();
            let mut tiled_state = tile(&case.state, &sh, state_len);
            let (grouped, tiled) = if chunk {
                (
                    chunked(&sh, &case.inputs(0, n), &mut grouped_state, 0, 2),
                    chunked(&tiled_shape, &tiled_inputs, &mut tiled_state, 0, 2),
                )
            } else {
                (
                    recurrent(&sh, &case.inputs(0, n), &mut grouped_state, 2),
                    recurrent(&tiled_shape, &tiled_inputs, &mut tiled_state, 2),
                )
            };
            assert_eq!(tiled, tile(&grouped, &sh, sh.value_dim), "chunked: {chunk}");
            assert_eq!(tiled_state, tile(&grouped_state, &sh, state_len));
        }
    }

    #[test]
    fn chunks_follow_the_grid_of_absolute_positions_and_resume_from_any_split() {
        let n = 300;
        let case = Case::new(n, 11);
        let (want_y, want_state) = reference(&case, n);
        // Prefilled in uneven pieces (a partial chunk first, then pieces across the grid), with
        // a decode step between: the same outputs as the whole run.
        let mut state = case.state.clone();
        let mut y = Vec::new();
        let mut at = 0;
        for piece in [37, 1, 90, 128, 44] {
            let inputs = case.inputs(at, at + piece);
            y.extend(if piece == 1 {
                recurrent(&case.shape, &inputs, &mut state, 2)
            } else {
                chunked(&case.shape, &inputs, &mut state, at, 2)
            });
            at += piece;
        }
        assert_eq!(at, n);
        let (ry, rs) = (relative(&y, &want_y), relative(&state, &want_state));
        assert!(ry < 1e-5 && rs < 1e-5, "pieces: y {ry:e}, state {rs:e}");
        // Aligned pieces compute the very chunks the whole run does: the same bits.
        let mut whole_state = case.state.clone();
        let whole = chunked(&case.shape, &case.inputs(0, 256), &mut whole_state, 0, 1);
        let mut split_state = case.state.clone();
        let mut split = chunked(&case.shape, &case.inputs(0, 128), &mut split_state, 0, 1);
        split.extend(chunked(
            &case.shape,
            &case.inputs(128, 256),
            &mut split_state,
            128,
            3,
        ));
        assert_eq!(whole, split);
        assert_eq!(whole_state, split_state);
    }

    #[test]
    fn the_convolution_carries_its_tail_across_steps() {
        let (channels, taps, n) = (3, 4, 7);
        let mut rng = Lcg(3);
        let x = rng.vec(n * channels);
        let weight = rng.vec(channels * taps);
        // Whole, from zeros.
        let mut tail = vec![0f32; (taps - 1) * channels];
        let whole = causal_conv_silu(&x, channels, &weight, taps, &mut tail);
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
        // In two steps, the tail carried: the same values.
        let mut tail2 = vec![0f32; (taps - 1) * channels];
        let mut parts = causal_conv_silu(&x[..2 * channels], channels, &weight, taps, &mut tail2);
        parts.extend(causal_conv_silu(
            &x[2 * channels..],
            channels,
            &weight,
            taps,
            &mut tail2,
        ));
        assert_eq!(whole, parts);
        assert_eq!(tail, tail2);
        assert_eq!(&tail[..], &x[(n - 3) * channels..]);
    }
}
