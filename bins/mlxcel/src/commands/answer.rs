//! One completion streamed from a loaded model: its budget under `-c`, the request, the text on
//! stdout and the statistics lines on stderr. A single answer (`-p`) and each chat turn run here.

use std::cell::Cell;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mlxcel_engine::{
    BackendKind, ChatMessage, Engine, Event, FinishReason, GenerationRequest, MaxNewTokens,
    SamplingParams,
};

use super::options::Options;

/// ANSI colours of `--color`.
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// A loaded model with the run's settings, answering one prompt at a time.
pub struct Session<'a> {
    pub engine: &'a Engine,
    pub options: &'a Options,
    pub sampling: SamplingParams,
    /// `--grammar`, `-j` ...: what every answer must match.
    pub constraint: Option<mlxcel_engine::Constraint>,
    pub max_new_tokens: MaxNewTokens,
    pub system: Option<String>,
    /// `-c`: most positions a request may use (capped at the window); `None`: the window.
    pub context: Option<usize>,
    pub colour: bool,
    /// Whether the engine keeps the conversation's KV between requests (a chat): each
    /// answer's statistics then split its prompt into the tokens prefilled and those reused.
    pub reuses_prefixes: bool,
    /// Whether `-n -1`'s resolution was printed: once a session, not every turn.
    pub budget_shown: Cell<bool>,
}

/// What one completion produced.
pub struct Answer {
    /// The text printed.
    pub text: String,
    /// Every token sampled, in order (an end-of-sequence token included).
    pub tokens: Vec<u32>,
}

/// What prefilling a prompt without answering it cost ([`Session::prefill`]).
pub struct Prefilled {
    pub tokens: usize,
    pub reused: usize,
    pub time: Duration,
}

