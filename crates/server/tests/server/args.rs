//! llama-server's spellings and environment twins reach the same settings.

use mlxcel_engine::{Activations, KvType, MaxNewTokens};
use mlxcel_server::ServerArgs;

use crate::support::parse_server_args as parse;

#[test]
fn defaults_match_llama_server() {
    let args = parse(&[]).unwrap();
    let config = args.server_config().unwrap();
    assert_eq!(config.addr.to_string(), "127.0.0.1:8080");
    assert_eq!(config.default_max_new_tokens, MaxNewTokens::Unlimited);
    assert_eq!(config.ctx_size, None);
    assert!(!config.api_keys.required());
    assert!(!config.metrics);
    assert!(
        config.webui,
        "the chat page is on by default, as llama-server's web UI"
    );
    assert!(!config.spm_infill);
    assert_eq!(args.backend, "mlx");
}

#[test]
fn llama_server_spellings() {
    let args = parse(&[
        "-m",
        "model.gguf",
        "-c",
        "2048",
        "-np",
        "4",
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
        "-n",
        "128",
        "--api-key",
        "k1,k2",
        "--metrics",
        "--alias",
        "smol",
        "--temp",
        "0",
        "--seed",
        "42",
        "-t",
        "2",
        "--timeout",
        "30",
    ])
    .unwrap();
    let config = args.server_config().unwrap();
    assert_eq!(args.model.as_deref(), Some("model.gguf"));
    assert_eq!(config.ctx_size, Some(2048));
    assert_eq!(config.parallel, 4);
    assert_eq!(args.engine_options().unwrap().scheduler.max_batch, 4);
    assert_eq!(config.addr.to_string(), "0.0.0.0:9000");
    assert_eq!(config.default_max_new_tokens, MaxNewTokens::Limited(128));
    assert!(config.api_keys.accepts("k1") && config.api_keys.accepts("k2"));
    assert!(!config.api_keys.accepts("k3"));
    assert!(config.metrics);
    assert_eq!(config.aliases, ["smol"]);
    assert_eq!(
        (config.default_temperature, config.default_seed),
        (0.0, Some(42))
    );
    assert_eq!(config.threads, Some(2));
    assert_eq!(config.header_timeout.as_secs(), 30);
    assert_eq!(parse(&["-np=3"]).unwrap().parallel, 3);
    assert_eq!(parse(&["--parallel", "5"]).unwrap().parallel, 5);
}

#[test]
fn the_api_key_never_shows_in_debug_output() {
    let args = parse(&["--api-key", "sekrit-value"]).unwrap();
    let config = args.server_config().unwrap();
    assert!(!format!("{config:?}").contains("sekrit-value"));
}

#[test]
fn api_key_file_adds_keys() {
    let dir = std::env::temp_dir().join(format!("mlxcel-server-keys-{}", std::process::id()));
    std::fs::write(&dir, "first\n\n  second  \n").unwrap();
    let config = parse(&["--api-key-file", dir.to_str().unwrap()])
        .unwrap()
        .server_config()
        .unwrap();
    std::fs::remove_file(&dir).unwrap();
    assert!(config.api_keys.accepts("first") && config.api_keys.accepts("second"));
    let missing = parse(&["--api-key-file", "/nonexistent/keys"])
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/keys"),
        "{missing}"
    );
}

#[test]
fn backends_are_named_and_xla_is_accepted() {
    assert!(parse(&["--backend", "xla"]).is_ok());
    let err = parse(&["--backend", "tpu"]).unwrap_err().to_string();
    assert!(err.contains("mlx") && err.contains("xla"), "{err}");
    let xla = parse(&["--backend", "xla"]).unwrap();
    assert_eq!(
        xla.engine_options().unwrap().backend,
        mlxcel_engine::BackendKind::Xla
    );
}

