//! `mlxcel generate`: stream text from a prompt, or chat interactively without one.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use mlxcel_engine::{
    BackendKind, ChatMessage, Engine, EngineOptions, Event, FinishReason, GenerationRequest,
    MaxNewTokens, SamplingParams, SchedulerConfig, SpeculativeConfig,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a checkpoint directory or a .gguf file (default: the default model, see `mlxcel pull`).
    #[arg(short = 'm', long, env = "MLXCEL_MODEL")]
    model: Option<String>,

    /// The prompt. Without it, mlxcel starts an interactive chat.
    #[arg(short = 'p', long)]
    prompt: Option<String>,

    /// Tokens to generate; -1 generates until the end of the window or an end-of-sequence token.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,

    /// Sampling temperature. 0 (the default, as mlx-lm's generate) decodes greedily, so a prompt
    /// gives the same text every run; a positive value samples (llama.cpp's default is 0.8).
    #[arg(long = "temp", default_value_t = 0.0)]
    temperature: f32,

    /// Keep the K most likely tokens (0 disables).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    top_k: usize,

    /// Nucleus sampling mass (1.0 disables).
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    top_p: f32,

    /// Drop tokens below this fraction of the most likely one's probability (0 disables).
    #[arg(long, default_value_t = SamplingParams::default().min_p)]
    min_p: f32,

    /// Penalise repeating the last --repeat-last-n tokens (1.0 disables).
    #[arg(long, default_value_t = SamplingParams::default().repeat_penalty)]
    repeat_penalty: f32,

    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = SamplingParams::default().repeat_last_n)]
    repeat_last_n: usize,

    /// OpenAI-style presence penalty.
    #[arg(
        long,
        default_value_t = SamplingParams::default().presence_penalty,
        allow_negative_numbers = true
    )]
    presence_penalty: f32,

    /// OpenAI-style frequency penalty.
    #[arg(
        long,
        default_value_t = SamplingParams::default().frequency_penalty,
        allow_negative_numbers = true
    )]
    frequency_penalty: f32,

    /// Random seed; -1 picks one (printed so the run can be repeated).
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    seed: i64,

    /// Stop when this string is generated (repeatable); the string itself is not printed.
    #[arg(long)]
    stop: Vec<String>,

    /// System message for the chat template.
    #[arg(long)]
    system: Option<String>,

    /// Send the prompt as-is instead of through the model's chat template.
    #[arg(long)]
    no_chat_template: bool,

    /// Backend to run the model on.
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx")]
    backend: String,

    /// What the quantized matmuls multiply the weights with: `f32` (the reference numbers, the
    /// exact path) or `int8` (~3× faster batched decode, perplexity within 0.3% of f32's on the
    /// default model). On the OpenXLA backend it picks its kernels' arithmetic unless
    /// `MLXCEL_XLA_WEIGHTS` names a format. Defaults to `MLXCEL_ACTIVATIONS`, else int8 on the
    /// MLX backend where the CPU has AVX2 or AVX-512 VNNI and on the OpenXLA backend where it has
    /// AVX-512 VNNI, else `f32`.
    #[arg(long)]
    activations: Option<String>,

    #[command(flatten)]
    kv: super::KvTypeArgs,

    /// Speculative decoding: `ngram-simple` (prompt lookup: propose what followed the last
    /// n-gram's earlier occurrence), `draft-simple` (a draft model's greedy continuation; the
    /// default when `--spec-draft-model` is given), or `none`. Proposals are verified in one pass
    /// of the model; greedy output is unchanged. The MLX backend only.
    #[arg(long = "spec-type", value_parser = ["none", "ngram-simple", "draft-simple"])]
    spec_type: Option<String>,

    /// The draft model for `--spec-type draft-simple`: a checkpoint directory or `.gguf` file
    /// with the model's tokenizer, run on the same backend (`-md` too).
    #[arg(long = "spec-draft-model", visible_alias = "model-draft")]
    spec_draft_model: Option<String>,

    /// Most tokens proposed per verification pass.
    #[arg(long = "spec-draft-n-max", visible_aliases = ["draft-max", "draft"], default_value_t = 16)]
    draft_max: usize,

    /// Fewest proposals worth a verification pass.
    #[arg(
        long = "spec-draft-n-min",
        visible_alias = "draft-min",
        default_value_t = 1
    )]
    draft_min: usize,

    /// The draft model stops proposing at a token it gives less than this probability (0: never
    /// stops early).
    #[arg(
        long = "spec-draft-p-min",
        visible_alias = "draft-p-min",
        default_value_t = 0.0
    )]
    draft_p_min: f32,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let max_new_tokens = MaxNewTokens::from_signed(args.n_predict).with_context(|| {
        format!(
            "-n {} is not a token budget; give -1 (unlimited) or a count >= 0",
            args.n_predict
        )
    })?;
    let backend: BackendKind = args.backend.parse()?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: u64::try_from(args.seed).ok(),
        ..SamplingParams::default()
    };
    sampling.validate()?;

    let started = Instant::now();
    let engine = Engine::load(
        args.model.as_deref(),
        EngineOptions {
            backend,
            activations: Some(super::parse_activations(
                args.activations.as_deref(),
                backend,
            )?),
            speculative: SpeculativeConfig::from_flags(
                args.spec_type.as_deref(),
                args.spec_draft_model.is_some(),
                args.draft_max,
                args.draft_min,
                args.draft_p_min,
            )?,
            draft_model: args.spec_draft_model.clone(),
            kv_types: args.kv.kv_types(),
            kv_budget_bytes: args.kv.kv_budget_bytes(),
            // One request at a time: one without a token limit may use the whole KV budget.
            scheduler: SchedulerConfig {
                max_batch: 1,
                ..SchedulerConfig::default()
            },
            ..EngineOptions::default()
        },
    )?;
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

    let session = Session {
        engine: &engine,
        args,
        sampling,
        max_new_tokens,
    };
    match &args.prompt {
        Some(prompt) => {
            let mut messages = session.system_messages();
            messages.push(ChatMessage::new("user", prompt.as_str()));
            let prompt_ids = session.prompt_ids(prompt, &messages)?;
            session.generate(prompt_ids)?;
        }
        None => session.chat()?,
    }
    Ok(ExitCode::SUCCESS)
}

