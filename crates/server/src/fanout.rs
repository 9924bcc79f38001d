//! Several generations answered as one request, as llama-server answers a list of prompts or
//! `n` > 1 completions: each runs through the one handler ([`crate::handler::generate`]) at
//! once, then their answers are joined. Not streamed, the OpenAI routes join their choices into
//! the first answer (usage counting every completion, each prompt once) and `/completion`
//! answers a list; streamed, the events of every generation are interleaved as they come, each
//! with its `index`, and one `data: [DONE]` ends the stream where the route ends with one.

use std::sync::Arc;

use bytes::Bytes;
use hyper::{Response, StatusCode};
use mlxcel_engine::Engine;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::body::{Body, StreamSender, event_stream, json};
use crate::error::ApiError;
use crate::handler::{Prepared, Reply, generate};
use crate::request::Generation;
use crate::state::AppState;

/// How the answers of several generations become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// OpenAI's shape: one answer whose `choices` are every generation's, `index` 0..n-1.
    Choices,
    /// llama-server's `/completion`: a list of answers, each with its `index`.
    List,
}

/// One generation of a request and the prompt it completes (generations of the same prompt
/// count its tokens once in a joined usage).
#[derive(Debug)]
pub(crate) struct Part {
    pub generation: Generation,
    pub prompt: usize,
}

/// The parts of a request that asks for `n` completions of each of `generations`, in llama-server's
/// order (every completion of the first prompt, then of the next): a completion after the first
/// of a prompt runs in any slot (`id_slot` is the first's alone) and, where the request set a
/// seed, with that seed plus its place among them, so that the completions differ as there.
pub(crate) fn parts(generations: Vec<Generation>, n: usize) -> Vec<Part> {
    let n = n.max(1);
    let mut parts = Vec::with_capacity(generations.len() * n);
    for (prompt, generation) in generations.into_iter().enumerate() {
        for j in 1..n {
            let mut child = generation.clone();
            child.params.id_slot = None;
            if let Some(seed) = child.params.sampling.seed.filter(|&s| s >= 0) {
                child.params.sampling.seed = Some(seed.wrapping_add(j as i64));
            }
            parts.push(Part {
                generation: child,
                prompt,
            });
        }
        let at = parts.len() + 1 - n;
        parts.insert(at, Part { generation, prompt });
    }
    parts
}

/// Aborts the generations still running when the request is dropped or fails.
struct Running(Vec<JoinHandle<Result<Response<Body>, ApiError>>>);

