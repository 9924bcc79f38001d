//! Structured output in the scheduler: the vocabulary constraints compile against, and the
//! token masks applied to a step's logits after the forward pass, before sampling.

use std::sync::Arc;

use crate::constraint::Constraints;
use crate::error::EngineError;

use super::sequence::Sequence;

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

    pub(super) fn get(&self) -> Result<&Constraints, EngineError> {
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

/// Applies the structured-output masks of the step's constrained sequences that sample now,
/// on several threads when there are several (the forward pass is over: the cores are
/// free). Per scheduled entry: `None` when unconstrained or not sampling yet, else the
/// outcome.
pub(super) fn mask_constrained(
    running: &mut [Sequence],
    scheduled: &[(usize, usize)],
    logits: &mut [Vec<f32>],
) -> Vec<Option<Result<(), String>>> {
    let mut outcomes: Vec<Option<Result<(), String>>> = vec![None; scheduled.len()];
    let mut rows: Vec<Option<&mut Vec<f32>>> = logits.iter_mut().map(Some).collect();
    let mut jobs = Vec::new();
    for (position, sequence) in running.iter_mut().enumerate() {
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
