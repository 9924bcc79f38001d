//! Host-side sampling: penalties, top-k, top-p, min-p, temperature, seeded draws.
//!
//! The chain and its order follow llama.cpp's default sampler so that the same settings mean the
//! same thing in both tools: penalties → top-k → top-p → min-p → temperature → draw. Top-p and min-p
//! see the untempered distribution; temperature only reshapes what survives them. A temperature of
//! zero or below is greedy decoding.

use crate::error::EngineError;
use crate::rng::{Rng, fresh_seed};

/// How to pick the next token from a sequence's logits.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`; `1.0` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0.0` disables.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens; `1.0` disables.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recently seen token (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per recent occurrence (OpenAI semantics).
    pub frequency_penalty: f32,
    /// Seed of the request's own random stream; `None` draws a fresh one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every field's range, naming the field and what is accepted.
    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |field: &'static str, value: f32, expected: &'static str| {
            Err(EngineError::InvalidSampling {
                field,
                value: value.to_string(),
                expected,
            })
        };
        if !self.temperature.is_finite() {
            return invalid(
                "temperature",
                self.temperature,
                "a finite number (<= 0 is greedy)",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", self.top_p, "a number in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid("min_p", self.min_p, "a number in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return invalid(
                "repeat_penalty",
                self.repeat_penalty,
                "a positive number (1 disables)",
            );
        }
        if !self.presence_penalty.is_finite() || self.presence_penalty.abs() > 2.0 {
            return invalid(
                "presence_penalty",
                self.presence_penalty,
                "a number in [-2, 2]",
            );
        }
        if !self.frequency_penalty.is_finite() || self.frequency_penalty.abs() > 2.0 {
            return invalid(
                "frequency_penalty",
                self.frequency_penalty,
                "a number in [-2, 2]",
            );
        }
        Ok(())
    }
}

