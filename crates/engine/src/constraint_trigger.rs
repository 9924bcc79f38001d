//! Lazy constraints, as llama.cpp's lazy grammars (`llama_sampler_init_grammar_lazy_patterns`):
//! the output is free until a trigger appears in it, then the constraint applies from the
//! trigger on. Tool-call grammars use them: the model may write text, and once it opens a call
//! (`<tool_call>`, `[TOOL_CALLS]` ...) the call must match the grammar.
//!
//! A trigger is a token, or a pattern searched in the text generated so far (a word is the
//! pattern of its literal text; a full pattern must match the whole text). When a pattern
//! matches, the constraint starts where its first non-empty capture group starts (else where the
//! match starts), and the text from there on, the part of a token before that point left out, is
//! the constraint's first input, as llama.cpp replays the tokens that overlap it. A token
//! trigger is itself the constraint's first input. Patterns use Rust's `regex` syntax, which
//! covers what llama.cpp's tool-call triggers use (classes, groups, lazy repetition) but not
//! look-around or back-references, which are refused with the pattern named.

use regex::Regex;

/// What starts a lazy constraint (llama-server's `grammar_triggers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstraintTrigger {
    /// This token is generated (llama.cpp's type 0, and a word that is one preserved token).
    Token(u32),
    /// This text appears in the output (type 1).
    Word(String),
    /// This pattern matches somewhere in the output (type 2).
    Pattern(String),
    /// This pattern matches the whole output so far (type 3).
    PatternFull(String),
}

/// What the constraint is fed once a trigger fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replay {
    /// The trigger token.
    Token(u32),
    /// The text from the trigger's start (as bytes of the output).
    Text(Vec<u8>),
}

/// A lazy constraint waiting for its trigger: the output so far, searched after each token.
#[derive(Debug, Clone)]
pub(crate) struct AwaitingTrigger {
    tokens: Vec<u32>,
    patterns: Vec<Regex>,
    text: Vec<u8>,
    /// Each token read so far with the byte range of its text in `text`.
    positions: Vec<(u32, usize, usize)>,
}

impl AwaitingTrigger {
    /// Compiles `triggers`; the error names the pattern that does not compile.
    pub(crate) fn new(triggers: &[ConstraintTrigger]) -> Result<Self, String> {
        let mut tokens = Vec::new();
        let mut patterns = Vec::new();
        for trigger in triggers {
            let source = match trigger {
                ConstraintTrigger::Token(token) => {
                    tokens.push(*token);
                    continue;
                }
                ConstraintTrigger::Word(word) => regex::escape(word),
                ConstraintTrigger::Pattern(pattern) => pattern.clone(),
                ConstraintTrigger::PatternFull(pattern) => {
                    let mut anchored = pattern.clone();
                    if !anchored.starts_with('^') {
                        anchored.insert(0, '^');
                    }
                    if !anchored.ends_with('$') || anchored.len() == 1 {
                        anchored.push('$');
                    }
                    anchored
                }
            };
            let regex = Regex::new(&source)
                .map_err(|e| format!("trigger pattern `{source}` does not compile: {e}"))?;
            patterns.push(regex);
        }
        Ok(Self {
            tokens,
            patterns,
            text: Vec::new(),
            positions: Vec::new(),
        })
    }

    /// Reads the next generated `token` (whose text is `piece`): what the constraint starts
    /// with if it fires a trigger, else `None` (still waiting).
    pub(crate) fn observe(&mut self, token: u32, piece: &[u8]) -> Option<Vec<Replay>> {
        if self.tokens.contains(&token) {
            self.text.clear();
            self.positions.clear();
            return Some(vec![Replay::Token(token)]);
        }
        let at = self.text.len();
        self.text.extend_from_slice(piece);
        self.positions.push((token, at, self.text.len()));
        let text = String::from_utf8_lossy(&self.text).into_owned();
        for regex in &self.patterns {
            let Some(captures) = regex.captures(&text) else {
                continue;
            };
            let start = captures
                .iter()
                .skip(1)
                .flatten()
                .find(|group| !group.is_empty())
                .or_else(|| captures.get(0))
                .map_or(0, |m| m.start());
            // The tokens that overlap the text from `start`: whole, and the first one's part
            // from `start` when it begins before it.
            let replay = self
                .positions
                .iter()
                .filter(|(_, _, end)| *end > start)
                .map(|&(token, from, end)| {
                    if from >= start {
                        Replay::Token(token)
                    } else {
                        Replay::Text(self.text[start.min(end)..end].to_vec())
                    }
                })
                .collect();
            self.text.clear();
            self.positions.clear();
            return Some(replay);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn awaiting(triggers: &[ConstraintTrigger]) -> AwaitingTrigger {
        AwaitingTrigger::new(triggers).unwrap()
    }

    #[test]
    fn a_token_trigger_fires_on_its_token_alone() {
        let mut lazy = awaiting(&[ConstraintTrigger::Token(7)]);
        assert_eq!(lazy.observe(3, b"<tool"), None);
        assert_eq!(lazy.observe(7, b"<call>"), Some(vec![Replay::Token(7)]));
    }

    #[test]
    fn a_word_fires_across_tokens_and_replays_from_where_it_starts() {
        let mut lazy = awaiting(&[ConstraintTrigger::Word("<tool_call>".into())]);
        assert_eq!(lazy.observe(1, b"Sure. <to"), None);
        assert_eq!(
            lazy.observe(2, b"ol_call>{\""),
            Some(vec![Replay::Text(b"<to".to_vec()), Replay::Token(2)])
        );
        // A word's special characters are literal.
        let mut dots = awaiting(&[ConstraintTrigger::Word("a.b".into())]);
        assert_eq!(dots.observe(1, b"axb"), None);
        assert_eq!(
            dots.observe(2, b" a.b"),
            Some(vec![Replay::Text(b"a.b".to_vec())])
        );
    }

    #[test]
    fn a_pattern_starts_at_its_first_non_empty_group() {
        let mut lazy = awaiting(&[ConstraintTrigger::Pattern(
            r"[\s\S]*?(\[TOOL_CALLS\])".into(),
        )]);
        assert_eq!(
            lazy.observe(1, b"text [TOOL_CALLS][{"),
            Some(vec![Replay::Text(b"[TOOL_CALLS][{".to_vec())])
        );
    }

    #[test]
    fn a_full_pattern_must_match_the_whole_output() {
        let mut lazy = awaiting(&[ConstraintTrigger::PatternFull(r"\s*(\{)".into())]);
        assert_eq!(lazy.observe(1, b"x {"), None);
        let mut lazy = awaiting(&[ConstraintTrigger::PatternFull(r"\s*(\{)".into())]);
        assert_eq!(
            lazy.observe(1, b"  {"),
            Some(vec![Replay::Text(b"{".to_vec())])
        );
        let err = AwaitingTrigger::new(&[ConstraintTrigger::Pattern("(?=x)".into())]).unwrap_err();
        assert!(err.contains("(?=x)"), "{err}");
    }
}
