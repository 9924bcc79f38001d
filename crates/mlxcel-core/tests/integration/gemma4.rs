//! Gemma 4 in its released models' layout (a larger head on the full layers, the last layers
//! reusing earlier layers' keys and values, per-layer token inputs) on a tiny random checkpoint
//! written here: the same logits however the prompt is cut into steps (across the sliding
//! window) and batched or alone; caches sized per layer, saved and restored; a cached prefix
//! shared. mlx-lm's agreement is scripts/check-families' (`gemma4_text-*` variants).

use std::path::Path;

use mlxcel_core::{ForwardSeq, Kernels, LlamaModel};
use mlxcel_model::{Checkpoint, ModelConfig, ModuleKind, expected_modules};
use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView;

use crate::pseudo_random;
use crate::reference::assert_logits_close;

const VOCAB: usize = 128;

/// Writes a random six-layer Gemma 4 (sliding ×3, full, sliding, full; window 8; heads of 16 on
/// the sliding layers and 32 on the full ones; the last two layers reusing layers 2 and 3's keys
/// and values with double-wide MLPs; per-layer inputs of 8) into `dir`, every tensor the config
/// calls for.
fn write_gemma4(dir: &Path) {
    let config = serde_json::json!({
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
        "intermediate_size": 96, "vocab_size": VOCAB, "max_position_embeddings": 4096,
        "sliding_window": 8, "num_kv_shared_layers": 2, "use_double_wide_mlp": true,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": true,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                        "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}
        }
    });
    let text = config.to_string();
    std::fs::write(dir.join("config.json"), &text).unwrap();
    let parsed = ModelConfig::from_json(&dir.join("config.json"), &text).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let values: Vec<u8> = pseudo_random(n, tensors.len() as u64 + 1)
            .into_iter()
            .flat_map(|v| (offset + scale * v).to_le_bytes())
            .collect();
        tensors.push((name, shape, values));
    };
    for module in expected_modules(&parsed) {
        let weight = format!("{}.weight", module.name);
        match module.kind {
            ModuleKind::Linear { out, inp, .. } => {
                add(weight, vec![out, inp], 2.0 * (3.0 / inp as f32).sqrt(), 0.0);
            }
            ModuleKind::Embedding { vocab, hidden } => add(weight, vec![vocab, hidden], 0.5, 0.0),
            ModuleKind::Norm { dim } => add(weight, vec![dim], 0.1, 1.0),
        }
    }
    for layer in 0..6 {
        add(
            format!("model.layers.{layer}.layer_scalar"),
            vec![1],
            0.1,
            1.0,
        );
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(StDtype::F32, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn tiny() -> (tempfile::TempDir, LlamaModel) {
    let dir = tempfile::tempdir().unwrap();
    write_gemma4(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).expect("the tiny Gemma 4 validates");
    let model = LlamaModel::load_with(&checkpoint, Kernels::from_env().unwrap()).unwrap();
    (dir, model)
}

fn prompt(len: usize, seed: u64) -> Vec<u32> {
    pseudo_random(len, seed)
        .into_iter()
        .map(|v| ((v + 1.0) * 0.5 * (VOCAB - 1) as f32) as u32)
        .collect()
}

/// The last position's logits of `tokens` fed in `pieces` (lengths) through one cache.
fn in_pieces(model: &LlamaModel, tokens: &[u32], pieces: &[usize]) -> Vec<f32> {
    let mut cache = model.new_cache(tokens.len());
    let mut at = 0;
    let mut logits = Vec::new();
    for &piece in pieces {
        logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &tokens[at..at + piece],
            }])
            .unwrap()
            .remove(0);
        at += piece;
    }
    assert_eq!(at, tokens.len());
    logits
}

#[test]
fn the_cache_holds_the_layers_with_keys_of_their_own_at_their_head_sizes() {
    let (_dir, model) = tiny();
    assert!(model.execution().contains("varied head sizes"));
    // Layers 0-2 (heads of 16) and 3 (32) hold keys and values; 4 and 5 reuse 2 and 3's.
    let floats = 2 * 2 * (3 * 16 + 32);
    assert_eq!(model.kv_bytes_per_position(), 4 * floats);
    let cache = model.new_cache(64);
    assert_eq!(cache.floats_per_position(), floats);
    assert_eq!(cache.bytes_per_position(), 4 * floats);
}

#[test]
fn prompts_cut_into_steps_get_the_logits_of_one_step() {
    let (_dir, model) = tiny();
    let tokens = prompt(40, 5);
    let whole = in_pieces(&model, &tokens, &[40]);
    // Across the window of 8, with single-token steps between.
    let pieces = in_pieces(&model, &tokens, &[13, 1, 20, 1, 5]);
    assert_logits_close(&pieces, &whole, 1e-5, "uneven pieces");
    let decode = in_pieces(&model, &tokens, &[3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 27]);
    assert_logits_close(&decode, &whole, 1e-5, "decode steps");
}

#[test]
fn sequences_batched_get_the_logits_they_get_alone() {
    let (_dir, model) = tiny();
    let prompts = [prompt(20, 1), prompt(3, 2), prompt(33, 3)];
    let next = [7u32, 9, 11];
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut all = p.clone();
            all.extend(next);
            in_pieces(&model, &all, &[p.len(), 1, 1, 1])
        })
        .collect();
    let mut caches: Vec<_> = prompts
        .iter()
        .map(|p| model.new_cache(p.len() + 3))
        .collect();
    let mut logits = Vec::new();
    for step in 0..4 {
        let decode = [next[step.max(1) - 1]];
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .zip(&prompts)
            .map(|(cache, p)| ForwardSeq {
                cache,
                tokens: if step == 0 { &p[..] } else { &decode[..] },
            })
            .collect();
        logits = model.forward(&mut seqs).unwrap();
    }
    for (i, (got, want)) in logits.iter().zip(&alone).enumerate() {
        assert_logits_close(got, want, 1e-5, &format!("sequence {i} batched"));
    }
}

#[test]
fn a_saved_cache_and_a_shared_prefix_resume_exactly() {
    let (_dir, model) = tiny();
    let tokens = prompt(30, 9);
    let mut cache = model.new_cache(31);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens[..29],
        }])
        .unwrap();
    let next = [tokens[29]];
    let saved = cache.export(29).unwrap();
    assert_eq!(saved.len(), 29 * cache.floats_per_position());
    let mut restored = model.new_cache(31);
    restored.import(&saved, 29).unwrap();
    let mut shared = model.new_cache(31);
    shared.copy_prefix_from(&cache, 29).unwrap();
    let step = |cache: &mut mlxcel_core::KvCache| {
        model
            .forward(&mut [ForwardSeq {
                cache,
                tokens: &next,
            }])
            .unwrap()
            .remove(0)
    };
    let want = step(&mut cache);
    assert_eq!(step(&mut restored), want, "restored from export");
    assert_eq!(step(&mut shared), want, "a shared prefix");
    // Importing data of another shape is refused.
    let mut other = model.new_cache(31);
    assert!(other.import(&saved[1..], 29).is_err());
}
