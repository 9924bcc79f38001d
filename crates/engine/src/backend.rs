//! The seam between the engine and a backend.
//!
//! The engine owns requests, sequences, scheduling and sampling; a backend owns weights, KV memory
//! and the forward pass. A backend is told which slot each sequence lives in, which tokens are new
//! (a prefill chunk or one decode token) and where they start, and returns the logits of each
//! sequence's last new position. Everything above the logits happens in the engine, so backends
//! behave identically to users and a mock backend can test the scheduler.

use mlxcel_capacity::{MaxNewTokens, admit_in_window};

use crate::error::EngineError;

/// A backend's handle for one sequence's KV memory.
pub type SlotId = usize;

/// The shape-relevant facts of a request, known before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    /// Prompt tokens after templating.
    pub prompt_len: usize,
    /// Worst-case image expansion in tokens (0 for text).
    pub image_tokens: usize,
    /// The generation budget asked for.
    pub max_new_tokens: MaxNewTokens,
}

impl RequestShape {
    /// Prompt plus worst-case image expansion.
    pub fn effective_prompt_len(&self) -> usize {
        self.prompt_len.saturating_add(self.image_tokens)
    }
}

/// How a backend sizes its sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShapePolicy {
    /// Any length up to the checkpoint window (MLX).
    Dynamic,
    /// A fixed set of compiled capacities, each with its own batch limit (OpenXLA).
    Static {
        /// Ascending by capacity.
        buckets: Vec<Bucket>,
    },
}

/// One compiled static shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Positions per sequence.
    pub context_capacity: usize,
    /// Sequences per step.
    pub max_batch: usize,
}

/// Where and with what budget a request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPlan {
    /// The static capacity the sequence runs in; `None` for a dynamic shape.
    pub context_capacity: Option<usize>,
    /// The most positions the sequence may occupy (the capacity, or the window).
    pub max_positions: usize,
    /// The budget the request runs with: explicit budgets unchanged, unlimited ones clamped.
    pub admitted_max_new_tokens: usize,
}

/// New tokens of one sequence for one step.
#[derive(Debug, Clone, Copy)]
pub struct SequenceStep<'a> {
    /// The sequence's slot, from [`Backend::allocate_slot`].
    pub slot: SlotId,
    /// The tokens to run: a prefill chunk, or the one token sampled last step.
    pub tokens: &'a [u32],
    /// The position of `tokens[0]`: how many tokens the slot already holds.
    pub start_position: usize,
}

/// KV memory in blocks (a backend whose sequences share blocks of a common prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvBlockUsage {
    /// Positions per block.
    pub block_positions: usize,
    /// Distinct blocks the slots hold (a block several slots share counts once).
    pub held: usize,
    /// Of those, blocks more than one slot holds.
    pub shared: usize,
    /// Blocks the KV budget has room for beyond those held and those the slots may still
    /// allocate up to their plans.
    pub free: usize,
}

/// A model runner.
pub trait Backend {
    /// A short name (`mlx`, `xla`), used in errors and logs.
    fn name(&self) -> &'static str;

    /// The checkpoint's window: the most positions any sequence may use.
    fn window(&self) -> usize;

    /// The size of each logits vector.
    fn vocab_size(&self) -> usize;

    /// How sequences are shaped; dynamic unless the backend compiles static shapes.
    fn shape_policy(&self) -> ShapePolicy {
        ShapePolicy::Dynamic
    }

    /// Sizes a request. The default is a dynamic shape bounded by the window: an explicit budget is
    /// honoured or refused, an unlimited one runs to the end of the window. Only static-shape
    /// backends override this, sizing through `mlxcel-capacity`.
    fn create_session_for_request(&self, shape: &RequestShape) -> Result<SessionPlan, EngineError> {
        let window = self.window();
        let admitted = admit_in_window(shape.effective_prompt_len(), shape.max_new_tokens, window)?;
        Ok(SessionPlan {
            context_capacity: None,
            max_positions: window,
            admitted_max_new_tokens: admitted,
        })
    }

    /// Reserves KV memory for a sequence run under `plan`.
    fn allocate_slot(&mut self, plan: &SessionPlan) -> Result<SlotId, EngineError>;

    /// Runs one step over `batch` and returns, per entry and in order, the logits of its last new
    /// position (`vocab_size()` floats each).
    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError>;

    /// Frees a slot's KV memory. Releasing an unknown slot is a no-op.
    fn release_slot(&mut self, slot: SlotId);

