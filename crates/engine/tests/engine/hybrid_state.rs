//! A gated-DeltaNet hybrid (Qwen3.5: layers 0 and 2 linear attention, 1 and 3 softmax
//! attention) on a tiny random checkpoint written here: its recurrent state follows everything
//! that touches sequence state. A cached prefix resumes from the state snapshot at its block
//! boundary to the same bits as computing it; speculative verification rolls the state back to
//! the last accepted token (greedy output unchanged); a saved slot carries its state; a
//! cancelled sequence frees it; the KV budget counts it.

use std::collections::HashMap;
use std::sync::Arc;

use mlxcel_engine::*;
use mlxcel_model::Checkpoint;
use serde_json::json;

use crate::families::{VOCAB, write_tiny_with};

/// One block of 256 positions of the two attention layers' f32 keys and values (2 kv heads of
/// 16 values each).
const BLOCK: usize = 256 * 2 * 2 * 16 * 2 * 4;
/// One sequence's recurrent state: per linear layer, the convolution's last 3 rows of 2·32 + 32
/// channels and 4 heads of an 8 × 16 matrix, f32.
const STATE: usize = 2 * 4 * (3 * 96 + 4 * 8 * 16);

fn hybrid(dir: &std::path::Path) -> Checkpoint {
    let family = json!({
        "architectures": ["Qwen3_5ForCausalLM"], "num_hidden_layers": 4,
        "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
    });
    write_tiny_with(dir, &family, 77, false)
}

fn backend(checkpoint: &Checkpoint, kv_budget_bytes: Option<usize>) -> Box<dyn Backend> {
    let defaults = EngineOptions::default();
    let options = EngineOptions {
        backend: BackendKind::Mlx,
        kv_budget_bytes: kv_budget_bytes.unwrap_or(defaults.kv_budget_bytes),
        ..defaults
    };
    load_backend(checkpoint, &options).unwrap()
}

fn allocate(backend: &mut Box<dyn Backend>, prompt: usize, new: usize) -> SlotId {
    let plan = backend
        .create_session_for_request(&RequestShape {
            prompt_len: prompt,
            image_tokens: 0,
            max_new_tokens: MaxNewTokens::Limited(new),
        })
        .unwrap();
    backend.allocate_slot(&plan).unwrap()
}

fn step(backend: &mut Box<dyn Backend>, slot: SlotId, tokens: &[u32], at: usize) -> Vec<f32> {
    backend
        .step(&[SequenceStep {
            slot,
            tokens,
            start_position: at,
        }])
        .unwrap()
        .remove(0)
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7 + seed * 13 + i * i % 5) % VOCAB as u32)
        .collect()
}

struct Silent;

struct SilentStream;

impl TextDecoder for Silent {
    fn stream(&self, _prompt: &[u32]) -> Box<dyn DecodeStream> {
        Box::new(SilentStream)
    }
}

impl DecodeStream for SilentStream {
    fn push(&mut self, _token: u32) -> String {
        String::new()
    }
}

fn scheduler(backend: Box<dyn Backend>) -> Scheduler<Box<dyn Backend>> {
    Scheduler::new(backend, Arc::new(Silent), SchedulerConfig::default()).unwrap()
}

fn greedy(prompt: Vec<u32>, new: usize) -> GenerationRequest {
    GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(prompt, MaxNewTokens::Limited(new))
    }
}

/// Runs `request` alone to its end: its tokens.
fn generate(s: &mut Scheduler<Box<dyn Backend>>, request: GenerationRequest) -> Vec<u32> {
    let id = s.submit(request).unwrap();
    let mut out: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        steps += 1;
        assert!(steps < 10_000, "no progress");
        for (rid, event) in s.step() {
            match event {
                Event::Token { token, .. } => out.entry(rid).or_default().push(token),
                Event::Finished { error, .. } => assert_eq!(error, None, "request {rid}"),
            }
        }
    }
    out.remove(&id).unwrap_or_default()
}

/// The backend's seam: a slot that computed 300 positions in one step keeps the state at the
/// block boundary 256, and a slot given those 256 positions computes the rest to the very bits
/// of the logits the first slot got (and of a slot that computed 256 then 44 itself); the
/// snapshots count in the KV budget.
#[test]
fn a_cached_prefix_of_a_hybrid_resumes_to_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut backend = backend(&checkpoint, None);
    assert!(backend.recurrent_state() && backend.can_copy_prefix() && backend.can_score());
    backend.keep_state_snapshots(true);
    let prompt = tokens(300, 1);
    let a = allocate(&mut backend, 300, 8);
    // Two blocks for 308 positions, each with the snapshot at its end, and the live state.
    assert_eq!(backend.kv_usage().unwrap().0, 2 * (BLOCK + STATE) + STATE);
    let whole = step(&mut backend, a, &prompt, 0);
    assert_eq!(backend.resumable_prefix(a, 300), 300);
    assert_eq!(backend.resumable_prefix(a, 290), 256);
    assert_eq!(backend.resumable_prefix(a, 255), 0);

    let b = allocate(&mut backend, 300, 8);
    backend.copy_prefix(a, b, 256).unwrap();
    let resumed = step(&mut backend, b, &prompt[256..], 256);
    assert!(
        resumed == whole,
        "a cached prefix resumed to other logits: max difference {}",
        resumed
            .iter()
            .zip(&whole)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    );
    let c = allocate(&mut backend, 300, 8);
    step(&mut backend, c, &prompt[..256], 0);
    assert!(step(&mut backend, c, &prompt[256..], 256) == whole);
    // And the sequences go on alike.
    let next = [argmax(&whole)];
    let (from_a, from_b) = (
        step(&mut backend, a, &next, 300),
        step(&mut backend, b, &next, 300),
    );
    assert!(from_a == from_b);

    // A prefix the source keeps no state for is refused by name.
    let d = allocate(&mut backend, 300, 8);
    let err = backend.copy_prefix(a, d, 200).unwrap_err().to_string();
    assert!(
        err.contains("copy a prefix") && err.contains("200"),
        "{err}"
    );
}

