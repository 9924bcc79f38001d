//! A hybrid model (Qwen3.5: gated-DeltaNet linear attention beside gated softmax attention) on a
//! tiny random checkpoint written here: its recurrent state is per sequence (batched or alone,
//! the same logits), carried across prefill pieces and decode steps, counted, rolled back to a
//! verification's checkpoints, saved and restored, and refused by name where it kept no copy
//! (rewound or cut elsewhere).

use std::path::Path;

use mlxcel_core::{ForwardSeq, Kernels, LlamaModel};
use mlxcel_model::Checkpoint;
use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView;

use crate::pseudo_random;
use crate::reference::assert_logits_close;

const HIDDEN: usize = 64;
const LAYERS: usize = 4;
const VOCAB: usize = 128;
const KEY_HEADS: usize = 2;
const VALUE_HEADS: usize = 4;
const KEY_DIM: usize = 16;
const VALUE_DIM: usize = 8;
const TAPS: usize = 4;

/// Writes a random Qwen3.5 (layers 0 and 2 linear, 1 and 3 gated attention) in Hugging Face's
/// layout (`conv1d.weight` `[channels, 1, taps]`, zero-centred norms) into `dir`.
fn write_qwen3_5(dir: &Path) {
    let config = serde_json::json!({
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5",
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "full_attention_interval": 2,
        "linear_num_key_heads": KEY_HEADS, "linear_num_value_heads": VALUE_HEADS,
        "linear_key_head_dim": KEY_DIM, "linear_value_head_dim": VALUE_DIM,
        "linear_conv_kernel_dim": TAPS, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut seed = 1u64;
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        seed += 1;
        let n: usize = shape.iter().product();
        let values: Vec<u8> = pseudo_random(n, seed)
            .into_iter()
            .flat_map(|v| (offset + scale * v).to_le_bytes())
            .collect();
        tensors.push((name, shape, values));
    };
    let gain = |inputs: usize| 2.0 * (3.0 / inputs as f32).sqrt();
    add(
        "model.embed_tokens.weight".into(),
        vec![VOCAB, HIDDEN],
        0.5,
        0.0,
    );
    let (key_dim, value_dim) = (KEY_HEADS * KEY_DIM, VALUE_HEADS * VALUE_DIM);
    let channels = 2 * key_dim + value_dim;
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        add(
            format!("{p}.input_layernorm.weight"),
            vec![HIDDEN],
            0.1,
            0.0,
        );
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![HIDDEN],
            0.1,
            0.0,
        );
        if layer % 2 == 0 {
            let a = format!("{p}.linear_attn");
            for (name, rows) in [
                ("in_proj_qkv", channels),
                ("in_proj_z", value_dim),
                ("in_proj_b", VALUE_HEADS),
                ("in_proj_a", VALUE_HEADS),
            ] {
                add(
                    format!("{a}.{name}.weight"),
                    vec![rows, HIDDEN],
                    gain(HIDDEN),
                    0.0,
                );
            }
            add(
                format!("{a}.conv1d.weight"),
                vec![channels, 1, TAPS],
                0.5,
                0.0,
            );
            add(format!("{a}.A_log"), vec![VALUE_HEADS], 1.0, 0.0);
            add(format!("{a}.dt_bias"), vec![VALUE_HEADS], 0.5, 0.0);
            add(format!("{a}.norm.weight"), vec![VALUE_DIM], 0.1, 1.0);
            add(
                format!("{a}.out_proj.weight"),
                vec![HIDDEN, value_dim],
                gain(value_dim),
                0.0,
            );
        } else {
            let s = format!("{p}.self_attn");
            add(
                format!("{s}.q_proj.weight"),
                vec![128, HIDDEN],
                gain(HIDDEN),
                0.0,
            );
            add(
                format!("{s}.k_proj.weight"),
                vec![32, HIDDEN],
                gain(HIDDEN),
                0.0,
            );
            add(
                format!("{s}.v_proj.weight"),
                vec![32, HIDDEN],
                gain(HIDDEN),
                0.0,
            );
            add(
                format!("{s}.o_proj.weight"),
                vec![HIDDEN, 64],
                gain(64),
                0.0,
            );
            add(format!("{s}.q_norm.weight"), vec![16], 0.1, 0.0);
            add(format!("{s}.k_norm.weight"), vec![16], 0.1, 0.0);
        }
        let m = format!("{p}.mlp");
        add(
            format!("{m}.gate_proj.weight"),
            vec![96, HIDDEN],
            gain(HIDDEN),
            0.0,
        );
        add(
            format!("{m}.up_proj.weight"),
            vec![96, HIDDEN],
            gain(HIDDEN),
            0.0,
        );
        add(
            format!("{m}.down_proj.weight"),
            vec![HIDDEN, 96],
            gain(96),
            0.0,
        );
    }
    add("model.norm.weight".into(), vec![HIDDEN], 0.1, 0.0);
    add(
        "lm_head.weight".into(),
        vec![VOCAB, HIDDEN],
        gain(HIDDEN),
        0.0,
    );
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
    write_qwen3_5(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).expect("the tiny hybrid validates");
    // Hugging Face's layout: the norms are read as `1 + w`.
    assert!(checkpoint.config().norm_weight_offset);
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
fn the_state_carries_across_prefill_pieces_and_decode_steps() {
    let (_dir, model) = tiny();
    assert!(model.is_hybrid());
    let tokens = prompt(150, 5);
    let whole = in_pieces(&model, &tokens, &[150]);
    // Across the 64-token grid, unevenly, with single-token (recurrent) steps between.
    let pieces = in_pieces(&model, &tokens, &[37, 1, 90, 1, 1, 20]);
    assert_logits_close(&pieces, &whole, 1e-5, "uneven pieces");
    let decode = in_pieces(&model, &tokens, &[100, 1, 1, 1, 1, 46]);
    assert_logits_close(&decode, &whole, 1e-5, "decode steps");
}

