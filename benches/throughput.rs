//! Prefill (512 tokens) and decode (128 tokens) throughput on the default model, per backend.
//! criterion reports elements/s: here, tokens/s.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mlxcel_engine::{BackendBench, BackendKind, EngineOptions};

const PROMPT: usize = 512;
const GENERATE: usize = 128;

fn throughput(c: &mut Criterion) {
    for backend in BackendKind::NAMES {
        let options = EngineOptions {
            backend: backend.parse().expect("a listed backend"),
            ..EngineOptions::default()
        };
        let mut bench = match BackendBench::load(None, &options) {
            Ok(bench) => bench,
            Err(err) => {
                eprintln!("skipping the {backend} backend: {err}");
                continue;
            }
        };
        let mut group = c.benchmark_group(format!("{backend}/default-model"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(10));
        group.throughput(Throughput::Elements(PROMPT as u64));
        group.bench_function(format!("prefill{PROMPT}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| bench.prompt(PROMPT, PROMPT, 0).expect("prefill runs"))
                    .sum()
            })
        });
        group.throughput(Throughput::Elements(GENERATE as u64));
        group.bench_function(format!("decode{GENERATE}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| bench.generate(GENERATE, PROMPT, 0).expect("decode runs"))
                    .sum()
            })
        });
        group.finish();
    }
}

criterion_group!(benches, throughput);
criterion_main!(benches);
