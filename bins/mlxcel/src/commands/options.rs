//! The flags `generate` and `run` share: sampling, the engine, the conversation, with the
//! spellings llama-cli, llama-completion and mlx_lm give them.
//!
//! mlxcel's own flags are listed first in `--help`; llama-cli's conversation switches have a
//! heading of their own, and the other tools' spellings of mlxcel's flags are hidden aliases
//! listed after the flags ([`ALIASES_HELP`]), so that neither buries mlxcel's own.

use anyhow::{Context, Result, bail};
use mlxcel_engine::{
    BackendKind, Constraint, EngineOptions, MaxNewTokens, SamplingOverrides, SamplingParams,
    SchedulerConfig, SpeculativeConfig,
};

/// The `--help` heading of llama-cli's conversation switches.
const LLAMA_CLI: &str = "llama-cli / llama-completion";

/// The other tools' spellings of mlxcel's flags, by origin, printed after the flags.
pub const ALIASES_HELP: &str = "\
Spellings of other tools, accepted as the flag they name:
  llama-cli, llama-completion:
    -sys, --system-prompt TEXT    --system        -r, --reverse-prompt TEXT  --stop
    --predict N                   -n              -md, --model-draft FILE  --spec-draft-model
    --draft-max, --draft N        --spec-draft-n-max
    -ngl, -fa, -tb, -b, -ub, -dev, -sm, -ts, -mg, -ot, -nkvo, -C, --mlock, --no-mmap, --numa,
    --jinja, --no-warmup, --no-display-prompt ...: accepted without effect, one warning each
    (mlxcel runs on the CPU; docs/cli.md says why for each)
  mlx_lm.generate, mlx_lm.chat:
    --model, --prompt (- reads standard input), --temp, --top-p, --seed: as mlxcel spells them
    --max-tokens N                -n              --system-prompt TEXT  --system
    --ignore-chat-template        --no-chat-template
    --draft-model FILE            --spec-draft-model
    --num-draft-tokens N          --spec-draft-n-max
