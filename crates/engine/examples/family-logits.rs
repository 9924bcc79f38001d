//! Runs a checkpoint through one backend the way `scripts/check-families` compares it with mlx-lm:
//! the prompt prefilled in one step, then greedy decoding, one token a step. Prints JSON with the
//! last position's logits after the prefill and after each decode step (`steps + 1` vectors) and
//! the greedy token of each (`steps + 1` tokens, the last one not fed back).
//!
//! ```sh
//! cargo run -p mlxcel-engine --example family-logits -- \
//!     --model DIR --backend mlx --prompt 1,2,3 --steps 8 [--activations f32|int8] \
//!     [--lora ADAPTER --lora-scale S] [--rope NAME=VALUE]... \
//!     [--control-vector FILE[:SCALE]]... [--control-vector-layer-range START END]
//! ```
//!
//! `--lora` applies one LoRA adapter (GGUF or PEFT) at `--lora-scale` (default 1), as
//! `scripts/check-lora` compares it with llama.cpp.
//!
//! `--control-vector` adds a control vector at SCALE (default 1; repeat for several, summed in
//! order) and `--control-vector-layer-range` limits the layers, as the engine's
//! `EngineOptions::control_vector` does for `mlxcel-server`'s flags (scripts/check-control-vectors).
//!
//! `--model` is a checkpoint directory or a GGUF file (converted by the importer, as `-m`).
//!
//! `--rope NAME=VALUE` is one of llama.cpp's RoPE overrides under its `llama_context_params` name
//! (`rope_scaling_type`, `rope_freq_base`, `rope_freq_scale`, `yarn_orig_ctx`, `yarn_ext_factor`,
//! `yarn_attn_factor`, `yarn_beta_slow`, `yarn_beta_fast`), as scripts/check-rope-overrides
//! passes the same settings to llama.cpp; they are applied to the checkpoint's config as the
//! engine applies `--rope-*`/`--yarn-*` (`mlxcel_model::RopeOverrides`).
//!
//! The backend is driven directly, below the scheduler and the sampler, so the logits are the
//! backend's own.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use mlxcel_engine::{
    Activations, BackendKind, EngineOptions, MaxNewTokens, RequestShape, SequenceStep, argmax,
    load_backend,
};
use mlxcel_model::{Checkpoint, ControlVectorSpec, RopeOverrides};

type Error = Box<dyn std::error::Error>;

struct Args {
    model: PathBuf,
    backend: BackendKind,
    prompt: Vec<u32>,
    steps: usize,
    activations: Option<Activations>,
    lora: Option<(PathBuf, f32)>,
    rope: RopeOverrides,
    control_vector: ControlVectorSpec,
}

const USAGE: &str = "usage: family-logits --model DIR --backend mlx|xla --prompt ID,ID,... \
                     [--steps N] [--activations f32|int8] [--lora ADAPTER [--lora-scale S]] \
                     [--rope NAME=VALUE]... [--control-vector FILE[:SCALE]]... \
                     [--control-vector-layer-range START END]";

/// One `--rope NAME=VALUE` into `rope`.
fn set_rope(rope: &mut RopeOverrides, setting: &str) -> Result<(), Error> {
    let (name, value) = setting
        .split_once('=')
        .ok_or_else(|| format!("--rope takes NAME=VALUE, not {setting:?}"))?;
    let number = || -> Result<f32, Error> { Ok(value.parse::<f32>()?) };
    match name {
        "rope_scaling_type" => rope.scaling = Some(value.parse()?),
        "rope_freq_base" => rope.freq_base = Some(number()?),
        "rope_freq_scale" => rope.freq_scale = Some(number()?),
        "yarn_orig_ctx" => rope.yarn_orig_ctx = Some(value.parse()?),
        "yarn_ext_factor" => rope.yarn_ext_factor = Some(number()?),
        "yarn_attn_factor" => rope.yarn_attn_factor = Some(number()?),
        "yarn_beta_slow" => rope.yarn_beta_slow = Some(number()?),
        "yarn_beta_fast" => rope.yarn_beta_fast = Some(number()?),
        _ => return Err(format!("--rope: `{name}` is not a RoPE setting").into()),
    }
    Ok(())
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, Error> {
    let (mut model, mut backend, mut prompt) = (None, BackendKind::Mlx, None);
    let (mut steps, mut activations) = (8, None);
    let (mut lora, mut lora_scale) = (None, 1.0f32);
    let mut rope = RopeOverrides::default();
    let mut control_vector = ControlVectorSpec::default();
    while let Some(flag) = argv.next() {
        let mut value = || {
            argv.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value()?)),
            "--backend" => backend = value()?.parse()?,
            "--prompt" => {
                let ids = value()?
                    .split(',')
                    .map(|id| id.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--prompt takes comma-separated token ids: {e}"))?;
                prompt = Some(ids);
            }
            "--steps" => steps = value()?.parse()?,
            "--activations" => activations = Some(value()?.parse::<Activations>()?),
            "--lora" => lora = Some(PathBuf::from(value()?)),
            "--lora-scale" => lora_scale = value()?.parse()?,
            "--rope" => set_rope(&mut rope, &value()?)?,
            "--control-vector" => {
                let item = value()?;
                let (path, scale) = match item.rsplit_once(':') {
                    Some((path, scale)) => (path.to_string(), scale.parse::<f32>()?),
                    None => (item, 1.0),
                };
                control_vector.files.push((PathBuf::from(path), scale));
            }
            "--control-vector-layer-range" => {
                let start = value()?.parse::<i32>()?;
                let end = value()?.parse::<i32>()?;
                control_vector.layer_range = Some((start, end));
            }
            _ => return Err(format!("unknown argument {flag:?}; {USAGE}").into()),
        }
    }
    let prompt = prompt.filter(|p| !p.is_empty());
    Ok(Args {
        model: model.ok_or(format!("--model is required; {USAGE}"))?,
        backend,
        prompt: prompt.ok_or(format!("--prompt is required; {USAGE}"))?,
        steps,
        activations,
        lora: lora.map(|path| (path, lora_scale)),
        rope,
        control_vector,
    })
}

