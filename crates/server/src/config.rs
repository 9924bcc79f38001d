//! The server's settings, independent of how they were given (flags, environment, tests).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use mlxcel_engine::{MaxNewTokens, SamplingOverrides, SamplingParams};

/// Accepted API keys. Never printed: `Debug` shows only how many there are.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(Vec<String>);

impl ApiKeys {
    /// Keys from a list; empty means no authentication.
    pub fn new(keys: Vec<String>) -> Self {
        Self(keys)
    }

    /// Whether requests must authenticate.
    pub fn required(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `offered` is one of the keys, compared without an early exit on the first
    /// differing byte.
    pub fn accepts(&self, offered: &str) -> bool {
        self.0.iter().fold(false, |found, key| {
            found | constant_time_eq(key.as_bytes(), offered.as_bytes())
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} redacted)", self.0.len())
    }
}

/// Everything the HTTP layer needs to know.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Further addresses to listen on (`--host 127.0.0.1,::1`: one listener each, all serving the
    /// same server).
    pub extra_addrs: Vec<SocketAddr>,
    /// The `-m` value as given (accepted as a model name).
    pub model_arg: Option<String>,
    /// The model's names clients see (`--alias`, sorted): the first is the one replies carry and
    /// `/v1/models`' `id`, all are its `aliases`; empty, the checkpoint directory's name.
    pub aliases: Vec<String>,
    /// The model's tags (`--tags`), listed by `/v1/models`.
    pub tags: Vec<String>,
    /// Whether a request naming another model is refused (`--strict-model-names`); by default
    /// the one model serves any name, as llama-server does.
    pub strict_model_names: bool,
    /// Per-request context cap (prompt + budget), further capped by the window.
    pub ctx_size: Option<usize>,
    /// Whether `ctx_size` is divided among the `parallel` slots (an explicit `--parallel`
    /// without `--kv-unified`, as llama-server sizes a slot) rather than each request's own.
    pub ctx_per_slot: bool,
    /// The scheduler's batch (`--parallel`), reported by `/props` and `/slots`.
    pub parallel: usize,
    /// Budget of requests that give none.
    pub default_max_new_tokens: MaxNewTokens,
    /// Temperature of requests that give none.
    pub default_temperature: f32,
    /// Other sampling settings of requests that give none (`--top-k` ...; its temperature and
    /// seed stay `None`: those are the two fields above); `None` keeps the engine's.
    pub sampling_defaults: SamplingOverrides,
    /// The chain, `ignore_eos` and biases of requests that give none (`--samplers`,
    /// `--ignore-eos`, `--logit-bias`).
    pub sampling_chain: crate::sampling_args::SamplingDefaults,
    /// What the output of a request that brings no constraint of its own must match
    /// (`--grammar`, `--grammar-file`, `-j`, `-jf`).
    pub default_constraint: Option<mlxcel_engine::Constraint>,
    /// Whether `/slots` is served (`--no-slots` turns it off).
    pub slots: bool,
    /// Whether `POST /props` is served (`--props`).
    pub props: bool,
    /// Seed of requests that give none; `None` draws one per request.
    pub default_seed: Option<u64>,
    /// `--threads` as given, recorded for `/props`.
    pub threads: Option<usize>,
    /// Keys every route but `/health` requires.
    pub api_keys: ApiKeys,
    /// Whether `/metrics` is served.
    pub metrics: bool,
    /// Largest request body accepted.
    pub body_limit: usize,
    /// How long a client may take to send its headers.
    pub header_timeout: Duration,
    /// How long in-flight requests may run after shutdown begins.
    pub shutdown_timeout: Duration,
    /// How the embedding routes pool per-token states (`--pooling`).
    pub pooling: mlxcel_engine::Pooling,
    /// How they normalize (`--embd-normalize`: -1 none, 0 max-abs, 1 taxicab, 2 euclidean, p).
    pub embd_normalize: i32,
    /// Whether the reranking routes are served (`--reranking`; they need a reranker model).
    pub reranking: bool,
    /// `/infill` puts the suffix before the prefix (`--spm-infill`).
    pub spm_infill: bool,
    /// Whether `GET /` serves the chat page (`--no-webui` turns it off).
    pub webui: bool,
    /// CORS (`--cors-origins`, `--cors-methods`, `--cors-headers`, `--cors-credentials`).
    pub cors: crate::cors::CorsConfig,
    /// Where `POST /slots/{id}?action=save|restore` write and read slot files
    /// (`--slot-save-path`); `None` turns the slot actions off (501).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Reasoning models (`--reasoning-format`, `--chat-template-kwargs`, `--reasoning-budget`,
    /// `--reasoning-effort`): how chat replies split, and the template's extra variables.
    pub reasoning: crate::reasoning::ReasoningDefaults,
    /// Unload the model after this long without a request that needs it
    /// (`--sleep-idle-seconds`; `None`: never).
    pub sleep_idle: Option<Duration>,
    /// When a request takes a slot, the idle slots give up their last request's KV to the prefix
    /// cache (`--cache-idle-slots`, on unless `--no-cache-idle-slots` or `--cache-ram 0`).
    pub cache_idle_slots: bool,
    /// A final assistant message is continued unless the request says otherwise
    /// (`--prefill-assistant`, on; `--no-prefill-assistant`).
    pub prefill_assistant: bool,
    /// SO_REUSEPORT on the listeners (`--reuse-port`): several servers may listen on one port.
    pub reuse_port: bool,
    /// The path prefix every route is served under (`--api-prefix`; `None`: the root).
    pub api_prefix: Option<String>,
    /// The directory whose files are served at the root (`--path`; `None`: none).
    pub static_path: Option<std::path::PathBuf>,
    /// Where each generation's prompt is written (`--log-prompts-dir`; `None`: nowhere).
    pub prompts_log_dir: Option<std::path::PathBuf>,
    /// Seconds a stream may stay silent before it sends an SSE comment
    /// (`--sse-ping-interval`, 30; -1 or 0: never).
    pub sse_ping_interval: i64,
    /// llama-server's `--kv-unified` (on with `--parallel` auto): idle slots cached by
    /// `--cache-idle-slots` are also cleared.
    pub kv_unified: bool,
    /// Google Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`; `None`: off).
    pub gcp: Option<crate::gcp::GcpConfig>,
    /// HTTPS on every listener (`--ssl-cert-file`, `--ssl-key-file`; `None`: plain HTTP).
    pub tls: Option<crate::tls::TlsFiles>,
    /// The agent features (`--tools`, MCP servers, the CORS proxy; all off by default).
    pub agent: crate::agent::AgentConfig,
    /// The LoRA adapters' scales at start, by id (`--lora`, `--lora-scaled`; 0 with
    /// `--lora-init-without-apply`): what requests without `lora` run with until
    /// `POST /lora-adapters` sets others.
    pub lora_scales: Vec<f32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            extra_addrs: Vec::new(),
            lora_scales: Vec::new(),
            model_arg: None,
            aliases: Vec::new(),
            tags: Vec::new(),
            strict_model_names: false,
            ctx_size: None,
            ctx_per_slot: false,
            parallel: 8,
            default_max_new_tokens: MaxNewTokens::Unlimited,
            default_temperature: SamplingParams::default().temperature,
            sampling_defaults: SamplingOverrides::default(),
            sampling_chain: crate::sampling_args::SamplingDefaults::default(),
            default_constraint: None,
            slots: true,
            props: false,
            default_seed: None,
            threads: None,
            api_keys: ApiKeys::default(),
            metrics: false,
            body_limit: 8 << 20,
            header_timeout: Duration::from_secs(600),
            shutdown_timeout: Duration::from_secs(30),
            pooling: mlxcel_engine::Pooling::Mean,
            embd_normalize: 2,
            reranking: false,
            spm_infill: false,
            webui: true,
            cors: crate::cors::CorsConfig::default(),
            slot_save_path: None,
            reasoning: crate::reasoning::ReasoningDefaults::new(),
            sleep_idle: None,
            cache_idle_slots: false,
            prefill_assistant: true,
            reuse_port: false,
            api_prefix: None,
            static_path: None,
            prompts_log_dir: None,
            sse_ping_interval: 30,
            kv_unified: false,
            gcp: None,
            tls: None,
            agent: crate::agent::AgentConfig::default(),
        }
    }
}
