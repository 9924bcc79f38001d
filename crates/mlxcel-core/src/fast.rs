//! The fused transformer ops of `mlx::core::fast`: RMS norm, rotary embedding, attention.

use crate::array::{Array, call};
use crate::error::Result;
use crate::sys::ffi;

/// `x / sqrt(mean(x², last axis) + eps) * weight`, normalising over the last axis.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
    call("rms_norm", || ffi::rms_norm(x.raw(), weight.raw(), eps))
}

/// Where RoPE's rotation frequencies come from.
#[derive(Debug, Clone)]
pub enum RopeFrequencies {
    /// The standard `base^(-2i/dims)` schedule, e.g. `base = 10000.0` or `500000.0`.
    Base(f32),
    /// Explicit per-pair *periods* (MLX divides positions by them), `dims / 2` entries, f32:
    /// what llama3 rope scaling computes at load time (`mlx_lm`'s `Llama3RoPE._freqs`).
    Custom(Array),
}

/// Rotary position embedding over the first `dims` features of the last axis.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Number of leading features rotated (the head dimension for llama).
    pub dims: i32,
    /// `true`: rotate interleaved pairs `(x[2i], x[2i+1])` (GPT-J / GGUF-permuted weights);
    /// `false`: rotate halves `(x[i], x[i + dims/2])` (Hugging Face llama layout).
    pub traditional: bool,
    /// Multiplier on positions (linear scaling); `1.0` for none.
    pub scale: f32,
    /// The frequency schedule.
    pub frequencies: RopeFrequencies,
}

impl Rope {
    /// Rotates `x` (`[..., seq, dims]`, the sequence on the second-to-last axis) whose first
    /// row sits at absolute position `offset`.
    pub fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        match &self.frequencies {
            RopeFrequencies::Base(base) => call("rope", || {
                ffi::rope(
                    x.raw(),
                    self.dims,
                    self.traditional,
                    *base,
                    self.scale,
                    offset,
                )
            }),
            RopeFrequencies::Custom(freqs) => call("rope", || {
                ffi::rope_with_freqs(
                    x.raw(),
                    self.dims,
                    self.traditional,
                    self.scale,
                    offset,
                    freqs.raw(),
                )
            }),
        }
    }
}

/// The mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every query attends to every key.
    None,
    /// Query `i` attends to keys `0..=i + (keys - queries)` (aligned to the end, as when
    /// the queries are the newest positions of a KV cache).
    Causal,
    /// An additive mask broadcastable to `[batch, heads, queries, keys]` (`0` keeps,
    /// `-inf` drops), or a boolean mask (`true` keeps).
    Array(&'a Array),
}

/// `softmax(q·kᵀ·scale + mask)·v` with `q: [batch, heads, queries, head_dim]` and
/// `k, v: [batch, kv_heads, keys, head_dim]`; `heads` must be a multiple of `kv_heads`
/// (grouped-query attention shares each KV head among `heads / kv_heads` query heads).
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    scaled_dot_product_attention_with_sinks(q, k, v, scale, mask, &[])
}

/// [`scaled_dot_product_attention`] with attention sinks: head `h`'s softmax has one more logit,
/// `sinks[h]`, in its denominator and none among the values (`sinks` empty: none, else one per
/// query head).
pub fn scaled_dot_product_attention_with_sinks(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
    sinks: &[f32],
) -> Result<Array> {
    match mask {
        AttentionMask::None => call("scaled_dot_product_attention", || {
            ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, false, sinks)
        }),
        AttentionMask::Causal => call("scaled_dot_product_attention", || {
            ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, true, sinks)
        }),
        AttentionMask::Array(m) => call("scaled_dot_product_attention", || {
            ffi::sdpa_with_mask(q.raw(), k.raw(), v.raw(), scale, m.raw(), sinks)
        }),
    }
}

/// Attention of one sequence with mlxcel's CPU kernel: `q: [1, heads, n, D]` against
/// `k, v: [1, kv_heads, L, D]` (grouped-query when `kv_heads < heads`), the queries being the last
/// `n` of the `L` positions; `causal` masks keys after each query. `k` and `v` may be strided
/// slices (a KV cache) and are read in place. f32 throughout; the exponential is a polynomial with
/// ~1e-7 relative error.
pub fn attention_native(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    causal: bool,
    isa: crate::Isa,
    threads: usize,
) -> Result<Array> {
    call("native_attention", || {
        ffi::native_attention(
            q.raw(),
            k.raw(),
            v.raw(),
            scale,
            causal,
            0,
            0.0,
            -1,
            false,
            &[],
            isa as u8,
            threads.min(i32::MAX as usize) as i32,
        )
    })
}