#[test]
fn threads_reach_the_engine() {
    let options = parse(&["-t", "3"]).unwrap().engine_options().unwrap();
    assert_eq!(options.threads, Some(3));
    let default = parse(&[]).unwrap().engine_options().unwrap();
    assert_eq!(default.threads, None);
    // The application default: int8 on the MLX backend where the CPU has AVX2 or AVX-512 VNNI
    // (unless MLXCEL_ACTIVATIONS says otherwise).
    assert_eq!(
        default.activations,
        Some(mlxcel_engine::EngineOptions::application_activations(
            mlxcel_engine::BackendKind::Mlx
        ))
    );
    if std::env::var_os("MLXCEL_ACTIVATIONS").is_none() && cpu_has("avx2") {
        assert_eq!(default.activations, Some(Activations::Int8));
        // ...and a model under 500 M parameters runs `mixed` (the default model's 134.5 M).
        assert_eq!(
            default.exact_below_parameters,
            Some(mlxcel_engine::SMALL_MODEL_PARAMETERS)
        );
        assert_eq!(
            default.activations_for(134_515_008),
            Some(Activations::Mixed)
        );
    }
    // A chosen activation is kept whatever the model's size.
    let chosen = parse(&["--activations", "int8"])
        .unwrap()
        .engine_options()
        .unwrap();
    assert_eq!(chosen.exact_below_parameters, None);
    assert_eq!(chosen.activations_for(1), Some(Activations::Int8));
    let xla = parse(&["--backend", "xla"])
        .unwrap()
        .engine_options()
        .unwrap();
    // On the OpenXLA backend: int8 where its kernels run (AVX-512 with VNNI), else f32.
    assert_eq!(
        xla.activations,
        Some(mlxcel_engine::EngineOptions::application_activations(
            mlxcel_engine::BackendKind::Xla
        ))
    );
    if !cpu_has("avx512_vnni") {
        assert_eq!(xla.activations, Some(Activations::F32));
    }
    let int8 = parse(&["--activations", "int8"]).unwrap().engine_options();
    assert_eq!(int8.unwrap().activations, Some(Activations::Int8));
    let mixed = parse(&["--activations", "mixed"]).unwrap().engine_options();
    let mixed = mixed.unwrap();
    assert_eq!(mixed.activations, Some(Activations::Mixed));
    assert_eq!(mixed.activations_for(1), Some(Activations::Mixed));
    let err = parse(&["--activations", "int4"])
        .unwrap()
        .engine_options()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--activations") && err.contains("int4"),
        "{err}"
    );
}

/// KV cache types: f32 by default, q8_0 as llama.cpp spells it; llama.cpp's other quantized
/// types are refused naming the flag and saying that mlxcel does not store them.
#[test]
fn cache_types_default_to_f32_and_refuse_what_is_not_stored() {
    let default = parse(&[]).unwrap().engine_options().unwrap();
    assert_eq!(default.kv_types, (KvType::F32, KvType::F32));
    let q8 = parse(&["--cache-type-k", "q8_0", "-ctv", "q8_0"]).unwrap();
    assert_eq!(
        q8.engine_options().unwrap().kv_types,
        (KvType::Q8_0, KvType::Q8_0)
    );
    for (flag, value) in [("--cache-type-k", "q4_0"), ("-ctv", "q5_1"), ("-ctk", "f8")] {
        let err = parse(&[flag, value]).unwrap_err().to_string();
        assert!(
            err.contains("--cache-type-") && err.contains(value),
            "{err}"
        );
    }
    let err = parse(&["-ctk", "q4_0"]).unwrap_err().to_string();
    assert!(err.contains("does not store"), "{err}");
}

