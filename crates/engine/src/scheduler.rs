//! Continuous batching: one step decodes a token for every running sequence and spends the rest
//! of a token budget on chunked prefill, admitting waiting requests first come, first served.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::backend::{Backend, RequestShape, SequenceStep, SessionPlan, ShapePolicy, SlotId};
use crate::constraint::{ConstrainedOutput, Constraints};
use crate::decode::{DecodeStream, TextDecoder};
use crate::error::EngineError;
use crate::metrics::{BucketOccupancy, RequestProgress};
use crate::request::{
    Event, FinishReason, GenerationRequest, RequestId, RequestStatus, TokenLogprob, Usage,
};
use crate::sampling::Sampler;
use crate::speculative::{Proposer, SpeculativeConfig};
use crate::stop::StopMatcher;
use mlxcel_capacity::MaxNewTokens;

/// Scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (holding a slot).
    pub max_batch: usize,
    /// Most prompt tokens one sequence prefills in one step.
    pub prefill_chunk: usize,
    /// Most tokens (decode and prefill together) in one step; at least `max_batch`.
    pub token_budget: usize,
    /// Most requests waiting for a slot; more are refused with [`EngineError::QueueFull`].
    pub max_waiting: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch: 8,
            prefill_chunk: 512,
            token_budget: 512,
            max_waiting: 64,
        }
    }
}

impl SchedulerConfig {
    /// Checks that the limits can make progress.
    pub fn validate(&self) -> Result<(), EngineError> {
        let check = |field, value: usize, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(EngineError::InvalidConfig {
                    field,
                    value,
                    expected,
                })
            }
        };
        check(
            "max_batch",
            self.max_batch,
            self.max_batch >= 1,
            "at least 1",
        )?;
        check(
            "prefill_chunk",
            self.prefill_chunk,
            self.prefill_chunk >= 1,
            "at least 1",
        )?;
        check(
            "token_budget",
            self.token_budget,
            self.token_budget >= self.max_batch,
            "at least max_batch, so every running sequence decodes each step",
        )?;
        // A request waits for its first step even when a slot is free.
        check(
            "max_waiting",
            self.max_waiting,
            self.max_waiting >= 1,
            "at least 1",
        )
    }
}

/// One sequence in the scheduler.
struct Sequence {
    id: RequestId,
    status: RequestStatus,
    plan: SessionPlan,
    slot: Option<SlotId>,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose keys and values are in the slot.
    computed: usize,
    /// Prompt tokens copied rather than computed: what the prefix cache held at admission, or
    /// what a sequence admitted before it computed meanwhile (see `waits_for_sharer`).
    cached: usize,
    /// Whether it may start from a cached prefix ([`GenerationRequest::reuse_cached_prefix`]).
    reuse_cached_prefix: bool,
    sampler: Sampler,
    decoder: Box<dyn DecodeStream>,
    stops: StopMatcher,
    stop_token_ids: Vec<u32>,
    logprobs: Option<usize>,
    /// The structured-output constraint in progress, if any.
    constraint: Option<ConstrainedOutput>,
    /// Prompt-lookup speculation, when the request (or the engine) asks for it.
    speculative: Option<SpeculativeConfig>,
    /// The rate at which its proposals have been accepted (per position, an exponential
    /// average): what [`SpeculativeConfig::draft_length`] sizes the next pass by.
    acceptance: f32,
    /// Decode steps since it last verified proposals.
    quiet_steps: usize,
    /// Proposals verified for this sequence, and of them accepted.
    drafted: usize,
    accepted: usize,
    /// The draft model's view of this sequence (draft-model speculation only).
    draft: DraftState,
    cancel_requested: bool,
    /// `GenerationRequest::predict_time_limit`, and when the first token was generated.
    predict_time_limit: Option<std::time::Duration>,
    first_token_at: Option<std::time::Instant>,
}

impl Sequence {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated(),
            cached_tokens: self.cached,
            drafted_tokens: self.drafted,
            accepted_tokens: self.accepted,
        }
    }
}

/// A sequence's slot in the draft model and what that slot holds: `computed` positions, the
/// sequence's tokens up to `base` and then `fed` (the proposals fed back to the draft, which the
/// sequence may or may not have accepted; reconciled lazily before the next proposal).
#[derive(Debug, Default)]
struct DraftState {
    slot: Option<SlotId>,
    computed: usize,
    base: usize,
    fed: Vec<u32>,
    /// The draft cannot serve this sequence (no room for it, or it failed): plain decoding.
    off: bool,
}

/// The prefix cache's counters, and what it holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCacheStats {
    /// Admitted requests whose prompt was looked up, and those that reused a prefix.
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens looked up (their ratio to `reused_tokens`: the token hit rate).
    pub queried_tokens: u64,
    /// Of the hits, those served by taking over a kept slot whole (the prompt started with
    /// everything it held): no copy, and the entry leaves the cache for the new sequence, so a
    /// chat's turns keep one slot, not one entry per turn.
    pub takeovers: u64,
    /// Entries evicted to make room (least recently used first).
    pub evictions: u64,
    /// Entries kept now, the bytes they hold, and the budget.
    pub entries: usize,
    pub bytes: usize,
    pub budget: usize,
}