llama.cpp options mlxcel does not have (-hf, --control-vector, --chat-template ...) are refused by
name, with what to use instead.";

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Options {
    /// Tokens to generate; -1 generates until the end of the window (or of -c) or an
    /// end-of-sequence token.
    #[arg(
        short = 'n',
        long = "n-predict",
        aliases = ["predict", "max-tokens"],
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,

    /// Sampling temperature. 0 (the default, as mlx-lm's generate) decodes greedily, so a prompt
    /// gives the same text every run; a positive value samples (llama.cpp's default is 0.8).
    #[arg(long = "temp", default_value_t = 0.0)]
    pub temperature: f32,

    /// Keep the K most likely tokens (0 disables).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,

    /// Nucleus sampling mass (1.0 disables).
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    pub top_p: f32,

    /// Drop tokens below this fraction of the most likely one's probability (0 disables).
    #[arg(long, default_value_t = SamplingParams::default().min_p)]
    pub min_p: f32,

    /// Locally typical sampling mass (1.0 disables).
    #[arg(long = "typical", default_value_t = SamplingParams::default().typical_p)]
    pub typical_p: f32,

    /// Penalise repeating the last --repeat-last-n tokens (1.0 disables).
    #[arg(long, default_value_t = SamplingParams::default().repeat_penalty)]
    pub repeat_penalty: f32,

    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = SamplingParams::default().repeat_last_n)]
    pub repeat_last_n: usize,

    /// OpenAI-style presence penalty.
    #[arg(
        long,
        default_value_t = SamplingParams::default().presence_penalty,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,

    /// OpenAI-style frequency penalty.
    #[arg(
        long,
        default_value_t = SamplingParams::default().frequency_penalty,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,

    /// Random seed; -1 picks one (printed so the run can be repeated).
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,

    /// Stop when this string is generated (repeatable); the string itself is not printed.
    #[arg(long, short_alias = 'r', alias = "reverse-prompt")]
    pub stop: Vec<String>,

    /// System message for the chat template.
    #[arg(long, alias = "system-prompt")]
    pub system: Option<String>,

    /// Send the prompt as-is instead of through the model's chat template.
    #[arg(long, alias = "ignore-chat-template")]
    pub no_chat_template: bool,

    /// Most positions (prompt and generated tokens) a request may use; 0 (the default) is the
    /// model's window. A turn that needs more is refused; -n -1 stops at it.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,

    /// Threads of the CPU kernels; defaults to `MLXCEL_THREADS`, else all cores.
    #[arg(short = 't', long, value_parser = clap::value_parser!(u64).range(1..))]
    pub threads: Option<u64>,

    /// Backend to run the model on.
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx")]
    pub backend: String,

    /// What the quantized matmuls multiply the weights with: `f32` (the reference numbers, the
    /// exact path), `int8` (~3× faster batched decode, perplexity within 0.3% of f32's on the
    /// default model) or `mixed` (the MLX backend only: int8 for the MLPs' gate and up
    /// projections and the output head, f32 for the rest). On the OpenXLA backend it picks its kernels' arithmetic
    /// unless `MLXCEL_XLA_WEIGHTS` names a format. Defaults to `MLXCEL_ACTIVATIONS`, else int8 on
    /// the MLX backend where the CPU has AVX2 or AVX-512 VNNI (`mixed` for a model under 500 M
    /// parameters where the command runs it: docs/cli.md) and on the OpenXLA backend where it
    /// has AVX-512 VNNI, else `f32`.
    #[arg(long)]
    pub activations: Option<String>,

    #[command(flatten)]
    pub kv: super::KvTypeArgs,

    /// LoRA adapters, as llama-cli takes them (`--lora`, `--lora-scaled`).
    #[command(flatten)]
    pub lora: mlxcel_server::lora_args::LoraArgs,

    /// Control vectors, as llama-cli takes them (`--control-vector`, `--control-vector-scaled`,
    /// `--control-vector-layer-range`).
    #[command(flatten)]
    pub control_vector: mlxcel_server::control_vector_args::ControlVectorArgs,

    #[command(flatten)]
    pub pipeline: Box<super::pipeline::PipelineArgs>,

    /// A chat's KV memory kept between turns, in MiB (the engine's prefix cache, as `serve
    /// --cache-ram`): each turn prefills only itself. 0 prefills the whole conversation every
    /// turn. Defaults to --kv-budget's. A single answer (`-p` without `-cnv`) keeps nothing.
    #[arg(long = "cache-ram", value_parser = clap::value_parser!(u64))]
    pub cache_ram: Option<u64>,

    /// Speculative decoding: a comma-separated list of `ngram-simple` (prompt lookup: propose
    /// what followed the last n-gram's earlier occurrence), `ngram-map-k`, `ngram-map-k4v`,
    /// `ngram-mod` (llama.cpp's hashed n-gram proposers), `draft-simple` (a draft model's greedy
    /// continuation; the default when `--spec-draft-model` is given), tried in that order, or
    /// `none`. Proposals are verified in one pass of the model; greedy output is unchanged. The
    /// MLX backend only.
    #[arg(long = "spec-type")]
    pub spec_type: Option<String>,

    /// The draft model for `--spec-type draft-simple`: a checkpoint directory or `.gguf` file
    /// with the model's tokenizer, run on the same backend (`-md` too).
    #[arg(long = "spec-draft-model", aliases = ["model-draft", "draft-model"])]
    pub spec_draft_model: Option<String>,

    /// Most tokens proposed per verification pass.
    #[arg(
        long = "spec-draft-n-max",
        aliases = ["draft-max", "draft", "num-draft-tokens"],
        default_value_t = 16
    )]
    pub draft_max: usize,

    /// Fewest proposals worth a verification pass.
    #[arg(
        long = "spec-draft-n-min",
        visible_alias = "draft-min",
        default_value_t = 1
    )]
    pub draft_min: usize,

    /// The draft model stops proposing at a token it gives less than this probability (0: never
    /// stops early).
    #[arg(
        long = "spec-draft-p-min",
        visible_alias = "draft-p-min",
        default_value_t = 0.0
    )]
    pub draft_p_min: f32,

    /// llama.cpp's hashed n-gram proposers' flags (`--spec-default`, `--spec-ngram-mod-*`,
    /// `--spec-ngram-map-k-*`, `--spec-ngram-map-k4v-*`), as `serve` reads them.
    #[command(flatten)]
    pub hashed_spec: mlxcel_server::spec_args::HashedSpecArgs,

    /// Chat (`-cnv`): after the prompt's answer (if a prompt is given), keep reading turns.
    #[arg(
        long = "conversation",
        visible_short_alias = 'i',
        visible_aliases = ["interactive", "interactive-first"],
        help_heading = LLAMA_CLI,
        conflicts_with = "no_conversation"
    )]
    pub conversation: bool,

    /// One completion of the prompt as written, without the chat template (`-no-cnv`:
    /// llama-completion's mode; as --no-chat-template).
    #[arg(long = "no-conversation", help_heading = LLAMA_CLI)]
    pub no_conversation: bool,

    /// Chat for one turn, then leave (`-st`).
    #[arg(long = "single-turn", help_heading = LLAMA_CLI)]
    pub single_turn: bool,

    /// Read the system message from a file (`-sysf`).
    #[arg(long = "system-prompt-file", help_heading = LLAMA_CLI, conflicts_with = "system")]
    pub system_prompt_file: Option<std::path::PathBuf>,

    /// Colour the chat (`-co`): your turns green, the statistics dim. `auto`: when stdout is a
    /// terminal.
    #[arg(
        long = "color",
        help_heading = LLAMA_CLI,
        num_args = 0..=1,
        default_value = "off",
        default_missing_value = "on",
        value_parser = ["on", "off", "auto"]
    )]
    pub color: String,

    /// Read escapes (\n, \t, \\, \", \', \xHH ...) in the prompt, the system message and --stop.
    #[arg(short = 'e', long = "escape", help_heading = LLAMA_CLI, overrides_with = "no_escape")]
    pub escape: bool,

    /// Take the prompt literally (the default).
    #[arg(long = "no-escape", help_heading = LLAMA_CLI, overrides_with = "escape")]
    pub no_escape: bool,

    /// llama.cpp's other sampling flags: the chain (`--samplers`), DRY, XTC, top-n-sigma,
    /// dynamic temperature, mirostat, `-l/--logit-bias`, `--ignore-eos`.
    #[command(flatten)]
    pub chain: mlxcel_server::sampling_args::SamplingArgs,

    /// Print special tokens (`<|im_end|>` ...) in the output (`-sp`).
    #[arg(long = "special")]
    pub special: bool,

    /// `--grammar`, `--grammar-file`, `-j`, `-jf`: what every answer must match.
    #[command(flatten)]
    pub constraint: mlxcel_server::constraint_args::ConstraintArgs,

    /// llama.cpp's RoPE overrides (`--rope-scaling`, `--rope-freq-base`, `--yarn-*` ...) and
    /// `--override-kv`, as `mlxcel serve` takes them.
    #[command(flatten)]
    pub model_overrides: mlxcel_server::model_args::ModelOverrideArgs,

    #[command(flatten)]
    pub ignored: super::ignored::Ignored,
}

