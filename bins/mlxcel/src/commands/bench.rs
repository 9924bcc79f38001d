//! `mlxcel bench`: prompt and generation throughput in llama-bench's format.

use std::process::ExitCode;

use anyhow::{Result, bail};
use mlxcel_engine::{
    Activations, BackendBench, BackendKind, EngineOptions, KvType, measure_read_bandwidth,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a checkpoint directory or a .gguf file (default: the default model).
    #[arg(short = 'm', long, env = "MLXCEL_MODEL")]
    model: Option<String>,

    /// Prompt lengths to test, comma-separated (`pp<N>` rows); 0 skips.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,

    /// Generation lengths to test, comma-separated (`tg<N>` rows); 0 skips.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,

    /// Context depths, comma-separated (llama-bench's `-d`): each test runs after this many tokens
    /// are already in the sequence (prefilled untimed); rows at a depth D > 0 are named
    /// `<test> @ d<D>`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,

    /// Concurrent streams for batched decode, comma-separated: each N > 1 adds a `tg<n>@<N>` row
    /// with the aggregate tokens/s of N sequences decoding together.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    streams: Vec<usize>,

    /// Repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,

    /// Prefill chunk: most prompt tokens per forward pass (llama-bench's ubatch).
    #[arg(short = 'u', long = "ubatch-size", default_value_t = 512)]
    ubatch: usize,

    /// Backend to run the model on.
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx")]
    backend: String,

    /// Threads of the CPU kernels (and of the memory-bandwidth probe); defaults to
    /// `MLXCEL_THREADS`, else all cores.
    #[arg(short = 't', long)]
    threads: Option<usize>,

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

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    output: Format,
    #[command(flatten)]
    ignored: super::ignored::Ignored,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Md,
    Json,
}

/// One test's samples.
struct Row {
    test: String,
    n_prompt: usize,
    n_gen: usize,
    /// Sequences decoding together (1 for ordinary rows).
    streams: usize,
    /// Tokens already in each sequence when the test starts.
    depth: usize,
    /// Tokens per second of each repetition (aggregate over the streams).
    samples: Vec<f64>,
}

