//! The rules that always match exactly one character, written as one regex each.

use std::collections::{HashMap, HashSet};

use super::ast::{Alternatives, Item, Sequence};
use super::grammar::{Grammar, visit_rules};

/// Characters as sorted, disjoint, inclusive ranges.
pub(super) type CharSet = Vec<(char, char)>;

/// The rules that always match exactly one character, with the characters they match: a choice
/// between one-character items (`letter | digit | [_-]`) is written as one regex, which matches
/// the same single character but costs llguidance one lexeme per character instead of one per
/// alternative (it halves the time of a token mask for llama.cpp's english.gbnf).
///
/// Worked out without recursion (rule chains may be as long as the grammar): a rule whose body
/// has the shape of one character is resolved once every rule it names is; rules in a cycle
/// never are.
pub(super) fn one_char_rules(grammar: &Grammar) -> HashMap<&str, CharSet> {
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
pub(super) fn one_char_item(item: &Item, rules: &HashMap<&str, CharSet>) -> Option<CharSet> {
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
