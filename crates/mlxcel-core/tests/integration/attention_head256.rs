//! Head size 256 (Qwen3.5's gated attention, Gemma's) on AVX-512's blocked attention kernel: the
//! same values as the scalar path, which keeps the plain per-key loops, within f32 rounding.

use mlxcel_core::fast::attention_native_tokens_major;
use mlxcel_core::{Array, Dtype, Isa};

use crate::{assert_close, pseudo_random};

/// On AVX-512, D = 256 against the scalar path (tolerance 1e-5, absolute + relative: the two sum
/// the 256 products in different orders and the scalar exponential differs by ~1e-7), on one and
/// two threads, with f32 and f16 caches: one query against 300 keys (decode; full blocks of 16
/// and a tail), nine causal rows (more than the eight rows one pass over the keys takes), groups
/// of one, four (Qwen3.5: 16 heads over 4) and eight heads (two passes of three and one of two
/// over each half of the value row), a sliding window and a soft cap (Gemma 2), and several
/// 256-key ranges split across tasks.
#[test]
fn head_256_fast_path_matches_the_scalar_path() {
    if Isa::best() < Isa::Avx512 {
        return;
    }
    let cases = [
        // (heads, kv_heads, queries, keys, window, softcap)
        (16, 4, 1, 300, None, None),
        (16, 4, 9, 131, None, None),
        (4, 4, 3, 37, None, None),
        (8, 1, 2, 97, None, None),
        (6, 2, 1, 16, None, None),
        (8, 4, 5, 600, Some(50), Some(0.5)),
        (16, 8, 2, 520, None, Some(0.3)),
    ];
    let d = 256;
    for (i, &(h, kh, n, l, window, cap)) in cases.iter().enumerate() {
        let seed = 4_000 + i as u64 * 3;
        let dims = |heads: usize, len: usize| [1, heads as i32, len as i32, d as i32];
        let q = Array::from_f32(&pseudo_random(h * n * d, seed), &dims(h, n)).unwrap();
        let k32 = Array::from_f32(&pseudo_random(kh * l * d, seed + 1), &dims(kh, l)).unwrap();
        let v32 = Array::from_f32(&pseudo_random(kh * l * d, seed + 2), &dims(kh, l)).unwrap();
        let k16 = k32.astype(Dtype::F16).unwrap();
        let v16 = v32.astype(Dtype::F16).unwrap();
        for (k, v) in [(&k32, &v32), (&k16, &v16), (&k16, &v32)] {
            let run = |isa: Isa, threads: usize| {
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
            let expected = run(Isa::Scalar, 1);
            assert!(expected.iter().all(|x| x.is_finite()), "case {i}");
            for threads in [1, 2] {
                let got = run(Isa::Avx512, threads);
                assert_close(&got, &expected, 1e-5);
            }
        }
    }
}
