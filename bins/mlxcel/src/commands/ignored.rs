//! llama.cpp options that have no effect on this engine, accepted by `generate`, `run`, `bench`
//! and `perplexity` with one warning line each, so that a llama-cli, llama-completion,
//! llama-bench or llama-perplexity command line runs (`serve` has llama-server's own table).

use clap::{Arg, ArgAction, ArgMatches, Command};

/// One option without effect here.
#[derive(Debug)]
pub struct NoEffect {
    /// Every spelling as llama.cpp spells them; the first long one is declared, the other long
    /// ones are its aliases, a one-letter short one is its short (multi-letter short ones are
    /// rewritten to the long one before parsing: `crate::spellings`).
    pub names: &'static [&'static str],
    /// How many values it takes: 0 (a switch), 1, or `OPTIONAL` (`-fa` and `-fa on` alike).
    pub values: usize,
    /// Why it has no effect.
    pub reason: &'static str,
}

/// `NoEffect::values` of an option whose value may be left out.
pub const OPTIONAL: usize = usize::MAX;

const PLACEMENT: &str = "mlxcel runs on the CPU (MLX's CPU device, or what IREE compiled for): \
                         there are no GPU layers or devices to place";
const THREADPOOL: &str = "llama.cpp's threadpool settings; mlxcel's CPU kernels take -t/--threads";
const MAPPING: &str = "safetensors are memory-mapped and GGUF tensors read as the model loads; \
                       there is nothing to lock or copy";

