//! The prefix cache: finished sequences' slots kept with the tokens their positions hold, for
//! later requests that start with the same tokens (least recently used out first, within a
//! budget of KV memory), and the sharing of a prompt's prefix between sequences running
//! together. The scheduler hands it the backend and the running sequences for each call; it
//! keeps its own entries and counters.

use crate::backend::{Backend, SessionPlan, ShapePolicy, SlotId};
use crate::error::EngineError;
use crate::request::{RequestId, RequestStatus};

use super::sequence::Sequence;

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

/// What the prefix cache holds for one entry: its tokens and, for each position, the keys and
/// values of every layer in the backend's own layout, and a hybrid model's recurrent state
/// after them (what a saved slot file stores; only the backend and model that exported it can
/// read it back).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedPrefix {
    pub tokens: Vec<u32>,
    pub kv: Vec<f32>,
    /// The recurrent state after the tokens ([`Backend::export_state`]'s layout); empty for a
    /// model without one.
    pub state: Vec<f32>,
}

/// Where an entry's positions are held: a kept entry, or a running sequence that took it over
/// (indices into `retained` and `running`).
enum Holder {
    Retained(usize),
    Running(usize),
}

/// A finished sequence's slot kept for its prefix.
struct Retained {
    /// Its handle ([`crate::Scheduler::export_cached`]): the finished request's id, or the id
    /// [`crate::Scheduler::restore_cached`] gave it (drawn from the request ids).
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

/// Finished sequences' slots kept for their prefixes, and what became of the entries later
/// requests took over.
#[derive(Default)]
pub(super) struct PrefixCache {
    /// The kept slots with the tokens their positions hold, least recently used first out,
    /// within `budget` bytes of KV memory.
    retained: Vec<Retained>,
    /// Kept entries a later request took over whole: (the entry's id, the taker's id, the
    /// positions the entry held). The entry stays readable under its id
    /// ([`crate::Scheduler::export_cached`]) while the taker, or an entry or taker after it,
    /// still holds those positions.
    taken: Vec<(RequestId, RequestId, usize)>,
    /// Bytes of KV memory the kept slots may hold (0: the cache is off).
    budget: usize,
    clock: u64,
    /// The counters (what it holds now is read from `retained` by [`PrefixCache::stats`]).
    counters: PrefixCacheStats,
    /// Prompt tokens not computed because a cached prefix held them.
    reused_tokens: u64,
}

impl PrefixCache {
    /// Lets the cache keep up to `budget` bytes of KV memory (0: off).
    pub(super) fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
    }

    /// Whether the cache keeps anything (its budget is not 0).
    pub(super) fn is_on(&self) -> bool {
        self.budget > 0
    }

