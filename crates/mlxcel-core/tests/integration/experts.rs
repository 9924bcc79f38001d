//! Routed-expert MLPs (Qwen3-MoE checkpoints with per-expert tensors, written by the test) and
//! OLMoE's q/k norms over whole projections, against `reference.rs`'s plain f32 forward: a
//! prefill and four decode steps, dense and 4-bit quantized, f32 and int8 activations, on
//! mlxcel's kernels and on MLX's; and batches against sequences alone.

use mlxcel_core::{Activations, ForwardSeq, KernelBackend, Kernels, LlamaModel};
use mlxcel_model::Routing;

use crate::argmax;
use crate::reference::{
    Moe, PLAIN, Storage, Variant, assert_logits_close, check_variant_on, open_tiny, write_tiny,
};

const Q4: Storage = Storage::Quantized {
    bits: 4,
    group_size: 32,
    f16_scales: true,
};

/// Eight experts of 32, two per token, renormalized (Qwen3-MoE's `norm_topk_prob`).
const TOP2: Moe = Moe {
    experts: 8,
    top_k: 2,
    ffn: 32,
    routing: Routing::SoftmaxTopK { renormalize: true },
    shared: None,
    dense_first: false,
};

fn moe(moe: Moe, storage: Storage) -> Variant {
    Variant {
        storage,
        qk_norm: true,
        moe: Some(moe),
        ..PLAIN
    }
}

fn native(activations: Activations) -> Kernels {
    Kernels {
        activations,
        ..Kernels::native()
    }
}

/// A variant on mlxcel's kernels with f32 and int8 activations, and (dense weights) MLX's.
fn check_everywhere(variant: Variant, seed: u64) {
    check_variant_on(variant, seed, Some(native(Activations::F32)));
    check_variant_on(variant, seed, Some(native(Activations::Int8)));
    check_variant_on(
        variant,
        seed,
        Some(Kernels {
            backend: KernelBackend::Mlx,
            ..Kernels::native()
        }),
    );
}

#[test]
fn top2_renormalized_matches_the_reference() {
    check_everywhere(moe(TOP2, Storage::F32), 300);
    check_everywhere(moe(TOP2, Q4), 301);
}

#[test]
fn top4_without_renormalizing_matches_the_reference() {
    let top4 = Moe {
        top_k: 4,
        routing: Routing::SoftmaxTopK { renormalize: false },
        ..TOP2
    };
    check_everywhere(moe(top4, Storage::F32), 310);
    check_everywhere(moe(top4, Q4), 311);
}

#[test]
fn top_k_then_softmax_matches_the_reference() {
    let mixtral = Moe {
        routing: Routing::TopKSoftmax,
        ..TOP2
    };
    check_everywhere(moe(mixtral, Storage::F32), 320);
    check_everywhere(moe(mixtral, Q4), 321);
}

/// Qwen2-MoE's shared expert, gated by the sigmoid of its own row, beside a dense first layer.
#[test]
fn a_shared_expert_and_a_dense_layer_match_the_reference() {
    let shared = Moe {
        top_k: 4,
        shared: Some(64),
        dense_first: true,
        routing: Routing::SoftmaxTopK { renormalize: false },
        ..TOP2
    };
    check_everywhere(moe(shared, Storage::F32), 330);
    check_everywhere(moe(shared, Q4), 331);
}

/// With per-head q/k norms an MoE model's layers, experts included, run as the fused
/// decoder-layer node on mlxcel's kernels, and match the reference (f32 and int8 activations).
#[test]
fn routed_experts_run_inside_the_fused_layer_node() {
    let variant = moe(TOP2, Q4);
    check_everywhere(variant, 345);
    let tiny = write_tiny(variant, 345);
    let model = LlamaModel::load_with(&open_tiny(&tiny), Kernels::native()).unwrap();
    assert!(
        model
            .execution()
            .contains("routed-expert MLPs inside the fused layer node"),
        "{}",
        model.execution()
    );
}

