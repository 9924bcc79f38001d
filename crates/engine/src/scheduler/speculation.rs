//! Speculative decoding's drive in the step: each decoding sequence's proposals (prompt lookup,
//! or the draft model run a pass per proposed token), their verification from the scored
//! positions, and the pass costs that size the next proposals. The rules themselves (draft
//! lengths, acceptance rates, prompt lookup) are [`crate::speculative`]'s.

use mlxcel_capacity::MaxNewTokens;

use crate::backend::{Backend, RequestShape, SequenceStep};
use crate::error::EngineError;
use crate::hashed_chain::{ModTables, Source};
use crate::request::{Event, RequestId};
use crate::speculative::{
    PassCosts, Proposer, SpeculativeConfig, drifted_acceptance, updated_acceptance,
};

use super::emission::{draw, emit, end_with_error, model_probabilities, reported_probabilities};
use super::sequence::Sequence;
use super::stats::SchedulerStats;

/// The draft model, when there is one, and what a verified position costs on this backend.
#[derive(Default)]
pub(super) struct Speculation {
    /// The draft model of draft-model speculation ([`crate::Scheduler::with_draft`]).
    draft: Option<Box<dyn Backend>>,
    /// What a verified position costs here, measured from the steps as they run.
    pass_costs: PassCosts,
    /// The ngram-mod proposer's tables, shared by every sequence and kept across requests.
    mod_tables: ModTables,
}

/// A sequence's draft for this step and the proposer it came from.
pub(super) type Drafted = Option<(Source, Vec<u32>)>;

impl Speculation {
    /// Lets sequences speculate with the draft model `draft`.
    pub(super) fn set_draft(&mut self, draft: Box<dyn Backend>) {
        self.draft = Some(draft);
    }

    /// Whether a draft model is loaded.
    pub(super) fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// The drafts asked for first in a step: for each running sequence that decodes now, the
    /// draft model's proposals (it runs a pass per proposed token, per sequence) or, for a
    /// sequence whose types form a chain ([`SpeculativeConfig::is_chain`]), the first draft of
    /// its proposers in llama.cpp's order (prompt lookup, `ngram-map-k`, `ngram-map-k4v`,
    /// `ngram-mod`, the draft model); `None` for the others (prompt lookup alone proposes in
    /// [`Speculation::proposals`]) and where no proposer drafted.
    pub(super) fn draft_proposals(
        &mut self,
        running: &mut [Sequence],
        can_score: bool,
        prefill_chunk: usize,
        stats: &mut SchedulerStats,
    ) -> Vec<Drafted> {
        let mut drafted: Vec<Drafted> = vec![None; running.len()];
        if !can_score {
            return drafted;
        }
        for (sequence, out) in running.iter_mut().zip(drafted.iter_mut()) {
            let Some(config) = sequence.speculative else {
                continue;
            };
            if sequence.computed < sequence.prompt_len
                || sequence.tokens.len() - sequence.computed != 1
            {
                continue;
            }
            if !config.is_chain() {
                if config.proposer == Proposer::DraftModel
                    && let Some(draft) = self.draft.as_deref_mut()
                {
                    let limit = speculation_limit(sequence, &self.pass_costs);
                    let proposals =
                        propose_with_draft(draft, sequence, limit, prefill_chunk, stats);
                    *out = Some((Source::Draft, proposals));
                }
                continue;
            }
            sequence.hashed.begin(
                &config,
                &sequence.tokens[..sequence.prompt_len],
                &mut self.mod_tables,
            );
            // As in llama.cpp, the proposers are asked at every step with room for a proposal,
            // whatever the adaptive draft length, so that their state is llama.cpp's.
            let room = room_left(sequence);
            sequence.hashed.pending = None;
            if room == 0 {
                continue;
            }
            let mut found = None;
            if config.proposer.looks_up() {
                let proposals = config.propose(&sequence.tokens, room);
                if !proposals.is_empty() {
                    found = Some((Source::Lookup, proposals));
                }
            }
            if found.is_none() {
                found = sequence
                    .hashed
                    .draft(&config, &sequence.tokens, &mut self.mod_tables);
            }
            if found.is_none()
                && config.proposer.uses_draft()
                && let Some(draft) = self.draft.as_deref_mut()
            {
                let limit = speculation_limit(sequence, &self.pass_costs);
                let proposals = propose_with_draft(draft, sequence, limit, prefill_chunk, stats);
                if !proposals.is_empty() {
                    found = Some((Source::Draft, proposals));
                }
            }
            if let Some((source, mut proposals)) = found {
                proposals.truncate(room);
                sequence.hashed.pending = Some(source);
                *out = Some((source, proposals));
            }
        }
        drafted
    }

