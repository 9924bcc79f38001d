//! llama-server's command line beyond what clap declares: multi-letter short options, and the
//! options that have no effect on this engine (accepted with one warning line each, so that a
//! llama-server command line starts mlxcel-server).
//!
//! The tables come from `compat/llama-server/<build>/manifest.toml` (the options whose state is
//! `not_applicable`, and every multi-letter short spelling); `cargo xtask check-compat` and the
//! server tests hold them to it through `compat/llama-server/accepted-flags.txt`.

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// One llama-server option without effect here.
#[derive(Debug)]
pub struct NoOpOption {
    /// Every spelling, the positive ones first.
    pub names: &'static [&'static str],
    /// Its `LLAMA_ARG_*` twin, if it has one.
    pub env: Option<&'static str>,
    /// How many values it takes (0: a switch).
    pub values: usize,
    /// Why it has no effect.
    pub reason: &'static str,
}

impl NoOpOption {
    /// The long spelling clap declares; the other long spellings are its aliases.
    fn long(&self) -> &'static str {
        self.names
            .iter()
            .find(|n| n.starts_with("--"))
            .map_or(self.names[0], |n| &n[2..])
    }

    fn arg(&self) -> Arg {
        let long = self.long();
        let mut arg = Arg::new(long).long(long).hide(true).aliases(
            self.names
                .iter()
                .filter_map(|n| n.strip_prefix("--"))
                .filter(|n| *n != long),
        );
        if let Some(short) = self
            .names
            .iter()
            .filter_map(|n| n.strip_prefix('-'))
            .find(|n| n.len() == 1)
            .and_then(|n| n.chars().next())
        {
            arg = arg.short(short);
        }
        if self.values == 0 {
            arg.action(ArgAction::Count)
        } else {
            arg.action(ArgAction::Append)
                .num_args(self.values)
                .allow_hyphen_values(true)
        }
    }
}

/// The no-op options given on the command line or in the environment, as warning lines.
#[derive(Debug, Clone, Default)]
pub struct IgnoredOptions {
    /// One line per option given.
    pub warnings: Vec<String>,
}

impl clap::FromArgMatches for IgnoredOptions {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut ignored = Self::default();
        ignored.update_from_arg_matches(matches)?;
        Ok(ignored)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.warnings.clear();
        for option in NO_OP_OPTIONS {
            let id = option.long();
            let spellings = option.names.join("/");
            if matches.value_source(id) == Some(ValueSource::CommandLine) {
                let values: Vec<String> = if option.values == 0 {
                    Vec::new()
                } else {
                    matches
                        .get_many::<String>(id)
                        .map(|v| v.cloned().collect())
                        .unwrap_or_default()
                };
                let given = if values.is_empty() {
                    spellings
                } else {
                    format!("{spellings} {}", values.join(" "))
                };
                self.warnings.push(format!(
                    "ignoring {given}: no effect here ({})",
                    option.reason
                ));
            } else if let Some(env) = option.env
                && let Some(value) = std::env::var_os(env)
            {
                self.warnings.push(format!(
                    "ignoring {env}={}: no effect here ({})",
                    value.to_string_lossy(),
                    option.reason
                ));
            }
        }
        Ok(())
    }
}

impl clap::Args for IgnoredOptions {
    fn augment_args(cmd: Command) -> Command {
        NO_OP_OPTIONS
            .iter()
            .fold(cmd, |cmd, option| cmd.arg(option.arg()))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Rewrites llama-server's multi-letter short options, which clap would read as clusters of
/// one-letter ones (`-ngl 99` as `-n gl`, `-hf` as `-h`), to their long forms:
/// `-np 4` → `--parallel 4`, `-ngl=99` → `--n-gpu-layers=99`; `--usage` to `--help`; and
/// underscores in a long option's name to dashes (`--backend_sampling`), as llama.cpp reads them.
/// Everything else passes through unchanged.
pub fn normalize_llama_args<I, T>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    args.into_iter()
        .map(|arg| {
            let arg: OsString = arg.into();
            let Some(text) = arg.to_str() else {
                return arg;
            };
            if text == "--usage" {
                return OsString::from("--help");
            }
            let (name, value) = match text.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (text, None),
            };
            if let Some((_, long)) = MULTI_LETTER_SHORTS.iter().find(|(short, _)| *short == name) {
                return match value {
                    Some(value) => OsString::from(format!("{long}={value}")),
                    None => OsString::from(*long),
                };
            }
            // As llama.cpp's parser: a long option may spell its dashes as underscores
            // (`--backend_sampling`); the value after `=` is kept as given.
            if name.starts_with("--") && name.contains('_') {
                let name = name.replace('_', "-");
                return match value {
                    Some(value) => OsString::from(format!("{name}={value}")),
                    None => OsString::from(name),
                };
            }
            arg
        })
        .collect()
}

