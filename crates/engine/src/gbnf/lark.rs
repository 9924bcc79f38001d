//! The resolved grammar written as Lark for llguidance, one character per lexeme.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::ast::{Item, Sequence, Token};
use super::grammar::Grammar;
use super::one_char::{CharSet, one_char_item, one_char_rules};

/// llguidance's Lark parser refuses groups nested 30 deep (its `MAX_NESTING`); a group nested
/// deeper than this becomes a rule of its own.
const MAX_INLINE_DEPTH: usize = 12;

/// Writes the Lark grammar: `start: root`, then one rule per GBNF rule, then the rules that deep
/// groups were moved into.
pub(super) struct Emitter<'g> {
    grammar: &'g Grammar,
    names: HashMap<&'g str, String>,
    used: HashSet<String>,
    one_char: HashMap<&'g str, CharSet>,
    /// Rules made of groups nested too deep to write inline: (name, body).
    hoisted: Vec<(String, String)>,
}

impl<'g> Emitter<'g> {
    pub(super) fn new(grammar: &'g Grammar) -> Self {
        let (names, used) = lark_names(grammar.rules.iter().map(|(name, _)| name.as_str()));
        Self {
            grammar,
            names,
            used,
            one_char: one_char_rules(grammar),
            hoisted: Vec::new(),
        }
    }

    pub(super) fn lark(mut self) -> String {
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
