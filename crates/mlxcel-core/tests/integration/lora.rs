//! LoRA adapters on the default model: random adapters built here (the oracle against llama.cpp
//! on a converted adapter is `scripts/check-lora`). A scale of 0 is the model alone, and
//! sequences with different adapters in one step get what each gets alone.

use mlxcel_core::{ForwardSeq, KernelBackend, Kernels, LlamaModel};
use mlxcel_model::{LoadedModel, LoraAdapter, LoraTarget, LoraWeight, ModelConfig, resolve_model};

use crate::{argmax, assert_close, pseudo_random};

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A random adapter of `rank` on `targets` of every layer (values scaled so that its delta
/// moves the logits without swamping them).
fn random_adapter(
    config: &ModelConfig,
    rank: usize,
    targets: &[LoraTarget],
    seed: u64,
) -> LoraAdapter {
    let mut weights = Vec::new();
    for layer in 0..config.num_hidden_layers {
        for (t, &target) in targets.iter().enumerate() {
            let (out_dim, in_dim) = target.shape(config, layer).unwrap();
            let s = seed * 1000 + layer as u64 * 10 + t as u64;
            let a = pseudo_random(rank * in_dim, s)
                .iter()
                .map(|x| x * 0.05)
                .collect();
            let b = pseudo_random(out_dim * rank, s + 7)
                .iter()
                .map(|x| x * 0.05)
                .collect();
            weights.push(LoraWeight {
                layer,
                target,
                rank,
                a,
                b,
                in_dim,
                out_dim,
            });
        }
    }
    LoraAdapter {
        path: format!("random-{seed}").into(),
        alpha: 2.0 * rank as f32,
        task_name: String::new(),
        prompt_prefix: String::new(),
        weights,
    }
}

fn model_with_adapters() -> (LoadedModel, LlamaModel) {
    let dir = resolve_model(None).expect("provision the default model");
    let loaded = LoadedModel::open(&dir).unwrap();
    let mut model = LlamaModel::load(&loaded.checkpoint).unwrap();
    let config = loaded.config();
    let attention = [LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O];
    let mlp = [LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down];
    model
        .set_adapters(&[
            random_adapter(config, 16, &attention, 1),
            random_adapter(config, 4, &mlp, 2),
        ])
        .unwrap();
    (loaded, model)
}

/// Prefill then `n` greedy decode steps of each prompt, all in the same steps, each with its
/// scales; returns each sequence's logits after the prefill and its tokens.
fn run_together(
    model: &LlamaModel,
    prompts: &[&[u32]],
    scales: &[&[f32]],
    n: usize,
) -> Vec<(Vec<f32>, Vec<u32>)> {
    let mut caches: Vec<_> = prompts
        .iter()
        .map(|p| model.new_cache(p.len() + n + 1))
        .collect();
    let mut seqs: Vec<ForwardSeq<'_>> = caches
        .iter_mut()
        .zip(prompts)
        .map(|(cache, &tokens)| ForwardSeq { cache, tokens })
        .collect();
    let firsts: Vec<usize> = prompts.iter().map(|p| p.len() - 1).collect();
    let first = model
        .forward_scored_with_adapters(&mut seqs, &firsts, scales)
        .unwrap();
    drop(seqs);
    let mut out: Vec<(Vec<f32>, Vec<u32>)> = first
        .into_iter()
        .map(|mut rows| {
            let logits = rows.remove(0);
            let next = argmax(&logits);
            (logits, vec![next])
        })
        .collect();
    for _ in 0..n {
        let last: Vec<[u32; 1]> = out.iter().map(|(_, t)| [*t.last().unwrap()]).collect();
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .zip(&last)
            .map(|(cache, tokens)| ForwardSeq { cache, tokens })
            .collect();
        let rows = model
            .forward_scored_with_adapters(&mut seqs, &vec![0; last.len()], scales)
            .unwrap();
        for ((_, tokens), mut row) in out.iter_mut().zip(rows) {
            tokens.push(argmax(&row.remove(0)));
        }
    }
    out
}

#[test]
fn zero_scales_are_the_model_alone_and_an_adapter_changes_the_logits() {
    if skip() {
        return;
    }
    let (loaded, model) = model_with_adapters();
    let prompt = loaded
        .tokenizer
        .encode("The capital of France is", false, false)
        .unwrap();
    let base = {
        let mut cache = model.new_cache(64);
        model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }])
            .unwrap()
            .remove(0)
    };
    let zero = run_together(&model, &[&prompt], &[&[0.0, 0.0]], 0);
    assert_eq!(
        zero[0].0, base,
        "scale 0 runs the fused path, bit for bit the model alone"
    );
    let adapted = run_together(&model, &[&prompt], &[&[1.0]], 0);
    let moved = adapted[0]
        .0
        .iter()
        .zip(&base)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(moved > 1e-2, "the adapter moved the logits by only {moved}");
    // Linear in the scale through the first layer's delta: a doubled scale moves further.
    let doubled = run_together(&model, &[&prompt], &[&[2.0]], 0);
    let further = doubled[0]
        .0
        .iter()
        .zip(&base)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(further > moved, "scale 2 moved {further}, scale 1 {moved}");
    // More scales than adapters are refused.
    let mut cache = model.new_cache(64);
    let err = model
        .forward_scored_with_adapters(
            &mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }],
            &[0],
            &[&[1.0, 0.0, 1.0]],
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("3 scales") && err.contains("2 adapters"),
        "{err}"
    );
}

