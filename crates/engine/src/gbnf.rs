//! GBNF, llama.cpp's grammar format (llama-server's `grammar` field), converted to the Lark
//! dialect that llguidance compiles.
//!
//! GBNF describes text character by character: a rule is a context-free production over Unicode
//! code points, with no lexer. llguidance splits a Lark grammar into lexemes (each string literal
//! and `/regex/`) and a parser over them, and its lexer is greedy: of the lexemes the parser allows
//! at a point it follows the longest match and never backtracks. A multi-character lexeme next to
//! a competing one would therefore reject text that GBNF accepts (with `"return"` and an identifier
//! `[a-z] [a-z]*` both allowed, `result` dies at the `s`). So every lexeme we emit matches exactly
//! one character: a string literal becomes a sequence of one-character literals, a character class
//! a one-character regex, and the language stays the one llama.cpp accepts.
//!
//! The mapping, what is refused and why, is documented in docs/server.md ("GBNF grammars").

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};

/// llama.cpp refuses a repetition whose minimum exceeds this and reads a larger maximum as "no
/// maximum" (`MAX_REPETITION_THRESHOLD` in llama-grammar.cpp); we do the same, so that a grammar
/// accepts the same text on both servers.
const MAX_REPETITIONS: u64 = 2000;

/// Groups and repetitions of repetitions nested deeper than this are refused: every pass over the
/// grammar recurses into them, and a grammar from the network must not overflow the stack.
const MAX_NESTING: usize = 100;

/// llguidance's Lark parser refuses groups nested 30 deep (its `MAX_NESTING`); a group nested
/// deeper than this becomes a rule of its own.
const MAX_INLINE_DEPTH: usize = 12;

/// Converts a GBNF grammar to a Lark grammar for llguidance whose `start` rule is GBNF's `root`.
///
/// The error names the line and column (1-based, in characters) and what is wrong there, in
/// words fit for the user who sent the grammar.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    convert(gbnf).map_err(|e| e.to_string())
}

/// Why a GBNF grammar was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GbnfError {
    pub(crate) line: usize,
    pub(crate) column: usize,
    pub(crate) message: String,
}

impl fmt::Display for GbnfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for GbnfError {}

pub(crate) fn convert(gbnf: &str) -> Result<String, GbnfError> {
    let mut parser = Parser::new(gbnf);
    let definitions = parser.grammar()?;
    let grammar = Grammar::resolve(definitions, &parser)?;
    Ok(Emitter::new(&grammar).lark())
}

// --- the grammar as parsed -----------------------------------------------------------------------

/// One `name ::= …` as written.
#[derive(Debug)]
struct Definition {
    name: String,
    body: Alternatives,
}

type Alternatives = Vec<Sequence>;
type Sequence = Vec<Item>;

