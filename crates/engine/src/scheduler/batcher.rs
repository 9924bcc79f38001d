//! The continuous batcher: the [`Scheduler`], its admission of waiting requests and its step,
//! the one place the scheduler and its backend meet. The prefix cache, speculation, constraint
//! masks and the events a step reports are the sibling files'; this one plans each step's batch,
//! runs it and hands the rows out.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::backend::{Backend, RequestShape, SequenceStep, SessionPlan, ShapePolicy};
use crate::decode::TextDecoder;
use crate::error::EngineError;
use crate::hashed_chain::HashedState;
use crate::reasoning_budget::{BudgetTracker, ReasoningEnd};
use crate::request::{Event, GenerationRequest, RequestId, RequestStatus};
use crate::sampling::{BreakerVocabulary, Sampler};
use crate::stop::StopMatcher;

use super::config::SchedulerConfig;
use super::constraints::{ConstraintSource, mask_constrained};
use super::emission::{advance, end_with_error, finished_event, report_end};
use super::indent::IndentStop;
use super::prefix_cache::{CachedPrefix, PrefixCache, waits_for_sharer};
use super::sequence::{DraftState, Sequence};
use super::speculation::{self, Speculation};
use super::stats::{BucketOccupancy, RequestProgress, SchedulerStats};

/// What a replaced scheduler hands its successor ([`Scheduler::carried`]).
#[derive(Debug, Clone)]
pub(crate) struct Carried {
    next_id: RequestId,
    stats: SchedulerStats,
}

/// The continuous batcher over one backend.
pub struct Scheduler<B: Backend> {
    backend: B,
    decoder: Arc<dyn TextDecoder>,
    config: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_id: RequestId,
    /// The counters the scheduler keeps itself (the prefix cache keeps its own:
    /// [`Scheduler::stats`] reads both).
    stats: SchedulerStats,
    /// Compiles structured-output constraints for the model's vocabulary (built on the first
    /// constrained request); `None` without a tokenizer (then such requests are refused).
    constraints: Option<Arc<ConstraintSource>>,
    /// Resolves DRY's sequence breakers against the model's vocabulary; `None` without a
    /// tokenizer (then DRY runs without breakers).
    breakers: Option<Arc<BreakerVocabulary>>,
    /// Finished sequences' slots kept for requests that start with the same tokens.
    prefix: PrefixCache,
    /// The draft model, and what a verified position costs.
    speculation: Speculation,
}