/// OLMoE's q and k norms, one RMSNorm over all heads, with experts and on a dense model; with
/// quantized weights both run as the fused decoder-layer node, which norms the whole
/// projections as the per-op graph does.
#[test]
fn whole_q_k_norms_match_the_reference() {
    let olmoe = Variant {
        qk_norm_whole: true,
        ..moe(TOP2, Storage::F32)
    };
    check_everywhere(olmoe, 340);
    let olmoe_q4 = Variant {
        qk_norm_whole: true,
        ..moe(TOP2, Q4)
    };
    check_everywhere(olmoe_q4, 342);
    let tiny = write_tiny(olmoe_q4, 342);
    let model = LlamaModel::load_with(&open_tiny(&tiny), Kernels::native()).unwrap();
    assert!(
        model
            .execution()
            .contains("routed-expert MLPs inside the fused layer node"),
        "{}",
        model.execution()
    );
    let dense = Variant {
        storage: Q4,
        qk_norm: true,
        qk_norm_whole: true,
        ..PLAIN
    };
    check_everywhere(dense, 341);
    let tiny = write_tiny(dense, 341);
    let model = LlamaModel::load_with(&open_tiny(&tiny), Kernels::native()).unwrap();
    assert_eq!(model.execution(), "fused layers");
}

/// Sequences prefilled and decoded together get the logits they get alone: with int8
/// activations the same bits (each token is routed from its own row, and each expert's matmul
/// computes a row from that row alone), with f32 ones the same to rounding.
#[test]
fn batched_steps_give_each_sequence_its_logits_alone() {
    let variant = moe(
        Moe {
            top_k: 4,
            shared: Some(64),
            ..TOP2
        },
        Q4,
    );
    let tiny = write_tiny(variant, 350);
    let checkpoint = open_tiny(&tiny);
    for activations in [Activations::Int8, Activations::F32] {
        let model = LlamaModel::load_with(&checkpoint, native(activations)).unwrap();
        assert!(
            model.execution().contains("routed-expert"),
            "{}",
            model.execution()
        );
        let prompts: [&[u32]; 3] = [&[1, 2], &[5, 9, 2, 44, 61, 7], &[70]];
        let steps = 4;
        // Alone: each sequence's logits at every step.
        let alone: Vec<Vec<Vec<f32>>> = prompts
            .iter()
            .map(|prompt| {
                let mut cache = model.new_cache(32);
                let mut tokens = prompt.to_vec();
                let mut rows = vec![
                    model
                        .forward(&mut [ForwardSeq {
                            cache: &mut cache,
                            tokens: &tokens,
                        }])
                        .unwrap()
                        .remove(0),
                ];
                for _ in 0..steps {
                    let next = argmax(rows.last().unwrap());
                    tokens.push(next);
                    rows.push(
                        model
                            .forward(&mut [ForwardSeq {
                                cache: &mut cache,
                                tokens: &[next],
                            }])
                            .unwrap()
                            .remove(0),
                    );
                }
                rows
            })
            .collect();
        // Together, each decoding the tokens it chose alone.
        let mut caches: Vec<_> = (0..3).map(|_| model.new_cache(32)).collect();
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .zip(prompts)
            .map(|(cache, tokens)| ForwardSeq { cache, tokens })
            .collect();
        let mut together = vec![model.forward(&mut seqs).unwrap()];
        drop(seqs);
        for step in 0..steps {
            let next: Vec<u32> = alone.iter().map(|rows| argmax(&rows[step])).collect();
            let mut seqs: Vec<ForwardSeq<'_>> = caches
                .iter_mut()
                .zip(&next)
                .map(|(cache, token)| ForwardSeq {
                    cache,
                    tokens: std::slice::from_ref(token),
                })
                .collect();
            together.push(model.forward(&mut seqs).unwrap());
        }
        for (step, rows) in together.iter().enumerate() {
            for (seq, row) in rows.iter().enumerate() {
                let what = format!("{activations:?} step {step} sequence {seq}");
                match activations {
                    Activations::Int8 => assert!(
                        row.iter()
                            .zip(&alone[seq][step])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: not the same bits batched and alone"
                    ),
                    Activations::F32 | Activations::Mixed => {
                        assert_logits_close(row, &alone[seq][step], 1e-5, &what)
                    }
                }
            }
        }
    }
}

