//! The GBNF text read into definitions, by a recursive-descent parser that follows llama.cpp's.

use super::ast::{Alternatives, Definition, Item, Sequence, Token};
use super::error::GbnfError;

/// llama.cpp refuses a repetition whose minimum exceeds this and reads a larger maximum as "no
/// maximum" (`MAX_REPETITION_THRESHOLD` in llama-grammar.cpp); we do the same, so that a grammar
/// accepts the same text on both servers.
const MAX_REPETITIONS: u64 = 2000;

/// Groups and repetitions of repetitions nested deeper than this are refused: every pass over the
/// grammar recurses into them, and a grammar from the network must not overflow the stack.
const MAX_NESTING: usize = 100;

/// GBNF's rule-name characters (llama.cpp's `is_word_char`).
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// A recursive-descent parser that follows llama.cpp's `llama_grammar_parser` rule for rule, so
/// that both accept the same grammars: a newline ends a sequence except inside a group or right
/// after `|`, and `#` starts a comment anywhere a space may stand.
pub(super) struct Parser {
    chars: Vec<char>,
    pos: usize,
    /// Groups open at `pos`.
    open_groups: usize,
}

impl Parser {
    pub(super) fn new(src: &str) -> Self {
        Self {
            chars: src.chars().collect(),
            pos: 0,
            open_groups: 0,
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    /// The line and column (1-based) of the character at `at`.
    fn line_column(&self, at: usize) -> (usize, usize) {
        let before = &self.chars[..at.min(self.chars.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        (line, column)
    }

    pub(super) fn error(&self, at: usize, message: impl Into<String>) -> GbnfError {
        let (line, column) = self.line_column(at);
        GbnfError {
            line,
            column,
            message: message.into(),
        }
    }

    /// What stands at the current position, for error messages.
    fn found(&self) -> String {
        match self.peek() {
            None => "the end of the grammar".into(),
            Some('\n' | '\r') => "the end of the line".into(),
            Some(c) => format!("`{c}`"),
        }
    }

    /// Skips spaces, tabs and comments, and newlines too where `newlines` is set.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    pub(super) fn grammar(&mut self) -> Result<Vec<Definition>, GbnfError> {
        let mut definitions = Vec::new();
        self.skip_space(true);
        while self.peek().is_some() {
            definitions.push(self.definition()?);
        }
        Ok(definitions)
    }

    fn definition(&mut self) -> Result<Definition, GbnfError> {
        let at = self.pos;
        let name = self.name().ok_or_else(|| {
            // A rule goes on past a line end only inside a group or after a `|` that ends the line.
            let hint = if self.peek() == Some('|') {
                " (to go on to a new line, end the line before with the `|`, or put the \
                 alternatives in parentheses)"
            } else {
                ""
            };
            self.error(
                at,
                format!(
                    "expected a rule name (`name ::= …`), found {}{hint}",
                    self.found()
                ),
            )
        })?;
        self.skip_space(false);
        if !(self.peek() == Some(':')
            && self.peek_at(1) == Some(':')
            && self.peek_at(2) == Some('='))
        {
            return Err(self.error(
                self.pos,
                format!(
                    "expected `::=` after the rule name `{name}`, found {}",
                    self.found()
                ),
            ));
        }
        self.pos += 3;
        self.skip_space(true);
        let (body, _) = self.alternatives(false)?;
        match self.peek() {
            None => {}
            Some('\n') => self.pos += 1,
            Some('\r') => {
                self.pos += 1;
                if self.peek() == Some('\n') {
                    self.pos += 1;
                }
            }
            Some(c) => {
                let hint = if c == ')' { " (no group is open)" } else { "" };
                return Err(self.error(
                    self.pos,
                    format!(
                        "unexpected `{c}` in rule `{name}`: expected a string, a character class, \
                         a rule name, a group, a repetition or the end of the line{hint}"
                    ),
                ));
            }
        }
        self.skip_space(true);
        Ok(Definition { name, body })
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.chars[start..self.pos].iter().collect())
    }

    /// The alternatives and how deep their items nest.
    fn alternatives(&mut self, nested: bool) -> Result<(Alternatives, usize), GbnfError> {
        let (first, mut nesting) = self.sequence(nested)?;
        let mut alternatives = vec![first];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_space(true);
            let (sequence, sequence_nesting) = self.sequence(nested)?;
            alternatives.push(sequence);
            nesting = nesting.max(sequence_nesting);
        }
        Ok((alternatives, nesting))
    }

    /// The sequence and how deep its items nest.
    fn sequence(&mut self, nested: bool) -> Result<(Sequence, usize), GbnfError> {
        let mut items: Sequence = Vec::new();
        // How deep each item nests: groups and repetitions in it, itself included.
        let mut nestings: Vec<usize> = Vec::new();
        while let Some(c) = self.peek() {
            let item_at = self.pos;
            let (item, nesting) = match c {
                '"' => (self.literal()?, 0),
                '[' => (self.class()?, 0),
                '<' | '!' => (self.token()?, 0),
                '(' => self.group()?,
                '.' => {
                    self.pos += 1;
                    (Item::AnyChar, 0)
                }
                c if is_word_char(c) => {
                    let name = self.name().unwrap_or_default();
                    (Item::Rule { name, at: item_at }, 0)
                }
                '*' | '+' | '?' | '{' => {
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        '?' => (0, Some(1)),
                        _ => self.bounds(nested)?,
                    };
                    if c != '{' {
                        self.pos += 1;
                    }
                    let (Some(item), Some(nesting)) = (items.pop(), nestings.pop()) else {
                        return Err(
                            self.error(item_at, format!("`{c}` must follow something to repeat"))
                        );
                    };
                    if nesting + 1 > MAX_NESTING {
                        return Err(self.error(
                            item_at,
                            format!("repetitions are nested more than {MAX_NESTING} deep"),
                        ));
                    }
                    let repeat = Item::Repeat {
                        item: Box::new(item),
                        min,
                        max,
                    };
                    (repeat, nesting + 1)
                }
                _ => break,
            };
            items.push(item);
            nestings.push(nesting);
            self.skip_space(nested);
        }
        Ok((items, nestings.into_iter().max().unwrap_or(0)))
    }

