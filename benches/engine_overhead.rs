//! The engine's own cost per step, on a "tiny model" whose forward pass is free: a backend that
//! returns fixed logits over a 49152-token vocabulary (the default model's). What is left is
//! scheduling, sampling and detokenization: the floor under every real step.

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mlxcel_engine::{
    Backend, DecodeStream, EngineError, GenerationRequest, MaxNewTokens, SamplingParams, Scheduler,
    SchedulerConfig, SequenceStep, SessionPlan, SlotId, TextDecoder,
};

const VOCAB: usize = 49_152;

struct FreeForward {
    logits: Vec<f32>,
    next_slot: SlotId,
}

impl Backend for FreeForward {
    fn name(&self) -> &'static str {
        "free"
    }
    fn window(&self) -> usize {
        1 << 40
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn allocate_slot(&mut self, _plan: &SessionPlan) -> Result<SlotId, EngineError> {
        self.next_slot += 1;
        Ok(self.next_slot)
    }
    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        Ok(batch.iter().map(|_| self.logits.clone()).collect())
    }
    fn release_slot(&mut self, _slot: SlotId) {}
}

struct Digits;
struct DigitStream;

impl TextDecoder for Digits {
    fn stream(&self, _prompt: &[u32]) -> Box<dyn DecodeStream> {
        Box::new(DigitStream)
    }
}

impl DecodeStream for DigitStream {
    fn push(&mut self, token: u32) -> String {
        (token % 10).to_string()
    }
}

fn overhead(c: &mut Criterion) {
    let logits: Vec<f32> = (0..VOCAB)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let mut group = c.benchmark_group("engine-overhead");
    for (label, sampling) in [
        ("greedy", SamplingParams::greedy()),
        (
            "top-k-top-p",
            SamplingParams {
                seed: Some(1),
                ..SamplingParams::default()
            },
        ),
    ] {
        for batch in [1usize, 8] {
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(format!("{label}/batch{batch}"), |b| {
                let backend = FreeForward {
                    logits: logits.clone(),
                    next_slot: 0,
                };
                let config = SchedulerConfig {
                    max_batch: batch,
                    ..SchedulerConfig::default()
                };
                let mut scheduler =
                    Scheduler::new(backend, Arc::new(Digits), config).expect("valid config");
                for _ in 0..batch {
                    let mut request =
                        GenerationRequest::new(vec![1, 2, 3], MaxNewTokens::Limited(1 << 39));
                    request.sampling = sampling.clone();
                    scheduler.submit(request).expect("admitted");
                }
                scheduler.step(); // prefill
                b.iter(|| scheduler.step());
            });
        }
    }
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
