//! Reasoning models: the reply split into its reasoning and its answer, as llama-server's
//! `reasoning_format` does, and the template variables that switch thinking on or off.
//!
//! - `think.rs`: the `<think>…</think>` form (Qwen3, DeepSeek-R1), also when the prompt already
//!   opened the block.
//! - `harmony.rs`: gpt-oss's channels (`analysis` is the reasoning, `final` the answer).
//! - `format.rs`: the format names (`reasoning_format`) and the forms models write.
//! - `split.rs`: what a splitter gives back.
//! - `fields.rs`: the request fields and server flags (`reasoning_format`,
//!   `chat_template_kwargs`, `reasoning_effort`, the reasoning budget) and the variables they
//!   give the chat template.
//! - `budget.rs`: the reasoning budget's count, tags and message, for the engine to force the
//!   end of a reasoning block with.
//!
//! A [`Splitter`] takes the reply's text piece by piece (a marker may be cut anywhere between
//! pieces) and gives back what is certain to be reasoning and answer so far; a whole reply is
//! the same pieces fed at once, so streamed and whole replies agree by construction.

mod budget;
mod fields;
mod format;
mod harmony;
mod split;
mod think;

use std::borrow::Cow;

use mlxcel_engine::Engine;

pub use budget::{BudgetFields, BudgetText, chat_budget, completion_budget};
pub use fields::{ReasoningDefaults, ReasoningFields, TemplateOptions, thinking_of_budget};
pub use format::{Form, ReasoningFormat};
use harmony::HarmonySplitter;
pub use split::{Split, SplitCall};
use think::ThinkSplitter;

#[derive(Debug)]
enum Kind {
    Think(ThinkSplitter),
    Harmony(HarmonySplitter),
}

/// Splits one reply into reasoning and answer.
#[derive(Debug)]
pub struct Splitter {
    kind: Kind,
    /// `deepseek-legacy`: the answer keeps the reply whole.
    legacy: bool,
}

impl Splitter {
    /// The splitter of a reply in `form` under `format`; `None` when the format leaves the reply
    /// whole.
    pub fn new(format: ReasoningFormat, form: Form) -> Option<Self> {
        if format == ReasoningFormat::None {
            return None;
        }
        let kind = match form {
            Form::Think { open } => Kind::Think(ThinkSplitter::new(open)),
            Form::Harmony => Kind::Harmony(HarmonySplitter::new()),
        };
        Some(Self {
            kind,
            legacy: format == ReasoningFormat::DeepseekLegacy && matches!(form, Form::Think { .. }),
        })
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        match &mut self.kind {
            Kind::Think(s) => s.push(text, &mut out),
            Kind::Harmony(s) => s.push(text, &mut out),
        }
        if self.legacy {
            out.content = text.to_owned();
        }
        out
    }

    /// Ends the reply: what was held back.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        match &mut self.kind {
            Kind::Think(s) => s.finish(&mut out),
            Kind::Harmony(s) => s.finish(&mut out),
        }
        if self.legacy {
            out.content.clear();
        }
        out
    }

    /// A whole reply, split.
    pub fn whole<'a>(mut self, pieces: impl IntoIterator<Item = &'a str>) -> Split {
        let mut all = Split::default();
        for piece in pieces {
            all.extend(self.push(piece));
        }
        all.extend(self.finish());
        all
    }
}

/// The markers a splitter reads that a tokenizer may hold as special tokens, which the engine's
/// text leaves out (as it leaves out every special token, end-of-sequence included).
const MARKERS: &[&str] = &[
    "<think>",
    "</think>",
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
];

/// The text of a generated token as a splitter reads it: the engine's text, or, for a special
/// token that is one of the [`MARKERS`], the marker.
pub fn marker_text<'a>(engine: &Engine, token: u32, text: &'a str) -> Cow<'a, str> {
    let tokenizer = engine.tokenizer();
    if text.is_empty() && tokenizer.is_dropped_by_decode(token, true) {
        let raw = tokenizer.decode(&[token], false).unwrap_or_default();
        if MARKERS.contains(&raw.as_str()) {
            return Cow::Owned(raw);
        }
    }
    Cow::Borrowed(text)
}

/// A finished reply split: its tokens' texts (each token id with its text; markers put back)
/// then the `text` past them (the tail the engine held back until the end).
pub fn split_reply<'a>(
    engine: &Engine,
    splitter: Splitter,
    tokens: impl Iterator<Item = (u32, &'a str)> + Clone,
    text: &'a str,
) -> Split {
    let streamed: usize = tokens.clone().map(|(_, piece)| piece.len()).sum();
    let pieces: Vec<Cow<'_, str>> = match text.get(streamed..) {
        Some(tail) => tokens
            .map(|(token, piece)| marker_text(engine, token, piece))
            .chain(std::iter::once(Cow::Borrowed(tail)))
            .collect(),
        // The tokens' texts are not the reply's start (never expected): the reply as one piece.
        None => vec![Cow::Borrowed(text)],
    };
    splitter.whole(pieces.iter().map(|p| p.as_ref()))
}

/// What a chat reply needs to split itself: the format asked for and the model's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningPlan {
    pub format: ReasoningFormat,
    pub form: Form,
}

impl ReasoningPlan {
    /// A fresh splitter for one reply (`None` with `reasoning_format: none`).
    pub fn splitter(&self) -> Option<Splitter> {
        Splitter::new(self.format, self.form)
    }

    /// A finished reply split as `plan` asks ([`split_reply`]); `None` where there is no plan
    /// or it splits nothing (`reasoning_format: none`).
    pub fn split<'a>(
        plan: Option<&Self>,
        engine: &Engine,
        tokens: impl Iterator<Item = (u32, &'a str)> + Clone,
        text: &'a str,
    ) -> Option<Split> {
        let splitter = plan.and_then(Self::splitter)?;
        Some(split_reply(engine, splitter, tokens, text))
    }
}

#[cfg(test)]
mod tests;
