//! `fast::scaled_dot_product_attention` against naive softmax attention, with GQA shapes.

use mlxcel_core::Array;
use mlxcel_core::fast::{AttentionMask, scaled_dot_product_attention};

use crate::{assert_close, pseudo_random};

struct Shapes {
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
}

/// Naive attention for batch 1. `mask(q, k)` is added to the score (0 or -inf).
fn attention_ref(
    s: &Shapes,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    mask: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    attention_ref_capped(s, q, k, v, scale, None, mask)
}

/// [`attention_ref`] with Gemma 2's soft-capping of the scaled scores.
fn attention_ref_capped(
    s: &Shapes,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    cap: Option<f32>,
    mask: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    attention_ref_sinks(s, q, k, v, scale, cap, &[], mask)
}

/// [`attention_ref_capped`] with attention sinks (`sinks` empty: none): head h's softmax runs
/// over its masked scores and `sinks[h]`, and the sink's weight is dropped (no value).
#[allow(clippy::too_many_arguments)]
fn attention_ref_sinks(
    s: &Shapes,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    cap: Option<f32>,
    sinks: &[f32],
    mask: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let d = s.head_dim;
    let group = s.heads / s.kv_heads;
    let mut out = vec![0.0; s.heads * s.queries * d];
    for h in 0..s.heads {
        let kvh = h / group;
        for i in 0..s.queries {
            let qrow = &q[(h * s.queries + i) * d..][..d];
            let scores: Vec<f32> = (0..s.keys)
                .map(|j| {
                    let krow = &k[(kvh * s.keys + j) * d..][..d];
                    let score = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f32>() * scale;
                    let score = cap.map_or(score, |c| c * (score / c).tanh());
                    score + mask(i, j)
                })
                .collect();
            let sink = sinks.get(h).copied();
            let max = scores
                .iter()
                .cloned()
                .chain(sink)
                .fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f32 = weights.iter().sum::<f32>() + sink.map_or(0.0, |x| (x - max).exp());
            for (j, w) in weights.iter().enumerate() {
                let vrow = &v[(kvh * s.keys + j) * d..][..d];
                for (o, x) in out[(h * s.queries + i) * d..][..d].iter_mut().zip(vrow) {
                    *o += w / total * x;
                }
            }
        }
    }
    out
}

fn run(s: &Shapes, mask: AttentionMask<'_>, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let q = pseudo_random(s.heads * s.queries * s.head_dim, seed);
    let k = pseudo_random(s.kv_heads * s.keys * s.head_dim, seed + 1);
    let v = pseudo_random(s.kv_heads * s.keys * s.head_dim, seed + 2);
    let dims = |h: usize, n: usize| [1, h as i32, n as i32, s.head_dim as i32];
    let out = scaled_dot_product_attention(
        &Array::from_f32(&q, &dims(s.heads, s.queries)).unwrap(),
        &Array::from_f32(&k, &dims(s.kv_heads, s.keys)).unwrap(),
        &Array::from_f32(&v, &dims(s.kv_heads, s.keys)).unwrap(),
        1.0 / (s.head_dim as f32).sqrt(),
        mask,
    )
    .unwrap();
    assert_eq!(out.shape(), dims(s.heads, s.queries));
    (out.to_vec_f32().unwrap(), q, k, v)
}

#[test]
fn sdpa_without_mask_matches_naive_attention_with_gqa() {
    let s = Shapes {
        heads: 6,
        kv_heads: 2,
        queries: 3,
        keys: 5,
        head_dim: 8,
    };
    let (out, q, k, v) = run(&s, AttentionMask::None, 31);
    let expected = attention_ref(&s, &q, &k, &v, 1.0 / 8f32.sqrt(), |_, _| 0.0);
    assert_close(&out, &expected, 1e-5);
}