impl<B: Backend> std::fmt::Debug for Scheduler<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("backend", &self.backend.name())
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<B: Backend> Scheduler<B> {
    /// A scheduler over `backend`, decoding text with `decoder`.
    pub fn new(
        backend: B,
        decoder: Arc<dyn TextDecoder>,
        config: SchedulerConfig,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        Ok(Self {
            backend,
            decoder,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 1,
            stats: SchedulerStats::default(),
            constraints: None,
            breakers: None,
            prefix: PrefixCache::default(),
            speculation: Speculation::default(),
        })
    }

    /// Lets requests speculate with `draft`, a model over the same vocabulary
    /// ([`Proposer::DraftModel`]); its vocabulary size must be this backend's.
    pub fn with_draft(mut self, draft: Box<dyn Backend>) -> Result<Self, EngineError> {
        if draft.vocab_size() != self.backend.vocab_size() {
            return Err(EngineError::InvalidSpeculation(format!(
                "the draft model's vocabulary has {} entries, the model's {}: a draft model must \
                 share the model's tokenizer",
                draft.vocab_size(),
                self.backend.vocab_size()
            )));
        }
        if draft.recurrent_state() {
            return Err(EngineError::InvalidSpeculation(format!(
                "the draft model: {}",
                crate::speculative::HYBRID_STATE
            )));
        }
        self.speculation.set_draft(draft);
        Ok(self)
    }

    /// Keeps finished sequences' caches, up to `bytes` of KV memory, for requests that start with
    /// the same tokens (on backends that can copy a prefix between slots; 0: off).
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        let budget = if self.backend.can_copy_prefix() {
            bytes
        } else {
            0
        };
        // A hybrid model's cached prefixes resume from snapshots of its recurrent state at
        // block boundaries, which slots keep only while there is a cache to use them.
        self.backend.keep_state_snapshots(budget > 0);
        self.prefix.set_budget(budget);
        self
    }

    /// What the prefix cache holds for `id` (a finished request's id, or a restored entry's):
    /// its tokens and their keys and values ([`Backend::export_kv`]'s layout, and a hybrid
    /// model's recurrent state after them, [`Backend::export_state`]'s); `None` when the
    /// request's slot was not kept (the cache off, or too short a sequence) or has been evicted.
    /// An entry taken over by a later request reads from what holds its positions now.
    pub fn export_cached(&mut self, id: RequestId) -> Result<Option<CachedPrefix>, EngineError> {
        self.prefix.export(&mut self.backend, &self.running, id)
    }

    /// Puts `tokens` with their keys and values (what [`Scheduler::export_cached`] returned, on
    /// this model) into the prefix cache, evicting least recently used entries to make room;
    /// returns the entry's id. Refused when the prefix cache is off or smaller than the entry.
    pub fn restore_cached(
        &mut self,
        tokens: Vec<u32>,
        kv: &[f32],
    ) -> Result<RequestId, EngineError> {
        self.restore_cached_state(tokens, kv, &[])
    }

    /// [`Scheduler::restore_cached`] with the recurrent state after the tokens (a hybrid
    /// model's: [`CachedPrefix::state`]; empty for a model without one).
    pub fn restore_cached_state(
        &mut self,
        tokens: Vec<u32>,
        kv: &[f32],
        state: &[f32],
    ) -> Result<RequestId, EngineError> {
        self.prefix.restore(
            &mut self.backend,
            &self.running,
            tokens,
            (kv, state),
            &mut self.next_id,
        )
    }

    /// Drops `id`'s entry from the prefix cache; returns the tokens it held (0: none was kept).
    /// An entry taken over by a later request is forgotten under its id (the taker keeps the
    /// positions).
    pub fn erase_cached(&mut self, id: RequestId) -> usize {
        self.prefix.erase(&mut self.backend, &self.running, id)
    }

    /// What a scheduler built to replace this one carries on (the engine's, when it wakes from
    /// sleep): the next request id, so that ids stay unique across the two, and the counters, so
    /// that its metrics continue rather than restart.
    pub(crate) fn carried(&self) -> Carried {
        Carried {
            next_id: self.next_id,
            stats: self.stats(),
        }
    }

    /// Continues from `carried` (a replaced scheduler's [`Scheduler::carried`]): request ids
    /// after its, its counters as the start of this one's. What it held (requests, kept slots)
    /// is not carried: it went with its backend.
    pub(crate) fn carry_on(mut self, carried: Carried) -> Self {
        self.next_id = self.next_id.max(carried.next_id);
        self.prefix
            .carry_counters(carried.stats.prefix, carried.stats.reused_tokens);
        self.stats = carried.stats;
        self
    }

    /// Lets requests carry structured-output constraints, compiled against this vocabulary.
    pub(crate) fn with_constraints(mut self, source: Arc<ConstraintSource>) -> Self {
        self.constraints = Some(source);
        self
    }

    /// Resolves DRY's sequence breakers with `vocabulary` (the model's tokenizer).
    pub(crate) fn with_breaker_vocabulary(mut self, vocabulary: Arc<BreakerVocabulary>) -> Self {
        self.breakers = Some(vocabulary);
        self
    }

    /// The backend, for queries such as its window.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably, for backend-specific controls between steps.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Counters as of the last step.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            reused_tokens: self.prefix.reused_tokens(),
            prefix: self.prefix.stats(),
            ..self.stats.clone()
        }
    }

    /// Each static-shape bucket's running sequences and the positions they hold; empty for a
    /// dynamic backend.
    pub fn bucket_occupancy(&self) -> Vec<BucketOccupancy> {
        let ShapePolicy::Static { buckets } = self.backend.shape_policy() else {
            return Vec::new();
        };
        buckets
            .iter()
            .map(|bucket| {
                let members = self
                    .running
                    .iter()
                    .filter(|s| s.plan.context_capacity == Some(bucket.context_capacity));
                BucketOccupancy {
                    context_capacity: bucket.context_capacity,
                    max_batch: bucket.max_batch,
                    running: members.clone().count(),
                    positions_used: members.map(|s| s.computed).sum(),
                }
            })
            .collect()
    }

    /// How far each running request's prompt has got.
    pub fn running_progress(&self) -> impl Iterator<Item = RequestProgress> + '_ {
        self.running.iter().map(|s| RequestProgress {
            id: s.id,
            prompt_processed: s.computed.min(s.prompt_len).saturating_sub(s.cached),
            prompt_cached: s.cached,
        })
    }

    /// The requests holding a slot.
    pub fn running_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running.iter().map(|s| s.id)
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Sizes and queues a request. Refusals (a request no shape can hold, bad sampling settings, a
    /// full queue) happen here, before the request takes any resources.
    pub fn submit(&mut self, request: GenerationRequest) -> Result<RequestId, EngineError> {
        if request.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if self.waiting.len() >= self.config.max_waiting {
            return Err(EngineError::QueueFull {
                capacity: self.config.max_waiting,
            });
        }
        let plan = self.backend.create_session_for_request(&RequestShape {
            prompt_len: request.prompt.len(),
            image_tokens: 0,
            max_new_tokens: request.max_new_tokens,
        })?;
        let dry_breakers = match &self.breakers {
            Some(vocabulary) if request.sampling.dry_enabled() => {
                vocabulary.resolve(&request.sampling.dry_sequence_breakers)
            }
            _ => Arc::default(),
        };
        let sampler = Sampler::new(request.sampling)?.with_dry_breakers(dry_breakers);
        if let Some(budget) = &request.reasoning_budget {
            budget
                .check()
                .map_err(EngineError::InvalidReasoningBudget)?;
        }
        if let Some(speculative) = &request.speculative {
            speculative.validate()?;
            if !self.backend.can_score() {
                return Err(EngineError::InvalidSpeculation(
                    crate::speculative::NEEDS_SCORING.into(),
                ));
            }
            if speculative.proposer.uses_draft() && !self.speculation.has_draft() {
                return Err(EngineError::InvalidSpeculation(
                    "the request asks for the draft model, but none is loaded (start the engine \
                     with a draft model: --spec-draft-model)"
                        .into(),
                ));
            }
        }
        let constraint = match &request.constraint {
            None => None,
            Some(c) => {
                let source = self
                    .constraints
                    .as_ref()
                    .ok_or(EngineError::InvalidConstraint {
                        kind: "constraint",
                        message: "structured output needs the model's tokenizer".into(),
                    })?;
                Some(
                    source
                        .get()?
                        .matcher(c)?
                        .lazy(&request.constraint_triggers)?,
                )
            }
        };
        let budget = request
            .reasoning_budget
            .map(|budget| BudgetTracker::new(budget, &request.prompt));
        let mut lora = request.lora;
        while lora.last() == Some(&0.0) {
            lora.pop();
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Sequence {
            id,
            status: RequestStatus::Waiting,
            plan,
            slot: None,
            decoder: self.decoder.stream(&request.prompt),
            prompt_len: request.prompt.len(),
            tokens: request.prompt,
            computed: 0,
            cached: 0,
            reuse_cached_prefix: request.reuse_cached_prefix && lora.is_empty(),
            lora,
            sampler,
            stops: StopMatcher::new(request.stop),
            stop_token_ids: request.stop_token_ids,
            logprobs: request.logprobs,
            post_sampling_probs: request.post_sampling_probs,
            constraint,
            speculative: request.speculative,
            acceptance: crate::speculative::PRIOR_ACCEPTANCE,
            quiet_steps: 0,
            drafted: 0,
            accepted: 0,
            draft: DraftState::default(),
            hashed: HashedState::default(),
            cancel_requested: false,
            predict_time_limit: request.predict_time_limit,
            first_token_at: None,
            indent: IndentStop::new(request.min_indent),
            indent_stopped: false,
            budget,
            forced_last: false,
        });
        Ok(id)
    }

    /// The plan a queued or running request runs under.
    pub fn plan(&self, id: RequestId) -> Option<SessionPlan> {
        self.waiting
            .iter()
            .chain(&self.running)
            .find(|s| s.id == id)
            .map(|s| s.plan)
    }

    /// Asks for a request to end; it finishes as `cancelled` at the start of the next step.
    /// Returns whether the request was known.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self
            .waiting
            .iter_mut()
            .chain(self.running.iter_mut())
            .find(|s| s.id == id)
        {
            Some(sequence) => {
                sequence.cancel_requested = true;
                true
            }
            None => false,
        }
    }

    /// Ends running request `id`'s reasoning block now ([`ReasoningEnd`] says whether it could).
    pub fn end_reasoning(&mut self, id: RequestId) -> ReasoningEnd {
        let Some(sequence) = self
            .waiting
            .iter_mut()
            .chain(self.running.iter_mut())
            .find(|s| s.id == id && !s.status.is_finished())
        else {
            return ReasoningEnd::UnknownRequest;
        };
        match &mut sequence.budget {
            None => ReasoningEnd::NoBudget,
            Some(budget) => {
                if budget.force() {
                    ReasoningEnd::Ended
                } else {
                    ReasoningEnd::NotReasoning
                }
            }
        }
    }

    /// Runs one step and returns what happened to each request, in order.
    pub fn step(&mut self) -> Vec<(RequestId, Event)> {
        let mut events = Vec::new();
        self.finish_early(&mut events);
        self.admit(&mut events);

        // Decode first (one token each), then prefill chunks in admission order.
        let mut budget = self.config.token_budget;
        let mut scheduled: Vec<(usize, usize)> = Vec::new();
        // Decoding sequences with proposals verify them in the same step, every position of
        // theirs scored.
        let mut speculations: Vec<(usize, Vec<u32>)> = Vec::new();
        let can_score = self.backend.can_score();
        let mut drifting: Vec<usize> = Vec::new();
        // The draft model's proposals first: it runs a pass per proposed token, per sequence.
        let mut drafted = self.speculation.draft_proposals(
            &mut self.running,
            can_score,
            self.config.prefill_chunk,
            &mut self.stats,
        );
        for (index, sequence) in self.running.iter().enumerate() {
            let pending = sequence.tokens.len() - sequence.computed;
            if sequence.computed >= sequence.prompt_len && pending == 1 && budget > 0 {
                if let Some(config) = sequence.speculative.filter(|_| can_score) {
                    // Proposals beyond the step's token budget wait for a later pass.
                    let room = budget - 1;
                    let (proposals, drifts) =
                        self.speculation
                            .proposals(sequence, config, &mut drafted[index], room);
                    if drifts {
                        // Not worth a pass now (or no room): back towards trying again.
                        drifting.push(index);
                    }
                    if !proposals.is_empty() {
                        budget -= 1 + proposals.len();
                        speculations.push((index, proposals));
                        continue;
                    }
                }
                scheduled.push((index, 1));
                budget -= 1;
            }
        }
        for index in drifting {
            speculation::drift(&mut self.running[index]);
        }
        for index in 0..self.running.len() {
            let sequence = &self.running[index];
            if sequence.computed < sequence.prompt_len && budget > 0 {
                if self.prefix.is_on() && sequence.reuse_cached_prefix {
                    // A hybrid model's prefixes are given from state snapshots at block
                    // boundaries: waiting for a shorter shared prefix would gain nothing.
                    let grain = match self.backend.kv_blocks() {
                        Some(blocks) if self.backend.recurrent_state() => blocks.block_positions,
                        _ => 1,
                    };
                    if waits_for_sharer(&self.running, index, grain) {
                        continue;
                    }
                    self.prefix
                        .copy_computed_prefix(&mut self.backend, &mut self.running, index);
                }
                let sequence = &self.running[index];
                let chunk = (sequence.prompt_len - sequence.computed)
                    .min(self.config.prefill_chunk)
                    .min(budget);
                scheduled.push((index, chunk));
                budget -= chunk;
            }
        }
        if scheduled.is_empty() && speculations.is_empty() {
            self.retire(&mut events);
            return events;
        }

        // Speculating sequences run their pending token and proposals in the same step as the
        // others' decode and prefill, every position scored.
        let spec_inputs: Vec<Vec<u32>> = speculations
            .iter()
            .map(|(index, proposals)| {
                let sequence = &self.running[*index];
                let mut input = Vec::with_capacity(1 + proposals.len());
                input.push(*sequence.tokens.last().expect("a pending token"));
                input.extend_from_slice(proposals);
                input
            })
            .collect();
        let mut batch: Vec<SequenceStep<'_>> = scheduled
            .iter()
            .map(|&(index, count)| {
                let s = &self.running[index];
                SequenceStep {
                    slot: s.slot.expect("running sequences hold a slot"),
                    tokens: &s.tokens[s.computed..s.computed + count],
                    start_position: s.computed,
                }
            })
            .collect();
        let mut firsts: Vec<usize> = scheduled.iter().map(|&(_, count)| count - 1).collect();
        for ((index, _), input) in speculations.iter().zip(&spec_inputs) {
            let s = &self.running[*index];
            batch.push(SequenceStep {
                slot: s.slot.expect("running sequences hold a slot"),
                tokens: input,
                start_position: s.computed,
            });
            firsts.push(0);
        }
        let started = std::time::Instant::now();
        let result = if speculations.is_empty() {
            self.backend
                .step(&batch)
                .map(|rows| rows.into_iter().map(|row| vec![row]).collect())
        } else {
            self.backend.step_scored(&batch, &firsts)
        };
        let expected: Vec<usize> = batch
            .iter()
            .zip(&firsts)
            .map(|(entry, first)| entry.tokens.len() - first)
            .collect();
        // A one-sequence step without prefill times a decode step (no proposals) or a pass over
        // 1 + k positions: what the speculation cost model learns from.
        if batch.len() == 1 && scheduled.iter().all(|&(_, count)| count == 1) && result.is_ok() {
            let index = scheduled
                .first()
                .map_or_else(|| speculations[0].0, |&(index, _)| index);
            let prior = self.running[index].speculative.unwrap_or_default().row_cost;
            self.speculation.observe_pass(
                batch[0].tokens.len() - 1,
                started.elapsed().as_secs_f64(),
                prior,
            );
        }
        drop(batch);
        self.stats.steps += 1;
        self.stats.busy_slot_steps += expected.len() as u64;
        let mut all = scheduled.clone();
        all.extend(speculations.iter().map(|(index, p)| (*index, 1 + p.len())));

        match result {
            Ok(rows)
                if rows.len() == expected.len()
                    && rows.iter().zip(&expected).all(|(r, &n)| r.len() == n) =>
            {
                let mut rows = rows.into_iter();
                let mut logits: Vec<Vec<f32>> = rows
                    .by_ref()
                    .take(scheduled.len())
                    .map(|mut r| r.pop().expect("one row"))
                    .collect();
                let masking = std::time::Instant::now();
                let masked = mask_constrained(&mut self.running, &scheduled, &mut logits);
                let computed = masked.iter().filter(|m| m.is_some()).count() as u64;
                if computed > 0 {
                    self.stats.constraint_masks += computed;
                    self.stats.constraint_mask_time += masking.elapsed();
                }
                for ((&(index, count), logits), masked) in scheduled.iter().zip(logits).zip(masked)
                {
                    advance(
                        &mut self.running[index],
                        &mut self.stats,
                        count,
                        logits,
                        masked,
                        &mut events,
                    );
                }
                for ((index, proposals), rows) in speculations.into_iter().zip(rows) {
                    let accepted = speculation::accept(
                        &mut self.backend,
                        &mut self.running[index],
                        &mut self.stats,
                        &proposals,
                        rows,
                        &mut events,
                    );
                    self.speculation
                        .feedback(&mut self.running[index], accepted);
                }
            }
            Ok(rows) => {
                let message = format!(
                    "returned {} logits vectors for a batch of {} (positions {:?}, expected {:?})",
                    rows.len(),
                    expected.len(),
                    rows.iter().map(Vec::len).collect::<Vec<_>>(),
                    expected
                );
                self.fail(&all, &message, &mut events);
            }
            Err(err) => self.fail(&all, &err.to_string(), &mut events),
        }
        self.retire(&mut events);
        events
    }

    /// Ends, before any work is scheduled, the requests that were cancelled and those whose budget
    /// is zero (nothing to generate).
    fn finish_early(&mut self, events: &mut Vec<(RequestId, Event)>) {
        let mut index = 0;
        while index < self.waiting.len() {
            let sequence = &self.waiting[index];
            let status = if sequence.cancel_requested {
                Some(RequestStatus::FinishedCancelled)
            } else if sequence.plan.admitted_max_new_tokens == 0 {
                Some(RequestStatus::FinishedLength)
            } else {
                None
            };
            if let Some(status) = status {
                let mut sequence = self.waiting.remove(index).expect("index is in range");
                sequence.status = status;
                events.push((sequence.id, finished_event(&sequence, String::new(), None)));
            } else {
                index += 1;
            }
        }
        for sequence in &mut self.running {
            if sequence.cancel_requested {
                sequence.status = RequestStatus::FinishedCancelled;
            }
        }
        self.retire(events);
    }

    /// Moves waiting requests into the running set, first come first served, while there is room.
    /// A request whose slot cannot be allocated for a reason other than a full backend (an
    /// OpenXLA module that fails to compile, say) ends with that error: waiting would retry the
    /// same failure every step.
    fn admit(&mut self, events: &mut Vec<(RequestId, Event)>) {
        while self.running.len() < self.config.max_batch {
            let Some(head) = self.waiting.front() else {
                break;
            };
            if !self.bucket_has_room(&head.plan) {
                break;
            }
            let look_up = self.prefix.is_on() && head.reuse_cached_prefix;
            if look_up
                && let Some(i) = self.prefix.takeover(
                    &self.backend,
                    &self.running,
                    &head.tokens[..head.prompt_len],
                )
            {
                let (slot, len) = self.prefix.entry(i);
                let adopted = self.backend.adopt_slot(slot, &head.plan, len);
                match adopted {
                    Ok(()) => {
                        let mut sequence = self.waiting.pop_front().expect("head exists");
                        self.backend.set_slot_adapters(slot, sequence.lora.clone());
                        self.prefix.hand_over(i, &sequence);
                        sequence.slot = Some(slot);
                        sequence.status = RequestStatus::Running;
                        sequence.computed = len;
                        sequence.cached = len;
                        self.running.push(sequence);
                        continue;
                    }
                    // Room for the plan: other entries give way first.
                    Err(EngineError::NoFreeSlot)
                        if self.prefix.evict_one_but(
                            &mut self.backend,
                            &self.running,
                            Some(slot),
                        ) =>
                    {
                        continue;
                    }
                    // Otherwise a fresh slot and a copy, as for any other prefix.
                    Err(_) => {}
                }
            }
            let Some(head) = self.waiting.front() else {
                break;
            };
            let plan = head.plan;
            match self.backend.allocate_slot(&plan) {
                Ok(slot) => {
                    let mut sequence = self.waiting.pop_front().expect("head exists");
                    self.backend.set_slot_adapters(slot, sequence.lora.clone());
                    sequence.slot = Some(slot);
                    sequence.status = RequestStatus::Running;
                    if look_up {
                        self.prefix.copy_at_admission(
                            &mut self.backend,
                            &self.running,
                            &mut sequence,
                            slot,
                        );
                    }
                    self.running.push(sequence);
                }
                // Memory held by the prefix cache gives way to new requests.
                Err(_)
                    if self.prefix.evict_for(
                        &mut self.backend,
                        &self.running,
                        Some(&plan),
                        None,
                    ) =>
                {
                    continue;
                }
                Err(EngineError::NoFreeSlot) => break,
                Err(e) => {
                    let mut sequence = self.waiting.pop_front().expect("head exists");
                    end_with_error(&mut sequence, e.to_string(), events);
                }
            }
        }
    }

    fn bucket_has_room(&self, plan: &SessionPlan) -> bool {
        let (ShapePolicy::Static { buckets }, Some(capacity)) =
            (self.backend.shape_policy(), plan.context_capacity)
        else {
            return true;
        };
        let limit = buckets
            .iter()
            .find(|b| b.context_capacity == capacity)
            .map_or(0, |b| b.max_batch);
        let in_bucket = self
            .running
            .iter()
            .filter(|s| s.plan.context_capacity == Some(capacity))
            .count();
        in_bucket < limit
    }

    fn fail(
        &mut self,
        scheduled: &[(usize, usize)],
        message: &str,
        events: &mut Vec<(RequestId, Event)>,
    ) {
        for &(index, _) in scheduled {
            end_with_error(&mut self.running[index], message.to_owned(), events);
        }
    }

    /// Releases the slots of finished sequences and reports their end.
    fn retire(&mut self, events: &mut Vec<(RequestId, Event)>) {
        let mut index = 0;
        while index < self.running.len() {
            if !self.running[index].status.is_finished() {
                index += 1;
                continue;
            }
            let mut sequence = self.running.remove(index);
            self.speculation.release(&mut sequence);
            if let Some(slot) = sequence.slot.take() {
                self.prefix
                    .keep_or_release(&mut self.backend, &self.running, &sequence, slot);
            }
            report_end(&mut sequence, events);
        }
        self.prefix.prune_taken(&self.running);
    }
}