#[derive(Debug)]
enum Item {
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
enum Token {
    /// `<[id]>`, or with `negated` `!<[id]>`: any token but that one.
    Id { id: u32, negated: bool },
    /// `<text>`: the special token spelled `<text>`.
    Text(String),
}

/// GBNF's rule-name characters (llama.cpp's `is_word_char`).
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// A recursive-descent parser that follows llama.cpp's `llama_grammar_parser` rule for rule, so
/// that both accept the same grammars: a newline ends a sequence except inside a group or right
/// after `|`, and `#` starts a comment anywhere a space may stand.
struct Parser {
    chars: Vec<char>,
    pos: usize,
    /// Groups open at `pos`.
    open_groups: usize,
}

impl Parser {
    fn new(src: &str) -> Self {
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

    fn error(&self, at: usize, message: impl Into<String>) -> GbnfError {
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

    fn grammar(&mut self) -> Result<Vec<Definition>, GbnfError> {
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

// --- the grammar resolved ------------------------------------------------------------------------

/// The rules by name, each with its last definition (a later `name ::=` replaces an earlier one,
/// as in llama.cpp), in the order of their first definition.
#[derive(Debug)]
struct Grammar {
    rules: Vec<(String, Alternatives)>,
}

impl Grammar {
    /// Checks every reference and the `root` rule.
    fn resolve(definitions: Vec<Definition>, parser: &Parser) -> Result<Self, GbnfError> {
        let defined: HashSet<&str> = definitions.iter().map(|d| d.name.as_str()).collect();
        let mut unknown: Option<(usize, &str)> = None;
        for definition in &definitions {
            visit_rules(&definition.body, &mut |name, at| {
                if !defined.contains(name) && unknown.is_none_or(|(first, _)| at < first) {
                    unknown = Some((at, name));
                }
            });
        }
        if let Some((at, name)) = unknown {
            return Err(parser.error(
                at,
                format!("unknown rule `{name}`: no `{name} ::= …` defines it"),
            ));
        }
        if !defined.contains("root") {
            let message = if definitions.is_empty() {
                "the grammar is empty: it needs a `root` rule, where the output starts"
            } else {
                "the grammar has no `root` rule, where the output starts"
            };
            return Err(parser.error(0, message));
        }
        let mut rules: Vec<(String, Alternatives)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for definition in definitions {
            match index.get(&definition.name) {
                Some(&i) => rules[i].1 = definition.body,
                None => {
                    index.insert(definition.name.clone(), rules.len());
                    rules.push((definition.name, definition.body));
                }
            }
        }
        Ok(Self { rules })
    }
}

fn visit_rules<'a>(alternatives: &'a Alternatives, f: &mut impl FnMut(&'a str, usize)) {
    for item in alternatives.iter().flatten() {
        visit_item(item, f);
    }
}

fn visit_item<'a>(item: &'a Item, f: &mut impl FnMut(&'a str, usize)) {
    match item {
        Item::Rule { name, at } => f(name, *at),
        Item::Group(alternatives) => visit_rules(alternatives, f),
        Item::Repeat { item, .. } => visit_item(item, f),
        Item::Literal(_) | Item::Class { .. } | Item::AnyChar | Item::Token(_) => {}
    }
}

// --- one-character rules -------------------------------------------------------------------------

/// Characters as sorted, disjoint, inclusive ranges.
type CharSet = Vec<(char, char)>;

/// The rules that always match exactly one character, with the characters they match: a choice
/// between one-character items (`letter | digit | [_-]`) is written as one regex, which matches
/// the same single character but costs llguidance one lexeme per character instead of one per
/// alternative (it halves the time of a token mask for llama.cpp's english.gbnf).
///
/// Worked out without recursion (rule chains may be as long as the grammar): a rule whose body
/// has the shape of one character is resolved once every rule it names is; rules in a cycle
/// never are.
fn one_char_rules(grammar: &Grammar) -> HashMap<&str, CharSet> {
    let mut waiting_on: HashMap<&str, usize> = HashMap::new();
    let mut dependents: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut ready: Vec<&str> = Vec::new();
    for (name, body) in &grammar.rules {
        if !body
            .iter()
            .all(|sequence| matches!(sequence.as_slice(), [item] if one_char_shape(item)))
        {
            continue;
        }
        let mut names = HashSet::new();
        visit_rules(body, &mut |referenced, _| {
            names.insert(referenced);
        });
        waiting_on.insert(name, names.len());
        if names.is_empty() {
            ready.push(name);
        }
        for referenced in names {
            dependents.entry(referenced).or_default().push(name);
        }
    }
    let bodies: HashMap<&str, &Alternatives> = grammar
        .rules
        .iter()
        .map(|(name, body)| (name.as_str(), body))
        .collect();
    let mut known = HashMap::new();
    while let Some(name) = ready.pop() {
        let Some(set) = one_char_alternatives(bodies[name], &known) else {
            continue;
        };
        known.insert(name, set);
        for &dependent in dependents.get(name).into_iter().flatten() {
            if let Some(count) = waiting_on.get_mut(dependent) {
                *count -= 1;
                if *count == 0 {
                    ready.push(dependent);
                }
            }
        }
    }
    known
}

/// Whether `item` is built only of things that match one character (its rules unchecked).
fn one_char_shape(item: &Item) -> bool {
    match item {
        Item::Literal(chars) => chars.len() == 1,
        Item::Class { .. } | Item::AnyChar | Item::Rule { .. } => true,
        Item::Group(alternatives) => alternatives
            .iter()
            .all(|sequence| matches!(sequence.as_slice(), [item] if one_char_shape(item))),
        Item::Token(_) | Item::Repeat { .. } => false,
    }
}

/// The characters `alternatives` match if each is exactly one one-character item.
fn one_char_alternatives(
    alternatives: &[Sequence],
    rules: &HashMap<&str, CharSet>,
) -> Option<CharSet> {
    let mut union = Vec::new();
    for sequence in alternatives {
        let [item] = sequence.as_slice() else {
            return None;
        };
        union.extend(one_char_item(item, rules)?);
    }
    Some(normalize(union))
}

/// The characters `item` matches if it always matches exactly one.
fn one_char_item(item: &Item, rules: &HashMap<&str, CharSet>) -> Option<CharSet> {
    match item {
        Item::Literal(chars) if chars.len() == 1 => Some(vec![(chars[0], chars[0])]),
        Item::Class {
            negated: false,
            ranges,
        } => Some(normalize(ranges.clone())),
        Item::Class {
            negated: true,
            ranges,
        } => Some(complement(&normalize(ranges.clone()))),
        Item::AnyChar => Some(complement(&[])),
        Item::Rule { name, .. } => rules.get(name.as_str()).cloned(),
        Item::Group(alternatives) => one_char_alternatives(alternatives, rules),
        Item::Literal(_) | Item::Token(_) | Item::Repeat { .. } => None,
    }
}

/// `ranges` sorted, with overlapping and adjacent ranges merged.
fn normalize(mut ranges: Vec<(char, char)>) -> CharSet {
    ranges.sort_unstable();
    let mut merged: CharSet = Vec::with_capacity(ranges.len());
    for (low, high) in ranges {
        match merged.last_mut() {
            Some(last) if low as u32 <= last.1 as u32 + 1 => last.1 = last.1.max(high),
            _ => merged.push((low, high)),
        }
    }
    merged
}

/// Every Unicode scalar value not in `set` (sorted and disjoint).
fn complement(set: &[(char, char)]) -> CharSet {
    let mut gaps = Vec::new();
    let mut next: u32 = 0;
    for &(low, high) in set {
        if (low as u32) > next {
            gaps.push((next, low as u32 - 1));
        }
        next = high as u32 + 1;
    }
    if next <= char::MAX as u32 {
        gaps.push((next, char::MAX as u32));
    }
    // Cut the surrogates (not characters) out of each gap; what remains converts to `char`.
    let mut out = Vec::new();
    for (low, high) in gaps {
        for (low, high) in [(low, high.min(0xD7FF)), (low.max(0xE000), high)] {
            if let (true, Some(low), Some(high)) =
                (low <= high, char::from_u32(low), char::from_u32(high))
            {
                out.push((low, high));
            }
        }
    }
    out
}

// --- Lark ----------------------------------------------------------------------------------------

/// Writes the Lark grammar: `start: root`, then one rule per GBNF rule, then the rules that deep
/// groups were moved into.
struct Emitter<'g> {
    grammar: &'g Grammar,
    names: HashMap<&'g str, String>,
    used: HashSet<String>,
    one_char: HashMap<&'g str, CharSet>,
    /// Rules made of groups nested too deep to write inline: (name, body).
    hoisted: Vec<(String, String)>,
}

impl<'g> Emitter<'g> {
    fn new(grammar: &'g Grammar) -> Self {
        let (names, used) = lark_names(grammar.rules.iter().map(|(name, _)| name.as_str()));
        Self {
            grammar,
            names,
            used,
            one_char: one_char_rules(grammar),
            hoisted: Vec::new(),
        }
    }

    fn lark(mut self) -> String {
        let mut out = String::from("start: root\n");
        for (name, body) in &self.grammar.rules {
            let lark_name = self.names[name.as_str()].clone();
            let body = match self.one_char.get(name.as_str()) {
                Some(set) if body.len() > 1 => class_regex(false, set),
                _ => self.alternatives(body, 1),
            };
            let _ = writeln!(out, "{lark_name}: {body}");
        }
        for (name, body) in &self.hoisted {
            let _ = writeln!(out, "{name}: {body}");
        }
        out
    }

    fn alternatives(&mut self, alternatives: &[Sequence], depth: usize) -> String {
        let written: Vec<String> = alternatives
            .iter()
            .map(|sequence| self.sequence(sequence, depth))
            .collect();
        written.join(" | ")
    }

    fn sequence(&mut self, sequence: &[Item], depth: usize) -> String {
        let written: Vec<String> = sequence
            .iter()
            .map(|item| self.item(item, depth))
            .filter(|item| item != "\"\"")
            .collect();
        if written.is_empty() {
            "\"\"".into()
        } else {
            written.join(" ")
        }
    }

    /// `item` as one or more Lark expressions in sequence.
    fn item(&mut self, item: &Item, depth: usize) -> String {
        if matches!(item, Item::Rule { .. } | Item::Group(_))
            && let Some(set) = one_char_item(item, &self.one_char)
        {
            return class_regex(false, &set);
        }
        match item {
            Item::Literal(chars) if chars.is_empty() => "\"\"".into(),
            Item::Literal(chars) => chars
                .iter()
                .map(|&c| lark_string(c))
                .collect::<Vec<_>>()
                .join(" "),
            Item::Class { negated, ranges } => class_regex(*negated, ranges),
            // GBNF's `.` matches a newline too; the regex's `.` does so only with the `s` flag.
            Item::AnyChar => "/(?s:.)/".into(),
            Item::Rule { name, .. } => self.names[name.as_str()].clone(),
            Item::Token(Token::Id { id, negated: false }) => format!("<[{id}]>"),
            Item::Token(Token::Id { id, negated: true }) => format!("<[^{id}]>"),
            Item::Token(Token::Text(text)) => format!("<{text}>"),
            Item::Group(alternatives) => {
                let hoist = depth >= MAX_INLINE_DEPTH;
                let inner = self.alternatives(alternatives, if hoist { 1 } else { depth + 1 });
                self.enclose(inner, hoist)
            }
            Item::Repeat { item, min, max } => self.repeat(item, *min, *max, depth),
        }
    }

    /// `(inner)`, or with `hoist` the name of a new rule whose body is `inner`: llguidance
    /// refuses groups nested 30 deep.
    fn enclose(&mut self, inner: String, hoist: bool) -> String {
        if !hoist {
            return format!("({inner})");
        }
        let name = unique_name("group", &mut self.used);
        self.hoisted.push((name.clone(), inner));
        name
    }

    fn repeat(&mut self, item: &Item, min: u64, max: Option<u64>, depth: usize) -> String {
        if max == Some(0) || matches!(item, Item::Literal(chars) if chars.is_empty()) {
            // `{0}` matches only the empty string; llguidance refuses a range ending at 0.
            return "\"\"".into();
        }
        let operand = match item {
            // Several one-character literals, or a repetition (Lark takes one operator per
            // expression), are grouped first.
            Item::Literal(chars) if chars.len() > 1 => {
                let hoist = depth >= MAX_INLINE_DEPTH;
                let inner = self.item(item, depth);
                self.enclose(inner, hoist)
            }
            Item::Repeat { .. } => {
                let hoist = depth >= MAX_INLINE_DEPTH;
                let inner = self.item(item, if hoist { 1 } else { depth + 1 });
                self.enclose(inner, hoist)
            }
            _ => self.item(item, depth),
        };
        let operator = match (min, max) {
            (0, None) => "*".to_string(),
            (1, None) => "+".to_string(),
            (0, Some(1)) => "?".to_string(),
            (min, None) => format!("{{{min},}}"),
            (min, Some(max)) if min == max => format!("{{{min}}}"),
            (min, Some(max)) => format!("{{{min},{max}}}"),
        };
        format!("{operand}{operator}")
    }
}

/// The Lark name of each GBNF rule: lowercase, `-` as `_`, never `start` (ours), all distinct.
/// Names that map as they are keep their spelling; the others (uppercase letters, a leading digit
/// or `-`, or `start`) get the first free `_2`, `_3`, … suffix, in the order they appear.
fn lark_names<'g>(
    names: impl Iterator<Item = &'g str> + Clone,
) -> (HashMap<&'g str, String>, HashSet<String>) {
    let mut used: HashSet<String> = HashSet::from(["start".to_string()]);
    let mut mapped = HashMap::new();
    let plain = |name: &str| name.replace('-', "_");
    let is_exact = |name: &str| {
        name.starts_with(|c: char| c.is_ascii_lowercase())
            && !name.contains(|c: char| c.is_ascii_uppercase())
            && name != "start"
    };
    for name in names.clone().filter(|name| is_exact(name)) {
        used.insert(plain(name));
        mapped.insert(name, plain(name));
    }
    for name in names.filter(|name| !is_exact(name)) {
        let mut base = plain(&name.to_ascii_lowercase());
        if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
            base.insert(0, 'r');
        }
        mapped.insert(name, unique_name(&base, &mut used));
    }
    (mapped, used)
}

/// `base`, or `base_2`, `base_3`, …: the first not in `used`, which it joins.
fn unique_name(base: &str, used: &mut HashSet<String>) -> String {
    let mut candidate = base.to_string();
    let mut n = 2;
    while used.contains(&candidate) {
        candidate = format!("{base}_{n}");
        n += 1;
    }
    used.insert(candidate.clone());
    candidate
}

/// `c` as a Lark (JSON) string literal.
fn lark_string(c: char) -> String {
    match c {
        '"' => r#""\"""#.into(),
        '\\' => r#""\\""#.into(),
        c if c.is_control() => format!("\"\\u{:04x}\"", c as u32),
        c => format!("\"{c}\""),
    }
}

/// A one-character regex for a character class, with the slashes of a Lark regex.
fn class_regex(negated: bool, ranges: &[(char, char)]) -> String {
    if ranges.is_empty() {
        // No character (a choice of classes that each exclude everything): a regex cannot spell
        // the empty class `[]`, but it can negate the class of every character.
        return class_regex(!negated, &[('\0', char::MAX)]);
    }
    let mut out = String::from("/[");
    if negated {
        out.push('^');
    }
    for &(low, high) in ranges {
        push_class_char(&mut out, low);
        if high != low {
            out.push('-');
            push_class_char(&mut out, high);
        }
    }
    out.push_str("]/");
    out
}

/// `c` inside a regex class: ASCII punctuation escaped with `\` (which also keeps `/` from ending
/// the Lark regex and `&&`, `--`, `~~` from being class operations), controls and other
/// whitespace as `\x{…}`, everything else as itself.
fn push_class_char(out: &mut String, c: char) {
    if c.is_ascii_punctuation() && c != '<' && c != '>' {
        out.push('\\');
        out.push(c);
    } else if c.is_control() || (c.is_whitespace() && c != ' ') {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use llguidance::api::TopLevelGrammar;
    use llguidance::{Matcher, ParserFactory};
    use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

    use super::*;

    /// A factory over a toy vocabulary: one token per byte, and an end-of-sequence token.
    fn byte_factory() -> ParserFactory {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF<eos>".to_vec());
        let trie = TokTrie::from(&TokRxInfo::new(257, 256), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).expect("a byte vocabulary is valid");
        factory.quiet();
        factory
    }

    /// Converts `gbnf` and compiles the Lark with llguidance; panics with both texts if either
    /// step fails.
    fn compile(factory: &ParserFactory, gbnf: &str) -> Matcher {
        let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{e}\nin:\n{gbnf}"));
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.clone()))
            .unwrap_or_else(|e| panic!("llguidance refuses the Lark: {e}\n{lark}"));
        let matcher = Matcher::new(Ok(parser));
        assert!(
            matcher.get_error().is_none(),
            "{:?}\n{lark}",
            matcher.get_error()
        );
        matcher
    }

