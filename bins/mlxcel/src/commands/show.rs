//! `mlxcel show [MODEL]` (as `ollama show`): a model's family, parameters, quantization, context
//! length and chat template, read from its checkpoint without loading the weights.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_model::{ChatTemplate, Checkpoint, GgufWeights, Quantization};

use super::cache::{human_bytes, model_arg};

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The model: a checkpoint directory, a .gguf file (prepared in the cache if it is not yet),
    /// a name or id from `mlxcel list`, or `default` (the default when left out).
    pub model: Option<String>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let arg = model_arg(args.model.as_deref())?;
    let dir = super::session::shown("preparing", arg.as_deref(), || {
        mlxcel_model::resolve_model(arg.as_deref())
    })?;
    let checkpoint = Checkpoint::open(&dir)?;
    let config = checkpoint.config();
    let row = |key: &str, value: String| println!("{key:<14}{value}");
    row(
        "model",
        config
            .name
            .clone()
            .unwrap_or_else(|| dir.display().to_string()),
    );
    row(
        "family",
        format!(
            "{} ({})",
            config.architecture.model_type(),
            config.architecture.hf_name()
        ),
    );
    row("parameters", parameters(&checkpoint));
    row(
        "shape",
        format!(
            "hidden {}, {} heads ({} key/value) of {}, feed-forward {}, vocabulary {}",
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            config.vocab_size
        ),
    );
    row("features", config.describe());
    row("quantization", quantization(config.quantization.as_ref()));
    row("context", format!("{} tokens", config.window()));
    match GgufWeights::read(&dir)? {
        Some(weights) => row(
            "weights",
            format!(
                "{} ({}, read as the model loads)",
                weights.gguf.display(),
                human_bytes(weights.size)
            ),
        ),
        None => row("weights", format!("{} (safetensors)", dir.display())),
    }
    row("directory", dir.display().to_string());
    match ChatTemplate::from_dir(&dir)? {
        Some(template) => {
            println!("chat template");
            for line in template.source().lines() {
                println!("  {line}");
            }
        }
        None => row(
            "chat template",
            "none (generate with --no-chat-template)".to_owned(),
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The parameter count, from the tensors' shapes: a quantized weight's packed words hold
/// `32 / bits` values each; its scales and biases are not parameters of the model.
fn parameters(checkpoint: &Checkpoint) -> String {
    let mut count = 0u64;
    for info in checkpoint.tensor_infos() {
        let elements: u64 = info.shape.iter().map(|&d| d as u64).product();
        let (module, suffix) = info.name.rsplit_once('.').unwrap_or((info.name, ""));
        match (checkpoint.quantization_of(module), suffix) {
            (Some(spec), "weight") => count += elements * 32 / u64::from(spec.bits.max(1)),
            (Some(_), "scales" | "biases") => {}
            _ => count += elements,
        }
    }
    let (value, unit) = match count {
        c if c >= 1_000_000_000 => (c as f64 / 1e9, "B"),
        c if c >= 1_000_000 => (c as f64 / 1e6, "M"),
        c => (c as f64 / 1e3, "K"),
    };
    format!("{value:.1}{unit} ({count})")
}

/// `4 bits, group 32 (model.embed_tokens: 8 bits, group 32)`, or `none`; a mix of many
/// modules (llama-quantize's `_M` presets) is counted per kind instead of listed.
fn quantization(quantization: Option<&Quantization>) -> String {
    let Some(q) = quantization else {
        return "none (dense weights)".to_owned();
    };
    let mut text = format!("{} bits, group {}", q.default.bits, q.default.group_size);
    let kind = |spec: &Option<mlxcel_model::QuantSpec>| match spec {
        Some(spec) => format!("{} bits, group {}", spec.bits, spec.group_size),
        None => "dense".to_owned(),
    };
    let others: Vec<String> = if q.overrides.len() <= 3 {
        q.overrides
            .iter()
            .map(|(module, spec)| format!("{module}: {}", kind(spec)))
            .collect()
    } else {
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for spec in q.overrides.values() {
            *counts.entry(kind(spec)).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|(kind, n)| format!("{n} modules at {kind}"))
            .collect()
    };
    if !others.is_empty() {
        text.push_str(&format!(" ({})", others.join("; ")));
    }
    text
}
