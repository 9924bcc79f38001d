//! Mirostat (Basu et al.), as llama.cpp's `llama_sampler_mirostat` and `_mirostat_v2`: a
//! feedback loop that truncates the distribution so that the surprise of the sampled tokens
//! (`-log2 p`) tracks a target `tau`. `mu` starts at `2 tau` and moves by `eta` times each
//! token's surprise error. Version 1 estimates the distribution's Zipf exponent from the 100 most
//! likely tokens and keeps the top `k` that the target implies; version 2 keeps the tokens whose
//! surprise is at most `mu`. Neither sorts the vocabulary: v1 reads its top tokens through the
//! bounded heap, v2 one pass for the normaliser and one for the survivors.

use super::filters::{Candidate, by_logit_desc, top_k_into};

/// How many of the most likely tokens v1 estimates the exponent from (llama.cpp's `m`).
const ESTIMATE_FROM: usize = 100;

/// One request's mirostat state.
#[derive(Debug, Clone)]
pub(super) struct Mirostat {
    version: u8,
    tau: f32,
    eta: f32,
    mu: f32,
}

impl Mirostat {
    pub(super) fn new(version: u8, tau: f32, eta: f32) -> Self {
        Self {
            version,
            tau,
            eta,
            mu: 2.0 * tau,
        }
    }

    /// The candidates mirostat draws from, most likely first, out of `logits` at `scale` (the
    /// inverse temperature).
    pub(super) fn truncate(&self, out: &mut Vec<Candidate>, logits: &[f32], scale: f64) {
        out.clear();
        if self.version == 1 {
            top_k_into(out, logits, ESTIMATE_FROM.min(logits.len()));
            out.sort_unstable_by(by_logit_desc);
            let k = self.v1_k(out, logits.len(), scale);
            if k > out.len() {
                out.clear();
                top_k_into(out, logits, k.min(logits.len()));
                out.sort_unstable_by(by_logit_desc);
            }
            out.truncate(k.max(1));
        } else {
            let max = logits
                .iter()
                .copied()
                .filter(|l| !l.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            let total: f64 = logits
                .iter()
                .filter(|l| !l.is_nan())
                .map(|&l| (f64::from(l - max) * scale).exp())
                .sum();
            // p >= 2^-mu, as a bound on the scaled logit relative to the largest.
            let floor = total.ln() - f64::from(self.mu) * std::f64::consts::LN_2;
            out.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_nan() && f64::from(**l - max) * scale >= floor)
                    .map(|(i, &l)| (i as u32, l)),
            );
            out.sort_unstable_by(by_logit_desc);
            if out.is_empty() {
                top_k_into(out, logits, 1);
            }
        }
    }

    /// v1's `k`: the Zipf exponent `s` estimated by least squares over the ratios of the most
    /// likely tokens' probabilities, then `((s - 1) 2^mu / (1 - n^(1 - s)))^(1 / s)`.
    fn v1_k(&self, top: &[Candidate], vocab: usize, scale: f64) -> usize {
        let (mut sum_tb, mut sum_tt) = (0.0f32, 0.0f32);
        for (i, pair) in top.windows(2).enumerate() {
            let t = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b = (f64::from(pair[0].1 - pair[1].1) * scale) as f32;
            sum_tb += t * b;
            sum_tt += t * t;
        }
        let s_hat = sum_tb / sum_tt;
        let epsilon = s_hat - 1.0;
        let k = ((epsilon * 2f32.powf(self.mu)) / (1.0 - (vocab as f32).powf(-epsilon)))
            .powf(1.0 / s_hat);
        // A NaN or negative estimate keeps one token, as llama.cpp's `max(int(k), 1)`.
        if k.is_finite() && k >= 1.0 {
            k as usize
        } else if k.is_infinite() && k > 0.0 {
            vocab
        } else {
            1
        }
    }

    /// Moves `mu` by the sampled token's surprise error (`p`: its probability among the
    /// candidates it was drawn from).
    pub(super) fn update(&mut self, p: f64) {
        let surprise = -(p.log2()) as f32;
        self.mu -= self.eta * (surprise - self.tau);
    }

    #[cfg(test)]
    pub(super) fn mu(&self) -> f32 {
        self.mu
    }
}
