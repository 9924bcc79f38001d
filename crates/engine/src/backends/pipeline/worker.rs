//! A stage worker (every rank but 0): it receives rank 0's greeting, checks that it holds the
//! same model, loads its own layers, then runs each step's layers over the hidden states the
//! rank before it sends, until rank 0 says to stop. It keeps its layers' KV cache per slot and
//! applies the slot operations each step carries. It never answers HTTP.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mlxcel_core::distributed::Group;
use mlxcel_core::{Dtype, ForwardSeq, KvCache, LlamaModel, Stage};
use mlxcel_model::{Checkpoint, resolve_model_with};

use super::link::{pipe_error, recv_message, send_message, wait_for};
use super::ring::{fingerprint, join_pipeline};
use super::wire::{FailReason, Header, Hello, Kind, SlotOp, Step, VERSION};
use crate::backends::RELEASE_EVERY;
use crate::backends::stage_model::load_model;
use crate::error::EngineError;
use crate::options::EngineOptions;

/// Runs this process as a stage worker of the pipeline `options.pipeline` describes, over the
/// model `model` names (as [`crate::Engine::load`] takes it; every rank names the same model
/// files), until rank 0 shuts the pipeline down (`Ok`) or a rank is lost (`Err`).
pub fn run_pipeline_stage(model: Option<&str>, options: &EngineOptions) -> Result<(), EngineError> {
    let pipeline = options
        .pipeline
        .as_ref()
        .ok_or_else(|| pipe_error("a stage worker needs pipeline options"))?;
    let mut checkpoint = Checkpoint::open(&resolve_model_with(model, &options.kv_overrides)?)?;
    checkpoint.apply_rope_overrides(&options.rope)?;
    // As the engine's backends do: each step's buffers stay mapped for the next step.
    mlxcel_core::keep_freed_heap_memory();
    let group = join_pipeline(pipeline)?;
    if group.rank() == 0 {
        return Err(pipe_error("rank 0 runs the engine, not a stage worker"));
    }
    let model = greet(&group, &checkpoint, options)?;
    // What loading freed (the checkpoint read and rewritten) goes back to the system, as the
    // engine's worker does on rank 0 once it goes idle: 135 MB of a Llama-3.2-1B stage.
    drop(checkpoint);
    crate::backends::release_unused_memory();
    let stage = model.stage();
    eprintln!(
        "mlxcel: pipeline rank {} of {}: layers {}..{} loaded",
        group.rank(),
        group.size(),
        stage.first,
        stage.end
    );
    let mut worker = Worker {
        group,
        model,
        slots: HashMap::new(),
    };
    worker.serve()
}

/// Receives rank 0's greeting, checks it and loads this rank's stage, then passes the greeting
/// on (the last rank answers rank 0 that the pipeline is ready); a refusal travels the same way.
fn greet(
    group: &Group,
    checkpoint: &Checkpoint,
    options: &EngineOptions,
) -> Result<LlamaModel, EngineError> {
    let (prev, next) = (group.prev(), group.next());
    let last = next == 0;
    let (header, payload) = recv_message(group, prev)?;
    let fail = |rank: i32, reason: i32| {
        let header = Header::new(Kind::Fail, 0, rank, reason);
        send_message(group, header, &[], next)
    };
    match header.kind {
        Kind::Hello => {}
        Kind::Fail => {
            fail(header.a, header.b)?;
            return Err(pipe_error(format!(
                "rank {} refused the pipeline: {}",
                header.a,
                FailReason::from_i32(header.b)
            )));
        }
        other => return Err(pipe_error(format!("rank {prev} opened with {other:?}"))),
    }
    let rank = group.rank() as i32;
    let hello = Hello::decode(&payload).map_err(pipe_error)?;
    let refusal = if hello.version != VERSION {
        Some((
            FailReason::Version,
            format!("protocol {} (this rank: {VERSION})", hello.version),
        ))
    } else if hello.fingerprint != fingerprint(checkpoint) {
        Some((
            FailReason::ModelMismatch,
            format!("{} differs from rank 0's model", checkpoint.dir().display()),
        ))
    } else {
        None
    };
    if let Some((reason, detail)) = refusal {
        fail(rank, reason as i32)?;
        return Err(pipe_error(format!(
            "rank {rank}: {}: {detail}",
            FailReason::from_i32(reason as i32)
        )));
    }
    let loaded = Stage::of_pipeline(checkpoint.config(), &hello.ends, group.rank())
        .map_err(|e| EngineError::backend("mlx", e))
        .and_then(|stage| load_model(checkpoint, stage, options));
    let model = match loaded {
        Ok(model) => model,
        Err(e) => {
            fail(rank, FailReason::Load as i32)?;
            return Err(e);
        }
    };
    if last {
        send_message(group, Header::new(Kind::Ready, 0, 0, 0), &[], next)?;
    } else {
        send_message(group, header, &payload, next)?;
    }
    Ok(model)
}

/// How long without a step before a worker counts as idle.
const IDLE_AFTER: Duration = Duration::from_secs(1);

/// A stage worker's state: its layers and each slot's cache of them.
struct Worker {
    group: Group,
    model: LlamaModel,
    slots: HashMap<usize, KvCache>,
}

