//! The grammar as parsed: each `name ::= …` as written, before references are checked.

/// One `name ::= …` as written.
#[derive(Debug)]
pub(super) struct Definition {
    pub(super) name: String,
    pub(super) body: Alternatives,
}

pub(super) type Alternatives = Vec<Sequence>;
pub(super) type Sequence = Vec<Item>;

#[derive(Debug)]
pub(super) enum Item {
    /// `"…"`: these characters in order (none: the empty string).
    Literal(Vec<char>),
    /// `[…]` or `[^…]`: one character in (or, negated, outside) the inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any one character, newlines included.
    AnyChar,
    /// A reference to a rule; `at` is where it is written, for the error if it is undefined.
    Rule { name: String, at: usize },
    /// `( … )`.
    Group(Alternatives),
    /// `<[id]>`, `!<[id]>` or `<text>`: one token of the model's vocabulary.
    Token(Token),
    /// `item*`, `item+`, `item?`, `item{m}`, `item{m,}`, `item{m,n}`; `max` is `None` without a
    /// maximum.
    Repeat {
        item: Box<Item>,
        min: u64,
        max: Option<u64>,
    },
}

#[derive(Debug)]
pub(super) enum Token {
    /// `<[id]>`, or with `negated` `!<[id]>`: any token but that one.
    Id { id: u32, negated: bool },
    /// `<text>`: the special token spelled `<text>`.
    Text(String),
}