/// Three sequences, each with other adapters (one with none), prefilled and decoded in the same
/// steps, get the logits and tokens each gets alone.
#[test]
fn mixed_adapters_in_one_batch_match_each_sequence_alone() {
    if skip() {
        return;
    }
    let (loaded, model) = model_with_adapters();
    let tok = |text| loaded.tokenizer.encode(text, false, false).unwrap();
    let a = tok("The capital of France is");
    let b = tok("Rust is a systems programming language that");
    let c = tok("Once upon a time");
    let scales: [&[f32]; 3] = [&[1.0], &[], &[0.5, 1.5]];
    let together = run_together(&model, &[&a, &b, &c], &scales, 8);
    for (i, prompt) in [&a, &b, &c].into_iter().enumerate() {
        let alone = run_together(&model, &[prompt], &[scales[i]], 8).remove(0);
        assert_close(&together[i].0, &alone.0, 1e-3);
        assert_eq!(together[i].1, alone.1, "sequence {i}'s greedy tokens");
    }
    // The adapters changed what the adapted sequences generate or score.
    let base = run_together(&model, &[&a], &[&[]], 8).remove(0);
    assert_ne!(base.0, together[0].0);
}

/// The fused decoder-layer node with adapters inside it gives the per-op graph's logits and
/// tokens (`MLXCEL_FUSED_LAYERS=off`'s path) for one batch of four sequences: one adapter, another
/// adapter, none, and two adapters on the same projections. Without adapters the two paths
/// agree bit for bit, so what differs here is the deltas' arithmetic alone: the same products,
/// summed in another order inside the rank-r matmuls (MLX's f32 gemm beside the node's loops),
/// a few f32 roundings of each delta (~1e-7 of it) carried through 30 layers and then amplified
/// by the output projection. The measured difference is 3.7e-5 of `1 + |logit|` at worst (on a
/// 2-core AVX2 machine); the bound is 2e-4, while the adapters move the logits by more than 1e-2.
#[test]
fn the_fused_node_with_adapters_matches_the_per_op_graph() {
    fused_matches_per_op(false);
}

/// The same with every adapter value an f16 (as llama.cpp's converter writes adapters): the
/// pairs are then kept in f16, which the node widens as it reads them and the per-op graph
/// widens before its matmuls, so the two still agree as above.
#[test]
fn the_fused_node_with_f16_adapters_matches_the_per_op_graph() {
    fused_matches_per_op(true);
}

fn fused_matches_per_op(f16_values: bool) {
    if skip() {
        return;
    }
    let dir = resolve_model(None).expect("provision the default model");
    let loaded = LoadedModel::open(&dir).unwrap();
    let config = loaded.config();
    let kernels = Kernels::from_env().unwrap();
    if kernels.backend != KernelBackend::Native || !kernels.fused_layers {
        eprintln!(
            "the fused node is off in this environment (MLXCEL_KERNELS, MLXCEL_FUSED_LAYERS)"
        );
        return;
    }
    let attention = [LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O];
    let mlp = [LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down];
    let mut adapters = [
        random_adapter(config, 16, &attention, 1),
        random_adapter(config, 4, &mlp, 2),
        random_adapter(config, 8, &LoraTarget::ALL, 3),
    ];
    if f16_values {
        let round = |v: &mut Vec<f32>| {
            v.iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32())
        };
        for w in adapters.iter_mut().flat_map(|a| a.weights.iter_mut()) {
            round(&mut w.a);
            round(&mut w.b);
        }
    }
    let load = |fused_layers| {
        let mut model = LlamaModel::load_with(
            &loaded.checkpoint,
            Kernels {
                fused_layers,
                ..kernels
            },
        )
        .unwrap();
        model.set_adapters(&adapters).unwrap();
        model
    };
    let (fused, per_op) = (load(true), load(false));
    let tok = |text| loaded.tokenizer.encode(text, false, false).unwrap();
    let prompts = [
        tok("The capital of France is"),
        tok("Rust is a systems programming language that"),
        tok("Once upon a time"),
        tok("The three primary colours are"),
    ];
    let prompts: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let none: [&[f32]; 4] = [&[], &[], &[], &[]];
    let bits = |runs: &[(Vec<f32>, Vec<u32>)]| -> Vec<u32> {
        runs.iter()
            .flat_map(|r| r.0.iter().map(|x| x.to_bits()))
            .collect()
    };
    assert_eq!(
        bits(&run_together(&fused, &prompts, &none, 0)),
        bits(&run_together(&per_op, &prompts, &none, 0)),
        "without adapters the fused node and the per-op graph agree bit for bit"
    );
    let base = run_together(&fused, &prompts, &none, 0);
    let scales: [&[f32]; 4] = [&[1.0], &[0.0, 1.5], &[], &[0.5, 0.0, -1.0]];
    let a = run_together(&fused, &prompts, &scales, 6);
    let b = run_together(&per_op, &prompts, &scales, 6);
    let mut worst = 0f32;
    for (i, ((fa, ta), (fb, tb))) in a.iter().zip(&b).enumerate() {
        for (x, y) in fa.iter().zip(fb) {
            worst = worst.max((x - y).abs() / (1.0 + y.abs()));
        }
        assert_close(fa, fb, 2e-4);
        assert_eq!(ta, tb, "sequence {i}'s greedy tokens");
        let moved = fa
            .iter()
            .zip(&base[i].0)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        if scales[i].is_empty() {
            assert_eq!(moved, 0.0, "sequence {i} has no adapter");
        } else {
            assert!(
                moved > 1e-2,
                "sequence {i}'s adapters moved its logits by {moved}"
            );
        }
    }
    eprintln!("fused against per-op with adapters: worst relative difference {worst:e}");
}
