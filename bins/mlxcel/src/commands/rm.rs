//! `mlxcel rm MODEL` (as `ollama rm`): removes a model from the cache. It never touches anything
//! outside the cache: a GGUF given with `-m` stays where it is; only its prepared directory goes.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use super::cache::{entries, find, human_bytes};

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The model: its name or id as `mlxcel list` prints them, `default`, or a path in the cache.
    pub model: String,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let cache = mlxcel_model::cache_dir()?;
    let entries = entries(&cache)?;
    let Some(entry) = find(&entries, &args.model)? else {
        let path = Path::new(&args.model);
        if path.exists() && !inside(&cache, path) {
            bail!(
                "{} is outside the cache ({}): mlxcel rm removes only what the cache holds \
                 (`mlxcel list`); delete other files yourself",
                args.model,
                cache.display()
            );
        }
        bail!(
            "{} is not a model in the cache ({}); `mlxcel list` shows the names and ids rm takes",
            args.model,
            cache.display()
        );
    };
    for file in &entry.files {
        // The entries are built from the cache's own listing; this only guards against a link.
        if !inside(&cache, file) {
            bail!("{} is outside the cache; not removed", file.display());
        }
    }
    // Judged before removing: the default model's GGUF is inside the cache, and then gone.
    let kept = entry
        .gguf
        .as_ref()
        .filter(|g| g.exists() && !inside(&cache, g));
    for file in &entry.files {
        let removed = if file.is_dir() {
            std::fs::remove_dir_all(file)
        } else {
            std::fs::remove_file(file)
        };
        removed.with_context(|| format!("removing {}", file.display()))?;
    }
    forget_hashes(&cache, &entry.id);
    println!(
        "removed {} ({}, {})",
        entry.label(),
        entry.short_id(),
        human_bytes(entry.bytes)
    );
    for file in &entry.files {
        println!("  {}", file.display());
    }
    if let Some(gguf) = kept {
        println!("kept {} (outside the cache)", gguf.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `path` lies inside `cache` (both canonical, so links and `..` cannot escape it).
fn inside(cache: &Path, path: &Path) -> bool {
    match (std::fs::canonicalize(cache), std::fs::canonicalize(path)) {
        (Ok(cache), Ok(path)) => path != cache && path.starts_with(&cache),
        _ => false,
    }
}

/// Drops the remembered hashes (`converted/<version>/by-path/`) that name `id`: they would only
/// lead a later run to prepare the same file again, which it does anyway.
fn forget_hashes(cache: &Path, id: &str) {
    if id.is_empty() {
        return;
    }
    let Ok(versions) = std::fs::read_dir(cache.join("converted")) else {
        return;
    };
    for version in versions.filter_map(|v| v.ok()) {
        let Ok(memos) = std::fs::read_dir(version.path().join("by-path")) else {
            continue;
        };
        for memo in memos.filter_map(|m| m.ok()) {
            let names_id = std::fs::read_to_string(memo.path()).is_ok_and(|text| {
                text.trim()
                    .rsplit_once(' ')
                    .is_some_and(|(_, sha)| sha == id)
            });
            if names_id {
                let _ = std::fs::remove_file(memo.path());
            }
        }
    }
}