impl Drop for Running {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

/// Runs every part (a single part is answered as the route answers one request) and joins the
/// answers as `join` says; `reply` builds the reply of the part at an index.
pub(crate) async fn generate_all<R, F>(
    state: &Arc<AppState>,
    engine: &Arc<Engine>,
    mut parts: Vec<Part>,
    join: Join,
    reply: F,
) -> Result<Response<Body>, ApiError>
where
    R: Reply,
    F: Fn(usize, Prepared) -> R + Send + Sync + 'static,
{
    if parts.len() == 1 {
        let part = parts.remove(0);
        return generate(state, engine, part.generation, |prepared| {
            reply(0, prepared)
        })
        .await;
    }
    let streamed = parts.first().is_some_and(|p| p.generation.stream);
    let groups: Vec<usize> = parts.iter().map(|p| p.prompt).collect();
    let reply = Arc::new(reply);
    let mut running = Running(Vec::with_capacity(parts.len()));
    for (i, part) in parts.into_iter().enumerate() {
        let (state, engine, reply) = (state.clone(), engine.clone(), reply.clone());
        running.0.push(tokio::spawn(async move {
            generate(&state, &engine, part.generation, |prepared| {
                reply(i, prepared)
            })
            .await
        }));
    }
    let mut bodies = Vec::with_capacity(running.0.len());
    for handle in &mut running.0 {
        let response = handle
            .await
            .map_err(|err| ApiError::Internal(format!("a generation task failed: {err}")))??;
        bodies.push(response.into_body());
    }
    if streamed {
        let receivers = bodies
            .into_iter()
            .map(|body| match body {
                Body::Channel(rx) => Ok(rx),
                Body::Full(_) => Err(ApiError::Internal("a stream answered whole".into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (response, sender) = event_stream();
        tokio::spawn(interleave(receivers, sender, join));
        return Ok(response);
    }
    let mut answers = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.into_iter().enumerate() {
        let Body::Full(Some(bytes)) = body else {
            return Err(ApiError::Internal("an answer came as a stream".into()));
        };
        let mut value: Value = serde_json::from_slice(&bytes)
            .map_err(|err| ApiError::Internal(format!("an answer is not JSON: {err}")))?;
        set_index(&mut value, i, join);
        answers.push(value);
    }
    let joined = match join {
        Join::List => Value::Array(answers),
        Join::Choices => join_choices(answers, &groups),
    };
    Ok(json(StatusCode::OK, &joined))
}

/// Sets the index of an answer or event: of each choice in OpenAI's shape, of the object in
/// llama-server's.
fn set_index(value: &mut Value, index: usize, join: Join) {
    match join {
        Join::Choices => {
            if let Some(choices) = value.get_mut("choices").and_then(Value::as_array_mut) {
                for choice in choices {
                    choice["index"] = index.into();
                }
            }
        }
        Join::List => {
            if let Some(object) = value.as_object_mut() {
                object.insert("index".into(), index.into());
            }
        }
    }
}

/// The first answer with every answer's choices, and a usage that counts every completion's
/// tokens and each prompt's once (`groups[i]` is the prompt of answer `i`).
fn join_choices(answers: Vec<Value>, groups: &[usize]) -> Value {
    let mut answers = answers.into_iter();
    let Some(mut first) = answers.next() else {
        return Value::Null;
    };
    let mut counted = vec![groups.first().copied().unwrap_or(0)];
    for (i, answer) in answers.enumerate() {
        let choices = answer.get("choices").and_then(Value::as_array).cloned();
        if let (Some(all), Some(more)) = (
            first.get_mut("choices").and_then(Value::as_array_mut),
            choices,
        ) {
            all.extend(more);
        }
        let group = groups.get(i + 1).copied().unwrap_or(0);
        let new_prompt = !counted.contains(&group);
        counted.push(group);
        if let (Some(total), Some(usage)) = (first.get_mut("usage"), answer.get("usage")) {
            add_usage(total, usage, new_prompt);
        }
    }
    first
}

/// Adds `usage`'s completion tokens (and prompt tokens when `prompt`) to `total`.
fn add_usage(total: &mut Value, usage: &Value, prompt: bool) {
    let count = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64).unwrap_or(0);
    let completion = count(total, "completion_tokens") + count(usage, "completion_tokens");
    let mut prompt_tokens = count(total, "prompt_tokens");
    if prompt {
        prompt_tokens += count(usage, "prompt_tokens");
    }
    total["completion_tokens"] = completion.into();
    total["prompt_tokens"] = prompt_tokens.into();
    total["total_tokens"] = (completion + prompt_tokens).into();
}

/// The end of an OpenAI stream, which the joined stream sends once, after every generation.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// Forwards the events of every generation to `sender` as they come, each with its index (and,
/// in OpenAI's shape, the first generation's `id`); a client that goes drops every generation.
async fn interleave(receivers: Vec<mpsc::Receiver<Bytes>>, sender: StreamSender, join: Join) {
    let (tx, mut rx) = mpsc::channel::<(usize, Bytes)>(64);
    for (i, mut child) in receivers.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    chunk = child.recv() => match chunk {
                        Some(chunk) => if tx.send((i, chunk)).await.is_err() { return },
                        None => return,
                    },
                    _ = tx.closed() => return,
                }
            }
        });
    }
    drop(tx);
    let mut done = false;
    let mut first_id: Option<Value> = None;
    while let Some((i, chunk)) = rx.recv().await {
        if chunk.as_ref() == DONE {
            done = true;
            continue;
        }
        if !sender.raw(relabel(&chunk, i, join, &mut first_id)).await {
            return;
        }
    }
    if done {
        let _ = sender.raw(String::from_utf8_lossy(DONE).into_owned()).await;
    }
}