/// Counters a caller can read cheaply after each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedulerStats {
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Steps run so far.
    pub steps: u64,
    /// Prompt tokens prefilled so far.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// Speculative decoding: tokens proposed, and of those accepted, so far.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// Sequences the draft model could not serve (no room in its window or memory, or it
    /// failed), which decoded without it.
    pub draft_fallbacks: u64,
    /// Prompt tokens not computed because a cached prefix held them (the prefix cache).
    pub reused_tokens: u64,
    /// The sum over steps of the sequences each step ran.
    pub busy_slot_steps: u64,
    /// Speculative verification passes that carried proposals.
    pub drafts: u64,
    /// Structured output: token masks applied, and the time steps spent on them after the
    /// forward pass, before sampling (waiting for what is left of a mask computed ahead, and
    /// applying it): what constraints add to a step.
    pub constraint_masks: u64,
    pub constraint_mask_time: std::time::Duration,
    /// The prefix cache's counters and contents.
    pub prefix: PrefixCacheStats,
}

/// The continuous batcher over one backend.
pub struct Scheduler<B: Backend> {
    backend: B,
    decoder: Arc<dyn TextDecoder>,
    config: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_id: RequestId,
    stats: SchedulerStats,
    /// Compiles structured-output constraints for the model's vocabulary (built on the first
    /// constrained request); `None` without a tokenizer (then such requests are refused).
    constraints: Option<Arc<ConstraintSource>>,
    /// The prefix cache: finished sequences' slots kept with the tokens their positions hold,
    /// least recently used first out, within `prefix_budget` bytes of KV memory.
    retained: Vec<Retained>,
    /// Kept entries a later request took over whole: (the entry's id, the taker's id, the
    /// positions the entry held). The entry stays readable under its id
    /// ([`Scheduler::export_cached`]) while the taker, or an entry or taker after it, still
    /// holds those positions.
    taken: Vec<(RequestId, RequestId, usize)>,
    prefix_budget: usize,
    clock: u64,
    /// The draft model of draft-model speculation ([`Scheduler::with_draft`]).
    draft: Option<Box<dyn Backend>>,
    /// What a verified position costs here, measured from the steps as they run.
    pass_costs: crate::speculative::PassCosts,
}

/// What the prefix cache holds for one entry: its tokens and, for each position, the keys and
/// values of every layer in the backend's own layout (what a saved slot file stores; only the
/// backend and model that exported it can read it back).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedPrefix {
    pub tokens: Vec<u32>,
    pub kv: Vec<f32>,
}

/// Where an entry's positions are held: a kept entry, or a running sequence that took it over
/// (indices into `retained` and `running`).
enum Holder {
    Retained(usize),
    Running(usize),
}

/// A finished sequence's slot kept for its prefix.
struct Retained {
    /// Its handle ([`Scheduler::export_cached`]): the finished request's id, or the id
    /// [`Scheduler::restore_cached`] gave it (drawn from the request ids).
    id: RequestId,
    slot: SlotId,
    tokens: Vec<u32>,
    bytes: usize,
    last_used: u64,
    /// The static capacity its slot is a row of (`None`: a dynamic shape).
    capacity: Option<usize>,
}

/// Take-overs remembered (so that an entry taken over stays readable under its id): the oldest
/// are forgotten past this many.
const MAX_TAKEN: usize = 256;

/// Prefixes shorter than this are recomputed: copying them would save less than it costs.
const MIN_REUSED_PREFIX: usize = 8;

/// The vocabulary that constraints compile against, and the compiler once built.
pub(crate) struct ConstraintSource {
    tokenizer: Arc<mlxcel_model::Tokenizer>,
    eos: u32,
    vocab_size: usize,
    built: std::sync::OnceLock<Result<Constraints, String>>,
}

impl ConstraintSource {
    pub(crate) fn new(
        tokenizer: Arc<mlxcel_model::Tokenizer>,
        eos: u32,
        vocab_size: usize,
    ) -> Self {
        Self {
            tokenizer,
            eos,
            vocab_size,
            built: std::sync::OnceLock::new(),
        }
    }

    fn get(&self) -> Result<&Constraints, EngineError> {
        self.built
            .get_or_init(|| {
                Constraints::new(self.tokenizer.clone(), self.eos, self.vocab_size)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|message| EngineError::InvalidConstraint {
                kind: "vocabulary",
                message: message.clone(),
            })
    }
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
            retained: Vec::new(),
            taken: Vec::new(),
            prefix_budget: 0,
            clock: 0,
            draft: None,
            pass_costs: crate::speculative::PassCosts::default(),
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
        self.draft = Some(draft);
        Ok(self)
    }

    /// Keeps finished sequences' caches, up to `bytes` of KV memory, for requests that start with
    /// the same tokens (on backends that can copy a prefix between slots; 0: off).
    pub fn with_prefix_cache(mut self, bytes: usize) -> Self {
        self.prefix_budget = if self.backend.can_copy_prefix() {
            bytes
        } else {
            0
        };
        self
    }

