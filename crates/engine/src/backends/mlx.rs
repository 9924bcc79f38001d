//! The MLX backend adapter: slots are KV caches, a step is one `LlamaModel::forward`; in a
//! pipeline (rank 0), a step runs this rank's layers and then the other ranks' through the
//! pipe, and every change to a slot is sent to the other ranks with the next step.

use std::collections::HashMap;

use mlxcel_capacity::MaxNewTokens;
use mlxcel_core::{ForwardSeq, KV_BLOCK, KvCache, LlamaModel, Stage};
use mlxcel_model::Checkpoint;

use super::pipeline::pipe::Pipe;
use super::pipeline::wire::SlotOp;
use super::stage_model::load_model;
use crate::backend::{Backend, KvBlockUsage, RequestShape, SequenceStep, SessionPlan, SlotId};
use crate::error::EngineError;
use crate::options::{EngineOptions, KvType};

/// The llama-family model on MLX, with one KV cache per slot (caches copied from one another
/// share their full blocks).
#[derive(Debug)]
pub(crate) struct MlxBackend {
    model: LlamaModel,
    slots: HashMap<SlotId, KvCache>,
    next_slot: SlotId,
    /// Most bytes of KV memory the live slots may reserve (each at its plan's worst case, a
    /// block shared by several slots counted once).
    kv_budget_bytes: usize,
    /// Most sequences running at once: a request without a token limit may generate up to this
    /// share of the budget's positions ([`MlxBackend::unlimited_generation`]).
    running: usize,
    /// Rank 0's end of a pipeline; `None`: the whole model is here.
    pipe: Option<Pipe>,
    /// KV bytes one position takes in the caches KV memory is budgeted by: this model's, or in
    /// a pipeline the most any rank's take (so that no rank's caches outgrow the budget).
    position_bytes: usize,
    /// Bytes of recurrent state every slot of a hybrid model holds whatever its length (0
    /// otherwise; in a pipeline the most any rank holds), counted in the KV budget beside its
    /// blocks.
    state_bytes: usize,
    /// Whether slots keep a snapshot of their recurrent state at each block boundary (the
    /// prefix cache is on, and the model is a hybrid): each block then costs a snapshot too.
    snapshots: bool,
    /// Each slot's LoRA scales ([`Backend::set_slot_adapters`]); a slot not here runs none.
    adapter_scales: HashMap<SlotId, Vec<f32>>,
}

fn backend_error(err: mlxcel_core::Error) -> EngineError {
    EngineError::backend("mlx", err)
}

impl MlxBackend {
    /// Loads the model (in a pipeline, rank 0's stage, after sending every other rank its
    /// layers, and waits until they have loaded theirs); the options' threads and activations
    /// override `MLXCEL_THREADS` and `MLXCEL_ACTIVATIONS` for the CPU kernels; slots' caches hold
    /// keys and values as the KV types say.
    pub(crate) fn load(
        checkpoint: &Checkpoint,
        options: &EngineOptions,
    ) -> Result<Self, EngineError> {
        if !options.control_vector.is_empty() && options.pipeline.is_some() {
            return Err(EngineError::backend(
                "mlx",
                "control vectors (--control-vector) are not supported in a pipeline yet \
                 (docs/distributed.md)",
            ));
        }
        let (mut pipe, stage) = match &options.pipeline {
            Some(pipeline) => {
                let (pipe, stage) = Pipe::open(checkpoint, pipeline)?;
                (Some(pipe), stage)
            }
            None => (None, Stage::whole(checkpoint.config())),
        };
        let mut model = load_model(checkpoint, stage, options)?;
        if !options.lora_adapters.is_empty() {
            if pipe.is_some() {
                return Err(EngineError::InvalidLora(
                    "LoRA adapters are not supported in a pipeline yet (docs/distributed.md)"
                        .into(),
                ));
            }
            let adapters = options
                .lora_adapters
                .iter()
                .map(|path| mlxcel_model::LoraAdapter::open(path, checkpoint.config()))
                .collect::<Result<Vec<_>, _>>()?;
            model
                .set_adapters(&adapters)
                .map_err(|e| EngineError::InvalidLora(e.to_string()))?;
        }
        let config = checkpoint.config();
        let control = mlxcel_model::ControlVector::load(
            &options.control_vector,
            config.hidden_size,
            config.num_hidden_layers,
        )?;
        if let Some(control) = &control {
            model
                .set_control_vector(Some(control))
                .map_err(backend_error)?;
        }
        let (mut position_bytes, mut state_bytes) = (
            model.kv_bytes_per_position(),
            model.recurrent_bytes_per_sequence(),
        );
        if let Some(pipe) = &mut pipe {
            pipe.await_ready()?;
            (position_bytes, state_bytes) =
                pipe.most_cache_bytes(checkpoint.config(), model.kv_types());
            eprintln!("mlxcel: pipeline ready: {}", pipe.describe());
        }
        Ok(Self {
            model,
            slots: HashMap::new(),
            next_slot: 0,
            kv_budget_bytes: options.kv_budget_bytes,
            running: options.scheduler.max_batch.max(1),
            pipe,
            position_bytes,
            state_bytes,
            snapshots: false,
            adapter_scales: HashMap::new(),
        })
    }

