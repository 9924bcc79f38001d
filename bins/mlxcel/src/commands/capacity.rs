//! `mlxcel capacity`: plan which static shape a request gets, without loading a model.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use mlxcel_capacity::{
    CONTEXT_BUCKETS_ENV, CONTEXT_CAPACITY_ENV, CapacityOverrides, MaxNewTokens, Request,
    resolve_context_capacity, route, server_buckets,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Prompt length in tokens (after the chat template).
    #[arg(long, value_name = "P")]
    prompt_tokens: Option<usize>,

    /// Tokens to generate; -1 means unlimited (up to the room the shape leaves).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,

    /// The checkpoint's context window (max_position_embeddings).
    #[arg(long, default_value_t = 131_072, value_name = "W")]
    window: usize,

    /// Worst-case tokens the request's images expand to.
    #[arg(long, default_value_t = 0, value_name = "I")]
    image_tokens: usize,

    /// Print the server's bucket set for the window, and where the request would route.
    #[arg(long)]
    buckets: bool,

    /// With --buckets: the smallest capacity that holds one image (added when above the derived set).
    #[arg(long, value_name = "TOKENS", requires = "buckets")]
    image_floor: Option<usize>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    let max_new_tokens = MaxNewTokens::from_signed(args.n_predict).with_context(|| {
        format!(
            "-n {} is not a token budget; give -1 (unlimited) or a count >= 0",
            args.n_predict
        )
    })?;
    let overrides = CapacityOverrides::from_env()?;
    if args.buckets {
        print_buckets(args, &overrides, max_new_tokens)
    } else {
        let prompt_tokens = args.prompt_tokens.context(
            "--prompt-tokens is required (or pass --buckets to list the server buckets)",
        )?;
        print_resolution(args, &overrides, prompt_tokens, max_new_tokens)
    }
}

fn print_resolution(
    args: &Args,
    overrides: &CapacityOverrides,
    prompt_tokens: usize,
    max_new_tokens: MaxNewTokens,
) -> Result<ExitCode> {
    let request = Request {
        prompt_len: prompt_tokens,
        image_tokens: args.image_tokens,
        max_new_tokens,
    };
    let resolution = resolve_context_capacity(&request, args.window, overrides.pinned_capacity)?;
    match resolution.sizing_line() {
        Some(line) => println!("{line}"),
        None => println!(
            "pinned context capacity {} ({CONTEXT_CAPACITY_ENV}) admits {} prompt + up to {}",
            resolution.context_capacity,
            resolution.effective_prompt_len,
            resolution.admitted_max_new_tokens
        ),
    }
    if max_new_tokens == MaxNewTokens::Unlimited {
        println!(
            "-n -1 (unlimited) resolved to {} new tokens",
            resolution.admitted_max_new_tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_buckets(
    args: &Args,
    overrides: &CapacityOverrides,
    max_new_tokens: MaxNewTokens,
) -> Result<ExitCode> {
    let buckets = server_buckets(args.window, args.image_floor, overrides);
    let source = if overrides.buckets.is_some() {
        format!("from {CONTEXT_BUCKETS_ENV}")
    } else if overrides.pinned_capacity.is_some() {
        format!("pinned by {CONTEXT_CAPACITY_ENV}")
    } else {
        format!("derived from window {}", args.window)
    };
    println!("capacities={buckets:?} ({source})");
    if let Some(prompt_tokens) = args.prompt_tokens {
        let effective_prompt_len = prompt_tokens.saturating_add(args.image_tokens);
        let routed = route(&buckets, args.window, effective_prompt_len, max_new_tokens)?;
        println!(
            "bucket {} for {} prompt + up to {}",
            routed.bucket, effective_prompt_len, routed.admitted_max_new_tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}
