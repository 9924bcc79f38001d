//! One request's sampler: the chain run over a step's logits, the draw from its own seeded
//! stream, speculative acceptance, and the distribution the last draw was made from (what
//! llama-server reports as post-sampling probabilities).

use std::sync::Arc;

use crate::error::EngineError;
use crate::rng::{Rng, fresh_seed};

use super::adaptive::AdaptiveP;
use super::dry::{self, DryBreakers, DrySettings};
use super::filters::{
    Candidate, argmax, by_logit_desc, dynamic_temperature, materialize, min_p_filter,
    probabilities, top_k_into, top_n_sigma_floor, top_p_filter, typical_filter, weights,
    xtc_filter,
};
use super::mirostat::Mirostat;
use super::params::{SamplerStage, SamplingParams};

/// One request's sampler: its parameters and its own random stream, so that its output does not
/// depend on which other requests share its batch.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    /// The survivors of the last chain, most likely first, with their untempered logits.
    candidates: Vec<Candidate>,
    /// The factor the survivors' logits were multiplied by before the last draw's softmax.
    scale: f64,
    dry_breakers: Arc<DryBreakers>,
    mirostat: Option<Mirostat>,
    adaptive: Option<AdaptiveP>,
}

impl Sampler {
    /// Validates `params` and seeds the stream (with a fresh seed when none is given). DRY runs
    /// without sequence breakers until [`Sampler::with_dry_breakers`] gives them.
    pub fn new(params: SamplingParams) -> Result<Self, EngineError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(fresh_seed);
        let mirostat = (params.mirostat != 0)
            .then(|| Mirostat::new(params.mirostat, params.mirostat_tau, params.mirostat_eta));
        let adaptive = params
            .adaptive_p_enabled()
            .then(|| AdaptiveP::new(params.adaptive_target, params.adaptive_decay));
        Ok(Self {
            params,
            seed,
            rng: Rng::seeded(seed),
            candidates: Vec::new(),
            scale: 1.0,
            dry_breakers: Arc::default(),
            mirostat,
            adaptive,
        })
    }

    /// DRY's sequence breakers as token sequences ([`super::resolve_breakers`] of
    /// [`SamplingParams::dry_sequence_breakers`] against the model's vocabulary).
    pub fn with_dry_breakers(mut self, breakers: Arc<DryBreakers>) -> Self {
        self.dry_breakers = breakers;
        self
    }

    /// The seed in use, to report so a run can be repeated.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token. `logits` is modified in place by the bias and penalties; `history`
    /// is the sequence so far (prompt and generated tokens), of which the last `repeat_last_n`
    /// count for the penalties and the last `dry_penalty_last_n` for DRY.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        if self.mirostat.is_some() {
            return self.sample_mirostat(logits);
        }
        if let Some(token) = self.greedy(logits, history) {
            return token;
        }
        self.run_chain(logits, history);
        self.adapt();
        let token = self.draw();
        self.adaptive_accept(token);
        token
    }

    /// Adaptive-p's reshaping of the chain's survivors, when the chain names it: their logits
    /// become the transformed ones, read at scale 1.
    fn adapt(&mut self) {
        if let Some(adaptive) = self.adaptive.as_mut()
            && adaptive.active()
        {
            adaptive.reshape(&mut self.candidates, self.scale);
            self.scale = 1.0;
        }
    }

    /// Enters the chosen token into adaptive-p's average.
    fn adaptive_accept(&mut self, token: u32) {
        if let Some(adaptive) = self.adaptive.as_mut() {
            adaptive.accept(token);
        }
    }

    /// The argmax after bias, penalties and DRY, when the chain is one where that is what a
    /// temperature of zero or below picks ([`SamplingParams::is_plain_chain`]).
    fn greedy(&mut self, logits: &mut [f32], history: &[u32]) -> Option<u32> {
        if !(self.params.temperature <= 0.0 && self.params.is_plain_chain()) {
            return None;
        }
        self.apply_bias(logits);
        self.apply_penalties(logits, history);
        self.apply_dry_whole(logits, history);
        let token = argmax(logits);
        self.candidates.clear();
        self.candidates.push((token, 0.0));
        self.scale = 1.0;
        Some(token)
    }

    /// Mirostat's chain (llama.cpp's, when mirostat is on): bias, temperature, mirostat's
    /// truncation, the draw, then its feedback. At a temperature of zero or below, the argmax.
    fn sample_mirostat(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_bias(logits);
        let Some(mirostat) = self.mirostat.as_mut() else {
            return argmax(logits);
        };
        if self.params.temperature <= 0.0 {
            let token = argmax(logits);
            mirostat.update(1.0);
            self.candidates.clear();
            self.candidates.push((token, 0.0));
            self.scale = 1.0;
            return token;
        }
        self.scale = 1.0 / f64::from(self.params.temperature);
        mirostat.truncate(&mut self.candidates, logits, self.scale);
        let token = self.draw();
        let p = self.probability_of(token);
        if let Some(mirostat) = self.mirostat.as_mut() {
            mirostat.update(p);
        }
        token
    }

    /// Speculative decoding's acceptance of a `proposed` token (from a deterministic proposer:
    /// prompt lookup): greedy accepts it exactly when it is the argmax; sampling accepts it with
    /// its probability p(x) under this sampler's filtered, tempered distribution, and otherwise
    /// draws from that distribution without x, renormalized. The emitted token is then distributed
    /// exactly as [`Sampler::sample`]'s (the standard speculative-sampling rule with a one-hot
    /// draft). Mirostat, whose state moves with each draw, samples and accepts a match. Returns
    /// the token and whether it is the proposal.
    pub fn verify(&mut self, logits: &mut [f32], history: &[u32], proposed: u32) -> (u32, bool) {
        if self.mirostat.is_some() {
            let token = self.sample_mirostat(logits);
            return (token, token == proposed);
        }
        if let Some(token) = self.greedy(logits, history) {
            return (token, token == proposed);
        }
        self.run_chain(logits, history);
        self.adapt();
        let (token, accepted) = self.verify_drawn(proposed);
        self.adaptive_accept(token);
        (token, accepted)
    }

    /// The speculative rule over the chain's survivors (see [`Sampler::verify`]).
    fn verify_drawn(&mut self, proposed: u32) -> (u32, bool) {
        let Some(&(first, _)) = self.candidates.first() else {
            return (0, false);
        };
        let (weights, total) = weights(&self.candidates, self.scale);
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

    /// The distribution the last token was drawn from (llama-server's post-sampling
    /// probabilities): the `n` most likely survivors of the chain with their probabilities, most
    /// likely first, and the probability of `token` (0 when it did not survive).
    pub fn post_sampling_probs(&self, token: u32, n: usize) -> (f64, Vec<(u32, f64)>) {
        if self.candidates.is_empty() {
            return (0.0, Vec::new());
        }
        let probs = probabilities(&self.candidates, self.scale);
        let chosen = self.probability_of(token);
        let top = self
            .candidates
            .iter()
            .zip(probs)
            .take(n)
            .filter(|(_, p)| *p > 0.0)
            .map(|(&(t, _), p)| (t, p))
            .collect();
        (chosen, top)
    }

    /// Mirostat's `mu` now.
    #[cfg(test)]
    pub(super) fn mirostat_mu(&self) -> Option<f32> {
        self.mirostat.as_ref().map(Mirostat::mu)
    }

    /// Adaptive-p's target for the next step.
    #[cfg(test)]
    pub(super) fn adaptive_target_now(&self) -> Option<f32> {
        self.adaptive.as_ref().map(AdaptiveP::adapted_target)
    }

    /// Runs the chain and adaptive-p's reshaping without drawing, then enters `token` as the
    /// chosen one (the oracle test, which follows llama.cpp's draws).
    #[cfg(test)]
    pub(super) fn step_with(&mut self, logits: &mut [f32], history: &[u32], token: u32) {
        self.run_chain(logits, history);
        self.adapt();
        self.adaptive_accept(token);
    }

    /// `token`'s probability among the last candidates.
    fn probability_of(&self, token: u32) -> f64 {
        let Some(index) = self.candidates.iter().position(|c| c.0 == token) else {
            return 0.0;
        };
        probabilities(&self.candidates, self.scale)[index]
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

    /// DRY's penalties for this step (empty when DRY is off).
    fn dry_penalties(&self, history: &[u32]) -> Vec<(u32, f32)> {
        let p = &self.params;
        if !p.dry_enabled() {
            return Vec::new();
        }
        let settings = DrySettings {
            multiplier: p.dry_multiplier,
            base: p.dry_base,
            allowed_length: p.dry_allowed_length,
            last_n: p.dry_penalty_last_n,
        };
        dry::penalties(history, settings, &self.dry_breakers)
    }

    fn apply_dry_whole(&self, logits: &mut [f32], history: &[u32]) {
        for (token, penalty) in self.dry_penalties(history) {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit -= penalty;
            }
        }
    }

    /// Runs the chain ([`SamplingParams::samplers`]) over `logits` (bias first): leaves in
    /// `self.candidates` the survivors, most likely first, with their untempered logits, and in
    /// `self.scale` the factor (the product of the temperature stages' `1 / t`) their logits are
    /// multiplied by before the softmax. Until a stage needs a list, the candidates are the whole
    /// vocabulary in `logits`; in llama.cpp's default order top-k makes the list, so every later
    /// stage works on at most `top_k` tokens.
    fn run_chain(&mut self, logits: &mut [f32], history: &[u32]) {
        self.apply_bias(logits);
        let p = &self.params;
        let (top_k, typical_p, top_p, min_p, temperature, min_keep) = (
            p.top_k,
            p.typical_p,
            p.top_p,
            p.min_p,
            p.temperature,
            p.min_keep,
        );
        let (top_n_sigma, xtc_on, xtc_probability, xtc_threshold) = (
            p.top_n_sigma,
            p.xtc_enabled(),
            p.xtc_probability,
            p.xtc_threshold,
        );
        let (dynatemp_range, dynatemp_exponent) = (p.dynatemp_range, p.dynatemp_exponent);
        self.candidates.clear();
        let mut whole = true;
        let mut scale = 1.0f64;
        for index in 0..self.params.samplers.len() {
            match self.params.samplers[index] {
                SamplerStage::Penalties if whole => self.apply_penalties(logits, history),
                SamplerStage::Penalties => {
                    let ids: Vec<u32> = self.candidates.iter().map(|c| c.0).collect();
                    let mut penalized: Vec<f32> = self.candidates.iter().map(|c| c.1).collect();
                    self.penalize_subset(&ids, &mut penalized, history);
                    for (c, l) in self.candidates.iter_mut().zip(penalized) {
                        c.1 = l;
                    }
                    self.candidates.sort_unstable_by(by_logit_desc);
                }
                SamplerStage::Dry if whole => self.apply_dry_whole(logits, history),
                SamplerStage::Dry => {
                    let penalties = self.dry_penalties(history);
                    for c in &mut self.candidates {
                        if let Some(&(_, penalty)) = penalties.iter().find(|(t, _)| *t == c.0) {
                            c.1 -= penalty;
                        }
                    }
                    self.candidates.sort_unstable_by(by_logit_desc);
                }
                SamplerStage::TopNSigma if top_n_sigma <= 0.0 => {}
                SamplerStage::TopNSigma if whole => {
                    if let Some(floor) = top_n_sigma_floor(logits.iter().copied(), top_n_sigma) {
                        self.candidates.extend(
                            logits
                                .iter()
                                .enumerate()
                                .filter(|(_, l)| **l >= floor)
                                .map(|(i, &l)| (i as u32, l)),
                        );
                        self.candidates.sort_unstable_by(by_logit_desc);
                        whole = false;
                    }
                }
                SamplerStage::TopNSigma => {
                    let logits = self.candidates.iter().map(|c| c.1);
                    if let Some(floor) = top_n_sigma_floor(logits, top_n_sigma) {
                        self.candidates.retain(|c| c.1 >= floor);
                    }
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
                SamplerStage::Xtc if !xtc_on => {}
                // Adaptive-p runs after the chain, in the draw's place (`Sampler::adapt`).
                SamplerStage::AdaptiveP => {}
                SamplerStage::Temperature if temperature > 0.0 && dynatemp_range <= 0.0 => {
                    scale *= 1.0 / f64::from(temperature);
                }
                stage => {
                    if whole {
                        materialize(&mut self.candidates, logits);
                        whole = false;
                    }
                    let candidates = &mut self.candidates;
                    match stage {
                        SamplerStage::TypicalP => {
                            typical_filter(candidates, typical_p, min_keep, scale);
                        }
                        SamplerStage::TopP => top_p_filter(candidates, top_p, min_keep, scale),
                        SamplerStage::MinP => min_p_filter(candidates, min_p, min_keep, scale),
                        SamplerStage::Xtc => {
                            // The chance is drawn only when there is something to remove, as
                            // llama.cpp draws it.
                            if candidates.len() >= 2
                                && self.rng.next_f64() as f32 <= xtc_probability
                            {
                                xtc_filter(candidates, xtc_threshold, min_keep, scale);
                            }
                        }
                        SamplerStage::Temperature if dynatemp_range > 0.0 => {
                            match dynamic_temperature(
                                candidates,
                                temperature,
                                dynatemp_range,
                                dynatemp_exponent,
                                scale,
                            ) {
                                Some(t) if t > 0.0 => scale *= 1.0 / f64::from(t),
                                Some(_) => candidates.truncate(1),
                                None => {}
                            }
                        }
                        // Temperature at zero or below: the most likely survivor alone.
                        _ => candidates.truncate(1),
                    }
                }
            }
        }
        if whole {
            materialize(&mut self.candidates, logits);
        }
        self.scale = scale;
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

    /// Draws from `self.candidates` with their logits multiplied by `self.scale`.
    fn draw(&mut self) -> u32 {
        let Some(&(first, _)) = self.candidates.first() else {
            return 0;
        };
        let (weights, total) = weights(&self.candidates, self.scale);
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