#[test]
fn sequences_batched_get_the_logits_they_get_alone() {
    let (_dir, model) = tiny();
    let prompts = [prompt(70, 1), prompt(5, 2), prompt(130, 3)];
    // Alone: each prompt, then three decode tokens.
    let next = [7u32, 9, 11];
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut all = p.clone();
            all.extend(next);
            in_pieces(&model, &all, &[p.len(), 1, 1, 1])
        })
        .collect();
    // Together: prefills of different lengths in one step, then decode steps of all three.
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
    // Each cache holds its own state: the attention layers' KV and the linear layers' state.
    let per_sequence = model.recurrent_bytes_per_sequence();
    let channels = 2 * KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM;
    assert_eq!(
        per_sequence,
        2 * 4 * ((TAPS - 1) * channels + VALUE_HEADS * VALUE_DIM * KEY_DIM)
    );
    for (cache, p) in caches.iter().zip(&prompts) {
        assert_eq!(cache.recurrent_bytes(), per_sequence);
        assert_eq!(cache.recurrent().unwrap().position(), p.len() + 3);
    }
    // Keys and values for the two attention layers only.
    assert_eq!(model.kv_bytes_per_position(), 2 * 2 * 2 * 16 * 4);
}

/// A verification step that asked for checkpoints goes back to the state after any of its
/// positions: the sequence then continues to the logits of one that never saw the rejected
/// tokens, fed as decode steps are (token by token).
#[test]
fn a_checkpointed_step_rolls_back_to_any_of_its_positions() {
    let (_dir, model) = tiny();
    let tokens = prompt(40, 4);
    let proposals = prompt(6, 12);
    // What decode computes: the prompt, then each token alone.
    let mut want = model.new_cache(60);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut want,
            tokens: &tokens,
        }])
        .unwrap();
    for token in &proposals[..3] {
        model
            .forward(&mut [ForwardSeq {
                cache: &mut want,
                tokens: std::slice::from_ref(token),
            }])
            .unwrap();
    }
    let next = [proposals[5]];
    let want_logits = model
        .forward(&mut [ForwardSeq {
            cache: &mut want,
            tokens: &next,
        }])
        .unwrap()
        .remove(0);
    // Verified as one scored step, three of six accepted, rolled back, then the next token.
    let mut cache = model.new_cache(60);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens,
        }])
        .unwrap();
    cache.checkpoint_next_step();
    let scored = model
        .forward_scored(
            &mut [ForwardSeq {
                cache: &mut cache,
                tokens: &proposals,
            }],
            &[0],
        )
        .unwrap();
    assert_eq!(scored[0].len(), 6);
    assert_eq!(cache.resumable_prefix(43), 43);
    cache.truncate(43);
    let got = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &next,
        }])
        .unwrap()
        .remove(0);
    assert_logits_close(&got, &want_logits, 1e-5, "rolled back to a checkpoint");
    // The checkpoints last one step: rolled back again past it, the state is refused.
    cache.truncate(42);
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &next,
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("(step)") && err.contains("rewound"), "{err}");
}

