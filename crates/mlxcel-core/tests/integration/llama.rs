//! The llama forward on the real default model (provisioned once through the project's cached,
//! checksummed script; skipped with `MLXCEL_SKIP_MODEL_TESTS=1`).

use std::sync::OnceLock;

use mlxcel_core::{ForwardSeq, LlamaModel};
use mlxcel_model::{LoadedModel, resolve_model};

use crate::{argmax, assert_close, greedy};

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn default_model() -> &'static (LoadedModel, LlamaModel) {
    static MODEL: OnceLock<(LoadedModel, LlamaModel)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = resolve_model(None)
            .expect("provision the default model (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)");
        let loaded = LoadedModel::open(&dir).expect("the default model opens");
        let model = LlamaModel::load(&loaded.checkpoint).expect("the default model loads");
        (loaded, model)
    })
}

/// DESIGN.md's greedy reference in f32 arithmetic over the quantized weights.
#[test]
fn greedy_reference_text_on_the_default_model() {
    if skip() {
        return;
    }
    let (loaded, model) = default_model();
    let prompt = loaded
        .tokenizer
        .encode("The capital of France is", false, false)
        .unwrap();
    assert_eq!(prompt, [504, 3575, 282, 4649, 314]);
    let generated = greedy(model, &prompt, 30);
    let text = loaded.tokenizer.decode(&generated, true).unwrap();
    assert!(
        text.starts_with(" Paris.\n\nThe answer is: 2018-01-22 12:12:53."),
        "{text:?}"
    );
}

/// A batch of sequences of different lengths gives each the logits it gets alone, through
/// chunked prefill and batched decode.
#[test]
fn batched_and_chunked_steps_match_single_sequences() {
    if skip() {
        return;
    }
    let (loaded, model) = default_model();
    let tok = |text| loaded.tokenizer.encode(text, false, false).unwrap();
    let a = tok("The capital of France is");
    let b = tok("Rust is a systems programming language that");

    // Alone, in one prefill.
    let alone = |prompt: &[u32]| {
        let mut cache = model.new_cache(256);
        model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: prompt,
            }])
            .unwrap()
            .remove(0)
    };
    let (alone_a, alone_b) = (alone(&a), alone(&b));

    // Together: `b` prefilled in two chunks, the second in the same step as all of `a`.
    let (mut cache_a, mut cache_b) = (model.new_cache(256), model.new_cache(256));
    let split = 3;
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache_b,
            tokens: &b[..split],
        }])
        .unwrap();
    let together = model
        .forward(&mut [
            ForwardSeq {
                cache: &mut cache_a,
                tokens: &a,
            },
            ForwardSeq {
                cache: &mut cache_b,
                tokens: &b[split..],
            },
        ])
        .unwrap();
    assert_close(&together[0], &alone_a, 1e-3);
    assert_close(&together[1], &alone_b, 1e-3);
    assert_eq!((cache_a.len(), cache_b.len()), (a.len(), b.len()));

    // Batched decode of one token each matches decoding alone.
    let next_a = argmax(&alone_a);
    let next_b = argmax(&alone_b);
    let batched = model
        .forward(&mut [
            ForwardSeq {
                cache: &mut cache_a,
                tokens: &[next_a],
            },
            ForwardSeq {
                cache: &mut cache_b,
                tokens: &[next_b],
            },
        ])
        .unwrap();
    let mut solo = model.new_cache(256);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut solo,
            tokens: &b,
        }])
        .unwrap();
    let solo_b = model
        .forward(&mut [ForwardSeq {
            cache: &mut solo,
            tokens: &[next_b],
        }])
        .unwrap()
        .remove(0);
    assert_close(&batched[1], &solo_b, 1e-3);
}

#[test]
fn a_full_cache_and_bad_tokens_are_errors_not_crashes() {
    if skip() {
        return;
    }
    let (_, model) = default_model();
    let mut cache = model.new_cache(4);
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[1, 2, 3, 4, 5],
        }])
        .unwrap_err();
    assert!(err.to_string().contains("KV cache full"), "{err}");
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[49_152],
        }])
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    // The cache is untouched by the failed steps and still works.
    assert_eq!(cache.len(), 0);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[1, 2],
        }])
        .unwrap();
    assert_eq!(cache.len(), 2);
}
