//! Stop strings that may span token boundaries.

/// Watches generated text for stop strings.
///
/// Text that could still become a stop string is held back until it either completes one (and is
/// dropped, with everything after it) or can no longer do so (and is released). Callers therefore
/// never see part of a stop string, even when it arrives split across tokens.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

/// What a [`StopMatcher`] releases after a piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopScan {
    /// Text safe to show the user now.
    pub text: String,
    /// Whether a stop string completed; no text after it is ever released.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored.
    pub fn new(stops: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next piece of generated text.
    pub fn push(&mut self, text: &str) -> StopScan {
        if self.stopped {
            return StopScan {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.push_str(text);
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min();
        if let Some(at) = earliest {
            self.stopped = true;
            let text = self.pending[..at].to_owned();
            self.pending.clear();
            return StopScan {
                text,
                stopped: true,
            };
        }
        let held = self.longest_partial_suffix();
        let release = self.pending.len() - held;
        let text = self.pending[..release].to_owned();
        self.pending.drain(..release);
        StopScan {
            text,
            stopped: false,
        }
    }

    /// Whether a stop string has completed.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Releases whatever is held back; call when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// The length of the longest suffix of the pending text that is a proper prefix of a stop
    /// string, on a character boundary.
    fn longest_partial_suffix(&self) -> usize {
        let pending = self.pending.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let longest = (stop.len() - 1).min(pending.len());
            for len in (best + 1..=longest).rev() {
                let start = pending.len() - len;
                if pending.is_char_boundary(start) && stop.starts_with(&pending[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}