/// [`attention_native`] over the first `keys` positions of `k` and `v` (whole KV caches, read
/// in place without a slice op), returning `[n, heads · D]` (tokens first, heads side by side:
/// the layout the output projection takes, without a transpose and a reshape). With a sliding
/// `window`, query `i` sees only its own position and the `window - 1` before it; with a
/// `softcap`, each scaled score `s` becomes `softcap · tanh(s / softcap)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_native_tokens_major(
    q: &Array,
    k: &Array,
    v: &Array,
    keys: usize,
    scale: f32,
    causal: bool,
    window: Option<usize>,
    softcap: Option<f32>,
    isa: crate::Isa,
    threads: usize,
) -> Result<Array> {
    let scores = Scores {
        scale,
        causal,
        window,
        softcap,
        sinks: &[],
    };
    attention_native_scored(q, k, v, keys, scores, isa, threads)
}

/// How [`attention_native_scored`] turns q·k into attention weights.
#[derive(Debug, Clone, Copy)]
pub struct Scores<'a> {
    /// The factor on q·k.
    pub scale: f32,
    /// Query `i` sees no key after its own position.
    pub causal: bool,
    /// Query `i` sees only its own position and the `window - 1` before it.
    pub window: Option<usize>,
    /// Each scaled score `s` becomes `softcap · tanh(s / softcap)`.
    pub softcap: Option<f32>,
    /// Attention sinks: head `h`'s softmax has one more logit, `sinks[h]` (neither scaled nor
    /// capped), in its denominator and none among the values; empty: none, else one per query
    /// head.
    pub sinks: &'a [f32],
}

/// [`attention_native_tokens_major`] with every option of the scores, attention sinks included.
pub fn attention_native_scored(
    q: &Array,
    k: &Array,
    v: &Array,
    keys: usize,
    scores: Scores<'_>,
    isa: crate::Isa,
    threads: usize,
) -> Result<Array> {
    let Scores {
        scale,
        causal,
        window,
        softcap,
        sinks,
    } = scores;
    call("native_attention", || {
        ffi::native_attention(
            q.raw(),
            k.raw(),
            v.raw(),
            scale,
            causal,
            window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            softcap.unwrap_or(0.0),
            keys.min(i32::MAX as usize) as i32,
            true,
            sinks,
            isa as u8,
            threads.min(i32::MAX as usize) as i32,
        )
    })
}

/// [`attention_native_scored`] over a KV cache's blocks (`k_blocks`, `v_blocks`: the same
/// number of `[1, kv_heads, 256, D]` arrays, block `b` holding positions `256·b..`), of which the
/// first `keys` positions are read where they lie: no concatenation into one array, whose copy
/// of every position each step cost more than the attention itself at long contexts. The same
/// kernel and the same key ranges (one block each) as over whole arrays, so the same bits.
/// Returns `[n, heads · D]`.
pub fn attention_native_blocks(
    q: &Array,
    (k_blocks, v_blocks): (&[&Array], &[&Array]),
    keys: usize,
    scores: Scores<'_>,
    isa: crate::Isa,
    threads: usize,
) -> Result<Array> {
    let Scores {
        scale,
        causal,
        window,
        softcap,
        sinks,
    } = scores;
    call("native_attention_blocks", || {
        let list = |blocks: &[&Array]| {
            let mut list = ffi::array_list_new();
            for block in blocks {
                ffi::array_list_push(list.pin_mut(), block.raw());
            }
            list
        };
        // Both lists are built and dropped inside `call`, under the MLX lock.
        let (k_list, v_list) = (list(k_blocks), list(v_blocks));
        ffi::native_attention_blocks(
            q.raw(),
            &k_list,
            &v_list,
            scale,
            causal,
            window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            softcap.unwrap_or(0.0),
            keys.min(i32::MAX as usize) as i32,
            sinks,
            isa as u8,
            threads.min(i32::MAX as usize) as i32,
        )
    })
}

/// Where [`split_heads`] finds its heads, and whether it rotates them.
#[derive(Debug, Clone, Copy)]
pub struct HeadSlice<'a> {
    /// First row (token) of the sequence in the stacked projection.
    pub row: i32,
    /// Rows of the sequence.
    pub rows: i32,
    /// First column of the first head.
    pub column: i32,
    /// Heads to take.
    pub heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// RoPE's inverse frequencies, `[head_dim / 2]` f32 (read only when `rope` is set).
    pub inv_freq: &'a Array,
    /// RoPE (halves layout): the absolute position of the first row, and the position scale.
    pub rope: Option<(i32, f32)>,
}

/// One sequence's heads out of a stacked `[tokens, columns]` projection as
/// `[1, heads, rows, head_dim]`, rotated when asked: mlxcel's CPU kernel for what is otherwise
/// a slice, a reshape, a transpose and [`Rope::apply`] (non-traditional).
pub fn split_heads(qkv: &Array, slice: HeadSlice<'_>) -> Result<Array> {
    let (rope, offset, scale) = match slice.rope {
        Some((offset, scale)) => (true, offset, scale),
        None => (false, 0, 1.0),
    };
    call("split_heads", || {
        ffi::split_heads(
            qkv.raw(),
            slice.inv_freq.raw(),
            slice.row,
            slice.rows,
            slice.column,
            slice.heads,
            slice.head_dim,
            rope,
            offset,
            scale,
        )
    })
}