    /// Its counters, and what it holds now.
    pub(super) fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.retained.len(),
            bytes: self.retained.iter().map(|r| r.bytes).sum(),
            budget: self.budget,
            ..self.counters
        }
    }

    /// Continues the counters of a cache this one replaces (`counters` its
    /// [`PrefixCache::stats`], `reused_tokens` its [`PrefixCache::reused_tokens`]); what it held
    /// now is not carried.
    pub(super) fn carry_counters(&mut self, counters: PrefixCacheStats, reused_tokens: u64) {
        self.counters = PrefixCacheStats {
            entries: 0,
            bytes: 0,
            budget: 0,
            ..counters
        };
        self.reused_tokens = reused_tokens;
    }

    /// Prompt tokens not computed because a cached prefix held them, so far.
    pub(super) fn reused_tokens(&self) -> u64 {
        self.reused_tokens
    }

    /// Releases the least recently used retained slot; `false` when none is left.
    fn evict_one<B: Backend + ?Sized>(&mut self, backend: &mut B, running: &[Sequence]) -> bool {
        self.evict_one_but(backend, running, None)
    }

    /// [`PrefixCache::evict_one`], sparing the entry of slot `spare`.
    pub(super) fn evict_one_but<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        spare: Option<SlotId>,
    ) -> bool {
        self.evict_for(backend, running, None, spare)
    }

    /// Releases the least recently used retained slot to make room for a slot of `plan`: on a
    /// static-shape backend, where a slot is a row of its capacity, one of the plan's capacity
    /// if any is kept (evicting another capacity's row would free no row of this one); sparing
    /// the entry of slot `spare`. `false` when none is left.
    pub(super) fn evict_for<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        plan: Option<&SessionPlan>,
        spare: Option<SlotId>,
    ) -> bool {
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
        backend.release_slot(entry.slot);
        self.counters.evictions += 1;
        self.prune_taken(running);
        true
    }

    /// What the cache holds for `id` (see [`crate::Scheduler::export_cached`]).
    pub(super) fn export<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        id: RequestId,
    ) -> Result<Option<CachedPrefix>, EngineError> {
        let Some((holder, len)) = self.holder_of(running, id) else {
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
                let sequence = &running[index];
                let Some(slot) = sequence.slot else {
                    return Ok(None);
                };
                (slot, sequence.tokens[..len].to_vec())
            }
        };
        let kv = backend.export_kv(slot, tokens.len())?;
        let state = backend.export_state(slot, tokens.len())?;
        Ok(Some(CachedPrefix { tokens, kv, state }))
    }

    /// Where `id`'s entry is held now, following take-overs, and how many of the holder's
    /// positions are the entry's.
    fn holder_of(&self, running: &[Sequence], mut id: RequestId) -> Option<(Holder, usize)> {
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
                if let Some(index) = running.iter().position(|s| s.id == *taker)
                    && running[index].slot.is_some()
                {
                    return Some((Holder::Running(index), len.min(running[index].computed)));
                }
                id = *taker;
                continue;
            }
            return None;
        }
    }

    /// Forgets take-overs whose positions nothing holds any longer.
    pub(super) fn prune_taken(&mut self, running: &[Sequence]) {
        let dead: Vec<RequestId> = self
            .taken
            .iter()
            .map(|(entry, ..)| *entry)
            .filter(|&entry| self.holder_of(running, entry).is_none())
            .collect();
        self.taken.retain(|(entry, ..)| !dead.contains(entry));
    }

    /// Puts `tokens` with their keys and values into the cache under the next request id (see
    /// [`crate::Scheduler::restore_cached`]).
    pub(super) fn restore<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        tokens: Vec<u32>,
        (kv, state): (&[f32], &[f32]),
        next_id: &mut RequestId,
    ) -> Result<RequestId, EngineError> {
        let refuse = |reason: String| Err(EngineError::PrefixCache(reason));
        if !backend.can_copy_prefix() {
            return refuse(format!(
                "the {} backend keeps no prefix cache, so a restored slot has nowhere to stay",
                backend.name()
            ));
        }
        if self.budget == 0 {
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
        let context_capacity = match backend.shape_policy() {
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
                            backend.name()
                        ))
                    })?,
            ),
        };
        let plan = SessionPlan {
            context_capacity,
            max_positions: context_capacity.unwrap_or(tokens.len()),
            admitted_max_new_tokens: 0,
        };
        let bytes = backend.kv_bytes(plan.max_positions);
        if bytes > self.budget {
            return refuse(format!(
                "{} tokens need {:.1} MiB of KV memory, more than the prefix cache's {:.1} MiB \
                 (raise --cache-ram)",
                tokens.len(),
                bytes as f64 / (1 << 20) as f64,
                self.budget as f64 / (1 << 20) as f64
            ));
        }
        while self.retained.iter().map(|r| r.bytes).sum::<usize>() + bytes > self.budget
            && self.evict_one(backend, running)
        {}
        let slot = loop {
            match backend.allocate_slot(&plan) {
                Ok(slot) => break slot,
                Err(EngineError::NoFreeSlot)
                    if self.evict_for(backend, running, Some(&plan), None) => {}
                Err(e) => return Err(e),
            }
        };
        if backend.recurrent_state() && state.is_empty() {
            backend.release_slot(slot);
            return refuse(
                "the saved slot holds keys and values but no recurrent state, which this hybrid \
                 model's linear-attention layers need (it was saved from another model)"
                    .into(),
            );
        }
        if let Err(e) = backend
            .import_kv(slot, tokens.len(), kv)
            .and_then(|()| backend.import_state(slot, state))
        {
            backend.release_slot(slot);
            return Err(e);
        }
        let id = *next_id;
        *next_id += 1;
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

    /// Drops `id`'s entry (see [`crate::Scheduler::erase_cached`]); returns the tokens it held.
    pub(super) fn erase<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        id: RequestId,
    ) -> usize {
        if let Some(index) = self.taken.iter().position(|(entry, ..)| *entry == id) {
            let held = self.holder_of(running, id).map_or(0, |(_, len)| len);
            self.taken.remove(index);
            return held;
        }
        let Some(index) = self.retained.iter().position(|r| r.id == id) else {
            return 0;
        };
        let entry = self.retained.remove(index);
        backend.release_slot(entry.slot);
        self.prune_taken(running);
        entry.tokens.len()
    }

    /// The longest cached prefix of `prompt` (at most `prompt.len() - 1` tokens: one is always
    /// computed for its logits), among retained slots and running sequences, cut to what the
    /// slot can give ([`Backend::resumable_prefix`]: a hybrid model's state snapshots): (slot,
    /// length).
    fn longest_prefix<B: Backend + ?Sized>(
        &self,
        backend: &B,
        running: &[Sequence],
        prompt: &[u32],
    ) -> Option<(SlotId, usize, Option<usize>)> {
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
        // A sequence with LoRA adapters computed the adapted model's keys and values.
        let running = running
            .iter()
            .filter(|s| s.lora.is_empty())
            .filter_map(|s| {
                let slot = s.slot?;
                Some((slot, common(&s.tokens[..s.computed]), None))
            });
        let retained = retained
            .chain(running)
            .map(|(slot, len, i)| (slot, backend.resumable_prefix(slot, len), i));
        retained
            .filter(|&(_, len, _)| len >= MIN_REUSED_PREFIX)
            .max_by_key(|&(_, len, _)| len)
    }

    /// The kept entry a prompt can take over whole: the longest whose every token the prompt
    /// starts with (leaving at least one prompt token to compute), if no other source (a kept
    /// slot or a running sequence) holds a longer prefix of it. Its index in `retained`.
    pub(super) fn takeover<B: Backend + ?Sized>(
        &self,
        backend: &B,
        running: &[Sequence],
        prompt: &[u32],
    ) -> Option<usize> {
        let (i, len) = self
            .retained
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.tokens.len() >= MIN_REUSED_PREFIX
                    && r.tokens.len() < prompt.len()
                    && prompt.starts_with(&r.tokens)
                    && backend.resumable_prefix(r.slot, r.tokens.len()) == r.tokens.len()
            })
            .map(|(i, r)| (i, r.tokens.len()))
            .max_by_key(|&(_, len)| len)?;
        let best = self
            .longest_prefix(backend, running, prompt)
            .map_or(0, |(_, best, _)| best);
        (len >= best).then_some(i)
    }

    /// Kept entry `index`'s slot and the positions it holds.
    pub(super) fn entry(&self, index: usize) -> (SlotId, usize) {
        let entry = &self.retained[index];
        (entry.slot, entry.tokens.len())
    }

    /// Hands kept entry `index` over to `taker`, whose admission adopted its slot: the entry
    /// leaves the cache and stays readable under its id through its taker, and the take-over
    /// is counted as a hit.
    pub(super) fn hand_over(&mut self, index: usize, taker: &Sequence) {
        let entry = self.retained.remove(index);
        let len = entry.tokens.len();
        // Earlier take-overs of this entry now point at its taker (chains stay one link long),
        // and the oldest are forgotten past a bound.
        for (_, earlier_taker, _) in &mut self.taken {
            if *earlier_taker == entry.id {
                *earlier_taker = taker.id;
            }
        }
        self.taken.push((entry.id, taker.id, len));
        if self.taken.len() > MAX_TAKEN {
            self.taken.remove(0);
        }
        self.counters.lookups += 1;
        self.counters.queried_tokens += taker.prompt_len as u64;
        self.counters.hits += 1;
        self.counters.takeovers += 1;
        self.reused_tokens += len as u64;
    }

    /// Looks `sequence`'s prompt up at its admission to `slot`, and copies the longest cached
    /// prefix of it into the slot.
    pub(super) fn copy_at_admission<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        sequence: &mut Sequence,
        slot: SlotId,
    ) {
        self.counters.lookups += 1;
        self.counters.queried_tokens += sequence.prompt_len as u64;
        if let Some((source, len, retained)) =
            self.longest_prefix(&*backend, running, &sequence.tokens[..sequence.prompt_len])
            && backend.copy_prefix(source, slot, len).is_ok()
        {
            sequence.computed = len;
            sequence.cached = len;
            self.reused_tokens += len as u64;
            self.counters.hits += 1;
            self.clock += 1;
            if let Some(i) = retained {
                self.retained[i].last_used = self.clock;
            }
        }
    }

    /// Copies into running sequence `index`'s slot the longest prefix of its prompt that a kept
    /// slot or another running sequence has computed since it was admitted, when that is at
    /// least [`MIN_REUSED_PREFIX`] positions past its own.
    pub(super) fn copy_computed_prefix<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &mut [Sequence],
        index: usize,
    ) {
        let sequence = &running[index];
        let (Some(slot), computed) = (sequence.slot, sequence.computed) else {
            return;
        };
        let Some((source, len, retained)) =
            self.longest_prefix(&*backend, running, &sequence.tokens[..sequence.prompt_len])
        else {
            return;
        };
        if source == slot || len < computed + MIN_REUSED_PREFIX {
            return;
        }
        if backend.copy_prefix(source, slot, len).is_err() {
            // Whatever the slot holds now, the prompt is computed again from its start.
            let sequence = &mut running[index];
            if backend.truncate(slot, 0).is_ok() {
                sequence.computed = 0;
                self.reused_tokens -= sequence.cached as u64;
                sequence.cached = 0;
            }
            return;
        }
        let sequence = &mut running[index];
        if sequence.cached == 0 {
            self.counters.hits += 1;
        }
        sequence.cached += len - computed;
        sequence.computed = len;
        self.reused_tokens += (len - computed) as u64;
        self.clock += 1;
        if let Some(i) = retained {
            self.retained[i].last_used = self.clock;
        }
    }

    /// Keeps finished `sequence`'s `slot` for its prefix when the cache is on and the sequence
    /// ended well with enough computed, evicting the least recently used entries past the
    /// budget; otherwise releases the slot.
    pub(super) fn keep_or_release<B: Backend + ?Sized>(
        &mut self,
        backend: &mut B,
        running: &[Sequence],
        sequence: &Sequence,
        slot: SlotId,
    ) {
        let keep = self.budget > 0
            && sequence.lora.is_empty()
            && sequence.computed >= MIN_REUSED_PREFIX
            && matches!(
                sequence.status,
                RequestStatus::FinishedStopped | RequestStatus::FinishedLength
            );
        if keep {
            self.clock += 1;
            // What the kept slot holds in memory: its whole allocation (whole blocks, or its
            // plan's positions where the backend allocates a slot for them up front), so that
            // the budget bounds the memory and not only the useful part of it.
            let bytes = backend.keep_slot(
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
            while self.retained.iter().map(|r| r.bytes).sum::<usize>() > self.budget
                && self.evict_one(backend, running)
            {}
        } else {
            backend.release_slot(slot);
        }
    }
}

/// Whether running sequence `index`, prefilling, should wait for one admitted before it that
/// is computing a prefix of its prompt (at least [`MIN_REUSED_PREFIX`] positions past its
/// own), to copy that prefix once computed rather than compute it too: requests that arrive
/// together with a shared system prompt compute it once. The first such sequence never
/// waits, so every wait ends. The shared prefix counts in whole multiples of `grain` positions
/// (1, or a hybrid model's block: what a copy can resume from).
pub(super) fn waits_for_sharer(running: &[Sequence], index: usize, grain: usize) -> bool {
    let sequence = &running[index];
    let prompt = &sequence.tokens[..sequence.prompt_len];
    running[..index].iter().any(|earlier| {
        let shared = earlier.tokens[..earlier.prompt_len]
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        let shared = shared / grain.max(1) * grain.max(1);
        earlier.slot.is_some()
            && earlier.lora.is_empty()
            && earlier.computed < shared
            && shared >= sequence.computed + MIN_REUSED_PREFIX
    })
}
