//! Pipeline stages ([`Stage`]): a tiny checkpoint split into two stages of one layer each, the
//! first stage's hidden states handed to the second as the pipe would carry them, gives the
//! whole model's logits bit for bit — dense and routed experts, tied and untied output (a tied
//! table projects on the first stage), soft-capped Gemma, f32 and int8 activations, prefill and
//! decode, two sequences in a step, and scored rows (speculative verification).

use mlxcel_core::{Activations, ForwardSeq, Kernels, KvCache, LlamaModel, Stage};
use mlxcel_model::Routing;

use crate::reference::{Moe, PLAIN, Storage, Variant, open_tiny, write_tiny};

const Q4: Storage = Storage::Quantized {
    bits: 4,
    group_size: 32,
    f16_scales: true,
};

const EXPERTS: Moe = Moe {
    experts: 8,
    top_k: 2,
    ffn: 32,
    routing: Routing::SoftmaxTopK { renormalize: true },
    shared: None,
    dense_first: false,
};

/// The steps each run takes: per sequence, its new tokens; and the first row each returns.
const STEPS: &[&[(&[u32], usize)]] = &[
    &[(&[1, 5, 9, 13, 17], 4), (&[2, 4, 6], 2)],
    &[(&[21], 0), (&[8], 0)],
    // A verification pass: the first sequence scores all three of its rows.
    &[(&[30, 31, 32], 0), (&[40], 0)],
    &[(&[50], 0), (&[60], 0)],
];

fn run_whole(model: &LlamaModel) -> Vec<Vec<Vec<f32>>> {
    let mut caches: Vec<KvCache> = (0..2).map(|_| model.new_cache(64)).collect();
    STEPS
        .iter()
        .map(|step| {
            let mut seqs: Vec<ForwardSeq<'_>> = caches
                .iter_mut()
                .zip(step.iter())
                .map(|(cache, (tokens, _))| ForwardSeq { cache, tokens })
                .collect();
            let firsts: Vec<usize> = step.iter().map(|(_, first)| *first).collect();
            model
                .forward_scored(&mut seqs, &firsts)
                .unwrap()
                .into_iter()
                .flatten()
                .collect()
        })
        .collect()
}

fn run_stages(first: &LlamaModel, second: &LlamaModel) -> Vec<Vec<Vec<f32>>> {
    let mut caches0: Vec<KvCache> = (0..2).map(|_| first.new_cache(64)).collect();
    let mut caches1: Vec<KvCache> = (0..2).map(|_| second.new_cache(64)).collect();
    let vocab = first.config().vocab_size;
    STEPS
        .iter()
        .map(|step| {
            let firsts: Vec<usize> = step.iter().map(|(_, first)| *first).collect();
            let mut seqs0: Vec<ForwardSeq<'_>> = caches0
                .iter_mut()
                .zip(step.iter())
                .map(|(cache, (tokens, _))| ForwardSeq { cache, tokens })
                .collect();
            let hidden = first.forward_stage(&mut seqs0, None, None).unwrap();
            first.finish_stage(&mut seqs0, &[&hidden]).unwrap();
            let mut seqs1: Vec<ForwardSeq<'_>> = caches1
                .iter_mut()
                .zip(step.iter())
                .map(|(cache, (tokens, _))| ForwardSeq { cache, tokens })
                .collect();
            let out = second
                .forward_stage(&mut seqs1, Some(hidden), Some(&firsts))
                .unwrap();
            second.finish_stage(&mut seqs1, &[&out]).unwrap();
            if first.stage().head {
                first.project_rows(&out).unwrap()
            } else {
                out.to_rows_f32(vocab).unwrap()
            }
        })
        .collect()
}

fn check(variant: Variant, seed: u64, activations: Activations) {
    let tiny = write_tiny(variant, seed);
    let kernels = Kernels {
        activations,
        ..Kernels::native()
    };
    let whole = LlamaModel::load_with(&open_tiny(&tiny), kernels).unwrap();
    let config = whole.config().clone();
    let stage = |rank| {
        let stage = Stage::of_pipeline(&config, &[1, 2], rank).unwrap();
        LlamaModel::load_stage(&open_tiny(&tiny), kernels, stage).unwrap()
    };
    let (first, second) = (stage(0), stage(1));
    assert_eq!(
        first.stage().head,
        variant.tied,
        "a tied table projects on rank 0"
    );
    assert!(first.weight_bytes() < whole.weight_bytes());
    assert!(second.weight_bytes() < whole.weight_bytes());
    let expected = run_whole(&whole);
    let got = run_stages(&first, &second);
    let bits = |steps: &[Vec<Vec<f32>>]| -> Vec<Vec<Vec<u32>>> {
        steps
            .iter()
            .map(|rows| {
                rows.iter()
                    .map(|r| r.iter().map(|x| x.to_bits()).collect())
                    .collect()
            })
            .collect()
    };
    assert_eq!(
        bits(&got),
        bits(&expected),
        "{variant:?} with {activations:?} activations: two stages differ from the whole model"
    );
}

#[test]
fn two_stages_give_the_whole_models_logits_bit_for_bit() {
    for activations in [Activations::F32, Activations::Int8] {
        check(
            Variant {
                storage: Q4,
                ..PLAIN
            },
            400,
            activations,
        );
        check(
            Variant {
                storage: Q4,
                tied: true,
                ..PLAIN
            },
            401,
            activations,
        );
        check(
            Variant {
                storage: Q4,
                qk_norm: true,
                moe: Some(EXPERTS),
                ..PLAIN
            },
            402,
            activations,
        );
        check(
            Variant {
                storage: Q4,
                gemma: Some(2),
                tied: true,
                ..PLAIN
            },
            403,
            activations,
        );
    }
}

#[test]
fn a_stage_refuses_what_it_does_not_hold() {
    let tiny = write_tiny(
        Variant {
            storage: Q4,
            ..PLAIN
        },
        410,
    );
    let checkpoint = open_tiny(&tiny);
    let config = checkpoint.config().clone();
    let second = LlamaModel::load_stage(
        &checkpoint,
        Kernels::native(),
        Stage::of_pipeline(&config, &[1, 2], 1).unwrap(),
    )
    .unwrap();
    let mut cache = second.new_cache(8);
    let mut seqs = [ForwardSeq {
        cache: &mut cache,
        tokens: &[1, 2],
    }];
    let err = second
        .forward_stage(&mut seqs, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no embedding table"), "{err}");
    let wrong = mlxcel_core::Array::from_f32(&[0.0; 64], &[1, 64]).unwrap();
    let err = second
        .forward_stage(&mut seqs, Some(wrong), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("hidden states of shape [1, 64]"), "{err}");
    for ends in [&[2, 2][..], &[0, 2], &[1, 3], &[]] {
        assert!(Stage::of_pipeline(&config, ends, 0).is_err(), "{ends:?}");
    }
    assert!(Stage::of_pipeline(&config, &[1, 2], 2).is_err());
}
