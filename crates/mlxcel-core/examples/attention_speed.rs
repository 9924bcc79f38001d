//! Times mlxcel's attention kernel at decode (one query row) over a Llama-3.2-1B-shaped layer's
//! KV cache (32 heads, 8 kv heads, head_dim 64) at several depths, with f32 and f16 keys and
//! values (`--cache-type-k/-v`): ms per layer, GB/s of keys and values read, and a hash of the
//! output's bits (to compare two builds of the kernel).
//!
//! `cargo run --release -p mlxcel-core --example attention_speed -- [--heads H] [--kv-heads KV]
//! [--head-dim D] [--rows N] [DEPTH...]`: other head counts (the default model: `--heads 9
//! --kv-heads 3`; Qwen2.5-3B: `--heads 16 --kv-heads 2 --head-dim 128`), and N query rows at the
//! end of the context (a prefill chunk or a speculative verification pass). `--layers L` cycles
//! over L separate caches (the default model: 30), so that each call reads its keys and values
//! from memory as a decode step's layers do, not from the cache the previous call left them in.

use std::time::Instant;

use mlxcel_core::fast::attention_native_tokens_major;
use mlxcel_core::{Array, Dtype, Isa, eval};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn main() -> Result<(), mlxcel_core::Error> {
    let (mut heads, mut kv_heads, mut rows, mut d, mut layers) = (32i32, 8i32, 1i32, 64i32, 1i32);
    let mut depths: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> i32 {
            match args.next().and_then(|v| v.parse().ok()) {
                Some(v) if v > 0 => v,
                _ => panic!("{name} needs a positive integer"),
            }
        };
        match arg.as_str() {
            "--heads" => heads = value("--heads"),
            "--kv-heads" => kv_heads = value("--kv-heads"),
            "--rows" => rows = value("--rows"),
            "--head-dim" => d = value("--head-dim"),
            "--layers" => layers = value("--layers"),
            depth => depths.push(
                depth
                    .parse()
                    .unwrap_or_else(|_| panic!("{depth}: expected a depth or a flag")),
            ),
        }
    }
    assert!(
        heads % kv_heads == 0,
        "--heads {heads} is not a multiple of --kv-heads {kv_heads}"
    );
    let depths = if depths.is_empty() {
        vec![512, 4096, 8192]
    } else {
        depths
    };
    for &depth in &depths {
        assert!(
            depth >= rows as usize,
            "depth {depth} is below --rows {rows}: the rows are the context's last positions"
        );
        let l = depth as i32;
        let q = Array::from_f32(
            &random((heads * rows * d) as usize, 1),
            &[1, heads, rows, d],
        )?;
        let keys = random((kv_heads * l * d) as usize, 2);
        let values = random((kv_heads * l * d) as usize, 3);
        for dtype in [Dtype::F32, Dtype::F16] {
            // Every layer's keys and values are the same numbers, each in arrays of their own.
            let caches = (0..layers)
                .map(|_| {
                    let k = Array::from_f32(&keys, &[1, kv_heads, l, d])?.astype(dtype)?;
                    let v = Array::from_f32(&values, &[1, kv_heads, l, d])?.astype(dtype)?;
                    Ok((k, v))
                })
                .collect::<Result<Vec<_>, mlxcel_core::Error>>()?;
            for (k, v) in &caches {
                eval(&[&q, k, v])?;
            }
            for threads in [1usize, 2] {
                let layer = std::cell::Cell::new(0usize);
                let attend = || {
                    let (k, v) = &caches[layer.get()];
                    layer.set((layer.get() + 1) % caches.len());
                    attention_native_tokens_major(
                        &q,
                        k,
                        v,
                        depth,
                        0.125,
                        true,
                        None,
                        None,
                        Isa::best(),
                        threads,
                    )
                };
                let run = || -> Result<(), mlxcel_core::Error> { eval(&[&attend()?]) };
                // FNV-1a over the output's bits: two builds that print the same value computed
                // the same bits.
                let bits = attend()?
                    .to_vec_f32()?
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
                        (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
                    });
                // The best of five rounds (this machine's other load only ever slows a round).
                let reps = (200_000 / depth).max(5);
                let mut ms = f64::MAX;
                for _ in 0..5 {
                    let start = Instant::now();
                    for _ in 0..reps {
                        run()?;
                    }
                    ms = ms.min(start.elapsed().as_secs_f64() * 1e3 / reps as f64);
                }
                let bytes = 2.0 * (kv_heads * l * d) as f64 * dtype.size_in_bytes() as f64;
                println!(
                    "depth {depth:>6} {dtype:?} KV, {rows} rows, {threads} threads: {ms:.3} ms/layer, {:.1} GB/s, output bits {bits:016x}",
                    bytes / ms / 1e6
                );
            }
        }
    }
    Ok(())
}