/// One request's sampler: its parameters and its own random stream, so that its output does not
/// depend on which other requests share its batch.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// Validates `params` and seeds the stream (with a fresh seed when none is given).
    pub fn new(params: SamplingParams) -> Result<Self, EngineError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Self {
            params,
            seed,
            rng: Rng::seeded(seed),
            candidates: Vec::new(),
        })
    }

    /// The seed in use, to report so a run can be repeated.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token. `logits` is modified in place by the penalties; `history` is the
    /// sequence so far (prompt and generated tokens), of which the last `repeat_last_n` count.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.filter_candidates(logits);
        self.draw()
    }

    /// Speculative decoding's acceptance of a `proposed` token (from a deterministic proposer:
    /// prompt lookup): greedy accepts it exactly when it is the argmax; sampling accepts it with
    /// its probability p(x) under this sampler's filtered, tempered distribution, and otherwise
    /// draws from that distribution without x, renormalized. The emitted token is then distributed
    /// exactly as [`Sampler::sample`]'s (the standard speculative-sampling rule with a one-hot
    /// draft). Returns the token and whether it is the proposal.
    pub fn verify(&mut self, logits: &mut [f32], history: &[u32], proposed: u32) -> (u32, bool) {
        self.apply_penalties(logits, history);
        if self.params.temperature <= 0.0 {
            let token = argmax(logits);
            return (token, token == proposed);
        }
        self.filter_candidates(logits);
        let Some(&(first, max)) = self.candidates.first() else {
            return (0, false);
        };
        let inv_t = 1.0 / f64::from(self.params.temperature);
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|&(_, l)| (f64::from(l - max) * inv_t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let p_proposed = self
            .candidates
            .iter()
            .zip(&weights)
            .find(|((t, _), _)| *t == proposed)
            .map_or(0.0, |(_, w)| w / total);
        if self.rng.next_f64() < p_proposed {
            return (proposed, true);
        }
        let rest: f64 = total - p_proposed * total;
        if rest <= 0.0 {
            return (proposed, true);
        }
        let mut target = self.rng.next_f64() * rest;
        for (&(token, _), w) in self.candidates.iter().zip(&weights) {
            if token == proposed {
                continue;
            }
            if target < *w {
                return (token, false);
            }
            target -= w;
        }
        let fallback = self
            .candidates
            .iter()
            .map(|&(t, _)| t)
            .find(|&t| t != proposed)
            .unwrap_or(first);
        (fallback, fallback == proposed)
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let recent = &history[history.len().saturating_sub(p.repeat_last_n)..];
        let mut counts: Vec<(u32, u32)> = Vec::with_capacity(recent.len());
        for &token in recent {
            match counts.iter_mut().find(|(t, _)| *t == token) {
                Some((_, count)) => *count += 1,
                None => counts.push((token, 1)),
            }
        }
        for (token, count) in counts {
            let Some(logit) = logits.get_mut(token as usize) else {
                continue;
            };
            if *logit > 0.0 {
                *logit /= p.repeat_penalty;
            } else {
                *logit *= p.repeat_penalty;
            }
            *logit -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Leaves in `self.candidates` the tokens top-k, top-p and min-p keep, most likely first, with
    /// their untempered logits.
    fn filter_candidates(&mut self, logits: &[f32]) {
        let p = &self.params;
        let candidates = &mut self.candidates;
        candidates.clear();
        if p.top_k > 0 && p.top_k < logits.len() {
            top_k_into(candidates, logits, p.top_k);
        } else {
            candidates.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_nan())
                    .map(|(i, &l)| (i as u32, l)),
            );
        }
        candidates.sort_unstable_by(by_logit_desc);
        if candidates.is_empty() {
            return;
        }

        let max = candidates[0].1;
        let weights: Vec<f64> = candidates
            .iter()
            .map(|&(_, l)| f64::from(l - max).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = candidates.len();
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            for (i, w) in weights.iter().enumerate() {
                mass += w / total;
                if mass >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            // weights[0] is the most likely token's weight, exp(0) = 1.
            let floor = f64::from(p.min_p);
            keep = keep.min(weights.iter().take_while(|&&w| w >= floor).count().max(1));
        }
        candidates.truncate(keep);
    }

    fn draw(&mut self) -> u32 {
        let Some(&(first, max)) = self.candidates.first() else {
            return 0;
        };
        let inv_t = 1.0 / f64::from(self.params.temperature);
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|&(_, l)| (f64::from(l - max) * inv_t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut target = self.rng.next_f64() * total;
        for (&(token, _), w) in self.candidates.iter().zip(&weights) {
            if target < *w {
                return token;
            }
            target -= w;
        }
        // Rounding can leave a sliver past the last weight; it belongs to the most likely token.
        first
    }
}

/// Most likely first; equal logits by lower token id.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A candidate in the top-k heap, ordered so that the heap's top is the worst one kept.
struct Kept((u32, f32));

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Kept {}

impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kept {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// The `k` most likely tokens of `logits` (NaN never kept), in no particular order: one pass with
/// a bounded heap, where almost every token is rejected by one comparison with the worst kept.
/// The same set as sorting the whole vocabulary and keeping the first `k`.
fn top_k_into(out: &mut Vec<(u32, f32)>, logits: &[f32], k: usize) {
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    let mut worst = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        if heap.len() == k {
            // Ids only grow, so a tie with the worst kept loses to it.
            if l.total_cmp(&worst).is_le() {
                continue;
            }
            heap.pop();
        }
        heap.push(Kept((i as u32, l)));
        if heap.len() == k {
            worst = heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.1);
        }
    }
    out.extend(heap.into_iter().map(|kept| kept.0));
}

/// The index of the largest logit, the lowest index on ties; NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &value) in logits.iter().enumerate() {
        if value > best_value {
            best = i;
            best_value = value;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: every non-NaN token sorted, the first `k` kept.
    fn naive_top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        all.sort_unstable_by(by_logit_desc);
        all.truncate(k);
        all
    }

    proptest! {
        /// Small value ranges force many ties; NaN, infinities and signed zeros included.
        #[test]
        fn heap_top_k_is_the_sorted_prefix(
            values in proptest::collection::vec(
                prop_oneof![
                    (-4i32..4).prop_map(|v| v as f32),
                    Just(f32::NAN),
                    Just(f32::INFINITY),
                    Just(f32::NEG_INFINITY),
                    Just(-0.0f32),
                ],
                1..200,
            ),
            k in 1usize..50,
        ) {
            let k = k.min(values.len());
            let mut ours = Vec::new();
            top_k_into(&mut ours, &values, k);
            ours.sort_unstable_by(by_logit_desc);
            let expected = naive_top_k(&values, k);
            prop_assert_eq!(ours.len(), expected.len());
            for (a, b) in ours.iter().zip(&expected) {
                prop_assert_eq!(a.0, b.0);
                prop_assert_eq!(a.1.to_bits(), b.1.to_bits());
            }
        }
    }

    /// Speculative acceptance keeps the distribution: the token `verify` emits for a proposal
    /// is distributed as `sample`'s, whatever the proposal (likely, unlikely, or filtered out by
    /// top-k), within 5 standard errors over 40,000 draws each.
    #[test]
    fn verify_emits_tokens_with_the_sampling_distribution() {
        let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0, -3.0];
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(99),
            ..SamplingParams::default()
        };
        let draws = 40_000;
        let frequencies = |mut pick: Box<dyn FnMut() -> u32>| {
            let mut counts = [0usize; 6];
            for _ in 0..draws {
                counts[pick() as usize] += 1;
            }
            counts.map(|c| c as f64 / draws as f64)
        };
        let mut reference_sampler = Sampler::new(params.clone()).unwrap();
        let expected = frequencies(Box::new(move || {
            reference_sampler.sample(&mut logits.clone(), &[])
        }));
        for proposed in [0u32, 2, 4, 5] {
            let mut sampler = Sampler::new(SamplingParams {
                seed: Some(7 + u64::from(proposed)),
                ..params.clone()
            })
            .unwrap();
            let got = frequencies(Box::new(move || {
                sampler.verify(&mut logits.clone(), &[], proposed).0
            }));
            for (token, (&p, &q)) in expected.iter().zip(&got).enumerate() {
                let bound = 5.0 * (p.max(q).max(1e-4) * (1.0 - p.min(q)) / draws as f64).sqrt();
                assert!(
                    (p - q).abs() <= bound.max(2e-3),
                    "proposal {proposed}: token {token}: sample {p:.4} vs verify {q:.4}"
                );
            }
        }
        // Greedy: accepted exactly when the proposal is the argmax.
        let mut greedy = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(greedy.verify(&mut logits.clone(), &[], 0), (0, true));
        assert_eq!(greedy.verify(&mut logits.clone(), &[], 3), (0, false));
    }
}
