//! The spellings of llama-cli, llama-completion, mlx_lm and ollama parse to what mlxcel's own
//! spellings parse to; options mlxcel lacks are refused by name; `--help` keeps them apart.

use std::ffi::OsString;

use clap::{CommandFactory, Parser};

use crate::{Cli, Command, commands, spellings};

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once("mlxcel")
        .chain(args.iter().copied())
        .map(OsString::from);
    Cli::try_parse_from(spellings::normalize(argv))
}

fn generate(args: &[&str]) -> commands::generate::Args {
    let mut full = vec!["generate"];
    full.extend_from_slice(args);
    match parse(&full) {
        Ok(Cli {
            command: Command::Generate(args),
        }) => *args,
        other => panic!("{full:?}: {other:?}"),
    }
}

/// Each group of spellings parses to the same arguments.
#[test]
fn aliases_parse_as_mlxcel_spells_them() {
    let groups: &[&[&[&str]]] = &[
        // llama-cli / llama-completion
        &[
            &["-sys", "Be brief"],
            &["-sys=Be brief"],
            &["--system-prompt", "Be brief"],
            &["--system", "Be brief"],
        ],
        &[&["-sysf", "sys.txt"], &["--system-prompt-file", "sys.txt"]],
        &[&["-f", "p.txt"], &["--file", "p.txt"]],
        &[&["-c", "512"], &["--ctx-size", "512"]],
        &[&["-t", "3"], &["--threads", "3"]],
        &[
            &["-cnv"],
            &["--conversation"],
            &["-i"],
            &["--interactive"],
            &["-if"],
            &["--interactive-first"],
        ],
        &[&["-no-cnv"], &["--no-conversation"]],
        &[&["-st"], &["--single-turn"]],
        &[&["--color"], &["-co"], &["--color", "on"], &["--color=on"]],
        &[
            &["-r", "User:"],
            &["--reverse-prompt", "User:"],
            &["--stop", "User:"],
        ],
        &[&["-e"], &["--escape"]],
        &[
            &["-n", "5"],
            &["--n-predict", "5"],
            &["--predict", "5"],
            &["--max-tokens", "5"],
        ],
        &[&["-s", "7"], &["--seed", "7"]],
        &[&["-p", "hi"], &["--prompt", "hi"]],
        &[
            &["-md", "d.gguf"],
            &["--model-draft", "d.gguf"],
            &["--draft-model", "d.gguf"],
            &["--spec-draft-model", "d.gguf"],
        ],
        &[
            &["--draft-max", "4"],
            &["--draft", "4"],
            &["--num-draft-tokens", "4"],
            &["--spec-draft-n-max", "4"],
        ],
        // mlx_lm.generate / mlx_lm.chat
        &[
            &[
                "--model",
                "m.gguf",
                "--prompt",
                "-",
                "--max-tokens",
                "9",
                "--temp",
                "0.7",
                "--top-p",
                "0.9",
                "--seed",
                "3",
                "--system-prompt",
                "S",
            ],
            &[
                "-m", "m.gguf", "-p", "-", "-n", "9", "--temp", "0.7", "--top-p", "0.9", "-s", "3",
                "--system", "S",
            ],
        ],
        &[&["--ignore-chat-template"], &["--no-chat-template"]],
    ];
    for group in groups {
        let first = generate(group[0]);
        for spelling in &group[1..] {
            assert_eq!(generate(spelling), first, "{spelling:?} vs {:?}", group[0]);
        }
        // Each spelling changes something: none of them is accepted and dropped.
        assert_ne!(first, generate(&[]), "{:?}", group[0]);
    }
}

