//! Adaptive-p: hand-computed reshapes and averages, its place in the chain, its checks, and the
//! comparison with llama.cpp's own sampler (`scripts/check-samplers`).

use super::*;

/// Two tokens at probabilities 0.9 and 0.1 (logits `ln 9` and 0).
fn two_tokens() -> Vec<f32> {
    vec![9f32.ln(), 0.0]
}

fn adaptive(target: f32, decay: f32, samplers: Vec<SamplerStage>) -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        adaptive_target: target,
        adaptive_decay: decay,
        samplers,
        seed: Some(7),
        ..SamplingParams::default()
    })
    .unwrap()
}

#[test]
fn a_low_target_makes_the_unlikely_token_the_likely_one() {
    // target 0.1, the average starting at its fixed point: the adapted target is 0.1. Token 1
    // (p 0.1) gets the peak logit 5; token 0 (p 0.9, d = 0.8 / 0.3) gets 5 - 10 d² / (1 + d).
    let mut sampler = adaptive(0.1, 0.9, vec![SamplerStage::AdaptiveP]);
    assert!((sampler.adaptive_target_now().unwrap() - 0.1).abs() < 1e-6);
    let token = sampler.sample(&mut two_tokens(), &[]);
    let d = 0.8f64 / 0.3;
    let gap = 10.0 * d * d / (1.0 + d);
    let expected = 1.0 / (1.0 + (-gap).exp());
    let (p, top) = sampler.post_sampling_probs(1, 2);
    assert_eq!(top[0].0, 1, "{top:?}");
    assert!((p - expected).abs() < 1e-5, "{p} vs {expected}");
    assert_eq!(token, 1, "p(token 1) = {p}");
}

#[test]
fn the_drawn_tokens_original_probability_moves_the_average() {
    // decay 0.5, target 0.1: sum 0.2, weight 2. Entering the p = 0.9 token: sum 0.9 + 0.1 = 1.0,
    // weight 1 + 1 = 2, average 0.5, adapted 2 * 0.1 - 0.5 < 0, clamped to 0.
    let mut sampler = adaptive(0.1, 0.5, vec![SamplerStage::AdaptiveP]);
    sampler.step_with(&mut two_tokens(), &[], 0);
    assert_eq!(sampler.adaptive_target_now(), Some(0.0));
    // Entering the p = 0.1 token next: sum 0.1 + 0.5, weight 1 + 1, average 0.3: adapted 0.
    // Then again: sum 0.1 + 0.3 = 0.4, weight 2, average 0.2, adapted 0.
    sampler.step_with(&mut two_tokens(), &[], 1);
    sampler.step_with(&mut two_tokens(), &[], 1);
    // Then again: sum 0.1 + 0.2 = 0.3, weight 2, average 0.15, adapted 0.05.
    sampler.step_with(&mut two_tokens(), &[], 1);
    assert!((sampler.adaptive_target_now().unwrap() - 0.05).abs() < 1e-6);
    // A token that was not among the survivors does not move it.
    sampler.step_with(&mut two_tokens(), &[], 5);
    assert!((sampler.adaptive_target_now().unwrap() - 0.05).abs() < 1e-6);
}

#[test]
fn a_negative_target_or_a_chain_without_the_stage_draws_as_without_it() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.4).collect();
    let history: Vec<u32> = vec![];
    let draws = |mut sampler: Sampler| -> Vec<u32> {
        (0..40)
            .map(|_| sampler.sample(&mut logits.clone(), &history))
            .collect()
    };
    let plain = draws(adaptive(-1.0, 0.9, vec![SamplerStage::TopK]));
    let off = draws(adaptive(
        -1.0,
        0.9,
        vec![SamplerStage::TopK, SamplerStage::AdaptiveP],
    ));
    assert_eq!(plain, off);
    let unnamed = draws(adaptive(0.3, 0.9, vec![SamplerStage::TopK]));
    assert_eq!(plain, unnamed, "the target alone does not add the stage");
    let on = draws(adaptive(
        0.3,
        0.9,
        vec![SamplerStage::TopK, SamplerStage::AdaptiveP],
    ));
    assert_ne!(
        plain, on,
        "named with a target, the stage reshapes the draw"
    );
}

#[test]
fn adaptive_p_is_named_as_llama_cpp_names_it_and_its_ranges_are_checked() {
    assert_eq!(
        SamplerStage::from_name("adaptive-p"),
        Some(SamplerStage::AdaptiveP)
    );
    assert_eq!(
        SamplerStage::parse_chain("ka", true).unwrap(),
        vec![SamplerStage::TopK, SamplerStage::AdaptiveP]
    );
    assert!(!SamplerStage::DEFAULT_ORDER.contains(&SamplerStage::AdaptiveP));
    for (target, decay, field) in [
        (1.5, 0.9, "adaptive_target"),
        (f32::NAN, 0.9, "adaptive_target"),
        (0.5, 1.0, "adaptive_decay"),
        (0.5, -0.1, "adaptive_decay"),
    ] {
        let params = SamplingParams {
            adaptive_target: target,
            adaptive_decay: decay,
            ..SamplingParams::default()
        };
        let err = params.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
}

/// One `scripts/check-samplers` adaptive case: at every step the reshaped distribution must
/// have llama.cpp's survivors with probabilities within 1e-4; then llama.cpp's drawn token is
/// entered into the average here too.
pub(super) fn oracle_problem(case: &serde_json::Value) -> Option<String> {
    let overrides: SamplingOverrides = serde_json::from_value(case["params"].clone()).unwrap();
    let mut params = overrides.over(SamplingParams {
        seed: Some(1),
        ..SamplingParams::default()
    });
    params.samplers = case["samplers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| SamplerStage::from_name(s.as_str().unwrap()).unwrap())
        .collect();
    let mut sampler = Sampler::new(params).unwrap();
    let steps = case["logits"].as_array().unwrap();
    let expected = case["expected"]["steps"].as_array().unwrap();
    for (step, (logits, theirs)) in steps.iter().zip(expected).enumerate() {
        let mut logits: Vec<f32> = logits
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let selected = theirs["selected"].as_u64().unwrap() as u32;
        sampler.step_with(&mut logits, &[], selected);
        let (_, ours) = sampler.post_sampling_probs(selected, usize::MAX);
        let theirs: Vec<(u32, f64)> = theirs["ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(theirs["probs"].as_array().unwrap())
            .map(|(t, p)| (t.as_u64().unwrap() as u32, p.as_f64().unwrap()))
            .collect();
        // Tokens whose reshaped probability underflows to 0 are left out of ours.
        let mut our_ids: Vec<u32> = ours.iter().map(|c| c.0).collect();
        let mut their_ids: Vec<u32> = theirs.iter().filter(|c| c.1 > 0.0).map(|c| c.0).collect();
        our_ids.sort_unstable();
        their_ids.sort_unstable();
        if our_ids != their_ids {
            return Some(format!(
                "step {step}: candidates differ: ours {our_ids:?}, llama.cpp's {their_ids:?}"
            ));
        }
        let worst = theirs
            .iter()
            .map(|(t, p)| (p - ours.iter().find(|c| c.0 == *t).map_or(0.0, |c| c.1)).abs())
            .fold(0.0, f64::max);
        if worst > 1e-4 {
            return Some(format!(
                "step {step}: largest probability difference {worst:.2e}"
            ));
        }
    }
    None
}