/// What a run does once the model is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Answer the prompt, then leave.
    Once(String),
    /// Chat: the first turn (if given) is answered before reading more; `single_turn` leaves
    /// after one answer.
    Chat {
        first: Option<String>,
        single_turn: bool,
    },
}

impl Options {
    /// The token budget `-n` gives.
    pub fn max_new_tokens(&self) -> Result<MaxNewTokens> {
        MaxNewTokens::from_signed(self.n_predict).with_context(|| {
            format!(
                "-n {} is not a token budget; give -1 (unlimited) or a count >= 0",
                self.n_predict
            )
        })
    }

    /// The sampling parameters, validated. `--ignore-eos` and the range of `--logit-bias` ids
    /// need the model: [`Options::for_model`].
    pub fn sampling(&self) -> Result<SamplingParams> {
        let chain = self.chain.defaults()?;
        let mut sampling =
            self.chain
                .overrides(SamplingOverrides::default())
                .over(SamplingParams {
                    temperature: self.temperature,
                    top_k: self.top_k,
                    top_p: self.top_p,
                    min_p: self.min_p,
                    typical_p: self.typical_p,
                    repeat_penalty: self.repeat_penalty,
                    repeat_last_n: self.repeat_last_n,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    seed: u64::try_from(self.seed).ok(),
                    ..SamplingParams::default()
                });
        if let Some(samplers) = chain.samplers {
            sampling.samplers = samplers;
        }
        sampling.logit_bias = chain.logit_bias;
        sampling.validate()?;
        Ok(sampling)
    }

    /// `sampling` for a model of `vocab` tokens ending with `eos`: `--ignore-eos` bans the
    /// end-of-sequence tokens (as llama.cpp's EOS bias); a `--logit-bias` id outside the
    /// vocabulary is refused.
    pub fn for_model(
        &self,
        mut sampling: SamplingParams,
        vocab: usize,
        eos: &[u32],
    ) -> Result<SamplingParams> {
        if let Some(&(token, _)) = sampling
            .logit_bias
            .iter()
            .find(|(t, _)| *t as usize >= vocab)
        {
            bail!("--logit-bias: token id {token} is not in the model's vocabulary (0..{vocab})");
        }
        if self.chain.ignore_eos {
            sampling
                .logit_bias
                .extend(eos.iter().map(|&t| (t, f32::NEG_INFINITY)));
        }
        Ok(sampling)
    }

    /// The output constraint `--grammar`, `--grammar-file`, `-j` or `-jf` gives.
    pub fn constraint(&self) -> Result<Option<Constraint>> {
        Ok(self.constraint.constraint()?)
    }

