//! A step's results turned into what requests see: a sampled token recorded for its sequence
//! (its text through the stop matcher, the end conditions) and the events reported for it.

use crate::request::{Event, FinishReason, RequestId, RequestStatus, TokenLogprob};

use super::sequence::Sequence;
use super::stats::SchedulerStats;

/// Records a step's result for one sequence: the chunk is now cached, and if it was the last
/// pending input, the next token is sampled (from `logits` already masked by its constraint:
/// `masked` is that outcome).
pub(super) fn advance(
    sequence: &mut Sequence,
    stats: &mut SchedulerStats,
    count: usize,
    mut logits: Vec<f32>,
    masked: Option<Result<(), String>>,
    events: &mut Vec<(RequestId, Event)>,
) {
    let was_prefill = sequence.computed < sequence.prompt_len;
    sequence.computed += count;
    if was_prefill {
        stats.prompt_tokens += count as u64;
    }
    if sequence.computed < sequence.tokens.len() {
        return;
    }
    let before = model_probabilities(sequence, &logits);
    if let Some(Err(message)) = masked {
        end_with_error(sequence, format!("structured output: {message}"), events);
        return;
    }
    let (token, _) = draw(sequence, &mut logits, None);
    let reported = reported_probabilities(sequence, before, token);
    emit(sequence, stats, token, reported, events);
}

/// The next token of `sequence` from `logits`: the one its reasoning budget forces, if it forces
/// one, else the sampler's draw; with a `proposed` token (speculation), also whether it is
/// accepted (a forced token accepts only itself).
pub(super) fn draw(
    sequence: &mut Sequence,
    logits: &mut [f32],
    proposed: Option<u32>,
) -> (u32, bool) {
    if let Some(forced) = sequence.budget.as_ref().and_then(|b| b.forced()) {
        sequence.forced_last = true;
        return (forced, proposed == Some(forced));
    }
    sequence.forced_last = false;
    match proposed {
        Some(proposed) => sequence.sampler.verify(logits, &sequence.tokens, proposed),
        None => (sequence.sampler.sample(logits, &sequence.tokens), false),
    }
}

/// The model's log-probabilities before sampling, when the request reports them (not the
/// sampler's: [`reported_probabilities`] reads those after the draw).
pub(super) fn model_probabilities(
    sequence: &Sequence,
    logits: &[f32],
) -> Option<(Vec<f32>, Vec<TokenLogprob>)> {
    match sequence.logprobs {
        Some(k) if !sequence.post_sampling_probs => Some(log_probabilities(logits, k)),
        _ => None,
    }
}

/// What the request reports for a sampled `token`: its log-probability and the most likely
/// alternatives, from the model's distribution (`before`) or, with post-sampling probabilities,
/// from the distribution the sampler drew it from.
pub(super) fn reported_probabilities(
    sequence: &Sequence,
    before: Option<(Vec<f32>, Vec<TokenLogprob>)>,
    token: u32,
) -> (f32, Vec<TokenLogprob>) {
    match (sequence.logprobs, before) {
        // A forced token was the only candidate.
        (Some(_), None) if sequence.post_sampling_probs && sequence.forced_last => (
            0.0,
            vec![TokenLogprob {
                token,
                logprob: 0.0,
            }],
        ),
        (Some(k), None) if sequence.post_sampling_probs => {
            let (chosen, top) = sequence.sampler.post_sampling_probs(token, k);
            let top = top
                .into_iter()
                .map(|(token, p)| TokenLogprob {
                    token,
                    logprob: p.ln() as f32,
                })
                .collect();
            (chosen.ln() as f32, top)
        }
        (_, Some((logprobs, top))) => (
            logprobs
                .get(token as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
            top,
        ),
        _ => (f32::NEG_INFINITY, Vec::new()),
    }
}

/// Records a sampled `token` for `sequence`: its text through the stop matcher, the end
/// conditions (stop token, stop string, constraint complete, budget, shape), and its event.
/// Returns whether the sequence finished (with an error too).
pub(super) fn emit(
    sequence: &mut Sequence,
    stats: &mut SchedulerStats,
    token: u32,
    (logprob, top_logprobs): (f32, Vec<TokenLogprob>),
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
            let mut piece = sequence.decoder.push(token);
            if let Some(budget) = &mut sequence.budget {
                budget.observe(token, !sequence.decoder.holds_partial_character());
            }
            // llama-server's n_indent: a line indented too little ends the output where its
            // indentation ends.
            if let Some(at) = sequence.indent.as_mut().and_then(|rule| rule.cut(&piece)) {
                piece.truncate(at);
                sequence.indent_stopped = true;
            }
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
                || sequence.indent_stopped
            {
                sequence.status = RequestStatus::FinishedLength;
            }
        }
        let logprob = sequence.logprobs.map(|_| TokenLogprob { token, logprob });
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

/// Ends `sequence` with an error event carrying `message`.
pub(super) fn end_with_error(
    sequence: &mut Sequence,
    message: String,
    events: &mut Vec<(RequestId, Event)>,
) {
    sequence.status = RequestStatus::FinishedError;
    events.push((
        sequence.id,
        finished_event(sequence, String::new(), Some(message)),
    ));
}

/// Reports finished `sequence`'s end, with what its decoder and stop matcher still held (an
/// ending error was reported when it happened).
pub(super) fn report_end(sequence: &mut Sequence, events: &mut Vec<(RequestId, Event)>) {
    let already_reported = sequence.status == RequestStatus::FinishedError;
    if !already_reported {
        let text = match sequence.status {
            // A completed stop string withholds everything after it.
            RequestStatus::FinishedStopped if sequence.stops.is_stopped() => String::new(),
            RequestStatus::FinishedCancelled => String::new(),
            _ => {
                // Past an indentation cut, what the decoder holds is past it too.
                let tail = if sequence.indent_stopped {
                    String::new()
                } else {
                    sequence.decoder.flush()
                };
                let mut text = sequence.stops.push(&tail).text;
                text.push_str(&sequence.stops.finish());
                text
            }
        };
        events.push((sequence.id, finished_event(sequence, text, None)));
    }
}

pub(super) fn finished_event(sequence: &Sequence, text: String, error: Option<String>) -> Event {
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
pub(super) fn log_probabilities(logits: &[f32], k: usize) -> (Vec<f32>, Vec<TokenLogprob>) {
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
