//! llama-server's `verbose` request field on the OpenAI routes: the answer carries `__verbose`,
//! the request as `/completion` would have answered it (the prompt the model ran after the chat
//! template, the text, the token counts, why it stopped, the timings and settings), for
//! debugging a template or a client.

use mlxcel_engine::{Engine, FinishReason};
use serde_json::{Value, json};

use crate::generate::{TokenRecord, Tracked};

/// What a `__verbose` object reports of a request beyond its tracking.
pub(super) struct Verbose<'a> {
    /// The prompt the model ran, as text (the chat template's output on a chat).
    pub prompt: &'a str,
    /// The whole generated text.
    pub content: &'a str,
    /// The last generated token (whether it ended the sequence).
    pub last_token: Option<u32>,
    pub reason: FinishReason,
    pub completion_tokens: usize,
    pub model: &'a str,
}

impl Verbose<'_> {
    /// The `__verbose` object, in `/completion`'s field names.
    pub fn value(&self, engine: &Engine, tracked: &Tracked) -> Value {
        let eos = self.reason == FinishReason::Stop
            && self
                .last_token
                .is_some_and(|t| engine.info().eos_token_ids.contains(&t));
        let stop_type = match self.reason {
            FinishReason::Length => "limit",
            FinishReason::Stop if eos => "eos",
            FinishReason::Stop => "word",
            _ => "none",
        };
        let prompt_n = tracked.prompt_tokens();
        json!({
            "index": 0,
            "content": self.content,
            "tokens": [],
            "id_slot": tracked.slot_id(),
            "stop": true,
            "model": self.model,
            "tokens_predicted": self.completion_tokens,
            "tokens_evaluated": prompt_n,
            "generation_settings": tracked.settings(),
            "prompt": self.prompt,
            "has_new_line": self.content.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": "",
            "tokens_cached": prompt_n + self.completion_tokens.saturating_sub(1),
            "timings": tracked.timings_object(self.completion_tokens),
        })
    }
}

/// The last token of a whole answer's records.
pub(super) fn last_token(tokens: &[TokenRecord]) -> Option<u32> {
    tokens.last().map(|t| t.token)
}
