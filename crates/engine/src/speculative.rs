//! Speculative decoding: a cheap proposer guesses the next tokens and one forward pass of the model
//! over the pending token and the guesses verifies them all; every accepted guess is a token
//! decoded without a pass of its own. Decode on a CPU reads every weight once per pass, so a pass
//! over a few tokens costs little more than one.
//!
//! Two proposers, spelled as llama.cpp spells them:
//! - **Prompt lookup** (`--spec-type ngram-simple`): the tokens that followed the latest earlier
//!   occurrence of the sequence's last n-gram (in its prompt or its own output). No second model;
//!   what repeats (code being edited, quoted documents, structured text) decodes several tokens a
//!   pass.
//! - **A draft model** (`--spec-draft-model`): a smaller model with the same vocabulary proposes
//!   its greedy continuation, one cheap pass per token, stopping early when its top probability
//!   falls below `p_min` (`--draft-p-min`). The scheduler keeps the draft's cache in step with the
//!   sequence (catching up on tokens it has not seen, rolled back past rejected guesses).
//!
//! Greedy output is the same token for token with and without speculation (bit for bit with int8
//! activations, whose logits do not depend on how a sequence is chunked); sampled output keeps its
//! distribution (the acceptance rule of [`crate::Sampler::verify`], exact for any proposer whose
//! guess is a function of the tokens so far, as both are).
//!
//! Besides them, llama.cpp's hashed n-gram proposers (`ngram-map-k`, `ngram-map-k4v`,
//! `ngram-mod`: [`crate::ngram_map`], [`crate::ngram_mod`]), tried in llama.cpp's order when
//! `--spec-type` lists several ([`SpeculativeConfig::from_flags`]).

use crate::ngram_map::NgramMapConfig;
use crate::ngram_mod::NgramModConfig;

/// Where proposals come from besides llama.cpp's hashed n-gram proposers
/// ([`SpeculativeConfig::ngram_map_k`], [`SpeculativeConfig::ngram_map_k4v`],
/// [`SpeculativeConfig::ngram_mod`]), which are tried after prompt lookup and before the draft
/// model, llama.cpp's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proposer {
    /// Prompt lookup (`ngram-simple`).
    #[default]
    Ngram,
    /// The engine's draft model ([`crate::EngineOptions::draft_model`]).
    DraftModel,
    /// Prompt lookup, then the draft model where it finds nothing (`ngram-simple,draft-simple`).
    NgramThenDraft,
    /// Neither: only the hashed proposers (`ngram-map-k`, `ngram-map-k4v`, `ngram-mod`).
    Hashed,
}

impl Proposer {
    /// Whether prompt lookup (`ngram-simple`) proposes.
    pub fn looks_up(self) -> bool {
        matches!(self, Self::Ngram | Self::NgramThenDraft)
    }

    /// Whether the draft model proposes.
    pub fn uses_draft(self) -> bool {
        matches!(self, Self::DraftModel | Self::NgramThenDraft)
    }
}

/// Speculative decoding's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculativeConfig {
    /// Prompt lookup or the draft model.
    pub proposer: Proposer,
    /// Most tokens proposed per pass (`--draft-max`).
    pub draft_max: usize,
    /// Fewer proposals than this are not worth a verification pass (`--draft-min`).
    pub draft_min: usize,
    /// The longest and shortest n-grams looked up, longest first.
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// The draft model stops proposing at a token whose probability (its softmax's top) is below
    /// this (`--draft-p-min`; 0 never stops early).
    pub p_min: f32,
    /// llama.cpp's `ngram-map-k` proposer ([`crate::ngram_map`]), when its type is on.
    pub ngram_map_k: Option<NgramMapConfig>,
    /// llama.cpp's `ngram-map-k4v` proposer, when its type is on.
    pub ngram_map_k4v: Option<NgramMapConfig>,
    /// llama.cpp's `ngram-mod` proposer ([`crate::ngram_mod`]), when its type is on.
    pub ngram_mod: Option<NgramModConfig>,
    /// What one more verified position costs, as a fraction of a one-token decode step, until the
    /// scheduler has measured it ([`PassCosts`]): the price [`SpeculativeConfig::draft_length`]
    /// weighs proposals against. 0.3 is what a pass over 1 + 15 positions measured against a
    /// decode step at depth 0 on the default model with int8 activations on an AVX2 machine
    /// (`mlxcel bench -p 1,16`; the `spec-cost` example measures it at a depth, where attention
    /// makes it ~0.45); lower where multi-row passes are relatively cheaper (AVX-512 VNNI).
    pub row_cost: f32,
}