    /// Whether the constraint compiled from `gbnf` takes `text` byte by byte and can end there.
    fn accepts(factory: &ParserFactory, gbnf: &str, text: &str) -> bool {
        let mut matcher = compile(factory, gbnf);
        for &byte in text.as_bytes() {
            if matcher.consume_token(u32::from(byte)).is_err() {
                return false;
            }
        }
        matcher.is_accepting().unwrap_or(false)
    }

    /// Each grammar with text it must accept and text it must reject.
    const LANGUAGES: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "arithmetic",
            r#"root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
"#,
            &["1", "12+3", "(1+2)*3", "((4))/5-6"],
            &["", "+1", "1+", "(1", "1)", "a"],
        ),
        (
            "JSON-like",
            r#"root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws (member ("," ws member)*)? "}"
member ::= string ws ":" ws value ws
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
string ::= "\"" ([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])* "\""
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws ::= [ \t\n]*
"#,
            &[
                r#"{"a": [1, 2.5, -3], "b": {"c": null}}"#,
                r#"[true, false, "x\"y\\z"]"#,
                "\"é ✓\"",
                "{}",
            ],
            &[r#"{"a" 1}"#, "[1,]", "tru", "\"a\nb\"", "01.", "{'a': 1}"],
        ),
        (
            "list",
            "root ::= (\"- \" item \"\\n\")+\nitem ::= [^\\n]+\n",
            &["- a\n", "- one\n- two words\n"],
            &["", "- \n", "- a", "* a\n"],
        ),
        (
            "character classes with escapes",
            r#"root ::= [\x41-\x43] [\u00e9\u4E00] [\U0001F600] [\-\]\[\\] [^\t\n\r] [a-]"#,
            &["Aé😀-xa", "C一😀]\u{7f}-", "B一😀[ a", "Aé😀\\/-"],
            &["Dé😀-xa", "Ae😀-xa", "Aé😀-\ta", "Aé😀^xa", "Aé😀-xb"],
        ),
        (
            "repetition bounds",
            r#"root ::= "a"{2} "b"{1,} "c"{0,2} "d"{1,3} "e"{0} ("fg"){2}"#,
            &["aabdfgfg", "aabbbccdddfgfg", "aabcdfgfg"],
            &[
                "abdfgfg",
                "aadfgfg",
                "aabcccdfgfg",
                "aabddddfgfg",
                "aabdefgfg",
                "aabdfg",
            ],
        ),
        (
            "stacked repetitions",
            r#"root ::= ("ab"?)+ "c"+? "x"*"#,
            &["", "abab", "ababc", "cccxx", "x"],
            &["a", "abb", "ba"],
        ),
        (
            "comments and multi-line rules",
            "# a comment before the rules\n\nroot ::= greeting # after a rule\n  \
             \ngreeting ::=\n    ( # inside a group\n      \"hi\"\n    | \"hello\"\n    \
             ) \" \" name\nname ::= \"you\" |\n  \"world\" # an alternative after `|`\n",
            &["hi you", "hello world"],
            &["hi", "hello  world", "hiworld"],
        ),
        (
            "a keyword next to an identifier",
            // A lexer would take `re`/`ret` as the start of `return` and reject `result` and
            // `ret`; GBNF accepts both.
            r#"root ::= ("return" | ident) " " ident
ident ::= [a-z] [a-z]*
"#,
            &["return x", "result x", "ret x", "r x"],
            &["return", "returnx", " x"],
        ),
        (
            "a literal that is a prefix of another",
            r#"root ::= ("a" | "ab") "bc" | "abc" "d""#,
            &["abc", "abbc", "abcd"],
            &["ab", "abcbc"],
        ),
        (
            "any character",
            r#"root ::= "<" .* ">" ."#,
            &["<>x", "<a\nb>\n", "<<>>>", "<é>😀"],
            &["<>", "<x", "x<>y"],
        ),
        (
            "empty alternatives",
            r#"root ::= "x" opt "y"
opt ::= | "-" |"+""#,
            &["xy", "x-y", "x+y"],
            &["x--y", "x"],
        ),
        (
            "rule names to map",
            r#"root ::= Start start the-end 9lives
Start ::= "A"
start ::= "b"
the-end ::= "c"
9lives ::= "d" | "9" 9lives
"#,
            &["Abcd", "Abc99d"],
            &["abcd", "Abc"],
        ),
        (
            "one-character rules",
            r#"root ::= (ch | pair)+
ch ::= [^a-z] | "q" | any-nl | cyc
any-nl ::= "\n"
pair ::= "ab"
cyc ::= cyc2 | "r"
cyc2 ::= cyc | "s"
"#,
            &["q", "1\nq", "ab", "rs", "😀Q"],
            &["b", "a", ""],
        ),
        (
            "classes of no character",
            r#"root ::= "a" | [^\x00-\U0010FFFF] "b" | none "c"
none ::= [^\x00-\U0010FFFF] | [^\x00-\U0010FFFF]
"#,
            &["a"],
            &["b", "c", "ab", ""],
        ),
        (
            "any character in a choice",
            r#"root ::= (. | "x") "!""#,
            &["\n!", "x!", "é!"],
            &["!", "xx!"],
        ),
        (
            "left recursion",
            r#"root ::= root "a" | "b""#,
            &["b", "baaa"],
            &["", "ab"],
        ),
        (
            "CRLF line ends",
            "root ::= a\r\na ::= \"x\" |\r\n  \"y\"\r\n",
            &["x", "y"],
            &["xy"],
        ),
    ];