/// The state goes into a saved slot beside the keys and values and comes back; a prefix or a
/// rewind to a position the cache kept no copy of is refused by name.
#[test]
fn a_state_is_saved_and_restored_and_refused_where_no_copy_was_kept() {
    let (_dir, model) = tiny();
    let tokens = prompt(20, 9);
    let mut cache = model.new_cache(40);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens,
        }])
        .unwrap();
    let (kv, state) = (cache.export(20).unwrap(), cache.export_state(20).unwrap());
    assert_eq!(state.len() * 4, model.recurrent_bytes_per_sequence());
    let err = cache.export_state(10).unwrap_err().to_string();
    assert!(
        err.contains("linear-attention state of a hybrid model (export)"),
        "{err}"
    );
    let mut restored = model.new_cache(40);
    restored.import(&kv, 20).unwrap();
    restored.import_state(&state).unwrap();
    let next = [tokens[3]];
    let step = |cache: &mut mlxcel_core::KvCache| {
        model
            .forward(&mut [ForwardSeq {
                cache,
                tokens: &next,
            }])
            .unwrap()
            .remove(0)
    };
    assert_eq!(step(&mut restored), step(&mut cache));
    let err = restored.import_state(&state[1..]).unwrap_err().to_string();
    assert!(err.contains("(import)"), "{err}");

    let mut other = model.new_cache(40);
    let err = other.copy_prefix_from(&cache, 10).unwrap_err().to_string();
    assert!(err.contains("(copy a prefix)"), "{err}");
    // Rewound (a speculative rollback without checkpoints): the next step is refused, not run
    // from the wrong state.
    cache.truncate(15);
    let err = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens[15..16],
        }])
        .unwrap_err()
        .to_string();
    assert!(err.contains("(step)") && err.contains("rewound"), "{err}");
}

/// Each step's last-row logits of `steps` (per step, each sequence's new tokens) run through a
/// pipeline of `stages`, the first stage's hidden states handed on as the pipe would carry them.
fn run_pipeline(stages: &[LlamaModel], steps: &[Vec<Vec<u32>>]) -> Vec<Vec<Vec<f32>>> {
    let sequences = steps[0].len();
    let mut caches: Vec<Vec<_>> = stages
        .iter()
        .map(|stage| (0..sequences).map(|_| stage.new_cache(256)).collect())
        .collect();
    let vocab = stages[0].config().vocab_size;
    steps
        .iter()
        .map(|step| {
            let mut carried = None;
            for (stage, caches) in stages.iter().zip(caches.iter_mut()) {
                let mut seqs: Vec<ForwardSeq<'_>> = caches
                    .iter_mut()
                    .zip(step)
                    .map(|(cache, tokens)| ForwardSeq { cache, tokens })
                    .collect();
                let out = stage
                    .forward_stage(&mut seqs, carried.take(), None)
                    .unwrap();
                stage.finish_stage(&mut seqs, &[&out]).unwrap();
                carried = Some(out);
            }
            carried.unwrap().to_rows_f32(vocab).unwrap()
        })
        .collect()
}

#[test]
fn pipeline_stages_of_a_hybrid_give_the_whole_models_logits_bit_for_bit() {
    let (dir, whole) = tiny();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let config = checkpoint.config().clone();
    let prompts = [prompt(70, 11), prompt(9, 12)];
    let steps: Vec<Vec<Vec<u32>>> = std::iter::once(prompts.to_vec())
        .chain((0..3).map(|i| vec![vec![3 + i], vec![40 + i]]))
        .collect();
    let expected = run_pipeline(std::slice::from_ref(&whole), &steps);
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
    // Layers 0 and 2 are linear, 1 and 3 attention: the splits put the recurrent state and the
    // keys and values on whichever rank holds each layer.
    for ends in [&[1, 4][..], &[2, 4], &[3, 4], &[1, 2, 4]] {
        let stages: Vec<LlamaModel> = (0..ends.len())
            .map(|rank| {
                let stage = mlxcel_core::Stage::of_pipeline(&config, ends, rank).unwrap();
                LlamaModel::load_stage(&checkpoint, Kernels::from_env().unwrap(), stage).unwrap()
            })
            .collect();
        let (mut per_position, mut per_sequence) = (0, 0);
        for stage in &stages {
            assert!(stage.is_hybrid(), "every stage answers for the whole model");
            let (p, s) = stage.stage().cache_bytes(&config, stage.kv_types());
            assert_eq!(p, stage.kv_bytes_per_position(), "{ends:?}");
            assert_eq!(s, stage.recurrent_bytes_per_sequence(), "{ends:?}");
            assert_eq!(stage.new_cache(8).recurrent_bytes(), s, "{ends:?}");
            per_position += p;
            per_sequence += s;
        }
        assert_eq!(per_position, whole.kv_bytes_per_position(), "{ends:?}");
        assert_eq!(
            per_sequence,
            whole.recurrent_bytes_per_sequence(),
            "{ends:?}"
        );
        assert_eq!(
            bits(&run_pipeline(&stages, &steps)),
            bits(&expected),
            "stages ending at {ends:?} differ from the whole model"
        );
    }
}