    /// Refuses what a pipeline cannot do yet, naming it.
    fn refuse_in_pipeline(&self, what: &str) -> Result<(), EngineError> {
        match self.pipe {
            Some(_) => Err(EngineError::backend(
                "mlx",
                format!("{what} is not supported in a pipeline yet (docs/distributed.md)"),
            )),
            None => Ok(()),
        }
    }

    /// Queues a slot change for the pipeline's other ranks.
    fn tell_pipe(&mut self, op: SlotOp) {
        if let Some(pipe) = &mut self.pipe {
            pipe.queue(op);
        }
    }

    /// The most tokens a request without a token limit is planned to generate after `prompt`
    /// positions: up to a `running`-th of the KV budget's positions in whole blocks (its
    /// share, at least one block), prompt included, as llama-server gives each of its parallel
    /// slots a share of its context; a prompt longer than the share may still generate a
    /// share's worth, within the whole budget. Without it such a request was planned for the
    /// whole window, which on a model of 128K positions is more KV memory than the budget holds
    /// (Llama-3.2-1B: 8 GiB of f32 keys and values), so every request without `max_tokens` was
    /// refused.
    fn unlimited_generation(&self, prompt: usize) -> usize {
        let block = self.block_bytes().max(1);
        // What the running sequences' recurrent states leave for positions.
        let budget = self
            .kv_budget_bytes
            .saturating_sub(self.running * self.state_bytes);
        let all = budget / block * KV_BLOCK;
        let share = (budget / self.running / block).max(1) * KV_BLOCK;
        let wanted = if prompt < share {
            share - prompt
        } else {
            share
        };
        wanted.min(all.saturating_sub(prompt)).max(1)
    }

    /// KV bytes one position takes across all layers (keys and values, in their types).
    fn bytes_per_position(&self) -> usize {
        self.position_bytes
    }

    /// KV bytes of one block of positions, plus the snapshot of a hybrid model's recurrent
    /// state at its end where slots keep them.
    fn block_bytes(&self) -> usize {
        let snapshot = if self.snapshots { self.state_bytes } else { 0 };
        KV_BLOCK * self.bytes_per_position() + snapshot
    }

    /// KV bytes of `positions` positions in whole blocks (what a cache allocates), plus a
    /// hybrid model's recurrent state (a fixed size per sequence).
    fn block_rounded_bytes(&self, positions: usize) -> usize {
        positions.div_ceil(KV_BLOCK) * self.block_bytes() + self.state_bytes
    }

    /// The distinct blocks the slots hold (a shared block once), plus the blocks each slot may
    /// still allocate (up to its bound, and a copy of a shared block it would write into).
    fn reserved_bytes(&self) -> usize {
        let (held, _, growth) = self.block_counts();
        (held + growth) * self.block_bytes() + self.slots.len() * self.state_bytes
    }