struct Session<'a> {
    engine: &'a Engine,
    args: &'a Args,
    sampling: SamplingParams,
    max_new_tokens: MaxNewTokens,
}

impl Session<'_> {
    fn system_messages(&self) -> Vec<ChatMessage> {
        self.args
            .system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .collect()
    }

    /// The prompt's tokens: through the chat template unless it is off.
    fn prompt_ids(&self, raw: &str, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        if self.args.no_chat_template {
            if self.args.system.is_some() {
                bail!("--system needs the chat template; drop --no-chat-template or --system");
            }
            return Ok(self.engine.tokenize(raw)?);
        }
        let text = self.engine.apply_chat_template(messages)?;
        // Templates write their own special tokens; the tokenizer adds none.
        Ok(self.engine.tokenizer().encode(&text, false, true)?)
    }

    /// Streams one completion to stdout; statistics go to stderr. Returns the generated text.
    fn generate(&self, prompt: Vec<u32>) -> Result<String> {
        let prompt_len = prompt.len();
        if self.engine.info().backend == BackendKind::Xla {
            // The XLA backend sizes its static shape with the capacity resolver (the engine admits
            // exactly this plan): print the choice, or refuse with the resolver's numbers.
            let overrides = mlxcel_capacity::CapacityOverrides::from_env()?;
            let resolution = mlxcel_capacity::resolve_context_capacity(
                &mlxcel_capacity::Request::text(prompt_len, self.max_new_tokens),
                self.engine.info().window,
                overrides.pinned_capacity,
            )?;
            if let Some(line) = resolution.sizing_line() {
                eprintln!("{line}");
            }
        }
        let mut request = GenerationRequest::new(prompt, self.max_new_tokens);
        request.sampling = self.sampling.clone();
        request.stop = self.args.stop.clone();

        let started = Instant::now();
        let mut stream = self.engine.submit(request)?;
        if self.max_new_tokens == MaxNewTokens::Unlimited
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
            eprintln!(
                "-n -1 resolved to {} tokens ({bound})",
                plan.admitted_max_new_tokens
            );
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
        eprintln!(
            "prompt: {prompt_len} tokens in {prompt_secs:.2}s = {:.1} tok/s",
            rate(prompt_len, prompt_secs)
        );
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
        eprintln!(
            "Generated {} tokens in {:.2}s = {:.1} tok/s (finish: {}; {decoding}{speculation})",
            usage.completion_tokens,
            prompt_secs + decode_secs,
            rate(decoded, decode_secs),
            reason.as_str(),
        );
        Ok(text)
    }

    /// An interactive chat: history kept, `/clear` forgets it, `/bye` or end of input leaves, and a
    /// line ending in `\` continues on the next line.
    fn chat(&self) -> Result<()> {
        if self.args.no_chat_template {
            bail!("interactive chat needs the chat template; give a prompt with -p instead");
        }
        eprintln!(
            "chat: /clear forgets the conversation, /bye leaves; end a line with \\ to continue it"
        );
        let mut history = self.system_messages();
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        loop {
            eprint!("> ");
            let mut input = String::new();
            loop {
                let Some(line) = lines.next() else {
                    return Ok(());
                };
                let line = line?;
                match line.strip_suffix('\\') {
                    Some(continued) => {
                        input.push_str(continued);
                        input.push('\n');
                    }
                    None => {
                        input.push_str(&line);
                        break;
                    }
                }
            }
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
            history.push(ChatMessage::new("user", input.as_str()));
            let ids = self.prompt_ids(&input, &history)?;
            match self.generate(ids) {
                Ok(reply) => history.push(ChatMessage::new("assistant", reply.trim())),
                Err(err) => {
                    // A refused turn (too long, say) leaves the conversation as it was.
                    history.pop();
                    eprintln!("error: {err:#}");
                }
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