/// Why a backend that returns only the last position's logits (OpenXLA) refuses speculation.
pub const NEEDS_SCORING: &str = "speculative decoding needs a backend that scores every position \
of a pass: the OpenXLA backend's compiled programs return only the last position's logits (docs/xla.md \
says why it compiles no verify program); use --backend mlx, or no --spec-type";

/// Why a hybrid model (gated-DeltaNet linear attention: Qwen3-Next, Qwen3.5) is refused as a
/// draft model: a draft proposes one token per step, and its recurrent state (the state after
/// every position it consumed) keeps no copy per step to go back to after a rejected proposal. A
/// hybrid *target* model speculates: its verification keeps the state after each position.
pub const HYBRID_STATE: &str = "the draft model is a hybrid model: its linear-attention layers \
keep a recurrent state per sequence that a draft's one-token steps do not checkpoint, so it \
cannot be rolled back after a rejected proposal; use a transformer draft model, or prompt lookup \
(docs/mlx.md)";

/// The acceptance rate a sequence starts from, and drifts back to while it does not speculate.
pub const PRIOR_ACCEPTANCE: f32 = 0.5;
/// How far an accepted proposal moves a sequence's acceptance rate towards 1, and a rejected one
/// towards 0. A miss moves it less than a hit: the rate is read right after a pass, and a pass
/// that ends in a miss leaves it at the low point of its swing, so equal steps underestimate a
/// stream of runs (four hits and a miss, accepted at 0.8 per position, read 0.67 at 0.25 both
/// ways; 0.86 at these). Prompt lookup's proposals are accepted per position at ~0.8 on our
/// prompts, and in a replay of `scripts/bench-spec`'s greedy outputs these steps gave 5–9% more
/// tokens per unit of pass cost on the input-grounded prompts than 0.25 both ways at
/// per-position costs of 0.17–0.25, and a faithful copy still ramps up as fast (docs/
/// benchmarks.md, "How far prompt lookup can go").
const ACCEPTANCE_RISE: f32 = 0.25;
const ACCEPTANCE_FALL: f32 = 0.1;
/// How far each step without speculation moves it back towards the prior (so that a sequence
/// whose proposals failed tries again after ~20 steps).
const ACCEPTANCE_DRIFT: f32 = 0.02;
/// Steps without speculation after which a sequence verifies a single proposal anyway (a probe
/// that refreshes its acceptance rate and the measured pass cost).
pub const PROBE_EVERY: usize = 16;
/// The smallest expected gain worth a verification pass.
const MIN_GAIN: f32 = 1.05;

impl Default for SpeculativeConfig {
    /// Up to 16 proposals (llama.cpp's `--draft-max`), from n-grams of 4 down to 2 tokens (a
    /// single matching token predicts little: its proposals were mostly rejected in our runs).
    fn default() -> Self {
        Self {
            proposer: Proposer::Ngram,
            draft_max: 16,
            draft_min: 1,
            ngram_max: 4,
            ngram_min: 2,
            p_min: 0.0,
            ngram_map_k: None,
            ngram_map_k4v: None,
            ngram_mod: None,
            row_cost: 0.3,
        }
    }
}

