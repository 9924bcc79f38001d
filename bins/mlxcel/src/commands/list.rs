//! `mlxcel list` (as `ollama list`): the models the cache holds, their sizes and where they are.

use std::process::ExitCode;

use anyhow::Result;

use super::cache::{Entry, entries, human_bytes};

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> Result<ExitCode> {
    let cache = mlxcel_model::cache_dir()?;
    let entries = entries(&cache)?;
    println!("cache: {}", cache.display());
    if entries.is_empty() {
        println!(
            "no models yet: `mlxcel pull` installs the default model, `-m FILE.gguf` prepares one"
        );
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table(&entries));
    Ok(ExitCode::SUCCESS)
}

/// The table: name, id, size in the cache, and the path `-m` takes (the GGUF for the default
/// model), with the GGUF a prepared directory reads when it lies outside the cache.
fn table(entries: &[Entry]) -> String {
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            let path = match (&e.model_arg, &e.gguf, &e.prepared) {
                (None, Some(gguf), _) => gguf.display().to_string(),
                (Some(arg), Some(gguf), Some(_)) => {
                    format!("{} (reads {})", arg.display(), gguf.display())
                }
                (Some(arg), _, _) => arg.display().to_string(),
                (None, None, Some(dir)) => dir.display().to_string(),
                (None, None, None) => e
                    .files
                    .first()
                    .map_or_else(String::new, |f| f.display().to_string()),
            };
            [
                e.label(),
                e.short_id().to_owned(),
                human_bytes(e.bytes),
                path,
            ]
        })
        .collect();
    let header = ["NAME", "ID", "SIZE", "PATH"].map(str::to_owned);
    let widths: Vec<usize> = (0..3)
        .map(|i| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        for (i, width) in widths.iter().enumerate() {
            out.push_str(&format!("{:<width$}  ", row[i]));
        }
        out.push_str(&row[3]);
        out.push('\n');
    }
    out
}