    /// Releases the least recently used retained slot; `false` when none is left.
    fn evict_one(&mut self) -> bool {
        self.evict_one_but(None)
    }

    /// [`Scheduler::evict_one`], sparing the entry of slot `spare`.
    fn evict_one_but(&mut self, spare: Option<SlotId>) -> bool {
        self.evict_for(None, spare)
    }

    /// Releases the least recently used retained slot to make room for a slot of `plan`: on a
    /// static-shape backend, where a slot is a row of its capacity, one of the plan's capacity
    /// if any is kept (evicting another capacity's row would free no row of this one); sparing
    /// the entry of slot `spare`. `false` when none is left.
    fn evict_for(&mut self, plan: Option<&SessionPlan>, spare: Option<SlotId>) -> bool {
        let capacity = plan.and_then(|p| p.context_capacity);
        let same_capacity = capacity.is_some()
            && self
                .retained
                .iter()
                .any(|r| r.capacity == capacity && Some(r.slot) != spare);
        let Some(oldest) = self
            .retained
            .iter()
            .enumerate()
            .filter(|(_, r)| Some(r.slot) != spare)
            .filter(|(_, r)| !same_capacity || r.capacity == capacity)
            .min_by_key(|(_, r)| r.last_used)
            .map(|(i, _)| i)
        else {
            return false;
        };
        let entry = self.retained.remove(oldest);
        self.backend.release_slot(entry.slot);
        self.stats.prefix.evictions += 1;
        self.prune_taken();
        true
    }

    /// What the prefix cache holds for `id` (a finished request's id, or a restored entry's):
    /// its tokens and their keys and values ([`Backend::export_kv`]'s layout); `None` when the
    /// request's slot was not kept (the cache off, or too short a sequence) or has been evicted.
    /// An entry taken over by a later request reads from what holds its positions now.
    pub fn export_cached(&mut self, id: RequestId) -> Result<Option<CachedPrefix>, EngineError> {
        let Some((holder, len)) = self.holder_of(id) else {
            return Ok(None);
        };
        let (slot, tokens) = match holder {
            Holder::Retained(index) => {
                self.clock += 1;
                let entry = &mut self.retained[index];
                entry.last_used = self.clock;
                (entry.slot, entry.tokens[..len].to_vec())
            }
            Holder::Running(index) => {
                let sequence = &self.running[index];
                let Some(slot) = sequence.slot else {
                    return Ok(None);
                };
                (slot, sequence.tokens[..len].to_vec())
            }
        };
        let kv = self.backend.export_kv(slot, tokens.len())?;
        Ok(Some(CachedPrefix { tokens, kv }))
    }

    /// Where `id`'s entry is held now, following take-overs, and how many of the holder's
    /// positions are the entry's.
    fn holder_of(&self, mut id: RequestId) -> Option<(Holder, usize)> {
        let mut len = usize::MAX;
        // Each take-over's taker came later than its entry, so the chain ends (and take-overs
        // are redirected to the latest taker, so it is one link long).
        loop {
            if let Some(index) = self.retained.iter().position(|r| r.id == id) {
                return Some((
                    Holder::Retained(index),
                    len.min(self.retained[index].tokens.len()),
                ));
            }
            if let Some((_, taker, held)) = self.taken.iter().find(|(entry, ..)| *entry == id) {
                len = len.min(*held);
                if let Some(index) = self.running.iter().position(|s| s.id == *taker)
                    && self.running[index].slot.is_some()
                {
                    return Some((
                        Holder::Running(index),
                        len.min(self.running[index].computed),
                    ));
                }
                id = *taker;
                continue;
            }
            return None;
        }
    }

    /// Forgets take-overs whose positions nothing holds any longer.
    fn prune_taken(&mut self) {
        let dead: Vec<RequestId> = self
            .taken
            .iter()
            .map(|(entry, ..)| *entry)
            .filter(|&entry| self.holder_of(entry).is_none())
            .collect();
        self.taken.retain(|(entry, ..)| !dead.contains(entry));
    }

