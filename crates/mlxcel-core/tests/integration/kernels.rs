//! mlxcel's own quantized-matmul kernels (`cpp/kernels/`) against references: the scalar path
//! against an f64 host computation over the raw packed layout, and every SIMD path and thread count
//! against the scalar path, on random shapes, bit widths and group sizes.
//!
//! Tolerances (documented in docs/kernels.md): the scalar path accumulates Σ (s·q + b)·x in order
//! in f32, so it is held to 2e-6 of Σ|(s·q + b)·x| against f64; the SIMD paths add in a different
//! order (per-lane partial sums, and s·Σq·x + b·Σx in the GEMV) and are held to 1e-5 of the same
//! magnitude against the scalar path.

use mlxcel_core::{Activations, Array, Dtype, Isa, KernelBackend, Kernels, QuantizedWeight};

use crate::pseudo_random;

/// Raw random u32 words, so every nibble and byte value occurs.
fn random_words(n: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 16) as u32
        })
        .collect()
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    group: usize,
    bits: usize,
    packed: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
    x: Vec<f32>,
}

impl Case {
    fn new(m: usize, n: usize, k: usize, group: usize, bits: usize, seed: u64) -> Case {
        let groups = n * k / group;
        Case {
            m,
            n,
            k,
            group,
            bits,
            packed: random_words(n * k * bits / 32, seed),
            scales: pseudo_random(groups, seed + 1)
                .iter()
                .map(|s| s * 0.05)
                .collect(),
            biases: pseudo_random(groups, seed + 2)
                .iter()
                .map(|b| b * 0.5)
                .collect(),
            x: pseudo_random(m * k, seed + 3),
        }
    }

    fn weight(&self) -> QuantizedWeight {
        let (n, k, g) = (self.n as i32, self.k as i32, (self.k / self.group) as i32);
        QuantizedWeight {
            weight: Array::from_u32(&self.packed, &[n, k * self.bits as i32 / 32]).unwrap(),
            scales: Array::from_f32(&self.scales, &[n, g]).unwrap(),
            biases: Array::from_f32(&self.biases, &[n, g]).unwrap(),
            group_size: self.group as i32,
            bits: self.bits as i32,
            int8: false,
            activations: None,
        }
    }

    fn x(&self) -> Array {
        Array::from_f32(&self.x, &[self.m as i32, self.k as i32]).unwrap()
    }

    /// The code of weight `[n][k]` in the raw layout.
    fn code(&self, n: usize, k: usize) -> u32 {
        let per_word = 32 / self.bits;
        let word = self.packed[(n * self.k + k) / per_word];
        (word >> (self.bits * (k % per_word))) & ((1u32 << self.bits) - 1)
    }

    /// Weight `[n][k]` dequantized on the host from the raw layout.
    fn dequantized(&self, n: usize, k: usize) -> f64 {
        let g = n * (self.k / self.group) + k / self.group;
        self.scales[g] as f64 * self.code(n, k) as f64 + self.biases[g] as f64
    }

    /// (value, magnitude Σ|w·x|) per output, in f64.
    fn reference(&self) -> Vec<(f64, f64)> {
        let mut out = Vec::with_capacity(self.m * self.n);
        for m in 0..self.m {
            for n in 0..self.n {
                let (mut value, mut magnitude) = (0.0, 0.0);
                for k in 0..self.k {
                    let term = self.dequantized(n, k) * self.x[m * self.k + k] as f64;
                    value += term;
                    magnitude += term.abs();
                }
                out.push((value, magnitude));
            }
        }
        out
    }
}

#[track_caller]
fn assert_within(actual: &[f32], expected: &[f32], magnitudes: &[f64], rel: f64, what: &str) {
    assert_eq!(actual.len(), expected.len());
    for (i, ((a, e), mag)) in actual.iter().zip(expected).zip(magnitudes).enumerate() {
        let err = (*a as f64 - *e as f64).abs();
        assert!(
            err <= rel * mag + 1e-6,
            "{what}: output {i}: got {a}, expected {e}, error {err:e} > {rel:e}·{mag:e}"
        );
    }
}

/// The shapes exercised: decode (M = 1), small batches on the GEMV path (M ≤ 4), and the GEMM
/// path with partial tiles and blocks in both dimensions.
const SHAPES: &[(usize, usize)] = &[(1, 1), (1, 37), (2, 16), (3, 5), (4, 70), (5, 33), (70, 19)];

#[test]
fn scalar_path_matches_an_f64_reference_over_the_packed_layout() {
    let mut seed = 11;
    for bits in [4, 8] {
        for group in [16, 32, 64, 128] {
            for &(m, n) in SHAPES {
                // Rows are whole 32-value chunks: 2 or 6 groups of 16.
                for groups in if group == 16 { [2, 6] } else { [1, 3] } {
                    seed += 1;
                    let case = Case::new(m, n, group * groups, group, bits, seed);
                    let reference = case.reference();
                    let expected: Vec<f32> = reference.iter().map(|r| r.0 as f32).collect();
                    let magnitudes: Vec<f64> = reference.iter().map(|r| r.1).collect();
                    let got = case
                        .weight()
                        .matmul_native(&case.x(), Isa::Scalar, 1)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                    let what = format!("scalar m={m} n={n} k={} g={group} b={bits}", case.k);
                    assert_within(&got, &expected, &magnitudes, 2e-6, &what);
                }
            }
        }
    }
}