    /// Sets the LoRA scales slot `slot`'s steps run with, one per adapter the backend loaded
    /// ([`crate::EngineOptions::lora_adapters`]); empty: none. The engine checks them against the
    /// adapters at submission; a backend that loads none is only ever given empty scales.
    fn set_slot_adapters(&mut self, slot: SlotId, scales: Vec<f32>) {
        let _ = (slot, scales);
    }

    /// Executables compiled so far (static-shape backends); nothing compiles after warm-up.
    fn compilations(&self) -> u64 {
        0
    }

    /// Why this backend can no longer run steps, once it cannot (a pipeline that lost a rank);
    /// `None` while it can.
    fn fault(&self) -> Option<String> {
        None
    }

    /// How this backend runs the model, for benchmark output (e.g. `fused layers`); empty when
    /// there is nothing to say.
    fn execution(&self) -> String {
        String::new()
    }

    /// The final hidden states of every position of `tokens` (a fresh sequence, its own
    /// scratch cache): what embeddings pool. Backends without them refuse.
    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        let _ = tokens;
        Err(EngineError::backend(
            self.name(),
            "this backend returns logits only: embeddings need the mlx backend",
        ))
    }

    /// Bytes of KV memory a slot of `positions` positions holds, whole blocks where the backend
    /// allocates in blocks (what the prefix cache budgets); 0 when the backend does not say.
    fn kv_bytes(&self, positions: usize) -> usize {
        let _ = positions;
        0
    }

    /// A finished slot the prefix cache keeps, holding `len` positions of a plan of
    /// `max_positions`: returns the bytes it holds from now on, what the cache counts against its
    /// budget. A backend that allocates as a slot grows trims the slot's reservation to what it
    /// holds (a kept slot does not grow; [`Backend::adopt_slot`] reserves again for the plan that
    /// takes it over). By default the slot keeps its plan's reservation, `kv_bytes(max_positions)`.
    fn keep_slot(&mut self, slot: SlotId, len: usize, max_positions: usize) -> usize {
        let _ = (slot, len);
        self.kv_bytes(max_positions)
    }

    /// KV memory reserved now (running sequences and prefix-cache slots) and the budget that
    /// bounds it, in bytes; `None` where the backend keeps no such budget.
    fn kv_usage(&self) -> Option<(usize, usize)> {
        None
    }

    /// Bytes of weights the loaded model holds, in the layout its kernels read (which can differ
    /// from the checkpoint's: the int8 layouts); `None` where the backend does not say.
    fn weight_bytes(&self) -> Option<u64> {
        None
    }

    /// Bytes of weights one decode token reads (a mixture of experts reads only its routed
    /// experts); `None` where the backend does not say (then all of [`Backend::weight_bytes`]).
    fn token_read_bytes(&self) -> Option<u64> {
        None
    }

    /// The KV blocks the slots hold, where the backend keeps its caches in shareable blocks;
    /// `None` otherwise.
    fn kv_blocks(&self) -> Option<KvBlockUsage> {
        None
    }

    /// Whether [`Backend::copy_prefix`] works (the prefix cache needs it).
    fn can_copy_prefix(&self) -> bool {
        false
    }

    /// Whether the model keeps a recurrent state per sequence (a hybrid's linear-attention
    /// layers): the state after every position consumed, which goes back to a shorter prefix
    /// only where the backend kept a copy of it ([`Backend::resumable_prefix`]).
    fn recurrent_state(&self) -> bool {
        false
    }

    /// The most positions, at most `len`, that slot `slot` can give another slot
    /// ([`Backend::copy_prefix`]) or be cut back to ([`Backend::adopt_slot`],
    /// [`Backend::truncate`]) with the same logits after: `len` where every position's keys and
    /// values are all a sequence's state; for a recurrent state, the longest prefix whose state
    /// the slot keeps a copy of (its own, a speculative step's checkpoints, snapshots at block
    /// boundaries when [`Backend::keep_state_snapshots`] asked for them).
    fn resumable_prefix(&self, slot: SlotId, len: usize) -> usize {
        let _ = slot;
        len
    }

    /// Whether slots keep copies of their recurrent state at block boundaries from now on (the
    /// prefix cache's snapshots, which cached prefixes of whole blocks resume from). A no-op
    /// for a model without recurrent state.
    fn keep_state_snapshots(&mut self, keep: bool) {
        let _ = keep;
    }

    /// A slot's recurrent state after its first `len` positions on the host (empty for a model
    /// without one): what a saved slot file holds beside [`Backend::export_kv`]'s keys and
    /// values ([`Backend::import_state`] reads it back).
    fn export_state(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        let _ = (slot, len);
        Ok(Vec::new())
    }

    /// Sets slot `slot`'s recurrent state to `data` ([`Backend::export_state`]'s layout on the
    /// same model) as the state after the positions [`Backend::import_kv`] gave it. Refused
    /// when `data` is not this model's state (empty, for a model without one).
    fn import_state(&mut self, slot: SlotId, data: &[f32]) -> Result<(), EngineError> {
        let _ = slot;
        if data.is_empty() {
            return Ok(());
        }
        Err(EngineError::backend(
            self.name(),
            format!(
                "the saved slot holds {} values of recurrent state (a hybrid model's), and this \
                 model keeps none",
                data.len()
            ),
        ))
    }

    /// Makes slot `to`'s first `len` positions a copy of slot `from`'s (the same tokens there),
    /// replacing whatever `to` held.
    fn copy_prefix(&mut self, from: SlotId, to: SlotId, len: usize) -> Result<(), EngineError> {
        let _ = (from, to, len);
        Err(EngineError::backend(
            self.name(),
            "this backend cannot copy a cached prefix between slots",
        ))
    }

    /// Gives kept slot `slot` to a new sequence of `plan` as if it had been allocated for it,
    /// keeping its first `len` positions (the prefix cache's take-over: no copy).
    /// [`EngineError::NoFreeSlot`] when the plan's positions do not fit the KV budget; backends
    /// without it refuse (the prefix cache then copies).
    fn adopt_slot(
        &mut self,
        slot: SlotId,
        plan: &SessionPlan,
        len: usize,
    ) -> Result<(), EngineError> {
        let _ = (slot, plan, len);
        Err(EngineError::backend(
            self.name(),
            "this backend cannot give a kept slot to a new sequence",
        ))
    }

    /// A slot's first `len` positions' keys and values on the host, in the backend's own layout
    /// ([`Backend::import_kv`] reads it back): what a saved slot file holds.
    fn export_kv(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        let _ = (slot, len);
        Err(EngineError::backend(
            self.name(),
            "this backend cannot export a slot's keys and values",
        ))
    }

    /// Makes slot `slot` hold `len` positions read from `data` ([`Backend::export_kv`]'s layout
    /// on the same model), replacing whatever it held.
    fn import_kv(&mut self, slot: SlotId, len: usize, data: &[f32]) -> Result<(), EngineError> {
        let _ = (slot, len, data);
        Err(EngineError::backend(
            self.name(),
            "this backend cannot import keys and values into a slot",
        ))
    }

    /// Whether [`Backend::score`] and [`Backend::truncate`] work (speculative decoding needs
    /// both).
    fn can_score(&self) -> bool {
        false
    }

    /// Forgets a slot's positions from `len` on (a speculative step's rejected proposals).
    fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        let _ = (slot, len);
        Err(EngineError::backend(
            self.name(),
            "this backend cannot roll back a sequence's positions",
        ))
    }

    /// Runs one step like [`Backend::step`] and returns, per entry and in order, the logits of
    /// its new positions from `firsts[i]` (an index into its tokens) to the last: a step in
    /// which speculating sequences verify their proposals beside other sequences' decode and
    /// prefill. `firsts[i] = tokens.len() - 1` asks for the last position only. Backends that
    /// score every position in one pass override this; the default runs the last-position
    /// entries as one [`Backend::step`] and scores each other entry in a pass of its own
    /// ([`Backend::score`]).
    fn step_scored(
        &mut self,
        batch: &[SequenceStep<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        if firsts.len() != batch.len() {
            return Err(EngineError::backend(
                self.name(),
                format!("{} first rows for a batch of {}", firsts.len(), batch.len()),
            ));
        }
        let last_only = |i: usize| firsts[i] + 1 >= batch[i].tokens.len();
        let plain: Vec<SequenceStep<'_>> = (0..batch.len())
            .filter(|&i| last_only(i))
            .map(|i| batch[i])
            .collect();
        let mut plain_rows = if plain.is_empty() {
            Vec::new()
        } else {
            self.step(&plain)?
        };
        if plain_rows.len() != plain.len() {
            return Err(EngineError::backend(
                self.name(),
                format!(
                    "returned {} logits vectors for a batch of {}",
                    plain_rows.len(),
                    plain.len()
                ),
            ));
        }
        plain_rows.reverse();
        let mut out = Vec::with_capacity(batch.len());
        for (i, &entry) in batch.iter().enumerate() {
            if last_only(i) {
                out.push(vec![plain_rows.pop().expect("one row per plain entry")]);
            } else {
                out.push(self.score(entry, firsts[i])?);
            }
        }
        Ok(out)
    }

    /// Runs one sequence's step like [`Backend::step`] and returns the logits of its new
    /// positions from `first` (an index into the step's tokens) to the last: what perplexity
    /// scores. Backends that compute only the last position's logits refuse.
    fn score(
        &mut self,
        step: SequenceStep<'_>,
        first: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let _ = (step, first);
        Err(EngineError::backend(
            self.name(),
            "this backend returns only the last position's logits: scoring every position \
             (perplexity) needs the mlx backend",
        ))
    }
}