impl Row {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len() as f64
    }

    fn stddev(&self) -> f64 {
        if self.samples.len() < 2 {
            return 0.0;
        }
        let mean = self.mean();
        let var = self.samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>()
            / (self.samples.len() - 1) as f64;
        var.sqrt()
    }
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    args.ignored.warn();
    let backend: BackendKind = args.backend.parse()?;
    let threads = match args.threads {
        Some(threads) => threads.max(1),
        None => mlxcel_core::Kernels::from_env()?.threads,
    };
    let activations = super::parse_activations(args.activations.as_deref(), backend)?;
    let options = EngineOptions {
        backend,
        threads: Some(threads),
        activations: Some(activations),
        kv_types: args.kv.kv_types(),
        kv_budget_bytes: args.kv.kv_budget_bytes(),
        ..EngineOptions::default()
    };
    // The MLX rows say which activations ran ("mlx int8", "mlx mixed"); f32 is unmarked.
    let label = match (backend, activations) {
        (BackendKind::Mlx, Activations::Int8 | Activations::Mixed) => {
            format!("mlx {}", activations.as_str())
        }
        _ => backend.as_str().to_owned(),
    };
    // …and which KV cache types, when not the default f32.
    let label = match args.kv.kv_types() {
        (KvType::F32, KvType::F32) => label,
        (k, v) => format!("{label} kv {}/{}", k.as_str(), v.as_str()),
    };
    let mut bench = super::session::shown("loading", args.model.as_deref(), || {
        BackendBench::load(args.model.as_deref(), &options)
    })?;
    // A load that maps a kept int8 layout then moves it into memory on a thread of its own
    // (`MLXCEL_LAYOUT_MEMORY`, docs/environment.md): the tests time the memory decode reads
    // once that is done, as a long-running server reads it.
    if !mlxcel_core::wait_for_layout_moves(std::time::Duration::from_secs(300)) {
        eprintln!(
            "mlxcel: the int8 layout is still moving into memory after 300 s; measuring anyway \
             (MLXCEL_LAYOUT_MEMORY=map keeps it mapped)"
        );
    }

    // The read bandwidth the decode rows are set against, probed before and after the tests
    // (best of three rounds each): on a shared machine one probe can fall in a busy spell the
    // tests missed, and a decode then reads "faster than the memory".
    let probe = args.n_gen.iter().any(|&n| n > 0);
    let before = probe.then(|| measure_read_bandwidth(threads, 3));
    let mut rows = Vec::new();
    let ubatch = args.ubatch;
    for &depth in &args.n_depth {
        let at = |test: String| match depth {
            0 => test,
            d => format!("{test} @ d{d}"),
        };
        for &n in args.n_prompt.iter().filter(|&&n| n > 0) {
            let mut run = || bench.prompt(n, ubatch, depth);
            let mut row = measure(at(format!("pp{n}")), n, 0, args.repetitions, &mut run)?;
            row.depth = depth;
            rows.push(row);
        }
        for &n in args.n_gen.iter().filter(|&&n| n > 0) {
            let mut run = || bench.generate(n, ubatch, depth);
            let mut row = measure(at(format!("tg{n}")), 0, n, args.repetitions, &mut run)?;
            row.depth = depth;
            rows.push(row);
        }
        for &streams in args.streams.iter().filter(|&&s| s > 1) {
            for &n in args.n_gen.iter().filter(|&&n| n > 0) {
                let mut run = || bench.generate_streams(streams, n, ubatch, depth);
                let test = at(format!("tg{n}@{streams}"));
                let mut row = measure(test, 0, n, args.repetitions, &mut run)?;
                row.streams = streams;
                row.depth = depth;
                for sample in &mut row.samples {
                    *sample *= streams as f64;
                }
                rows.push(row);
            }
        }
    }
    let info = bench.info();
    // What a decode step reads: the weights as the loaded model holds them, of a mixture of
    // experts only the routed experts a token goes to.
    let weight_bytes = bench.token_read_bytes();
    let bandwidth = before.map(|before| before.max(measure_read_bandwidth(threads, 3)));

    let execution = bench.execution();
    match args.output {
        Format::Md => {
            print_markdown(info, weight_bytes, &label, threads, &rows, bandwidth);
            if !execution.is_empty() {
                println!("\nexecution: {execution}");
            }
        }
        Format::Json => print_json(
            info,
            weight_bytes,
            &label,
            threads,
            args.kv.kv_types(),
            &rows,
            bandwidth,
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(
    test: String,
    n_prompt: usize,
    n_gen: usize,
    repetitions: usize,
    run: &mut dyn FnMut() -> Result<std::time::Duration, mlxcel_engine::EngineError>,
) -> Result<Row> {
    run()?; // warm-up, as llama-bench does
    let tokens = (n_prompt + n_gen) as f64;
    let samples = (0..repetitions)
        .map(|_| Ok(tokens / run()?.as_secs_f64()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Row {
        test,
        n_prompt,
        n_gen,
        streams: 1,
        depth: 0,
        samples,
    })
}

fn size_mib(info: &mlxcel_engine::ModelInfo) -> f64 {
    info.weight_bytes as f64 / (1024.0 * 1024.0)
}

fn print_markdown(
    info: &mlxcel_engine::ModelInfo,
    weight_bytes: u64,
    backend: &str,
    threads: usize,
    rows: &[Row],
    bandwidth: Option<f64>,
) {
    println!(
        "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
        "model", "size", "params", "backend", "threads", "test", "t/s"
    );
    println!(
        "| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->14}: | {:->19}: |",
        "", "", "", "", "", "", ""
    );
    for row in rows {
        println!(
            "| {:<30} | {:>6.2} MiB | {:>8.2} M | {:<10} | {:>7} | {:>15} | {:>20} |",
            truncate(&info.name, 30),
            size_mib(info),
            info.parameters as f64 / 1e6,
            backend,
            threads,
            row.test,
            format!("{:.2} ± {:.2}", row.mean(), row.stddev()),
        );
    }
    println!("\nmodel: {}", info.features);
    if let Some(measured) = bandwidth {
        for row in rows.iter().filter(|r| r.n_gen > 0 && r.streams == 1) {
            let effective = weight_bytes as f64 * row.mean() / 1e9;
            println!(
                "\n{}: {:.1} MB of weights per token × {:.2} tok/s = {:.2} GB/s, {:.0}% of the {:.2} GB/s read bandwidth measured now ({} threads)",
                row.test,
                weight_bytes as f64 / 1e6,
                row.mean(),
                effective,
                100.0 * effective / measured,
                measured,
                threads
            );
        }
    }
}

fn print_json(
    info: &mlxcel_engine::ModelInfo,
    weight_bytes: u64,
    backend: &str,
    threads: usize,
    kv_types: (KvType, KvType),
    rows: &[Row],
    bandwidth: Option<f64>,
) {
    let entries: Vec<String> = rows
        .iter()
        .map(|row| {
            let samples: Vec<String> = row.samples.iter().map(|s| format!("{s:.4}")).collect();
            let decode = match (row.n_gen > 0 && row.streams == 1, bandwidth) {
                (true, Some(measured)) => {
                    let effective = weight_bytes as f64 * row.mean() / 1e9;
                    format!(
                        ", \"weight_read_gbps\": {effective:.4}, \"measured_read_gbps\": {measured:.4}"
                    )
                }
                _ => String::new(),
            };
            format!(
                "  {{\"model\": {:?}, \"model_size\": {}, \"model_n_params\": {}, \"backend\": {:?}, \"n_threads\": {}, \"type_k\": {:?}, \"type_v\": {:?}, \"test\": {:?}, \"n_prompt\": {}, \"n_gen\": {}, \"n_depth\": {}, \"n_streams\": {}, \"avg_ts\": {:.4}, \"stddev_ts\": {:.4}, \"samples_ts\": [{}]{decode}}}",
                info.name,
                info.weight_bytes,
                info.parameters,
                backend,
                threads,
                kv_types.0.as_str(),
                kv_types.1.as_str(),
                row.test,
                row.n_prompt,
                row.n_gen,
                row.depth,
                row.streams,
                row.mean(),
                row.stddev(),
                samples.join(", "),
            )
        })
        .collect();
    println!("[\n{}\n]", entries.join(",\n"));
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(max - 1).collect();
        short.push('…');
        short
    }
}