/// Through the scheduler: a prompt sharing 280 tokens with a finished one resumes from the
/// snapshot at 256; a chat's next turn (the whole kept sequence and more) takes the kept slot
/// over with its live state; both give the tokens a scheduler without the cache gives, and the
/// kept entries count their snapshots.
#[test]
fn the_prefix_cache_serves_a_hybrid_with_the_tokens_it_gives_without() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut plain = scheduler(backend(&checkpoint, None));
    let mut cached = scheduler(backend(&checkpoint, None)).with_prefix_cache(64 << 20);

    let first = tokens(300, 2);
    let want = generate(&mut plain, greedy(first.clone(), 4));
    assert_eq!(generate(&mut cached, greedy(first.clone(), 4)), want);
    let kept = cached.stats().prefix;
    assert_eq!(kept.entries, 1);
    // Its 303 positions in two blocks, each with a snapshot, and its live state.
    assert_eq!(kept.bytes, 2 * (BLOCK + STATE) + STATE);

    let mut second = first[..280].to_vec();
    second.extend(tokens(30, 3));
    let want = generate(&mut plain, greedy(second.clone(), 4));
    assert_eq!(generate(&mut cached, greedy(second, 4)), want);
    let stats = cached.stats();
    assert_eq!((stats.prefix.hits, stats.reused_tokens), (1, 256));

    let held = cached
        .export_cached(1)
        .unwrap()
        .expect("the first request's slot is kept")
        .tokens;
    let mut turn = held.clone();
    turn.extend(tokens(9, 4));
    let want = generate(&mut plain, greedy(turn.clone(), 6));
    assert_eq!(generate(&mut cached, greedy(turn, 6)), want);
    let stats = cached.stats();
    assert_eq!((stats.prefix.hits, stats.prefix.takeovers), (2, 1));
    assert_eq!(stats.reused_tokens, 256 + held.len() as u64);
}

/// Prompt-lookup speculation on a hybrid: verification keeps the state after each position and
/// rejected proposals roll it back, so greedy output is the one without speculation.
#[test]
fn speculative_decoding_on_a_hybrid_keeps_greedy_output() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut prompt = Vec::new();
    for _ in 0..5 {
        prompt.extend(tokens(11, 5));
    }
    let mut plain = scheduler(backend(&checkpoint, None));
    let want = generate(&mut plain, greedy(prompt.clone(), 60));
    let mut speculating = scheduler(backend(&checkpoint, None));
    // Speculating as often as it can (verification costs nothing, one matching token
    // proposes), so that proposals are verified and rejected many times over.
    let request = GenerationRequest {
        speculative: Some(SpeculativeConfig {
            row_cost: 0.0,
            ngram_min: 1,
            ..SpeculativeConfig::default()
        }),
        ..greedy(prompt, 60)
    };
    assert_eq!(generate(&mut speculating, request), want);
    let stats = speculating.stats();
    eprintln!(
        "{} drafted, {} accepted",
        stats.drafted_tokens, stats.accepted_tokens
    );
    assert!(stats.drafted_tokens > 0, "{stats:?}");
    assert!(stats.accepted_tokens < stats.drafted_tokens, "{stats:?}");
}