    /// The proposals decoding `sequence` (speculating under `config`) verifies in this step,
    /// with `room` positions left in the step's token budget besides its pending token (the
    /// draft taken from `drafted`, or prompt lookup's); and whether its adaptive limit came out
    /// 0 (not worth a pass now, or no room), so that it drifts back towards trying again. A
    /// hashed proposer's draft is verified whole (as far as `room` goes), as llama.cpp does;
    /// prompt lookup's and the draft model's are cut to the adaptive draft length.
    pub(super) fn proposals(
        &self,
        sequence: &Sequence,
        config: SpeculativeConfig,
        drafted: &mut Drafted,
        room: usize,
    ) -> (Vec<u32>, bool) {
        let limit = speculation_limit(sequence, &self.pass_costs).min(room);
        let mut proposals = match drafted.take() {
            Some((source, mut proposals)) if source.verified_whole() => {
                proposals.truncate(room);
                return (proposals, false);
            }
            Some((Source::Lookup, mut proposals)) => {
                proposals.truncate(limit);
                if proposals.len() < config.draft_min.max(1) {
                    proposals.clear();
                }
                proposals
            }
            Some((_, proposals)) => proposals,
            None if config.proposer == Proposer::Ngram && !config.is_chain() => {
                config.propose(&sequence.tokens, limit)
            }
            None => Vec::new(),
        };
        proposals.truncate(room);
        (proposals, limit == 0)
    }

    /// Tells the proposer of the draft `sequence` just verified how many of its proposals were
    /// accepted (llama.cpp's hashed proposers size their next drafts by it).
    pub(super) fn feedback(&mut self, sequence: &mut Sequence, accepted: usize) {
        if let (Some(source), Some(config)) = (sequence.hashed.pending.take(), sequence.speculative)
        {
            sequence
                .hashed
                .accept(&config, source, accepted, &mut self.mod_tables);
        }
    }

    /// Learns what a verified position costs from a one-sequence step without prefill over
    /// 1 + `extra` positions (0: a decode step) that took `secs`; `prior` is the sequence's
    /// configured row cost.
    pub(super) fn observe_pass(&mut self, extra: usize, secs: f64, prior: f32) {
        self.pass_costs.observe(extra, secs, prior);
    }

    /// Releases finished `sequence`'s slot in the draft model.
    pub(super) fn release(&mut self, sequence: &mut Sequence) {
        if let (Some(draft), Some(slot)) = (self.draft.as_mut(), sequence.draft.slot.take()) {
            draft.release_slot(slot);
        }
    }
}

/// A speculating sequence that verified no proposals this step: not worth a pass now (or no
/// room), its acceptance drifts back towards trying again.
pub(super) fn drift(sequence: &mut Sequence) {
    sequence.acceptance = drifted_acceptance(sequence.acceptance);
    sequence.quiet_steps += 1;
}

/// The draft model's proposals for decoding `sequence`, at most `limit`: its
/// slot is reconciled with the sequence (positions past the first proposal the sequence did
/// not take are dropped), fed the tokens it has not seen, then asked for its most likely
/// token, fed it, and asked again, until `limit` tokens or one less likely than `p_min`. Empty
/// when fewer than `draft_min` come, or the draft cannot serve the sequence (which then
/// decodes without it).
fn propose_with_draft(
    draft: &mut dyn Backend,
    sequence: &mut Sequence,
    limit: usize,
    prefill_chunk: usize,
    stats: &mut SchedulerStats,
) -> Vec<u32> {
    let Some(config) = sequence.speculative else {
        return Vec::new();
    };
    let state = &mut sequence.draft;
    if state.off || limit == 0 || limit < config.draft_min {
        return Vec::new();
    }
    let result = (|| -> Result<Vec<u32>, EngineError> {
        let slot = match state.slot {
            Some(slot) => slot,
            None => {
                let plan = draft.create_session_for_request(&RequestShape {
                    prompt_len: sequence.prompt_len,
                    image_tokens: 0,
                    max_new_tokens: MaxNewTokens::Limited(sequence.plan.admitted_max_new_tokens),
                })?;
                let slot = draft.allocate_slot(&plan)?;
                state.slot = Some(slot);
                slot
            }
        };
        // Keep the positions whose inputs are the sequence's tokens.
        let tokens = &sequence.tokens;
        let valid = state.base
            + state
                .fed
                .iter()
                .zip(tokens.get(state.base..).unwrap_or(&[]))
                .take_while(|(a, b)| a == b)
                .count();
        let valid = valid.min(state.computed);
        if valid < state.computed {
            draft.truncate(slot, valid)?;
            state.computed = valid;
        }
        state.fed.clear();
        state.base = tokens.len();
        // Catch up on what it has not seen (the prompt, the tokens since its last turn).
        let mut logits = None;
        while state.computed < tokens.len() {
            let end = tokens.len().min(state.computed + prefill_chunk);
            let step = SequenceStep {
                slot,
                tokens: &tokens[state.computed..end],
                start_position: state.computed,
            };
            logits = draft.step(&[step])?.pop();
            state.computed = end;
        }
        let Some(mut logits) = logits else {
            return Ok(Vec::new());
        };
        let mut proposals = Vec::new();
        loop {
            let (token, p) = top_token(&logits);
            if p < config.p_min {
                break;
            }
            proposals.push(token);
            if proposals.len() >= limit {
                break;
            }
            let step = SequenceStep {
                slot,
                tokens: &[token],
                start_position: state.computed,
            };
            let next = draft.step(&[step])?.pop();
            state.computed += 1;
            state.fed.push(token);
            match next {
                Some(next) => logits = next,
                None => break,
            }
        }
        Ok(if proposals.len() < config.draft_min.max(1) {
            Vec::new()
        } else {
            proposals
        })
    })();
    match result {
        Ok(proposals) => proposals,
        Err(_) => {
            // The draft's window or KV memory cannot hold the sequence, or it failed: the
            // sequence goes on without it (counted; its output is the same either way).
            stats.draft_fallbacks += 1;
            state.off = true;
            if let Some(slot) = state.slot.take() {
                draft.release_slot(slot);
            }
            Vec::new()
        }
    }
}

