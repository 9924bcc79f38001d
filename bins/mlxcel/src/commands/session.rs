//! One loaded model answering from the command line: a single completion, or an interactive chat
//! (`generate` and `run` both end here).

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use mlxcel_engine::{
    BackendKind, ChatMessage, Engine, Event, FinishReason, GenerationRequest, MaxNewTokens,
    SamplingParams,
};

use super::options::{Mode, Options};

/// ANSI colours of `--color`.
const GREEN: &str = "\x1b[32m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Loads the model (`None`: the default model) and does what `mode` says.
pub fn run(model: Option<&str>, options: &Options, mode: Mode) -> Result<()> {
    let max_new_tokens = options.max_new_tokens()?;
    let sampling = options.sampling()?;
    let system = options.system()?;
    if system.is_some() && !options.chat_template() {
        bail!("--system needs the chat template; drop --no-chat-template (or -no-cnv) or --system");
    }
    let engine_options = options.engine_options()?;
    options.ignored.warn();

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
    let context = match options.ctx_size {
        0 => None,
        c => Some(c.min(info.window)),
    };
    let session = Session {
        engine: &engine,
        options,
        sampling,
        max_new_tokens,
        system,
        context,
        colour: options.colour(),
    };
    match mode {
        Mode::Once(prompt) => {
            let mut messages = session.system_messages();
            messages.push(ChatMessage::new("user", prompt.as_str()));
            let prompt_ids = session.prompt_ids(&prompt, &messages)?;
            session.generate(prompt_ids)?;
        }
        Mode::Chat { first, single_turn } => session.chat(first, single_turn)?,
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

struct Session<'a> {
    engine: &'a Engine,
    options: &'a Options,
    sampling: SamplingParams,
    max_new_tokens: MaxNewTokens,
    system: Option<String>,
    /// `-c`: most positions a request may use (capped at the window); `None`: the window.
    context: Option<usize>,
    colour: bool,
}

impl Session<'_> {
    fn system_messages(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .collect()
    }

    /// The prompt's tokens: through the chat template unless it is off.
    fn prompt_ids(&self, raw: &str, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        if !self.options.chat_template() {
            return Ok(self.engine.tokenize(raw)?);
        }
        let text = self.engine.apply_chat_template(messages)?;
        // Templates write their own special tokens; the tokenizer adds none.
        Ok(self.engine.tokenizer().encode(&text, false, true)?)
    }

    /// The budget of a request whose prompt is `prompt_len` tokens under `-c`: an explicit budget
    /// is honoured or refused, an unlimited one stops at the context.
    fn budget(&self, prompt_len: usize) -> Result<MaxNewTokens> {
        let Some(context) = self.context else {
            return Ok(self.max_new_tokens);
        };
        if prompt_len >= context {
            bail!(
                "the prompt's {prompt_len} tokens fill -c/--ctx-size {context}: raise -c (the \
                 window is {}) or shorten the prompt",
                self.engine.info().window
            );
        }
        let room = context - prompt_len;
        match self.max_new_tokens {
            MaxNewTokens::Unlimited => {
                self.stats(&format!(
                    "-n -1 resolved to {room} tokens (-c {context} - prompt {prompt_len})"
                ));
                Ok(MaxNewTokens::Limited(room))
            }
            MaxNewTokens::Limited(n) if n > room => bail!(
                "prompt {prompt_len} + -n {n} > -c/--ctx-size {context}: raise -c or lower -n"
            ),
            limited => Ok(limited),
        }
    }

    /// A statistics line on stderr (dim with `--color`).
    fn stats(&self, line: &str) {
        if self.colour {
            eprintln!("{DIM}{line}{RESET}");
        } else {
            eprintln!("{line}");
        }
    }

    /// Streams one completion to stdout; statistics go to stderr. Returns the generated text.
    fn generate(&self, prompt: Vec<u32>) -> Result<String> {
        let prompt_len = prompt.len();
        let max_new_tokens = self.budget(prompt_len)?;
        if self.engine.info().backend == BackendKind::Xla {
            // The XLA backend sizes its static shape with the capacity resolver (the engine admits
            // exactly this plan): print the choice, or refuse with the resolver's numbers.
            let overrides = mlxcel_capacity::CapacityOverrides::from_env()?;
            let resolution = mlxcel_capacity::resolve_context_capacity(
                &mlxcel_capacity::Request::text(prompt_len, max_new_tokens),
                self.engine.info().window,
                overrides.pinned_capacity,
            )?;
            if let Some(line) = resolution.sizing_line() {
                self.stats(&line);
            }
        }
        let mut request = GenerationRequest::new(prompt, max_new_tokens);
        request.sampling = self.sampling.clone();
        request.stop = self.options.stops();

        let started = Instant::now();
        let mut stream = self.engine.submit(request)?;
        if max_new_tokens == MaxNewTokens::Unlimited
            && self.engine.info().backend != BackendKind::Xla
            && let Some(plan) = self.engine.plan(stream.id())?
        {
            let window = self.engine.info().window;
            let room = window.saturating_sub(prompt_len);
            let bound = if plan.admitted_max_new_tokens < room {
                "the KV budget, --kv-budget".to_owned()
            } else {
                format!("window {window} - prompt {prompt_len}")
            };
            self.stats(&format!(
                "-n -1 resolved to {} tokens ({bound})",
                plan.admitted_max_new_tokens
            ));
        }
        let mut first_token_at = None;
        let mut text = String::new();
        let mut stdout = std::io::stdout().lock();
        let mut outcome = None;
        for event in stream.by_ref() {
            match event {
                Event::Token { text: piece, .. } => {
                    first_token_at.get_or_insert_with(Instant::now);
                    stdout.write_all(piece.as_bytes())?;
                    stdout.flush()?;
                    text.push_str(&piece);
                }
                Event::Finished {
                    reason,
                    text: piece,
                    usage,
                    error,
                } => {
                    stdout.write_all(piece.as_bytes())?;
                    writeln!(stdout)?;
                    text.push_str(&piece);
                    outcome = Some((reason, usage, error));
                }
            }
        }
        let (reason, usage, error) = outcome.context("the engine stopped mid-request")?;
        if let (FinishReason::Error, Some(message)) = (reason, error) {
            bail!("generation failed: {message}");
        }
        let end = Instant::now();
        let first = first_token_at.unwrap_or(end);
        let prompt_secs = (first - started).as_secs_f64();
        let decode_secs = (end - first).as_secs_f64();
        let decoded = usage.completion_tokens.saturating_sub(1);
        self.stats(&format!(
            "prompt: {prompt_len} tokens in {prompt_secs:.2}s = {:.1} tok/s",
            rate(prompt_len, prompt_secs)
        ));
        // Greedy decoding draws nothing, so a seed would mean nothing: say which it was.
        let decoding = match self.sampling.seed {
            _ if self.sampling.temperature <= 0.0 => "greedy".to_owned(),
            Some(seed) => format!("seed {seed}"),
            None => "seed random".to_owned(),
        };
        let stats = self.engine.stats();
        let speculation = if stats.drafted_tokens > 0 {
            format!(
                "; speculative: {}/{} proposals accepted ({:.0}%), {:.2} tokens per verification \
                 pass",
                stats.accepted_tokens,
                stats.drafted_tokens,
                100.0 * stats.accepted_tokens as f64 / stats.drafted_tokens as f64,
                (stats.drafts + stats.accepted_tokens) as f64 / stats.drafts.max(1) as f64
            )
        } else {
            String::new()
        };
        self.stats(&format!(
            "Generated {} tokens in {:.2}s = {:.1} tok/s (finish: {}; {decoding}{speculation})",
            usage.completion_tokens,
            prompt_secs + decode_secs,
            rate(decoded, decode_secs),
            reason.as_str(),
        ));
        Ok(text)
    }

    /// An interactive chat: history kept, `/clear` forgets it, `/bye` or end of input leaves, and a
    /// line ending in `\` continues on the next line. `first` is answered before any line is
    /// read; `single_turn` leaves after one answer.
    fn chat(&self, first: Option<String>, single_turn: bool) -> Result<()> {
        if !self.options.chat_template() {
            bail!(
                "interactive chat needs the chat template; give a prompt with -p instead (or \
                 drop --no-chat-template)"
            );
        }
        if !single_turn {
            eprintln!(
                "chat: /clear forgets the conversation, /bye leaves; end a line with \\ to \
                 continue it"
            );
        }
        let mut history = self.system_messages();
        if let Some(first) = first {
            let answered = self.turn(&mut history, &first);
            if single_turn {
                return answered;
            }
            if let Err(err) = answered {
                eprintln!("error: {err:#}");
            }
        }
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        loop {
            eprint!("> ");
            if self.colour {
                eprint!("{GREEN}");
            }
            let input = read_turn(&mut lines);
            if self.colour {
                eprint!("{RESET}");
            }
            let Some(input) = input? else {
                return Ok(());
            };
            match input.trim() {
                "" => continue,
                "/bye" => return Ok(()),
                "/clear" => {
                    history = self.system_messages();
                    eprintln!("(conversation cleared)");
                    continue;
                }
                _ => {}
            }
            let answered = self.turn(&mut history, &input);
            if single_turn {
                return answered;
            }
            if let Err(err) = answered {
                eprintln!("error: {err:#}");
            }
        }
    }

    /// Answers `input` after `history`, which keeps the turn if it was answered; a refused turn
    /// (too long, say) leaves the conversation as it was.
    fn turn(&self, history: &mut Vec<ChatMessage>, input: &str) -> Result<()> {
        history.push(ChatMessage::new("user", input));
        let answer = self
            .prompt_ids(input, history)
            .and_then(|ids| self.generate(ids));
        match answer {
            Ok(reply) => {
                history.push(ChatMessage::new("assistant", reply.trim()));
                Ok(())
            }
            Err(err) => {
                history.pop();
                Err(err)
            }
        }
    }
}

/// One turn from standard input (lines ending in `\` continue it); `None` at end of input.
fn read_turn(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Result<Option<String>> {
    let mut input = String::new();
    loop {
        let Some(line) = lines.next() else {
            return Ok(None);
        };
        let line = line?;
        match line.strip_suffix('\\') {
            Some(continued) => {
                input.push_str(continued);
                input.push('\n');
            }
            None => {
                input.push_str(&line);
                return Ok(Some(input));
            }
        }
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}