    #[test]
    fn gbnf_grammars_accept_what_llama_cpp_accepts() {
        let factory = byte_factory();
        for (name, gbnf, accepted, rejected) in LANGUAGES {
            for text in *accepted {
                assert!(
                    accepts(&factory, gbnf, text),
                    "{name}: rejects {text:?}\n{}",
                    gbnf_to_lark(gbnf).unwrap_or_default()
                );
            }
            for text in *rejected {
                assert!(
                    !accepts(&factory, gbnf, text),
                    "{name}: accepts {text:?}\n{}",
                    gbnf_to_lark(gbnf).unwrap_or_default()
                );
            }
        }
    }

    #[test]
    fn gbnf_lark_output_spells_each_construct() {
        let lark = gbnf_to_lark(
            "root ::= \"a\\\"\\\\\\n\" [^a-z\\x2F\\]] . my-rule{2,} <[7]> !<[8]> <think>\n\
             my-rule ::= (\"x\" | ) \"\"",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: root\n\
             root: \"a\" \"\\\"\" \"\\\\\" \"\\u000a\" /[^a-z\\/\\]]/ /(?s:.)/ my_rule{2,} \
             <[7]> <[^8]> <think>\n\
             my_rule: (\"x\" | \"\")\n"
        );
    }

    #[test]
    fn gbnf_rule_names_map_to_distinct_lark_names() {
        let lark = gbnf_to_lark(
            "root ::= Ws ws-1 WS-1 ws-1-2 start 2x\nWs ::= \"a\" \"a\"\nws-1 ::= \"b\" \"b\"\n\
             WS-1 ::= \"c\" \"c\"\nws-1-2 ::= \"d\" \"d\"\nstart ::= \"e\" \"e\"\n\
             2x ::= \"f\" \"f\"\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: root\n\
             root: ws ws_1 ws_1_3 ws_1_2 start_2 r2x\n\
             ws: \"a\" \"a\"\nws_1: \"b\" \"b\"\nws_1_3: \"c\" \"c\"\nws_1_2: \"d\" \"d\"\n\
             start_2: \"e\" \"e\"\nr2x: \"f\" \"f\"\n"
        );
    }

