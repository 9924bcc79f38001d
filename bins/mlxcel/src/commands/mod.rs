//! One module per subcommand.

pub mod answer;
pub mod bench;
pub mod cache;
pub mod capacity;
pub mod chat;
pub mod conversation;
pub mod convert;
pub mod generate;
pub mod ignored;
pub mod list;
pub mod options;
pub mod perplexity;
pub mod pipeline;
pub mod pull;
pub mod rm;
pub mod run;
pub mod serve;
pub mod session;
pub mod show;
pub mod tokenize;

/// `--activations` (`f32`, `int8` or `mixed`; the error names the flag), else the application default
/// for `backend` ([`mlxcel_engine::EngineOptions::application_activations`]: int8 on the MLX
/// backend with AVX2 or AVX-512 VNNI unless `MLXCEL_ACTIVATIONS` says otherwise).
pub fn parse_activations(
    value: Option<&str>,
    backend: mlxcel_engine::BackendKind,
) -> anyhow::Result<mlxcel_engine::Activations> {
    match value {
        Some(v) => v
            .parse()
            .map_err(|err: String| anyhow::anyhow!("--activations: {err}")),
        None => Ok(mlxcel_engine::EngineOptions::application_activations(
            backend,
        )),
    }
}

/// `--cache-type-k` / `--cache-type-v` (`-ctk` / `-ctv`, as llama.cpp spells them).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct KvTypeArgs {
    /// The KV cache's key type: `f32` (the default), `f16` (half the KV memory and the bytes
    /// attention reads per token; keys rounded to half precision when written) or `q8_0` (34
    /// bytes per 32 values, llama.cpp's block). llama.cpp's other quantized cache types are
    /// refused by name. The MLX backend only (q8_0: where the fused decoder layer runs).
    #[arg(long = "cache-type-k", default_value = "f32", value_parser = parse_kv_type)]
    pub cache_type_k: mlxcel_engine::KvType,

    /// The KV cache's value type, as `--cache-type-k`.
    #[arg(long = "cache-type-v", default_value = "f32", value_parser = parse_kv_type)]
    pub cache_type_v: mlxcel_engine::KvType,

    /// The KV memory running sequences may reserve, in MiB (the MLX backend): a request whose
    /// prompt and budget need more is refused; one without a token limit may generate up to
    /// this memory's positions (an eighth of them where eight run at once).
    #[arg(
        long = "kv-budget",
        env = "MLXCEL_KV_BUDGET",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub kv_budget: u64,
}

impl KvTypeArgs {
    /// The engine option.
    pub fn kv_types(&self) -> (mlxcel_engine::KvType, mlxcel_engine::KvType) {
        (self.cache_type_k, self.cache_type_v)
    }

    /// `--kv-budget` in bytes.
    pub fn kv_budget_bytes(&self) -> usize {
        usize::try_from(self.kv_budget.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

fn parse_kv_type(value: &str) -> Result<mlxcel_engine::KvType, String> {
    value.parse()
}
