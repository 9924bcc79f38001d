//! Times the int8-activation matmul at decode (M = 1) on Llama-3.2-1B- and Qwen2.5-3B-shaped
//! K-quant matrices,
//! wide against compact layout, per thread count: GB/s of the bytes each layout reads. With
//! `f32`, the f32-activation matmul instead: MLX's layout (what the f32 path read before)
//! against f32 activations over the compact int8 layout.
//!
//! With M > 1 each line also gives the multiply-adds per second (M·N·K over the time); FILTER
//! keeps the shapes whose name contains it.
//!
//! `cargo run --release -p mlxcel-core --example int8_speed [M] [int8|f32] [FILTER]`

use std::time::Instant;

use mlxcel_core::{Activations, Array, Epilogue, Int8Layout, Isa, QuantizedWeight, eval};

fn random(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 16) as u32
        })
        .collect()
}

/// A K-quant-like weight: codes under `mask`, scales d · c per superblock of 256.
fn weight(n: usize, k: usize, bits: usize, mask: u32, group: usize, seed: u64) -> QuantizedWeight {
    let words: Vec<u32> = random(n * k * bits / 32, seed)
        .iter()
        .map(|w| w & mask)
        .collect();
    let per = 256 / group;
    let factors = random(n * k / 256, seed + 1);
    let subs = random(n * k / group, seed + 2);
    let scales: Vec<f32> = (0..n * k / group)
        .map(|i| (factors[i / per] % 1000) as f32 * 1e-5 * (subs[i] % 64) as f32)
        .collect();
    let biases: Vec<f32> = scales.iter().map(|s| -0.5 * s).collect();
    let g = (k / group) as i32;
    QuantizedWeight {
        weight: Array::from_u32(&words, &[n as i32, (k * bits / 32) as i32]).unwrap(),
        scales: Array::from_f32(&scales, &[n as i32, g]).unwrap(),
        biases: Array::from_f32(&biases, &[n as i32, g]).unwrap(),
        group_size: group as i32,
        bits: bits as i32,
        int8: false,
        activations: None,
    }
}

fn bytes(w: &QuantizedWeight) -> usize {
    [&w.weight, &w.scales, &w.biases]
        .iter()
        .map(|a| a.size() * a.dtype().size_in_bytes())
        .sum()
}

fn main() -> Result<(), mlxcel_core::Error> {
    let m: i32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let activations = match std::env::args().nth(2).as_deref() {
        None | Some("int8") => Activations::Int8,
        Some("f32") => Activations::F32,
        Some(other) => panic!("activations must be int8 or f32, got {other}"),
    };
    let filter = std::env::args().nth(3).unwrap_or_default();
    // (name, N, K, bits, mask, group): a layer's Q4_K gate/up and Q6_K down, and a Q6_K head.
    let shapes = [
        ("L2-resident Q4_K 512x2048", 512, 2048, 4, u32::MAX, 32),
        ("L2-resident Q6_K 512x2048", 512, 2048, 8, 0x3F3F_3F3F, 16),
        ("gate_up Q4_K 16384x2048", 16384, 2048, 4, u32::MAX, 32),
        ("down Q6_K 2048x8192", 2048, 8192, 8, 0x3F3F_3F3F, 16),
        ("head Q6_K 128256x2048", 128256, 2048, 8, 0x3F3F_3F3F, 16),
        // Qwen2.5-3B's: q/k/v stacked, o, gate/up, a Q4_K down, its tied Q6_K head.
        ("3B qkv Q4_K 2560x2048", 2560, 2048, 4, u32::MAX, 32),
        ("3B o Q4_K 2048x2048", 2048, 2048, 4, u32::MAX, 32),
        ("3B gate_up Q4_K 22016x2048", 22016, 2048, 4, u32::MAX, 32),
        ("3B down Q4_K 2048x11008", 2048, 11008, 4, u32::MAX, 32),
        ("3B head Q6_K 151936x2048", 151936, 2048, 8, 0x3F3F_3F3F, 16),
    ];
    for (name, n, k, bits, mask, group) in shapes {
        if !name.contains(filter.as_str()) {
            continue;
        }
        // Several copies so that a pass streams from DRAM (8 MiB L3).
        let copies = if n == 512 {
            1
        } else {
            (256 << 20) / (n * k * bits / 8) + 1
        };
        let base: Vec<QuantizedWeight> = (0..copies)
            .map(|c| weight(n, k, bits, mask, group, 7 + c as u64))
            .collect();
        let x = Array::from_f32(
            &(0..m as usize * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect::<Vec<_>>(),
            &[m, k as i32],
        )?;
        let layouts: &[Option<Int8Layout>] = match activations {
            Activations::Int8 => &[Some(Int8Layout::Wide), Some(Int8Layout::Compact)],
            Activations::F32 | Activations::Mixed => &[None, Some(Int8Layout::Compact)],
        };
        for &layout in layouts {
            let ws: Vec<QuantizedWeight> = match layout {
                Some(layout) => base
                    .iter()
                    .map(|w| w.interleave_int8_as(layout))
                    .collect::<Result<_, _>>()?,
                None => base.clone(),
            };
            let label = layout.map_or("MLX".to_string(), |l| format!("{l:?}"));
            for threads in [1, 2] {
                let mut best = f64::MAX;
                for _ in 0..if n == 512 { 200 } else { 5 } {
                    let start = Instant::now();
                    for w in &ws {
                        let y = w.matmul_native_full(
                            &x,
                            None,
                            Isa::best(),
                            threads,
                            activations,
                            Epilogue::None,
                        )?;
                        eval(&[&y])?;
                    }
                    best = best.min(start.elapsed().as_secs_f64() / copies as f64);
                }
                let rate = if m > 1 {
                    format!("\t{:.0} G MAC/s", (m as usize * n * k) as f64 / best / 1e9)
                } else {
                    String::new()
                };
                println!(
                    "{name:26} {label}\t×{threads}\t{:.2} ms\t{:.1} GB/s ({} bits){rate}",
                    best * 1e3,
                    bytes(&ws[0]) as f64 / best / 1e9,
                    ws[0].bits
                );
            }
        }
    }
    Ok(())
}