    /// How the engine is loaded: one request at a time.
    pub fn engine_options(&self) -> Result<EngineOptions> {
        let backend: BackendKind = self.backend.parse()?;
        let mut options = EngineOptions {
            backend,
            threads: self.threads.and_then(|t| usize::try_from(t).ok()),
            speculative: SpeculativeConfig::from_flags(
                self.spec_type.as_deref(),
                self.hashed_spec.spec_default,
                self.spec_draft_model.is_some(),
                self.draft_max,
                self.draft_min,
                self.draft_p_min,
            )?,
            draft_model: self.spec_draft_model.clone(),
            kv_types: self.kv.kv_types(),
            kv_budget_bytes: self.kv.kv_budget_bytes(),
            lora_adapters: self.lora.paths(),
            control_vector: self.control_vector.spec.clone(),
            // One request at a time: one without a token limit may use the whole KV budget.
            scheduler: SchedulerConfig {
                max_batch: 1,
                ..SchedulerConfig::default()
            },
            ..EngineOptions::default()
        };
        // `--activations`, else the application default: int8 where the kernels are fast, f32
        // for a model under 500 M parameters (decided at load, once its size is known).
        match self.activations.as_deref() {
            Some(value) => {
                options.activations = Some(super::parse_activations(Some(value), backend)?);
            }
            None => options.use_application_activations(),
        }
        self.hashed_spec
            .apply(options.speculative.as_mut())
            .map_err(anyhow::Error::msg)?;
        options.special_tokens = self.special;
        options.rope = self.model_overrides.rope()?;
        options.kv_overrides = self.model_overrides.kv_overrides()?;
        Ok(options)
    }

    /// `--cache-ram` in bytes, else `--kv-budget`'s.
    pub fn cache_ram_bytes(&self) -> usize {
        match self.cache_ram {
            Some(mib) => usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            None => self.kv.kv_budget_bytes(),
        }
    }

    /// Whether the prompt goes through the chat template.
    pub fn chat_template(&self) -> bool {
        !(self.no_chat_template || self.no_conversation)
    }

    /// Whether escapes are read (`-e`; `--no-escape`, the default, reads text literally).
    fn escapes(&self) -> bool {
        self.escape && !self.no_escape
    }

    /// `text`, its escapes read if `-e` asks for that.
    pub fn text(&self, text: &str) -> String {
        if self.escapes() {
            unescape(text)
        } else {
            text.to_owned()
        }
    }

    /// The system message: `--system`, or the contents of `--system-prompt-file`.
    pub fn system(&self) -> Result<Option<String>> {
        let text = match (&self.system, &self.system_prompt_file) {
            (Some(text), _) => text.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("--system-prompt-file {}", path.display()))?,
            (None, None) => return Ok(None),
        };
        Ok(Some(self.text(&text)))
    }

    /// The stop strings (`--stop`, `-r`).
    pub fn stops(&self) -> Vec<String> {
        self.stop.iter().map(|s| self.text(s)).collect()
    }

    /// What to do with `prompt` (already read from `-p`, `-f` or standard input).
    pub fn mode(&self, prompt: Option<String>) -> Result<Mode> {
        if self.no_conversation {
            return match prompt {
                Some(prompt) => Ok(Mode::Once(prompt)),
                None => bail!("--no-conversation (-no-cnv) completes a prompt: give -p or -f"),
            };
        }
        Ok(match prompt {
            Some(prompt) if !self.conversation => Mode::Once(prompt),
            first => Mode::Chat {
                first,
                single_turn: self.single_turn,
            },
        })
    }

    /// Whether to colour the chat (`--color`).
    pub fn colour(&self) -> bool {
        use std::io::IsTerminal;
        match self.color.as_str() {
            "on" => true,
            "auto" => std::io::stdout().is_terminal(),
            _ => false,
        }
    }
}

/// `text` with llama.cpp's escapes read: `\n`, `\r`, `\t`, `\a`, `\b`, `\f`, `\v`, `\\`, `\'`,
/// `\"`, `\?` and `\xHH`; any other backslash is kept as written.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(&next) = chars.peek() else {
            out.push(c);
            break;
        };
        let replaced = match next {
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'f' => Some('\x0c'),
            'v' => Some('\x0b'),
            '\\' => Some('\\'),
            '\'' => Some('\''),
            '"' => Some('"'),
            '?' => Some('?'),
            _ => None,
        };
        if let Some(r) = replaced {
            chars.next();
            out.push(r);
            continue;
        }
        if next == 'x' {
            let hex: String = chars.clone().skip(1).take(2).collect();
            if hex.len() == 2
                && let Ok(byte) = u8::from_str_radix(&hex, 16)
                && byte.is_ascii()
            {
                chars.nth(2);
                out.push(char::from(byte));
                continue;
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes_read_as_llama_cpp_reads_them() {
        assert_eq!(unescape(r"a\nb\tc"), "a\nb\tc");
        assert_eq!(unescape(r#"\"q\" \\ \'"#), "\"q\" \\ '");
        assert_eq!(unescape(r"\x41\x7e"), "A~");
        // Unknown escapes, a short \x and a trailing backslash stay as written.
        assert_eq!(unescape(r"\q \x4 \"), r"\q \x4 \");
    }
}
