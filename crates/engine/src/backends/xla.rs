//! The OpenXLA backend adapter: static shapes sized through `mlxcel-capacity`.
//!
//! Each context capacity is one compiled module with `max_batch` cache rows; a slot is a row of
//! its capacity. A request is sized by the command-line resolver (the smallest ladder rung that
//! holds its prompt and budget, or the pinned `MLXCEL_XLA_CONTEXT_CAPACITY`), so the engine's
//! admission and the CLI's sizing line agree; a server instead compiles a fixed bucket set at load
//! and routes each request to the smallest bucket that holds its prompt and whole budget. A step runs the prefill chunks one sequence at a
//! time and every capacity's decode tokens together.

use std::collections::{BTreeMap, HashMap};

use mlxcel_capacity::{
    CapacityOverrides, LADDER, Request, resolve_context_capacity, route, server_buckets,
};
use mlxcel_model::Checkpoint;
use mlxcel_xla::program::default_format;
use mlxcel_xla::{Compiler, DecodeEntry, WeightFormat, XlaModel, XlaOptions};

use crate::backend::{
    Backend, Bucket, RequestShape, SequenceStep, SessionPlan, ShapePolicy, SlotId,
};
use crate::error::{BackendSource, EngineError};
use crate::options::{Activations, ShapeMode};

fn backend_error(err: impl Into<BackendSource>) -> EngineError {
    EngineError::backend("xla", err)
}

/// The plan of one request on a checkpoint of `window` positions: the command-line resolver's
/// choice, so that the engine admits exactly what `mlxcel generate` prints.
fn plan_for(
    shape: &RequestShape,
    window: usize,
    pinned_capacity: Option<usize>,
) -> Result<SessionPlan, EngineError> {
    let request = Request {
        prompt_len: shape.prompt_len,
        image_tokens: shape.image_tokens,
        max_new_tokens: shape.max_new_tokens,
    };
    let resolution = resolve_context_capacity(&request, window, pinned_capacity)?;
    Ok(SessionPlan {
        context_capacity: Some(resolution.context_capacity),
        max_positions: resolution.context_capacity,
        admitted_max_new_tokens: resolution.admitted_max_new_tokens,
    })
}

#[derive(Debug, Clone, Copy)]
struct XlaSlot {
    capacity: usize,
    row: usize,
    /// Positions the row holds.
    len: usize,
}

/// The llama-family model compiled by IREE, one module per capacity.
#[derive(Debug)]
pub(crate) struct XlaBackend {
    model: XlaModel,
    window: usize,
    vocab_size: usize,
    pinned_capacity: Option<usize>,
    /// The server's fixed bucket set; `None` sizes each request over the ladder.
    buckets: Option<Vec<usize>>,
    slots: HashMap<SlotId, XlaSlot>,
    next_slot: SlotId,
}

impl XlaBackend {
    /// Loads the checkpoint's weights into the IREE runtime with the options of
    /// `MLXCEL_XLA_WEIGHTS` and `MLXCEL_XLA_MAX_BATCH` (else the defaults); modules compile on
    /// first use (or come from the on-disk cache). Unless `MLXCEL_XLA_WEIGHTS` names a format
    /// (which then decides the arithmetic: int8 activations under `kernel-int8`, f32 under the
    /// others), `activations` (else `MLXCEL_ACTIVATIONS`, else f32) chooses between mlxcel's
    /// kernels with f32 or int8 activations, or f16 weights where the kernels cannot run
    /// (`mlxcel_xla::program::default_format`).
    pub(crate) fn load(
        checkpoint: &Checkpoint,
        shapes: ShapeMode,
        activations: Option<Activations>,
    ) -> Result<Self, EngineError> {
        let mut options = XlaOptions::from_env().map_err(backend_error)?;
        if !options.format_from_env {
            let activations = match activations {
                Some(a) => a,
                None => match std::env::var("MLXCEL_ACTIVATIONS") {
                    Ok(value) => value.parse().map_err(|e: String| {
                        EngineError::backend("xla", format!("MLXCEL_ACTIVATIONS: {e}"))
                    })?,
                    Err(_) => Activations::F32,
                },
            };
            // The OpenXLA program multiplies every matrix the same way (one weight format).
            if activations == Activations::Mixed {
                return Err(EngineError::backend(
                    "xla",
                    "activations `mixed` (int8 for some matrices, f32 for the rest) runs on the \
                     MLX backend only: choose --activations f32 or int8 (MLXCEL_ACTIVATIONS) \
                     on the OpenXLA backend",
                ));
            }
            let dims = mlxcel_xla::weights::checkpoint_dims(checkpoint).map_err(backend_error)?;
            options.format = default_format(&dims, activations == Activations::Int8)
                .map_err(|e| EngineError::backend("xla", e))?;
        }
        Self::load_with(checkpoint, shapes, options)
    }

