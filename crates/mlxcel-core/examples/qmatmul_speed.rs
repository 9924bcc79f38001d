//! Times quantized matmul on the default model's shapes: MLX's kernel against mlxcel's, per path
//! and thread count. Prints GB/s of weights read for M = 1 (decode) and GFLOP/s for larger M.
//!
//! `cargo run --release -p mlxcel-core --example qmatmul_speed [M...]` (default M: 1 512).

use std::time::Instant;

use mlxcel_core::{Array, Isa, QuantizedWeight, eval};

/// One way to run `x · Wᵀ`.
type Run = Box<dyn Fn(&QuantizedWeight, &Array) -> mlxcel_core::Result<Array>>;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() -> Result<(), mlxcel_core::Error> {
    let ms: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ms = if ms.is_empty() { vec![1, 512] } else { ms };
    // (name, N, K, bits) for one SmolLM2-135M layer and the tied output projection.
    let shapes = [
        ("30 layers (q k v o gate up down)", 0, 0, 4),
        ("lm_head 49152x576 q8", 49152, 576, 8),
    ];
    let layer: Vec<(usize, usize)> = vec![
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    for &m in &ms {
        for (name, n, k, bits) in shapes {
            // Thirty distinct layers (80 MB) stream from DRAM as in a real decode step.
            let mats: Vec<(usize, usize)> = if n == 0 {
                layer
                    .iter()
                    .cycle()
                    .take(30 * layer.len())
                    .copied()
                    .collect()
            } else {
                vec![(n, k)]
            };
            let weights: Vec<QuantizedWeight> = mats
                .iter()
                .enumerate()
                .map(|(i, &(n, k))| {
                    let w = Array::from_f32(&random(n * k, i as u64 + 1), &[n as i32, k as i32])?;
                    QuantizedWeight::quantize(&w, 32, bits)
                })
                .collect::<Result<_, _>>()?;
            let inputs: Vec<Array> = mats
                .iter()
                .map(|&(_, k)| Array::from_f32(&random(m * k, 9), &[m as i32, k as i32]))
                .collect::<Result<_, _>>()?;
            let bytes: usize = mats
                .iter()
                .map(|&(n, k)| n * k * bits as usize / 8 + 2 * 4 * n * k / 32)
                .sum();
            let flops: usize = mats.iter().map(|&(n, k)| 2 * m * n * k).sum();
            let mut runs: Vec<(String, Run)> = vec![(
                "mlx".into(),
                Box::new(|w: &QuantizedWeight, x: &Array| w.matmul(x, true)),
            )];
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                if isa > Isa::best() || (isa == Isa::Scalar && m > 1) {
                    continue;
                }
                for threads in [1, 2] {
                    runs.push((
                        format!("{isa:?}x{threads}"),
                        Box::new(move |w: &QuantizedWeight, x: &Array| {
                            w.matmul_native(x, isa, threads)
                        }),
                    ));
                }
            }
            for (label, run) in &runs {
                if label == "mlx" && m > 64 {
                    continue;
                }
                let iters = if m == 1 { 10 } else { 3 };
                let mut best = f64::MAX;
                for _ in 0..iters {
                    let start = Instant::now();
                    let outs: Vec<Array> = weights
                        .iter()
                        .zip(&inputs)
                        .map(|(w, x)| run(w, x))
                        .collect::<Result<_, _>>()?;
                    eval(&outs.iter().collect::<Vec<_>>())?;
                    best = best.min(start.elapsed().as_secs_f64());
                }
                println!(
                    "M={m:4} {name:30} {label:10} {:8.3} ms  {:6.2} GB/s  {:7.2} GFLOP/s",
                    best * 1e3,
                    bytes as f64 / best / 1e9,
                    flops as f64 / best / 1e9
                );
            }
        }
    }
    Ok(())
}