    #[test]
    fn gbnf_one_character_choices_become_one_regex() {
        let lark = gbnf_to_lark(
            "root ::= ch+ (\"x\" | [yz])\nch ::= letter | digit | [_-]\n\
             letter ::= [a-z] | [A-Z]\ndigit ::= [0-9]\nloop ::= loop | \"a\"\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: root\n\
             root: /[\\-0-9A-Z\\_a-z]/+ /[x-z]/\n\
             ch: /[\\-0-9A-Z\\_a-z]/\n\
             letter: /[A-Za-z]/\n\
             digit: /[0-9]/\n\
             loop: loop | \"a\"\n"
        );
    }

    #[test]
    fn gbnf_later_definition_replaces_earlier_as_in_llama_cpp() {
        let factory = byte_factory();
        let gbnf = "root ::= a\na ::= \"x\"\na ::= \"y\"\n";
        assert!(accepts(&factory, gbnf, "y"));
        assert!(!accepts(&factory, gbnf, "x"));
    }

    #[test]
    fn gbnf_deep_groups_become_rules() {
        let depth = 40;
        let gbnf = format!("root ::= {}\"x\"{}\n", "(".repeat(depth), ")".repeat(depth));
        let factory = byte_factory();
        assert!(accepts(&factory, &gbnf, "x"));
        assert!(!accepts(&factory, &gbnf, "xx"));
    }

