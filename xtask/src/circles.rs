//! The import-circle gate: inside each workspace crate, no two source files depend on each other,
//! directly or around a longer loop. A file depends on another when it names an item defined
//! there, however it reaches it: `use crate::a::Item`, an inline `crate::a::Item` or
//! `super::Item` path, a module alias (`use crate::a; a::Item`), or a re-export: `crate::Item`
//! re-exported by `lib.rs` from `a.rs` is an arrow to `a.rs`, not to `lib.rs`. That last rule is
//! why this gate exists beside [`check_layers`](crate::check_layers): circles hidden behind
//! `crate::` re-exports are invisible to a reader who follows only `use` lines.
//!
//! The reading is lexical (comments and literals stripped, `use` trees parsed, paths resolved
//! against the modules and items each file declares); `#[cfg(test)]` items are left out, as tests
//! may reach anywhere. `mod x;` and `pub use x::Item;` are containment and re-export, not arrows.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// One arrow between two files of a crate, with the names that make it.
type Arrows = BTreeMap<(usize, usize), BTreeSet<String>>;

/// Checks every workspace crate's `src/` for import circles between files; returns a summary.
pub fn check_circles(root: &Path) -> Result<String> {
    let mut problems = Vec::new();
    let (mut files, mut arrows, mut crates) = (0, 0, 0);
    for src in crate_sources(root)? {
        let graph = CrateGraph::read(&src)?;
        crates += 1;
        files += graph.files.len();
        arrows += graph.arrows.len();
        for circle in graph.circles() {
            problems.push(graph.describe(root, &circle));
        }
    }
    if !problems.is_empty() {
        bail!(
            "{} import circle(s) between files (a file names an item of another that names one of \
             its own; move the shared items to a file both can import, or invert one arrow):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
    Ok(format!(
        "{crates} crates, {files} files, {arrows} arrows between files, no circles"
    ))
}

/// The `src/` folder of each workspace member that has one.
fn crate_sources(root: &Path) -> Result<Vec<PathBuf>> {
    let path = root.join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: toml::Value =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(toml::Value::as_array)
        .context("Cargo.toml has no [workspace] members")?;
    Ok(members
        .iter()
        .filter_map(toml::Value::as_str)
        .map(|member| root.join(member).join("src"))
        .filter(|src| src.is_dir())
        .collect())
}

/// A module: the file it lives in, the items it defines and what it re-exports.
#[derive(Default)]
struct Module {
    file: usize,
    defines: HashSet<String>,
    /// `pub use` lines: the name each binds (`*` for a glob) and the absolute path it names
    /// (for a glob, the module).
    reexports: Vec<(String, Vec<String>)>,
}

/// A reference found in a file: from which module, to which path (as written).
struct Reference {
    file: usize,
    module: Vec<String>,
    path: Vec<String>,
}

struct CrateGraph {
    files: Vec<PathBuf>,
    arrows: Arrows,
}

impl CrateGraph {
    fn read(src: &Path) -> Result<Self> {
        let mut files = Vec::new();
        collect_rs(src, &mut files)?;
        files.sort();
        let mut modules: HashMap<Vec<String>, Module> = HashMap::new();
        let mut references = Vec::new();
        for (index, file) in files.iter().enumerate() {
            let Some(module) = module_path(src, file) else {
                continue;
            };
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let tokens = tokenize(&text);
            Reader {
                tokens: &tokens,
                at: 0,
                file: index,
                modules: &mut modules,
                references: &mut references,
            }
            .read_module(module);
        }
        let resolver = Resolver { modules: &modules };
        let mut arrows = Arrows::new();
        for reference in &references {
            let mut seen = HashSet::new();
            if let Some(target) = resolver.resolve(&reference.module, &reference.path, &mut seen)
                && target != reference.file
            {
                let name = reference.path.join("::");
                arrows
                    .entry((reference.file, target))
                    .or_default()
                    .insert(name);
            }
        }
        Ok(Self { files, arrows })
    }

    /// The strongly connected groups of more than one file (Tarjan's algorithm).
    fn circles(&self) -> Vec<Vec<usize>> {
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); self.files.len()];
        for &(from, to) in self.arrows.keys() {
            next[from].push(to);
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; self.files.len()],
            low: vec![0; self.files.len()],
            on_stack: vec![false; self.files.len()],
            stack: Vec::new(),
            counter: 0,
            groups: Vec::new(),
        };
        for file in 0..self.files.len() {
            if tarjan.index[file].is_none() {
                tarjan.visit(file);
            }
        }
        tarjan.groups.retain(|group| group.len() > 1);
        tarjan.groups
    }

    fn describe(&self, root: &Path, circle: &[usize]) -> String {
        let name = |file: usize| {
            let path = &self.files[file];
            path.strip_prefix(root)
                .unwrap_or(path)
                .display()
                .to_string()
        };
        let mut lines = vec![format!(
            "circle of {} files: {}",
            circle.len(),
            circle
                .iter()
                .map(|&f| name(f))
                .collect::<Vec<_>>()
                .join(", ")
        )];
        for ((from, to), names) in &self.arrows {
            if circle.contains(from) && circle.contains(to) {
                // `a::Enum` stands for `a::Enum::Variant` and `a::Type::method` too.
                let names: Vec<&str> = names
                    .iter()
                    .filter(|name| {
                        !names
                            .iter()
                            .any(|shorter| name.starts_with(&format!("{shorter}::")))
                    })
                    .map(String::as_str)
                    .collect();
                lines.push(format!(
                    "  {} -> {}: {}",
                    name(*from),
                    name(*to),
                    names.join(", ")
                ));
            }
        }
        lines.join("\n")
    }
}

struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    groups: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, node: usize) {
        self.index[node] = Some(self.counter);
        self.low[node] = self.counter;
        self.counter += 1;
        self.stack.push(node);
        self.on_stack[node] = true;
        for &to in &self.next[node] {
            match self.index[to] {
                None => {
                    self.visit(to);
                    self.low[node] = self.low[node].min(self.low[to]);
                }
                Some(index) if self.on_stack[to] => self.low[node] = self.low[node].min(index),
                Some(_) => {}
            }
        }
        if Some(self.low[node]) == self.index[node] {
            let mut group = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack[top] = false;
                group.push(top);
                if top == node {
                    break;
                }
            }
            group.sort_unstable();
            self.groups.push(group);
        }
    }
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The module a file holds: `lib.rs`/`main.rs` the crate root, `a/mod.rs` and `a.rs` module `a`,
/// `a/b.rs` module `a::b`. `src/bin/` holds other crates' roots and is left out.
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.is_empty() && (stem == "lib" || stem == "main") || stem == "mod" {
        return Some(parts);
    }
    parts.push(stem.to_owned());
    Some(parts)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// Identifiers, `::` and single punctuation, with comments, strings, chars and lifetimes dropped.
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' || ((c == 'r' || c == 'b') && raw_string_start(&chars, i).is_some()) {
            i = skip_string(&chars, i);
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a): only the first closes.
            if at(i + 1) == '\\' {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            if ident == "r" && at(i) == '#' {
                // A raw identifier `r#name`: the name follows the `#`.
                i += 1;
            } else {
                tokens.push(Token::Ident(ident));
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token::PathSep);
            i += 2;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else {
            if !c.is_whitespace() {
                tokens.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    tokens
}

/// Where a raw or byte string starts at `i` (`r"`, `r#"`, `b"`, `br"`, `br#"`): its `#` count.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) == Some(&'r') {
        j += 1;
    }
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    (j > i && chars.get(j + hashes) == Some(&'"')).then_some(hashes)
}

/// The index just past the string literal that starts at `i`.
fn skip_string(chars: &[char], i: usize) -> usize {
    let hashes = raw_string_start(chars, i);
    let raw = hashes.is_some() && chars[i..].iter().take(2).any(|&c| c == 'r');
    let hashes = hashes.unwrap_or(0);
    let mut j = i;
    while chars.get(j) != Some(&'"') {
        j += 1;
    }
    j += 1;
    while j < chars.len() {
        if !raw && chars[j] == '\\' {
            j += 2;
            continue;
        }
        if chars[j] == '"' && chars[j + 1..].iter().take(hashes).all(|&c| c == '#') {
            return j + 1 + hashes;
        }
        j += 1;
    }
    j
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod",
];

/// Walks one file's tokens, recording each module's definitions and re-exports and every path
/// that may name another file's item.
struct Reader<'a> {
    tokens: &'a [Token],
    at: usize,
    file: usize,
    modules: &'a mut HashMap<Vec<String>, Module>,
    references: &'a mut Vec<Reference>,
}