#[test]
fn nonsense_values_are_refused() {
    assert!(parse(&["-n", "-2"]).unwrap().server_config().is_err());
    assert!(parse(&["-np", "0"]).unwrap().engine_options().is_err());
    assert!(parse(&["--port", "http"]).is_err());
    let err = parse(&["--max-queue-depth", "0"]).unwrap_err().to_string();
    assert!(err.contains("--max-queue-depth"), "{err}");
    let err = parse(&["--kv-budget", "0"]).unwrap_err().to_string();
    assert!(err.contains("--kv-budget"), "{err}");
    // Speculative settings that contradict each other are refused naming the flag.
    for argv in [
        &["--spec-type", "draft-simple"][..],
        &["--spec-type", "ngram-simple", "-md", "/d"],
        &["--spec-type", "ngram-simple", "--spec-draft-n-max", "0"],
        &["-md", "/d", "--spec-draft-p-min", "2"],
    ] {
        let err = parse(argv)
            .unwrap()
            .engine_options()
            .unwrap_err()
            .to_string();
        assert!(err.contains("speculative decoding"), "{argv:?}: {err}");
    }
    // An unknown type in the list is refused when the engine's options are read, naming it.
    let err = parse(&["--spec-type", "ngram-mod,eagle"])
        .unwrap()
        .engine_options()
        .unwrap_err()
        .to_string();
    assert!(err.contains("--spec-type eagle"), "{err}");
}

