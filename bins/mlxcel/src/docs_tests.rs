//! docs/cli.md keeps in step with the parser: every subcommand is in its table, every spelling
//! `generate` and `run` accept (their own, the other tools', those without effect) is named in it,
//! and every flag of every other subcommand is named in the page the table sends it to.

use clap::CommandFactory;

use crate::{Cli, commands};

const CLI_MD: &str = include_str!("../../../docs/cli.md");

/// The pages the subcommand table links to, by file name.
const PAGES: &[(&str, &str)] = &[
    ("cli.md", CLI_MD),
    ("server.md", include_str!("../../../docs/server.md")),
    ("benchmarks.md", include_str!("../../../docs/benchmarks.md")),
    ("capacity.md", include_str!("../../../docs/capacity.md")),
    ("model.md", include_str!("../../../docs/model.md")),
];

/// Whether `page` names `flag` in code (`` `--temp` ``, `` `--color` (`-co`) ``).
fn named_in(page: &str, flag: &str) -> bool {
    page.contains(&format!("`{flag}`")) || page.contains(&format!("`{flag} "))
}

/// Whether docs/cli.md names `flag` in code.
fn documented(flag: &str) -> bool {
    named_in(CLI_MD, flag)
}

/// The rows of docs/cli.md's subcommand table: the names in the first cell, and the page the
/// last cell links to (`below` and `#anchor` links are cli.md itself).
fn subcommand_rows() -> Vec<(Vec<&'static str>, &'static str)> {
    let table = CLI_MD
        .split_once("| subcommand | what it does | documented in |")
        .expect("the subcommand table")
        .1;
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            let names = cells[1]
                .split(',')
                .map(|name| name.trim().trim_matches('`'))
                .collect();
            let last = cells[cells.len() - 2];
            let page = last
                .split_once("](")
                .map(|(_, link)| link.split(['#', ')']).next().unwrap_or_default())
                .filter(|file| !file.is_empty())
                .unwrap_or("cli.md");
            (names, page)
        })
        .collect()
}

/// Every spelling of every flag of `sub` (its long name, short name and aliases), `--help` and
/// hidden arguments aside.
fn spellings(sub: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    for arg in sub.get_arguments() {
        if arg.is_positional() || arg.get_id() == "help" || arg.is_hide_set() {
            continue;
        }
        out.extend(
            arg.get_long()
                .into_iter()
                .chain(arg.get_all_aliases().into_iter().flatten())
                .map(|l| format!("--{l}")),
        );
        out.extend(
            arg.get_short()
                .into_iter()
                .chain(arg.get_all_short_aliases().into_iter().flatten())
                .map(|s| format!("-{s}")),
        );
    }
    out
}

#[test]
fn every_subcommand_is_in_the_table() {
    // The first cell of each row: `generate`, or `convert`, `pull`, `tokenize`.
    let listed: Vec<&str> = subcommand_rows()
        .into_iter()
        .flat_map(|(names, _)| names)
        .collect();
    for sub in Cli::command().get_subcommands() {
        let name = sub.get_name();
        assert!(
            listed.contains(&name),
            "docs/cli.md's table lacks `{name}`: {listed:?}"
        );
    }
}

#[test]
fn every_spelling_of_generate_and_run_is_documented() {
    let mut missing = Vec::new();
    for name in ["generate", "run"] {
        let mut cli = Cli::command();
        let sub = cli.find_subcommand_mut(name).expect("subcommand");
        missing.extend(spellings(sub).into_iter().filter(|s| !documented(s)));
    }
    for option in commands::ignored::NO_EFFECT {
        missing.extend(
            option
                .names
                .iter()
                .filter(|n| !documented(n))
                .map(|n| n.to_string()),
        );
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "not in docs/cli.md: {missing:?}");
}

#[test]
fn every_flag_of_every_subcommand_is_in_its_page() {
    let rows = subcommand_rows();
    let mut missing = Vec::new();
    for sub in Cli::command().get_subcommands() {
        let name = sub.get_name();
        let Some((_, file)) = rows.iter().find(|(names, _)| names.contains(&name)) else {
            panic!("docs/cli.md's table lacks `{name}`");
        };
        let Some((_, page)) = PAGES.iter().find(|(f, _)| f == file) else {
            panic!(
                "`{name}` is documented in {file}, which this test does not read: add it to PAGES"
            );
        };
        missing.extend(
            spellings(sub)
                .into_iter()
                .filter(|flag| !named_in(page, flag))
                .map(|flag| format!("{name} {flag} (docs/{file})")),
        );
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "flags not in their docs: {missing:?}");
}