impl Reader<'_> {
    fn ident(&self, at: usize) -> Option<&str> {
        match self.tokens.get(at) {
            Some(Token::Ident(name)) => Some(name),
            _ => None,
        }
    }

    fn is(&self, at: usize, punct: char) -> bool {
        self.tokens.get(at) == Some(&Token::Punct(punct))
    }

    /// Reads items until the module's closing brace (or the end of the file at depth 0).
    fn read_module(&mut self, module: Vec<String>) {
        self.modules.entry(module.clone()).or_default().file = self.file;
        let mut aliases: HashMap<String, Vec<String>> = HashMap::new();
        let mut depth = 0usize;
        let mut public = false;
        while self.at < self.tokens.len() {
            let at = self.at;
            match &self.tokens[at] {
                Token::Punct('{') => {
                    depth += 1;
                    self.at += 1;
                }
                Token::Punct('}') => {
                    self.at += 1;
                    if depth == 0 {
                        return;
                    }
                    depth -= 1;
                }
                Token::Punct('#') if self.is_cfg_test(at) => self.skip_item(),
                Token::Ident(word) if word == "pub" => {
                    public = depth == 0;
                    self.at += 1;
                    if self.is(self.at, '(') {
                        self.skip_group('(', ')');
                    }
                    continue;
                }
                Token::Ident(word) if word == "use" => {
                    self.at += 1;
                    let mut paths = Vec::new();
                    self.read_use_tree(&mut Vec::new(), &mut paths);
                    for (path, alias) in paths {
                        let bound = alias.or_else(|| path.last().cloned()).unwrap_or_default();
                        if public {
                            let mut target = self.absolute(&module, &path);
                            if bound == "*" {
                                target.pop();
                            }
                            let entry = self.modules.entry(module.clone()).or_default();
                            entry.reexports.push((bound, target));
                        } else {
                            if bound != "*" && path.len() > 1 {
                                aliases.insert(bound, path.clone());
                            }
                            self.reference(&module, path);
                        }
                    }
                }
                Token::Ident(word) if word == "mod" && depth == 0 => {
                    if let Some(name) = self.ident(at + 1).map(str::to_owned) {
                        self.define(&module, &name);
                        if self.is(at + 2, '{') {
                            self.at = at + 3;
                            let mut inner = module.clone();
                            inner.push(name);
                            self.read_module(inner);
                            self.modules.entry(module.clone()).or_default().file = self.file;
                        } else {
                            self.at = at + 2;
                        }
                    } else {
                        self.at += 1;
                    }
                }
                Token::Ident(word) if depth == 0 && (ITEM_KEYWORDS.contains(&word.as_str())) => {
                    if let Some(name) = self.ident(at + 1).map(str::to_owned) {
                        self.define(&module, &name);
                    }
                    self.at += 1;
                }
                Token::Ident(word) if word == "macro_rules" && self.is(at + 1, '!') => {
                    if let Some(name) = self.ident(at + 2).map(str::to_owned) {
                        self.define(&module, &name);
                    }
                    self.at += 1;
                }
                Token::Ident(first) if self.tokens.get(at + 1) == Some(&Token::PathSep) => {
                    let starts_path = at == 0 || self.tokens[at - 1] != Token::PathSep;
                    let first = first.clone();
                    let mut path = vec![first.clone()];
                    let mut next = at + 1;
                    while self.tokens.get(next) == Some(&Token::PathSep) {
                        match self.ident(next + 1) {
                            Some(segment) => path.push(segment.to_owned()),
                            None => break,
                        }
                        next += 2;
                    }
                    self.at = next;
                    if starts_path {
                        if let Some(target) = aliases.get(&first) {
                            let mut full = target.clone();
                            full.extend(path.into_iter().skip(1));
                            self.reference(&module, full);
                        } else {
                            self.reference(&module, path);
                        }
                    }
                }
                _ => self.at += 1,
            }
            if !matches!(self.tokens.get(at), Some(Token::Ident(w)) if w == "pub") {
                public = false;
            }
        }
    }

    fn define(&mut self, module: &[String], name: &str) {
        self.modules
            .entry(module.to_vec())
            .or_default()
            .defines
            .insert(name.to_owned());
    }

    fn reference(&mut self, module: &[String], path: Vec<String>) {
        self.references.push(Reference {
            file: self.file,
            module: module.to_vec(),
            path,
        });
    }

    /// A path made absolute against `module` for `crate`, `self` and `super`; other first
    /// segments are kept (a child module or another crate, decided at resolution).
    fn absolute(&self, module: &[String], path: &[String]) -> Vec<String> {
        absolute(module, path).unwrap_or_else(|| {
            let mut full = module.to_vec();
            full.extend(path.iter().cloned());
            full
        })
    }

    /// `#[cfg(test)]` (or `#[cfg(all(test, ...))]`) at `at`.
    fn is_cfg_test(&self, at: usize) -> bool {
        self.is(at + 1, '[')
            && self.ident(at + 2) == Some("cfg")
            && self.is(at + 3, '(')
            && (self.ident(at + 4) == Some("test")
                || (self.ident(at + 4) == Some("all") && self.ident(at + 6) == Some("test")))
    }

    /// Skips an attribute and the item it is on: to the item's `;` or past its braces.
    fn skip_item(&mut self) {
        self.at += 1;
        self.skip_group('[', ']');
        while self.at < self.tokens.len() {
            if self.is(self.at, '#') && self.is(self.at + 1, '[') {
                self.at += 1;
                self.skip_group('[', ']');
            } else if self.is(self.at, ';') {
                self.at += 1;
                return;
            } else if self.is(self.at, '{') {
                self.skip_group('{', '}');
                return;
            } else {
                self.at += 1;
            }
        }
    }

    /// Skips a balanced group that opens at the current token.
    fn skip_group(&mut self, open: char, close: char) {
        let mut depth = 0usize;
        while self.at < self.tokens.len() {
            if self.is(self.at, open) {
                depth += 1;
            } else if self.is(self.at, close) {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    self.at += 1;
                    return;
                }
            }
            self.at += 1;
        }
    }

    /// Parses a use tree up to its `;` (or the `,`/`}` that ends a nested one) into paths, each
    /// with the alias it binds (`as name`, `None` for the last segment).
    fn read_use_tree(
        &mut self,
        prefix: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        let base = prefix.len();
        loop {
            match self.tokens.get(self.at) {
                Some(Token::Ident(name)) if name == "as" => {
                    let alias = self.ident(self.at + 1).map(str::to_owned);
                    self.at += 2;
                    if let Some((_, bound)) = out.last_mut() {
                        *bound = alias;
                    }
                }
                Some(Token::Ident(name)) => {
                    let name = name.clone();
                    self.at += 1;
                    if name == "self" && !prefix.is_empty() {
                        // `use a::b::{self, C}`: `self` is the module the braces open.
                        out.push((prefix.clone(), None));
                    } else {
                        prefix.push(name);
                        if self.tokens.get(self.at) != Some(&Token::PathSep) {
                            out.push((prefix.clone(), None));
                        }
                    }
                }
                Some(Token::PathSep) => self.at += 1,
                Some(Token::Punct('*')) => {
                    self.at += 1;
                    let mut glob = prefix.clone();
                    glob.push("*".to_owned());
                    out.push((glob, None));
                }
                Some(Token::Punct('{')) => {
                    self.at += 1;
                    loop {
                        let mut inner = prefix.clone();
                        self.read_use_tree(&mut inner, out);
                        match self.tokens.get(self.at) {
                            Some(Token::Punct(',')) => self.at += 1,
                            Some(Token::Punct('}')) => {
                                self.at += 1;
                                break;
                            }
                            _ => break,
                        }
                        if self.is(self.at, '}') {
                            self.at += 1;
                            break;
                        }
                    }
                }
                Some(Token::Punct(',')) | Some(Token::Punct('}')) => {
                    prefix.truncate(base);
                    return;
                }
                Some(Token::Punct(';')) => {
                    self.at += 1;
                    prefix.truncate(base);
                    return;
                }
                Some(_) => self.at += 1,
                None => return,
            }
        }
    }
}