/// The outcome of a speculative sequence's verification: `rows` are the logits of its
/// pending token's position and of each proposal's. Each position's token is sampled in
/// order (a proposal accepted by [`crate::Sampler::verify`]'s rule) until one differs from its
/// proposal or the sequence ends; the cache keeps only the positions whose inputs were right.
pub(super) fn accept<B: Backend + ?Sized>(
    backend: &mut B,
    sequence: &mut Sequence,
    stats: &mut SchedulerStats,
    proposals: &[u32],
    rows: Vec<Vec<f32>>,
    events: &mut Vec<(RequestId, Event)>,
) -> usize {
    let slot = sequence.slot.expect("running sequences hold a slot");
    // The pending token's position is now cached.
    sequence.computed += 1;
    stats.drafts += 1;
    stats.drafted_tokens += proposals.len() as u64;
    let mut accepted_here = 0;
    for (i, mut logits) in rows.into_iter().enumerate() {
        let before = model_probabilities(sequence, &logits);
        // Structured output: this position's mask, from the constraint's state after the
        // tokens accepted so far (a proposal it forbids is rejected like any other).
        let Sequence {
            constraint,
            stop_token_ids,
            ..
        } = &mut *sequence;
        if let Some(constraint) = constraint.as_mut()
            && let Err(message) = constraint.mask(&mut logits, stop_token_ids)
        {
            end_with_error(sequence, format!("structured output: {message}"), events);
            return accepted_here;
        }
        let (token, accepted) = draw(sequence, &mut logits, proposals.get(i).copied());
        let reported = reported_probabilities(sequence, before, token);
        let finished = emit(sequence, stats, token, reported, events);
        if finished || !accepted {
            break;
        }
        // The proposal was right: its position (the next input) is valid too.
        sequence.computed += 1;
        stats.accepted_tokens += 1;
        accepted_here += 1;
    }
    sequence.quiet_steps = 0;
    sequence.drafted += proposals.len();
    sequence.accepted += accepted_here;
    let positions = sequence.speculative.map_or(0, |c| c.draft_max);
    count_per_position(&mut stats.accepted_per_position, positions, accepted_here);
    sequence.acceptance = updated_acceptance(sequence.acceptance, proposals.len(), accepted_here);
    if !sequence.status.is_finished()
        && let Err(err) = backend.truncate(slot, sequence.computed)
    {
        end_with_error(sequence, err.to_string(), events);
    }
    accepted_here
}

/// Counts one accepted proposal at each of positions `0..accepted` in `per_position`, first
/// grown to `positions` entries (the sequence's most proposals per pass).
fn count_per_position(per_position: &mut Vec<u64>, positions: usize, accepted: usize) {
    if per_position.len() < positions.max(accepted) {
        per_position.resize(positions.max(accepted), 0);
    }
    for count in &mut per_position[..accepted] {
        *count += 1;
    }
}

/// Room for proposals in `sequence`: for them and the token after them within its budget and
/// its shape (llama.cpp's `n_draft_max`).
fn room_left(sequence: &Sequence) -> usize {
    let budget_left = sequence
        .plan
        .admitted_max_new_tokens
        .saturating_sub(sequence.generated() + 1);
    let room = sequence
        .plan
        .max_positions
        .saturating_sub(sequence.tokens.len() + 1);
    budget_left.min(room)
}

/// How many proposals `sequence` may verify in its next pass: its [`room_left`], and its
/// adaptive draft length.
fn speculation_limit(sequence: &Sequence, costs: &PassCosts) -> usize {
    let limit = room_left(sequence);
    sequence.speculative.map_or(0, |config| {
        config.next_draft(
            sequence.acceptance,
            sequence.quiet_steps,
            costs.row_cost(config.row_cost),
            limit,
        )
    })
}

/// The most likely token of `logits` and its probability (softmax).
fn top_token(logits: &[f32]) -> (u32, f32) {
    let (best, max) =
        logits
            .iter()
            .copied()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| {
                if v > bv { (i, v) } else { (bi, bv) }
            });
    let sum: f64 = logits.iter().map(|&v| f64::from(v - max).exp()).sum();
    (best as u32, (1.0 / sum) as f32)
}
