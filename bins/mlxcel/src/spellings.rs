//! The spellings people bring from llama.cpp's command-line tools (llama-cli, llama-completion,
//! llama-server, llama-bench), before and after clap parses them.
//!
//! Before: llama.cpp's multi-letter short options (`-sys`, `-cnv`, `-ngl`, `-hf` …) are rewritten
//! to their long forms, since clap would read `-sys` as `-s ys` (a seed) and `-hf` as `-h f`.
//! After: an option clap does not know but llama.cpp's tools have gets an error that names it and
//! says what to use instead, rather than clap's generic "unexpected argument".

use std::ffi::OsString;

/// llama-cli's and llama-completion's multi-letter short options that llama-server lacks (the
/// server's own are in [`mlxcel_server::normalize_llama_args`]), each with the long spelling it is
/// rewritten to.
const LLAMA_CLI_SHORTS: &[(&str, &str)] = &[
    ("-sys", "--system-prompt"),
    ("-sysf", "--system-prompt-file"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-st", "--single-turn"),
    ("-if", "--interactive-first"),
    ("-co", "--color"),
    ("-mli", "--multiline-input"),
    ("-bf", "--binary-file"),
    ("-ptc", "--print-token-count"),
    ("-gan", "--grp-attn-n"),
    ("-gaw", "--grp-attn-w"),
    ("-dkvc", "--dump-kv-cache"),
    ("-cml", "--chatml"),
    ("-ld", "--logdir"),
];

/// Rewrites llama.cpp's multi-letter short options to their long forms (`-sys X` →
/// `--system-prompt X`, `-ngl=99` → `--gpu-layers=99`) and `--usage` to `--help`. Everything
/// after a bare `--` and every other argument passes through unchanged.
pub fn normalize(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut after_separator = false;
    let rewritten: Vec<OsString> = args
        .into_iter()
        .map(|arg| {
            if after_separator {
                return arg;
            }
            if arg == "--" {
                after_separator = true;
                return arg;
            }
            let Some(text) = arg.to_str() else {
                return arg;
            };
            let (name, value) = match text.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (text, None),
            };
            match LLAMA_CLI_SHORTS.iter().find(|(short, _)| *short == name) {
                Some((_, long)) => match value {
                    Some(value) => OsString::from(format!("{long}={value}")),
                    None => OsString::from(*long),
                },
                None => arg,
            }
        })
        .collect();
    mlxcel_server::normalize_llama_args(rewritten)
}

/// A llama.cpp option that mlxcel does not have.
#[derive(Debug)]
pub struct Refused {
    /// Every spelling, short ones first, as llama.cpp spells them.
    pub names: &'static [&'static str],
    /// What it does there.
    pub does: &'static str,
    /// What to do here instead.
    pub instead: &'static str,
}

const NO_DOWNLOADS: &str = "this subcommand does not download models by name; give -m a local \
                            .gguf file or checkpoint directory (`mlxcel serve` fetches with -hf, \
                            -mu and -dr as llama-server; `mlxcel pull` installs the default model)";
const ROPE: &str = "self-extend is not implemented; --rope-scaling/--rope-scale and the --yarn-* flags stretch the context instead";
const NO_PROMPT_CACHE: &str = "there is no prompt-cache file; `mlxcel serve` keeps a prefix cache \
                               in memory (--cache-ram)";
const TEMPLATE: &str = "the chat template is the checkpoint's own; --no-chat-template sends the \
                        prompt as written, where you can frame each turn yourself";