impl Worker {
    fn serve(&mut self) -> Result<(), EngineError> {
        let (prev, next) = (self.group.prev(), self.group.next());
        let mut released = Instant::now();
        loop {
            // Freed memory goes back to the system as on rank 0 ([`RELEASE_EVERY`]): once when
            // no step comes for a while (idle; the recv below then blocks until one does), and
            // every so often while busy.
            let idle = !self
                .group
                .wait_readable(Some(IDLE_AFTER))
                .map_err(|e| pipe_error(format!("receiving from rank {prev}: {e}")))?;
            if idle || released.elapsed() >= RELEASE_EVERY {
                crate::backends::release_unused_memory();
                released = Instant::now();
            }
            let (header, payload) = recv_message(&self.group, prev)?;
            match header.kind {
                Kind::Shutdown => {
                    if next != 0 {
                        send_message(&self.group, header, &[], next)?;
                    }
                    return Ok(());
                }
                Kind::Step => {
                    let step = Step::decode(&payload)
                        .map_err(|e| pipe_error(format!("rank {prev} sent {e}")))?;
                    self.step(header, &payload, &step)?;
                }
                other => return Err(pipe_error(format!("rank {prev} sent {other:?} mid-stream"))),
            }
        }
    }

    fn apply(&mut self, op: SlotOp) -> Result<(), EngineError> {
        let missing = |slot| pipe_error(format!("slot {slot} is not allocated on this rank"));
        match op {
            SlotOp::Alloc { slot, max } => {
                self.slots.insert(slot, self.model.new_cache(max));
            }
            SlotOp::Release { slot } => {
                self.slots.remove(&slot);
            }
            SlotOp::CopyPrefix { from, to, len } => {
                let mut target = self.slots.remove(&to).ok_or_else(|| missing(to))?;
                let copied = match self.slots.get(&from) {
                    Some(source) => target
                        .copy_prefix_from(source, len)
                        .map_err(|e| EngineError::backend("mlx", e)),
                    None => Err(missing(from)),
                };
                self.slots.insert(to, target);
                copied?;
            }
            SlotOp::Bound { slot, len, max } => {
                let cache = self.slots.get_mut(&slot).ok_or_else(|| missing(slot))?;
                cache.truncate(len);
                cache
                    .set_max_positions(max)
                    .map_err(|e| EngineError::backend("mlx", e))?;
            }
        }
        Ok(())
    }

    /// Runs this rank's layers over one step and passes the result on: the hidden states to
    /// the next rank, or from the last rank the rows that leave the step to rank 0. Any failure
    /// ends the worker (its sockets close, and its neighbours see the pipeline down).
    fn step(&mut self, header: Header, payload: &[i32], step: &Step) -> Result<(), EngineError> {
        let next = self.group.next();
        let last = next == 0;
        for &op in &step.ops {
            self.apply(op)?;
        }
        let mut caches = Vec::with_capacity(step.seqs.len());
        for s in &step.seqs {
            let cache = self
                .slots
                .remove(&s.slot)
                .ok_or_else(|| pipe_error(format!("slot {} is not allocated", s.slot)))?;
            if cache.len() != s.start {
                return Err(pipe_error(format!(
                    "slot {} holds {} positions but the step starts at {}",
                    s.slot,
                    cache.len(),
                    s.start
                )));
            }
            caches.push((s.slot, cache));
        }
        // The next rank learns the step before this one computes it.
        if !last {
            send_message(&self.group, header, payload, next)?;
        }
        let result = self.run(&mut caches, step, last);
        self.slots.extend(caches);
        result
    }

    fn run(
        &self,
        caches: &mut [(usize, KvCache)],
        step: &Step,
        last: bool,
    ) -> Result<(), EngineError> {
        let (prev, next) = (self.group.prev(), self.group.next());
        let mlx = |e: mlxcel_core::Error| EngineError::backend("mlx", e);
        let io = |e: mlxcel_core::Error| {
            pipe_error(format!("exchanging with rank {prev} or {next}: {e}"))
        };
        let hidden = self.model.config().hidden_size;
        wait_for(&self.group, prev)?;
        let input = self
            .group
            .recv(&[step.tokens.len() as i32, hidden as i32], Dtype::F32, prev)
            .map_err(io)?;
        let firsts: Vec<usize> = step.seqs.iter().map(|s| s.first).collect();
        let mut start = 0;
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .zip(&step.seqs)
            .map(|((_, cache), s)| {
                let tokens = &step.tokens[start..start + s.n];
                start += s.n;
                ForwardSeq { cache, tokens }
            })
            .collect();
        let out = self
            .model
            .forward_stage(&mut seqs, Some(input), last.then_some(firsts.as_slice()))
            .map_err(mlx)?;
        if last {
            let width = out.shape().get(1).copied().unwrap_or(0);
            let header = Header::new(Kind::Rows, 0, step.rows() as i32, width);
            send_message(&self.group, header, &[], next)?;
        }
        let send = self.group.send(&out, next).map_err(io)?;
        self.model.finish_stage(&mut seqs, &[&send]).map_err(io)
    }
}