/// Every supported spelling of the compatibility manifest reaches its setting, alone.
#[test]
fn every_llama_server_spelling_reaches_its_setting() {
    type Check = fn(&ServerArgs) -> bool;
    let table: &[(&[&str], Check)] = &[
        (&["-t", "3"], |a| {
            a.server_config().unwrap().threads == Some(3)
        }),
        (&["--threads", "3"], |a| {
            a.server_config().unwrap().threads == Some(3)
        }),
        (&["-c", "512"], |a| {
            a.server_config().unwrap().ctx_size == Some(512)
        }),
        (&["--ctx-size", "512"], |a| {
            a.server_config().unwrap().ctx_size == Some(512)
        }),
        (&["--pooling", "cls"], |a| {
            a.server_config().unwrap().pooling == mlxcel_engine::Pooling::Cls
        }),
        (&["--embd-normalize", "-1"], |a| {
            a.server_config().unwrap().embd_normalize == -1
        }),
        (&["--embedding"], |a| a.embedding),
        (&["--embeddings"], |a| a.embedding),
        (&["--rerank"], |a| a.server_config().unwrap().reranking),
        (&["--reranking"], |a| a.server_config().unwrap().reranking),
        (&["--max-queue-depth", "5"], |a| {
            a.engine_options().unwrap().scheduler.max_waiting == 5
        }),
        (&["--cache-ram", "64"], |a| {
            a.engine_options().unwrap().prefix_cache_bytes == 64 << 20
        }),
        (&["--kv-budget", "512"], |a| {
            a.engine_options().unwrap().kv_budget_bytes == 512 << 20
        }),
        (&["-cram", "0"], |a| {
            a.engine_options().unwrap().prefix_cache_bytes == 0
        }),
        (&["--cache-type-k", "f16"], |a| {
            a.engine_options().unwrap().kv_types == (KvType::F16, KvType::F32)
        }),
        (&["-ctk", "F16", "-ctv", "f16"], |a| {
            a.engine_options().unwrap().kv_types == (KvType::F16, KvType::F16)
        }),
        (&["--cache-type-v", "f16"], |a| {
            a.engine_options().unwrap().kv_types == (KvType::F32, KvType::F16)
        }),
        (&["-ctv", "f32"], |a| {
            a.engine_options().unwrap().kv_types == (KvType::F32, KvType::F32)
        }),
        (&["--slot-save-path", "/tmp/mlxcel-args-test/slots"], |a| {
            a.server_config().unwrap().slot_save_path == Some("/tmp/mlxcel-args-test/slots".into())
                && std::path::Path::new("/tmp/mlxcel-args-test/slots").is_dir()
        }),
        (&["--slot-save-path", "/proc/version/slots"], |a| {
            a.server_config().is_err_and(|e| {
                e.to_string()
                    .contains("--slot-save-path /proc/version/slots")
            })
        }),
        (&["-n", "7"], |a| a.n_predict == 7),
        (&["--predict", "7"], |a| a.n_predict == 7),
        (&["--n-predict", "7"], |a| a.n_predict == 7),
        (&["-np", "2"], |a| a.server_config().unwrap().parallel == 2),
        (&["--parallel", "2"], |a| {
            a.server_config().unwrap().parallel == 2
        }),
        (&["-s", "9"], |a| {
            a.server_config().unwrap().default_seed == Some(9)
        }),
        (&["--seed", "9"], |a| {
            a.server_config().unwrap().default_seed == Some(9)
        }),
        (&["--temp", "0.5"], |a| a.temperature == 0.5),
        (&["--temperature", "0.5"], |a| a.temperature == 0.5),
        (&["--top-k", "5"], |a| {
            a.server_config().unwrap().sampling_defaults.top_k == Some(5)
        }),
        (&["--top-p", "0.5"], |a| {
            a.server_config().unwrap().sampling_defaults.top_p == Some(0.5)
        }),
        (&["--min-p", "0.2"], |a| {
            a.server_config().unwrap().sampling_defaults.min_p == Some(0.2)
        }),
        (&["--repeat-last-n", "8"], |a| {
            a.server_config().unwrap().sampling_defaults.repeat_last_n == Some(8)
        }),
        (&["--repeat-penalty", "1.1"], |a| {
            a.server_config().unwrap().sampling_defaults.repeat_penalty == Some(1.1)
        }),
        (&["--presence-penalty", "0.5"], |a| {
            a.server_config()
                .unwrap()
                .sampling_defaults
                .presence_penalty
                == Some(0.5)
        }),
        (&["--frequency-penalty", "0.5"], |a| {
            a.server_config()
                .unwrap()
                .sampling_defaults
                .frequency_penalty
                == Some(0.5)
        }),
        (&["-a", "x"], |a| a.alias == ["x"]),
        (&["--alias", "x"], |a| a.alias == ["x"]),
        (&["-m", "m.gguf"], |a| a.model.as_deref() == Some("m.gguf")),
        (&["--model", "m.gguf"], |a| {
            a.model.as_deref() == Some("m.gguf")
        }),
        (&["--host", "localhost"], |a| {
            a.server_config().unwrap().addr.ip().is_loopback()
        }),
        (&["--port", "0"], |a| {
            a.server_config().unwrap().addr.port() == 0
        }),
        (&["-to", "5"], |a| {
            a.server_config().unwrap().header_timeout.as_secs() == 5
        }),
        (&["--timeout", "5"], |a| {
            a.server_config().unwrap().header_timeout.as_secs() == 5
        }),
        (&["--metrics"], |a| a.server_config().unwrap().metrics),
        (&["--props"], |a| a.server_config().unwrap().props),
        (&["--slots"], |a| a.server_config().unwrap().slots),
        (&["--no-slots"], |a| !a.server_config().unwrap().slots),
        (&["--no-slots", "--slots"], |a| {
            a.server_config().unwrap().slots
        }),
        (&["-v"], |a| a.verbose),
        (&["--verbose"], |a| a.verbose),
        (&["--log-verbose"], |a| a.verbose),
        (&["--log-disable"], |a| a.log_disable),
        (&["-np", "-1"], |a| a.server_config().unwrap().parallel == 8),
        (&["--spec-type", "ngram-simple"], |a| {
            a.engine_options().unwrap().speculative.unwrap().proposer
                == mlxcel_engine::Proposer::Ngram
        }),
        (&["-md", "/d"], |a| {
            let o = a.engine_options().unwrap();
            o.draft_model.as_deref() == Some("/d")
                && o.speculative.unwrap().proposer == mlxcel_engine::Proposer::DraftModel
        }),
        (&["--spec-draft-model", "/d"], |a| {
            a.engine_options().unwrap().draft_model.as_deref() == Some("/d")
        }),
        (
            &["--model-draft", "/d", "--spec-type", "draft-simple"],
            |a| a.engine_options().unwrap().draft_model.as_deref() == Some("/d"),
        ),
        (
            &["--spec-type", "ngram-simple", "--spec-draft-n-max", "5"],
            |a| a.engine_options().unwrap().speculative.unwrap().draft_max == 5,
        ),
        (
            &["--spec-type", "ngram-simple", "--spec-draft-n-min", "2"],
            |a| a.engine_options().unwrap().speculative.unwrap().draft_min == 2,
        ),
        (&["-md", "/d", "--spec-draft-p-min", "0.5"], |a| {
            a.engine_options().unwrap().speculative.unwrap().p_min == 0.5
        }),
        (&["-md", "/d", "--draft-p-min", "0.5"], |a| {
            a.engine_options().unwrap().speculative.unwrap().p_min == 0.5
        }),
        (&["--webui"], |a| a.server_config().unwrap().webui),
        (&["--ui"], |a| a.server_config().unwrap().webui),
        (&["--no-webui"], |a| !a.server_config().unwrap().webui),
        (&["--no-ui"], |a| !a.server_config().unwrap().webui),
        (&["--no-webui", "--webui"], |a| {
            a.server_config().unwrap().webui
        }),
        (&["--spm-infill"], |a| a.server_config().unwrap().spm_infill),
    ];
    for (argv, check) in table {
        let args = parse(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert!(check(&args), "{argv:?} did not reach its setting");
    }
}

/// clap read `-ngl 99` as `-n gl` and `-hf` as `-h`; each multi-letter short is its long form.
#[test]
fn multi_letter_short_options_are_not_letter_clusters() {
    let args = parse(&["-ngl", "99", "-fa", "on", "-ctk", "f16", "-kvu", "-cb"]).unwrap();
    assert_eq!(args.n_predict, -1);
    assert_eq!(args.cache_type_k, KvType::F16);
    // `-kvu` now keeps llama-server's slot sizing (it was ignored with a warning before).
    assert!(args.kv_unified);
    assert_eq!(
        args.ignored.warnings.len(),
        3,
        "{:?}",
        args.ignored.warnings
    );
    assert!(
        args.ignored
            .warnings
            .iter()
            .any(|w| w.contains("-ngl") && w.contains("99")),
        "{:?}",
        args.ignored.warnings
    );
    // `-hf` is `--hf-repo`, not `-h` with `f`.
    let args = parse(&["-hf", "user/model", "-hfd", "user/draft"]).unwrap();
    assert_eq!(args.download.hf_repo.as_deref(), Some("user/model"));
    assert_eq!(args.download.spec_draft_hf.as_deref(), Some("user/draft"));
    assert_eq!(
        parse(&["--usage"]).unwrap_err().kind(),
        clap::error::ErrorKind::DisplayHelp
    );
    for refused in [&["-np", "0"][..], &["-np", "-2"][..]] {
        let err = parse(refused).unwrap().server_config().unwrap_err();
        assert!(err.to_string().contains("--parallel"), "{err}");
    }
}

/// Whether /proc/cpuinfo lists `flag` (false where it cannot be read).
fn cpu_has(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| info.split_whitespace().any(|word| word == flag))
        .unwrap_or(false)
}