/// llama-cli's sampling flags reach the sampler, and `-sys` is not read as `-s ys`.
#[test]
fn llama_cli_values_land_where_they_belong() {
    let args = generate(&[
        "-sys",
        "S",
        "-p",
        "x",
        "-n",
        "5",
        "--temp",
        "0.5",
        "-s",
        "7",
        "--top-k",
        "5",
        "--top-p",
        "0.5",
        "--min-p",
        "0.1",
        "--repeat-penalty",
        "1.1",
        "-c",
        "64",
        "-t",
        "2",
    ]);
    let o = &args.options;
    assert_eq!(o.system.as_deref(), Some("S"));
    assert_eq!(args.prompt.as_deref(), Some("x"));
    assert_eq!(
        (
            o.n_predict,
            o.temperature,
            o.seed,
            o.top_k,
            o.top_p,
            o.min_p,
            o.repeat_penalty
        ),
        (5, 0.5, 7, 5, 0.5, 0.1, 1.1)
    );
    assert_eq!((o.ctx_size, o.threads), (64, Some(2)));
    // `-sys` alone leaves the seed at its default.
    assert_eq!(generate(&["-sys", "ys"]).options.seed, -1);
}

/// `run MODEL [PROMPT]` takes every flag of `generate`.
#[test]
fn run_takes_a_model_a_prompt_and_generate_flags() {
    let Ok(Cli {
        command: Command::Run(run),
    }) = parse(&[
        "run",
        "model.gguf",
        "Why?",
        "-sys",
        "S",
        "--max-tokens",
        "3",
    ])
    else {
        panic!("run did not parse");
    };
    assert_eq!(run.model, "model.gguf");
    assert_eq!(run.prompt.as_deref(), Some("Why?"));
    assert_eq!(run.options, generate(&["--system", "S", "-n", "3"]).options);
    assert!(matches!(
        parse(&["run", "default"]),
        Ok(Cli { command: Command::Run(r) }) if r.prompt.is_none()
    ));
}

/// `-t` and `-c` where llama.cpp's tools have them: bench, perplexity, serve.
#[test]
fn threads_and_context_on_every_subcommand_that_runs_a_model() {
    for args in [
        &["bench", "-t", "3"][..],
        &["perplexity", "-f", "x.txt", "-t", "3", "-c", "128"],
        &["serve", "-t", "3", "-c", "128"],
    ] {
        let long: Vec<&str> = args
            .iter()
            .map(|a| match *a {
                "-t" => "--threads",
                "-c" => "--ctx-size",
                a => a,
            })
            .collect();
        let (short, long) = (parse(args), parse(&long));
        assert!(short.is_ok(), "{args:?}: {short:?}");
        assert_eq!(format!("{short:?}"), format!("{long:?}"), "{args:?}");
    }
}

/// `-ngl` and the other placement options are accepted with a warning naming them; a
/// subcommand's own spelling (`perplexity -b`) keeps its meaning.
#[test]
fn options_without_effect_are_accepted_and_named() {
    let args = generate(&["-ngl", "99", "-fa", "--mlock", "-fa", "on"]);
    let warnings = &args.options.ignored.warnings;
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings[0].starts_with("ignoring -ngl/--gpu-layers/--n-gpu-layers 99: no effect here"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("ignoring -fa/--flash-attn on:"),
        "{warnings:?}"
    );
    assert!(warnings[2].starts_with("ignoring --mlock:"), "{warnings:?}");
    assert!(generate(&[]).options.ignored.warnings.is_empty());
    let Ok(cli) = parse(&["perplexity", "-f", "x", "-b", "256", "-ngl", "1"]) else {
        panic!("perplexity did not parse");
    };
    let text = format!("{cli:?}");
    assert!(text.contains("batch_size: 256"), "{text}");
    assert!(text.contains("ignoring -ngl"), "{text}");
    let Ok(cli) = parse(&["bench", "-ngl", "99", "-ub", "256"]) else {
        panic!("bench did not parse");
    };
    let text = format!("{cli:?}");
    assert!(
        text.contains("ubatch: 256") && text.contains("ignoring -ngl"),
        "{text}"
    );
    assert!(!text.contains("ignoring -ub"), "{text}");
}

/// Every spelling of every option without effect parses on `generate` and `run`, and is named in
/// exactly one warning.
#[test]
fn every_spelling_without_effect_is_accepted_with_its_warning() {
    use commands::ignored::{NO_EFFECT, OPTIONAL};
    for option in NO_EFFECT {
        for name in option.names {
            let mut args = vec![*name];
            if option.values != 0 && option.values != OPTIONAL {
                args.push("1");
            }
            let warnings = generate(&args).options.ignored.warnings;
            assert_eq!(warnings.len(), 1, "{name}: {warnings:?}");
            assert!(
                warnings[0].starts_with(&format!("ignoring {}", option.names.join("/"))),
                "{name}: {warnings:?}"
            );
            let mut run = vec!["run", "default"];
            run.extend_from_slice(&args);
            assert!(parse(&run).is_ok(), "run {name}");
        }
    }
}

