//! What a splitter gives back, and the check every splitter makes for a marker cut by the end
//! of a piece.

/// Reasoning and answer text, as far as they are known, and the tool calls the reply made in
/// its own form (gpt-oss's harmony messages addressed `to=functions.NAME`), each whole.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<SplitCall>,
}

/// One tool call of the reply: the function's name and its arguments as the model wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitCall {
    pub name: String,
    pub arguments: String,
}

impl Split {
    /// Appends `other`.
    pub fn extend(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
    }
}

/// The length of the longest end of `text` that begins `tag` (a tag cut by the piece boundary).
pub(super) fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}