impl Session<'_> {
    pub fn system_messages(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .collect()
    }

    /// The prompt's tokens: through the chat template unless it is off.
    pub fn prompt_ids(&self, raw: &str, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        if !self.options.chat_template() {
            return Ok(self.engine.tokenize(raw)?);
        }
        Ok(self.engine.chat_prompt(messages)?)
    }

    /// `messages` through the chat template without the generation prompt (a conversation
    /// as it stands, to prefill before its next turn).
    pub fn conversation_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let template = self
            .engine
            .chat_template()
            .context("the model has no chat template")?;
        let text = template.render(messages, false)?;
        // Templates write their own special tokens; the tokenizer adds none.
        Ok(self.engine.tokenizer().encode(&text, false, true)?)
    }

    /// Prints `-n -1`'s resolution the first time only: the rule is the same every turn.
    fn show_budget(&self, line: &str) {
        if !self.budget_shown.replace(true) {
            self.stats(line);
        }
    }

    /// The budget of a request whose prompt is `prompt_len` tokens under `-c`: an explicit budget
    /// is honoured or refused, an unlimited one stops at the context.
    fn budget(&self, prompt_len: usize) -> Result<MaxNewTokens> {
        let Some(context) = self.context else {
            return Ok(self.max_new_tokens);
        };
        if prompt_len >= context {
            bail!(
                "the prompt's {prompt_len} tokens fill -c/--ctx-size {context}: raise -c (the \
                 window is {}), shorten the prompt, or /clear the conversation",
                self.engine.info().window
            );
        }
        let room = context - prompt_len;
        match self.max_new_tokens {
            MaxNewTokens::Unlimited => {
                self.show_budget(&format!(
                    "-n -1 resolved to {room} tokens (-c {context} - prompt {prompt_len}){}",
                    self.later_turns()
                ));
                Ok(MaxNewTokens::Limited(room))
            }
            MaxNewTokens::Limited(n) if n > room => bail!(
                "prompt {prompt_len} + -n {n} > -c/--ctx-size {context}: raise -c or lower -n"
            ),
            limited => Ok(limited),
        }
    }

    /// What the budget line adds in a chat, where it is printed for the first turn only.
    fn later_turns(&self) -> &'static str {
        if self.reuses_prefixes {
            "; each later answer may use what the conversation leaves"
        } else {
            ""
        }
    }

    /// A statistics line on stderr (dim with `--color`).
    pub fn stats(&self, line: &str) {
        if self.colour {
            eprintln!("{DIM}{line}{RESET}");
        } else {
            eprintln!("{line}");
        }
    }

    /// Computes `prompt`'s KV without answering (one token is sampled and dropped), so that the
    /// engine's prefix cache holds it for the next request: a loaded conversation is prefilled
    /// once, when it is loaded.
    pub fn prefill(&self, prompt: Vec<u32>) -> Result<Prefilled> {
        let tokens = prompt.len();
        if let Some(context) = self.context
            && tokens >= context
        {
            bail!(
                "the conversation's {tokens} tokens fill -c/--ctx-size {context}: raise -c (the \
                 window is {})",
                self.engine.info().window
            );
        }
        let mut request = GenerationRequest::new(prompt, MaxNewTokens::Limited(1));
        request.sampling = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        request.lora = self.options.lora.initial_scales();
        let started = Instant::now();
        let completion = self
            .engine
            .submit(request)?
            .collect_completion()
            .context("prefilling the conversation")?;
        Ok(Prefilled {
            tokens,
            reused: completion.usage.cached_tokens,
            time: started.elapsed(),
        })
    }

    /// Streams one completion to stdout; statistics go to stderr. `rendered`: how long rendering
    /// the conversation through the chat template and tokenizing it took (a chat turn renders
    /// the whole conversation), said after the prefill's time, which it is not part of.
    pub fn generate(&self, prompt: Vec<u32>, rendered: Option<Duration>) -> Result<Answer> {
        let prompt_len = prompt.len();
        let max_new_tokens = self.budget(prompt_len)?;
        if self.engine.info().backend == BackendKind::Xla {
            // The XLA backend sizes its static shape with the capacity resolver (the engine admits
            // exactly this plan): print the choice, or refuse with the resolver's numbers.
            let overrides = mlxcel_capacity::CapacityOverrides::from_env()?;
            let resolution = mlxcel_capacity::resolve_context_capacity(
                &mlxcel_capacity::Request::text(prompt_len, max_new_tokens),
                self.engine.info().window,
                overrides.pinned_capacity,
            )?;
            if let Some(line) = resolution.sizing_line() {
                self.stats(&line);
            }
        }
        let mut request = GenerationRequest::new(prompt, max_new_tokens);
        request.sampling = self.sampling.clone();
        request.constraint = self.constraint.clone();
        request.stop = self.options.stops();
        request.lora = self.options.lora.initial_scales();

        let started = Instant::now();
        let mut stream = self.engine.submit(request)?;
        if max_new_tokens == MaxNewTokens::Unlimited
            && self.engine.info().backend != BackendKind::Xla
            && let Some(plan) = self.engine.plan(stream.id())?
        {
            let window = self.engine.info().window;
            let room = window.saturating_sub(prompt_len);
            let bound = if plan.admitted_max_new_tokens < room {
                "the KV budget, --kv-budget".to_owned()
            } else {
                format!("window {window} - prompt {prompt_len}")
            };
            self.show_budget(&format!(
                "-n -1 resolved to {} tokens ({bound}){}",
                plan.admitted_max_new_tokens,
                self.later_turns()
            ));
        }
        let mut first_token_at = None;
        let mut text = String::new();
        let mut tokens = Vec::new();
        let mut stdout = std::io::stdout().lock();
        let mut outcome = None;
        for event in stream.by_ref() {
            match event {
                Event::Token {
                    token, text: piece, ..
                } => {
                    first_token_at.get_or_insert_with(Instant::now);
                    tokens.push(token);
                    stdout.write_all(piece.as_bytes())?;
                    stdout.flush()?;
                    text.push_str(&piece);
                }
                Event::Finished {
                    reason,
                    text: piece,
                    usage,
                    error,
                } => {
                    stdout.write_all(piece.as_bytes())?;
                    writeln!(stdout)?;
                    text.push_str(&piece);
                    outcome = Some((reason, usage, error));
                }
            }
        }
        let (reason, usage, error) = outcome.context("the engine stopped mid-request")?;
        if let (FinishReason::Error, Some(message)) = (reason, error) {
            bail!("generation failed: {message}");
        }
        let end = Instant::now();
        let first = first_token_at.unwrap_or(end);
        let prompt_secs = (first - started).as_secs_f64();
        let decode_secs = (end - first).as_secs_f64();
        let decoded = usage.completion_tokens.saturating_sub(1);
        let reused = usage.cached_tokens;
        let rendering = rendered.map_or_else(String::new, |time| {
            format!(
                "; conversation rendered and tokenized in {:.1} ms",
                time.as_secs_f64() * 1e3
            )
        });
        if self.reuses_prefixes {
            let new = prompt_len.saturating_sub(reused);
            self.stats(&format!(
                "prompt: {prompt_len} tokens, prefill {new} new tokens ({reused} reused) in \
                 {prompt_secs:.3}s = {:.1} tok/s{rendering}",
                rate(new, prompt_secs)
            ));
        } else {
            self.stats(&format!(
                "prompt: {prompt_len} tokens in {prompt_secs:.2}s = {:.1} tok/s{rendering}",
                rate(prompt_len, prompt_secs)
            ));
        }
        // Greedy decoding draws nothing, so a seed would mean nothing: say which it was.
        let decoding = match self.sampling.seed {
            _ if self.sampling.temperature <= 0.0 => "greedy".to_owned(),
            Some(seed) => format!("seed {seed}"),
            None => "seed random".to_owned(),
        };
        let stats = self.engine.stats();
        let speculation = if stats.drafted_tokens > 0 {
            format!(
                "; speculative: {}/{} proposals accepted ({:.0}%), {:.2} tokens per verification \
                 pass",
                stats.accepted_tokens,
                stats.drafted_tokens,
                100.0 * stats.accepted_tokens as f64 / stats.drafted_tokens as f64,
                (stats.drafts + stats.accepted_tokens) as f64 / stats.drafts.max(1) as f64
            )
        } else {
            String::new()
        };
        self.stats(&format!(
            "Generated {} tokens in {:.2}s = {:.1} tok/s (finish: {}; {decoding}{speculation})",
            usage.completion_tokens,
            prompt_secs + decode_secs,
            rate(decoded, decode_secs),
            reason.as_str(),
        ));
        Ok(Answer { text, tokens })
    }
}

pub fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}