/// llama.cpp options mlxcel lacks are refused naming the option and what to use instead, on
/// every subcommand (issue #60: `-hf` got clap's generic error).
#[test]
fn missing_llama_options_are_refused_by_name() {
    for args in [
        &["generate", "-hf", "user/model"][..],
        &["bench", "--hf-repo=user/model"],
        &["run", "m", "-hfr", "user/model"],
    ] {
        let err = parse(args).expect_err("refused");
        let text = spellings::explain(&err).unwrap_or_else(|| panic!("{args:?}: {err}"));
        assert!(
            text.starts_with("-hf/-hfr/--hf-repo is not an mlxcel option (in llama.cpp it"),
            "{text}"
        );
        assert!(text.contains("give -m a local .gguf file"), "{text}");
    }
    for (flag, says) in [
        ("-mli", "end a line with \\"),
        ("--chat-template", "--no-chat-template"),
        ("--in-prefix", "--no-chat-template"),
    ] {
        let err = parse(&["generate", flag, "x"]).expect_err(flag);
        let text = spellings::explain(&err).unwrap_or_else(|| panic!("{flag}: {err}"));
        assert!(text.contains(flag) && text.contains(says), "{text}");
    }
    // Every spelling of every refused option, on the two subcommands that take llama-cli's flags.
    for refused in spellings::REFUSED {
        for name in refused.names {
            for args in [&["generate", name, "x"][..], &["run", "default", name, "x"]] {
                let err = parse(args).expect_err(name);
                let text = spellings::explain(&err).unwrap_or_else(|| panic!("{name}: {err}"));
                assert!(text.starts_with(&refused.names.join("/")), "{text}");
            }
        }
    }
    // An option no tool has keeps clap's own message.
    let err = parse(&["generate", "--no-such-flag"]).expect_err("unknown");
    assert_eq!(spellings::explain(&err), None);
}

/// The command lines are well formed (clap's own checks: no two arguments share a spelling).
#[test]
fn command_line_is_consistent() {
    Cli::command().debug_assert();
}

/// Whether `text` names `flag` (not merely a longer flag that starts with it).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        text[at + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c == '-' || c.is_alphanumeric()))
    })
}

/// `--help` lists mlxcel's own flags first; the conversation switches of llama-cli under their
/// heading; the other spellings after the flags, by origin; ollama's verbs after mlxcel's.
#[test]
fn help_groups_the_habits() {
    let mut cli = Cli::command();
    let generate = cli
        .find_subcommand_mut("generate")
        .expect("generate")
        .render_help()
        .to_string();
    let (flags, spellings) = generate
        .split_once("Spellings of other tools")
        .expect("the aliases section");
    let own = flags
        .split_once("llama-cli / llama-completion:")
        .expect("the llama-cli heading")
        .0;
    for flag in [
        "--model",
        "--prompt",
        "--temp",
        "--ctx-size",
        "--threads",
        "--file",
    ] {
        assert!(own.contains(flag), "{flag} among the own flags:\n{own}");
    }
    for alias in [
        "--max-tokens",
        "--system-prompt",
        "--reverse-prompt",
        "--ignore-chat-template",
        "--draft-model",
        "-ngl",
    ] {
        assert!(!mentions(flags, alias), "{alias} in the flags:\n{flags}");
        assert!(
            mentions(spellings, alias),
            "{alias} not listed:\n{spellings}"
        );
    }
    assert!(!mentions(flags, "--gpu-layers"), "{flags}");
    for origin in [
        "llama-cli, llama-completion:",
        "mlx_lm.generate, mlx_lm.chat:",
    ] {
        assert!(spellings.contains(origin), "{spellings}");
    }
    let top = Cli::command().render_help().to_string();
    let (own, verbs) = top.split_once("  run ").expect("the run verb");
    assert!(
        own.contains("generate") && own.contains("tokenize"),
        "{top}"
    );
    for verb in ["list", "rm", "show"] {
        assert!(verbs.contains(&format!("  {verb} ")), "{top}");
    }
    assert!(top.contains("ollama's verbs"), "{top}");
}

