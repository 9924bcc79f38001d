//! MXFP4 weights on mlxcel's kernels without loss: written into the int8 layout straight from
//! their GGUF blocks (4-bit E2M1 indices looked up as codes, power-of-two scales, derived
//! biases), interleaved the general way (5-bit codes), and converted to MLX's
//! layout (8-bit affine groups of 32), the values read back are llama.cpp's bit for bit at scale
//! bytes from 0 to 251, and the matmuls of both layouts, int8 or f32 activations, every path,
//! are exactly the dequantized weight's f64 product where x is on the int8 grid, and within the
//! int8 quantization bound (int8) or the f32 kernels' tolerance (f32) elsewhere.

use std::path::Path;

use mlxcel_core::{
    Activations, Array, Dtype, Epilogue, Int8Layout, Isa, KernelBackend, Kernels, QuantizedWeight,
};
use mlxcel_model::gguf::dequant::dequantize_reference;
use mlxcel_model::gguf::{GgmlType, GgufFile};
use mlxcel_model::{Checkpoint, converted};

use crate::int8_blocks::fixtures::{Rng, TinyLlama};
use crate::pseudo_random;

const UP: &str = "model.layers.0.mlp.up_proj.weight";
const UP_GGUF: &str = "blk.0.ffn_up.weight";

/// A tiny llama whose linears are MXFP4 (up: 512 rows of 256 values, 16 blocks of 32 each),
/// written to `dir`, with layer 0's up projection's blocks replaced: block `b` of the tensor
/// gets scale byte `scale(b)` and random codes. Returns the lazily converted checkpoint (weights
/// read from the GGUF's blocks) and llama.cpp's values of that tensor.
fn patched(dir: &Path, seed: u64, scale: impl Fn(usize) -> u8) -> (Checkpoint, Vec<f32>) {
    let gguf = dir.join(format!("mxfp4-{seed}.gguf"));
    TinyLlama {
        hidden: 256,
        ffn: 512,
        tied: false,
        linear_type: |_| GgmlType::MXFP4,
        embed_type: GgmlType::Q8_0,
        ..TinyLlama::default()
    }
    .write(&gguf, seed);
    let file = GgufFile::open(&gguf).unwrap();
    let old = file
        .tensor_data(file.tensor_info(UP_GGUF).unwrap())
        .unwrap()
        .to_vec();
    drop(file);
    let mut rng = Rng::new(seed);
    let new: Vec<u8> = (0..old.len() / 17)
        .flat_map(|b| [vec![scale(b)], rng.bytes(16)].concat())
        .collect();
    let mut bytes = std::fs::read(&gguf).unwrap();
    let at = bytes
        .windows(old.len())
        .position(|w| w == old.as_slice())
        .unwrap();
    bytes[at..at + old.len()].copy_from_slice(&new);
    std::fs::write(&gguf, bytes).unwrap();
    let lazy = converted(&dir.join("cache"), &gguf, &format!("{seed:08x}")).unwrap();
    let values = dequantize_reference(GgmlType::MXFP4, &new).unwrap();
    (Checkpoint::open(&lazy).unwrap(), values)
}

/// Layer 0's up projection written into the int8 layout from its blocks.
fn direct(ckpt: &Checkpoint) -> QuantizedWeight {
    let blocks = ckpt.gguf_blocks(UP).unwrap();
    assert_eq!(blocks.ggml_type, GgmlType::MXFP4);
    QuantizedWeight::int8_from_gguf_blocks(&[blocks], 2)
        .unwrap()
        .expect("written from its blocks")
}

/// The same weight in MLX's layout, as converted (8-bit affine groups of 32).
fn mlx_layout(ckpt: &Checkpoint) -> QuantizedWeight {
    let module = UP.trim_end_matches(".weight");
    let array = |part: &str| {
        let t = ckpt.tensor(&format!("{module}.{part}")).unwrap();
        let dtype = match t.dtype {
            mlxcel_model::Dtype::U32 => Dtype::U32,
            mlxcel_model::Dtype::F16 => Dtype::F16,
            mlxcel_model::Dtype::F32 => Dtype::F32,
            other => panic!("{part}: {other:?}"),
        };
        let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
        Array::from_bytes(t.data, &shape, dtype).unwrap()
    };
    let spec = ckpt.quantization_of(module).unwrap();
    assert_eq!((spec.bits, spec.group_size), (8, 32));
    QuantizedWeight {
        weight: array("weight"),
        scales: array("scales"),
        biases: array("biases"),
        group_size: 32,
        bits: 8,
        int8: false,
        activations: None,
    }
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i}: {} != {}", got[i], want[i]);
    }
}