/// The logits after the prefill and after each of `steps` greedy decode steps, and the greedy
/// token of each.
fn run(args: &Args) -> Result<(Vec<Vec<f32>>, Vec<u32>), Error> {
    // A directory as it is, a GGUF file through the importer (as `-m` takes it).
    let dir = mlxcel_model::resolve_model(args.model.to_str())?;
    let mut checkpoint = Checkpoint::open(&dir)?;
    checkpoint.apply_rope_overrides(&args.rope)?;
    let options = EngineOptions {
        backend: args.backend,
        activations: args.activations,
        lora_adapters: args.lora.iter().map(|(path, _)| path.clone()).collect(),
        control_vector: args.control_vector.clone(),
        ..EngineOptions::default()
    };
    let mut backend = load_backend(&checkpoint, &options)?;
    let plan = backend.create_session_for_request(&RequestShape {
        prompt_len: args.prompt.len(),
        image_tokens: 0,
        max_new_tokens: MaxNewTokens::Limited(args.steps),
    })?;
    let slot = backend.allocate_slot(&plan)?;
    if let Some((_, scale)) = args.lora {
        backend.set_slot_adapters(slot, vec![scale]);
    }
    let mut all_logits = Vec::with_capacity(args.steps + 1);
    let mut tokens = Vec::with_capacity(args.steps + 1);
    let mut position = 0;
    let mut input = args.prompt.clone();
    loop {
        let logits = backend
            .step(&[SequenceStep {
                slot,
                tokens: &input,
                start_position: position,
            }])?
            .pop()
            .ok_or("the backend returned no logits")?;
        position += input.len();
        let token = argmax(&logits);
        all_logits.push(logits);
        tokens.push(token);
        if tokens.len() > args.steps {
            break;
        }
        input = vec![token];
    }
    backend.release_slot(slot);
    Ok((all_logits, tokens))
}

/// JSON by hand (the engine has no JSON dependency): f32's `Debug` is the shortest text that reads
/// back to the same value; a non-finite logit, which JSON cannot hold, becomes `null`.
fn to_json(args: &Args, logits: &[Vec<f32>], tokens: &[u32]) -> String {
    let list = |items: &mut dyn Iterator<Item = String>| items.collect::<Vec<_>>().join(",");
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"backend\":\"{}\",\"prompt\":[{}],\"tokens\":[{}],\"logits\":[",
        args.backend.as_str(),
        list(&mut args.prompt.iter().map(u32::to_string)),
        list(&mut tokens.iter().map(u32::to_string)),
    );
    for (i, vector) in logits.iter().enumerate() {
        let values = list(&mut vector.iter().map(|v| {
            if v.is_finite() {
                format!("{v:?}")
            } else {
                "null".to_owned()
            }
        }));
        let _ = write!(out, "{}[{values}]", if i == 0 { "" } else { "," });
    }
    out.push_str("]}");
    out
}

fn main() -> ExitCode {
    let outcome = parse(std::env::args().skip(1)).and_then(|args| {
        let (logits, tokens) = run(&args)?;
        writeln!(std::io::stdout(), "{}", to_json(&args, &logits, &tokens))?;
        Ok(())
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("family-logits: {err}");
            ExitCode::FAILURE
        }
    }
}