/// The fused routed-expert node (mlxcel's kernels with fused layers) against the per-op graph
/// it replaces (`fused_layers: false`, which routes on the host): the same bits for every
/// routing, with a shared expert and a dense first layer, with int8 and f32 activations, over a
/// prefill of three sequences together (several tokens per expert) and four decode steps.
/// A dense v projection beside the quantized weights keeps the attention on the per-op graph,
/// so that the two models differ only in the MoE block (with every projection quantized the
/// layers run as the fused decoder-layer node, whose attention is not the per-op graph's to the
/// bit: `routed_experts_run_inside_the_fused_layer_node` checks that path).
#[test]
fn the_fused_node_gives_the_per_op_graphs_bits() {
    let variants = [
        (TOP2, 360),
        (
            Moe {
                top_k: 4,
                routing: Routing::SoftmaxTopK { renormalize: false },
                ..TOP2
            },
            361,
        ),
        (
            Moe {
                routing: Routing::TopKSoftmax,
                ..TOP2
            },
            362,
        ),
        (
            Moe {
                top_k: 4,
                shared: Some(64),
                dense_first: true,
                routing: Routing::SoftmaxTopK { renormalize: false },
                ..TOP2
            },
            363,
        ),
    ];
    for (variant, seed) in variants {
        let tiny = write_tiny(
            Variant {
                v_storage: Some(Storage::F32),
                ..moe(variant, Q4)
            },
            seed,
        );
        let checkpoint = open_tiny(&tiny);
        for activations in [Activations::Int8, Activations::F32] {
            let node = LlamaModel::load_with(&checkpoint, native(activations)).unwrap();
            let graph = LlamaModel::load_with(
                &checkpoint,
                Kernels {
                    fused_layers: false,
                    ..native(activations)
                },
            )
            .unwrap();
            assert!(
                node.execution().contains("one fused node"),
                "{}",
                node.execution()
            );
            assert!(
                graph.execution().contains("FUSED_LAYERS=off"),
                "{}",
                graph.execution()
            );
            let run = |model: &LlamaModel| {
                let prompts: [&[u32]; 3] = [&[1, 2, 3], &[5, 9, 2, 44, 61, 7, 8, 30], &[70]];
                let mut caches: Vec<_> = (0..3).map(|_| model.new_cache(32)).collect();
                let mut seqs: Vec<ForwardSeq<'_>> = caches
                    .iter_mut()
                    .zip(prompts)
                    .map(|(cache, tokens)| ForwardSeq { cache, tokens })
                    .collect();
                let mut steps = vec![model.forward(&mut seqs).unwrap()];
                drop(seqs);
                for _ in 0..4 {
                    let next: Vec<u32> = steps.last().unwrap().iter().map(|r| argmax(r)).collect();
                    let mut seqs: Vec<ForwardSeq<'_>> = caches
                        .iter_mut()
                        .zip(&next)
                        .map(|(cache, token)| ForwardSeq {
                            cache,
                            tokens: std::slice::from_ref(token),
                        })
                        .collect();
                    steps.push(model.forward(&mut seqs).unwrap());
                }
                // One sequence alone: a decode step of one token (no gathering).
                let mut cache = model.new_cache(32);
                let mut alone = model
                    .forward(&mut [ForwardSeq {
                        cache: &mut cache,
                        tokens: &[3, 4],
                    }])
                    .unwrap();
                let next = argmax(&alone[0]);
                alone.extend(
                    model
                        .forward(&mut [ForwardSeq {
                            cache: &mut cache,
                            tokens: &[next],
                        }])
                        .unwrap(),
                );
                steps.push(alone);
                steps
            };
            let (fused, reference) = (run(&node), run(&graph));
            for (step, (a, b)) in fused.iter().zip(&reference).enumerate() {
                for (seq, (a, b)) in a.iter().zip(b).enumerate() {
                    let differ = a
                        .iter()
                        .zip(b)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count();
                    assert_eq!(
                        differ, 0,
                        "seed {seed} {activations:?} step {step} sequence {seq}: {differ} logits differ"
                    );
                }
            }
        }
    }
}