/// The seam under speculation: a verification of five tokens of which the model accepts two
/// proposals is cut back to the last accepted token, and the sequence goes on with the logits
/// (and tokens) of one that decoded those tokens one by one.
#[test]
fn a_hybrid_verification_rolls_back_to_the_last_accepted_token() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut backend = backend(&checkpoint, None);
    let prompt = tokens(50, 9);
    let a = allocate(&mut backend, 50, 10);
    let mut logits = vec![step(&mut backend, a, &prompt, 0)];
    let mut out = Vec::new();
    for i in 0..5 {
        out.push(argmax(&logits[i]));
        logits.push(step(&mut backend, a, &out[i..=i], 50 + i));
    }
    let b = allocate(&mut backend, 50, 10);
    step(&mut backend, b, &prompt, 0);
    let wrong = (out[3] + 1) % VOCAB as u32;
    let verify = [out[0], out[1], out[2], wrong, out[4]];
    let scored = backend
        .step_scored(
            &[SequenceStep {
                slot: b,
                tokens: &verify,
                start_position: 50,
            }],
            &[0],
        )
        .unwrap()
        .remove(0);
    assert_eq!(scored.len(), 5);
    // out[1] and out[2] are accepted, `wrong` is not: positions 50..=52 stay.
    assert_eq!(argmax(&scored[0]), out[1]);
    assert_eq!(argmax(&scored[1]), out[2]);
    assert_ne!(argmax(&scored[2]), wrong);
    assert_eq!(backend.resumable_prefix(b, 53), 53);
    backend.truncate(b, 53).unwrap();
    let resumed = step(&mut backend, b, &out[3..4], 53);
    let scale = logits[4].iter().fold(1f32, |m, x| m.max(x.abs()));
    let worst = resumed
        .iter()
        .zip(&logits[4])
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-5 * scale, "{worst}");
    assert_eq!(argmax(&resumed), out[4]);
}

/// A saved entry of a hybrid carries its recurrent state, restores into another scheduler and
/// is taken over with the tokens a scheduler without the cache gives; an entry without the
/// state, or with another model's, is refused naming it.
#[test]
fn a_saved_hybrid_slot_carries_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut source = scheduler(backend(&checkpoint, None)).with_prefix_cache(64 << 20);
    let id = source.submit(greedy(tokens(40, 6), 4)).unwrap();
    while source.has_work() {
        source.step();
    }
    let saved = source.export_cached(id).unwrap().expect("kept");
    assert_eq!(saved.state.len() * 4, STATE);
    // Keys and values of the two attention layers per position.
    assert_eq!(saved.kv.len(), saved.tokens.len() * 2 * 2 * 2 * 16);

    let mut follow_up = saved.tokens.clone();
    follow_up.extend(tokens(7, 7));
    let mut plain = scheduler(backend(&checkpoint, None));
    let want = generate(&mut plain, greedy(follow_up.clone(), 5));

    let mut restored = scheduler(backend(&checkpoint, None)).with_prefix_cache(64 << 20);
    let err = restored
        .restore_cached(saved.tokens.clone(), &saved.kv)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no recurrent state"), "{err}");
    let err = restored
        .restore_cached_state(saved.tokens.clone(), &saved.kv, &saved.state[1..])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{} values", saved.state.len() - 1))
            && err.contains(&format!("{} values", saved.state.len())),
        "{err}"
    );
    restored
        .restore_cached_state(saved.tokens.clone(), &saved.kv, &saved.state)
        .unwrap();
    assert_eq!(generate(&mut restored, greedy(follow_up, 5)), want);
    assert_eq!(restored.stats().prefix.takeovers, 1);
}

/// A cancelled hybrid sequence frees its blocks and its recurrent state within a step.
#[test]
fn cancelling_a_hybrid_sequence_frees_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = hybrid(dir.path());
    let mut s = scheduler(backend(&checkpoint, None)).with_prefix_cache(64 << 20);
    let id = s.submit(greedy(tokens(30, 8), 200)).unwrap();
    s.step();
    s.step();
    let (reserved, _) = s.backend().kv_usage().unwrap();
    // One block for 230 positions with its snapshot, and the live state.
    assert_eq!(reserved, BLOCK + STATE + STATE);
    assert!(s.cancel(id));
    while s.has_work() {
        s.step();
    }
    assert_eq!(s.backend().kv_usage().unwrap().0, 0);
    assert_eq!(
        s.stats().prefix.entries,
        0,
        "a cancelled sequence is not kept"
    );
}

/// `--kv-budget` counts the recurrent state: three blocks of budget admit three short
/// sequences of a model with the hybrid's two attention layers and no linear ones (one block
/// each), and two of the hybrid (a block and its state each: 3 · 131072 / (131072 + 6400) =
/// 2.86).
#[test]
fn the_kv_budget_counts_a_hybrid_state() {
    let dir = tempfile::tempdir().unwrap();
    let dense = write_tiny_with(
        dir.path(),
        &json!({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2}),
        3,
        false,
    );
    let hybrid_dir = tempfile::tempdir().unwrap();
    let hybrid = hybrid(hybrid_dir.path());
    let budget = 3 * BLOCK;
    let admitted = |checkpoint: &Checkpoint| {
        let mut backend = backend(checkpoint, Some(budget));
        let plan = backend
            .create_session_for_request(&RequestShape {
                prompt_len: 9,
                image_tokens: 0,
                max_new_tokens: MaxNewTokens::Limited(3),
            })
            .unwrap();
        let mut n = 0;
        loop {
            match backend.allocate_slot(&plan) {
                Ok(_) => n += 1,
                Err(EngineError::NoFreeSlot) => return n,
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(admitted(&dense), budget / BLOCK);
    assert_eq!(admitted(&hybrid), budget / (BLOCK + STATE));
    assert_eq!((budget / BLOCK, budget / (BLOCK + STATE)), (3, 2));
}
