//! Rank 0's end of the pipe: it plans the split, greets the workers, and runs each engine step
//! through every stage: its own layers, then the hidden states down the pipe, then the rows
//! that leave the step back from the last rank.

use std::ops::Range;

use mlxcel_core::distributed::Group;
use mlxcel_core::{Dtype, ForwardSeq, KvType, LlamaModel, Stage};
use mlxcel_model::{Checkpoint, ModelConfig};

use super::link::{pipe_error, recv_message, send_message, wait_for};
use super::plan::{WeightBytes, split_by_bytes, split_by_counts, split_micro_batches};
use super::ring::{fingerprint, join_pipeline};
use super::wire::{FailReason, Header, Hello, Kind, SlotOp, Step, StepSeq, VERSION};
use crate::error::EngineError;
use crate::options::PipelineOptions;

/// Rank 0's connection to the other stages.
#[derive(Debug)]
pub(crate) struct Pipe {
    group: Group,
    /// One past each rank's last layer.
    ends: Vec<usize>,
    /// Slot operations since the last step, sent with the next one.
    ops: Vec<SlotOp>,
    /// Why the pipeline is down, once a rank was lost: every later step fails with it.
    down: Option<String>,
    vocab: usize,
    hidden: usize,
    /// Most micro-batches a step is split into.
    micro_batches: usize,
}

impl Pipe {
    /// Joins the ring as rank 0, splits the layers and sends every rank its range; returns the
    /// pipe and rank 0's own stage. The workers load while rank 0 does; [`Pipe::await_ready`]
    /// waits for them.
    pub(crate) fn open(
        checkpoint: &Checkpoint,
        options: &PipelineOptions,
    ) -> Result<(Pipe, Stage), EngineError> {
        let group = join_pipeline(options)?;
        if group.rank() != 0 {
            return Err(pipe_error(format!(
                "rank {} runs a stage worker, not the engine",
                group.rank()
            )));
        }
        let config = checkpoint.config();
        let layers = config.num_hidden_layers;
        let ends = match &options.layers {
            Some(counts) => split_by_counts(counts, layers, group.size()),
            None => split_by_bytes(&WeightBytes::of(checkpoint), group.size()),
        }
        .map_err(pipe_error)?;
        let stage = Stage::of_pipeline(config, &ends, 0).map_err(pipe_error)?;
        let hello = Hello {
            version: VERSION,
            fingerprint: fingerprint(checkpoint),
            ends: ends.clone(),
        };
        send_message(
            &group,
            Header::new(Kind::Hello, 0, 0, 0),
            &hello.encode(),
            group.next(),
        )?;
        let ranks = group.size();
        let pipe = Pipe {
            group,
            ends,
            ops: Vec::new(),
            down: None,
            vocab: config.vocab_size,
            hidden: config.hidden_size,
            micro_batches: options.micro_batches.unwrap_or(ranks).max(1),
        };
        Ok((pipe, stage))
    }

    /// Waits until every worker has loaded its layers; their refusal otherwise, naming the
    /// rank and why.
    pub(crate) fn await_ready(&mut self) -> Result<(), EngineError> {
        let (header, _) = recv_message(&self.group, self.group.prev())?;
        match header.kind {
            Kind::Ready => Ok(()),
            Kind::Fail => {
                self.down = Some(format!("rank {} refused to join", header.a));
                Err(pipe_error(format!(
                    "rank {} refused the pipeline: {}",
                    header.a,
                    FailReason::from_i32(header.b)
                )))
            }
            other => Err(pipe_error(format!(
                "rank {} answered the greeting with {other:?}",
                self.group.prev()
            ))),
        }
    }

    /// The split, for logs: each rank's layers.
    pub(crate) fn describe(&self) -> String {
        let mut first = 0;
        let ranges: Vec<String> = self
            .ends
            .iter()
            .enumerate()
            .map(|(rank, &end)| {
                let r = format!("rank {rank}: layers {first}..{end}");
                first = end;
                r
            })
            .collect();
        ranges.join(", ")
    }

    /// The most KV bytes per position, and the most recurrent-state bytes per sequence, any
    /// rank's caches take (what KV memory is budgeted by: [`Stage::cache_bytes`]).
    pub(crate) fn most_cache_bytes(
        &self,
        config: &ModelConfig,
        kv_types: (KvType, KvType),
    ) -> (usize, usize) {
        (0..self.ends.len())
            .filter_map(|rank| Stage::of_pipeline(config, &self.ends, rank).ok())
            .map(|stage| stage.cache_bytes(config, kv_types))
            .fold((0, 0), |(p, s), (bp, bs)| (p.max(bp), s.max(bs)))
    }

    /// Queues a slot operation for every other rank (sent with the next step).
    pub(crate) fn queue(&mut self, op: SlotOp) {
        self.ops.push(op);
    }

