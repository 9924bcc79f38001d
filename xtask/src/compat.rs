//! The llama-server compatibility gate: `compat/llama-server/<build>/manifest.toml` against what
//! mlxcel-server accepts and what its tests exercise.
//!
//! - Every entry is curated: a known state, `to` when aliased, a `note` when not applicable,
//!   deferred or by design (`unreviewed` is what the generator writes for a new entry).
//! - Every spelling mlxcel-server accepts (`compat/llama-server/accepted-flags.txt`, which a test
//!   of the server crate keeps equal to the parser) is an option of the manifest or one of
//!   mlxcel's own (`[mlxcel_only]`).
//! - Every spelling of a supported, aliased or not-applicable option is accepted (a llama-server
//!   command line must start mlxcel-server), and no deferred or by-design one is.
//! - Every supported or aliased entry is named by a test that drives the binary or the HTTP
//!   server (`bins/mlxcel-server/tests`, `crates/server/tests`), and a supported route is in the
//!   router's table.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use toml::Value;

const COMPAT: &str = "compat/llama-server";
const ACCEPTED: &str = "compat/llama-server/accepted-flags.txt";
const ROUTES: &str = "crates/server/src/routes.rs";
const TEST_DIRS: &[&str] = &["crates/server/tests", "bins/mlxcel-server/tests"];
const STATES: &[&str] = &[
    "supported",
    "aliased",
    "not_applicable",
    "deferred",
    "by_design",
];
const TABLES: &[&str] = &["option", "route", "field", "response", "metric"];

/// Checks every manifest under `compat/llama-server/`; returns a one-line summary.
pub fn check_compat(root: &Path) -> Result<String> {
    let dir = root.join(COMPAT);
    let mut manifests = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path().join("manifest.toml");
        if path.is_file() {
            manifests.push(path);
        }
    }
    manifests.sort();
    if manifests.is_empty() {
        bail!("no manifest under {COMPAT}/<build>/manifest.toml");
    }
    let accepted = read_lines(&root.join(ACCEPTED))?;
    let tests = test_text(root)?;
    let routes =
        std::fs::read_to_string(root.join(ROUTES)).with_context(|| format!("reading {ROUTES}"))?;
    let mut problems = Vec::new();
    let mut summaries = Vec::new();
    for path in &manifests {
        let build = path
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let manifest: Value =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let counts = check_manifest(&build, &manifest, &accepted, &tests, &routes, &mut problems);
        summaries.push(format!("{build}: {counts}"));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(summaries.join("; "))
}

fn read_lines(path: &Path) -> Result<BTreeSet<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

/// The text of every Rust file under the test directories, concatenated.
fn test_text(root: &Path) -> Result<String> {
    fn walk(path: &Path, out: &mut String) -> Result<()> {
        if path.is_dir() {
            for entry in
                std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))?
            {
                walk(&entry?.path(), out)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?,
            );
            out.push('\n');
        }
        Ok(())
    }
    let mut text = String::new();
    for dir in TEST_DIRS {
        let path = root.join(dir);
        if path.exists() {
            walk(&path, &mut text)?;
        }
    }
    Ok(text)
}

fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// What a test must contain to count as exercising the entry: the spelling or name in quotes
/// (a flag may be followed by `=`), or a metric family's name followed by a non-name character.
fn named_by_tests(table: &str, needle: &str, tests: &str) -> bool {
    if table == "metric" {
        return tests.match_indices(needle).any(|(i, _)| {
            !tests[i + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        });
    }
    tests.contains(&format!("\"{needle}\"")) || tests.contains(&format!("\"{needle}="))
}

/// The names a test must mention for an entry: every spelling of an option and its variable,
/// a route's path (`:name` segments written `{name}`), a field's or response's last name
/// segment, a metric's family.
fn needles(table: &str, entry: &Value, key: &str) -> Vec<String> {
    match table {
        "option" => {
            let mut names = strings(entry.get("flags"));
            names.extend(strings(entry.get("negated")));
            names.extend(strings(entry.get("env")));
            names
        }
        // llama-server's `:name` path segments are the router's `{name}`.
        "route" => {
            let path = key.split_once(' ').map_or(key, |(_, p)| p);
            let segments: Vec<String> = path
                .split('/')
                .map(|s| {
                    s.strip_prefix(':')
                        .map_or_else(|| s.to_owned(), |n| format!("{{{n}}}"))
                })
                .collect();
            vec![segments.join("/")]
        }
        "field" | "response" => {
            let name = key.split_once(':').map_or(key, |(_, n)| n);
            let name = name.trim_start_matches('?');
            vec![name.rsplit('.').next().unwrap_or(name).to_owned()]
        }
        _ => vec![key.to_owned()],
    }
}

fn check_manifest(
    build: &str,
    manifest: &Value,
    accepted: &BTreeSet<String>,
    tests: &str,
    routes: &str,
    problems: &mut Vec<String>,
) -> String {
    let mut known: BTreeSet<String> =
        strings(manifest.get("mlxcel_only").and_then(|t| t.get("flags")))
            .into_iter()
            .collect();
    let mut counts: Vec<(String, usize)> = STATES.iter().map(|s| (s.to_string(), 0)).collect();
    for table in TABLES {
        let Some(entries) = manifest.get(*table).and_then(Value::as_array) else {
            problems.push(format!("{build}: the manifest has no [[{table}]] entries"));
            continue;
        };
        for entry in entries {
            let key = entry.get("key").and_then(Value::as_str).unwrap_or("?");
            let what = format!("{build}: {table} `{key}`");
            let state = entry.get("state").and_then(Value::as_str).unwrap_or("");
            match counts.iter_mut().find(|(s, _)| s == state) {
                Some((_, n)) => *n += 1,
                None => {
                    problems.push(format!(
                        "{what} has state `{state}`: expected one of {}",
                        STATES.join(", ")
                    ));
                    continue;
                }
            }
            let has = |field: &str| {
                entry
                    .get(field)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.trim().is_empty())
            };
            if state == "aliased" && !has("to") {
                problems.push(format!("{what} is aliased but names no `to`"));
            }
            if matches!(state, "not_applicable" | "deferred" | "by_design") && !has("note") {
                problems.push(format!("{what} is {state} but has no `note` saying why"));
            }
            let names = needles(table, entry, key);
            if *table == "option" {
                known.extend(names.iter().cloned());
                for name in &names {
                    let is_accepted = accepted.contains(name);
                    match state {
                        "supported" | "aliased" | "not_applicable" if !is_accepted => problems
                            .push(format!(
                                "{what} is {state} but mlxcel-server does not accept `{name}` \
                                 (a llama-server command line must start it)"
                            )),
                        "deferred" | "by_design" if is_accepted => problems.push(format!(
                            "{what} is {state} but mlxcel-server accepts `{name}`: \
                             curate its state"
                        )),
                        _ => {}
                    }
                }
            }
            if matches!(state, "supported" | "aliased") {
                for name in &names {
                    if !named_by_tests(table, name, tests) {
                        problems.push(format!(
                            "{what} is {state} but no test under {} names `{name}`",
                            TEST_DIRS.join(" or ")
                        ));
                    }
                }
                if *table == "route" && !routes.contains(&format!("\"{}\"", names[0])) {
                    problems.push(format!(
                        "{what} is {state} but {ROUTES} has no route `{}`",
                        names[0]
                    ));
                }
            }
        }
    }
    for name in accepted.difference(&known) {
        problems.push(format!(
            "mlxcel-server accepts `{name}`, which {build}'s manifest does not list \
             (an option's flags or env, or [mlxcel_only])"
        ));
    }
    counts
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}