/// llama.cpp options that mlxcel refuses by name (any subcommand that does not declare them).
pub const REFUSED: &[Refused] = &[
    Refused {
        names: &["-hf", "-hfr", "--hf-repo"],
        does: "downloads a model from Hugging Face",
        instead: NO_DOWNLOADS,
    },
    Refused {
        names: &["-hff", "--hf-file"],
        does: "picks the file of a Hugging Face download",
        instead: NO_DOWNLOADS,
    },
    Refused {
        names: &["-hft", "--hf-token"],
        does: "authenticates Hugging Face downloads",
        instead: NO_DOWNLOADS,
    },
    Refused {
        names: &["-mu", "--model-url"],
        does: "downloads a model from a URL",
        instead: NO_DOWNLOADS,
    },
    Refused {
        names: &["-dr", "--docker-repo"],
        does: "downloads a model from Docker Hub",
        instead: NO_DOWNLOADS,
    },
    Refused {
        names: &["-mli", "--multiline-input"],
        does: "reads multi-line turns",
        instead: "end a line with \\ to continue the turn on the next line",
    },
    Refused {
        names: &["--in-prefix"],
        does: "writes text before each user turn",
        instead: TEMPLATE,
    },
    Refused {
        names: &["--in-suffix"],
        does: "writes text after each user turn",
        instead: TEMPLATE,
    },
    Refused {
        names: &["--in-prefix-bos"],
        does: "starts each user turn with BOS",
        instead: TEMPLATE,
    },
    Refused {
        names: &["--chat-template"],
        does: "overrides the chat template",
        instead: TEMPLATE,
    },
    Refused {
        names: &["--chat-template-file"],
        does: "reads a chat template from a file",
        instead: TEMPLATE,
    },
    Refused {
        names: &["-cml", "--chatml"],
        does: "forces the ChatML template",
        instead: TEMPLATE,
    },
    Refused {
        names: &["-bf", "--binary-file"],
        does: "reads the prompt from a binary file",
        instead: "give the prompt with -f FILE (text) or -p - (standard input)",
    },
    Refused {
        names: &["--prompt-cache"],
        does: "saves the prompt's state to a file",
        instead: NO_PROMPT_CACHE,
    },
    Refused {
        names: &["--prompt-cache-all"],
        does: "saves the whole session's state to a file",
        instead: NO_PROMPT_CACHE,
    },
    Refused {
        names: &["--prompt-cache-ro"],
        does: "reads a prompt-cache file without updating it",
        instead: NO_PROMPT_CACHE,
    },
    Refused {
        names: &["--keep"],
        does: "keeps the prompt's first tokens when the context shifts",
        instead: "there is no context shift: a turn that outgrows the context is refused or \
                  stopped by length",
    },
    Refused {
        names: &["--context-shift", "--no-context-shift"],
        does: "turns context shifting on or off",
        instead: "there is no context shift: a turn that outgrows the context is refused or \
                  stopped by length",
    },
    Refused {
        names: &["-gan", "--grp-attn-n"],
        does: "sets self-extend's group factor",
        instead: ROPE,
    },
    Refused {
        names: &["-gaw", "--grp-attn-w"],
        does: "sets self-extend's group width",
        instead: ROPE,
    },
    Refused {
        names: &["-ptc", "--print-token-count"],
        does: "prints the token count every N tokens",
        instead: "the token counts and rates are printed after each answer",
    },
    Refused {
        names: &["-dkvc", "--dump-kv-cache"],
        does: "prints the KV cache's state",
        instead: "not offered",
    },
    Refused {
        names: &["-ld", "--logdir"],
        does: "writes YAML logs of each run",
        instead: "the statistics lines go to stderr; redirect them",
    },
    Refused {
        names: &["-v", "--verbose", "--log-verbose"],
        does: "logs everything",
        instead: "RUST_LOG=debug sets the log filter (docs/environment.md)",
    },
    Refused {
        names: &["-lv", "--verbosity", "--log-verbosity"],
        does: "sets the log verbosity",
        instead: "RUST_LOG sets the log filter (docs/environment.md)",
    },
    Refused {
        names: &["--log-disable"],
        does: "turns logging off",
        instead: "RUST_LOG=off turns the logs off; answers and statistics are not logs",
    },
    Refused {
        names: &["--log-file"],
        does: "writes the log to a file",
        instead: "the log and statistics go to stderr: redirect it (2> FILE)",
    },
    Refused {
        names: &["--verbose-prompt"],
        does: "prints the prompt's tokens before generating",
        instead: "`mlxcel tokenize` prints a text's token ids",
    },
    Refused {
        names: &["--list-devices"],
        does: "lists the devices models can be placed on",
        instead: "mlxcel runs on the CPU; there are no devices to choose",
    },
    Refused {
        names: &["--lookup-cache-static", "-lcs"],
        does: "reads a static lookup cache",
        instead: "--spec-type ngram-simple proposes from the prompt and output so far",
    },
    Refused {
        names: &["--lookup-cache-dynamic", "-lcd"],
        does: "reads and writes a dynamic lookup cache",
        instead: "--spec-type ngram-simple proposes from the prompt and output so far",
    },
];

/// The llama.cpp option clap rejected in `err`, explained: what it does there and what to use
/// here instead. `None` when the rejected argument is not one of [`REFUSED`] (or clap's error is
/// of another kind), so that clap's own message stands.
pub fn explain(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    refusal(arg)
}

/// The refusal of `arg` (as typed, or as [`normalize`] rewrote it; a `=value` is ignored).
pub fn refusal(arg: &str) -> Option<String> {
    let name = arg.split_once('=').map_or(arg, |(name, _)| name);
    let refused = REFUSED.iter().find(|r| r.names.contains(&name))?;
    Some(format!(
        "{} is not an mlxcel option (in llama.cpp it {}): {}",
        refused.names.join("/"),
        refused.does,
        refused.instead
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        normalize(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn multi_letter_shorts_become_long_options() {
        assert_eq!(
            strings(&[
                "mlxcel", "generate", "-sys", "Be brief", "-cnv", "-ngl=99", "-hf", "x"
            ]),
            [
                "mlxcel",
                "generate",
                "--system-prompt",
                "Be brief",
                "--conversation",
                "--gpu-layers=99",
                "--hf-repo",
                "x"
            ]
        );
        assert_eq!(
            strings(&["-no-cnv", "-st"]),
            ["--no-conversation", "--single-turn"]
        );
    }

    /// A prompt after `--` is never taken for an option.
    #[test]
    fn arguments_after_the_separator_pass_through() {
        assert_eq!(strings(&["run", "--", "-sys"]), ["run", "--", "-sys"]);
    }

    /// Every spelling a short option is rewritten to (here or in the server's table) that names
    /// a refused option reaches its refusal, so that no refusal is unreachable.
    #[test]
    fn refusals_name_every_spelling() {
        for refused in REFUSED {
            for name in refused.names {
                let rewritten = strings(&[name]);
                let text = refusal(&rewritten[0]).unwrap_or_else(|| panic!("{name}"));
                assert!(text.contains(name), "{text}");
                assert!(text.contains(refused.instead), "{text}");
            }
        }
        assert_eq!(refusal("--temp"), None);
        assert!(refusal("--hf-repo=user/model").is_some());
    }
}
