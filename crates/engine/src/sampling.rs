//! Host-side sampling: logit bias, penalties, top-k, typical-p, top-p, min-p, temperature, seeded
//! draws.
//!
//! The chain and its default order follow llama.cpp's default sampler so that the same settings
//! mean the same thing in both tools: logit bias → penalties → top-k → typical-p → top-p → min-p
//! → temperature → draw. Typical-p, top-p and min-p see the untempered distribution; temperature
//! only reshapes what survives them. A temperature of zero or below is greedy decoding.
//! [`SamplingParams::samplers`] reorders the chain or leaves stages out, as llama-server's
//! `samplers` field does (logit bias always comes first and the draw last).

use crate::error::EngineError;
use crate::rng::{Rng, fresh_seed};

/// One stage of the sampling chain ([`SamplingParams::samplers`]), under llama.cpp's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerStage {
    /// Repetition, presence and frequency penalties (`penalties`).
    Penalties,
    /// Top-k (`top_k`).
    TopK,
    /// Locally typical sampling (`typ_p`).
    TypicalP,
    /// Nucleus, top-p (`top_p`).
    TopP,
    /// Min-p (`min_p`).
    MinP,
    /// Temperature (`temperature`); at zero or below, only the most likely survivor is kept.
    Temperature,
}

impl SamplerStage {
    /// llama.cpp's default order of the stages this sampler has.
    pub const DEFAULT_ORDER: [SamplerStage; 6] = [
        Self::Penalties,
        Self::TopK,
        Self::TypicalP,
        Self::TopP,
        Self::MinP,
        Self::Temperature,
    ];

    /// llama.cpp's canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Penalties => "penalties",
            Self::TopK => "top_k",
            Self::TypicalP => "typ_p",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::Temperature => "temperature",
        }
    }
}

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
    /// Locally typical sampling: keep the tokens whose surprisal (`-ln p`) is closest to the
    /// distribution's entropy until their mass exceeds `typical_p`; `>= 1.0` disables.
    pub typical_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens; `1.0` disables.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recently seen token (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per recent occurrence (OpenAI semantics).
    pub frequency_penalty: f32,
    /// Added to tokens' logits before anything else (`f32::NEG_INFINITY` bans a token, as
    /// llama-server's `ignore_eos` does with the end-of-sequence tokens).
    pub logit_bias: Vec<(u32, f32)>,
    /// The chain's stages in order ([`SamplerStage::DEFAULT_ORDER`] by default); a stage left out
    /// does not run. Without [`SamplerStage::Temperature`] the draw is at temperature 1, as in
    /// llama.cpp.
    pub samplers: Vec<SamplerStage>,
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
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            samplers: SamplerStage::DEFAULT_ORDER.to_vec(),
            seed: None,
        }
    }
}

/// Sampling settings each of which may be left out (`None` keeps the setting under it): what a
/// request asks for, or a server's defaults. This is the one declaration of the sampling fields
/// every wire format reads under these names (deserialized from the request body as it is), and
/// [`SamplingOverrides::over`] the one place they meet the defaults of [`SamplingParams`].
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct SamplingOverrides {
    /// [`SamplingParams::temperature`].
    pub temperature: Option<f32>,
    /// [`SamplingParams::top_k`].
    pub top_k: Option<usize>,
    /// [`SamplingParams::top_p`].
    pub top_p: Option<f32>,
    /// [`SamplingParams::min_p`].
    pub min_p: Option<f32>,
    /// [`SamplingParams::typical_p`] (llama-server's `typical_p`).
    pub typical_p: Option<f32>,
    /// [`SamplingParams::repeat_penalty`].
    pub repeat_penalty: Option<f32>,
    /// [`SamplingParams::repeat_last_n`].
    pub repeat_last_n: Option<usize>,
    /// [`SamplingParams::presence_penalty`].
    pub presence_penalty: Option<f32>,
    /// [`SamplingParams::frequency_penalty`].
    pub frequency_penalty: Option<f32>,
    /// [`SamplingParams::seed`]; a negative seed draws a fresh one.
    pub seed: Option<i64>,
}