    /// [`Self::load`] with explicit options.
    pub(crate) fn load_with(
        checkpoint: &Checkpoint,
        shapes: ShapeMode,
        options: XlaOptions,
    ) -> Result<Self, EngineError> {
        let overrides = CapacityOverrides::from_env().map_err(backend_error)?;
        let cache_root = mlxcel_model::cache_dir()?;
        let compiler = Compiler::from_env(&cache_root).map_err(backend_error)?;
        let config = checkpoint.config();
        let window = config.window();
        let buckets = match shapes {
            ShapeMode::PerRequest => None,
            ShapeMode::ServerBuckets => Some(server_buckets(window, None, &overrides)),
        };
        let mut backend = Self {
            model: XlaModel::load(checkpoint, compiler, options).map_err(backend_error)?,
            window,
            vocab_size: config.vocab_size,
            pinned_capacity: overrides.pinned_capacity,
            buckets,
            slots: HashMap::new(),
            next_slot: 0,
        };
        // A server compiles (or loads from the cache) every bucket now, so that no request ever
        // waits for a compile.
        if let Some(buckets) = backend.buckets.clone() {
            backend
                .model
                .ensure_capacities(&buckets)
                .map_err(backend_error)?;
        }
        Ok(backend)
    }

    /// Every capacity a request can get: the server's buckets, else the pin, else each rung
    /// bounded by the window.
    fn capacities(&self) -> Vec<usize> {
        let mut capacities: Vec<usize> = match (&self.buckets, self.pinned_capacity) {
            (Some(buckets), _) => buckets.clone(),
            (None, Some(pin)) => vec![pin],
            (None, None) => LADDER.iter().map(|&r| r.min(self.window)).collect(),
        };
        capacities.sort_unstable();
        capacities.dedup();
        capacities
    }

    fn fail(message: String) -> EngineError {
        EngineError::backend("xla", message)
    }

    fn slot(&self, slot: SlotId) -> Result<XlaSlot, EngineError> {
        self.slots
            .get(&slot)
            .copied()
            .ok_or_else(|| Self::missing(slot))
    }

    /// Sets the positions slot `slot` holds.
    fn set_len(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        let held = self
            .slots
            .get_mut(&slot)
            .ok_or_else(|| Self::missing(slot))?;
        held.len = len;
        Ok(())
    }

    fn missing(slot: SlotId) -> EngineError {
        Self::fail(format!("slot {slot} is not allocated"))
    }
}

