//! The IREE program on the default model (skipped with `MLXCEL_SKIP_MODEL_TESTS=1`). The logits
//! comparison with the MLX backend is in mlxcel-engine (`xla.rs`), which has both backends.

use std::time::Instant;

use mlxcel_model::{LoadedModel, resolve_model};
use mlxcel_xla::{DecodeEntry, WeightFormat, XlaModel, XlaOptions};

use crate::{argmax, compiler, skip_model_tests};

fn load(format: WeightFormat) -> (LoadedModel, XlaModel) {
    let dir = resolve_model(None).expect("provision the default model");
    let loaded = LoadedModel::open(&dir).unwrap();
    let cache_root = mlxcel_model::cache_dir().unwrap();
    let started = Instant::now();
    let xla = XlaModel::load(
        &loaded.checkpoint,
        compiler(cache_root.join("xla").join("modules")),
        XlaOptions {
            format,
            max_batch: 2,
            ..XlaOptions::default()
        },
    )
    .unwrap();
    eprintln!(
        "{}: weights loaded in {:?}",
        format.name(),
        started.elapsed()
    );
    (loaded, xla)
}

/// The greedy reference (f32 arithmetic over the quantized weights; docs/model.md) starts ` Paris.\n\n`;
/// the default f16 weights give the same text. A second sequence decodes in the same batch.
#[test]
fn greedy_decoding_on_the_default_model() {
    if skip_model_tests() {
        return;
    }
    greedy(WeightFormat::F16);
}

/// The same with the quantized weights kept packed and dequantized inside the matmuls.
#[test]
fn greedy_decoding_with_packed_weights() {
    if skip_model_tests() {
        return;
    }
    greedy(WeightFormat::Packed);
}

/// The same with f32 weights: a measurement against the f16 default (docs/xla.md), so not part
/// of the default test run.
#[test]
#[ignore = "a measurement; run with --ignored"]
fn greedy_decoding_with_f32_weights() {
    greedy(WeightFormat::F32);
}

fn greedy(format: WeightFormat) {
    let (loaded, mut xla) = load(format);
    let prompt = loaded
        .tokenizer
        .encode("The capital of France is", false, false)
        .unwrap();
    let capacity = 256;
    let started = Instant::now();
    let logits = xla.prefill(capacity, 0, 0, &prompt).unwrap();
    eprintln!(
        "capacity {capacity}: compile/load + prefill {:?}",
        started.elapsed()
    );
    let other = xla.prefill(capacity, 1, 0, &prompt[..3]).unwrap();
    let mut next = [argmax(&logits) as u32, argmax(&other) as u32];
    let mut positions = [prompt.len(), 3];
    let mut generated = vec![next[0]];
    let started = Instant::now();
    let steps = 20;
    for _ in 0..steps {
        let out = xla
            .decode(
                capacity,
                &[
                    DecodeEntry {
                        row: 0,
                        position: positions[0],
                        token: next[0],
                    },
                    DecodeEntry {
                        row: 1,
                        position: positions[1],
                        token: next[1],
                    },
                ],
            )
            .unwrap();
        for r in 0..2 {
            next[r] = argmax(&out[r]) as u32;
            positions[r] += 1;
        }
        generated.push(next[0]);
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{}: decode {steps} steps of 2 sequences in {elapsed:?} ({:.1} steps/s)",
        format.name(),
        steps as f64 / elapsed.as_secs_f64()
    );
    let text = loaded.tokenizer.decode(&generated, true).unwrap();
    eprintln!("{text:?}");
    assert!(text.starts_with(" Paris.\n\nThe answer is"), "{text:?}");
}