#[test]
fn a_host_list_aliases_and_tags() {
    // llama-server's `--host a,b` listens on each; `--alias` and `--tags` are sets: sorted,
    // trimmed, without repeats, the first alias the model's name.
    let args = parse(&[
        "--host",
        "127.0.0.1, ::1,[::1]",
        "--port",
        "9000",
        "--alias",
        "tinyllama-2,fim, code,fim",
        "--tags",
        "chat,fim,small",
    ])
    .unwrap();
    let config = args.server_config().unwrap();
    assert_eq!(config.addr.to_string(), "127.0.0.1:9000");
    let extra: Vec<String> = config.extra_addrs.iter().map(|a| a.to_string()).collect();
    assert_eq!(extra, ["[::1]:9000"]);
    assert_eq!(config.aliases, ["code", "fim", "tinyllama-2"]);
    assert_eq!(config.tags, ["chat", "fim", "small"]);
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_TAGS"));
    let empty = parse(&["--host", "127.0.0.1,"]).unwrap();
    let error = empty.server_config().unwrap_err().to_string();
    assert!(error.contains("--host"), "{error}");
}

#[test]
fn an_explicit_parallel_divides_the_context_unless_unified() {
    // llama-server: `-c 512 -np 2` gives each slot 256 positions; `-kvu` (and `-np` auto) each
    // slot all 512.
    let per_slot = |argv: &[&str]| parse(argv).unwrap().server_config().unwrap().ctx_per_slot;
    assert!(per_slot(&["-c", "512", "-np", "2"]));
    assert!(per_slot(&["-c", "512", "--parallel", "2", "-no-kvu"]));
    assert!(!per_slot(&["-c", "512", "-np", "2", "-kvu"]));
    assert!(!per_slot(&["-c", "512", "-np", "2", "--kv-unified"]));
    assert!(!per_slot(&["-c", "512"]));
    assert!(!per_slot(&["-c", "512", "-np", "-1"]));
    assert!(per_slot(&[
        "-c",
        "512",
        "-np",
        "2",
        "-kvu",
        "--no-kv-unified"
    ]));
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_KV_UNIFIED"));
}

