//! Adaptive-p, as llama.cpp's `llama_sampler_init_adaptive_p` behaves: the last stage of the
//! chain (it takes the draw's place, as mirostat does), which reshapes the survivors'
//! distribution so that tokens whose probability is near a *target* become the likely ones.
//!
//! Each step it computes the survivors' probabilities `p` (the *original* ones), an adapted
//! target `clamp(2 target - ema, 0, 1)` where `ema` is the decayed average of the original
//! probabilities of the tokens drawn so far, and gives every survivor the logit
//! `5 - 10 d² / (1 + d)` with `d = |p - adapted| / 0.3` (quadratic near the target, linear in the
//! tails); the draw is from the softmax of those logits. Once the token is chosen, its original
//! probability enters the average: `sum = p + decay sum`, `weight = 1 + decay weight`, both
//! starting at their fixed points for a history of `target`s (`target / (1 - decay)` and
//! `1 / (1 - decay)`). A negative target turns the reshaping off (the draw is then the plain one,
//! and the average does not move). The decay is clamped to [0, 0.99] as llama.cpp clamps it.

use super::filters::{Candidate, by_logit_desc, probabilities};

/// The transform's constants (llama.cpp's `DISTRIBUTION_WIDTH`, `PEAK_LOGIT_VALUE`,
/// `SHARPNESS`).
const INV_WIDTH: f32 = 1.0 / 0.3;
const PEAK: f32 = 5.0;
const SHARPNESS: f32 = 10.0;

/// One request's adaptive-p state.
#[derive(Debug, Clone)]
pub(super) struct AdaptiveP {
    target: f32,
    decay: f32,
    weighted_sum: f32,
    total_weight: f32,
    /// The survivors' original probabilities at the last reshape, by token.
    original: Vec<(u32, f32)>,
}

impl AdaptiveP {
    pub(super) fn new(target: f32, decay: f32) -> Self {
        let decay = decay.clamp(0.0, 0.99);
        Self {
            target,
            decay,
            weighted_sum: target / (1.0 - decay),
            total_weight: 1.0 / (1.0 - decay),
            original: Vec::new(),
        }
    }

    /// Whether the stage reshapes anything (a negative target does not).
    pub(super) fn active(&self) -> bool {
        self.target >= 0.0
    }

    /// The target this step aims at, from the average of the tokens drawn so far.
    pub(super) fn adapted_target(&self) -> f32 {
        let target = self.target.clamp(0.0, 1.0);
        let adapted = if self.total_weight == 0.0 {
            target
        } else {
            2.0 * target - self.weighted_sum / self.total_weight
        };
        adapted.clamp(0.0, 1.0)
    }

    /// Reshapes `candidates` (logits to be multiplied by `scale` before the softmax): afterwards
    /// their logits are the transformed ones, to be read at scale 1, most likely first.
    pub(super) fn reshape(&mut self, candidates: &mut [Candidate], scale: f64) {
        self.original.clear();
        if !self.active() || candidates.is_empty() {
            return;
        }
        let probs = probabilities(candidates, scale);
        let adapted = self.adapted_target();
        for (c, p) in candidates.iter_mut().zip(probs) {
            let p = p as f32;
            self.original.push((c.0, p));
            let d = ((p - adapted) * INV_WIDTH).abs();
            c.1 = PEAK - SHARPNESS * d * d / (1.0 + d);
        }
        candidates.sort_unstable_by(by_logit_desc);
    }

    /// Enters `token`'s original probability into the average, when it was among the last
    /// reshape's survivors (as llama.cpp's accept of the token its apply selected).
    pub(super) fn accept(&mut self, token: u32) {
        if let Some(&(_, p)) = self.original.iter().find(|(t, _)| *t == token) {
            self.weighted_sum = p + self.decay * self.weighted_sum;
            self.total_weight = 1.0 + self.decay * self.total_weight;
        }
        self.original.clear();
    }
}
