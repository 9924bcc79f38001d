//! docs/cli.md keeps in step with the parser: every subcommand is in its table, and every
//! spelling `generate` and `run` accept (their own, the other tools', those without effect) is
//! named in it.

use clap::CommandFactory;

use crate::{Cli, commands};

const CLI_MD: &str = include_str!("../../../docs/cli.md");

/// Whether docs/cli.md names `flag` in code (`` `--temp` ``, `` `--color` (`-co`) ``).
fn documented(flag: &str) -> bool {
    CLI_MD.contains(&format!("`{flag}`")) || CLI_MD.contains(&format!("`{flag} "))
}

#[test]
fn every_subcommand_is_in_the_table() {
    let table = CLI_MD
        .split_once("| subcommand | what it does | documented in |")
        .expect("the subcommand table")
        .1;
    // The first cell of each row: `generate`, or `convert`, `pull`, `tokenize`.
    let listed: Vec<&str> = table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| line.split('|').nth(1))
        .flat_map(|cell| cell.split(','))
        .map(|name| name.trim().trim_matches('`'))
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
        for arg in sub.get_arguments() {
            if arg.is_positional() || arg.get_id() == "help" || arg.is_hide_set() {
                continue;
            }
            let spellings = arg
                .get_long()
                .into_iter()
                .chain(arg.get_all_aliases().into_iter().flatten())
                .map(|l| format!("--{l}"))
                .chain(
                    arg.get_short()
                        .into_iter()
                        .chain(arg.get_all_short_aliases().into_iter().flatten())
                        .map(|s| format!("-{s}")),
                );
            missing.extend(spellings.filter(|s| !documented(s)));
        }
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
