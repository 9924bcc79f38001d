//! gpt-oss's harmony form: the reply is a run of messages, each a header
//! (`<|start|>assistant<|channel|>NAME …`) then `<|message|>` and a body ended by `<|end|>`,
//! `<|return|>` or `<|call|>`. The `analysis` channel is the reasoning, `final` the answer, and
//! `commentary` (the preambles gpt-oss writes around tool calls) the answer's text too. A message
//! addressed to a function (`to=functions.NAME` in its header, before or after the channel) is a
//! tool call: its body, the arguments, is held until the message ends and then given back whole
//! as a [`SplitCall`], which the routes return as `tool_calls`. The markers are special tokens,
//! which the engine's text leaves out; the server puts them back ([`super::marker_text`]) so that
//! this splitter sees them.

use super::split::{Split, SplitCall, partial_tag};

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
    /// Inside the body of a message addressed to a function (the name is in `call`).
    Call,
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
    /// The call whose arguments are being read.
    call: Option<SplitCall>,
}

/// The channel a header names (`<|channel|>analysis`, `<|channel|>commentary to=functions.f`).
fn channel(header: &str) -> &str {
    header
        .rfind(CHANNEL)
        .map(|at| &header[at + CHANNEL.len()..])
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next())
        .unwrap_or("")
}

/// The function a header addresses (`to=functions.get_weather` gives `get_weather`; a recipient
/// outside the `functions` namespace keeps its full name).
fn recipient(header: &str) -> Option<&str> {
    let at = header.find("to=")?;
    let name = header[at + 3..]
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
        .filter(|n| !n.is_empty())?;
    Some(name.strip_prefix("functions.").unwrap_or(name))
}

impl HarmonySplitter {
    pub(super) fn new() -> Self {
        Self {
            state: State::Header,
            held: String::new(),
            seen_header: false,
            call: None,
        }
    }

    pub(super) fn push(&mut self, text: &str, out: &mut Split) {
        self.held.push_str(text);
        loop {
            match self.state {
                State::Header => {
                    if let Some(at) = self.held.find(MESSAGE) {
                        let header = &self.held[..at];
                        self.state = match recipient(header) {
                            Some(name) => {
                                self.call = Some(SplitCall {
                                    name: name.to_owned(),
                                    arguments: String::new(),
                                });
                                State::Call
                            }
                            None => State::Body {
                                reasoning: channel(header) == "analysis",
                            },
                        };
                        self.held.drain(..at + MESSAGE.len());
                        self.seen_header = true;
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
                State::Call => {
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|&(marker, consumed)| {
                            self.held.find(marker).map(|at| (at, marker, consumed))
                        })
                        .min_by_key(|&(at, ..)| at);
                    let Some((at, marker, consumed)) = end else {
                        return;
                    };
                    if let Some(mut call) = self.call.take() {
                        call.arguments = self.held[..at].trim().to_owned();
                        out.calls.push(call);
                    }
                    let skip = if consumed { at + marker.len() } else { at };
                    self.held.drain(..skip);
                    self.state = State::Header;
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
            // A call cut by the end of the reply (`<|call|>` is an end-of-generation token the
            // engine leaves out of the text): its arguments are what was written.
            State::Call => {
                if let Some(mut call) = self.call.take() {
                    call.arguments = held.trim().to_owned();
                    out.calls.push(call);
                }
            }
            State::Header if !self.seen_header || !held.contains("<|") => {
                out.content.push_str(&held)
            }
            State::Header => {}
        }
    }
}