/// The options accepted without effect, unless a subcommand declares one of the spellings itself
/// (`perplexity`'s `-b`, `bench`'s `--ubatch-size`), in which case its own meaning wins.
pub const NO_EFFECT: &[NoEffect] = &[
    NoEffect {
        names: &["-ngl", "--gpu-layers", "--n-gpu-layers"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-dev", "--device"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-sm", "--split-mode"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-ts", "--tensor-split"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-mg", "--main-gpu"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-nkvo", "--no-kv-offload", "-kvo", "--kv-offload"],
        values: 0,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-fa", "--flash-attn"],
        values: OPTIONAL,
        reason: "attention is always mlxcel's own fused kernel; there is nothing to switch",
    },
    NoEffect {
        names: &["-tb", "--threads-batch"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["--numa"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["-C", "--cpu-mask"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["-Cr", "--cpu-range"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["--cpu-strict"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["--prio"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["--poll"],
        values: 1,
        reason: THREADPOOL,
    },
    NoEffect {
        names: &["-ot", "--override-tensor"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-cmoe", "--cpu-moe"],
        values: 0,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-ncmoe", "--n-cpu-moe"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["--rpc"],
        values: 1,
        reason: PLACEMENT,
    },
    NoEffect {
        names: &["-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"],
        values: 0,
        reason: "every sequence has its own KV cache; there is no shared buffer to unify",
    },
    NoEffect {
        names: &["--swa-full"],
        values: 0,
        reason: "the KV cache keeps every position of every layer already",
    },
    NoEffect {
        names: &["--perf", "--no-perf"],
        values: 0,
        reason: "the timings lines are printed after every answer",
    },
    NoEffect {
        names: &["--offline"],
        values: 0,
        reason: "mlxcel never downloads a model by name",
    },
    NoEffect {
        names: &["--mlock"],
        values: 0,
        reason: MAPPING,
    },
    NoEffect {
        names: &["--no-mmap", "--mmap"],
        values: 0,
        reason: MAPPING,
    },
    NoEffect {
        names: &["-b", "--batch-size"],
        values: 1,
        reason: "the scheduler sizes each step itself; llama.cpp's logical batch has no \
                 counterpart",
    },
    NoEffect {
        names: &["-ub", "--ubatch-size"],
        values: 1,
        reason: "the scheduler sizes each step itself; there is no physical micro-batch",
    },
    NoEffect {
        names: &["--jinja", "--no-jinja"],
        values: 0,
        reason: "chat templates are always rendered as Jinja",
    },
    NoEffect {
        names: &["--no-warmup", "--warmup"],
        values: 0,
        reason: "there is no separate warm-up run",
    },
    NoEffect {
        names: &["--no-display-prompt", "--display-prompt"],
        values: 0,
        reason: "mlxcel never prints the prompt back, only what the model generates",
    },
    NoEffect {
        names: &["--simple-io"],
        values: 0,
        reason: "mlxcel reads plain lines and writes plain text already",
    },
];

/// The id under which an option is declared: its long spelling, whose dashes keep it apart from
/// the ids of a subcommand's own arguments (their field names, in snake case).
fn id(option: &NoEffect) -> &'static str {
    long(option)
}

/// The long spelling clap declares.
fn long(option: &NoEffect) -> &'static str {
    option
        .names
        .iter()
        .find_map(|n| n.strip_prefix("--"))
        .unwrap_or(option.names[0])
}

/// The one-letter short spelling, if the option has one.
fn short(option: &NoEffect) -> Option<char> {
    option
        .names
        .iter()
        .filter_map(|n| n.strip_prefix('-'))
        .find(|n| n.len() == 1)
        .and_then(|n| n.chars().next())
}

/// Whether `cmd` already declares one of the option's spellings.
fn taken(cmd: &Command, option: &NoEffect) -> bool {
    cmd.get_arguments().any(|arg| {
        let mut longs = arg
            .get_long()
            .into_iter()
            .chain(arg.get_all_aliases().into_iter().flatten());
        longs.any(|l| option.names.iter().any(|n| n.strip_prefix("--") == Some(l)))
            || arg.get_short().is_some_and(|s| short(option) == Some(s))
    })
}

fn arg(option: &NoEffect) -> Arg {
    let long = long(option);
    let mut arg = Arg::new(id(option)).long(long).hide(true).aliases(
        option
            .names
            .iter()
            .filter_map(|n| n.strip_prefix("--"))
            .filter(|n| *n != long),
    );
    if let Some(short) = short(option) {
        arg = arg.short(short);
    }
    match option.values {
        0 => arg.action(ArgAction::Count),
        OPTIONAL => arg
            .action(ArgAction::Append)
            .num_args(0..=1)
            .default_missing_value(""),
        n => arg
            .action(ArgAction::Append)
            .num_args(n)
            .allow_hyphen_values(true),
    }
}

/// The options of [`NO_EFFECT`] that were given, as warning lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ignored {
    /// One line per option given.
    pub warnings: Vec<String>,
}

impl Ignored {
    /// Prints the warnings to stderr.
    pub fn warn(&self) {
        for line in &self.warnings {
            eprintln!("mlxcel: {line}");
        }
    }
}

impl clap::FromArgMatches for Ignored {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut ignored = Self::default();
        ignored.update_from_arg_matches(matches)?;
        Ok(ignored)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.warnings.clear();
        let present: Vec<&str> = matches.ids().map(|id| id.as_str()).collect();
        for option in NO_EFFECT {
            let id = id(option);
            // Switches count from a default of 0, so presence alone does not mean given.
            if !present.contains(&id)
                || matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine)
            {
                continue;
            }
            let values: Vec<String> = matches
                .try_get_many::<String>(id)
                .ok()
                .flatten()
                .map(|v| v.filter(|v| !v.is_empty()).cloned().collect())
                .unwrap_or_default();
            let mut given = option.names.join("/");
            for value in values {
                given.push(' ');
                given.push_str(&value);
            }
            self.warnings.push(format!(
                "ignoring {given}: no effect here ({})",
                option.reason
            ));
        }
        Ok(())
    }
}

impl clap::Args for Ignored {
    fn augment_args(cmd: Command) -> Command {
        NO_EFFECT.iter().fold(cmd, |cmd, option| {
            if taken(&cmd, option) {
                cmd
            } else {
                cmd.arg(arg(option))
            }
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}