    #[test]
    fn gbnf_repetition_limits_follow_llama_cpp() {
        let factory = byte_factory();
        // A maximum over 2000 means no maximum, as in llama.cpp.
        let unbounded = r#"root ::= "a"{1,5000}"#;
        assert!(accepts(&factory, unbounded, &"a".repeat(5001)));
        assert!(
            gbnf_to_lark(r#"root ::= "a"{2001}"#)
                .unwrap_err()
                .contains("exceeds llama.cpp's limit of 2000")
        );
    }

    #[test]
    fn gbnf_token_ids_match_tokens() {
        let factory = byte_factory();
        // In the byte vocabulary token 97 is `a`.
        assert!(accepts(&factory, "root ::= <[97]> \"b\"", "ab"));
        assert!(!accepts(&factory, "root ::= <[97]> \"b\"", "bb"));
        assert!(accepts(&factory, "root ::= !<[97]> \"b\"", "cb"));
        assert!(!accepts(&factory, "root ::= !<[97]> \"b\"", "ab"));
    }

    /// Each malformed grammar, the line and column of the error, and a part of its message.
    const ERRORS: &[(&str, &str)] = &[
        (
            "root ::= \"abc",
            "line 1, column 10: unterminated string literal",
        ),
        (
            "root ::= [abc",
            "line 1, column 10: unterminated character class",
        ),
        ("root ::= []", "line 1, column 10: empty character class"),
        (
            "root ::= [z-a]",
            "line 1, column 11: the range `z-a` is reversed",
        ),
        ("root ::= foo\n", "line 1, column 10: unknown rule `foo`"),
        (
            "a ::= \"x\"\nroot ::= a b-c\n",
            "line 2, column 12: unknown rule `b-c`",
        ),
        (
            "a ::= \"x\"\n",
            "line 1, column 1: the grammar has no `root` rule",
        ),
        (
            "# only a comment\n",
            "line 1, column 1: the grammar is empty",
        ),
        (
            "root = \"x\"",
            "line 1, column 6: expected `::=` after the rule name `root`",
        ),
        (
            "root ::= \"x\"\n::= \"y\"",
            "line 2, column 1: expected a rule name",
        ),
        (
            "root ::= (\"x\"",
            "line 1, column 10: this group is never closed",
        ),
        (
            "root ::= (\"x\" ]",
            "line 1, column 15: unexpected `]` in the group opened at line 1, column 10",
        ),
        (
            "root ::= \"x\" )",
            "line 1, column 14: unexpected `)` in rule `root`",
        ),
        (
            "root ::= \"x\"\n  | \"y\"",
            "line 2, column 3: expected a rule name",
        ),
        (
            "root ::= * \"x\"",
            "line 1, column 10: `*` must follow something to repeat",
        ),
        (
            "root ::= \"x\"{,3}",
            "line 1, column 14: expected a number after `{`",
        ),
        (
            "root ::= \"x\"{3;}",
            "line 1, column 15: expected `,` or `}`",
        ),
        (
            "root ::= \"x\"{1,2",
            "line 1, column 17: expected `}` to end the repetition",
        ),
        (
            "root ::= \"x\"{3,2}",
            "line 1, column 13: the repetition `{3,2}` has its maximum below its minimum",
        ),
        (
            "root ::= \"\\q\"",
            "line 1, column 11: unknown escape `\\q`",
        ),
        (
            "root ::= \"\\x4\"",
            "line 1, column 11: `\\x` needs 2 hexadecimal digits",
        ),
        (
            "root ::= \"\\uD800\"",
            "line 1, column 11: U+D800 is not a Unicode scalar value",
        ),
        (
            "root ::= [\\U00110000]",
            "line 1, column 11: U+110000 is not a Unicode scalar value",
        ),
        (
            "root ::= !<think>",
            "line 1, column 10: `!<think>` (any token but one named by its text)",
        ),
        (
            "root ::= <a b>",
            "line 1, column 10: the token `<a b>` cannot be passed to llguidance",
        ),
        (
            "root ::= <[x]>",
            "line 1, column 12: expected a token id after `<[`",
        ),
        (
            "root ::= <[99999999999]>",
            "line 1, column 12: token id 99999999999 is too large",
        ),
        ("root ::= <[1>", "line 1, column 13: expected `]>`"),
        ("root ::= <abc", "line 1, column 10: unterminated token"),
        (
            "root ::= !\"x\"",
            "line 1, column 11: expected `<` after `!`",
        ),
        (
            "root ::= \"é\" \"x\" @",
            "line 1, column 18: unexpected `@` in rule `root`",
        ),
        (
            "root ::= \"x\"\n\nfoo ::= \"y\" bar",
            "line 3, column 13: unknown rule `bar`",
        ),
    ];

    #[test]
    fn gbnf_nesting_is_bounded() {
        let groups = format!("root ::= {}\"x\"{}", "(".repeat(101), ")".repeat(101));
        assert!(
            gbnf_to_lark(&groups)
                .unwrap_err()
                .starts_with("line 1, column 110: groups are nested more than 100 deep")
        );
        let deep = format!(
            "root ::= {}\"x\"{}",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert!(gbnf_to_lark(&deep).is_err());
        let repeats = format!("root ::= \"x\"{}", "?".repeat(101));
        assert!(
            gbnf_to_lark(&repeats)
                .unwrap_err()
                .starts_with("line 1, column 113: repetitions are nested more than 100 deep")
        );
        let mixed = format!("root ::= {}\"x\"{}", "(".repeat(60), ")?".repeat(60));
        assert!(
            gbnf_to_lark(&mixed)
                .unwrap_err()
                .contains("groups and repetitions are nested more than 100 deep")
        );
        let within = format!("root ::= {}\"x\"{}", "(".repeat(50), ")?".repeat(49));
        assert!(gbnf_to_lark(&format!("{within})")).is_ok());
    }

    #[test]
    fn gbnf_errors_name_line_column_and_cause() {
        for (gbnf, expected) in ERRORS {
            let error = gbnf_to_lark(gbnf).expect_err(gbnf);
            assert!(
                error.starts_with(expected),
                "{gbnf:?}:\n  got      {error}\n  expected {expected}"
            );
        }
    }

    /// A recognizer for the parsed grammar, written straight from GBNF's meaning (the positions
    /// where each item can end), as the oracle for the compiled constraint. Grammars given to it
    /// must not be left-recursive.
    struct Reference {
        rules: HashMap<String, Alternatives>,
    }

    impl Reference {
        fn new(gbnf: &str) -> Self {
            let mut parser = Parser::new(gbnf);
            let definitions = parser.grammar().expect("the grammar parses");
            let grammar = Grammar::resolve(definitions, &parser).expect("the grammar resolves");
            Self {
                rules: grammar.rules.into_iter().collect(),
            }
        }

        fn accepts(&self, text: &str) -> bool {
            let text: Vec<char> = text.chars().collect();
            self.alternatives(&self.rules["root"], &text, 0)
                .contains(&text.len())
        }

        fn alternatives(
            &self,
            alternatives: &[Sequence],
            text: &[char],
            at: usize,
        ) -> BTreeSet<usize> {
            alternatives
                .iter()
                .flat_map(|sequence| {
                    sequence.iter().fold(BTreeSet::from([at]), |ends, item| {
                        ends.iter()
                            .flat_map(|&end| self.item(item, text, end))
                            .collect()
                    })
                })
                .collect()
        }

        fn item(&self, item: &Item, text: &[char], at: usize) -> BTreeSet<usize> {
            let next = text.get(at).copied();
            match item {
                Item::Literal(chars) if text[at..].starts_with(chars) => {
                    BTreeSet::from([at + chars.len()])
                }
                Item::Literal(_) => BTreeSet::new(),
                Item::Class { negated, ranges } => match next {
                    Some(c) if ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated => {
                        BTreeSet::from([at + 1])
                    }
                    _ => BTreeSet::new(),
                },
                Item::AnyChar if next.is_some() => BTreeSet::from([at + 1]),
                Item::AnyChar => BTreeSet::new(),
                Item::Rule { name, .. } => self.alternatives(&self.rules[name], text, at),
                Item::Group(alternatives) => self.alternatives(alternatives, text, at),
                Item::Token(_) => panic!("the reference has no tokens"),
                Item::Repeat { item, min, max } => {
                    // Ends after exactly `count` repetitions, until the count reaches `max` or
                    // adds no new end.
                    let mut current = BTreeSet::from([at]);
                    let mut ends = BTreeSet::new();
                    let mut count = 0;
                    loop {
                        if count >= *min {
                            let before = ends.len();
                            ends.extend(current.iter().copied());
                            if count > *min && ends.len() == before {
                                break;
                            }
                        }
                        if current.is_empty() || max.is_some_and(|max| count >= max) {
                            break;
                        }
                        current = current
                            .iter()
                            .flat_map(|&end| self.item(item, text, end))
                            .collect();
                        count += 1;
                    }
                    ends
                }
            }
        }
    }

    /// Grammars with the pieces their random texts are made of.
    const DIFFERENTIAL: &[(&str, &[&str])] = &[
        (
            "root ::= (\"return\" | \"re\" | ident) \" \" ident\nident ::= [a-z]+\n",
            &["return", "ret", "re", "r", "u", " ", "x"],
        ),
        (
            "root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n",
            &["1", "23", "+", "-", "(", ")"],
        ),
        (
            "root ::= (\"a\" | \"ab\" | \"abc\")* \"b\"?",
            &["a", "b", "c", "ab", "abc"],
        ),
        (
            "root ::= ws (item (\",\" ws item)*)? ws\n\
             item ::= [0-9] | [1-9] [0-9]{0,2}\nws ::= | \" \" | \"\\n\" [ \\t]{0,2}\n",
            &[",", " ", "0", "15", "\n", "\t"],
        ),
        (
            "root ::= (\"ab\"{1,2} \"c\"?){2,3} .?",
            &["ab", "abc", "a", "c", "x"],
        ),
        (
            "root ::= ([^a-c] | \"é\" \"b\"?)+ | \"😀\"{2}",
            &["a", "b", "é", "😀", "x"],
        ),
        (
            "root ::= (\"\" | \"a\" | x)* \"b\"\nx ::= \"a\"? \"c\"{0,1}\n",
            &["a", "b", "c"],
        ),
        (
            "root ::= word (sep word)*\nword ::= letter+\nletter ::= [a-c] | \"-\"\nsep ::= [ ,]",
            &["ab", "-", " ", ",", "c"],
        ),
    ];

    /// The compiled constraint accepts exactly the texts the reference accepts; each grammar's
    /// random texts include both kinds.
    #[test]
    fn gbnf_constraint_agrees_with_a_reference_recognizer() {
        use std::cell::Cell;

        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRng, TestRunner};

        let factory = byte_factory();
        for (gbnf, pieces) in DIFFERENTIAL {
            let matcher = compile(&factory, gbnf);
            let reference = Reference::new(gbnf);
            let texts = proptest::collection::vec(proptest::sample::select(pieces.to_vec()), 0..8);
            // A fixed seed: the same texts every run, so that the counts below cannot flake.
            let config = Config {
                cases: 300,
                failure_persistence: None,
                ..Config::default()
            };
            let rng = TestRng::deterministic_rng(config.rng_algorithm);
            let mut runner = TestRunner::new_with_rng(config, rng);
            let (accepted, rejected) = (Cell::new(0), Cell::new(0));
            let outcome = runner.run(&texts, |pieces| {
                let text = pieces.concat();
                let mut fresh = matcher.deep_clone();
                let taken = text
                    .bytes()
                    .all(|byte| fresh.consume_token(u32::from(byte)).is_ok());
                let ours = taken && fresh.is_accepting().unwrap_or(false);
                let expected = reference.accepts(&text);
                let counter = if expected { &accepted } else { &rejected };
                counter.set(counter.get() + 1);
                prop_assert_eq!(ours, expected, "text {:?}", text);
                Ok(())
            });
            let lark = gbnf_to_lark(gbnf).unwrap_or_default();
            if let Err(failure) = outcome {
                panic!("{failure}\ngrammar:\n{gbnf}\nLark:\n{lark}");
            }
            assert!(
                accepted.get() >= 10 && rejected.get() >= 10,
                "{} accepted and {} rejected texts: not a test of\n{gbnf}",
                accepted.get(),
                rejected.get()
            );
        }
    }

    /// Every grammar llama.cpp ships, from the folder in `GBNF_GRAMMARS_DIR`: it converts,
    /// llguidance compiles it, and the constraint accepts the sample output
    /// `tests/gbnf_grammars/samples/<name>.txt`. Run by scripts/check-gbnf, which fetches the
    /// grammars; one line per grammar.
    #[test]
    #[ignore = "needs llama.cpp's grammars folder: scripts/check-gbnf"]
    fn gbnf_llama_cpp_grammars_compile_and_accept_samples() {
        let Some(dir) = std::env::var_os("GBNF_GRAMMARS_DIR") else {
            panic!(
                "set GBNF_GRAMMARS_DIR to llama.cpp's grammars folder (scripts/check-gbnf does)"
            );
        };
        let samples =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gbnf_grammars/samples");
        let mut grammars: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.to_string_lossy()))
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|e| e == "gbnf"))
            .collect();
        grammars.sort();
        assert!(
            !grammars.is_empty(),
            "no .gbnf file in {}",
            dir.to_string_lossy()
        );
        let factory = byte_factory();
        let mut failures = 0;
        for path in &grammars {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            let outcome = check_grammar(&factory, path, &samples.join(format!("{name}.txt")));
            match outcome {
                Ok(detail) => println!("ok      {name}.gbnf: {detail}"),
                Err(why) => {
                    failures += 1;
                    println!("FAILED  {name}.gbnf: {why}");
                }
            }
        }
        assert_eq!(
            failures,
            0,
            "{failures} of {} grammars failed",
            grammars.len()
        );
    }

    fn check_grammar(
        factory: &ParserFactory,
        grammar: &std::path::Path,
        sample: &std::path::Path,
    ) -> Result<String, String> {
        let gbnf = std::fs::read_to_string(grammar).map_err(|e| format!("cannot read: {e}"))?;
        let lark = gbnf_to_lark(&gbnf).map_err(|e| format!("not converted: {e}"))?;
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.clone()))
            .map_err(|e| format!("llguidance refuses the Lark: {e}"))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(format!("llguidance refuses the Lark: {error}"));
        }
        let text = std::fs::read_to_string(sample)
            .map_err(|e| format!("no sample {}: {e}", sample.display()))?;
        for (offset, &byte) in text.as_bytes().iter().enumerate() {
            matcher.consume_token(u32::from(byte)).map_err(|e| {
                let line = text[..offset].matches('\n').count() + 1;
                let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
                format!("the sample is rejected at byte {offset} (line {line}): {first_line}")
            })?;
        }
        if !matcher.is_accepting().unwrap_or(false) {
            return Err("the sample is an incomplete output".into());
        }
        Ok(format!(
            "converted ({} Lark lines), compiled, accepts the {}-byte sample",
            lark.lines().count(),
            text.len()
        ))
    }
}