impl SpeculativeConfig {
    /// Refuses settings that cannot work, naming the setting.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        let bad = |field: &'static str, value: usize, expected: &'static str| {
            Err(crate::EngineError::InvalidConfig {
                field,
                value,
                expected,
            })
        };
        if self.draft_max == 0 {
            return bad("draft_max", 0, "at least 1");
        }
        if self.draft_min > self.draft_max {
            return bad("draft_min", self.draft_min, "at most draft_max");
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return bad("ngram_min", self.ngram_min, "between 1 and ngram_max");
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(crate::EngineError::InvalidSpeculation(format!(
                "p_min {} is not a probability: give a value in [0, 1]",
                self.p_min
            )));
        }
        if !(self.row_cost.is_finite() && self.row_cost >= 0.0) {
            return Err(crate::EngineError::InvalidSpeculation(format!(
                "row_cost {} is not a cost: give a non-negative fraction of a decode step",
                self.row_cost
            )));
        }
        let maps = [
            ("--spec-ngram-map-k", self.ngram_map_k),
            ("--spec-ngram-map-k4v", self.ngram_map_k4v),
        ];
        for (prefix, map) in maps {
            if let Some(map) = map {
                map.validate(prefix)
                    .map_err(crate::EngineError::InvalidSpeculation)?;
            }
        }
        if let Some(ngram_mod) = self.ngram_mod {
            ngram_mod
                .validate()
                .map_err(crate::EngineError::InvalidSpeculation)?;
        }
        if self.proposer == Proposer::Hashed && !self.hashed() {
            return Err(crate::EngineError::InvalidSpeculation(
                "no proposer: give --spec-type ngram-map-k, ngram-map-k4v or ngram-mod".into(),
            ));
        }
        Ok(())
    }

    /// Whether any of llama.cpp's hashed n-gram proposers is on.
    pub fn hashed(&self) -> bool {
        self.ngram_map_k.is_some() || self.ngram_map_k4v.is_some() || self.ngram_mod.is_some()
    }

    /// Whether proposals come from a chain of proposers tried in llama.cpp's order (a hashed
    /// one, or prompt lookup then the draft model) rather than from one of mlxcel's own.
    pub fn is_chain(&self) -> bool {
        self.hashed() || self.proposer == Proposer::NgramThenDraft
    }

    /// How many proposals to verify next (at most `limit`) for a sequence whose proposals have
    /// been accepted at rate `acceptance` (per position, in order), each verified position
    /// costing `row_cost` decode steps ([`PassCosts::row_cost`], else `self.row_cost`): the k
    /// maximizing the tokens a pass yields per unit of cost, (1 + a + a² + … + aᵏ) /
    /// (1 + row_cost·k), or 0 when no k gains 5% over a plain step. Proposals are accepted in order until the first miss, so with
    /// a per-position rate a the expected accepted count of k proposals is a + … + aᵏ.
    pub fn draft_length(&self, acceptance: f32, row_cost: f32, limit: usize) -> usize {
        let a = acceptance.clamp(0.0, 1.0);
        let (mut best, mut best_gain) = (0, MIN_GAIN);
        let (mut expected, mut power) = (0.0f32, 1.0f32);
        for k in 1..=limit.min(self.draft_max) {
            power *= a;
            expected += power;
            let gain = (1.0 + expected) / (1.0 + row_cost * k as f32);
            if gain > best_gain {
                (best, best_gain) = (k, gain);
            }
        }
        if best < self.draft_min { 0 } else { best }
    }

    /// How many proposals a sequence verifies in its next pass, at most `limit`: the
    /// [`SpeculativeConfig::draft_length`] of its acceptance rate and the row cost, except that a
    /// sequence that has not speculated for [`PROBE_EVERY`] steps verifies one anyway, so that its
    /// acceptance rate and the measured cost can show that speculation pays again.
    pub(crate) fn next_draft(
        &self,
        acceptance: f32,
        quiet_steps: usize,
        row_cost: f32,
        limit: usize,
    ) -> usize {
        let k = self.draft_length(acceptance, row_cost, limit);
        if k == 0 && quiet_steps >= PROBE_EVERY {
            limit.min(1)
        } else {
            k
        }
    }

    /// What prompt lookup with these settings does over a known greedy continuation: `output`
    /// after `context` (the prompt), one sequence alone, each pass over 1 + k positions costing
    /// `1 + row_cost·k` decode steps. The scheduler's own rules (draft length, acceptance
    /// updates, drift, probes), replayed without a model: greedy verification accepts exactly the
    /// proposals that equal the output's next tokens. Beside it, the least cost any schedule of
    /// the same proposals could reach, knowing in advance how many each pass would accept (the
    /// oracle: what better draft-length rules could still win), and the least cost if each
    /// pass could also choose which earlier occurrence to propose from (the continuation of any
    /// occurrence of the last `ngram_min` tokens, the best one known in advance, its rivals
    /// verified for free: a bound on what choosing the match better, or verifying several
    /// candidates in one pass as a tree, could reach). `output[0]` comes from the prompt's
    /// prefill and is not counted. Refused for the draft-model proposer, which needs its model.
    pub fn replay(
        &self,
        context: &[u32],
        output: &[u32],
        row_cost: f32,
    ) -> Result<Replay, crate::EngineError> {
        if self.proposer != Proposer::Ngram || self.hashed() {
            return Err(crate::EngineError::InvalidSpeculation(
                "replay needs prompt lookup (ngram-simple) alone: a draft model's proposals need \
                 its model, and the hashed proposers their acceptance feedback"
                    .into(),
            ));
        }
        if !(row_cost.is_finite() && row_cost >= 0.0) {
            return Err(crate::EngineError::InvalidSpeculation(format!(
                "row cost {row_cost} is not a cost: give a non-negative fraction of a decode step"
            )));
        }
        let n = output.len();
        let mut tokens: Vec<u32> = context.iter().chain(output.first()).copied().collect();
        // What each position's proposals (at most draft_max) would have accepted.
        let accepted_at = |i: usize, tokens: &[u32], limit: usize| -> (usize, usize) {
            let proposals = self.propose(tokens, limit);
            let hits = proposals
                .iter()
                .zip(&output[i..])
                .take_while(|(p, o)| p == o)
                .count();
            (proposals.len(), hits)
        };
        let mut replay = Replay {
            tokens: n.saturating_sub(1),
            ..Replay::default()
        };
        let (mut acceptance, mut quiet) = (PRIOR_ACCEPTANCE, 0usize);
        let mut i = 1;
        while i < n {
            let limit = n - i - 1;
            let k = self.next_draft(acceptance, quiet, row_cost, limit);
            if k == 0 {
                acceptance = drifted_acceptance(acceptance);
                quiet += 1;
            }
            let (proposed, hits) = if k > 0 {
                accepted_at(i, &tokens, k)
            } else {
                (0, 0)
            };
            if proposed > 0 {
                replay.passes += 1;
                replay.proposed += proposed;
                replay.accepted += hits;
                replay.cost += 1.0 + f64::from(row_cost) * proposed as f64;
                acceptance = updated_acceptance(acceptance, proposed, hits);
                quiet = 0;
            } else {
                replay.cost += 1.0;
            }
            let step = hits + 1;
            tokens.extend_from_slice(&output[i..i + step]);
            i += step;
        }
        // The oracles: the least total cost from each position on, verifying at most as many
        // proposals as will be accepted there (of the proposer's choice of match, or of the
        // best of every match).
        let mut prefix: Vec<u32> = context.to_vec();
        prefix.extend_from_slice(output);
        let least_cost = |hits_at: &dyn Fn(usize, &[u32], usize) -> usize| -> f64 {
            let mut best = vec![0.0f64; n + 1];
            for i in (1..n).rev() {
                let at = &prefix[..context.len() + i];
                let hits = hits_at(i, at, (n - i - 1).min(self.draft_max));
                best[i] = 1.0 + best[i + 1];
                for k in 1..=hits {
                    let cost = 1.0 + f64::from(row_cost) * k as f64 + best[(i + k + 1).min(n)];
                    best[i] = best[i].min(cost);
                }
            }
            if n > 1 { best[1] } else { 0.0 }
        };
        replay.oracle_cost = least_cost(&|i, at, limit| accepted_at(i, at, limit).1);
        replay.any_match_cost =
            least_cost(&|i, at, limit| self.best_match_hits(at, &output[i..], limit));
        Ok(replay)
    }

    /// The most tokens of `expected` that the continuation of any earlier occurrence of the
    /// last `ngram_min` tokens of `tokens` predicts, at most `limit` (0 where none occurs or
    /// `limit` is below `draft_min`).
    fn best_match_hits(&self, tokens: &[u32], expected: &[u32], limit: usize) -> usize {
        let (len, n) = (tokens.len(), self.ngram_min);
        if limit == 0 || limit < self.draft_min || len <= n {
            return 0;
        }
        let suffix = &tokens[len - n..];
        (0..len - n)
            .filter(|&i| &tokens[i..i + n] == suffix)
            .map(|i| {
                tokens[i + n..]
                    .iter()
                    .zip(expected)
                    .take(limit)
                    .take_while(|(p, o)| p == o)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// The proposals after `tokens` (prompt and output so far), at most `limit`: what followed
    /// the latest earlier occurrence of its last n-gram, the longest n-gram that has one; empty
    /// when none does or too few tokens follow it.
    pub fn propose(&self, tokens: &[u32], limit: usize) -> Vec<u32> {
        let limit = limit.min(self.draft_max);
        if limit == 0 || limit < self.draft_min {
            return Vec::new();
        }
        let len = tokens.len();
        for n in (self.ngram_min..=self.ngram_max).rev() {
            if len <= n {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Latest occurrence strictly before the suffix itself.
            let found = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                let proposals: Vec<u32> = tokens[from..len.min(from + limit)].to_vec();
                if proposals.len() >= self.draft_min.max(1) {
                    return proposals;
                }
            }
        }
        Vec::new()
    }
}

/// What [`SpeculativeConfig::replay`] found: decode steps' worth of cost for `tokens` decoded
/// tokens with speculation as the scheduler runs it, and with the best schedule of the same
/// proposals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Replay {
    /// Tokens decoded (the output less its first token, which the prefill gives).
    pub tokens: usize,
    /// Verification passes, proposals verified in them, and proposals accepted.
    pub passes: usize,
    pub proposed: usize,
    pub accepted: usize,
    /// The replay's cost in decode steps: 1 per plain step, `1 + row_cost·k` per pass.
    pub cost: f64,
    /// The oracle's cost.
    pub oracle_cost: f64,
    /// The oracle's cost when each pass may also propose from any earlier occurrence of the
    /// last `ngram_min` tokens, the best one.
    pub any_match_cost: f64,
}

impl Replay {
    /// Tokens per decode step's cost against plain decoding (1.0: no gain).
    pub fn speed_up(&self) -> f64 {
        Self::tokens_per_cost(self.tokens, self.cost)
    }

    /// The same for the oracle: no draft-length rule over these proposals does better.
    pub fn oracle_speed_up(&self) -> f64 {
        Self::tokens_per_cost(self.tokens, self.oracle_cost)
    }

    /// The same for the oracle that also picks the best earlier occurrence: no choice of
    /// match (nor a tree of several) does better.
    pub fn any_match_speed_up(&self) -> f64 {
        Self::tokens_per_cost(self.tokens, self.any_match_cost)
    }

    fn tokens_per_cost(tokens: usize, cost: f64) -> f64 {
        if cost > 0.0 {
            tokens as f64 / cost
        } else {
            1.0
        }
    }
}

/// What passes cost on this backend and machine, learned from the steps as they run: an
/// exponential average of a one-token decode step's time, and of what each extra position of a
/// verification pass adds to it (as a fraction of that step). Until both have been seen, the
/// configured [`SpeculativeConfig::row_cost`] stands.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassCosts {
    decode_secs: Option<f64>,
    row_cost: Option<f64>,
}

