//! The grammar resolved: every reference checked, one body per rule.

use std::collections::{HashMap, HashSet};

use super::ast::{Alternatives, Definition, Item};
use super::error::GbnfError;
use super::parser::Parser;

/// The rules by name, each with its last definition (a later `name ::=` replaces an earlier one,
/// as in llama.cpp), in the order of their first definition.
#[derive(Debug)]
pub(super) struct Grammar {
    pub(super) rules: Vec<(String, Alternatives)>,
}

impl Grammar {
    /// Checks every reference and the `root` rule.
    pub(super) fn resolve(
        definitions: Vec<Definition>,
        parser: &Parser,
    ) -> Result<Self, GbnfError> {
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

pub(super) fn visit_rules<'a>(alternatives: &'a Alternatives, f: &mut impl FnMut(&'a str, usize)) {
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