#[test]
fn every_path_and_thread_count_matches_the_scalar_path() {
    let mut seed = 1000;
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    for bits in [4, 8] {
        for group in [16, 32, 64, 128] {
            for &(m, n) in SHAPES.iter().chain(&[
                (1, 300),
                (130, 40),
                (6, 21),
                (7, 9),
                (8, 40),
                (8, 41),
                (4, 23),
                (9, 17),
            ]) {
                seed += 1;
                // Large enough that the kernels split the work across threads.
                let k = group * if m * n >= 300 { 4 } else { 2 };
                let case = Case::new(m, n, k, group, bits, seed);
                let magnitudes: Vec<f64> = case.reference().iter().map(|r| r.1).collect();
                let weight = case.weight();
                let x = case.x();
                let scalar = weight
                    .matmul_native(&x, Isa::Scalar, 1)
                    .unwrap()
                    .to_vec_f32()
                    .unwrap();
                for &isa in &paths {
                    for threads in [1, 2, 3] {
                        let got = weight
                            .matmul_native(&x, isa, threads)
                            .unwrap()
                            .to_vec_f32()
                            .unwrap();
                        let what =
                            format!("{isa:?}×{threads} m={m} n={n} k={k} g={group} b={bits}");
                        assert_within(&got, &scalar, &magnitudes, 1e-5, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn native_kernel_agrees_with_mlx_quantized_matmul() {
    for (bits, group) in [(4, 32), (8, 32), (4, 64), (8, 128)] {
        let w = Array::from_f32(&pseudo_random(48 * 256, 5), &[48, 256]).unwrap();
        let q = QuantizedWeight::quantize(&w, group, bits).unwrap();
        for m in [1, 3, 9] {
            let x = Array::from_f32(&pseudo_random(m * 256, 6), &[m as i32, 256]).unwrap();
            let ours = q
                .linear(&x, &Kernels::native())
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let mlx = q.matmul(&x, true).unwrap().to_vec_f32().unwrap();
            crate::assert_close(&ours, &mlx, 1e-4);
        }
    }
}

#[test]
fn strided_and_batched_inputs_are_read_through_their_strides() {
    let case = Case::new(6, 24, 64, 32, 4, 77);
    let weight = case.weight();
    let x = case.x();
    let contiguous = weight
        .matmul_native(&x, Isa::best(), 2)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    // The same rows as a [2, 3, K] batch, and as every other row of a [12, K] array.
    let batched = weight
        .matmul_native(&x.reshape(&[2, 3, 64]).unwrap(), Isa::best(), 2)
        .unwrap();
    assert_eq!(batched.shape(), [2, 3, 24]);
    crate::assert_close(&batched.to_vec_f32().unwrap(), &contiguous, 1e-6);
    let doubled = Array::concatenate(&[&x, &x], 1)
        .unwrap()
        .reshape(&[12, 64])
        .unwrap();
    let every_other = doubled.slice_strided(&[0, 0], &[12, 64], &[2, 1]).unwrap();
    let got = weight.matmul_native(&every_other, Isa::best(), 2).unwrap();
    crate::assert_close(&got.to_vec_f32().unwrap(), &contiguous, 1e-6);
    // A transposed view: the column stride is not 1.
    let transposed = x.transpose(&[1, 0]).unwrap().transpose(&[1, 0]).unwrap();
    let got = weight.matmul_native(&transposed, Isa::best(), 1).unwrap();
    crate::assert_close(&got.to_vec_f32().unwrap(), &contiguous, 1e-6);
}

#[test]
fn unsupported_layouts_are_refused_with_a_reason() {
    let case = Case::new(1, 8, 64, 32, 4, 3);
    let weight = case.weight();
    let wrong_k = Array::from_f32(&[0.0; 32], &[1, 32]).unwrap();
    let err = weight
        .matmul_native(&wrong_k, Isa::Scalar, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not match"), "{err}");
    let three_bit = QuantizedWeight {
        bits: 3,
        ..case.weight()
    };
    let err = three_bit
        .matmul_native(&case.x(), Isa::Scalar, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bits must be 4 or 8"), "{err}");
    // `linear` falls back to MLX for what the native kernel does not cover.
    assert!(!three_bit.native_covers(&case.x()));
}

#[test]
fn kernel_choice_is_read_from_the_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let default = Kernels::from_lookup(env(&[])).unwrap();
    assert_eq!(default, Kernels::native());
    let mlx = Kernels::from_lookup(env(&[("MLXCEL_KERNELS", "mlx")])).unwrap();
    assert_eq!(mlx.backend, KernelBackend::Mlx);
    let scalar = Kernels::from_lookup(env(&[
        ("MLXCEL_KERNEL_ISA", "scalar"),
        ("MLXCEL_THREADS", "3"),
    ]))
    .unwrap();
    assert_eq!((scalar.isa, scalar.threads), (Isa::Scalar, 3));
    assert!(default.fused_layers);
    let per_op = Kernels::from_lookup(env(&[("MLXCEL_FUSED_LAYERS", "off")])).unwrap();
    assert!(!per_op.fused_layers);
    assert_eq!(default.activations, Activations::F32);
    let scalar_int8 = Kernels::from_lookup(env(&[
        ("MLXCEL_ACTIVATIONS", "int8"),
        ("MLXCEL_KERNEL_ISA", "scalar"),
    ]))
    .unwrap();
    assert_eq!(scalar_int8.activations, Activations::Int8);
    let int8 = Kernels::from_lookup(env(&[("MLXCEL_ACTIVATIONS", "int8")])).unwrap();
    assert_eq!(int8.activations, Activations::Int8);
    // int8 activations exist on mlxcel's kernels only: the conflict is named.
    let err = Kernels::from_lookup(env(&[
        ("MLXCEL_ACTIVATIONS", "int8"),
        ("MLXCEL_KERNELS", "mlx"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("MLXCEL_ACTIVATIONS") && err.contains("MLXCEL_KERNELS=mlx"),
        "{err}"
    );
    // When an option set the activations (the engine's, from --activations), the conflict names
    // the option, not the variable the user never set.
    let flagged = Kernels {
        backend: KernelBackend::Mlx,
        activations: Activations::Int8,
        ..Kernels::native()
    };
    let err = flagged.check("--activations").unwrap_err().to_string();
    assert!(
        err.starts_with("--activations=\"int8\"") && !err.contains("MLXCEL_ACTIVATIONS"),
        "{err}"
    );
    // The int8 layout: compact by default on every CPU (every int8 path reads it), either on
    // request.
    use mlxcel_core::Int8Layout;
    assert_eq!(Kernels::native().int8_layout, Int8Layout::Compact);
    for (value, layout) in [("compact", Int8Layout::Compact), ("wide", Int8Layout::Wide)] {
        let pairs: &'static [(&'static str, &'static str)] =
            Box::leak(vec![("MLXCEL_INT8_LAYOUT", value)].into_boxed_slice());
        assert_eq!(
            Kernels::from_lookup(env(pairs)).unwrap().int8_layout,
            layout
        );
    }
    // f32 activations read the int8 layout by default where its f32 kernel runs (AVX-512),
    // MLX's layout on request or elsewhere; int8 activations always read the int8 layout.
    use mlxcel_core::F32Layout;
    assert_eq!(Kernels::native().f32_layout, F32Layout::Int8);
    for (value, layout) in [("int8", F32Layout::Int8), ("mlx", F32Layout::Mlx)] {
        let pairs: &'static [(&'static str, &'static str)] =
            Box::leak(vec![("MLXCEL_F32_LAYOUT", value)].into_boxed_slice());
        assert_eq!(Kernels::from_lookup(env(pairs)).unwrap().f32_layout, layout);
    }
    let f32 = Kernels {
        activations: Activations::F32,
        ..Kernels::native()
    };
    assert_eq!(f32.int8_layout_weights(), Isa::best() == Isa::Avx512);
    for other in [
        Kernels {
            f32_layout: F32Layout::Mlx,
            ..f32
        },
        Kernels {
            isa: Isa::Avx2,
            ..f32
        },
        Kernels {
            backend: KernelBackend::Mlx,
            ..f32
        },
    ] {
        assert!(!other.int8_layout_weights(), "{other:?}");
    }
    assert!(
        Kernels {
            activations: Activations::Int8,
            isa: Isa::Scalar,
            ..f32
        }
        .int8_layout_weights()
    );
    for (name, value) in [
        ("MLXCEL_F32_LAYOUT", "wide"),
        ("MLXCEL_INT8_LAYOUT", "narrow"),
        ("MLXCEL_ACTIVATIONS", "int4"),
        ("MLXCEL_FUSED_LAYERS", "yes"),
        ("MLXCEL_KERNELS", "fast"),
        ("MLXCEL_KERNEL_ISA", "neon"),
        ("MLXCEL_THREADS", "0"),
        ("MLXCEL_THREADS", "many"),
    ] {
        let pairs: &'static [(&'static str, &'static str)] =
            Box::leak(vec![(name, value)].into_boxed_slice());
        let err = Kernels::from_lookup(env(pairs)).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(value), "{err}");
    }
}

#[test]
fn epilogues_match_the_equivalent_mlx_ops() {
    use mlxcel_core::Epilogue;
    let case = Case::new(5, 48, 64, 32, 4, 91);
    let weight = case.weight();
    let x = case.x();
    let mlx = Kernels {
        backend: KernelBackend::Mlx,
        ..Kernels::native()
    };
    let residual = Array::from_f32(&pseudo_random(5 * 48, 92), &[5, 48]).unwrap();
    for m in [1, 5] {
        let xm = x.slice(&[0, 0], &[m, 64]).unwrap();
        let rm = residual.slice(&[0, 0], &[m, 48]).unwrap();
        for epilogue in [Epilogue::Residual(&rm), Epilogue::Swiglu] {
            let ours = weight
                .linear_then(&xm, &Kernels::native(), epilogue)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let reference = weight
                .linear_then(&xm, &mlx, epilogue)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert_eq!(ours.len(), reference.len(), "{epilogue:?}");
            crate::assert_close(&ours, &reference, 1e-4);
            // The same with RMSNorm computed inside the op.
            let norm = Array::from_f32(&pseudo_random(64, 94), &[64]).unwrap();
            let ours = weight
                .linear_normed_then(&xm, &norm, 1e-5, &Kernels::native(), epilogue)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let reference = weight
                .linear_normed_then(&xm, &norm, 1e-5, &mlx, epilogue)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            crate::assert_close(&ours, &reference, 1e-4);
        }
    }
    // Stacked gate and up rows give each projection's outputs side by side.
    let other = Case::new(5, 48, 64, 32, 4, 93).weight();
    let stacked = QuantizedWeight::concat_rows(&[&weight, &other]).unwrap();
    let both = stacked.matmul_native(&x, Isa::best(), 2).unwrap();
    assert_eq!(both.shape(), [5, 96]);
    let first = weight.matmul_native(&x, Isa::best(), 2).unwrap();
    crate::assert_close(
        &both.slice(&[0, 0], &[5, 48]).unwrap().to_vec_f32().unwrap(),
        &first.to_vec_f32().unwrap(),
        1e-6,
    );
}

/// The gated activations (SwiGLU, GeGLU) over gate values from -200 to 200, in their scalar form
/// and sixteen lanes at a time (AVX-512, where the CPU has it), against the same formulas in f64
/// on the matmul's own output: within 2e-6 of |act(g)·u| plus 2e-7 of |g·u| (f32's rounding of
/// the 1 in GELU's 1 + tanh, and e^x's saturation below -87 where silu's exact value is smaller
/// still), rows of 40 values (two full vectors and a masked tail).
#[test]
fn gated_activations_match_f64_over_a_wide_range_on_every_path() {
    use mlxcel_core::Epilogue;
    let mut case = Case::new(3, 80, 64, 32, 4, 311);
    // Gate values spread to about ±200: the scalar and vector forms' saturation and both signs.
    case.x = case.x.iter().map(|v| v * 90.0).collect();
    let weight = case.weight();
    let x = case.x();
    for isa in [Isa::Scalar, Isa::best()] {
        let kernels = Kernels {
            isa,
            ..Kernels::native()
        };
        let y = weight
            .linear_then(&x, &kernels, Epilogue::None)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let (mut smallest, mut largest) = (f32::MAX, f32::MIN);
        for (epilogue, act) in [
            (
                Epilogue::Swiglu,
                (|g: f64| g / (1.0 + (-g).exp())) as fn(f64) -> f64,
            ),
            (Epilogue::Geglu, |g: f64| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh())
            }),
        ] {
            let out = weight
                .linear_then(&x, &kernels, epilogue)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert_eq!(out.len(), 3 * 40);
            for m in 0..3 {
                for j in 0..40 {
                    let (g, u) = (y[m * 80 + j], y[m * 80 + 40 + j]);
                    smallest = smallest.min(g);
                    largest = largest.max(g);
                    let want = act(g as f64) * u as f64;
                    let got = out[m * 40 + j] as f64;
                    assert!(
                        (got - want).abs()
                            <= 2e-6 * want.abs() + 2e-7 * (g as f64 * u as f64).abs(),
                        "{isa:?} {epilogue:?} g={g} u={u}: {got} against {want}"
                    );
                }
            }
        }
        assert!(smallest < -90.0 && largest > 90.0, "{smallest}..{largest}");
    }
}

/// `split_heads` against the MLX ops it replaces (slice, reshape, transpose, RoPE), for q-like and
/// v-like column ranges, with and without rotation. Tolerance 1e-5: the inverse frequencies are
/// rounded once from f64 and cos/sin come from libm rather than MLX's own.
#[test]
fn split_heads_matches_slice_reshape_transpose_and_rope() {
    use mlxcel_core::fast::{HeadSlice, Rope, RopeFrequencies, split_heads};
    let (tokens, d) = (7, 16);
    let columns = (4 + 2 + 2) * d;
    let qkv = Array::from_f32(
        &pseudo_random(tokens * columns as usize, 5),
        &[tokens as i32, columns],
    )
    .unwrap();
    let rope = Rope {
        dims: d,
        traditional: false,
        scale: 1.0,
        frequencies: RopeFrequencies::Base(10000.0),
    };
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| 10000f64.powf(-2.0 * i as f64 / d as f64) as f32)
        .collect();
    let inv_freq = Array::from_f32(&inv_freq, &[d / 2]).unwrap();
    for (row, rows, offset) in [(2, 4, 5), (6, 1, 300)] {
        for (column, heads, rotate) in [(0, 4, true), (4 * d, 2, true), (6 * d, 2, false)] {
            let ours = split_heads(
                &qkv,
                HeadSlice {
                    row,
                    rows,
                    column,
                    heads,
                    head_dim: d,
                    inv_freq: &inv_freq,
                    rope: rotate.then_some((offset, 1.0)),
                },
            )
            .unwrap();
            let mut expected = qkv
                .slice(&[row, column], &[row + rows, column + heads * d])
                .unwrap()
                .reshape(&[1, rows, heads, d])
                .unwrap()
                .transpose(&[0, 2, 1, 3])
                .unwrap();
            if rotate {
                expected = rope.apply(&expected, offset).unwrap();
            }
            assert_eq!(ours.shape(), [1, heads, rows, d]);
            crate::assert_close(
                &ours.to_vec_f32().unwrap(),
                &expected.to_vec_f32().unwrap(),
                1e-5,
            );
        }
    }
}

/// Scales and biases stored as f16 (as GGUF conversions store them; the kernels read them as
/// stored) give the f64 reference over the same half values on every path, including subnormal,
/// zero and negative halves.
#[test]
fn f16_scales_and_biases_match_the_reference_on_every_path() {
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    let mut seed = 5000;
    for bits in [4, 8] {
        for group in [16, 32, 128] {
            for &(m, n) in &[(1, 37), (3, 5), (4, 70), (9, 17)] {
                seed += 1;
                let k = if group == 16 { 64 } else { group * 3 };
                let mut case = Case::new(m, n, k, group, bits, seed);
                let half = |v: f32| half::f16::from_f32(v).to_f32();
                for (i, s) in case.scales.iter_mut().enumerate() {
                    *s = match i % 7 {
                        0 => half(3.0e-6), // subnormal in f16
                        1 => half(-*s),
                        2 => 0.0,
                        _ => half(*s),
                    };
                }
                for b in case.biases.iter_mut() {
                    *b = half(*b);
                }
                let reference = case.reference();
                let expected: Vec<f32> = reference.iter().map(|r| r.0 as f32).collect();
                let magnitudes: Vec<f64> = reference.iter().map(|r| r.1).collect();
                let w32 = case.weight();
                let w16 = QuantizedWeight {
                    scales: w32.scales.astype(Dtype::F16).unwrap(),
                    biases: w32.biases.astype(Dtype::F16).unwrap(),
                    ..w32.clone()
                };
                assert!(w16.native_layout());
                for &isa in &paths {
                    for threads in [1, 2] {
                        let got = w16
                            .matmul_native(&case.x(), isa, threads)
                            .unwrap()
                            .to_vec_f32()
                            .unwrap();
                        let what = format!("f16 {isa:?}×{threads} m={m} n={n} g={group} b={bits}");
                        assert_within(&got, &expected, &magnitudes, 1e-5, &what);
                    }
                }
            }
        }
    }
}

// ---- int8 activations (MLXCEL_ACTIVATIONS=int8) ----

/// The int8 paths to check: the scalar reference, AVX2 (`vpmaddubsw`), and AVX-512 VNNI, as far
/// as the CPU has them (an AVX-512 CPU without VNNI runs the AVX2 form for `Isa::Avx512`).
fn int8_paths() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect()
}

/// Row `m` of x alone, as a [1, K] array.
fn row_of(case: &Case, m: usize) -> Array {
    Array::from_f32(&case.x[m * case.k..(m + 1) * case.k], &[1, case.k as i32]).unwrap()
}

/// `weight` (int8 layout) on every int8 path and 1–3 threads gives `reference`'s bits for x,
/// and each of `rows` of x computed alone gives that row's bits batched.
fn assert_int8_bits_everywhere(
    weight: &QuantizedWeight,
    case: &Case,
    reference: &[f32],
    rows: &[usize],
    what: &str,
) {
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let x = case.x();
    let n = case.n;
    for &isa in &int8_paths() {
        for threads in [1, 2, 3] {
            let got = weight
                .matmul_native(&x, isa, threads)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert!(
                same(&got, reference),
                "{isa:?}×{threads} {what}: not the reference bits"
            );
        }
        for &row in rows {
            let alone = weight
                .matmul_native(&row_of(case, row), isa, 2)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert!(
                same(&alone, &reference[row * n..(row + 1) * n]),
                "{isa:?} {what}: row {row} alone differs from row {row} batched"
            );
        }
    }
}

/// Every int8 path, thread count and batch gives the same bits: the computation per output is
/// fixed (docs/kernels.md), integer sums are exact, and a row of x is quantized on its own, so
/// row m of a batch equals row m computed alone. This is what keeps a sequence's tokens
/// independent of its batch-mates with int8 activations.
#[test]
fn int8_paths_threads_and_batches_give_the_same_bits() {
    let mut seed = 7000;
    for bits in [4, 8] {
        for group in [16, 32, 64, 128] {
            for half in [false, true] {
                for (m, n) in [
                    (1, 16),
                    (2, 16),
                    (3, 32),
                    (4, 16),
                    (5, 16),
                    (6, 16),
                    (7, 16),
                    (8, 48),
                    (9, 16),
                    (17, 64),
                    (70, 32),
                ] {
                    seed += 1;
                    // Whole blocks of 32 (groups of 16 come in pairs).
                    let k: usize = group * if m * n >= 300 { 3 } else { 2 };
                    let k = k.next_multiple_of(32);
                    let case = Case::new(m, n, k, group, bits, seed);
                    let mut weight = case.weight();
                    if half {
                        weight.scales = weight.scales.astype(Dtype::F16).unwrap();
                        weight.biases = weight.biases.astype(Dtype::F16).unwrap();
                    }
                    let int8 = weight.interleave_int8().unwrap();
                    let x = case.x();
                    let reference = int8
                        .matmul_native(&x, Isa::Scalar, 1)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                    let what = format!("m={m} n={n} k={k} g={group} b={bits} half={half}");
                    assert_int8_bits_everywhere(
                        &int8,
                        &case,
                        &reference,
                        &[0, m / 2, m - 1],
                        &what,
                    );
                }
            }
        }
    }
}

/// The int8 result is the f64 product up to the quantization of x: each block of 32 values is
/// rounded to steps of max|x|/127, so |y − y_f64| ≤ Σ_blocks (step/2)·Σ|w| (plus f32 summation
/// error). With x already on the grid (every block holds ±127 and integers) the product is
/// exact to summation error, which pins the interleaved layout value by value.
#[test]
fn int8_matmul_is_within_the_quantization_bound_and_exact_on_the_grid() {
    let mut seed = 9000;
    for bits in [4, 8] {
        for group in [16, 32, 64, 128] {
            for (m, n) in [(1, 32), (5, 16), (12, 48)] {
                seed += 1;
                let k = group * 2;
                let mut case = Case::new(m, n, k, group, bits, seed);
                for grid in [false, true] {
                    if grid {
                        for (i, v) in case.x.iter_mut().enumerate() {
                            *v = if i % 32 == 5 {
                                -127.0
                            } else {
                                (*v * 127.0).round()
                            };
                        }
                    }
                    let got = case
                        .weight()
                        .interleave_int8()
                        .unwrap()
                        .matmul_native(&case.x(), Isa::best(), 2)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                    let reference = case.reference();
                    for mi in 0..m {
                        for ni in 0..n {
                            let (value, magnitude) = reference[mi * n + ni];
                            let mut bound = 2e-6 * magnitude + 1e-5;
                            if !grid {
                                for block in 0..k / 32 {
                                    let xs = &case.x[mi * k + block * 32..mi * k + block * 32 + 32];
                                    let step =
                                        xs.iter().fold(0.0f64, |a, &v| a.max(v.abs() as f64))
                                            / 127.0;
                                    let w: f64 = (block * 32..block * 32 + 32)
                                        .map(|kk| case.dequantized(ni, kk).abs())
                                        .sum();
                                    bound += 0.501 * step * w;
                                }
                            }
                            let err = (got[mi * n + ni] as f64 - value).abs();
                            assert!(
                                err <= bound,
                                "grid={grid} m={mi} n={ni} k={k} g={group} b={bits}: \
                                 {} vs {value}, error {err:e} > {bound:e}",
                                got[mi * n + ni]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int8_layout_is_refused_where_it_does_not_apply() {
    // Output rows must come in tiles of 16.
    let case = Case::new(2, 20, 64, 32, 4, 42);
    let err = case.weight().interleave_int8().unwrap_err().to_string();
    assert!(err.contains("multiple of 16"), "{err}");
    assert!(!case.weight().int8_capable());
    // An interleaved weight is not MLX's layout: MLX's ops refuse it, and it is not re-interleaved.
    let int8 = Case::new(2, 32, 64, 32, 4, 43)
        .weight()
        .interleave_int8()
        .unwrap();
    assert!(int8.int8 && !int8.int8_capable());
    for err in [
        int8.dequantize().unwrap_err().to_string(),
        int8.matmul(&Case::new(2, 32, 64, 32, 4, 43).x(), true)
            .unwrap_err()
            .to_string(),
        int8.interleave_int8().unwrap_err().to_string(),
    ] {
        assert!(err.contains("int8") || err.contains("interleaved"), "{err}");
    }
}

/// Scales shaped like a K-quant's: per row and superblock of 256 values, one f32 factor times
/// an integer per group (6-bit sub-scales for Q4_K/Q5_K and their mins, signed 8-bit for Q6_K,
/// zeros included), so the compact layout can store them factored.
fn k_quant_scales(rows: usize, k: usize, group: usize, signed: bool, seed: u64) -> Vec<f32> {
    let per = 256 / group;
    let factors = pseudo_random(rows * k / 256, seed);
    let subs = random_words(rows * k / group, seed + 1);
    (0..rows * k / group)
        .map(|i| {
            let d = factors[i / per] * 0.01;
            let c = if signed {
                (subs[i] % 256) as i32 - 128
            } else {
                (subs[i] % 64) as i32
            };
            d * c as f32
        })
        .collect()
}

/// `case`'s weight shaped like a GGUF conversion: codes masked to `mask`; with `kquant`
/// (whether the scales' and the biases' multipliers are signed), K-quant scales and negated
/// K-quant biases (from `seed`); f16 scales and biases when `half`.
fn k_quant_weight(
    case: &mut Case,
    mask: u32,
    kquant: Option<(bool, bool)>,
    half: bool,
    seed: u64,
) -> QuantizedWeight {
    for word in &mut case.packed {
        *word &= mask;
    }
    if let Some((signed_scales, signed_biases)) = kquant {
        let (n, k, group) = (case.n, case.k, case.group);
        case.scales = k_quant_scales(n, k, group, signed_scales, seed + 3);
        case.biases = k_quant_scales(n, k, group, signed_biases, seed + 5)
            .iter()
            .map(|b| -b)
            .collect();
    }
    let mut weight = case.weight();
    if half {
        weight.scales = weight.scales.astype(Dtype::F16).unwrap();
        weight.biases = weight.biases.astype(Dtype::F16).unwrap();
    }
    weight
}

/// (bits, code mask, group, K-quant scales?, signed sub-scales, f16 scales, expected bits in the
/// compact layout, biases = this multiple of the scales): what GGUF files convert to.
type CompactCase = (usize, u32, usize, bool, bool, bool, i32, Option<f32>);
const COMPACT_CASES: &[CompactCase] = &[
    (4, 0xFFFF_FFFF, 32, true, false, false, 4, None), // Q4_K
    (8, 0x1F1F_1F1F, 32, true, false, false, 5, None), // Q5_K
    (8, 0x3F3F_3F3F, 16, true, true, false, 6, Some(-32.0)), // Q6_K
    (4, 0xFFFF_FFFF, 16, true, true, false, 4, None),  // Q2_K
    (4, 0x7777_7777, 16, true, true, false, 4, Some(-4.0)), // Q3_K
    (8, 0x1F1F_1F1F, 32, false, false, true, 5, None), // Q5_1: f16 scales stay
    (8, 0x1F1F_1F1F, 32, false, false, true, 5, Some(-16.0)), // Q5_0
    (4, 0xFFFF_FFFF, 32, false, false, true, 4, Some(-8.0)), // Q4_0
    (8, 0xFFFF_FFFF, 32, false, false, true, 8, Some(-128.0)), // Q8_0
    (8, 0x3F3F_3F3F, 64, false, false, false, 6, None), // scales that do not factor
    (8, 0x7F7F_7F7F, 128, true, false, false, 8, None), // 7-bit codes: no smaller width
];

/// f32 activations over the int8 layout, wide and compact (every form of COMPACT_CASES), on the
/// scalar and AVX-512 paths and 1-3 threads, on the GEMV (M <= 8) and GEMM shapes, match the f32
/// scalar path over the weight in MLX's layout within the SIMD paths' tolerance (1e-5 of
/// Σ|w·x|); epilogues and the fused norm apply as on the other paths.
#[test]
fn f32_activations_over_the_int8_layout_match_the_scalar_path() {
    use mlxcel_core::{Epilogue, Int8Layout};
    let mut seed = 21_000;
    let paths: Vec<Isa> = [Isa::Scalar, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    for &(bits, mask, group, kquant, signed, half, _, multiple) in COMPACT_CASES {
        for (m, n, k) in [
            (1, 16, 256),
            (2, 48, 512),
            (3, 32, 256),
            (5, 16, 512),
            (8, 64, 256),
            (9, 48, 256),
            (13, 16, 512),
            (70, 32, 512),
        ] {
            seed += 10;
            let mut case = Case::new(m, n, k, group, bits, seed);
            let mut weight = k_quant_weight(
                &mut case,
                mask,
                kquant.then_some((signed, signed)),
                half,
                seed,
            );
            if let Some(m) = multiple {
                let m = Array::scalar_f32(m).astype(weight.scales.dtype()).unwrap();
                weight.biases = weight.scales.multiply(&m).unwrap();
            }
            // Σ|w·x| per output over the weight as dequantized.
            let dense = weight
                .dequantize()
                .unwrap()
                .astype(Dtype::F32)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            let magnitudes: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    (0..k)
                        .map(|j| (dense[col * k + j] as f64 * case.x[row * k + j] as f64).abs())
                        .sum()
                })
                .collect();
            let x = case.x();
            let reference = weight
                .matmul_native(&x, Isa::Scalar, 1)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            for layout in [Int8Layout::Wide, Int8Layout::Compact] {
                let interleaved = weight.interleave_int8_as(layout).unwrap();
                for &isa in &paths {
                    for threads in [1, 2, 3] {
                        let got = interleaved
                            .matmul_native_full(
                                &x,
                                None,
                                isa,
                                threads,
                                Activations::F32,
                                Epilogue::None,
                            )
                            .unwrap()
                            .to_vec_f32()
                            .unwrap();
                        let what = format!(
                            "{layout:?} {isa:?}×{threads} m={m} n={n} k={k} g={group} \
                             bits={bits} mask={mask:x}"
                        );
                        assert_within(&got, &reference, &magnitudes, 1e-5, &what);
                    }
                }
                // Through `linear` with f32 activations chosen, and with a residual epilogue.
                let kernels = Kernels {
                    activations: Activations::F32,
                    ..Kernels::native()
                };
                let got = interleaved
                    .linear(&x, &kernels)
                    .unwrap()
                    .to_vec_f32()
                    .unwrap();
                assert_within(&got, &reference, &magnitudes, 1e-5, "linear");
                let residual =
                    Array::from_f32(&pseudo_random(m * n, seed + 7), &[m as i32, n as i32])
                        .unwrap();
                let got = interleaved
                    .linear_then(&x, &kernels, Epilogue::Residual(&residual))
                    .unwrap()
                    .to_vec_f32()
                    .unwrap();
                let r = residual.to_vec_f32().unwrap();
                let expected: Vec<f32> = reference.iter().zip(&r).map(|(a, b)| a + b).collect();
                assert_within(&got, &expected, &magnitudes, 1e-5, "residual epilogue");
            }
        }
    }
}

/// The compact int8 layout (5- and 6-bit codes, factored scales, biases kept as a power-of-two
/// multiple of the scales: what K-quant, Q4_0, Q5 and Q8_0 files convert to) gives the wide
/// layout's bits on every path, thread count and batch, and a row alone equals it batched;
/// what cannot be stored compactly (8-bit codes above 63, scales that do not factor, biases
/// that are not one multiple of the scales) stays wide. Factored scales take x per superblock
/// (a different rounding of x than the wide layout's, checked bit for bit against a host
/// computation by `factored_weights_take_x_per_superblock`): their reference is the compact
/// layout's scalar path.
#[test]
fn compact_int8_layouts_give_the_wide_layouts_bits() {
    use mlxcel_core::Int8Layout;
    let mut seed = 12_000;
    for &(bits, mask, group, kquant, signed, half, expect_bits, multiple) in COMPACT_CASES {
        for (m, n, k) in [
            (1, 16, 256),
            (3, 32, 512),
            (4, 16, 256),
            (9, 48, 256),
            (70, 16, 512),
        ] {
            seed += 10;
            let mut case = Case::new(m, n, k, group, bits, seed);
            let weight = k_quant_weight(
                &mut case,
                mask,
                kquant.then_some((signed, signed)),
                half,
                seed,
            );
            let mut weight = weight;
            if let Some(m) = multiple {
                // A symmetric format: every bias is the code offset times the scale.
                let m = Array::scalar_f32(m).astype(weight.scales.dtype()).unwrap();
                weight.biases = weight.scales.multiply(&m).unwrap();
            }
            let wide = weight.interleave_int8().unwrap();
            let compact = weight.interleave_int8_as(Int8Layout::Compact).unwrap();
            // The rewrite runs a tile per task: one thread or three give the same words.
            let serial = weight.interleave_int8_on(Int8Layout::Compact, 1).unwrap();
            let threaded = weight.interleave_int8_on(Int8Layout::Compact, 3).unwrap();
            let what = format!("m={m} n={n} k={k} g={group} bits={bits} mask={mask:x}");
            assert_eq!(
                serial.weight.to_vec_u32().unwrap(),
                threaded.weight.to_vec_u32().unwrap(),
                "{what}"
            );
            assert_eq!(compact.bits, expect_bits, "{what}");
            assert_eq!(compact.factored(), kquant, "{what}");
            assert_eq!(compact.derived_biases(), multiple.is_some(), "{what}");
            assert!(!wide.derived_biases(), "{what}");
            assert!(compact.native_layout() && !compact.int8_capable(), "{what}");
            let bytes = |w: &QuantizedWeight| {
                [&w.weight, &w.scales, &w.biases]
                    .iter()
                    .map(|a| a.size() * a.dtype().size_in_bytes())
                    .sum::<usize>()
            };
            if expect_bits != bits as i32 || kquant || multiple.is_some() {
                assert!(bytes(&compact) < bytes(&wide), "{what}: not smaller");
            }
            let x = case.x();
            let reference = if kquant { &compact } else { &wide }
                .matmul_native(&x, Isa::Scalar, 1)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert_int8_bits_everywhere(&compact, &case, &reference, &[m - 1], &what);
            assert_int8_bits_everywhere(&serial, &case, &reference, &[m - 1], &what);
        }
    }
}

/// x quantized per superblock of 256 values as the kernels do it (qmatmul.h): codes rounded to
/// nearest even at max|x| / 127 over the superblock, and that step.
fn superblock_codes(x: &[f32]) -> (Vec<i32>, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let codes = x
        .iter()
        .map(|&v| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i32)
        .collect();
    (codes, amax / 127.0)
}

/// Factored (K-quant) weights multiply x quantized per superblock, with the group's integer
/// sub-scales applied to exact integer sums and the floats once per superblock (qmatmul.h):
/// every int8 path, thread count and batch gives the bits of that formula computed here from
/// the codes, the factors and x, for the forms K-quant files convert to (Q4_K, Q5_K and Q2_K
/// with factored mins, Q6_K and Q3_K with biases a multiple of the scales, groups of 16 to
/// 128), and a row alone gives its bits batched.
#[test]
fn factored_weights_take_x_per_superblock() {
    use mlxcel_core::Int8Layout;
    let mut seed = 31_000;
    for &(bits, mask, group, kquant, signed, _, expect_bits, multiple) in COMPACT_CASES {
        if !kquant {
            continue;
        }
        for (m, n, k) in [(1, 16, 256), (3, 32, 512), (9, 48, 256), (70, 16, 512)] {
            seed += 10;
            let mut case = Case::new(m, n, k, group, bits, seed);
            for word in &mut case.packed {
                *word &= mask;
            }
            // Per row and superblock d (scales) and e (biases), per group c and cb; each
            // superblock's first integer the largest, as llama.cpp writes them (63, or -128
            // signed), so the layout's factoring is exactly these.
            let (groups, per) = (k / group, 256 / group);
            let ints = |seed: u64, signed: bool| -> Vec<i32> {
                random_words(n * groups, seed)
                    .iter()
                    .enumerate()
                    .map(|(i, w)| match (i % per == 0, signed) {
                        (true, true) => -128,
                        (true, false) => 63,
                        (false, true) => (w % 256) as i32 - 128,
                        (false, false) => (w % 64) as i32,
                    })
                    .collect()
            };
            let factors = |seed: u64| -> Vec<f32> {
                pseudo_random(n * k / 256, seed)
                    .iter()
                    .map(|v| (v.abs() + 0.1) * 0.001)
                    .collect()
            };
            let (d, c) = (factors(seed + 11), ints(seed + 12, signed));
            // Biases: -(e · cb) with cb unsigned (factored as -e and cb), or the multiple.
            let (e, cb): (Vec<f32>, Vec<i32>) = match multiple {
                Some(mul) => (d.iter().map(|d| mul * d).collect(), c.clone()),
                None => (
                    factors(seed + 13).iter().map(|e| -e).collect(),
                    ints(seed + 14, false),
                ),
            };
            let at = |row: usize, g: usize| row * groups + g;
            case.scales = (0..n * groups).map(|i| d[i / per] * c[i] as f32).collect();
            case.biases = (0..n * groups).map(|i| e[i / per] * cb[i] as f32).collect();
            let weight = case.weight();
            let compact = weight.interleave_int8_as(Int8Layout::Compact).unwrap();
            assert!(compact.factored() && compact.bits == expect_bits);
            assert_eq!(compact.derived_biases(), multiple.is_some());
            let mut reference = vec![0.0f32; m * n];
            for row in 0..m {
                for sb in 0..k / 256 {
                    let (codes, step) =
                        superblock_codes(&case.x[row * k + sb * 256..row * k + sb * 256 + 256]);
                    for col in 0..n {
                        let (mut s, mut t) = (0i64, 0i64);
                        for g in sb * per..(sb + 1) * per {
                            let (mut dot, mut sum) = (0i64, 0i64);
                            for kk in g * group..(g + 1) * group {
                                let q = codes[kk - sb * 256] as i64;
                                dot += case.code(col, kk) as i64 * q;
                                sum += q;
                            }
                            s += c[at(col, g)] as i64 * dot;
                            t += cb[at(col, g)] as i64 * sum;
                        }
                        assert!(s.abs() < 1 << 31 && t.abs() < 1 << 31);
                        let acc = &mut reference[row * n + col];
                        let f = col * (k / 256) + sb;
                        *acc = (s as f32).mul_add(d[f] * step, *acc);
                        *acc = (t as f32).mul_add(e[f] * step, *acc);
                    }
                }
            }
            let what = format!("factored m={m} n={n} k={k} g={group} bits={bits} mask={mask:x}");
            assert_int8_bits_everywhere(&compact, &case, &reference, &[0, m - 1], &what);
            if m == 3 {
                // A NaN or an infinity in a superblock turns its row's outputs NaN (as the f32
                // path's), and only its row's.
                let mut bad = case.x.clone();
                bad[5] = f32::NAN;
                bad[2 * k + k - 7] = f32::INFINITY;
                let x = Array::from_f32(&bad, &[m as i32, k as i32]).unwrap();
                for &isa in &int8_paths() {
                    let got = compact
                        .matmul_native(&x, isa, 2)
                        .unwrap()
                        .to_vec_f32()
                        .unwrap();
                    assert!(
                        got[..n].iter().chain(&got[2 * n..]).all(|v| v.is_nan()),
                        "{isa:?} {what}"
                    );
                    assert!(
                        got[n..2 * n]
                            .iter()
                            .zip(&reference[n..2 * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} {what}: a clean row changed"
                    );
                }
            }
        }
    }
}

/// A tied embedding table lives in the int8 layout alone: its rows read back from the wide or
/// compact layout are the values MLX's `dequantize` gives for the original weight (f16 scales
/// widened first, as the lookup does), bit for bit
/// (4/5/6/8-bit codes, f32/f16/factored scales, groups of 16 to 128), and an id past the
/// table gives NaN rather than another row.
#[test]
fn int8_layout_rows_read_back_as_the_dequantized_weight() {
    use mlxcel_core::Int8Layout;
    let mut seed = 13_000;
    for (bits, mask, group, kquant, half) in [
        (4, u32::MAX, 32, true, false),
        (4, u32::MAX, 32, false, true),
        (8, 0x1F1F_1F1F, 32, true, false),
        (8, 0x3F3F_3F3F, 16, true, false),
        (4, u32::MAX, 16, true, false),
        (8, u32::MAX, 64, false, false),
        (8, 0x1F1F_1F1F, 128, false, true),
    ] {
        seed += 10;
        let (n, k) = (48, 512);
        let mut case = Case::new(1, n, k, group, bits, seed);
        let weight = k_quant_weight(
            &mut case,
            mask,
            kquant.then_some((group == 16, false)),
            half,
            seed,
        );
        let ids = [0u32, 17, 47, 3, 17];
        let ids_array = Array::from_u32(&ids, &[ids.len() as i32]).unwrap();
        // As the embedding lookup computes it: f16 scales widened first, then f32 arithmetic.
        let expected = QuantizedWeight {
            scales: weight.scales.astype(Dtype::F32).unwrap(),
            biases: weight.biases.astype(Dtype::F32).unwrap(),
            ..weight.clone()
        }
        .dequantize()
        .unwrap()
        .to_vec_f32()
        .unwrap();
        for layout in [Int8Layout::Wide, Int8Layout::Compact] {
            let int8 = weight.interleave_int8_as(layout).unwrap();
            let rows = int8.int8_rows(&ids_array).unwrap();
            assert_eq!(rows.shape(), vec![ids.len() as i32, k as i32]);
            let rows = rows.to_vec_f32().unwrap();
            for (i, &id) in ids.iter().enumerate() {
                let want = &expected[id as usize * k..(id as usize + 1) * k];
                let got = &rows[i * k..(i + 1) * k];
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{layout:?} bits={bits} g={group} half={half} row {id}: not dequantize's bits"
                );
            }
            let past = int8
                .int8_rows(&Array::from_u32(&[n as u32], &[1]).unwrap())
                .unwrap()
                .to_vec_f32()
                .unwrap();
            assert!(
                past.iter().all(|v| v.is_nan()),
                "{layout:?}: id past the table"
            );
        }
        let err = weight.int8_rows(&ids_array).unwrap_err().to_string();
        assert!(err.contains("not in the int8 layout"), "{err}");
    }
}

// ---- groups of 16 (GGUF Q6_K, Q3_K, Q2_K) ----

/// Groups of 16 are outside MLX's quantized ops: `linear` takes mlxcel's kernel even when MLX's
/// kernels are chosen (`MLXCEL_KERNELS=mlx`), MLX's `quantized_matmul` refuses them by name, a
/// row that is not whole 32-value chunks is refused, and `dequantize` (the embedding lookup)
/// computes `fl(fl(scale·q) + bias)` per group of 16, bit for bit the host's f32 arithmetic.
#[test]
fn group16_takes_mlxcels_kernels_and_mlx_refuses_it() {
    for bits in [4, 8] {
        let case = Case::new(3, 32, 96, 16, bits, 77 + bits as u64);
        let weight = case.weight();
        assert!(weight.native_only() && weight.native_layout());
        let x = case.x();
        let native = weight
            .matmul_native(&x, Isa::best(), 1)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let mlx_kernels = Kernels {
            backend: KernelBackend::Mlx,
            ..Kernels::native()
        };
        let via_linear = weight
            .linear(&x, &mlx_kernels)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_eq!(via_linear, native);
        let err = weight.matmul(&x, true).unwrap_err().to_string();
        assert!(err.contains("groups of 16"), "{err}");

        let dense = weight.dequantize().unwrap().to_vec_f32().unwrap();
        for n in 0..case.n {
            for k in 0..case.k {
                let per_word = 32 / case.bits;
                let word = case.packed[(n * case.k + k) / per_word];
                let q = (word >> (case.bits * (k % per_word))) & ((1u32 << case.bits) - 1);
                let g = n * (case.k / 16) + k / 16;
                let expected = case.scales[g] * q as f32 + case.biases[g];
                assert_eq!(
                    dense[n * case.k + k].to_bits(),
                    expected.to_bits(),
                    "b={bits} [{n}, {k}]"
                );
            }
        }
    }
    // 48 values: three groups of 16, not whole chunks of 32.
    let odd = Case::new(1, 16, 48, 16, 8, 5);
    assert!(!odd.weight().native_layout());
    let err = odd
        .weight()
        .matmul_native(&odd.x(), Isa::Scalar, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not match") || err.contains("32"),
        "{err}"
    );
}