    fn literal(&mut self) -> Result<Item, GbnfError> {
        let open = self.pos;
        self.pos += 1;
        let mut chars = Vec::new();
        loop {
            match self.peek() {
                None => {
                    return Err(self.error(open, "unterminated string literal: no closing `\"`"));
                }
                Some('"') => {
                    self.pos += 1;
                    return Ok(Item::Literal(chars));
                }
                Some(_) => chars.push(self.character()?),
            }
        }
    }

    fn class(&mut self) -> Result<Item, GbnfError> {
        let open = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => {
                    return Err(self.error(open, "unterminated character class: no closing `]`"));
                }
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let low_at = self.pos;
                    let low = self.character()?;
                    // As in llama.cpp, a `-` before the closing `]` is the character itself.
                    let high =
                        if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                            self.pos += 1;
                            self.character()?
                        } else {
                            low
                        };
                    if high < low {
                        return Err(self.error(
                            low_at,
                            format!(
                                "the range `{}-{}` is reversed (U+{:04X} > U+{:04X})",
                                low.escape_debug(),
                                high.escape_debug(),
                                low as u32,
                                high as u32
                            ),
                        ));
                    }
                    ranges.push((low, high));
                }
            }
        }
        if ranges.is_empty() {
            return Err(self.error(open, "empty character class"));
        }
        Ok(Item::Class { negated, ranges })
    }

    /// One character of a literal or a class, escapes decoded.
    fn character(&mut self) -> Result<char, GbnfError> {
        let at = self.pos;
        let Some(c) = self.peek() else {
            return Err(self.error(at, "unexpected end of the grammar"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(escape) = self.peek() else {
            return Err(self.error(at, "unexpected end of the grammar after `\\`"));
        };
        self.pos += 1;
        let digits = match escape {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            't' => return Ok('\t'),
            'r' => return Ok('\r'),
            'n' => return Ok('\n'),
            '\\' | '"' | '[' | ']' | '-' => return Ok(escape),
            other => {
                return Err(self.error(
                    at,
                    format!(
                        "unknown escape `\\{other}` (GBNF has \\n \\r \\t \\\\ \\\" \\[ \\] \\- \
                         \\xHH \\uHHHH \\UHHHHHHHH)"
                    ),
                ));
            }
        };
        let mut value: u32 = 0;
        for _ in 0..digits {
            let Some(digit) = self.peek().and_then(|c| c.to_digit(16)) else {
                return Err(self.error(
                    at,
                    format!("`\\{escape}` needs {digits} hexadecimal digits"),
                ));
            };
            value = (value << 4) | digit;
            self.pos += 1;
        }
        char::from_u32(value).ok_or_else(|| {
            self.error(
                at,
                format!(
                    "U+{value:04X} is not a Unicode scalar value (a surrogate, or above U+10FFFF)"
                ),
            )
        })
    }

    fn token(&mut self) -> Result<Item, GbnfError> {
        let start = self.pos;
        let negated = self.peek() == Some('!');
        if negated {
            self.pos += 1;
        }
        if self.peek() != Some('<') {
            return Err(self.error(
                self.pos,
                format!("expected `<` after `!`, found {}", self.found()),
            ));
        }
        self.pos += 1;
        if self.peek() == Some('[') {
            self.pos += 1;
            let digits_at = self.pos;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
            let digits: String = self.chars[digits_at..self.pos].iter().collect();
            if digits.is_empty() {
                return Err(self.error(
                    digits_at,
                    format!("expected a token id after `<[`, found {}", self.found()),
                ));
            }
            let id = digits
                .parse::<u32>()
                .map_err(|_| self.error(digits_at, format!("token id {digits} is too large")))?;
            if !(self.peek() == Some(']') && self.peek_at(1) == Some('>')) {
                return Err(self.error(
                    self.pos,
                    format!("expected `]>` after the token id, found {}", self.found()),
                ));
            }
            self.pos += 2;
            return Ok(Item::Token(Token::Id { id, negated }));
        }
        let text_at = self.pos;
        while self.peek().is_some_and(|c| c != '>') {
            self.pos += 1;
        }
        if self.peek().is_none() {
            return Err(self.error(start, "unterminated token: no closing `>`"));
        }
        let text: String = self.chars[text_at..self.pos].iter().collect();
        self.pos += 1;
        if negated {
            return Err(self.error(
                start,
                format!(
                    "`!<{text}>` (any token but one named by its text) has no llguidance \
                     equivalent; name the token by its id instead: `!<[id]>`"
                ),
            ));
        }
        if text.is_empty() || text.contains(|c: char| c == '<' || c.is_whitespace()) {
            return Err(self.error(
                start,
                format!(
                    "the token `<{text}>` cannot be passed to llguidance: a token named by its \
                     text must be non-empty, without spaces or `<`; name it by its id instead: \
                     `<[id]>`"
                ),
            ));
        }
        Ok(Item::Token(Token::Text(text)))
    }

    /// The group and how deep it nests.
    fn group(&mut self) -> Result<(Item, usize), GbnfError> {
        let open = self.pos;
        if self.open_groups >= MAX_NESTING {
            return Err(self.error(
                open,
                format!("groups are nested more than {MAX_NESTING} deep"),
            ));
        }
        self.pos += 1;
        self.skip_space(true);
        self.open_groups += 1;
        let (alternatives, nesting) = self.alternatives(true)?;
        self.open_groups -= 1;
        if nesting + 1 > MAX_NESTING {
            return Err(self.error(
                open,
                format!("groups and repetitions are nested more than {MAX_NESTING} deep"),
            ));
        }
        match self.peek() {
            Some(')') => {
                self.pos += 1;
                Ok((Item::Group(alternatives), nesting + 1))
            }
            None => Err(self.error(open, "this group is never closed: no `)`")),
            Some(c) => {
                let (line, column) = self.line_column(open);
                Err(self.error(
                    self.pos,
                    format!(
                        "unexpected `{c}` in the group opened at line {line}, column {column}: \
                         expected a string, a character class, a rule name, a group, a \
                         repetition, `|` or `)`"
                    ),
                ))
            }
        }
    }

    /// `{m}`, `{m,}` or `{m,n}`, the current character being `{`.
    fn bounds(&mut self, nested: bool) -> Result<(u64, Option<u64>), GbnfError> {
        let open = self.pos;
        self.pos += 1;
        self.skip_space(nested);
        let min = self.number().ok_or_else(|| {
            self.error(
                self.pos,
                format!("expected a number after `{{`, found {}", self.found()),
            )
        })?;
        self.skip_space(nested);
        let max = match self.peek() {
            Some('}') => Some(min),
            Some(',') => {
                self.pos += 1;
                self.skip_space(nested);
                let max = self.number();
                self.skip_space(nested);
                if self.peek() != Some('}') {
                    return Err(self.error(
                        self.pos,
                        format!(
                            "expected `}}` to end the repetition, found {}",
                            self.found()
                        ),
                    ));
                }
                max
            }
            _ => {
                return Err(self.error(
                    self.pos,
                    format!(
                        "expected `,` or `}}` in the repetition, found {}",
                        self.found()
                    ),
                ));
            }
        };
        self.pos += 1;
        if min > MAX_REPETITIONS {
            return Err(self.error(
                open,
                format!(
                    "a repetition of at least {min} exceeds llama.cpp's limit of {MAX_REPETITIONS}"
                ),
            ));
        }
        if let Some(max) = max
            && max < min
        {
            return Err(self.error(
                open,
                format!("the repetition `{{{min},{max}}}` has its maximum below its minimum"),
            ));
        }
        Ok((min, max.filter(|&max| max <= MAX_REPETITIONS)))
    }

    /// A decimal number; one too large for `u64` saturates (it is past every limit anyway).
    fn number(&mut self) -> Option<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        while let Some(digit) = self.peek().and_then(|c| c.to_digit(10)) {
            value = value.saturating_mul(10).saturating_add(u64::from(digit));
            self.pos += 1;
        }
        (self.pos > start).then_some(value)
    }
}