#[test]
fn idle_flags_parse_as_llama_server_spells_them() {
    let config = |argv: &[&str]| parse(argv).unwrap().server_config().unwrap();
    // --sleep-idle-seconds: -1 (the default) never, N seconds, 0 and below -1 refused.
    assert_eq!(config(&[]).sleep_idle, None);
    assert_eq!(
        config(&["--sleep-idle-seconds", "5"]).sleep_idle,
        Some(std::time::Duration::from_secs(5))
    );
    assert_eq!(config(&["--sleep-idle-seconds", "-1"]).sleep_idle, None);
    for bad in ["0", "-2"] {
        let err = parse(&["--sleep-idle-seconds", bad])
            .unwrap()
            .server_config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sleep-idle-seconds"), "{err}");
    }
    // --cache-idle-slots: on by default, off with --no-cache-idle-slots or --cache-ram 0; the
    // slots are also cleared with --kv-unified (or --parallel auto).
    let idle = |argv: &[&str]| {
        let c = config(argv);
        (c.cache_idle_slots, c.kv_unified)
    };
    assert_eq!(idle(&[]), (true, true));
    assert_eq!(idle(&["-np", "2"]), (true, false));
    assert_eq!(
        idle(&["-np", "2", "-kvu", "--cache-idle-slots"]),
        (true, true)
    );
    assert_eq!(idle(&["--no-cache-idle-slots"]), (false, true));
    assert_eq!(idle(&["--cache-ram", "0"]), (false, true));
    assert_eq!(
        idle(&["--no-cache-idle-slots", "--cache-idle-slots"]),
        (true, true)
    );
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_CACHE_IDLE_SLOTS"));
}

#[test]
fn ngram_simple_sizes_set_the_prompt_lookup_proposer() {
    let options = parse(&[
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "3",
        "--spec-ngram-simple-size-m",
        "8",
    ])
    .unwrap()
    .engine_options()
    .unwrap();
    let config = options.speculative.unwrap();
    assert_eq!((config.ngram_min, config.ngram_max), (3, 3));
    assert_eq!((config.draft_min, config.draft_max), (1, 8));
    // Without the prompt-lookup proposer, or out of llama.cpp's range, they are refused by name.
    for bad in [
        &["--spec-ngram-simple-size-n", "3"][..],
        &[
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-m",
            "0",
        ],
        &[
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "2000",
        ],
    ] {
        let err = parse(bad).unwrap().engine_options().unwrap_err();
        assert!(
            err.to_string().contains("--spec-ngram-simple-size"),
            "{err}"
        );
    }
    // The draft model's placement options are accepted (it runs beside the model), and the
    // options llama.cpp itself removed are refused.
    assert!(parse(&["-td", "4", "--spec-draft-ngl", "99", "-ctkd", "f16"]).is_ok());
    for removed in ["--draft", "--draft-min", "--spec-ngram-size-n"] {
        assert!(parse(&[removed, "4"]).is_err(), "{removed}");
    }
}