/// llama-cli's sampler, bias and constraint flags reach the request's sampling settings and
/// constraint.
#[test]
fn llama_cli_sampler_and_constraint_flags_reach_the_request() {
    use mlxcel_engine::{Constraint, SamplerStage};
    let args = generate(&[
        "--samplers",
        "top_k;dry;xtc;temperature",
        "--top-nsigma",
        "1.5",
        "--xtc-probability",
        "0.5",
        "--xtc-threshold",
        "0.2",
        "--dry-multiplier",
        "0.8",
        "--dry-base",
        "2",
        "--dry-allowed-length",
        "3",
        "--dry-penalty-last-n",
        "-1",
        "--dry-sequence-breaker",
        "none",
        "--dynatemp-range",
        "0.3",
        "--dynatemp-exp",
        "2",
        "--mirostat",
        "2",
        "--mirostat-lr",
        "0.2",
        "--mirostat-ent",
        "4",
        "-l",
        "7+1.5",
        "--logit-bias",
        "9-inf",
        "--ignore-eos",
        "-sp",
        "-j",
        "{\"type\": \"object\"}",
    ]);
    let o = &args.options;
    let s = o.sampling().unwrap();
    assert_eq!(
        s.samplers,
        vec![
            SamplerStage::TopK,
            SamplerStage::Dry,
            SamplerStage::Xtc,
            SamplerStage::Temperature
        ]
    );
    assert_eq!(
        (
            s.top_n_sigma,
            s.xtc_probability,
            s.xtc_threshold,
            s.dry_multiplier,
            s.dry_base
        ),
        (1.5, 0.5, 0.2, 0.8, 2.0)
    );
    assert_eq!(
        (s.dry_allowed_length, s.dry_penalty_last_n),
        (3, usize::MAX)
    );
    assert!(s.dry_sequence_breakers.is_empty());
    assert_eq!(
        (
            s.dynatemp_range,
            s.dynatemp_exponent,
            s.mirostat,
            s.mirostat_eta,
            s.mirostat_tau
        ),
        (0.3, 2.0, 2, 0.2, 4.0)
    );
    assert_eq!(s.logit_bias, vec![(7, 1.5), (9, f32::NEG_INFINITY)]);
    // --ignore-eos bans the model's end tokens; an id outside the vocabulary is refused.
    let s = o.for_model(s, 100, &[2]).unwrap();
    assert!(s.logit_bias.contains(&(2, f32::NEG_INFINITY)));
    assert!(o.for_model(o.sampling().unwrap(), 8, &[2]).is_err());
    assert!(o.engine_options().unwrap().special_tokens);
    assert_eq!(
        o.constraint().unwrap(),
        Some(Constraint::JsonSchema(
            serde_json::json!({"type": "object"})
        ))
    );
    let grammar = generate(&["--grammar", "root ::= \"yes\""]);
    assert!(matches!(
        grammar.options.constraint().unwrap(),
        Some(Constraint::Lark(_))
    ));
    let seq = generate(&["--sampling-seq", "kt"]);
    assert_eq!(
        seq.options.sampling().unwrap().samplers,
        vec![SamplerStage::TopK, SamplerStage::Temperature]
    );
    // Out of range: refused, naming the setting.
    let bad = generate(&["--xtc-probability", "2"]);
    assert!(
        bad.options
            .sampling()
            .unwrap_err()
            .to_string()
            .contains("xtc_probability")
    );
    let bad = generate(&["--samplers", "top_k;bogus"]);
    assert!(
        bad.options
            .sampling()
            .unwrap_err()
            .to_string()
            .contains("bogus")
    );
    let bad = generate(&["--grammar", "root ::= ("]);
    assert!(
        bad.options
            .constraint()
            .unwrap_err()
            .to_string()
            .contains("--grammar")
    );
}