    /// Why the pipeline is down, once it is.
    pub(crate) fn fault(&self) -> Option<&str> {
        self.down.as_deref()
    }

    /// Runs one step through every stage: `seqs` are rank 0's caches and the step's tokens,
    /// `slots` their slots, `firsts` each sequence's first returned row. Returns the rows'
    /// logits in order. A lost rank fails this step and every later one.
    ///
    /// A step of several sequences goes down the pipe as micro-batches (about as many tokens
    /// each, [`split_micro_batches`]): rank 0 sends the first and computes the second while
    /// rank 1 computes the first, and so on, so that the ranks work at once instead of in turn.
    /// Each micro-batch is a step of its own to the workers; the slot operations go with the
    /// first.
    pub(crate) fn step(
        &mut self,
        model: &LlamaModel,
        seqs: &mut [ForwardSeq<'_>],
        slots: &[usize],
        firsts: &[usize],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        if let Some(reason) = &self.down {
            return Err(pipe_error(format!(
                "the pipeline is down ({reason}); restart every rank"
            )));
        }
        let tokens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        let parts = split_micro_batches(&tokens, self.micro_batches);
        let mut steps = Vec::with_capacity(parts.len());
        let mut hiddens = Vec::with_capacity(parts.len());
        // The graphs first: a step refused here (a token outside the vocabulary) sent nothing.
        for (k, range) in parts.iter().enumerate() {
            let part = &mut seqs[range.clone()];
            steps.push(Step {
                ops: if k == 0 { self.ops.clone() } else { Vec::new() },
                seqs: part
                    .iter()
                    .zip(&slots[range.clone()])
                    .zip(&firsts[range.clone()])
                    .map(|((s, &slot), &first)| StepSeq {
                        slot,
                        start: s.cache.len(),
                        n: s.tokens.len(),
                        first,
                    })
                    .collect(),
                tokens: part.iter().flat_map(|s| s.tokens.iter().copied()).collect(),
            });
            let hidden = model
                .forward_stage(part, None, None)
                .map_err(|e| EngineError::backend("mlx", e))?;
            hiddens.push(hidden);
        }
        self.ops.clear();
        let result = self.exchange(model, seqs, &parts, &steps, &hiddens);
        if let Err(e) = &result {
            self.down = Some(e.to_string());
        }
        result
    }

    /// Sends every micro-batch down the pipe (the workers start on the first while this rank
    /// computes the next), then gathers their rows from the last rank in order.
    fn exchange(
        &self,
        model: &LlamaModel,
        seqs: &mut [ForwardSeq<'_>],
        parts: &[Range<usize>],
        steps: &[Step],
        hiddens: &[mlxcel_core::Array],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let (next, prev) = (self.group.next(), self.group.prev());
        for ((range, step), hidden) in parts.iter().zip(steps).zip(hiddens) {
            let header = Header::new(Kind::Step, 0, step.tokens.len() as i32, 0);
            send_message(&self.group, header, &step.encode(), next)?;
            let send = self
                .group
                .send(hidden, next)
                .map_err(|e| pipe_error(format!("sending to rank {next}: {e}")))?;
            model
                .finish_stage(&mut seqs[range.clone()], &[&send])
                .map_err(|e| pipe_error(format!("sending to rank {next}: {e}")))?;
        }
        // With a tied table rank 0 projects (the last rank sends normed rows), else logits come.
        let tied = model.stage().head;
        let width = if tied { self.hidden } else { self.vocab };
        let mut out = Vec::with_capacity(steps.iter().map(Step::rows).sum());
        for step in steps {
            let (answer, _) = recv_message(&self.group, prev)?;
            let rows = step.rows();
            if answer.kind != Kind::Rows || answer.a as usize != rows || answer.b as usize != width
            {
                return Err(pipe_error(format!(
                    "rank {prev} answered a step of {rows} rows of {width} with {answer:?}"
                )));
            }
            let io = |e: mlxcel_core::Error| pipe_error(format!("receiving from rank {prev}: {e}"));
            wait_for(&self.group, prev)?;
            let got = self
                .group
                .recv(&[rows as i32, width as i32], Dtype::F32, prev)
                .map_err(io)?;
            let logits = if tied {
                model
                    .project_rows(&got)
                    .map_err(|e| EngineError::backend("mlx", e))?
            } else {
                got.to_rows_f32(self.vocab).map_err(io)?
            };
            out.extend(logits);
        }
        Ok(out)
    }
}

impl Drop for Pipe {
    /// Tells the workers to exit (they exit 0), unless the pipeline is down already.
    fn drop(&mut self) {
        if self.down.is_none() {
            let _ = send_message(
                &self.group,
                Header::new(Kind::Shutdown, 0, 0, 0),
                &[],
                self.group.next(),
            );
        }
    }
}
