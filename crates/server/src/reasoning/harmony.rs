//! gpt-oss's harmony form: the reply is a run of messages, each a header
//! (`<|start|>assistant<|channel|>NAME …`) then `<|message|>` and a body ended by `<|end|>`,
//! `<|return|>` or `<|call|>`. The `analysis` channel is the reasoning, `final` the answer, and
//! `commentary` (the preambles gpt-oss writes around tool calls) the answer's text too. The
//! markers are special tokens, which the engine's text leaves out; the server puts them back
//! ([`super::marker_text`]) so that this splitter sees them.

use super::split::{Split, partial_tag};

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
/// What ends a message's body: its end markers, and the markers that begin the next header
/// (a model that leaves out `<|end|>`).
const BODY_ENDS: &[(&str, bool)] = &[
    ("<|end|>", true),
    ("<|return|>", true),
    ("<|call|>", true),
    ("<|start|>", false),
    ("<|channel|>", false),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Inside a body; `reasoning` on the analysis channel.
    Body { reasoning: bool },
    /// A reply that did not begin with a harmony header: all of it is the answer.
    Plain,
}

/// Splits one reply of the harmony form, piece by piece.
#[derive(Debug)]
pub(super) struct HarmonySplitter {
    state: State,
    held: String,
    /// Whether a header has been read: until then, text that is not a marker means the reply is
    /// not in the harmony form.
    seen_header: bool,
}

/// The channel a header names (`<|channel|>analysis`, `<|channel|>commentary to=functions.f`).
fn channel(header: &str) -> &str {
    header
        .rfind(CHANNEL)
        .map(|at| &header[at + CHANNEL.len()..])
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next())
        .unwrap_or("")
}

impl HarmonySplitter {
    pub(super) fn new() -> Self {
        Self {
            state: State::Header,
            held: String::new(),
            seen_header: false,
        }
    }

    pub(super) fn push(&mut self, text: &str, out: &mut Split) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Header => {
                    if let Some(at) = self.held.find(MESSAGE) {
                        let reasoning = channel(&self.held[..at]) == "analysis";
                        self.held.drain(..at + MESSAGE.len());
                        self.seen_header = true;
                        self.state = State::Body { reasoning };
                        continue;
                    }
                    let visible = self.held.trim_start();
                    let may_be_marker = visible.starts_with("<|") || "<|".starts_with(visible);
                    if !self.seen_header && !may_be_marker {
                        self.state = State::Plain;
                        continue;
                    }
                    return;
                }
                State::Body { reasoning } => {
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|&(marker, consumed)| {
                            self.held.find(marker).map(|at| (at, marker, consumed))
                        })
                        .min_by_key(|&(at, ..)| at);
                    let target = if reasoning {
                        &mut out.reasoning
                    } else {
                        &mut out.content
                    };
                    if let Some((at, marker, consumed)) = end {
                        target.push_str(&self.held[..at]);
                        let skip = if consumed { at + marker.len() } else { at };
                        self.held.drain(..skip);
                        self.state = State::Header;
                        continue;
                    }
                    let keep = BODY_ENDS
                        .iter()
                        .map(|&(marker, _)| partial_tag(&self.held, marker))
                        .max()
                        .unwrap_or(0);
                    let sent = self.held.len() - keep;
                    target.push_str(&self.held[..sent]);
                    self.held.drain(..sent);
                    return;
                }
                State::Plain => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return;
                }
            }
        }
    }

    /// What is still held when the reply ends: a cut body goes to its channel; a header that
    /// never reached `<|message|>` (markers, a role, a channel name) is dropped, but held text
    /// with no marker in it, or a reply never in the harmony form, is the answer.
    pub(super) fn finish(&mut self, out: &mut Split) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Body { reasoning: true } => out.reasoning.push_str(&held),
            State::Body { reasoning: false } | State::Plain => out.content.push_str(&held),
            State::Header if !self.seen_header || !held.contains("<|") => {
                out.content.push_str(&held)
            }
            State::Header => {}
        }
    }
}