/// Every value read back equals llama.cpp's, at every kind of scale byte the form holds (the
/// f32 subnormals 2^−128 and 2^−127, f16's edges 104 and 143 and just past them, 2^123): from
/// the layout written from the blocks (E2M1 indices, f32 scales since f16 cannot hold them all,
/// biases derived), from the general path's interleaving of the converted weight (5-bit codes),
/// and from the converted weight itself through MLX's `dequantize`.
#[test]
fn mxfp4_values_read_back_exactly_at_the_scale_extremes() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = [0u8, 1, 2, 50, 103, 104, 127, 128, 143, 144, 200, 251];
    let (ckpt, want) = patched(dir.path(), 3901, |b| bytes[b % bytes.len()]);
    let direct = direct(&ckpt);
    assert_eq!((direct.bits, direct.group_size), (4, 32));
    assert!(direct.derived_biases() && direct.e2m1_codes());
    assert_eq!(direct.scales.dtype(), Dtype::F32);
    let mlx = mlx_layout(&ckpt);
    assert_eq!(mlx.scales.dtype(), Dtype::F32);
    let general = mlx.interleave_int8_as(Int8Layout::Compact).unwrap();
    assert_eq!((general.bits, general.derived_biases()), (5, true));
    assert!(!general.e2m1_codes());
    let ids = Array::from_u32(&(0..512).collect::<Vec<_>>(), &[512]).unwrap();
    for (w, what) in [(&direct, "from the blocks"), (&general, "interleaved")] {
        let rows = w.int8_rows(&ids).unwrap().to_vec_f32().unwrap();
        assert_bits(&rows, &want, what);
    }
    let dense = mlx.dequantize().unwrap().to_vec_f32().unwrap();
    assert_bits(&dense, &want, "MLX's dequantize");
}

/// x of `m` rows of `k` values: on the int8 grid (integers, each block of 32 reaching ±127, so
/// quantizing it is exact) or uniform in [−1, 1).
fn activations(m: usize, k: usize, grid: bool, seed: u64) -> Vec<f32> {
    let mut x = pseudo_random(m * k, seed);
    if grid {
        for (i, v) in x.iter_mut().enumerate() {
            *v = if i % 32 == 7 {
                127.0
            } else {
                (*v * 127.0).round()
            };
        }
    }
    x
}

/// `x · Wᵀ` in f64 over the dequantized weight `w` (`[n, k]`), and Σ|w·x| per output.
fn reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|p| f64::from(w[j * k + p]) * f64::from(x[i * k + p]));
            out.push(terms.fold((0.0, 0.0), |(v, a), t| (v + t, a + t.abs())));
        }
    }
    out
}

/// The int8 bound of docs/kernels.md: Σ_blocks 0.501 · step · Σ|w| (step = max|x|/127 of the
/// block), plus the f32 summation's 2e-6 · Σ|w·x|.
fn int8_bound(w: &[f32], x: &[f32], k: usize, (i, j): (usize, usize), magnitude: f64) -> f64 {
    let mut bound = 2e-6 * magnitude + 1e-5;
    for block in 0..k / 32 {
        let xs = &x[i * k + 32 * block..i * k + 32 * block + 32];
        let step = xs.iter().fold(0.0f64, |a, &v| a.max(f64::from(v.abs()))) / 127.0;
        let ws = &w[j * k + 32 * block..j * k + 32 * block + 32];
        bound += 0.501 * step * ws.iter().map(|&v| f64::from(v.abs())).sum::<f64>();
    }
    bound
}

/// The matmuls of an MXFP4 weight (scale bytes 124..=126, as real weights' range of a few
/// powers of two) on every path: int8 and f32 activations over the layout written from its
/// blocks (scalar, AVX2, AVX-512; 1 and 2 threads; GEMV and GEMM shapes), and MLX's layout on
/// mlxcel's f32 kernel and on MLX's own (`MLXCEL_KERNELS=mlx`). On the grid every sum is exact,
/// so each equals the f64 product bit for bit; off it int8 is within its quantization bound and
/// f32 within 1e-5 of Σ|w·x|. The layout from the blocks (E2M1 indices) gives the same bits as
/// the general path's (5-bit codes) on every path.
#[test]
fn mxfp4_matmuls_equal_the_dequantized_weights_product() {
    mxfp4_matmuls_check();
}