impl PassCosts {
    /// Weight of the newest sample in the averages.
    const ALPHA: f64 = 0.1;

    /// Records a one-sequence step of `1 + extra` positions that took `secs`; the row-cost
    /// average starts from `prior` (the configured cost), so one slow pass moves it a tenth of
    /// the way.
    pub fn observe(&mut self, extra: usize, secs: f64, prior: f32) {
        let average = |old: Option<f64>, new: f64| {
            Some(old.map_or(new, |old| old + Self::ALPHA * (new - old)))
        };
        if extra == 0 {
            self.decode_secs = average(self.decode_secs, secs);
        } else if let Some(decode) = self.decode_secs.filter(|&d| d > 0.0) {
            let per_row = ((secs / decode - 1.0) / extra as f64).clamp(0.0, 4.0);
            self.row_cost = average(self.row_cost.or(Some(f64::from(prior))), per_row);
        }
    }

    /// The measured cost of one more verified position, else `configured`.
    pub fn row_cost(&self, configured: f32) -> f32 {
        self.row_cost.map_or(configured, |c| c as f32)
    }
}

/// A sequence's acceptance rate after a pass that verified `proposed` proposals and accepted
/// `accepted` of them (in order: the first `accepted` hit, the next one, if any, missed).
pub fn updated_acceptance(acceptance: f32, proposed: usize, accepted: usize) -> f32 {
    let mut a = acceptance;
    for _ in 0..accepted {
        a += ACCEPTANCE_RISE * (1.0 - a);
    }
    if accepted < proposed {
        a -= ACCEPTANCE_FALL * a;
    }
    a
}

