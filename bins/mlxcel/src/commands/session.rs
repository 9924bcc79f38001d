//! One loaded model answering from the command line: a single completion, or an interactive chat
//! (`generate` and `run` both end here).

use std::cell::Cell;
use std::time::Instant;

use anyhow::{Result, bail};
use mlxcel_engine::{ChatMessage, Engine};

use super::answer::Session;
use super::options::{Mode, Options};

/// Loads the model (`None`: the default model) and does what `mode` says.
pub fn run(model: Option<&str>, options: &Options, mode: Mode) -> Result<()> {
    let max_new_tokens = options.max_new_tokens()?;
    let sampling = options.sampling()?;
    let constraint = options.constraint()?;
    let system = options.system()?;
    if system.is_some() && !options.chat_template() {
        bail!("--system needs the chat template; drop --no-chat-template (or -no-cnv) or --system");
    }
    let mut engine_options = options.engine_options()?;
    // A chat keeps its conversation's KV between turns in the engine's prefix cache, so that
    // each turn prefills only itself; a single answer has no next turn to keep anything for.
    let chat = matches!(mode, Mode::Chat { .. });
    if chat {
        engine_options.prefix_cache_bytes = options.cache_ram_bytes();
    }
    let reuses_prefixes = engine_options.prefix_cache_bytes > 0;
    options.ignored.warn();
    // A stage worker (pipeline rank > 0) answers nothing itself: it runs until rank 0 is done.
    if options.pipeline.join(model, &mut engine_options)? {
        return Ok(());
    }

    let started = Instant::now();
    let engine = load(model, engine_options)?;
    let info = engine.info();
    eprintln!(
        "loaded {} ({}; {} backend, window {}, {:.1} MB of weights) in {:.2}s",
        info.name,
        info.features,
        info.backend.as_str(),
        info.window,
        info.weight_bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    let sampling = options.for_model(sampling, info.vocab_size, &info.eos_token_ids)?;
    let context = match options.ctx_size {
        0 => None,
        c => Some(c.min(info.window)),
    };
    let session = Session {
        engine: &engine,
        options,
        sampling,
        constraint,
        max_new_tokens,
        system,
        context,
        colour: options.colour(),
        reuses_prefixes,
        budget_shown: Cell::new(false),
    };
    match mode {
        Mode::Once(prompt) => {
            let mut messages = session.system_messages();
            messages.push(ChatMessage::new("user", prompt.as_str()));
            let prompt_ids = session.prompt_ids(&prompt, &messages)?;
            session.generate(prompt_ids, None)?;
        }
        Mode::Chat { first, single_turn } => super::chat::chat(&session, first, single_turn)?,
    }
    Ok(())
}

/// `Engine::load`, in its two waits, each shown when it runs long ([`crate::progress`]): preparing
/// the model (hashing and preparing a GGUF on its first run), then loading its weights.
pub fn load(model: Option<&str>, options: mlxcel_engine::EngineOptions) -> Result<Engine> {
    let dir = shown("preparing", model, || mlxcel_model::resolve_model(model))?;
    // The name the load line prints (config.json's), else the directory.
    let name = mlxcel_model::ModelConfig::from_dir(&dir)
        .ok()
        .and_then(|config| config.name)
        .unwrap_or_else(|| dir.display().to_string());
    crate::progress::while_waiting(&format!("loading {name}"), || {
        let loaded = mlxcel_model::LoadedModel::open(&dir)?;
        Ok(Engine::from_loaded(loaded, options)?)
    })
}

/// Runs `work`, which prepares (`verb`) `model`, showing the wait when it runs long, except while
/// the default model is downloaded: pip shows that download's progress itself.
pub fn shown<T>(verb: &str, model: Option<&str>, work: impl FnOnce() -> T) -> T {
    let downloading = model.is_none()
        && mlxcel_model::cache_dir().is_ok_and(|cache| {
            !mlxcel_model::DefaultModel::pinned()
                .gguf_path(&cache)
                .is_file()
        });
    match model {
        _ if downloading => work(),
        Some(m) => crate::progress::while_waiting(&format!("{verb} {m}"), work),
        None => crate::progress::while_waiting(&format!("{verb} the default model"), work),
    }
}