/// llama-server's multi-letter short options (and `-np`-style spellings clap cannot declare),
/// each with the long spelling it is rewritten to before parsing.
pub const MULTI_LETTER_SHORTS: &[(&str, &str)] = &[
    ("-cl", "--cache-list"),
    ("-tb", "--threads-batch"),
    ("-Cr", "--cpu-range"),
    ("-Cb", "--cpu-mask-batch"),
    ("-Crb", "--cpu-range-batch"),
    ("-lcs", "--lookup-cache-static"),
    ("-lcd", "--lookup-cache-dynamic"),
    ("-ub", "--ubatch-size"),
    ("-ctxcp", "--ctx-checkpoints"),
    ("-cms", "--checkpoint-min-step"),
    ("-cram", "--cache-ram"),
    ("-kvu", "--kv-unified"),
    ("-no-kvu", "--no-kv-unified"),
    ("-fa", "--flash-attn"),
    ("-sp", "--special"),
    ("-jf", "--json-schema-file"),
    ("-bs", "--backend-sampling"),
    ("-kvo", "--kv-offload"),
    ("-nkvo", "--no-kv-offload"),
    ("-nr", "--no-repack"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-dt", "--defrag-thold"),
    ("-np", "--parallel"),
    ("-cb", "--cont-batching"),
    ("-nocb", "--no-cont-batching"),
    ("-mm", "--mmproj"),
    ("-mmu", "--mmproj-url"),
    ("-mmdev", "--mmproj-device"),
    ("-lm", "--load-mode"),
    ("-lzm", "--lazy-mode"),
    ("-dev", "--device"),
    ("-ot", "--override-tensor"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-ncffn", "--n-cpu-ffn"),
    ("-ngl", "--gpu-layers"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-fit", "--fit"),
    ("-fitt", "--fit-target"),
    ("-fitc", "--fit-ctx"),
    ("-mu", "--model-url"),
    ("-dr", "--docker-repo"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("-ag", "--agent"),
    ("-no-ag", "--no-agent"),
    ("-to", "--timeout"),
    ("-rea", "--reasoning"),
    ("-sps", "--slot-prompt-similarity"),
    ("-lv", "--verbosity"),
    ("-hfd", "--spec-draft-hf"),
    ("-hfrd", "--spec-draft-hf"),
    ("-td", "--spec-draft-threads"),
    ("-tbd", "--spec-draft-threads-batch"),
    ("-Cd", "--spec-draft-cpu-mask"),
    ("-Crd", "--spec-draft-cpu-range"),
    ("-Cbd", "--spec-draft-cpu-mask-batch"),
    ("-ctkd", "--spec-draft-type-k"),
    ("-ctvd", "--spec-draft-type-v"),
    ("-otd", "--spec-draft-override-tensor"),
    ("-cmoed", "--spec-draft-cpu-moe"),
    ("-ncmoed", "--spec-draft-n-cpu-moe"),
    ("-devd", "--spec-draft-device"),
    ("-ngld", "--spec-draft-ngl"),
    ("-md", "--spec-draft-model"),
];

/// llama-server options that have no effect here: accepted, with one warning line each.
pub const NO_OP_OPTIONS: &[NoOpOption] = &[
    NoOpOption {
        names: &["-tb", "--threads-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-C", "--cpu-mask"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-Cr", "--cpu-range"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--cpu-strict"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--prio"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--poll"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-Cb", "--cpu-mask-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-Crb", "--cpu-range-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--cpu-strict-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--prio-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["--poll-batch"],
        env: None,
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-lcs", "--lookup-cache-static"],
        env: None,
        values: 1,
        reason: "lookup decoding of llama.cpp's command-line tools",
    },
    NoOpOption {
        names: &["-lcd", "--lookup-cache-dynamic"],
        env: None,
        values: 1,
        reason: "lookup decoding of llama.cpp's command-line tools",
    },
    NoOpOption {
        names: &["--kv-unified-per-slot"],
        env: Some("LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
        values: 1,
        reason: "every sequence has its own KV cache; there is no shared buffer to size",
    },
    NoOpOption {
        names: &["-b", "--batch-size"],
        env: Some("LLAMA_ARG_BATCH"),
        values: 1,
        reason: "the engine's scheduler sizes each step itself (its token budget); llama.cpp's logical batch has no counterpart",
    },
    NoOpOption {
        names: &["-ub", "--ubatch-size"],
        env: Some("LLAMA_ARG_UBATCH"),
        values: 1,
        reason: "the engine's scheduler sizes each step itself; there is no physical micro-batch",
    },
    NoOpOption {
        names: &["--keep"],
        env: None,
        values: 1,
        reason: "no context shift: a request that outgrows its context is refused or stopped by length, so there is nothing to keep",
    },
    NoOpOption {
        names: &["--swa-full"],
        env: Some("LLAMA_ARG_SWA_FULL"),
        values: 0,
        reason: "the KV cache is the backend's own (MLX arrays or IREE buffers) with the model's dtype",
    },
    NoOpOption {
        names: &["-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"],
        env: Some("LLAMA_ARG_CTX_CHECKPOINTS"),
        values: 1,
        reason: "no prompt cache yet: every prompt is computed afresh (docs/server.md)",
    },
    NoOpOption {
        names: &["-cms", "--checkpoint-min-step"],
        env: Some("LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
        values: 1,
        reason: "no prompt cache yet: every prompt is computed afresh (docs/server.md)",
    },
    NoOpOption {
        names: &["--context-shift", "--no-context-shift"],
        env: Some("LLAMA_ARG_CONTEXT_SHIFT"),
        values: 0,
        reason: "no context shift: a request that outgrows its context is stopped by length (finish_reason \"length\")",
    },
    NoOpOption {
        names: &["-fa", "--flash-attn"],
        env: Some("LLAMA_ARG_FLASH_ATTN"),
        values: 1,
        reason: "attention is the backend's own fused kernel (MLX's scaled_dot_product_attention, or IREE's); there is nothing to switch",
    },
    NoOpOption {
        names: &["--perf", "--no-perf"],
        env: Some("LLAMA_ARG_PERF"),
        values: 0,
        reason: "llama.cpp's internal performance counters; timings are in every response and in /metrics",
    },
    NoOpOption {
        names: &["-e", "--escape", "--no-escape"],
        env: None,
        values: 0,
        reason: "prompt escapes of llama.cpp's command-line tools; the server reads JSON",
    },
    NoOpOption {
        names: &["-r", "--reverse-prompt"],
        env: None,
        values: 1,
        reason: "interactive reverse prompt of llama.cpp's command-line tools; requests send `stop`",
    },
    NoOpOption {
        names: &["--warmup", "--no-warmup"],
        env: None,
        values: 0,
        reason: "the backends warm up while loading (OpenXLA compiles its shapes); there is no separate empty run",
    },
    NoOpOption {
        names: &["-bs", "--backend-sampling"],
        env: Some("LLAMA_ARG_BACKEND_SAMPLING"),
        values: 0,
        reason: "sampling always runs in the engine, on the host, after the backend's logits",
    },
    NoOpOption {
        names: &["-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"],
        env: Some("LLAMA_ARG_KV_OFFLOAD"),
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["--repack", "-nr", "--no-repack"],
        env: Some("LLAMA_ARG_REPACK"),
        values: 0,
        reason: "weights are laid out by mlxcel's own kernels at load",
    },
    NoOpOption {
        names: &["--no-host"],
        env: Some("LLAMA_ARG_NO_HOST"),
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-dt", "--defrag-thold"],
        env: Some("LLAMA_ARG_DEFRAG_THOLD"),
        values: 1,
        reason: "deprecated in llama.cpp itself; the KV cache is never fragmented here",
    },
    NoOpOption {
        names: &["-cb", "--cont-batching", "-nocb", "--no-cont-batching"],
        env: Some("LLAMA_ARG_CONT_BATCHING"),
        values: 0,
        reason: "batching is always continuous: the engine's scheduler admits requests between steps",
    },
    NoOpOption {
        names: &["--mmproj-auto", "--no-mmproj", "--no-mmproj-auto"],
        env: Some("LLAMA_ARG_MMPROJ_AUTO"),
        values: 0,
        reason: "no multimodal projector is ever loaded, so there is nothing to find or skip",
    },
    NoOpOption {
        names: &["--mmproj-offload", "--no-mmproj-offload"],
        env: Some("LLAMA_ARG_MMPROJ_OFFLOAD"),
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-mmdev", "--mmproj-device"],
        env: Some("MTMD_BACKEND_DEVICE"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["--rpc"],
        env: Some("LLAMA_ARG_RPC"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-lm", "--load-mode"],
        env: Some("LLAMA_ARG_LOAD_MODE"),
        values: 1,
        reason: "weights are memory-mapped (safetensors) or converted at load; there is no load mode to choose",
    },
    NoOpOption {
        names: &["-lzm", "--lazy-mode"],
        env: Some("LLAMA_ARG_LAZY_MODE"),
        values: 1,
        reason: "weights are memory-mapped (safetensors) or converted at load; there is no lazy mode to choose",
    },
    NoOpOption {
        names: &["--numa"],
        env: Some("LLAMA_ARG_NUMA"),
        values: 1,
        reason: "thread affinity, priority and polling of llama.cpp's threadpool; MLX and IREE keep their own threads (--threads sizes mlxcel's CPU kernels)",
    },
    NoOpOption {
        names: &["-dev", "--device"],
        env: Some("LLAMA_ARG_DEVICE"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["--list-devices"],
        env: None,
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-ot", "--override-tensor"],
        env: Some("LLAMA_ARG_OVERRIDE_TENSOR"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-cmoe", "--cpu-moe"],
        env: Some("LLAMA_ARG_CPU_MOE"),
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-ncmoe", "--n-cpu-moe"],
        env: Some("LLAMA_ARG_N_CPU_MOE"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-ncffn", "--n-cpu-ffn"],
        env: Some("LLAMA_ARG_N_CPU_FFN"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-ngl", "--gpu-layers", "--n-gpu-layers"],
        env: Some("LLAMA_ARG_N_GPU_LAYERS"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-sm", "--split-mode"],
        env: Some("LLAMA_ARG_SPLIT_MODE"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-ts", "--tensor-split"],
        env: Some("LLAMA_ARG_TENSOR_SPLIT"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-mg", "--main-gpu"],
        env: Some("LLAMA_ARG_MAIN_GPU"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-fit", "--fit"],
        env: Some("LLAMA_ARG_FIT"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-fitt", "--fit-target"],
        env: Some("LLAMA_ARG_FIT_TARGET"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["-fitc", "--fit-ctx"],
        env: Some("LLAMA_ARG_FIT_CTX"),
        values: 1,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["--check-tensors"],
        env: None,
        values: 0,
        reason: "checkpoints are validated as they are read (shapes, dtypes; checksums on download)",
    },
    NoOpOption {
        names: &["--op-offload", "--no-op-offload"],
        env: None,
        values: 0,
        reason: "device placement and offload: the MLX backend runs where MLX runs (CPU here), the OpenXLA backend where IREE compiles for; nothing to place",
    },
    NoOpOption {
        names: &["--ui-config", "--webui-config"],
        env: Some("LLAMA_ARG_UI_CONFIG"),
        values: 1,
        reason: "the built-in chat page (GET /) has no settings to load or MCP proxy",
    },
    NoOpOption {
        names: &["--ui-config-file", "--webui-config-file"],
        env: Some("LLAMA_ARG_UI_CONFIG_FILE"),
        values: 1,
        reason: "the built-in chat page (GET /) has no settings to load or MCP proxy",
    },
    NoOpOption {
        names: &["--threads-http"],
        env: Some("LLAMA_ARG_THREADS_HTTP"),
        values: 1,
        reason: "HTTP runs on the async runtime's threads; there is no HTTP thread pool to size",
    },
    NoOpOption {
        names: &["--cache-prompt", "--no-cache-prompt"],
        env: Some("LLAMA_ARG_CACHE_PROMPT"),
        values: 0,
        reason: "no prompt cache yet: every prompt is computed afresh (docs/server.md)",
    },
    NoOpOption {
        names: &["--cache-reuse"],
        env: Some("LLAMA_ARG_CACHE_REUSE"),
        values: 1,
        reason: "no prompt cache yet: every prompt is computed afresh (docs/server.md)",
    },
    NoOpOption {
        names: &["--jinja", "--no-jinja"],
        env: Some("LLAMA_ARG_JINJA"),
        values: 0,
        reason: "chat templates are always rendered as Jinja (minijinja with Hugging Face's settings); there is no other renderer to choose",
    },
    NoOpOption {
        names: &["-sps", "--slot-prompt-similarity"],
        env: None,
        values: 1,
        reason: "no prompt cache yet: every prompt is computed afresh (docs/server.md)",
    },
    NoOpOption {
        names: &["--log-colors"],
        env: Some("LLAMA_ARG_LOG_COLORS"),
        values: 1,
        reason: "logs are plain text on stderr",
    },
    NoOpOption {
        names: &["-lv", "--verbosity", "--log-verbosity"],
        env: Some("LLAMA_ARG_LOG_VERBOSITY"),
        values: 1,
        reason: "verbosity is set by -v or RUST_LOG (tracing's filter), not by a number",
    },
    NoOpOption {
        names: &["--log-prefix", "--no-log-prefix"],
        env: Some("LLAMA_ARG_LOG_PREFIX"),
        values: 0,
        reason: "log lines always carry their level and target",
    },
    NoOpOption {
        names: &["--log-timestamps", "--no-log-timestamps"],
        env: Some("LLAMA_ARG_LOG_TIMESTAMPS"),
        values: 0,
        reason: "log lines always carry timestamps",
    },
    NoOpOption {
        names: &["--spec-draft-threads", "-td", "--threads-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &[
            "--spec-draft-threads-batch",
            "-tbd",
            "--threads-batch-draft",
        ],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-cpu-strict", "--cpu-strict-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-prio", "--prio-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-poll", "--poll-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &[
            "--spec-draft-cpu-mask-batch",
            "-Cbd",
            "--cpu-mask-batch-draft",
        ],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-prio-batch", "--prio-batch-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &["--spec-draft-poll-batch", "--poll-batch-draft"],
        env: None,
        values: 1,
        reason: "the draft model runs in the engine beside the model, on the same threads and placement (--threads sizes mlxcel's CPU kernels for both); nothing to place separately",
    },
    NoOpOption {
        names: &[
            "--spec-draft-override-tensor",
            "-otd",
            "--override-tensor-draft",
        ],
        env: None,
        values: 1,
        reason: "device placement of the draft model's tensors: the MLX backend runs where MLX runs (CPU here); nothing to place",
    },
    NoOpOption {
        names: &["--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"],
        env: Some("LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
        values: 0,
        reason: "device placement of the draft model's experts: the MLX backend runs where MLX runs (CPU here); nothing to place",
    },
    NoOpOption {
        names: &[
            "--spec-draft-n-cpu-moe",
            "--spec-draft-ncmoe",
            "-ncmoed",
            "--n-cpu-moe-draft",
        ],
        env: Some("LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
        values: 1,
        reason: "device placement of the draft model's experts: the MLX backend runs where MLX runs (CPU here); nothing to place",
    },
    NoOpOption {
        names: &["--spec-draft-device", "-devd", "--device-draft"],
        env: None,
        values: 1,
        reason: "device placement of the draft model: it runs on the model's backend; nothing to place",
    },
    NoOpOption {
        names: &[
            "--spec-draft-ngl",
            "-ngld",
            "--gpu-layers-draft",
            "--n-gpu-layers-draft",
        ],
        env: Some("LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
        values: 1,
        reason: "device placement of the draft model: it runs on the model's backend; nothing to place",
    },
    NoOpOption {
        names: &[
            "--spec-draft-backend-sampling",
            "--no-spec-draft-backend-sampling",
        ],
        env: Some("LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING"),
        values: 0,
        reason: "the draft model's proposals are sampled in the engine, on the host, after its logits (as every sample here)",
    },
    NoOpOption {
        names: &["--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"],
        env: Some("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K"),
        values: 1,
        reason: "the draft model's KV cache takes the model's key and value types (--cache-type-k, --cache-type-v)",
    },
    NoOpOption {
        names: &["--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"],
        env: Some("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"),
        values: 1,
        reason: "the draft model's KV cache takes the model's key and value types (--cache-type-k, --cache-type-v)",
    },
    NoOpOption {
        names: &["--spec-draft-p-split", "--draft-p-split"],
        env: Some("LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
        values: 1,
        reason: "the split probability of llama.cpp's draft trees; the draft model here proposes one chain per pass, so there is nothing to split",
    },
    NoOpOption {
        names: &["--spec-ngram-simple-min-hits"],
        env: None,
        values: 1,
        reason: "llama.cpp's ngram-simple proposer does not read it either (only its ngram-map types count hits)",
    },
];

/// llama.cpp's booleans: `on`/`enabled`/`true`/`1` and `off`/`disabled`/`false`/`0`.
pub(crate) fn llama_bool(value: &str) -> Result<bool, String> {
    match value {
        "on" | "enabled" | "true" | "1" => Ok(true),
        "off" | "disabled" | "false" | "0" => Ok(false),
        other => Err(format!(
            "`{other}`: expected on, enabled, true, 1, off, disabled, false or 0"
        )),
    }
}
