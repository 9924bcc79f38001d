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
            let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f32 = weights.iter().sum();
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
/// Tolerance 1e-5 (absolute + relative): f32 throughout, a polynomial exponential (~1e-7).
#[test]
fn native_attention_matches_naive_attention_on_every_path() {
    use mlxcel_core::Isa;
    use mlxcel_core::fast::attention_native;
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
        let scale = 1.0 / (head_dim as f32).sqrt();
        for causal in [false, true] {
            let offset = keys - queries;
            let expected = attention_ref(&s, &q, &k, &v, scale, |i, j| {
                if causal && j > offset + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            });
            for &isa in &paths {
                for threads in [1, 2] {
                    let got = attention_native(&qa, &ka, &va, scale, causal, isa, threads)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                    assert_close(&got, &expected, 1e-5);
                }
            }
        }
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