/// The same, in a child process with `MLXCEL_NO_VBMI=1`: the AVX-512 kernels' E2M1 lookup by
/// vpshufb (a VNNI CPU without VBMI), which a CPU with VBMI would not otherwise reach.
#[test]
fn mxfp4_matmuls_without_vbmi() {
    crate::run_ignored_test_in_child(
        "mxfp4::child_mxfp4_matmuls_without_vbmi",
        &[("MLXCEL_NO_VBMI", "1")],
    );
}

/// Run by `mxfp4_matmuls_without_vbmi` in a child process.
#[test]
#[ignore = "run as a child process by mxfp4_matmuls_without_vbmi"]
fn child_mxfp4_matmuls_without_vbmi() {
    assert_eq!(std::env::var("MLXCEL_NO_VBMI").as_deref(), Ok("1"));
    mxfp4_matmuls_check();
}

fn mxfp4_matmuls_check() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, w) = patched(dir.path(), 3902, |b| 124 + (b * 7 % 3) as u8);
    let (n, k) = (512, 256);
    let direct = direct(&ckpt);
    assert_eq!(direct.scales.dtype(), Dtype::F16, "2^−4 .. 2^−2 fit f16");
    assert!(direct.e2m1_codes());
    let mlx = mlx_layout(&ckpt);
    // The general path's 5-bit codes: the same codes, so the same bits on every path.
    let general = mlx.interleave_int8_as(Int8Layout::Compact).unwrap();
    assert_eq!(general.bits, 5);
    let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&isa| isa <= Isa::best())
        .collect();
    let mlx_kernels = Kernels {
        backend: KernelBackend::Mlx,
        ..Kernels::native()
    };
    for (m, grid) in [(1, true), (3, true), (9, true), (1, false), (9, false)] {
        let seed = 40 + m as u64 + u64::from(grid);
        let xs = activations(m, k, grid, seed);
        let x = Array::from_f32(&xs, &[m as i32, k as i32]).unwrap();
        let reference = reference(&w, &xs, m, n, k);
        let check = |got: Vec<f32>, int8: bool, what: &str| {
            for (o, (&y, &(value, magnitude))) in got.iter().zip(&reference).enumerate() {
                let err = (f64::from(y) - value).abs();
                let bound = match (grid, int8) {
                    (true, _) => 0.0,
                    (false, true) => int8_bound(&w, &xs, k, (o / n, o % n), magnitude),
                    (false, false) => 1e-5 * magnitude + 1e-6,
                };
                assert!(
                    err <= bound,
                    "{what} m={m} grid={grid} output {o}: {y} vs {value}, error {err:e} > {bound:e}"
                );
            }
        };
        let run = |w: &QuantizedWeight, isa, threads, activations| {
            w.matmul_native_full(&x, None, isa, threads, activations, Epilogue::None)
                .unwrap()
                .to_vec_f32()
                .unwrap()
        };
        for &isa in &isas {
            for threads in [1, 2] {
                let what = format!("{isa:?}×{threads}");
                let int8 = run(&direct, isa, threads, Activations::Int8);
                assert_bits(
                    &int8,
                    &run(&general, isa, threads, Activations::Int8),
                    &format!("{what} E2M1 vs 5-bit codes, int8 m={m}"),
                );
                check(int8, true, &what);
                if isa != Isa::Avx2 {
                    // f32 activations read the int8 layout on the scalar and AVX-512 paths.
                    let f32 = run(&direct, isa, threads, Activations::F32);
                    assert_bits(
                        &f32,
                        &run(&general, isa, threads, Activations::F32),
                        &format!("{what} E2M1 vs 5-bit codes, f32 m={m}"),
                    );
                    check(f32, false, &what);
                }
                check(
                    run(&mlx, isa, threads, Activations::F32),
                    false,
                    "MLX layout",
                );
            }
        }
        // MLX's kernels take scales and biases in the activations' f32, as a load for them
        // widens them.
        let widened = QuantizedWeight {
            scales: mlx.scales.astype(Dtype::F32).unwrap(),
            biases: mlx.biases.astype(Dtype::F32).unwrap(),
            ..mlx.clone()
        };
        let got = widened
            .linear(&x, &mlx_kernels)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        check(got, false, "MLX's quantized_matmul");
    }
}