impl SamplingOverrides {
    /// `base` with every setting given here replacing its own.
    pub fn over(&self, base: SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            typical_p: self.typical_p.unwrap_or(base.typical_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(base.repeat_last_n),
            presence_penalty: self.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(base.frequency_penalty),
            seed: match self.seed {
                Some(seed) => u64::try_from(seed).ok(),
                None => base.seed,
            },
            ..base
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

    /// Whether the chain is llama.cpp's default one with typical-p off: then a temperature of zero
    /// or below is the argmax after bias and penalties (every other stage keeps the most likely
    /// token).
    fn is_plain_chain(&self) -> bool {
        self.samplers == SamplerStage::DEFAULT_ORDER && self.typical_p >= 1.0
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
        if !(self.typical_p.is_finite() && self.typical_p >= 0.0) {
            return invalid(
                "typical_p",
                self.typical_p,
                "a number >= 0 (1 or more disables)",
            );
        }
        if let Some(&(_, bias)) = self.logit_bias.iter().find(|(_, b)| b.is_nan()) {
            return invalid("logit_bias", bias, "a number or -inf");
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
        if self.params.temperature <= 0.0 && self.params.is_plain_chain() {
            self.apply_bias(logits);
            self.apply_penalties(logits, history);
            return argmax(logits);
        }
        let scale = self.run_chain(logits, history);
        self.draw(scale)
    }

    /// Speculative decoding's acceptance of a `proposed` token (from a deterministic proposer:
    /// prompt lookup): greedy accepts it exactly when it is the argmax; sampling accepts it with
    /// its probability p(x) under this sampler's filtered, tempered distribution, and otherwise
    /// draws from that distribution without x, renormalized. The emitted token is then distributed
    /// exactly as [`Sampler::sample`]'s (the standard speculative-sampling rule with a one-hot
    /// draft). Returns the token and whether it is the proposal.
    pub fn verify(&mut self, logits: &mut [f32], history: &[u32], proposed: u32) -> (u32, bool) {
        if self.params.temperature <= 0.0 && self.params.is_plain_chain() {
            self.apply_bias(logits);
            self.apply_penalties(logits, history);
            let token = argmax(logits);
            return (token, token == proposed);
        }
        let scale = self.run_chain(logits, history);
        let Some(&(first, max)) = self.candidates.first() else {
            return (0, false);
        };
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|&(_, l)| (f64::from(l - max) * scale).exp())
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

    fn apply_bias(&self, logits: &mut [f32]) {
        for &(token, bias) in &self.params.logit_bias {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit += bias;
            }
        }
    }

    /// Runs the chain ([`SamplingParams::samplers`]) over `logits` (bias first): leaves in
    /// `self.candidates` the survivors, most likely first, with their untempered logits, and
    /// returns the factor (the product of the temperature stages' `1 / t`) their logits are
    /// multiplied by before the softmax.
    fn run_chain(&mut self, logits: &mut [f32], history: &[u32]) -> f64 {
        self.apply_bias(logits);
        let p = &self.params;
        let (top_k, typical_p, top_p, min_p, temperature) =
            (p.top_k, p.typical_p, p.top_p, p.min_p, p.temperature);
        self.candidates.clear();
        // Until a stage needs the list, the candidates are the whole vocabulary, in `logits`.
        let mut whole = true;
        let mut scale = 1.0f64;
        for index in 0..self.params.samplers.len() {
            match self.params.samplers[index] {
                SamplerStage::Penalties if whole => self.apply_penalties(logits, history),
                SamplerStage::Penalties => {
                    let mut penalized: Vec<f32> = self.candidates.iter().map(|c| c.1).collect();
                    let ids: Vec<u32> = self.candidates.iter().map(|c| c.0).collect();
                    self.penalize_subset(&ids, &mut penalized, history);
                    for (c, l) in self.candidates.iter_mut().zip(penalized) {
                        c.1 = l;
                    }
                    self.candidates.sort_unstable_by(by_logit_desc);
                }
                SamplerStage::TopK if top_k == 0 => {}
                SamplerStage::TopK if whole => {
                    if top_k < logits.len() {
                        top_k_into(&mut self.candidates, logits, top_k);
                        self.candidates.sort_unstable_by(by_logit_desc);
                        whole = false;
                    }
                }
                SamplerStage::TopK => self.candidates.truncate(top_k),
                SamplerStage::TypicalP if typical_p >= 1.0 => {}
                SamplerStage::TopP if top_p >= 1.0 => {}
                SamplerStage::MinP if min_p <= 0.0 => {}
                SamplerStage::Temperature if temperature > 0.0 => {
                    scale *= 1.0 / f64::from(temperature);
                }
                stage => {
                    if whole {
                        materialize(&mut self.candidates, logits);
                        whole = false;
                    }
                    match stage {
                        SamplerStage::TypicalP => {
                            typical_filter(&mut self.candidates, typical_p, scale);
                        }
                        SamplerStage::TopP => top_p_filter(&mut self.candidates, top_p, scale),
                        SamplerStage::MinP => min_p_filter(&mut self.candidates, min_p, scale),
                        // Temperature at zero or below: the most likely survivor alone.
                        _ => self.candidates.truncate(1),
                    }
                }
            }
        }
        if whole {
            materialize(&mut self.candidates, logits);
        }
        scale
    }

    /// The penalties on a subset of the vocabulary (`ids` with their `logits`), for a chain where
    /// they come after a stage that cut the candidates.
    fn penalize_subset(&self, ids: &[u32], logits: &mut [f32], history: &[u32]) {
        let Some(&max_id) = ids.iter().max() else {
            return;
        };
        let mut scratch = vec![0.0f32; max_id as usize + 1];
        for (&id, &l) in ids.iter().zip(logits.iter()) {
            scratch[id as usize] = l;
        }
        self.apply_penalties(&mut scratch, history);
        for (&id, l) in ids.iter().zip(logits.iter_mut()) {
            *l = scratch[id as usize];
        }
    }

    /// Draws from `self.candidates` with their logits multiplied by `scale`.
    fn draw(&mut self, scale: f64) -> u32 {
        let Some(&(first, max)) = self.candidates.first() else {
            return 0;
        };
        let weights: Vec<f64> = self
            .candidates
            .iter()
            .map(|&(_, l)| (f64::from(l - max) * scale).exp())
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

/// Every non-NaN token of `logits`, most likely first.
fn materialize(candidates: &mut Vec<(u32, f32)>, logits: &[f32]) {
    candidates.clear();
    candidates.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l)),
    );
    candidates.sort_unstable_by(by_logit_desc);
}

/// Each candidate's weight `exp((logit - max) * scale)` (the most likely one's is 1) and their
/// sum; `candidates` is sorted most likely first and not empty.
fn weights(candidates: &[(u32, f32)], scale: f64) -> (Vec<f64>, f64) {
    let max = candidates[0].1;
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&(_, l)| (f64::from(l - max) * scale).exp())
        .collect();
    let total = weights.iter().sum();
    (weights, total)
}

