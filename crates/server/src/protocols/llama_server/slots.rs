//! `GET /slots`: the `--parallel` slots and the requests holding them.

use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::body::{Body, json};
use crate::error::ApiError;
use crate::state::AppState;

/// One entry of `/slots`: a request holding the slot, or an idle slot.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Slot {
    Busy {
        id: usize,
        id_task: u64,
        n_ctx: usize,
        speculative: bool,
        is_processing: bool,
        params: serde_json::Value,
        /// The prompt, as text.
        prompt: String,
        /// The text generated so far.
        generated: String,
        n_prompt_tokens: usize,
        /// Prompt tokens this request's prefill has computed so far.
        n_prompt_tokens_processed: usize,
        /// Prompt tokens the prefix cache held.
        n_prompt_tokens_cache: usize,
        next_token: NextToken,
        t_elapsed_ms: f64,
    },
    Idle {
        id: usize,
        /// -1: no task.
        id_task: i64,
        n_ctx: usize,
        speculative: bool,
        is_processing: bool,
    },
}

#[derive(Debug, Serialize)]
struct NextToken {
    has_next_token: bool,
    /// Whether the generated text has a newline yet.
    has_new_line: bool,
    /// Tokens left in the budget; -1: unlimited.
    n_remain: i64,
    n_decoded: usize,
}

/// Whether a query string (`a=1&b`) sets `name` to a non-empty value, as llama-server reads
/// its `/slots` flags.
fn query_flag(query: &str, name: &str) -> bool {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| key == name && !value.is_empty())
}

/// `GET /slots`: one entry per `--parallel` slot, by a stable id a request holds from
/// submission to its end (requests beyond `--parallel` wait in the engine's queue without one,
/// as llama-server's deferred tasks do); 501 with `--no-slots`, as llama-server answers.
/// `?fail_on_no_slot=1` answers 503 while no slot is idle.
pub fn slots(state: &AppState, query: &str) -> Result<Response<Body>, ApiError> {
    if !state.config().slots {
        return Err(ApiError::NotImplemented(
            "This server does not support slots endpoint. Start it with `--slots`".into(),
        ));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        if key != "fail_on_no_slot" {
            return Err(ApiError::invalid_param(
                key,
                format!(
                    "GET /slots?{key}: unknown query parameter (this server reads \
                     fail_on_no_slot; slots are saved and restored with POST /slots/{{id}}?action=)"
                ),
            ));
        }
    }
    let engine = state.engine()?;
    let n_ctx = state.context_limit(engine.info());
    let speculative = engine.default_speculative().is_some();
    let active = state.active_requests();
    let progress = engine.metrics().running_requests;
    let parallel = state.config().parallel;
    if query_flag(query, "fail_on_no_slot")
        && active.iter().filter(|r| r.slot.is_some()).count() >= parallel
    {
        return Err(ApiError::NoSlotAvailable);
    }
    let slots: Vec<Slot> = (0..parallel)
        .map(|id| match active.iter().find(|r| r.slot == Some(id)) {
            Some(request) => Slot::Busy {
                id,
                id_task: request.request_id,
                n_ctx,
                speculative,
                is_processing: true,
                params: request.params.clone(),
                prompt: engine
                    .tokenizer()
                    .decode(&request.prompt, false)
                    .unwrap_or_default(),
                generated: request.text.clone(),
                n_prompt_tokens: request.prompt_tokens,
                n_prompt_tokens_processed: progress
                    .iter()
                    .find(|p| p.id == request.request_id)
                    .map_or(0, |p| p.prompt_processed),
                n_prompt_tokens_cache: progress
                    .iter()
                    .find(|p| p.id == request.request_id)
                    .map_or(0, |p| p.prompt_cached),
                next_token: NextToken {
                    has_next_token: true,
                    has_new_line: request.text.contains('\n'),
                    n_remain: request
                        .budget
                        .map_or(-1, |b| b.saturating_sub(request.generated) as i64),
                    n_decoded: request.generated,
                },
                t_elapsed_ms: request.started.elapsed().as_secs_f64() * 1e3,
            },
            None => Slot::Idle {
                id,
                id_task: -1,
                n_ctx,
                speculative,
                is_processing: false,
            },
        })
        .collect();
    Ok(json(StatusCode::OK, &slots))
}