/// A sequence's acceptance rate after a step in which it did not speculate: back towards the
/// prior, so that speculation that stopped paying is tried again later.
pub fn drifted_acceptance(acceptance: f32) -> f32 {
    acceptance + ACCEPTANCE_DRIFT * (PRIOR_ACCEPTANCE - acceptance)
}

#[cfg(test)]
mod tests {
    use super::{
        PRIOR_ACCEPTANCE, PassCosts, Proposer, SpeculativeConfig, drifted_acceptance,
        updated_acceptance,
    };

    /// The draft length weighs the expected accepted run against the pass's cost: long drafts
    /// only for text that keeps being accepted, none when too little is, all of `draft_max` when
    /// extra positions cost nothing.
    #[test]
    fn draft_length_follows_acceptance_and_cost() {
        let config = SpeculativeConfig::default();
        let c = config.row_cost;
        assert_eq!(config.draft_length(1.0, c, 100), 16);
        assert_eq!(config.draft_length(1.0, c, 5), 5);
        let high = config.draft_length(0.95, c, 16);
        assert!((5..=9).contains(&high), "{high}");
        assert_eq!(config.draft_length(PRIOR_ACCEPTANCE, c, 16), 1);
        assert_eq!(config.draft_length(0.3, c, 16), 0);
        let free = SpeculativeConfig {
            row_cost: 0.0,
            ..SpeculativeConfig::default()
        };
        assert_eq!(free.draft_length(0.9, free.row_cost, 16), 16);
        let at_least_four = SpeculativeConfig {
            draft_min: 4,
            ..SpeculativeConfig::default()
        };
        assert_eq!(at_least_four.draft_length(PRIOR_ACCEPTANCE, c, 16), 0);
    }