    /// Puts `tokens` with their keys and values (what [`Scheduler::export_cached`] returned, on
    /// this model) into the prefix cache, evicting least recently used entries to make room;
    /// returns the entry's id. Refused when the prefix cache is off or smaller than the entry.
    pub fn restore_cached(
        &mut self,
        tokens: Vec<u32>,
        kv: &[f32],
    ) -> Result<RequestId, EngineError> {
        let refuse = |reason: String| Err(EngineError::PrefixCache(reason));
        if !self.backend.can_copy_prefix() {
            return refuse(format!(
                "the {} backend keeps no prefix cache, so a restored slot has nowhere to stay",
                self.backend.name()
            ));
        }
        if self.prefix_budget == 0 {
            return refuse(
                "the prefix cache is off, so a restored slot has nowhere to stay (turn it on: \
                 --cache-ram MiB)"
                    .into(),
            );
        }
        if tokens.is_empty() {
            return refuse("nothing to restore: the saved slot holds no tokens".into());
        }
        // A slot of exactly its positions: it is only ever read (copied from) or taken over,
        // never extended as it is. Static shapes give it the smallest capacity that holds it.
        let context_capacity = match self.backend.shape_policy() {
            ShapePolicy::Dynamic => None,
            ShapePolicy::Static { buckets } => Some(
                buckets
                    .iter()
                    .map(|b| b.context_capacity)
                    .filter(|&c| c >= tokens.len())
                    .min()
                    .ok_or_else(|| {
                        EngineError::PrefixCache(format!(
                            "{} tokens are more than the largest context capacity of the {} \
                             backend",
                            tokens.len(),
                            self.backend.name()
                        ))
                    })?,
            ),
        };
        let plan = SessionPlan {
            context_capacity,
            max_positions: context_capacity.unwrap_or(tokens.len()),
            admitted_max_new_tokens: 0,
        };
        let bytes = self.backend.kv_bytes(plan.max_positions);
        if bytes > self.prefix_budget {
            return refuse(format!(
                "{} tokens need {:.1} MiB of KV memory, more than the prefix cache's {:.1} MiB \
                 (raise --cache-ram)",
                tokens.len(),
                bytes as f64 / (1 << 20) as f64,
                self.prefix_budget as f64 / (1 << 20) as f64
            ));
        }
        while self.retained.iter().map(|r| r.bytes).sum::<usize>() + bytes > self.prefix_budget
            && self.evict_one()
        {}
        let slot = loop {
            match self.backend.allocate_slot(&plan) {
                Ok(slot) => break slot,
                Err(EngineError::NoFreeSlot) if self.evict_for(Some(&plan), None) => {}
                Err(e) => return Err(e),
            }
        };
        if let Err(e) = self.backend.import_kv(slot, tokens.len(), kv) {
            self.backend.release_slot(slot);
            return Err(e);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.clock += 1;
        self.retained.push(Retained {
            id,
            slot,
            tokens,
            bytes,
            last_used: self.clock,
            capacity: plan.context_capacity,
        });
        Ok(id)
    }

    /// Drops `id`'s entry from the prefix cache; returns the tokens it held (0: none was kept).
    /// An entry taken over by a later request is forgotten under its id (the taker keeps the
    /// positions).
    pub fn erase_cached(&mut self, id: RequestId) -> usize {
        if let Some(index) = self.taken.iter().position(|(entry, ..)| *entry == id) {
            let held = self.holder_of(id).map_or(0, |(_, len)| len);
            self.taken.remove(index);
            return held;
        }
        let Some(index) = self.retained.iter().position(|r| r.id == id) else {
            return 0;
        };
        let entry = self.retained.remove(index);
        self.backend.release_slot(entry.slot);
        self.prune_taken();
        entry.tokens.len()
    }

    /// The longest cached prefix of `prompt` (at most `prompt.len() - 1` tokens: one is always
    /// computed for its logits), among retained slots and running sequences: (slot, length).
    fn longest_prefix(&self, prompt: &[u32]) -> Option<(SlotId, usize, Option<usize>)> {
        let common = |tokens: &[u32]| {
            tokens
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.len().saturating_sub(1))
        };
        let retained = self
            .retained
            .iter()
            .enumerate()
            .map(|(i, r)| (r.slot, common(&r.tokens), Some(i)));
        let running = self.running.iter().filter_map(|s| {
            let slot = s.slot?;
            Some((slot, common(&s.tokens[..s.computed]), None))
        });
        retained
            .chain(running)
            .filter(|&(_, len, _)| len >= MIN_REUSED_PREFIX)
            .max_by_key(|&(_, len, _)| len)
    }