/// A boxed backend is a backend, so the engine can choose one at run time.
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn window(&self) -> usize {
        (**self).window()
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn shape_policy(&self) -> ShapePolicy {
        (**self).shape_policy()
    }

    fn create_session_for_request(&self, shape: &RequestShape) -> Result<SessionPlan, EngineError> {
        (**self).create_session_for_request(shape)
    }

    fn allocate_slot(&mut self, plan: &SessionPlan) -> Result<SlotId, EngineError> {
        (**self).allocate_slot(plan)
    }

    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        (**self).step(batch)
    }

    fn release_slot(&mut self, slot: SlotId) {
        (**self).release_slot(slot)
    }

    fn set_slot_adapters(&mut self, slot: SlotId, scales: Vec<f32>) {
        (**self).set_slot_adapters(slot, scales)
    }

    fn compilations(&self) -> u64 {
        (**self).compilations()
    }

    fn fault(&self) -> Option<String> {
        (**self).fault()
    }

    fn execution(&self) -> String {
        (**self).execution()
    }

    fn score(
        &mut self,
        step: SequenceStep<'_>,
        first: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        (**self).score(step, first)
    }
    fn step_scored(
        &mut self,
        batch: &[SequenceStep<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        (**self).step_scored(batch, firsts)
    }

    fn can_score(&self) -> bool {
        (**self).can_score()
    }

    fn can_copy_prefix(&self) -> bool {
        (**self).can_copy_prefix()
    }

    fn recurrent_state(&self) -> bool {
        (**self).recurrent_state()
    }

    fn resumable_prefix(&self, slot: SlotId, len: usize) -> usize {
        (**self).resumable_prefix(slot, len)
    }

    fn keep_state_snapshots(&mut self, keep: bool) {
        (**self).keep_state_snapshots(keep)
    }

    fn export_state(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        (**self).export_state(slot, len)
    }

    fn import_state(&mut self, slot: SlotId, data: &[f32]) -> Result<(), EngineError> {
        (**self).import_state(slot, data)
    }

    fn kv_bytes(&self, positions: usize) -> usize {
        (**self).kv_bytes(positions)
    }

    fn keep_slot(&mut self, slot: SlotId, len: usize, max_positions: usize) -> usize {
        (**self).keep_slot(slot, len, max_positions)
    }

    fn kv_usage(&self) -> Option<(usize, usize)> {
        (**self).kv_usage()
    }

    fn kv_blocks(&self) -> Option<KvBlockUsage> {
        (**self).kv_blocks()
    }

    fn weight_bytes(&self) -> Option<u64> {
        (**self).weight_bytes()
    }

    fn token_read_bytes(&self) -> Option<u64> {
        (**self).token_read_bytes()
    }

    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        (**self).hidden_states(tokens)
    }

    fn adopt_slot(
        &mut self,
        slot: SlotId,
        plan: &SessionPlan,
        len: usize,
    ) -> Result<(), EngineError> {
        (**self).adopt_slot(slot, plan, len)
    }

    fn copy_prefix(&mut self, from: SlotId, to: SlotId, len: usize) -> Result<(), EngineError> {
        (**self).copy_prefix(from, to, len)
    }

    fn export_kv(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        (**self).export_kv(slot, len)
    }

    fn import_kv(&mut self, slot: SlotId, len: usize, data: &[f32]) -> Result<(), EngineError> {
        (**self).import_kv(slot, len, data)
    }

    fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        (**self).truncate(slot, len)
    }
}