/// The bytes a decode token reads count `top_k` of each layer's routed experts: the same
/// weights routed to 2, 4 or all 8 experts read 6/8, 4/8 and none of the experts' bytes less
/// than all of them.
#[test]
fn a_token_reads_only_its_routed_experts_bytes() {
    let read = |top_k: usize| {
        let tiny = write_tiny(moe(Moe { top_k, ..TOP2 }, Q4), 370);
        let model = LlamaModel::load_with(&open_tiny(&tiny), native(Activations::Int8)).unwrap();
        (model.weight_bytes(), model.token_read_bytes())
    };
    let (all, every) = read(8);
    let (same, two) = read(2);
    let (_, four) = read(4);
    assert_eq!(all, same, "top_k must not change the weights");
    assert!(two < four && four < every, "{two} {four} {every}");
    // every − two = 6/8 of the experts' bytes, every − four = 4/8.
    assert_eq!((every - two) * 2, (every - four) * 3);
}

/// Decode speed on Qwen3-30B-A3B's layer shape (hidden 2048, 32 query and 4 key/value heads of
/// 128, 128 experts of 768, eight per token), four layers of random 4-bit weights (groups of
/// 64, f16 scales; an f32 router), int8 activations; beside it the same layers with one dense
/// MLP of 8 × 768 (the bytes a token reads from its eight experts) on the fused layer. Prints
/// tokens per second and the read bandwidth over the bytes a token reads. Run with
/// `cargo test -p mlxcel-core --release --test integration moe_decode_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a benchmark: writes 1.3 GB of weights"]
fn moe_decode_speed() {
    use std::time::Instant;
    const HIDDEN: usize = 2048;
    const HEADS: usize = 32;
    const KV_HEADS: usize = 4;
    const HEAD_DIM: usize = 128;
    const EXPERTS: usize = 128;
    const TOP_K: usize = 8;
    const FFN: usize = 768;
    const LAYERS: usize = 4;
    const VOCAB: usize = 4096;
    const GROUP: usize = 64;

    for routed in [true, false] {
        let dir = write_random_checkpoint(routed);
        let checkpoint = mlxcel_model::Checkpoint::open(dir.path()).unwrap();
        let started = Instant::now();
        let model = LlamaModel::load_with(&checkpoint, native(Activations::Int8)).unwrap();
        let load = started.elapsed();
        let mut cache = model.new_cache(256);
        let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
        let mut logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &prompt,
            }])
            .unwrap()
            .remove(0);
        let steps = 24;
        let started = Instant::now();
        for _ in 0..steps {
            let next = argmax(&logits);
            logits = model
                .forward(&mut [ForwardSeq {
                    cache: &mut cache,
                    tokens: &[next],
                }])
                .unwrap()
                .remove(0);
        }
        let per_token = started.elapsed().as_secs_f64() / steps as f64;
        // 4-bit codes plus an f16 scale and bias per group of 64.
        let bytes = |rows: usize, cols: usize| (rows * cols) as f64 * (0.5 + 4.0 / GROUP as f64);
        let attention =
            bytes((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN) + bytes(HIDDEN, HEADS * HEAD_DIM);
        let mlp = TOP_K as f64 * (bytes(2 * FFN, HIDDEN) + bytes(HIDDEN, FFN));
        let router = if routed {
            (EXPERTS * HIDDEN * 4) as f64
        } else {
            0.0
        };
        let read = LAYERS as f64 * (attention + mlp + router) + bytes(VOCAB, HIDDEN);
        println!(
            "{}: {} ({} threads), load {:.1} s, decode {:.2} ms/token = {:.1} tokens/s, \
             {:.1} MB read per token = {:.2} GB/s",
            if routed {
                "routed (128 experts, top-8)"
            } else {
                "dense MLP of 8 × 768"
            },
            model.execution(),
            model.kernels().threads,
            load.as_secs_f64(),
            per_token * 1e3,
            1.0 / per_token,
            read / 1e6,
            read / per_token / 1e9,
        );
    }

    /// The checkpoint: routed layers, or the dense MLP of the same per-token bytes.
    fn write_random_checkpoint(routed: bool) -> tempfile::TempDir {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut words = |n: usize| -> Vec<u8> {
            (0..n)
                .flat_map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state as u32).to_le_bytes()
                })
                .collect()
        };
        let f16s = |n: usize, value: f32| -> Vec<u8> {
            let bits = half::f16::from_f32(value).to_le_bytes();
            (0..n).flat_map(|_| bits).collect()
        };
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut quantized = |tensors: &mut Vec<_>, module: &str, rows: usize, cols: usize| {
            let groups = cols / GROUP;
            // Scale 0.01, bias centring the codes: weights in ±0.075.
            tensors.push((
                format!("{module}.weight"),
                safetensors::Dtype::U32,
                vec![rows, cols / 8],
                words(rows * cols / 8),
            ));
            tensors.push((
                format!("{module}.scales"),
                safetensors::Dtype::F16,
                vec![rows, groups],
                f16s(rows * groups, 0.01),
            ));
            tensors.push((
                format!("{module}.biases"),
                safetensors::Dtype::F16,
                vec![rows, groups],
                f16s(rows * groups, -0.075),
            ));
        };
        let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1f32.to_le_bytes()).collect() };
        let norm = |tensors: &mut Vec<_>, name: String, n: usize| {
            tensors.push((name, safetensors::Dtype::F32, vec![n], ones(n)));
        };
        quantized(&mut tensors, "model.embed_tokens", VOCAB, HIDDEN);
        for layer in 0..LAYERS {
            let p = format!("model.layers.{layer}");
            norm(&mut tensors, format!("{p}.input_layernorm.weight"), HIDDEN);
            norm(
                &mut tensors,
                format!("{p}.post_attention_layernorm.weight"),
                HIDDEN,
            );
            norm(
                &mut tensors,
                format!("{p}.self_attn.q_norm.weight"),
                HEAD_DIM,
            );
            norm(
                &mut tensors,
                format!("{p}.self_attn.k_norm.weight"),
                HEAD_DIM,
            );
            for (m, rows) in [
                ("q_proj", HEADS * HEAD_DIM),
                ("k_proj", KV_HEADS * HEAD_DIM),
                ("v_proj", KV_HEADS * HEAD_DIM),
            ] {
                quantized(&mut tensors, &format!("{p}.self_attn.{m}"), rows, HIDDEN);
            }
            quantized(
                &mut tensors,
                &format!("{p}.self_attn.o_proj"),
                HIDDEN,
                HEADS * HEAD_DIM,
            );
            let mlps: Vec<(String, usize)> = if routed {
                let router: Vec<u8> = crate::pseudo_random(EXPERTS * HIDDEN, layer as u64)
                    .iter()
                    .flat_map(|x| (x * 0.05).to_le_bytes())
                    .collect();
                tensors.push((
                    format!("{p}.mlp.gate.weight"),
                    safetensors::Dtype::F32,
                    vec![EXPERTS, HIDDEN],
                    router,
                ));
                (0..EXPERTS)
                    .map(|j| (format!("{p}.mlp.experts.{j}"), FFN))
                    .collect()
            } else {
                vec![(format!("{p}.mlp"), TOP_K * FFN)]
            };
            for (mlp, ffn) in mlps {
                quantized(&mut tensors, &format!("{mlp}.gate_proj"), ffn, HIDDEN);
                quantized(&mut tensors, &format!("{mlp}.up_proj"), ffn, HIDDEN);
                quantized(&mut tensors, &format!("{mlp}.down_proj"), HIDDEN, ffn);
            }
        }
        norm(&mut tensors, "model.norm.weight".into(), HIDDEN);
        let dir = tempfile::tempdir().unwrap();
        let (architecture, model_type) = if routed {
            ("Qwen3MoeForCausalLM", "qwen3_moe")
        } else {
            ("Qwen3ForCausalLM", "qwen3")
        };
        let mut config = serde_json::json!({
            "architectures": [architecture],
            "model_type": model_type,
            "hidden_size": HIDDEN,
            "intermediate_size": TOP_K * FFN,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "num_hidden_layers": LAYERS,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "vocab_size": VOCAB,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": true,
            "eos_token_id": 0,
            "num_experts": EXPERTS,
            "num_experts_per_tok": TOP_K,
            "moe_intermediate_size": FFN,
            "norm_topk_prob": true,
            "quantization": {"bits": 4, "group_size": GROUP},
        });
        if !routed {
            for key in [
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "norm_topk_prob",
            ] {
                config.as_object_mut().unwrap().remove(key);
            }
        }
        std::fs::write(
            dir.path().join("config.json"),
            serde_json::to_string(&config).unwrap(),
        )
        .unwrap();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                (
                    name.clone(),
                    safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
        dir
    }
}