    /// The kept entry a prompt can take over whole: the longest whose every token the prompt
    /// starts with (leaving at least one prompt token to compute), if no other source (a kept
    /// slot or a running sequence) holds a longer prefix of it. Its index in `retained`.
    fn takeover(&self, prompt: &[u32]) -> Option<usize> {
        let (i, len) = self
            .retained
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.tokens.len() >= MIN_REUSED_PREFIX
                    && r.tokens.len() < prompt.len()
                    && prompt.starts_with(&r.tokens)
            })
            .map(|(i, r)| (i, r.tokens.len()))
            .max_by_key(|&(_, len)| len)?;
        let best = self.longest_prefix(prompt).map_or(0, |(_, best, _)| best);
        (len >= best).then_some(i)
    }

    /// Whether running sequence `index`, prefilling, should wait for one admitted before it that
    /// is computing a prefix of its prompt (at least [`MIN_REUSED_PREFIX`] positions past its
    /// own), to copy that prefix once computed rather than compute it too: requests that arrive
    /// together with a shared system prompt compute it once. The first such sequence never
    /// waits, so every wait ends.
    fn waits_for_sharer(&self, index: usize) -> bool {
        let sequence = &self.running[index];
        let prompt = &sequence.tokens[..sequence.prompt_len];
        self.running[..index].iter().any(|earlier| {
            let shared = earlier.tokens[..earlier.prompt_len]
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.len() - 1);
            earlier.slot.is_some()
                && earlier.computed < shared
                && shared >= sequence.computed + MIN_REUSED_PREFIX
        })
    }

    /// Copies into running sequence `index`'s slot the longest prefix of its prompt that a kept
    /// slot or another running sequence has computed since it was admitted, when that is at
    /// least [`MIN_REUSED_PREFIX`] positions past its own.
    fn copy_computed_prefix(&mut self, index: usize) {
        let sequence = &self.running[index];
        let (Some(slot), computed) = (sequence.slot, sequence.computed) else {
            return;
        };
        let Some((source, len, retained)) =
            self.longest_prefix(&sequence.tokens[..sequence.prompt_len])
        else {
            return;
        };
        if source == slot || len < computed + MIN_REUSED_PREFIX {
            return;
        }
        if self.backend.copy_prefix(source, slot, len).is_err() {
            // Whatever the slot holds now, the prompt is computed again from its start.
            let sequence = &mut self.running[index];
            if self.backend.truncate(slot, 0).is_ok() {
                sequence.computed = 0;
                self.stats.reused_tokens -= sequence.cached as u64;
                sequence.cached = 0;
            }
            return;
        }
        let sequence = &mut self.running[index];
        if sequence.cached == 0 {
            self.stats.prefix.hits += 1;
        }
        sequence.cached += len - computed;
        sequence.computed = len;
        self.stats.reused_tokens += (len - computed) as u64;
        self.clock += 1;
        if let Some(i) = retained {
            self.retained[i].last_used = self.clock;
        }
    }

    /// Lets requests carry structured-output constraints, compiled against this vocabulary.
    pub(crate) fn with_constraints(mut self, source: Arc<ConstraintSource>) -> Self {
        self.constraints = Some(source);
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
            prefix: PrefixCacheStats {
                entries: self.retained.len(),
                bytes: self.retained.iter().map(|r| r.bytes).sum(),
                budget: self.prefix_budget,
                ..self.stats.prefix
            },
            ..self.stats
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
        let sampler = Sampler::new(request.sampling)?;
        if let Some(speculative) = &request.speculative {
            speculative.validate()?;
            if !self.backend.can_score() {
                return Err(EngineError::InvalidSpeculation(
                    crate::speculative::NEEDS_SCORING.into(),
                ));
            }
            if speculative.proposer == Proposer::DraftModel && self.draft.is_none() {
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
                Some(source.get()?.matcher(c)?)
            }
        };
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
            reuse_cached_prefix: request.reuse_cached_prefix,
            sampler,
            stops: StopMatcher::new(request.stop),
            stop_token_ids: request.stop_token_ids,
            logprobs: request.logprobs,
            constraint,
            speculative: request.speculative,
            acceptance: crate::speculative::PRIOR_ACCEPTANCE,
            quiet_steps: 0,
            drafted: 0,
            accepted: 0,
            draft: DraftState::default(),
            cancel_requested: false,
            predict_time_limit: request.predict_time_limit,
            first_token_at: None,
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
        let mut drafted: Vec<Option<Vec<u32>>> = vec![None; self.running.len()];
        if can_score && self.draft.is_some() {
            for (index, proposals) in drafted.iter_mut().enumerate() {
                let sequence = &self.running[index];
                if sequence.speculative.map(|c| c.proposer) == Some(Proposer::DraftModel)
                    && sequence.computed >= sequence.prompt_len
                    && sequence.tokens.len() - sequence.computed == 1
                {
                    let limit = speculation_limit(sequence, &self.pass_costs);
                    *proposals = Some(self.draft_propose(index, limit));
                }
            }
        }
        for (index, sequence) in self.running.iter().enumerate() {
            let pending = sequence.tokens.len() - sequence.computed;
            if sequence.computed >= sequence.prompt_len && pending == 1 && budget > 0 {
                if let Some(config) = sequence.speculative.filter(|_| can_score) {
                    // Proposals beyond the step's token budget wait for a later pass.
                    let room = budget - 1;
                    let limit = speculation_limit(sequence, &self.pass_costs).min(room);
                    if limit == 0 {
                        // Not worth a pass now (or no room): back towards trying again.
                        drifting.push(index);
                    }
                    let mut proposals = match config.proposer {
                        Proposer::Ngram => config.propose(&sequence.tokens, limit),
                        Proposer::DraftModel => drafted[index].take().unwrap_or_default(),
                    };
                    proposals.truncate(room);
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
            let sequence = &mut self.running[index];
            sequence.acceptance = crate::speculative::drifted_acceptance(sequence.acceptance);
            sequence.quiet_steps += 1;
        }
        for index in 0..self.running.len() {
            let sequence = &self.running[index];
            if sequence.computed < sequence.prompt_len && budget > 0 {
                if self.prefix_budget > 0 && sequence.reuse_cached_prefix {
                    if self.waits_for_sharer(index) {
                        continue;
                    }
                    self.copy_computed_prefix(index);
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
            self.pass_costs.observe(
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
                let masked = self.mask_constrained(&scheduled, &mut logits);
                let computed = masked.iter().filter(|m| m.is_some()).count() as u64;
                if computed > 0 {
                    self.stats.constraint_masks += computed;
                    self.stats.constraint_mask_time += masking.elapsed();
                }
                for ((&(index, count), logits), masked) in scheduled.iter().zip(logits).zip(masked)
                {
                    self.advance(index, count, logits, masked, &mut events);
                }
                for ((index, proposals), rows) in speculations.into_iter().zip(rows) {
                    self.accept(index, &proposals, rows, &mut events);
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
            let look_up = self.prefix_budget > 0 && head.reuse_cached_prefix;
            if look_up && let Some(i) = self.takeover(&head.tokens[..head.prompt_len]) {
                let (slot, len) = (self.retained[i].slot, self.retained[i].tokens.len());
                let adopted = self.backend.adopt_slot(slot, &head.plan, len);
                match adopted {
                    Ok(()) => {
                        let entry = self.retained.remove(i);
                        let mut sequence = self.waiting.pop_front().expect("head exists");
                        // Earlier take-overs of this entry now point at its taker (chains stay
                        // one link long), and the oldest are forgotten past a bound.
                        for (_, taker, _) in &mut self.taken {
                            if *taker == entry.id {
                                *taker = sequence.id;
                            }
                        }
                        self.taken.push((entry.id, sequence.id, len));
                        if self.taken.len() > MAX_TAKEN {
                            self.taken.remove(0);
                        }
                        sequence.slot = Some(slot);
                        sequence.status = RequestStatus::Running;
                        sequence.computed = len;
                        sequence.cached = len;
                        self.stats.prefix.lookups += 1;
                        self.stats.prefix.queried_tokens += sequence.prompt_len as u64;
                        self.stats.prefix.hits += 1;
                        self.stats.prefix.takeovers += 1;
                        self.stats.reused_tokens += len as u64;
                        self.running.push(sequence);
                        continue;
                    }
                    // Room for the plan: other entries give way first.
                    Err(EngineError::NoFreeSlot) if self.evict_one_but(Some(slot)) => continue,
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
                    sequence.slot = Some(slot);
                    sequence.status = RequestStatus::Running;
                    if look_up {
                        self.stats.prefix.lookups += 1;
                        self.stats.prefix.queried_tokens += sequence.prompt_len as u64;
                    }
                    if look_up
                        && let Some((source, len, retained)) =
                            self.longest_prefix(&sequence.tokens[..sequence.prompt_len])
                        && self.backend.copy_prefix(source, slot, len).is_ok()
                    {
                        sequence.computed = len;
                        sequence.cached = len;
                        self.stats.reused_tokens += len as u64;
                        self.stats.prefix.hits += 1;
                        self.clock += 1;
                        if let Some(i) = retained {
                            self.retained[i].last_used = self.clock;
                        }
                    }
                    self.running.push(sequence);
                }
                // Memory held by the prefix cache gives way to new requests.
                Err(_) if self.evict_for(Some(&plan), None) => continue,
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

    /// Applies the structured-output masks of the step's constrained sequences that sample now,
    /// on several threads when there are several (the forward pass is over: the cores are
    /// free). Per scheduled entry: `None` when unconstrained or not sampling yet, else the
    /// outcome.
    fn mask_constrained(
        &mut self,
        scheduled: &[(usize, usize)],
        logits: &mut [Vec<f32>],
    ) -> Vec<Option<Result<(), String>>> {
        let mut outcomes: Vec<Option<Result<(), String>>> = vec![None; scheduled.len()];
        let mut rows: Vec<Option<&mut Vec<f32>>> = logits.iter_mut().map(Some).collect();
        let mut jobs = Vec::new();
        for (position, sequence) in self.running.iter_mut().enumerate() {
            let Some(k) = scheduled.iter().position(|&(index, _)| index == position) else {
                continue;
            };
            let samples = sequence.computed + scheduled[k].1 >= sequence.tokens.len();
            let Sequence {
                constraint,
                stop_token_ids,
                ..
            } = sequence;
            if let (true, Some(constraint)) = (samples, constraint.as_mut())
                && let Some(row) = rows[k].take()
            {
                jobs.push((k, constraint, stop_token_ids.as_slice(), row));
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if jobs.len() <= 1 || threads <= 1 {
            for (k, constraint, stops, row) in jobs {
                outcomes[k] = Some(constraint.mask(row, stops));
            }
            return outcomes;
        }
        let per_thread = jobs.len().div_ceil(threads);
        let results: Vec<(usize, Result<(), String>)> = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            while !jobs.is_empty() {
                let take = per_thread.min(jobs.len());
                let chunk: Vec<_> = jobs.drain(..take).collect();
                handles.push(scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(k, constraint, stops, row)| (k, constraint.mask(row, stops)))
                        .collect::<Vec<_>>()
                }));
            }
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a mask thread does not panic"))
                .collect()
        });
        for (k, outcome) in results {
            outcomes[k] = Some(outcome);
        }
        outcomes
    }

    /// Records a step's result for one sequence: the chunk is now cached, and if it was the last
    /// pending input, the next token is sampled (from `logits` already masked by its constraint:
    /// `masked` is that outcome).
    fn advance(
        &mut self,
        index: usize,
        count: usize,
        mut logits: Vec<f32>,
        masked: Option<Result<(), String>>,
        events: &mut Vec<(RequestId, Event)>,
    ) {
        let sequence = &mut self.running[index];
        let was_prefill = sequence.computed < sequence.prompt_len;
        sequence.computed += count;
        if was_prefill {
            self.stats.prompt_tokens += count as u64;
        }
        if sequence.computed < sequence.tokens.len() {
            return;
        }
        let (logprob, top_logprobs) = match sequence.logprobs {
            Some(k) => log_probabilities(&logits, k),
            None => (Vec::new(), Vec::new()),
        };
        if let Some(Err(message)) = masked {
            end_with_error(sequence, format!("structured output: {message}"), events);
            return;
        }
        let token = sequence.sampler.sample(&mut logits, &sequence.tokens);
        emit(
            sequence,
            &mut self.stats,
            token,
            (logprob, top_logprobs),
            events,
        );
    }

    /// The draft model's proposals for the decoding sequence at `index`, at most `limit`: its
    /// slot is reconciled with the sequence (positions past the first proposal the sequence did
    /// not take are dropped), fed the tokens it has not seen, then asked for its most likely
    /// token, fed it, and asked again, until `limit` tokens or one less likely than `p_min`. Empty
    /// when fewer than `draft_min` come, or the draft cannot serve the sequence (which then
    /// decodes without it).
    fn draft_propose(&mut self, index: usize, limit: usize) -> Vec<u32> {
        let prefill_chunk = self.config.prefill_chunk;
        let Some(draft) = self.draft.as_mut() else {
            return Vec::new();
        };
        let sequence = &mut self.running[index];
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
                        max_new_tokens: MaxNewTokens::Limited(
                            sequence.plan.admitted_max_new_tokens,
                        ),
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
                self.stats.draft_fallbacks += 1;
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
    /// order (a proposal accepted by [`Sampler::verify`]'s rule) until one differs from its
    /// proposal or the sequence ends; the cache keeps only the positions whose inputs were right.
    fn accept(
        &mut self,
        index: usize,
        proposals: &[u32],
        rows: Vec<Vec<f32>>,
        events: &mut Vec<(RequestId, Event)>,
    ) {
        let sequence = &mut self.running[index];
        let slot = sequence.slot.expect("running sequences hold a slot");
        // The pending token's position is now cached.
        sequence.computed += 1;
        self.stats.drafts += 1;
        self.stats.drafted_tokens += proposals.len() as u64;
        let mut accepted_here = 0;
        for (i, mut logits) in rows.into_iter().enumerate() {
            let sequence = &mut self.running[index];
            let logprobs = match sequence.logprobs {
                Some(k) => log_probabilities(&logits, k),
                None => (Vec::new(), Vec::new()),
            };
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
                return;
            }
            let (token, accepted) = match proposals.get(i) {
                Some(&proposed) => sequence
                    .sampler
                    .verify(&mut logits, &sequence.tokens, proposed),
                None => (
                    sequence.sampler.sample(&mut logits, &sequence.tokens),
                    false,
                ),
            };
            let finished = emit(sequence, &mut self.stats, token, logprobs, events);
            if finished || !accepted {
                break;
            }
            // The proposal was right: its position (the next input) is valid too.
            sequence.computed += 1;
            self.stats.accepted_tokens += 1;
            accepted_here += 1;
        }
        let sequence = &mut self.running[index];
        sequence.quiet_steps = 0;
        sequence.drafted += proposals.len();
        sequence.accepted += accepted_here;
        sequence.acceptance = crate::speculative::updated_acceptance(
            sequence.acceptance,
            proposals.len(),
            accepted_here,
        );
        let sequence = &self.running[index];
        if !sequence.status.is_finished()
            && let Err(err) = self.backend.truncate(slot, sequence.computed)
        {
            end_with_error(&mut self.running[index], err.to_string(), events);
        }
    }
}

/// Ends `sequence` with an error event carrying `message`.
fn end_with_error(sequence: &mut Sequence, message: String, events: &mut Vec<(RequestId, Event)>) {
    sequence.status = RequestStatus::FinishedError;
    events.push((
        sequence.id,
        finished_event(sequence, String::new(), Some(message)),
    ));
}

/// How many proposals `sequence` may verify in its next pass: room for them and the token after
/// them within its budget and its shape, and its adaptive draft length.
fn speculation_limit(sequence: &Sequence, costs: &crate::speculative::PassCosts) -> usize {
    let budget_left = sequence
        .plan
        .admitted_max_new_tokens
        .saturating_sub(sequence.generated() + 1);
    let room = sequence
        .plan
        .max_positions
        .saturating_sub(sequence.tokens.len() + 1);
    let limit = budget_left.min(room);
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

/// Records a sampled `token` for `sequence`: its text through the stop matcher, the end
/// conditions (stop token, stop string, constraint complete, budget, shape), and its event.
/// Returns whether the sequence finished (with an error too).
fn emit(
    sequence: &mut Sequence,
    stats: &mut SchedulerStats,
    token: u32,
    (logprob, top_logprobs): (Vec<f32>, Vec<TokenLogprob>),
    events: &mut Vec<(RequestId, Event)>,
) -> bool {
    {
        sequence.tokens.push(token);
        stats.generated_tokens += 1;
        let first_token_at = *sequence
            .first_token_at
            .get_or_insert_with(std::time::Instant::now);

        let mut text = String::new();
        let is_stop_token = sequence.stop_token_ids.contains(&token);
        // A constraint that can take nothing more ends the output, as an EOS would.
        let mut complete = false;
        if !is_stop_token && let Some(constraint) = &mut sequence.constraint {
            match constraint.accept(token) {
                Ok(done) => complete = done,
                Err(message) => {
                    end_with_error(sequence, format!("structured output: {message}"), events);
                    return true;
                }
            }
        }
        if is_stop_token {
            sequence.status = RequestStatus::FinishedStopped;
        } else {
            let piece = sequence.decoder.push(token);
            let scan = sequence.stops.push(&piece);
            text = scan.text;
            // llama-server's t_max_predict_ms: past the limit, the next newline ends the output.
            let out_of_time = sequence
                .predict_time_limit
                .is_some_and(|limit| piece.contains('\n') && first_token_at.elapsed() > limit);
            if scan.stopped || complete {
                sequence.status = RequestStatus::FinishedStopped;
            } else if sequence.generated() >= sequence.plan.admitted_max_new_tokens
                || sequence.tokens.len() > sequence.plan.max_positions
                || out_of_time
            {
                sequence.status = RequestStatus::FinishedLength;
            }
        }
        let logprob = sequence.logprobs.map(|_| TokenLogprob {
            token,
            logprob: logprob
                .get(token as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
        });
        events.push((
            sequence.id,
            Event::Token {
                token,
                text,
                logprob,
                top_logprobs,
            },
        ));
        sequence.status.is_finished()
    }
}

impl<B: Backend> Scheduler<B> {
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
            if let (Some(draft), Some(slot)) = (self.draft.as_mut(), sequence.draft.slot.take()) {
                draft.release_slot(slot);
            }
            if let Some(slot) = sequence.slot.take() {
                let keep = self.prefix_budget > 0
                    && sequence.computed >= MIN_REUSED_PREFIX
                    && matches!(
                        sequence.status,
                        RequestStatus::FinishedStopped | RequestStatus::FinishedLength
                    );
                if keep {
                    self.clock += 1;
                    // What the kept slot holds in memory: its whole allocation (whole blocks,
                    // or its plan's positions where the backend allocates a slot for them up
                    // front), so that the budget bounds the memory and not only the useful part
                    // of it.
                    let bytes = self.backend.keep_slot(
                        slot,
                        sequence.computed,
                        sequence.plan.max_positions.max(sequence.computed),
                    );
                    self.retained.push(Retained {
                        id: sequence.id,
                        slot,
                        tokens: sequence.tokens[..sequence.computed].to_vec(),
                        bytes,
                        last_used: self.clock,
                        capacity: sequence.plan.context_capacity,
                    });
                    while self.retained.iter().map(|r| r.bytes).sum::<usize>() > self.prefix_budget
                        && self.evict_one()
                    {}
                } else {
                    self.backend.release_slot(slot);
                }
            }
            let already_reported = sequence.status == RequestStatus::FinishedError;
            if !already_reported {
                let text = match sequence.status {
                    // A completed stop string withholds everything after it.
                    RequestStatus::FinishedStopped if sequence.stops.is_stopped() => String::new(),
                    RequestStatus::FinishedCancelled => String::new(),
                    _ => {
                        let tail = sequence.decoder.flush();
                        let mut text = sequence.stops.push(&tail).text;
                        text.push_str(&sequence.stops.finish());
                        text
                    }
                };
                events.push((sequence.id, finished_event(&sequence, text, None)));
            }
        }
        self.prune_taken();
    }
}

fn finished_event(sequence: &Sequence, text: String, error: Option<String>) -> Event {
    Event::Finished {
        reason: sequence
            .status
            .finish_reason()
            .unwrap_or(FinishReason::Error),
        text,
        usage: sequence.usage(),
        error,
    }
}

/// Log-softmax of `logits` and its `k` most likely entries, most likely first.
fn log_probabilities(logits: &[f32], k: usize) -> (Vec<f32>, Vec<TokenLogprob>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_sum = max + sum.ln() as f32;
    let logprobs: Vec<f32> = logits.iter().map(|&l| l - log_sum).collect();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(order.len());
    if k > 0 {
        let desc = |a: &u32, b: &u32| {
            logprobs[*b as usize]
                .total_cmp(&logprobs[*a as usize])
                .then(a.cmp(b))
        };
        order.select_nth_unstable_by(k - 1, desc);
        order.truncate(k);
        order.sort_unstable_by(desc);
    } else {
        order.clear();
    }
    let top = order
        .into_iter()
        .map(|token| TokenLogprob {
            token,
            logprob: logprobs[token as usize],
        })
        .collect();
    (logprobs, top)
}