/// Top-p: the smallest prefix whose probability mass reaches `top_p`.
fn top_p_filter(candidates: &mut Vec<(u32, f32)>, top_p: f32, scale: f64) {
    if candidates.is_empty() {
        return;
    }
    let (weights, total) = weights(candidates, scale);
    let mut mass = 0.0;
    for (i, w) in weights.iter().enumerate() {
        mass += w / total;
        if mass >= f64::from(top_p) {
            candidates.truncate(i + 1);
            return;
        }
    }
}

/// Min-p: the tokens at least `min_p` times as likely as the most likely one (always that one).
fn min_p_filter(candidates: &mut Vec<(u32, f32)>, min_p: f32, scale: f64) {
    if candidates.is_empty() {
        return;
    }
    let (weights, _) = weights(candidates, scale);
    let floor = f64::from(min_p);
    let keep = weights.iter().take_while(|&&w| w >= floor).count().max(1);
    candidates.truncate(keep);
}

/// Locally typical sampling (Meister et al., as llama.cpp's `llama_sampler_typical`): with `p_i`
/// the softmax and `H = -Σ p_i ln p_i` its entropy, the tokens are ordered by `|-ln p_i - H|`
/// (ties by likelihood) and kept until their mass exceeds `typical_p`; the survivors are left most
/// likely first.
fn typical_filter(candidates: &mut Vec<(u32, f32)>, typical_p: f32, scale: f64) {
    if candidates.is_empty() {
        return;
    }
    let (weights, total) = weights(candidates, scale);
    let probs: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let entropy: f64 = probs
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| -p * p.ln())
        .sum();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    let score = |i: usize| (-probs[i].ln() - entropy).abs();
    order.sort_by(|&a, &b| score(a).total_cmp(&score(b)));
    let mut mass = 0.0;
    let mut keep = order.len();
    for (n, &i) in order.iter().enumerate() {
        mass += probs[i];
        if mass > f64::from(typical_p) {
            keep = n + 1;
            break;
        }
    }
    let mut kept: Vec<(u32, f32)> = order[..keep].iter().map(|&i| candidates[i]).collect();
    kept.sort_unstable_by(by_logit_desc);
    *candidates = kept;
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

    /// Probabilities 1/2, 1/4, 1/8, 1/8: entropy H = 1.75 ln 2; surprisals ln 2, 2 ln 2, 3 ln 2,
    /// 3 ln 2, so |surprisal - H| is 0.75, 0.25, 1.25, 1.25 (× ln 2): the typical order is token 1,
    /// token 0, then tokens 2 and 3. Mass must exceed `typical_p`: 0.2 keeps {1} (0.25), 0.5 keeps
    /// {1, 0} (0.75), 0.8 keeps {1, 0, 2} (0.875), 0.9 keeps all four.
    #[test]
    fn typical_p_keeps_the_hand_computed_sets() {
        let logits = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
        let kept = |typical_p: f32| {
            let mut candidates = Vec::new();
            materialize(&mut candidates, &logits);
            typical_filter(&mut candidates, typical_p, 1.0);
            candidates.iter().map(|c| c.0).collect::<Vec<_>>()
        };
        assert_eq!(kept(0.2), vec![1]);
        assert_eq!(kept(0.5), vec![0, 1]);
        assert_eq!(kept(0.8), vec![0, 1, 2]);
        assert_eq!(kept(0.9), vec![0, 1, 2, 3]);

        // Through the sampler (temperature 1, no other filter): 0.2 always draws token 1, the
        // least surprising rather than the most likely; 0.5 draws 0 and 1 as 2/3 and 1/3.
        let params = |typical_p: f32| SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p,
            seed: Some(5),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params(0.2)).unwrap();
        for _ in 0..100 {
            assert_eq!(sampler.sample(&mut logits.clone(), &[]), 1);
        }
        let mut sampler = Sampler::new(params(0.5)).unwrap();
        let draws = 30_000;
        let mut counts = [0usize; 4];
        for _ in 0..draws {
            counts[sampler.sample(&mut logits.clone(), &[]) as usize] += 1;
        }
        let share = counts[0] as f64 / draws as f64;
        assert!((share - 2.0 / 3.0).abs() < 0.02, "{counts:?}");
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
        // Greedy with typical-p before temperature keeps the most likely survivor (llama.cpp's
        // order), token 1 here.
        let mut greedy = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..params(0.2)
        })
        .unwrap();
        assert_eq!(greedy.sample(&mut logits.clone(), &[]), 1);
    }

    /// The chain runs in the given order: top-p before temperature sees the untempered
    /// distribution, after it the tempered one; stages left out do not run; bias comes first.
    #[test]
    fn sampler_order_and_subset_are_honoured() {
        // Probabilities 0.6, 0.3, 0.1. Top-p 0.55 untempered keeps token 0 alone; at temperature
        // 2 the distribution flattens (0.47, 0.33, 0.19) and top-p 0.55 keeps tokens 0 and 1.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let run = |samplers: Vec<SamplerStage>| {
            let mut sampler = Sampler::new(SamplingParams {
                temperature: 2.0,
                top_k: 0,
                top_p: 0.55,
                min_p: 0.0,
                samplers,
                seed: Some(3),
                ..SamplingParams::default()
            })
            .unwrap();
            let mut seen = [false; 3];
            for _ in 0..2_000 {
                seen[sampler.sample(&mut logits.clone(), &[]) as usize] = true;
            }
            seen
        };
        use SamplerStage::*;
        assert_eq!(run(vec![TopP, Temperature]), [true, false, false]);
        assert_eq!(run(vec![Temperature, TopP]), [true, true, false]);
        assert_eq!(run(vec![Temperature]), [true, true, true]);
        // A bias of -inf bans a token whatever the chain, greedy included.
        let mut greedy = Sampler::new(SamplingParams {
            logit_bias: vec![(0, f32::NEG_INFINITY)],
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert_eq!(greedy.sample(&mut logits.clone(), &[]), 1);
        assert_eq!(
            SamplerStage::DEFAULT_ORDER
                .map(SamplerStage::name)
                .join(";"),
            "penalties;top_k;typ_p;top_p;min_p;temperature"
        );
    }

    #[test]
    fn overrides_replace_only_what_they_give() {
        let base = SamplingParams {
            seed: Some(7),
            ..SamplingParams::default()
        };
        let none = SamplingOverrides::default().over(base.clone());
        assert_eq!(none, base);
        let given = SamplingOverrides {
            temperature: Some(0.0),
            top_p: Some(0.5),
            seed: Some(-1),
            ..SamplingOverrides::default()
        }
        .over(base.clone());
        assert_eq!(
            (given.temperature, given.top_p, given.seed, given.top_k),
            (0.0, 0.5, None, base.top_k)
        );
        let parsed: SamplingOverrides =
            serde_json::from_str(r#"{"top_k": 5, "seed": 3, "other": 1}"#).unwrap();
        assert_eq!((parsed.top_k, parsed.seed), (Some(5), Some(3)));
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