impl Backend for XlaBackend {
    fn name(&self) -> &'static str {
        "xla"
    }

    fn window(&self) -> usize {
        self.window
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn shape_policy(&self) -> ShapePolicy {
        let max_batch = self.model.options().max_batch;
        ShapePolicy::Static {
            buckets: self
                .capacities()
                .into_iter()
                .map(|context_capacity| Bucket {
                    context_capacity,
                    max_batch,
                })
                .collect(),
        }
    }

    /// Sizes the static shape through the capacity resolver: an explicit budget is honoured or
    /// refused, an unlimited one is clamped to the room the chosen capacity leaves.
    fn create_session_for_request(&self, shape: &RequestShape) -> Result<SessionPlan, EngineError> {
        match &self.buckets {
            None => plan_for(shape, self.window, self.pinned_capacity),
            Some(buckets) => {
                let routed = route(
                    buckets,
                    self.window,
                    shape.effective_prompt_len(),
                    shape.max_new_tokens,
                )?;
                Ok(SessionPlan {
                    context_capacity: Some(routed.bucket),
                    max_positions: routed.bucket,
                    admitted_max_new_tokens: routed.admitted_max_new_tokens,
                })
            }
        }
    }

    fn allocate_slot(&mut self, plan: &SessionPlan) -> Result<SlotId, EngineError> {
        let capacity = plan
            .context_capacity
            .ok_or_else(|| Self::fail("a plan without a context capacity".into()))?;
        let used: Vec<usize> = self
            .slots
            .values()
            .filter(|s| s.capacity == capacity)
            .map(|s| s.row)
            .collect();
        let row = (0..self.model.options().max_batch)
            .find(|r| !used.contains(r))
            .ok_or(EngineError::NoFreeSlot)?;
        self.model
            .ensure_capacity(capacity)
            .map_err(backend_error)?;
        let slot = self.next_slot;
        self.next_slot += 1;
        self.slots.insert(
            slot,
            XlaSlot {
                capacity,
                row,
                len: 0,
            },
        );
        Ok(slot)
    }

    fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut slots = Vec::with_capacity(batch.len());
        for entry in batch {
            let slot = *self
                .slots
                .get(&entry.slot)
                .ok_or_else(|| Self::fail(format!("slot {} is not allocated", entry.slot)))?;
            if entry.start_position != slot.len {
                return Err(Self::fail(format!(
                    "slot {} holds {} positions but the step starts at {}",
                    entry.slot, slot.len, entry.start_position
                )));
            }
            if entry.tokens.is_empty() || slot.len + entry.tokens.len() > slot.capacity {
                return Err(Self::fail(format!(
                    "slot {}: {} + {} tokens exceed context capacity {}",
                    entry.slot,
                    slot.len,
                    entry.tokens.len(),
                    slot.capacity
                )));
            }
            slots.push(slot);
        }
        if (1..batch.len()).any(|i| batch[..i].iter().any(|e| e.slot == batch[i].slot)) {
            return Err(Self::fail("a slot appears twice in one step".into()));
        }

        let mut logits: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        let mut decodes: BTreeMap<usize, Vec<(usize, DecodeEntry)>> = BTreeMap::new();
        for (i, (entry, slot)) in batch.iter().zip(&slots).enumerate() {
            if let [token] = entry.tokens {
                decodes.entry(slot.capacity).or_default().push((
                    i,
                    DecodeEntry {
                        row: slot.row,
                        position: slot.len,
                        token: *token,
                    },
                ));
            } else {
                logits[i] = Some(
                    self.model
                        .prefill(slot.capacity, slot.row, slot.len, entry.tokens)
                        .map_err(backend_error)?,
                );
            }
        }
        for (capacity, entries) in decodes {
            let plain: Vec<DecodeEntry> = entries.iter().map(|(_, e)| *e).collect();
            let rows = self.model.decode(capacity, &plain).map_err(backend_error)?;
            for ((i, _), row) in entries.into_iter().zip(rows) {
                logits[i] = Some(row);
            }
        }
        for entry in batch {
            if let Some(slot) = self.slots.get_mut(&entry.slot) {
                slot.len += entry.tokens.len();
            }
        }
        logits
            .into_iter()
            .map(|l| l.ok_or_else(|| Self::fail("a step entry produced no logits".into())))
            .collect()
    }

    fn release_slot(&mut self, slot: SlotId) {
        self.slots.remove(&slot);
    }

    fn compilations(&self) -> u64 {
        self.model.compilations()
    }

    /// The weight format and the activations it multiplies with (`kernel-int8`: int8).
    fn execution(&self) -> String {
        let format = self.model.options().format;
        let activations = if format == WeightFormat::KernelInt8 {
            "int8"
        } else {
            "f32"
        };
        format!("{} weights, {activations} activations", format.name())
    }

    fn kv_bytes(&self, positions: usize) -> usize {
        positions * self.model.floats_per_position() * 4
    }

    fn can_copy_prefix(&self) -> bool {
        true
    }

    /// Copies rows on the device: within a capacity (one row of the same buffers to another) or
    /// between capacities (a prefix computed in a small bucket reused by a request routed to a
    /// larger one, or the other way while it fits).
    fn copy_prefix(&mut self, from: SlotId, to: SlotId, len: usize) -> Result<(), EngineError> {
        let source = self.slot(from)?;
        let target = self.slot(to)?;
        if len > source.len || len > target.capacity {
            return Err(Self::fail(format!(
                "slot {from} holds {} positions and slot {to} has room for {}: {len} cannot be \
                 copied",
                source.len, target.capacity
            )));
        }
        self.model
            .copy_positions(
                (source.capacity, source.row),
                (target.capacity, target.row),
                len,
            )
            .map_err(backend_error)?;
        self.set_len(to, len)
    }

    /// A kept row serves a new request of the same capacity in place; one routed to another
    /// capacity is refused (not [`EngineError::NoFreeSlot`]), so the engine copies the prefix
    /// into a row of that capacity instead.
    fn adopt_slot(
        &mut self,
        slot: SlotId,
        plan: &SessionPlan,
        len: usize,
    ) -> Result<(), EngineError> {
        let held = self.slot(slot)?;
        if plan.context_capacity != Some(held.capacity) || len > held.len {
            return Err(Self::fail(format!(
                "slot {slot} (capacity {}, {} positions) cannot keep {len} positions for a plan \
                 of capacity {:?}",
                held.capacity, held.len, plan.context_capacity
            )));
        }
        self.set_len(slot, len)
    }

    fn export_kv(&mut self, slot: SlotId, len: usize) -> Result<Vec<f32>, EngineError> {
        let held = self.slot(slot)?;
        if len > held.len {
            return Err(Self::fail(format!(
                "slot {slot} holds {} positions, not {len}",
                held.len
            )));
        }
        self.model
            .export_positions(held.capacity, held.row, len)
            .map_err(backend_error)
    }

    fn import_kv(&mut self, slot: SlotId, len: usize, data: &[f32]) -> Result<(), EngineError> {
        let held = self.slot(slot)?;
        self.model
            .import_positions(held.capacity, held.row, len, data)
            .map_err(backend_error)?;
        self.set_len(slot, len)
    }

    /// Positions past `len` stay in the row until overwritten; no program reads past a
    /// sequence's length.
    fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), EngineError> {
        let held = self.slot(slot)?.len;
        self.set_len(slot, held.min(len))
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_capacity::MaxNewTokens::{self, Limited, Unlimited};
    use mlxcel_model::{LoadedModel, resolve_model};

    use super::*;
    #[cfg(feature = "mlx")]
    use crate::backends::mlx::MlxBackend;

    fn shape(prompt_len: usize, max_new_tokens: MaxNewTokens) -> RequestShape {
        RequestShape {
            prompt_len,
            image_tokens: 0,
            max_new_tokens,
        }
    }

    /// The capacity acceptance table (window 131072; docs/capacity.md) through the backend's sizing.
    #[test]
    fn plans_follow_the_capacity_acceptance_table() {
        let window = 131_072;
        for (prompt, budget, pin, capacity, admitted) in [
            (6, Unlimited, None, 1024, 1018),
            (6, Limited(64), None, 256, 64),
            (553, Limited(1), None, 1024, 1),
            (553, Unlimited, None, 2048, 1495),
            (6, Limited(2000), None, 2048, 2000),
        ] {
            let plan = plan_for(&shape(prompt, budget), window, pin).unwrap();
            assert_eq!(plan.context_capacity, Some(capacity), "{prompt} {budget:?}");
            assert_eq!(plan.max_positions, capacity);
            assert_eq!(
                plan.admitted_max_new_tokens, admitted,
                "{prompt} {budget:?}"
            );
        }
        let err = plan_for(&shape(553, Limited(1)), window, Some(300)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300"
        );
    }

    fn skip() -> bool {
        std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
    }

    fn argmax(v: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Logits of the two backends agree to this absolute tolerance (logits are O(10)). With f16
    /// weights (the default, rounded to f16 once on the host; docs/xla.md) the difference
    /// measured 1.9e-2 at the first step and 3.3e-2 over 32 steps: 5e-2. Packed weights are
    /// dequantized in the graph with MLX's own f32 arithmetic and differ only by summation
    /// order: 7.2e-5 at the first step, 1.2e-4 over 32 steps: 1e-3, tight enough to catch a
    /// backend that dequantizes anything in reduced precision (it caught f16 embeddings).
    /// mlxcel's kernels (`kernel`) compute MLX's dequantization in f32 too, summed in another
    /// order: 1e-3. With int8 activations (`kernel-int8`) against the MLX backend's int8
    /// activations: both quantize x per block of 32 to the same codes, but the kernels multiply
    /// each bias by the quantized block's sum and the MLX backend by the exact one, and their
    /// logits measured 0.84 apart at the first step and 1.26 over 32 steps with the same 64
    /// greedy tokens (each is as far from f32 activations: 0.69 / 1.52 and 0.64 / 1.44, two of
    /// 64 greedy tokens differing): 2.
    fn tolerance(format: WeightFormat) -> f32 {
        match format {
            WeightFormat::Packed | WeightFormat::Kernel => 1e-3,
            WeightFormat::KernelInt8 => 2.0,
            _ => 5e-2,
        }
    }

    /// A server's backend compiles its bucket set at load, routes each request to the smallest
    /// bucket that holds its prompt and whole budget, and compiles nothing afterwards.
    #[test]
    fn server_buckets_compile_at_load_and_route() {
        if skip() {
            return;
        }
        let loaded = LoadedModel::open(&resolve_model(None).unwrap()).unwrap();
        let mut xla = XlaBackend::load(&loaded.checkpoint, ShapeMode::ServerBuckets, None).unwrap();
        let ShapePolicy::Static { buckets } = xla.shape_policy() else {
            panic!("xla has static shapes");
        };
        let capacities: Vec<usize> = buckets.iter().map(|b| b.context_capacity).collect();
        assert_eq!(capacities, [256, 4096], "window 8192");
        let compiled = xla.compilations();
        let plan = |prompt_len, n| {
            let shape = RequestShape {
                prompt_len,
                image_tokens: 0,
                max_new_tokens: n,
            };
            xla.create_session_for_request(&shape)
                .map(|p| (p.context_capacity, p.admitted_max_new_tokens))
        };
        use mlxcel_capacity::MaxNewTokens::{Limited, Unlimited};
        assert_eq!(plan(6, Limited(64)).unwrap(), (Some(256), 64));
        assert_eq!(plan(415, Limited(8)).unwrap(), (Some(4096), 8));
        assert_eq!(plan(6, Unlimited).unwrap(), (Some(4096), 4090));
        let err = plan(5000, Limited(1)).unwrap_err().to_string();
        assert!(err.contains("> largest context capacity=4096"), "{err}");
        // A step in a bucket runs without compiling.
        let p = xla
            .create_session_for_request(&RequestShape {
                prompt_len: 5,
                image_tokens: 0,
                max_new_tokens: Limited(2),
            })
            .unwrap();
        let slot = xla.allocate_slot(&p).unwrap();
        let tokens = [504, 3575, 282, 4649, 314];
        xla.step(&[SequenceStep {
            slot,
            tokens: &tokens,
            start_position: 0,
        }])
        .unwrap();
        xla.release_slot(slot);
        assert_eq!(xla.compilations(), compiled, "nothing compiles after load");
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    }

    /// Copied, exported, imported and truncated rows of the static caches give the logits of a
    /// prompt computed in place: bit for bit where the same program sees the same chunks (a
    /// prefix copied at a chunk boundary within a capacity, an exported row imported into
    /// another, decoding side by side), and to f32 rounding where the chunks or the capacity
    /// differ (a prefix copied mid-chunk, or into a row of a larger capacity).
    #[test]
    fn copied_and_restored_rows_give_the_logits_of_computed_ones() {
        if skip() {
            return;
        }
        let loaded = LoadedModel::open(&resolve_model(None).unwrap()).unwrap();
        let mut xla = XlaBackend::load(&loaded.checkpoint, ShapeMode::ServerBuckets, None).unwrap();
        assert!(xla.can_copy_prefix());
        let words: Vec<String> = (1..=40).map(|n| format!("item {n}")).collect();
        let prompt = loaded
            .tokenizer
            .encode(&words.join(", "), false, false)
            .unwrap();
        let n = prompt.len();
        assert!(n > 96 && n < 200, "{n} tokens");
        let chunk = xla.model.options().chunk;
        let plan = |prompt_len| {
            xla.create_session_for_request(&shape(prompt_len, Limited(8)))
                .unwrap()
        };
        let (small, large) = (plan(n), plan(400));
        assert_eq!(
            (small.context_capacity, large.context_capacity),
            (Some(256), Some(4096))
        );
        let step = |xla: &mut XlaBackend, slot, tokens: &[u32], start_position| {
            xla.step(&[SequenceStep {
                slot,
                tokens,
                start_position,
            }])
            .unwrap()
            .remove(0)
        };

        let computed = xla.allocate_slot(&small).unwrap();
        let want = step(&mut xla, computed, &prompt, 0);
        let next = argmax(&want);

        // At a chunk boundary, in the same capacity: the same chunks, bit for bit.
        let aligned = 2 * chunk;
        let copy = xla.allocate_slot(&small).unwrap();
        xla.copy_prefix(computed, copy, aligned).unwrap();
        let got = step(&mut xla, copy, &prompt[aligned..], aligned);
        assert_eq!(got, want, "copied at position {aligned}");

        // Mid-chunk, and into the larger capacity: to rounding.
        let mid = chunk + chunk / 2 + 3;
        let other = xla.allocate_slot(&small).unwrap();
        xla.copy_prefix(computed, other, mid).unwrap();
        let got = step(&mut xla, other, &prompt[mid..], mid);
        assert!(max_diff(&got, &want) < 1e-3, "{}", max_diff(&got, &want));
        assert_eq!(argmax(&got), next);
        let wide = xla.allocate_slot(&large).unwrap();
        xla.copy_prefix(computed, wide, aligned).unwrap();
        let got = step(&mut xla, wide, &prompt[aligned..], aligned);
        assert!(max_diff(&got, &want) < 1e-3, "{}", max_diff(&got, &want));
        assert_eq!(argmax(&got), next);

        // Exported and imported into a fresh row, then decoded beside the original: the same
        // bits.
        let kv = xla.export_kv(computed, n).unwrap();
        assert_eq!(kv.len(), n * xla.model.floats_per_position());
        assert_eq!(xla.kv_bytes(n), kv.len() * 4);
        xla.release_slot(other);
        let restored = xla.allocate_slot(&small).unwrap();
        xla.import_kv(restored, n, &kv).unwrap();
        assert_eq!(xla.export_kv(restored, n).unwrap(), kv);
        let rows = xla
            .step(&[
                SequenceStep {
                    slot: computed,
                    tokens: &[next],
                    start_position: n,
                },
                SequenceStep {
                    slot: restored,
                    tokens: &[next],
                    start_position: n,
                },
            ])
            .unwrap();
        assert_eq!(rows[0], rows[1], "an imported row decodes as its source");

        // Truncated back into the prompt and recomputed from there: the prompt's logits again.
        xla.truncate(restored, n - 5).unwrap();
        let got = step(&mut xla, restored, &prompt[n - 5..], n - 5);
        assert!(max_diff(&got, &want) < 1e-3, "{}", max_diff(&got, &want));

        // What does not fit is refused with the numbers.
        let err = xla
            .copy_prefix(computed, copy, n + 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be copied"), "{err}");
        let err = xla.import_kv(copy, n, &kv[1..]).unwrap_err().to_string();
        assert!(err.contains("floats for"), "{err}");
        let err = xla.adopt_slot(wide, &small, 8).unwrap_err();
        assert!(!matches!(err, EngineError::NoFreeSlot), "{err}");
        xla.adopt_slot(copy, &small, 8).unwrap();
    }

    /// The XLA backend (f16 weights, the default) against the MLX backend on the default model.
    #[cfg(feature = "mlx")]
    #[test]
    fn logits_agree_with_the_mlx_backend_on_the_default_model() {
        if skip() {
            return;
        }
        agree_with_mlx(WeightFormat::F16);
    }

    /// The same with the quantized weights kept packed and dequantized in the graph.
    #[cfg(feature = "mlx")]
    #[test]
    fn packed_weights_agree_with_the_mlx_backend_on_the_default_model() {
        if skip() {
            return;
        }
        agree_with_mlx(WeightFormat::Packed);
    }

    /// The same with mlxcel's kernels multiplying the packed weights (f32 activations), where
    /// they run.
    #[cfg(feature = "mlx")]
    #[test]
    fn kernel_weights_agree_with_the_mlx_backend_on_the_default_model() {
        if skip() || !mlxcel_xla::kernels::supported() {
            return;
        }
        agree_with_mlx(WeightFormat::Kernel);
    }

    /// The kernels with int8 activations against the MLX backend's int8 activations.
    #[cfg(feature = "mlx")]
    #[test]
    fn kernel_int8_agrees_with_the_mlx_backend_int8_activations_on_the_default_model() {
        if skip() || !mlxcel_xla::kernels::supported() {
            return;
        }
        agree_with_mlx(WeightFormat::KernelInt8);
    }

    /// The XLA backend against the MLX backend, through the backend seam: two sequences of
    /// different lengths, prefilled then decoded together for 32 greedy steps; every step's
    /// logits agree within [`tolerance`] and pick the same token.
    #[cfg(feature = "mlx")]
    fn agree_with_mlx(format: WeightFormat) {
        let loaded = LoadedModel::open(&resolve_model(None).unwrap()).unwrap();
        // int8 activations against the MLX backend's int8 activations.
        let activations = (format == WeightFormat::KernelInt8).then_some(Activations::Int8);
        let mlx_options = crate::options::EngineOptions {
            kv_budget_bytes: 1 << 30,
            activations,
            ..Default::default()
        };
        let mut mlx = MlxBackend::load(&loaded.checkpoint, &mlx_options).unwrap();
        let options = XlaOptions {
            format,
            ..XlaOptions::default()
        };
        let mut xla =
            XlaBackend::load_with(&loaded.checkpoint, ShapeMode::PerRequest, options).unwrap();
        let prompts = [
            loaded.tokenizer.encode("The capital of France is", false, false).unwrap(),
            loaded
                .tokenizer
                .encode("One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen, sixteen, seventeen, eighteen", false, false)
                .unwrap(),
        ];
        assert!(
            prompts[1].len() > 32,
            "the second prompt spans two prefill chunks"
        );
        let plan = xla
            .create_session_for_request(&shape(64, Limited(40)))
            .unwrap();
        assert_eq!(plan.context_capacity, Some(256));
        let mut slots = Vec::new();
        for _ in &prompts {
            slots.push((
                mlx.allocate_slot(&plan).unwrap(),
                xla.allocate_slot(&plan).unwrap(),
            ));
        }
        let mut tokens: Vec<Vec<u32>> = prompts.to_vec();
        let mut positions = [0usize; 2];
        let mut worst = 0f32;
        let mut first = 0f32;
        let mut disagreements = 0;
        for step in 0..32 {
            let batch = |which: usize| -> Vec<SequenceStep<'_>> {
                (0..2)
                    .map(|i| SequenceStep {
                        slot: if which == 0 { slots[i].0 } else { slots[i].1 },
                        tokens: &tokens[i],
                        start_position: positions[i],
                    })
                    .collect()
            };
            let expected = mlx.step(&batch(0)).unwrap();
            let got = xla.step(&batch(1)).unwrap();
            for i in 0..2 {
                let diff = expected[i]
                    .iter()
                    .zip(&got[i])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                worst = worst.max(diff);
                if step == 0 {
                    first = first.max(diff);
                }
                assert!(
                    diff < tolerance(format),
                    "{}: step {step}, sequence {i}: max |Δlogit| {diff}",
                    format.name()
                );
                if argmax(&expected[i]) != argmax(&got[i]) {
                    disagreements += 1;
                }
            }
            for i in 0..2 {
                positions[i] += tokens[i].len();
                tokens[i] = vec![argmax(&expected[i])];
            }
        }
        eprintln!(
            "xla ({}) vs mlx: max |Δlogit| {first:.2e} at the first step, {worst:.2e} over 32 \
             steps, {disagreements} of 64 greedy tokens differ",
            format.name()
        );
        assert_eq!(disagreements, 0);
        assert!(xla.compilations() <= 1);
    }
}