    /// (distinct blocks held by the slots, of those the ones more than one slot holds, blocks
    /// the slots may still allocate).
    fn block_counts(&self) -> (usize, usize, usize) {
        let mut holders: HashMap<usize, usize> = HashMap::new();
        let mut growth = 0;
        for cache in self.slots.values() {
            for id in cache.block_ids() {
                *holders.entry(id).or_default() += 1;
            }
            growth += cache.reserved_blocks() - cache.blocks();
        }
        let shared = holders.values().filter(|&&n| n > 1).count();
        (holders.len(), shared, growth)
    }
}

impl MlxBackend {
    /// The LoRA scales of `batch`'s slots in order, when any slot has some.
    fn batch_adapter_scales(&self, batch: &[SequenceStep<'_>]) -> Option<Vec<Vec<f32>>> {
        if !batch
            .iter()
            .any(|e| self.adapter_scales.contains_key(&e.slot))
        {
            return None;
        }
        Some(
            batch
                .iter()
                .map(|e| {
                    self.adapter_scales
                        .get(&e.slot)
                        .cloned()
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    /// Runs `forward` over the caches of `batch`'s slots (taken out of the map so that each can
    /// be borrowed mutably, and put back whatever happens), after checking that each slot exists
    /// once and holds the positions its entry starts at.
    fn run_batch<T>(
        &mut self,
        batch: &[SequenceStep<'_>],
        forward: impl FnOnce(&LlamaModel, &mut [ForwardSeq<'_>]) -> mlxcel_core::Result<T>,
    ) -> Result<T, EngineError> {
        self.run_batch_piped(batch, |model, _, seqs| {
            forward(model, seqs).map_err(backend_error)
        })
    }

    /// [`MlxBackend::run_batch`] whose `forward` also gets the pipe.
    fn run_batch_piped<T>(
        &mut self,
        batch: &[SequenceStep<'_>],
        forward: impl FnOnce(
            &LlamaModel,
            Option<&mut Pipe>,
            &mut [ForwardSeq<'_>],
        ) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let mut caches = Vec::with_capacity(batch.len());
        let mut failure = None;
        for entry in batch {
            match self.slots.remove(&entry.slot) {
                Some(cache) if cache.len() == entry.start_position => {
                    caches.push((entry.slot, cache))
                }
                Some(cache) => {
                    failure = Some(format!(
                        "slot {} holds {} positions but the step starts at {}",
                        entry.slot,
                        cache.len(),
                        entry.start_position
                    ));
                    caches.push((entry.slot, cache));
                    break;
                }
                None => {
                    failure = Some(format!(
                        "slot {} is not allocated (or repeated)",
                        entry.slot
                    ));
                    break;
                }
            }
        }
        let result = match failure {
            Some(message) => Err(EngineError::backend("mlx", message)),
            None => {
                let mut seqs: Vec<ForwardSeq<'_>> = caches
                    .iter_mut()
                    .zip(batch)
                    .map(|((_, cache), entry)| ForwardSeq {
                        cache,
                        tokens: entry.tokens,
                    })
                    .collect();
                forward(&self.model, self.pipe.as_mut(), &mut seqs)
            }
        };
        self.slots.extend(caches);
        result
    }

    /// A step through the pipeline: rows from `firsts[i]` on for sequence `i`, grouped per
    /// sequence.
    fn pipeline_step(
        &mut self,
        batch: &[SequenceStep<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        if firsts.len() != batch.len()
            || batch.iter().zip(firsts).any(|(e, &f)| f >= e.tokens.len())
        {
            return Err(EngineError::backend(
                "mlx",
                format!(
                    "first rows {firsts:?} do not fit a batch of {}",
                    batch.len()
                ),
            ));
        }
        let slots: Vec<usize> = batch.iter().map(|e| e.slot).collect();
        let rows = self.run_batch_piped(batch, |model, pipe, seqs| match pipe {
            Some(pipe) => pipe.step(model, seqs, &slots, firsts),
            None => Err(EngineError::backend("mlx", "no pipeline")),
        })?;
        let mut rows = rows.into_iter();
        Ok(batch
            .iter()
            .zip(firsts)
            .map(|(e, &f)| rows.by_ref().take(e.tokens.len() - f).collect())
            .collect())
    }
}

impl Backend for MlxBackend {
    fn name(&self) -> &'static str {
        "mlx"
    }

    fn window(&self) -> usize {
        self.model.config().window()
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn execution(&self) -> String {
        let kernels = self.model.kernels();
        let piped = match &self.pipe {
            Some(pipe) => format!(", pipeline ({})", pipe.describe()),
            None => String::new(),
        };
        let kv = match self.model.kv_types() {
            (KvType::F32, KvType::F32) => String::new(),
            (k, v) => format!(", {}/{} KV cache", k.as_str(), v.as_str()),
        };
        format!(
            "{}, {:?} kernels, {:?} activations{kv}{piped}",
            self.model.execution(),
            kernels.isa,
            kernels.activations
        )
    }

    /// Dynamic shapes bounded by the window, and by the KV memory budget: a request whose worst
    /// case could never fit the budget is refused now rather than queued forever.
    fn create_session_for_request(&self, shape: &RequestShape) -> Result<SessionPlan, EngineError> {
        let window = self.window();
        let admitted = mlxcel_capacity::admit_in_window(
            shape.effective_prompt_len(),
            shape.max_new_tokens,
            window,
        )?;
        let admitted = match shape.max_new_tokens {
            MaxNewTokens::Unlimited => {
                admitted.min(self.unlimited_generation(shape.effective_prompt_len()))
            }
            MaxNewTokens::Limited(_) => admitted,
        };
        let positions = shape.effective_prompt_len() + admitted;
        let bytes = self.block_rounded_bytes(positions);
        if bytes > self.kv_budget_bytes {
            return Err(EngineError::KvBudget {
                positions,
                bytes,
                budget: self.kv_budget_bytes,
            });
        }
        Ok(SessionPlan {
            context_capacity: None,
            max_positions: positions,
            admitted_max_new_tokens: admitted,
        })
    }

    fn kv_usage(&self) -> Option<(usize, usize)> {
        Some((self.reserved_bytes(), self.kv_budget_bytes))
    }

    fn fault(&self) -> Option<String> {
        let pipe = self.pipe.as_ref()?;
        pipe.fault()
            .map(|reason| format!("the pipeline is down: {reason}"))
    }

    fn kv_blocks(&self) -> Option<KvBlockUsage> {
        let (held, shared, growth) = self.block_counts();
        let budget_blocks = self.kv_budget_bytes / self.block_bytes().max(1);
        Some(KvBlockUsage {
            block_positions: KV_BLOCK,
            held,
            shared,
            free: budget_blocks.saturating_sub(held + growth),
        })
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.model.weight_bytes())
    }

    fn token_read_bytes(&self) -> Option<u64> {
        Some(self.model.token_read_bytes())
    }

    fn allocate_slot(&mut self, plan: &SessionPlan) -> Result<SlotId, EngineError> {
        let wanted = self.block_rounded_bytes(plan.max_positions);
        if self.reserved_bytes() + wanted > self.kv_budget_bytes {
            return Err(EngineError::NoFreeSlot);
        }
        let slot = self.next_slot;
        self.next_slot += 1;
        let mut cache = self.model.new_cache(plan.max_positions);
        cache.set_keep_state_snapshots(self.snapshots);
        self.slots.insert(slot, cache);
        self.tell_pipe(SlotOp::Alloc {
            slot,
            max: plan.max_positions,
        });
        Ok(slot)
    }

    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        if self.pipe.is_some() {
            let lasts: Vec<usize> = batch
                .iter()
                .map(|e| e.tokens.len().saturating_sub(1))
                .collect();
            let rows = self.pipeline_step(batch, &lasts)?;
            return Ok(rows.into_iter().flatten().collect());
        }
        if let Some(scales) = self.batch_adapter_scales(batch) {
            let lasts: Vec<usize> = batch.iter().map(|e| e.tokens.len() - 1).collect();
            let rows = self.run_batch(batch, |model, seqs| {
                let scales: Vec<&[f32]> = scales.iter().map(Vec::as_slice).collect();
                model.forward_scored_with_adapters(seqs, &lasts, &scales)
            })?;
            return Ok(rows.into_iter().flatten().collect());
        }
        self.run_batch(batch, |model, seqs| model.forward(seqs))
    }

    fn step_scored(
        &mut self,
        batch: &[SequenceStep<'_>],
        firsts: &[usize],
    ) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        if self.pipe.is_some() {
            return self.pipeline_step(batch, firsts);
        }
        let adapter_scales = self.batch_adapter_scales(batch);
        self.run_batch(batch, |model, seqs| {
            // A verification keeps a hybrid's recurrent state after each of its positions, so
            // that `truncate` can roll rejected proposals back.
            for (seq, &first) in seqs.iter_mut().zip(firsts) {
                if first + 1 < seq.tokens.len() {
                    seq.cache.checkpoint_next_step();
                }
            }
            match &adapter_scales {
                Some(scales) => {
                    let scales: Vec<&[f32]> = scales.iter().map(Vec::as_slice).collect();
                    model.forward_scored_with_adapters(seqs, firsts, &scales)
                }
                None => model.forward_scored(seqs, firsts),
            }
        })
    }

    fn set_slot_adapters(&mut self, slot: SlotId, scales: Vec<f32>) {
        if scales.iter().all(|&s| s == 0.0) {
            self.adapter_scales.remove(&slot);
        } else {
            self.adapter_scales.insert(slot, scales);
        }
    }

    fn release_slot(&mut self, slot: SlotId) {
        self.adapter_scales.remove(&slot);
        if self.slots.remove(&slot).is_some() {
            self.tell_pipe(SlotOp::Release { slot });
        }
    }

    fn adopt_slot(
        &mut self,
        slot: SlotId,
        plan: &SessionPlan,
        len: usize,
    ) -> Result<(), EngineError> {
        let block = self.block_bytes();
        let reserved = self.reserved_bytes();
        let budget = self.kv_budget_bytes;
        let cache = self
            .slots
            .get_mut(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        if len > cache.len() || len > plan.max_positions {
            return Err(EngineError::backend(
                "mlx",
                format!(
                    "slot {slot} holds {} positions: it cannot keep {len} for a plan of {}",
                    cache.len(),
                    plan.max_positions
                ),
            ));
        }
        // Its held blocks stay counted; what changes is what it may still allocate.
        let now = (cache.reserved_blocks() - cache.blocks()) * block;
        let after =
            (cache.reserved_blocks_at(len, plan.max_positions.max(len)) - cache.blocks()) * block;
        if reserved - now + after > budget {
            return Err(EngineError::NoFreeSlot);
        }
        cache.truncate(len);
        cache
            .set_max_positions(plan.max_positions)
            .map_err(backend_error)?;
        self.tell_pipe(SlotOp::Bound {
            slot,
            len,
            max: plan.max_positions,
        });
        Ok(())
    }

    /// A hybrid model's verification keeps its recurrent state after each position
    /// ([`MlxBackend::step_scored`]), which [`Backend::truncate`] rolls back to.
    ///
    /// In a pipeline, the other ranks' caches keep no such checkpoints: a hybrid model does not
    /// verify there.
    fn can_score(&self) -> bool {
        self.pipe.is_none() || !self.model.is_hybrid()
    }

    /// A hybrid model's prefixes are given from the state snapshots at block boundaries (or a
    /// slot's whole length): [`Backend::resumable_prefix`].
    ///
    /// In a pipeline, the other ranks' caches keep no snapshots: a hybrid model's prefix cache
    /// is off there.
    fn can_copy_prefix(&self) -> bool {
        self.pipe.is_none() || !self.model.is_hybrid()
    }

    fn recurrent_state(&self) -> bool {
        self.model.is_hybrid()
    }

    fn resumable_prefix(&self, slot: SlotId, len: usize) -> usize {
        self.slots
            .get(&slot)
            .map_or(0, |cache| cache.resumable_prefix(len))
    }

    fn keep_state_snapshots(&mut self, keep: bool) {
        self.snapshots = keep && self.model.is_hybrid() && self.pipe.is_none();
        for cache in self.slots.values_mut() {
            cache.set_keep_state_snapshots(self.snapshots);
        }
    }

    fn export_state(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        let cache = self
            .slots
            .get(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        cache.export_state(len).map_err(backend_error)
    }

    fn import_state(&mut self, slot: SlotId, data: &[f32]) -> Result<(), EngineError> {
        let cache = self
            .slots
            .get_mut(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        cache.import_state(data).map_err(backend_error)
    }

    /// A cache of `positions` positions holds whole blocks: what a kept slot costs the prefix
    /// cache is what it reserves here (counting the positions alone let `--cache-ram 32` keep
    /// ~170 MB of one-block slots in a soak of short requests).
    fn kv_bytes(&self, positions: usize) -> usize {
        self.block_rounded_bytes(positions)
    }

    /// The slot's bound drops to the positions it holds: its blocks stay, the ones it could
    /// still have allocated leave the budget's reservation.
    fn keep_slot(&mut self, slot: SlotId, len: usize, max_positions: usize) -> usize {
        let block = self.block_bytes();
        if let Some(cache) = self.slots.get_mut(&slot)
            && cache.len() == len
            && cache.set_max_positions(len).is_ok()
        {
            let bytes = cache.reserved_blocks() * block + self.state_bytes;
            self.tell_pipe(SlotOp::Bound {
                slot,
                len,
                max: len,
            });
            return bytes;
        }
        self.kv_bytes(max_positions)
    }

    fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.refuse_in_pipeline("embeddings (the final hidden states)")?;
        let mut cache = self.model.new_cache(tokens.len());
        self.model
            .forward_hidden(ForwardSeq {
                cache: &mut cache,
                tokens,
            })
            .map_err(backend_error)
    }

    fn copy_prefix(&mut self, from: SlotId, to: SlotId, len: usize) -> Result<(), EngineError> {
        let missing = |slot| EngineError::backend("mlx", format!("slot {slot} is not allocated"));
        let mut target = self.slots.remove(&to).ok_or_else(|| missing(to))?;
        let result = match self.slots.get(&from) {
            Some(source) => target.copy_prefix_from(source, len).map_err(backend_error),
            None => Err(missing(from)),
        };
        self.slots.insert(to, target);
        if result.is_ok() {
            self.tell_pipe(SlotOp::CopyPrefix { from, to, len });
        }
        result
    }

    fn export_kv(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        self.refuse_in_pipeline("saving a slot's keys and values")?;
        let cache = self
            .slots
            .get(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        cache.export(len).map_err(backend_error)
    }

    fn import_kv(&mut self, slot: SlotId, len: usize, data: &[f32]) -> Result<(), EngineError> {
        self.refuse_in_pipeline("restoring a slot's keys and values")?;
        let cache = self
            .slots
            .get_mut(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        cache.import(data, len).map_err(backend_error)
    }

    fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        let cache = self
            .slots
            .get_mut(&slot)
            .ok_or_else(|| EngineError::backend("mlx", format!("slot {slot} is not allocated")))?;
        cache.truncate(len);
        let max = cache.max_positions();
        self.tell_pipe(SlotOp::Bound { slot, len, max });
        Ok(())
    }

    fn score(
        &mut self,
        step: SequenceStep<'_>,
        first: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        if self.pipe.is_some() {
            return Ok(self
                .pipeline_step(&[step], &[first])?
                .pop()
                .unwrap_or_default());
        }
        let mut cache = self.slots.remove(&step.slot).ok_or_else(|| {
            EngineError::backend("mlx", format!("slot {} is not allocated", step.slot))
        })?;
        let result = if cache.len() == step.start_position {
            self.model
                .forward_scores(
                    ForwardSeq {
                        cache: &mut cache,
                        tokens: step.tokens,
                    },
                    first,
                )
                .map_err(backend_error)
        } else {
            Err(EngineError::backend(
                "mlx",
                format!(
                    "slot {} holds {} positions but the step starts at {}",
                    step.slot,
                    cache.len(),
                    step.start_position
                ),
            ))
        };
        self.slots.insert(step.slot, cache);
        result
    }
}