/// One server-sent event with its data's index set (and its `id` the first generation's); an
/// event whose data is not JSON passes as it is.
fn relabel(chunk: &[u8], index: usize, join: Join, first_id: &mut Option<Value>) -> String {
    let text = String::from_utf8_lossy(chunk);
    let Some(at) = text.find("data: ") else {
        return text.into_owned();
    };
    let (head, data) = text.split_at(at + "data: ".len());
    let Ok(mut value) = serde_json::from_str::<Value>(data.trim_end()) else {
        return text.into_owned();
    };
    set_index(&mut value, index, join);
    if join == Join::Choices
        && let Some(id) = value.get_mut("id")
    {
        match first_id {
            Some(first) => *id = first.clone(),
            None => *first_id = Some(id.clone()),
        }
    }
    format!("{head}{value}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn choices_join_with_their_index_and_usage_counts_each_prompt_once() {
        let answer = |text: &str, prompt: u64, completion: u64| {
            json!({"id": "a", "choices": [{"index": 0, "text": text}],
                   "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}})
        };
        let mut answers = vec![answer("x", 5, 3), answer("y", 5, 4), answer("z", 7, 2)];
        for (i, a) in answers.iter_mut().enumerate() {
            set_index(a, i, Join::Choices);
        }
        let joined = join_choices(answers, &[0, 0, 1]);
        let indices: Vec<u64> = joined["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect();
        assert_eq!(indices, [0, 1, 2]);
        assert_eq!(joined["choices"][2]["text"], "z");
        assert_eq!(joined["usage"]["prompt_tokens"], 12);
        assert_eq!(joined["usage"]["completion_tokens"], 9);
        assert_eq!(joined["usage"]["total_tokens"], 21);
    }

    #[test]
    fn events_are_relabelled_and_other_lines_pass() {
        let mut first = None;
        let a = relabel(
            b"data: {\"id\":\"one\",\"choices\":[{\"index\":0}]}\n\n",
            0,
            Join::Choices,
            &mut first,
        );
        assert!(a.contains("\"one\""), "{a}");
        let b = relabel(
            b"data: {\"id\":\"two\",\"choices\":[{\"index\":0}]}\n\n",
            1,
            Join::Choices,
            &mut first,
        );
        let value: Value = serde_json::from_str(b.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(value["id"], "one");
        assert_eq!(value["choices"][0]["index"], 1);
        let named = relabel(
            b"event: x\ndata: {\"index\":0}\n\n",
            3,
            Join::List,
            &mut first,
        );
        assert_eq!(named, "event: x\ndata: {\"index\":3}\n\n");
        assert_eq!(
            relabel(b": ping\n\n", 1, Join::List, &mut first),
            ": ping\n\n"
        );
    }

    #[test]
    fn parts_follow_llama_servers_order_and_seeds() {
        let generation = |seed: Option<i64>| {
            let mut params = crate::request::Params {
                id_slot: Some(0),
                ..Default::default()
            };
            params.sampling.seed = seed;
            Generation {
                prompt: crate::request::Prompt::Input(crate::request::PromptInput::Text(
                    "p".into(),
                )),
                params,
                stream: false,
            }
        };
        let parts = parts(vec![generation(Some(10)), generation(None)], 3);
        let seen: Vec<(usize, Option<i64>, Option<usize>)> = parts
            .iter()
            .map(|p| {
                (
                    p.prompt,
                    p.generation.params.sampling.seed,
                    p.generation.params.id_slot,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (0, Some(10), Some(0)),
                (0, Some(11), None),
                (0, Some(12), None),
                (1, None, Some(0)),
                (1, None, None),
                (1, None, None),
            ]
        );
    }
}