#[test]
fn causal_mask_aligns_queries_to_the_newest_keys() {
    // Prefill (queries == keys), chunked prefill over a cache, and one decode step.
    for (queries, keys) in [(4, 4), (3, 7), (1, 6)] {
        let s = Shapes {
            heads: 4,
            kv_heads: 2,
            queries,
            keys,
            head_dim: 8,
        };
        let (out, q, k, v) = run(&s, AttentionMask::Causal, 41);
        let past = keys - queries;
        let expected = attention_ref(&s, &q, &k, &v, 1.0 / 8f32.sqrt(), |i, j| {
            if j <= i + past {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        });
        assert_close(&out, &expected, 1e-5);
    }
}

#[test]
fn additive_mask_array_is_added_to_the_scores() {
    let s = Shapes {
        heads: 3,
        kv_heads: 1,
        queries: 2,
        keys: 4,
        head_dim: 4,
    };
    // Query 0 sees keys 0 and 2; query 1 sees keys 1..4 with a penalty on key 3.
    let mask_values = [
        0.0,
        f32::NEG_INFINITY,
        0.0,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
        0.0,
        0.0,
        -1.5,
    ];
    let mask = Array::from_f32(&mask_values, &[2, 4]).unwrap();
    let (out, q, k, v) = run(&s, AttentionMask::Array(&mask), 51);
    let expected = attention_ref(&s, &q, &k, &v, 1.0 / 2.0, |i, j| {
        mask_values[i * s.keys + j]
    });
    assert_close(&out, &expected, 1e-5);
}

#[test]
fn boolean_mask_array_keeps_true_positions() {
    let s = Shapes {
        heads: 2,
        kv_heads: 2,
        queries: 2,
        keys: 3,
        head_dim: 4,
    };
    let keep = [true, false, true, false, true, true];
    let bytes: Vec<u8> = keep.iter().map(|&k| k as u8).collect();
    let mask = Array::from_bytes(&bytes, &[2, 3], mlxcel_core::Dtype::Bool).unwrap();
    let (out, q, k, v) = run(&s, AttentionMask::Array(&mask), 61);
    let expected = attention_ref(&s, &q, &k, &v, 0.5, |i, j| {
        if keep[i * s.keys + j] {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    });
    assert_close(&out, &expected, 1e-5);
}

/// mlxcel's attention kernel against the naive reference, on every path and 1–2 threads, with
/// grouped-query heads, causal and unmasked, keys read in place from a strided cache slice, and
/// long key ranges split into partial results and merged.
/// `attention_native` on `(values, array)` queries, keys and values, with and without the causal
/// mask, on every path in `paths` and on one and two threads, against [`attention_ref`] on the
/// values the arrays hold (tolerance 1e-5).
fn assert_native_matches_reference(
    s: &Shapes,
    (q, qa): (&[f32], &Array),
    (k, ka): (&[f32], &Array),
    (v, va): (&[f32], &Array),
    paths: &[mlxcel_core::Isa],
) {
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    for causal in [false, true] {
        let offset = s.keys - s.queries;
        let expected = attention_ref(s, q, k, v, scale, |i, j| {
            if causal && j > offset + i {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        });
        for &isa in paths {
            for threads in [1, 2] {
                let got =
                    mlxcel_core::fast::attention_native(qa, ka, va, scale, causal, isa, threads)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                assert_close(&got, &expected, 1e-5);
            }
        }
    }
}

/// Tolerance 1e-5 (absolute + relative): f32 throughout, a polynomial exponential (~1e-7).
#[test]
fn native_attention_matches_naive_attention_on_every_path() {
    use mlxcel_core::Isa;
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    for (heads, kv_heads, queries, keys, head_dim) in [
        (9, 3, 1, 1, 64),
        (9, 3, 1, 37, 64),
        (4, 2, 5, 5, 16),
        (6, 2, 13, 40, 32),
        (2, 1, 70, 70, 64),
        // Key blocks of 16 with a tail, key ranges split across tasks, D = 128, and a group
        // of six heads per kv head (beyond the AVX-512 fast path's four).
        (9, 3, 1, 300, 64),
        (9, 3, 3, 131, 64),
        (8, 2, 2, 97, 128),
        (12, 2, 1, 150, 64),
        // Seven heads per kv head (the AVX2 kernel's groups of four and three).
        (14, 2, 2, 97, 64),
        // Eight and five heads per kv head (Qwen2.5-3B's 16 over 2 at D = 128): the AVX-512
        // fast path's two passes over the values, the second of four heads or of one.
        (16, 2, 3, 300, 128),
        (8, 1, 2, 97, 64),
        (10, 2, 1, 150, 128),
        // Several 256-key ranges; causal rows whose keys end before the last range starts
        // (empty partials in the merge).
        (9, 3, 2, 700, 64),
        (4, 2, 300, 300, 64),
        // The AVX2 fast path's other head sizes (value tiles of 6 and 8 vectors).
        (6, 2, 3, 45, 96),
        (4, 1, 2, 21, 256),
    ] {
        let s = Shapes {
            heads,
            kv_heads,
            queries,
            keys,
            head_dim,
        };
        let seed = (heads * 1000 + queries * 10 + keys) as u64;
        let q = pseudo_random(heads * queries * head_dim, seed);
        let k = pseudo_random(kv_heads * keys * head_dim, seed + 1);
        let v = pseudo_random(kv_heads * keys * head_dim, seed + 2);
        let (h, kh, n, l, d) = (
            heads as i32,
            kv_heads as i32,
            queries as i32,
            keys as i32,
            head_dim as i32,
        );
        let qa = Array::from_f32(&q, &[1, h, n, d]).unwrap();
        // The keys and values as the first `keys` positions of a larger cache.
        let pad = |data: &[f32]| -> Array {
            let full = Array::from_f32(data, &[1, kh, l, d]).unwrap();
            let extra = Array::zeros(&[1, kh, 7, d], mlxcel_core::Dtype::F32).unwrap();
            Array::concatenate(&[&full, &extra], 2)
                .unwrap()
                .slice(&[0, 0, 0, 0], &[1, kh, l, d])
                .unwrap()
        };
        let (ka, va) = (pad(&k), pad(&v));
        assert_native_matches_reference(&s, (&q, &qa), (&k, &ka), (&v, &va), &paths);
    }
}

/// The tokens-major variant reads a prefix of whole cache arrays and lays heads side by side:
/// it equals the heads-major kernel on sliced keys, transposed and reshaped.
#[test]
fn native_attention_tokens_major_reads_a_cache_prefix() {
    use mlxcel_core::Isa;
    use mlxcel_core::fast::{attention_native, attention_native_tokens_major};
    let (h, kh, n, l, d, allocated) = (6, 2, 3, 10, 16, 16);
    let q = Array::from_f32(
        &pseudo_random(h * n * d, 1),
        &[1, h as i32, n as i32, d as i32],
    )
    .unwrap();
    let shape = [1, kh as i32, allocated, d as i32];
    let k = Array::from_f32(&pseudo_random(kh * allocated as usize * d, 2), &shape).unwrap();
    let v = Array::from_f32(&pseudo_random(kh * allocated as usize * d, 3), &shape).unwrap();
    let prefix = |a: &Array| {
        a.slice(&[0, 0, 0, 0], &[1, kh as i32, l as i32, d as i32])
            .unwrap()
    };
    for causal in [false, true] {
        let expected = attention_native(&q, &prefix(&k), &prefix(&v), 0.25, causal, Isa::Scalar, 1)
            .unwrap()
            .transpose(&[0, 2, 1, 3])
            .unwrap()
            .reshape(&[n as i32, (h * d) as i32])
            .unwrap();
        for isa in [Isa::Scalar, Isa::best()] {
            let got =
                attention_native_tokens_major(&q, &k, &v, l, 0.25, causal, None, None, isa, 2)
                    .unwrap();
            assert_eq!(got.shape(), [n as i32, (h * d) as i32]);
            assert_close(
                &got.to_vec_f32().unwrap(),
                &expected.to_vec_f32().unwrap(),
                1e-5,
            );
        }
    }
}

/// A sliding window (and Gemma 2's soft-capping, where given) on mlxcel's kernel: query i (at
/// position L − n + i) sees only the `window` positions ending at its own, on every path (D = 64 takes AVX-512's blocked kernel, D = 16 the
/// loops) and across the 256-key ranges the kernel splits long caches into.
#[test]
fn native_attention_with_a_sliding_window_matches_the_masked_reference() {
    use mlxcel_core::Isa;
    use mlxcel_core::fast::attention_native_tokens_major;
    let cases = [
        (64, 5, 300, 100, None),
        (16, 3, 40, 7, Some(0.5)),
        (64, 1, 520, 300, Some(0.3)),
        (16, 1, 9, 20, None),
        (128, 4, 50, 64, Some(0.4)),
    ];
    for (d, n, l, window, cap) in cases {
        let s = Shapes {
            heads: 4,
            kv_heads: 2,
            queries: n,
            keys: l,
            head_dim: d,
        };
        let q = pseudo_random(s.heads * n * d, 5);
        let k = pseudo_random(s.kv_heads * l * d, 6);
        let v = pseudo_random(s.kv_heads * l * d, 7);
        let scale = 1.0 / (d as f32).sqrt();
        let expected = attention_ref_capped(&s, &q, &k, &v, scale, cap, |i, j| {
            let query = l - n + i;
            if j <= query && j + window > query {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        });
        // Reference rows are head-major; the kernel's output is tokens-major.
        let mut expected_tokens_major = vec![0.0; expected.len()];
        for h in 0..s.heads {
            for i in 0..n {
                expected_tokens_major[(i * s.heads + h) * d..][..d]
                    .copy_from_slice(&expected[(h * n + i) * d..][..d]);
            }
        }
        let dims = |h: usize, len: usize| [1, h as i32, len as i32, d as i32];
        let qa = Array::from_f32(&q, &dims(s.heads, n)).unwrap();
        let ka = Array::from_f32(&k, &dims(s.kv_heads, l)).unwrap();
        let va = Array::from_f32(&v, &dims(s.kv_heads, l)).unwrap();
        for isa in [Isa::Scalar, Isa::Avx2, Isa::best()] {
            let got = attention_native_tokens_major(
                &qa,
                &ka,
                &va,
                l,
                scale,
                n > 1,
                Some(window),
                cap,
                isa,
                2,
            )
            .unwrap();
            assert_close(&got.to_vec_f32().unwrap(), &expected_tokens_major, 1e-5);
        }
    }
}

/// f16 caches: the kernel widens each half exactly, so its result is the f32 kernel's on the
/// widened keys and values, bit for bit, on every path, thread count and head grouping, for
/// f16 keys, f16 values or both, with causal rows, sliding windows and soft-capping, across the
/// 256-key ranges (D = 16 takes the plain loops, the others the blocked kernels of the AVX2 and
/// AVX-512 paths).
#[test]
fn f16_caches_give_the_f32_kernels_bits_on_the_widened_values() {
    use mlxcel_core::fast::attention_native_tokens_major;
    use mlxcel_core::{Dtype, Isa};
    let cases = [
        // (heads, kv_heads, queries, keys, head_dim, window, softcap)
        (9, 3, 1, 37, 64, None, None),
        (8, 8, 2, 300, 64, None, None),
        (8, 4, 3, 131, 128, Some(50), None),
        (14, 2, 1, 700, 64, None, Some(0.5)),
        (10, 2, 4, 45, 96, None, None),
        (4, 1, 2, 21, 256, None, None),
        (6, 2, 3, 40, 16, Some(9), Some(0.3)),
        (32, 8, 1, 520, 64, None, None),
        (16, 2, 2, 300, 128, None, None),
        (10, 2, 3, 131, 64, Some(50), Some(0.5)),
    ];
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    for (i, &(h, kh, n, l, d, window, cap)) in cases.iter().enumerate() {
        let seed = 900 + i as u64 * 3;
        let dims = |heads: usize, len: usize| [1, heads as i32, len as i32, d as i32];
        let q = Array::from_f32(&pseudo_random(h * n * d, seed), &dims(h, n)).unwrap();
        // Keys of many magnitudes, some subnormal as halves (finite scores throughout).
        let spread = |data: Vec<f32>| -> Vec<f32> {
            data.iter()
                .enumerate()
                .map(|(j, x)| x * [1.0, 1e-6, 20.0, 3e-5, 0.01][j % 5])
                .collect()
        };
        let k32 =
            Array::from_f32(&spread(pseudo_random(kh * l * d, seed + 1)), &dims(kh, l)).unwrap();
        let v32 = Array::from_f32(&pseudo_random(kh * l * d, seed + 2), &dims(kh, l)).unwrap();
        let (k16, v16) = (
            k32.astype(Dtype::F16).unwrap(),
            v32.astype(Dtype::F16).unwrap(),
        );
        let widened = |a: &Array| a.astype(Dtype::F32).unwrap();
        for (k, v) in [(&k16, &v16), (&k16, &v32), (&k32, &v16)] {
            let (kw, vw) = (widened(k), widened(v));
            for &isa in &paths {
                for threads in [1, 2] {
                    let run = |k: &Array, v: &Array| {
                        attention_native_tokens_major(
                            &q,
                            k,
                            v,
                            l,
                            1.0 / (d as f32).sqrt(),
                            n > 1,
                            window,
                            cap,
                            isa,
                            threads,
                        )
                        .unwrap()
                        .to_vec_f32()
                        .unwrap()
                    };
                    let (got, expected) = (run(k, v), run(&kw, &vw));
                    assert!(expected.iter().all(|x| x.is_finite()), "case {i}");
                    let same = got
                        .iter()
                        .zip(&expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "case {i} ({:?}/{:?}) on {isa:?}, {threads} threads",
                        k.dtype(),
                        v.dtype()
                    );
                }
            }
        }
    }
}

/// The rounding the fused layer applies when it writes an f16 cache is MLX's `astype(float16)`
/// (round to nearest, ties to even), over a sweep of every 65,537th f32 bit pattern (all
/// exponents, both signs) and the hard cases: ties in normal and subnormal halves, the overflow
/// threshold, infinities and NaN.
#[test]
fn f16_cache_writes_round_as_mlx_does() {
    use mlxcel_core::{Dtype, f16_cache_bits};
    let mut values: Vec<f32> = (0..=u32::MAX / 65_537)
        .map(|i| f32::from_bits(i.wrapping_mul(65_537)))
        .collect();
    for base in [1.0f32, 1.5, 1024.0, 6.1035156e-5, 3.0517578e-5, 65504.0] {
        let bits = base.to_bits();
        // Exactly halfway between two halves (13 dropped bits = 0x1000), and one ulp around it.
        for delta in [0x0FFFu32, 0x1000, 0x1001, 0x3000, 0x2000] {
            values.push(f32::from_bits(bits + delta));
            values.push(-f32::from_bits(bits + delta));
        }
    }
    values.extend([
        65519.0,
        65520.0,
        65536.0,
        1e-8,
        2.9802322e-8,
        2.9802326e-8,
        5.9604645e-8,
        8.940697e-8,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
    ]);
    let ours = f16_cache_bits(&values);
    let bytes: Vec<u8> = ours.iter().flat_map(|h| h.to_le_bytes()).collect();
    let ours = Array::from_bytes(&bytes, &[values.len() as i32], Dtype::F16)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let mlx = Array::from_f32(&values, &[values.len() as i32])
        .unwrap()
        .astype(Dtype::F16)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    for ((x, a), b) in values.iter().zip(&ours).zip(&mlx) {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{x:e} ({:#010x}): ours {a:e}, MLX {b:e}",
            x.to_bits()
        );
    }
}

/// q8_0 keys and values (uint8 rows of 34-byte blocks, as `--cache-type-k/-v q8_0` caches hold
/// them), alone and beside f32 and f16 ones: on every path and 1–2 threads, the kernel equals
/// naive attention on the dequantized values (q · d, exact in f32), through the fast paths' head
/// sizes (64 and 128 on AVX-512; 64, 96, 128 and 256 on AVX2), the generic loops (D = 32), groups
/// beyond four heads, and several 256-key ranges. The quantizer is the kernels' (the fused layer
/// writes with the same arithmetic; `quantize_q8_0`).
#[test]
fn native_attention_reads_q8_0_keys_and_values_on_every_path() {
    use mlxcel_core::fast::attention_native;
    use mlxcel_core::{Dtype, Isa, dequantize_q8_0, quantize_q8_0};
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Side {
        F32,
        F16,
        Q8,
    }
    for (heads, kv_heads, queries, keys, head_dim, k_side, v_side) in [
        (9, 3, 1, 37, 64, Side::Q8, Side::Q8),
        (9, 3, 3, 300, 64, Side::Q8, Side::Q8),
        (16, 2, 2, 300, 128, Side::Q8, Side::Q8),
        (10, 2, 1, 97, 64, Side::F16, Side::Q8),
        (8, 2, 2, 97, 128, Side::Q8, Side::F16),
        (6, 2, 3, 45, 96, Side::F32, Side::Q8),
        (4, 1, 2, 21, 256, Side::Q8, Side::Q8),
        (12, 2, 1, 150, 64, Side::Q8, Side::F32),
        (4, 2, 5, 40, 32, Side::Q8, Side::Q8),
        (2, 1, 70, 600, 64, Side::F16, Side::Q8),
    ] {
        let s = Shapes {
            heads,
            kv_heads,
            queries,
            keys,
            head_dim,
        };
        let seed = (heads * 1000 + queries * 10 + keys + head_dim) as u64;
        let q = pseudo_random(heads * queries * head_dim, seed);
        // Scaled up so that blocks' scales and codes vary (q8_0's error is relative to each
        // block's largest value).
        let k: Vec<f32> = pseudo_random(kv_heads * keys * head_dim, seed + 1)
            .iter()
            .enumerate()
            .map(|(i, x)| x * (1.0 + (i % 7) as f32))
            .collect();
        let v = pseudo_random(kv_heads * keys * head_dim, seed + 2);
        let (h, kh, n, l, d) = (
            heads as i32,
            kv_heads as i32,
            queries as i32,
            keys as i32,
            head_dim as i32,
        );
        // The values the kernel reads, and the array that holds them.
        let stored = |data: &[f32], side: Side| -> (Vec<f32>, Array) {
            match side {
                Side::F32 => (
                    data.to_vec(),
                    Array::from_f32(data, &[1, kh, l, d]).unwrap(),
                ),
                Side::F16 => {
                    let a = Array::from_f32(data, &[1, kh, l, d])
                        .unwrap()
                        .astype(Dtype::F16)
                        .unwrap();
                    (a.to_vec_f32().unwrap(), a)
                }
                Side::Q8 => {
                    let bytes = quantize_q8_0(data);
                    assert_eq!(bytes.len(), data.len() / 32 * 34);
                    let row = (head_dim / 32 * 34) as i32;
                    (
                        dequantize_q8_0(&bytes),
                        Array::from_bytes(&bytes, &[1, kh, l, row], Dtype::U8).unwrap(),
                    )
                }
            }
        };
        let (kw, ka) = stored(&k, k_side);
        let (vw, va) = stored(&v, v_side);
        if k_side == Side::Q8 {
            // q8_0 moves each value by at most half a step of its block's scale.
            let worst = k
                .iter()
                .zip(&kw)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst > 0.0 && worst < 8.0 / 254.0 + 1e-6, "{worst}");
        }
        let qa = Array::from_f32(&q, &[1, h, n, d]).unwrap();
        assert_native_matches_reference(&s, (&q, &qa), (&kw, &ka), (&vw, &va), &paths);
    }
    // Rows that are not whole blocks are refused.
    let q = Array::from_f32(&pseudo_random(2 * 48, 1), &[1, 2, 1, 48]).unwrap();
    let k = Array::from_bytes(&[0u8; 2 * 4 * 51], &[1, 2, 4, 51], Dtype::U8).unwrap();
    let err = attention_native(&q, &k, &k, 0.1, false, Isa::Scalar, 1)
        .and_then(|a| a.to_vec_f32())
        .unwrap_err()
        .to_string();
    assert!(err.contains("q8_0"), "{err}");
}

/// Attention sinks on mlxcel's kernel: each head's extra logit joins its softmax's denominator
/// (and no value), on every path and 1–2 threads, for f32, f16 and q8_0 keys and values, causal
/// rows, sliding windows and soft-capping, decode and prefill, across several 256-key ranges
/// (the sink joins where the ranges' partials are merged), with sinks below, among and above the
/// scores; against naive attention on the values the kernel reads (tolerance 1e-5).
#[test]
fn native_attention_with_sinks_matches_the_reference_on_every_path() {
    use mlxcel_core::fast::{Scores, attention_native_scored};
    use mlxcel_core::{Dtype, Isa, dequantize_q8_0, quantize_q8_0};
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    // (heads, kv_heads, queries, keys, head_dim, window, softcap, kv type: 0 f32, 1 f16, 2 q8_0)
    let cases = [
        (8, 2, 1, 37, 64, None, None, 0),
        (8, 2, 5, 300, 64, Some(128), None, 0),
        (4, 1, 3, 520, 128, None, None, 1),
        (6, 2, 1, 700, 64, Some(128), None, 2),
        (6, 3, 4, 45, 32, None, Some(0.5), 2),
        (4, 2, 2, 131, 16, Some(9), None, 0),
    ];
    for (c, &(h, kh, n, l, d, window, cap, kv)) in cases.iter().enumerate() {
        let s = Shapes {
            heads: h,
            kv_heads: kh,
            queries: n,
            keys: l,
            head_dim: d,
        };
        let seed = 4000 + c as u64 * 5;
        let q = pseudo_random(h * n * d, seed);
        let k = pseudo_random(kh * l * d, seed + 1);
        let v = pseudo_random(kh * l * d, seed + 2);
        // Below every score, among them and above them all.
        let sinks: Vec<f32> = (0..h).map(|i| [-6.0, 0.1, 3.5, -0.4][i % 4]).collect();
        let dims = |heads: usize, len: usize| [1, heads as i32, len as i32, d as i32];
        let stored = |data: &[f32]| -> (Vec<f32>, Array) {
            let a = Array::from_f32(data, &dims(kh, l)).unwrap();
            match kv {
                0 => (data.to_vec(), a),
                1 => {
                    let a = a.astype(Dtype::F16).unwrap();
                    (a.to_vec_f32().unwrap(), a)
                }
                _ => {
                    let bytes = quantize_q8_0(data);
                    let row = (d / 32 * 34) as i32;
                    let a = Array::from_bytes(&bytes, &[1, kh as i32, l as i32, row], Dtype::U8);
                    (dequantize_q8_0(&bytes), a.unwrap())
                }
            }
        };
        let (kw, ka) = stored(&k);
        let (vw, va) = stored(&v);
        let qa = Array::from_f32(&q, &dims(h, n)).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let causal = n > 1;
        let expected = attention_ref_sinks(&s, &q, &kw, &vw, scale, cap, &sinks, |i, j| {
            let query = l - n + i;
            let seen = (!causal || j <= query) && window.is_none_or(|w| j + w > query);
            if seen { 0.0 } else { f32::NEG_INFINITY }
        });
        let without = attention_ref_sinks(&s, &q, &kw, &vw, scale, cap, &[], |i, j| {
            let query = l - n + i;
            let seen = (!causal || j <= query) && window.is_none_or(|w| j + w > query);
            if seen { 0.0 } else { f32::NEG_INFINITY }
        });
        let mut tokens_major = vec![0.0; expected.len()];
        for head in 0..h {
            for i in 0..n {
                tokens_major[(i * h + head) * d..][..d]
                    .copy_from_slice(&expected[(head * n + i) * d..][..d]);
            }
        }
        // The sinks matter: the outputs move by a hundred times the tolerance or more.
        let moved = expected
            .iter()
            .zip(&without)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(moved > 1e-3, "case {c}: sinks move the output by {moved}");
        for &isa in &paths {
            for threads in [1, 2] {
                let scores = Scores {
                    scale,
                    causal,
                    window,
                    softcap: cap,
                    sinks: &sinks,
                };
                let got = attention_native_scored(&qa, &ka, &va, l, scores, isa, threads)
                    .unwrap()
                    .to_vec_f32()
                    .unwrap();
                assert_close(&got, &tokens_major, 1e-5);
            }
        }
    }
    // One logit per query head, or none.
    let q = Array::from_f32(&pseudo_random(2 * 32, 1), &[1, 2, 1, 32]).unwrap();
    let k = Array::from_f32(&pseudo_random(2 * 32, 2), &[1, 1, 2, 32]).unwrap();
    let scores = Scores {
        scale: 0.1,
        causal: false,
        window: None,
        softcap: None,
        sinks: &[0.5],
    };
    let err = attention_native_scored(&q, &k, &k, 2, scores, Isa::Scalar, 1)
        .and_then(|a| a.to_vec_f32())
        .unwrap_err()
        .to_string();
    assert!(err.contains("sinks"), "{err}");
}

/// MLX's attention (`MLXCEL_KERNELS=mlx`) with sinks against the same reference, causal and
/// with a sliding-window mask.
#[test]
fn sdpa_with_sinks_matches_the_reference() {
    use mlxcel_core::fast::scaled_dot_product_attention_with_sinks;
    let s = Shapes {
        heads: 4,
        kv_heads: 2,
        queries: 3,
        keys: 9,
        head_dim: 16,
    };
    let q = pseudo_random(4 * 3 * 16, 71);
    let k = pseudo_random(2 * 9 * 16, 72);
    let v = pseudo_random(2 * 9 * 16, 73);
    let sinks = [-1.0, 0.3, 2.5, -5.0];
    let dims = |h: usize, n: usize| [1, h as i32, n as i32, 16];
    let (qa, ka, va) = (
        Array::from_f32(&q, &dims(4, 3)).unwrap(),
        Array::from_f32(&k, &dims(2, 9)).unwrap(),
        Array::from_f32(&v, &dims(2, 9)).unwrap(),
    );
    let causal = |i: usize, j: usize| if j <= i + 6 { 0.0 } else { f32::NEG_INFINITY };
    let got =
        scaled_dot_product_attention_with_sinks(&qa, &ka, &va, 0.25, AttentionMask::Causal, &sinks)
            .unwrap();
    let expected = attention_ref_sinks(&s, &q, &k, &v, 0.25, None, &sinks, causal);
    assert_close(&got.to_vec_f32().unwrap(), &expected, 1e-5);
    // A window of 4: query i (position 6 + i) sees positions 3 + i ..= 6 + i.
    let window = |i: usize, j: usize| {
        if j <= i + 6 && j + 4 > i + 6 {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    };
    let mask_values: Vec<f32> = (0..3)
        .flat_map(|i| (0..9).map(move |j| window(i, j)))
        .collect();
    let mask = Array::from_f32(&mask_values, &[3, 9]).unwrap();
    let got = scaled_dot_product_attention_with_sinks(
        &qa,
        &ka,
        &va,
        0.25,
        AttentionMask::Array(&mask),
        &sinks,
    )
    .unwrap();
    let expected = attention_ref_sinks(&s, &q, &k, &v, 0.25, None, &sinks, window);
    assert_close(&got.to_vec_f32().unwrap(), &expected, 1e-5);
}

/// Attention over a KV cache's blocks (the per-op graph's path) gives the bits of the same
/// kernel over the blocks concatenated, for decode and a causal prefill chunk, with f32 and f16
/// caches, and with a block that is a strided view (what a step that writes a block whole
/// leaves in it: a slice of that step's keys, laid out `[1, kv_heads, n, D]`).
#[test]
fn native_attention_over_cache_blocks_matches_the_concatenated_cache() {
    use mlxcel_core::fast::{Scores, attention_native_blocks, attention_native_scored};
    use mlxcel_core::{Dtype, Isa, KV_BLOCK};
    let (h, kh, d) = (8, 2, 64);
    let block = KV_BLOCK as i32;
    for dtype in [Dtype::F32, Dtype::F16] {
        for (n, keys) in [(1usize, 700usize), (5, 520), (3, 256)] {
            let blocks = keys.div_ceil(KV_BLOCK);
            let whole = |seed: u64, strided: bool| -> Vec<Array> {
                (0..blocks)
                    .map(|b| {
                        let shape = [1, kh as i32, block, d as i32];
                        let values = pseudo_random(kh * KV_BLOCK * d, seed + b as u64);
                        if strided && b == 0 {
                            // Block 0 as a slice of a longer `[1, kh, 2·block, d]` array.
                            let mut longer = pseudo_random(2 * kh * KV_BLOCK * d, 99);
                            for head in 0..kh {
                                let to = head * 2 * KV_BLOCK * d;
                                let from = head * KV_BLOCK * d;
                                longer[to..to + KV_BLOCK * d]
                                    .copy_from_slice(&values[from..from + KV_BLOCK * d]);
                            }
                            Array::from_f32(&longer, &[1, kh as i32, 2 * block, d as i32])
                                .unwrap()
                                .astype(dtype)
                                .unwrap()
                                .slice(&[0, 0, 0, 0], &shape)
                                .unwrap()
                        } else {
                            Array::from_f32(&values, &shape)
                                .unwrap()
                                .astype(dtype)
                                .unwrap()
                        }
                    })
                    .collect()
            };
            let q = Array::from_f32(
                &pseudo_random(h * n * d, 7),
                &[1, h as i32, n as i32, d as i32],
            )
            .unwrap();
            let scores = Scores {
                scale: 0.125,
                causal: n > 1,
                window: None,
                softcap: None,
                sinks: &[],
            };
            let (k, v) = (whole(10, false), whole(50, false));
            let cat =
                |parts: &[Array]| Array::concatenate(&parts.iter().collect::<Vec<_>>(), 2).unwrap();
            for isa in [Isa::Scalar, Isa::best()] {
                let expected =
                    attention_native_scored(&q, &cat(&k), &cat(&v), keys, scores, isa, 2)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                for strided in [false, true] {
                    let (k, v) = (whole(10, strided), whole(50, strided));
                    let (k, v): (Vec<&Array>, Vec<&Array>) =
                        (k.iter().collect(), v.iter().collect());
                    let got = attention_native_blocks(&q, (&k, &v), keys, scores, isa, 2).unwrap();
                    assert_eq!(got.shape(), [n as i32, (h * d) as i32]);
                    assert_eq!(
                        got.to_vec_f32().unwrap(),
                        expected,
                        "{dtype:?} n={n} keys={keys}"
                    );
                }
            }
        }
    }
}

/// The block form refuses blocks that do not hold the keys, by what is wrong.
#[test]
fn native_attention_over_cache_blocks_refuses_blocks_that_do_not_fit() {
    use mlxcel_core::fast::{Scores, attention_native_blocks};
    use mlxcel_core::{Isa, KV_BLOCK};
    let q = Array::from_f32(&pseudo_random(4 * 16, 1), &[1, 4, 1, 16]).unwrap();
    let full = Array::from_f32(
        &pseudo_random(2 * KV_BLOCK * 16, 2),
        &[1, 2, KV_BLOCK as i32, 16],
    )
    .unwrap();
    let scores = Scores {
        scale: 0.25,
        causal: false,
        window: None,
        softcap: None,
        sinks: &[],
    };
    // Two blocks for 100 keys: the second holds none of them.
    let err = attention_native_blocks(
        &q,
        (&[&full, &full], &[&full, &full]),
        100,
        scores,
        Isa::Scalar,
        1,
    )
    .unwrap_err();
    assert!(err.to_string().contains("blocks hold the keys"), "{err}");
    // More keys than the blocks hold.
    let err = attention_native_blocks(
        &q,
        (&[&full], &[&full]),
        KV_BLOCK + 1,
        scores,
        Isa::Scalar,
        1,
    )
    .unwrap_err();
    assert!(err.to_string().contains("blocks hold the keys"), "{err}");
    // Unequal sides.
    let err = attention_native_blocks(&q, (&[&full], &[&full, &full]), 10, scores, Isa::Scalar, 1)
        .unwrap_err();
    assert!(
        err.to_string().contains("same number of cache blocks"),
        "{err}"
    );
}
