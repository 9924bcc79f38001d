//! `cargo xtask <check>`: the project's own gates, each exiting non-zero on a bad tree.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let check = args.next().unwrap_or_default();
    let root = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(xtask::workspace_root);
    let outcome = match check.as_str() {
        "check-versions" => xtask::check_versions(&root),
        "check-env-docs" => xtask::check_env_docs(&root),
        "check-layers" => xtask::check_layers(&root).and_then(|layers| {
            xtask::check_circles(&root).map(|circles| format!("{layers}; {circles}"))
        }),
        "check-compat" => xtask::check_compat(&root),
        _ => {
            eprintln!(
                "usage: cargo xtask <check-versions|check-env-docs|check-layers|check-compat> [WORKSPACE_ROOT]"
            );
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(summary) => {
            println!("{check}: {summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{check} failed:\n{err:#}");
            ExitCode::FAILURE
        }
    }
}