/// `path` made absolute from `module` when it starts with `crate`, `self` or `super`.
fn absolute(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base = module.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

struct Resolver<'a> {
    modules: &'a HashMap<Vec<String>, Module>,
}

impl Resolver<'_> {
    /// The file that defines what `path`, written in `module`, names; `None` for other crates,
    /// locals and anything this reading cannot place.
    fn resolve(
        &self,
        module: &[String],
        path: &[String],
        seen: &mut HashSet<Vec<String>>,
    ) -> Option<usize> {
        let full = match absolute(module, path) {
            Some(full) => full,
            None => {
                // A path from a child module of `module` (e.g. `scheduler::Step` in lib.rs).
                let mut child = module.to_vec();
                child.push(path.first()?.clone());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                let mut full = module.to_vec();
                full.extend(path.iter().cloned());
                full
            }
        };
        self.resolve_absolute(&full, seen)
    }

    fn resolve_absolute(&self, full: &[String], seen: &mut HashSet<Vec<String>>) -> Option<usize> {
        if !seen.insert(full.to_vec()) {
            return None;
        }
        let mut current: Vec<String> = Vec::new();
        for (index, segment) in full.iter().enumerate() {
            if segment == "*" {
                break;
            }
            let mut child = current.clone();
            child.push(segment.clone());
            if self.modules.contains_key(&child) {
                current = child;
                continue;
            }
            return self.resolve_item(&current, segment, &full[index + 1..], seen);
        }
        self.modules.get(&current).map(|m| m.file)
    }

    fn resolve_item(
        &self,
        module: &[String],
        name: &str,
        rest: &[String],
        seen: &mut HashSet<Vec<String>>,
    ) -> Option<usize> {
        let found = self.modules.get(module)?;
        if found.defines.contains(name) {
            return Some(found.file);
        }
        for (bound, target) in &found.reexports {
            if bound == name {
                let mut full = target.clone();
                full.extend(rest.iter().cloned());
                if let Some(file) = self.resolve_absolute(&full, seen) {
                    return Some(file);
                }
            }
        }
        for (bound, target) in &found.reexports {
            if bound == "*" {
                let mut full = target.clone();
                full.push(name.to_owned());
                full.extend(rest.iter().cloned());
                if let Some(file) = self.resolve_absolute(&full, seen) {
                    return Some(file);
                }
            }
        }
        None
    }
}