#[test]
fn log_file_receives_the_log_lines_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server.log");
    let args = parse(&["--log-file", path.to_str().unwrap()]).unwrap();
    args.server_config().unwrap();
    assert!(path.is_file(), "the file is created at start");
    let file = mlxcel_server::open_log_file(args.log_file.as_deref().unwrap()).unwrap();
    let subscriber = mlxcel_server::log_subscriber(
        "info",
        mlxcel_server::LogFormat::Text,
        true,
        mlxcel_server::tee_writer(file),
    );
    tracing::subscriber::with_default(subscriber, || tracing::info!("a line for the file"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("a line for the file"), "{text}");
    let err = parse(&["--log-file", "/no/such/dir/server.log"])
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(err.to_string().contains("--log-file"), "{err}");
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_LOG_FILE"));
}

/// The hashed types' size flags set their proposer; without their type, or out of llama.cpp's
/// range, they are refused by name; `--spec-default` is ngram-mod at llama.cpp's sizes, which
/// explicit flags still change.
#[test]
fn hashed_spec_flags_set_their_proposers() {
    let config = |flags: &[&str]| {
        parse(flags)
            .unwrap()
            .engine_options()
            .unwrap()
            .speculative
            .unwrap()
    };
    let c = config(&[
        "--spec-type",
        "ngram-map-k,ngram-map-k4v",
        "--spec-ngram-map-k-size-n",
        "3",
        "--spec-ngram-map-k4v-size-m",
        "7",
        "--spec-ngram-map-k4v-min-hits",
        "2",
    ]);
    let (k, k4v) = (c.ngram_map_k.unwrap(), c.ngram_map_k4v.unwrap());
    assert_eq!((k.size_n, k.size_m, k.min_hits), (3, 48, 1));
    assert_eq!((k4v.size_n, k4v.size_m, k4v.min_hits), (12, 7, 2));
    assert!(c.ngram_mod.is_none());
    let m = config(&["--spec-default", "--spec-ngram-mod-n-max", "32"])
        .ngram_mod
        .unwrap();
    assert_eq!((m.n_match, m.n_min, m.n_max), (24, 48, 32));
    for (bad, named) in [
        (
            &["--spec-ngram-mod-n-min", "3"][..],
            "--spec-ngram-mod-n-match/-n-min/-n-max",
        ),
        (
            &["--spec-type", "ngram-mod", "--spec-ngram-map-k-size-n", "3"],
            "--spec-ngram-map-k-size-n",
        ),
        (
            &[
                "--spec-type",
                "ngram-map-k",
                "--spec-ngram-map-k4v-min-hits",
                "3",
            ],
            "--spec-ngram-map-k4v-size-n",
        ),
        (
            &["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "0"],
            "--spec-ngram-mod-n-match 0",
        ),
        (
            &["--spec-default", "--spec-ngram-mod-n-max", "2000"],
            "--spec-ngram-mod-n-max 2000",
        ),
        (
            &[
                "--spec-type",
                "ngram-map-k",
                "--spec-ngram-map-k-min-hits",
                "0",
            ],
            "--spec-ngram-map-k-min-hits 0",
        ),
        (&["--spec-type", "ngram-cache"], "ngram-cache"),
        (
            &["--spec-type", "ngram-mod", "-md", "/d"],
            "--spec-draft-model",
        ),
    ] {
        let err = parse(bad).unwrap().engine_options().unwrap_err();
        assert!(err.to_string().contains(named), "{bad:?}: {err}");
    }
}