    /// The measured row cost moves from the configured one once a decode step and a pass have
    /// been timed, and follows later samples as an average.
    #[test]
    fn pass_costs_learn_the_row_cost() {
        let mut costs = PassCosts::default();
        assert_eq!(costs.row_cost(0.3), 0.3);
        costs.observe(4, 0.030, 0.3);
        assert_eq!(costs.row_cost(0.3), 0.3, "no decode step timed yet");
        costs.observe(0, 0.010, 0.3);
        costs.observe(4, 0.026, 0.3);
        // A tenth of the way from the prior 0.3 towards the sample 0.4.
        assert!((costs.row_cost(0.3) - 0.31).abs() < 1e-6);
        for _ in 0..100 {
            costs.observe(2, 0.012, 0.3);
        }
        assert!((costs.row_cost(0.3) - 0.1).abs() < 1e-3);
    }

    /// Accepted proposals raise the rate, a miss lowers it, and steps without speculation bring
    /// it back towards the prior: a sequence that stopped speculating tries again within ~20
    /// steps.
    #[test]
    fn acceptance_rises_falls_and_drifts_back() {
        let up = updated_acceptance(0.5, 4, 4);
        assert!(up > 0.8, "{up}");
        let down = updated_acceptance(0.5, 4, 0);
        assert!(down < 0.5, "{down}");
        let mut a = 0.2;
        let config = SpeculativeConfig::default();
        assert_eq!(config.draft_length(a, config.row_cost, 16), 0);
        let mut steps = 0;
        while config.draft_length(a, config.row_cost, 16) == 0 {
            a = drifted_acceptance(a);
            steps += 1;
        }
        assert!((5..=40).contains(&steps), "{steps}");
    }

