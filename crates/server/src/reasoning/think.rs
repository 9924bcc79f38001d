//! The `<think>…</think>` form (Qwen3, DeepSeek-R1 and its distills, SmolLM3): a reply that
//! opens with `<think>` (or whose prompt already opened it) reasons until `</think>`, then
//! answers. Text arrives in pieces that may cut a tag anywhere, so whatever could still become a
//! tag is held back until the next piece decides it.

use super::split::{Split, partial_tag};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first visible text: it may still open a thinking block.
    Start,
    /// Inside the thinking block; `started` once its leading whitespace is past.
    Thinking { started: bool },
    /// The answer; `started` once the whitespace after `</think>` is past.
    Answer { started: bool },
}

/// Splits one reply of the `<think>` form, piece by piece.
#[derive(Debug)]
pub(super) struct ThinkSplitter {
    state: State,
    held: String,
}

impl ThinkSplitter {
    /// A splitter for a reply that starts inside the thinking block when `open` (the prompt
    /// ended with `<think>`), else one that may open it.
    pub(super) fn new(open: bool) -> Self {
        Self {
            state: if open {
                State::Thinking { started: false }
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    pub(super) fn push(&mut self, text: &str, out: &mut Split) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let visible = self.held.trim_start();
                    if let Some(rest) = visible.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Thinking { started: false };
                    } else if OPEN.starts_with(visible) {
                        return; // nothing visible yet, or a cut `<think>`
                    } else {
                        self.state = State::Answer { started: true };
                    }
                }
                State::Thinking { started } => {
                    if !started {
                        let visible = self.held.trim_start();
                        if visible.is_empty() {
                            self.held.clear();
                            return;
                        }
                        self.held = visible.to_owned();
                        self.state = State::Thinking { started: true };
                    }
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning.push_str(self.held[..at].trim_end());
                        self.held = self.held[at + CLOSE.len()..].to_owned();
                        self.state = State::Answer { started: false };
                        continue;
                    }
                    // Trailing whitespace waits: it is dropped if `</think>` follows it.
                    let body = self.held.len() - partial_tag(&self.held, CLOSE);
                    let sent = self.held[..body].trim_end().len();
                    out.reasoning.push_str(&self.held[..sent]);
                    self.held.drain(..sent);
                    return;
                }
                State::Answer { started } => {
                    if !started {
                        let visible = self.held.trim_start();
                        if visible.is_empty() {
                            self.held.clear();
                            return;
                        }
                        self.held = visible.to_owned();
                        self.state = State::Answer { started: true };
                    }
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return;
                }
            }
        }
    }

    /// What is still held when the reply ends: an unterminated thinking block is reasoning, a
    /// cut `<think>` that never completed is the answer's text.
    pub(super) fn finish(&mut self, out: &mut Split) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start => out.content.push_str(&held),
            State::Thinking { .. } => out.reasoning.push_str(held.trim_end()),
            State::Answer { .. } => out.content.push_str(&held),
        }
    }
}