    /// The rate follows what a stream of passes accepts per position: runs of four hits ended
    /// by a miss (4 of 5 positions) settle it near 0.8 (read after each miss), steady enough
    /// that the draft length it gives stays put from pass to pass; proposals that always miss
    /// stop speculation within a few passes (the back-off).
    #[test]
    fn acceptance_tracks_the_per_position_rate_and_backs_off() {
        let config = SpeculativeConfig::default();
        let mut a = PRIOR_ACCEPTANCE;
        let mut lengths = Vec::new();
        for _ in 0..40 {
            a = updated_acceptance(a, 6, 4);
            lengths.push(config.draft_length(a, 0.2, 16));
        }
        assert!((0.72..=0.88).contains(&a), "{a}");
        let settled = &lengths[20..];
        let (lo, hi) = (settled.iter().min().unwrap(), settled.iter().max().unwrap());
        assert!(*lo >= 2 && hi - lo <= 1, "draft lengths {lengths:?}");
        let mut a = PRIOR_ACCEPTANCE;
        let mut passes = 0;
        while config.draft_length(a, 0.2, 16) > 0 {
            let k = config.draft_length(a, 0.2, 16);
            a = updated_acceptance(a, k, 0);
            passes += 1;
            assert!(
                passes <= 8,
                "still speculating after {passes} passes that all missed"
            );
        }
    }

    /// Replaying prompt lookup over known outputs: a faithful copy of the prompt decodes several
    /// tokens a pass (and no schedule of the same proposals beats the oracle), text that never
    /// repeats runs no pass and costs what plain decoding does, and a draft model is refused.
    #[test]
    fn replay_counts_what_speculation_would_have_cost() {
        let config = SpeculativeConfig::default();
        let text: Vec<u32> = (0..120).map(|i| 1000 + (i * 37) % 997).collect();
        let copy = config.replay(&text, &text, 0.1).unwrap();
        assert_eq!(copy.tokens, text.len() - 1);
        assert!(copy.passes > 0 && copy.accepted > 0, "{copy:?}");
        assert!(copy.speed_up() > 3.0, "{copy:?}");
        assert!(copy.oracle_speed_up() >= copy.speed_up() - 1e-9, "{copy:?}");
        // A faithful copy from its second token on: no proposal can have been rejected but
        // the last of a pass cut short by the end of the output.
        assert!(copy.proposed - copy.accepted <= 1, "{copy:?}");

        let fresh: Vec<u32> = (0..120).map(|i| 5000 + i).collect();
        let none = config.replay(&text, &fresh, 0.1).unwrap();
        assert_eq!((none.passes, none.proposed), (0, 0), "{none:?}");
        assert_eq!(none.cost, none.tokens as f64);
        assert_eq!((none.speed_up(), none.oracle_speed_up()), (1.0, 1.0));

        // Half the copy, then new text: the oracle is no worse than the rules, and passes that
        // verify more than they accept cost the rules more than the oracle.
        let mixed: Vec<u32> = text[..60]
            .iter()
            .copied()
            .chain(fresh[..60].iter().copied())
            .collect();
        let half = config.replay(&text, &mixed, 0.2).unwrap();
        assert!(half.speed_up() > 1.0 && half.oracle_speed_up() >= half.speed_up());
        assert!(half.oracle_cost <= half.cost);
        // The pricier a verified position, the less any schedule gains.
        let dear = config.replay(&text, &mixed, 0.6).unwrap();
        assert!(
            dear.oracle_speed_up() < half.oracle_speed_up(),
            "{dear:?} {half:?}"
        );

        // Choosing the match: the oracles agree where only one occurrence exists, and where the
        // latest occurrence of a bigram is followed by other text than an earlier one, the
        // earlier one's continuation is what only the any-match oracle takes.
        assert_eq!(copy.any_match_cost, copy.oracle_cost);
        assert_eq!(none.any_match_cost, none.cost);
        assert!(half.any_match_cost <= half.oracle_cost);
        let earlier: Vec<u32> = (0..40).map(|i| 2000 + i).collect();
        let later: Vec<u32> = (0..40).map(|i| 3000 + i).collect();
        let context: Vec<u32> = [7, 8]
            .iter()
            .chain(&earlier)
            .chain(&[7, 8])
            .chain(&later)
            .copied()
            .collect();
        let output: Vec<u32> = [5, 7, 8].iter().chain(&earlier).copied().collect();
        let forked = config.replay(&context, &output, 0.1).unwrap();
        // The latest "7 8" proposes 3000…: one pass lost before the next bigram finds 2000….
        assert!(
            forked.any_match_cost + 0.5 < forked.oracle_cost,
            "{forked:?}"
        );

        let draft = SpeculativeConfig {
            proposer: Proposer::DraftModel,
            ..config
        };
        assert!(draft.replay(&text, &text, 0.1).is_err());
        assert!(config.replay(&text, &text, f32::NAN).is_err());
    }

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_ngram() {
        let config = SpeculativeConfig {
            draft_max: 4,
            draft_min: 1,
            ngram_max: 3,
            ngram_min: 1,
            ..SpeculativeConfig::default()
        };
        // "a b c d e ... a b c" → after the 3-gram "a b c": "d e f x".
        let tokens = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(config.propose(&tokens, 10), [4, 5, 6, 7]);
        assert_eq!(config.propose(&tokens, 2), [4, 5]);
        // The latest occurrence wins.
        let tokens = [5, 8, 5, 9, 5];
        assert_eq!(config.propose(&tokens, 10), [9, 5]);
        // Nothing repeats: no proposal.
        assert!(config.propose(&[1, 2, 3, 4], 10).is_empty());
        // Too few to bother.
        let picky = SpeculativeConfig {
            draft_min: 3,
            ..config
        };
        assert!(picky.propose(&[7, 8, 7], 10).is_empty());
        assert!(picky.validate().is_ok());
        assert!(
            SpeculativeConfig {
                draft_max: 0,
                ..config
            }
            .validate()
            .is_err()
        );
        let flags = |t, d| SpeculativeConfig::from_flags(t, false, d, 8, 1, 0.5);
        assert_eq!(flags(None, false).unwrap(), None);
        assert_eq!(flags(Some("none"), false).unwrap(), None);
        assert_eq!(
            flags(Some("ngram-simple"), false)
                .unwrap()
                .unwrap()
                .proposer,
            Proposer::Ngram
        );
        for (t, d) in [(None, true), (Some("draft-simple"), true)] {
            let config = flags(t, d).unwrap().unwrap();
            assert_eq!(
                (config.proposer, config.draft_max, config.p_min),
                (Proposer::DraftModel, 8, 0.5)
            );
        }
        for (t, d, named) in [
            (Some("none"), true, "--spec-draft-model"),
            (Some("ngram-simple"), true, "--spec-draft-model"),
            (Some("draft-simple"), false, "--spec-draft-model FILE"),
            (Some("eagle"), false, "--spec-type eagle"),
        ] {
            let err = flags(t, d).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
        for p_min in [-0.1, 1.5, f32::NAN] {
            assert!(
                SpeculativeConfig { p_min, ..config }.validate().is_err(),
                "{p_min}"
            );
        }
    }
}
