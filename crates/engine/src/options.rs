//! How to load and run a model: the options an embedder sets, shared by the engine and the
//! backends (which import them from here, never from the engine).

pub use mlxcel_model::{Activations, KvType};

use crate::error::EngineError;
use crate::scheduler::SchedulerConfig;

/// Which backend runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// MLX: dynamic shapes, eager graphs.
    #[default]
    Mlx,
    /// OpenXLA through IREE: static shapes, one compiled module per context capacity.
    Xla,
}

impl BackendKind {
    /// Every backend name `from_str` accepts.
    pub const NAMES: &'static [&'static str] = &["mlx", "xla"];

    /// The backend's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mlx => "mlx",
            Self::Xla => "xla",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = EngineError;

    fn from_str(name: &str) -> Result<Self, EngineError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "mlx" => Ok(Self::Mlx),
            "xla" => Ok(Self::Xla),
            _ => Err(EngineError::UnknownBackend {
                name: name.to_owned(),
                choices: Self::NAMES.join(", "),
            }),
        }
    }
}

/// How to load and run a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The backend.
    pub backend: BackendKind,
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
    /// Most bytes of KV memory live sequences may reserve, each at its worst case (MLX backend;
    /// `--kv-budget`). A request without a token limit is planned to generate at most the
    /// positions of a `scheduler.max_batch`-th of it, in whole blocks of 256 (and no further
    /// than the window).
    pub kv_budget_bytes: usize,
    /// Threads of the MLX backend's CPU kernels; `None` takes `MLXCEL_THREADS`, else every core.
    pub threads: Option<usize>,
    /// What the quantized matmuls multiply the weights with (on the OpenXLA backend: its
    /// kernels, unless `MLXCEL_XLA_WEIGHTS` names a weight format); `None` takes
    /// `MLXCEL_ACTIVATIONS`, else f32.
    pub activations: Option<Activations>,
    /// With int8 `activations`, a model with fewer parameters than this runs the small-model
    /// activations instead ([`EngineOptions::activations_for`]: `mixed` on the MLX backend, f32
    /// on OpenXLA): what the applications' default sets
    /// ([`EngineOptions::use_application_activations`], [`SMALL_MODEL_PARAMETERS`]) so that a
    /// small model, which int8 rounding costs answers, answers as the exact path does. `None`:
    /// `activations` as given.
    pub exact_below_parameters: Option<u64>,
    /// How a static-shape backend picks its shapes.
    pub shapes: ShapeMode,
    /// Prompt-lookup speculative decoding for every request that does not choose for itself;
    /// `None`: off. Needs a backend that scores every position (the MLX backend); elsewhere
    /// requests decode one token a pass.
    pub speculative: Option<crate::SpeculativeConfig>,
    /// A draft model for speculative decoding ([`crate::Proposer::DraftModel`]): a checkpoint
    /// directory or `.gguf` file (as `Engine::load` takes) whose tokenizer is the model's, run on
    /// the same backend with the same options. Requests use it when their (or the engine's)
    /// speculative settings choose it; `None`: no draft model.
    pub draft_model: Option<String>,
    /// The prefix cache's KV memory (bytes; llama-server's `--cache-ram` in MiB): finished
    /// requests' caches are kept, least recently used out first, and a request whose prompt
    /// starts with tokens a kept or running sequence computed copies their keys and values
    /// instead of recomputing them. 0 turns it off; backends that cannot copy a prefix between
    /// slots have none (both of mlxcel's can; on OpenXLA a kept cache is a row of its capacity's
    /// static buffers). Kept caches give way to new requests when KV memory or rows run short.
    /// Off by default for embedders (with f32 activations a reused prefix's logits match a
    /// recomputed one's to rounding, not bit for bit).
    pub prefix_cache_bytes: usize,
    /// The element types of the KV cache's keys and values (llama.cpp's `--cache-type-k` and
    /// `--cache-type-v`): f32 (the default) or f16, which halves KV memory and the bytes
    /// attention reads per token, at the cost of rounding each key and value to half precision.
    /// The MLX backend only: the OpenXLA backend refuses anything but f32 at load.
    pub kv_types: (KvType, KvType),
    /// Whether generated text shows special tokens (`<|im_end|>` ...) as their text, as
    /// llama.cpp's `-sp/--special`; by default they are left out of the text.
    pub special_tokens: bool,
    /// Pipeline-parallel running over MLX's ring backend (docs/distributed.md): this process is
    /// one rank of a pipeline whose ranks each hold a contiguous range of the decoder layers.
    /// `None`: the whole model in this process. The MLX backend only.
    pub pipeline: Option<PipelineOptions>,
    /// A chat template (Jinja source) that replaces the checkpoint's, as llama-server's
    /// `--chat-template`; it sees the checkpoint template's `bos_token`/`eos_token` texts (empty
    /// where the checkpoint has none). `None`: the checkpoint's.
    pub chat_template: Option<String>,
    /// LoRA adapters to load beside the model (llama-server's `--lora`), GGUF or PEFT
    /// safetensors ([`mlxcel_model::LoraAdapter`]); an adapter's id is its place here. Requests
    /// choose their scales ([`crate::GenerationRequest::lora`]). The MLX backend only.
    pub lora_adapters: Vec<std::path::PathBuf>,
    /// llama.cpp's RoPE overrides (`--rope-scaling`, `--rope-freq-base`, `--yarn-*` ...),
    /// applied to the model's config before a backend builds its rotary tables (both backends
    /// read the same periods). Default: none.
    pub rope: mlxcel_model::RopeOverrides,
    /// llama.cpp's `--override-kv`: typed replacements of a GGUF model's metadata, applied by
    /// the importer before the config and tokenizer are derived (`mlxcel_model::KvOverride`); a
    /// checkpoint directory refuses them. Default: none.
    pub kv_overrides: Vec<mlxcel_model::KvOverride>,
    /// llama.cpp's control vectors (`--control-vector`, `--control-vector-scaled`,
    /// `--control-vector-layer-range`): directions added to the model's decoder layers'
    /// outputs for every request (`mlxcel_model::ControlVector`). The target model only, never
    /// the draft model, as llama.cpp. The MLX backend only. Default: none.
    pub control_vector: mlxcel_model::ControlVectorSpec,
}

/// One rank of a pipeline of processes, each holding a contiguous range of the model's decoder
/// layers (docs/distributed.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineOptions {
    /// MLX's ring hostfile: a JSON list with one entry per rank, each a list of `"ip:port"`.
    pub hostfile: std::path::PathBuf,
    /// This process's rank in it; rank 0 runs the engine, the others a stage worker.
    pub rank: usize,
    /// Decoder layers per rank, in rank order (rank 0's first); `None` splits them so that the
    /// ranks hold about as many bytes of weights each. Read on rank 0, which tells the others.
    pub layers: Option<Vec<usize>>,
    /// How long joining the ring waits for every rank to connect.
    pub connect_timeout: std::time::Duration,
    /// Micro-batches a step of several sequences is split into, so that every rank works on
    /// one while the others work on theirs (`None`: one per rank; 1: the whole step at once).
    /// Read on rank 0.
    pub micro_batches: Option<usize>,
    /// How long a ring connection may stay unanswered (unacknowledged bytes, or keepalive
    /// probes of an idle link) before TCP drops it and the pipeline goes down: what detects a
    /// silent partition. Set on every rank.
    pub link_timeout: std::time::Duration,
    /// What rank 0's server does once the pipeline is down: exit with status 1 (`true`, for a
    /// supervisor that restarts every rank), or keep answering 503 (`false`). A lost rank cannot
    /// rejoin either way (docs/distributed.md).
    pub exit_on_failure: bool,
}

/// How a static-shape backend (OpenXLA) sizes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShapeMode {
    /// Each request gets the smallest ladder rung that holds it (the command line's resolver);
    /// a rung's executable compiles the first time a request needs it.
    #[default]
    PerRequest,
    /// A server's fixed bucket set (`[256, min(4096, window)]`, the pin, or
    /// `MLXCEL_XLA_CONTEXT_BUCKETS`), compiled at load so that nothing compiles while serving;
    /// each request routes to the smallest bucket that holds its prompt and whole budget.
    ServerBuckets,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            backend: BackendKind::default(),
            scheduler: SchedulerConfig::default(),
            kv_budget_bytes: 4 << 30,
            threads: None,
            activations: None,
            exact_below_parameters: None,
            shapes: ShapeMode::default(),
            speculative: None,
            draft_model: None,
            prefix_cache_bytes: 0,
            kv_types: (KvType::F32, KvType::F32),
            special_tokens: false,
            pipeline: None,
            chat_template: None,
            lora_adapters: Vec::new(),
            rope: mlxcel_model::RopeOverrides::default(),
            kv_overrides: Vec::new(),
            control_vector: mlxcel_model::ControlVectorSpec::default(),
        }
    }
}

/// Below this many parameters the applications' default activations are `mixed` (int8 for the
/// MLPs' gate and up projections and the output head, f32 for the rest:
/// `mlxcel_core::Matrix::MIXED_INT8`) on the MLX backend, not int8: on the default model
/// (SmolLM2-135M, Q4_1) int8 activations answer 38 of the 62 questions of
/// scripts/questions/factual.tsv, f32 ones 41 and `mixed` 45, and `mixed` decodes faster than
/// f32 (docs/benchmarks.md has the speeds against llama.cpp's). At the Llama-3.2-1B shape
/// int8 answers as f32 does and prefills 2x faster, so int8 stays from 0.5 B on
/// (docs/benchmarks.md, "A right first answer").
pub const SMALL_MODEL_PARAMETERS: u64 = 500_000_000;

impl EngineOptions {
    /// The applications' default when neither `--activations` nor `MLXCEL_ACTIVATIONS` chooses:
    /// [`EngineOptions::application_activations`], and the small-model activations for a model
    /// under [`SMALL_MODEL_PARAMETERS`] ([`EngineOptions::activations_for`], decided at load,
    /// when the model's size is known). With the variable set, it alone decides.
    pub fn use_application_activations(&mut self) {
        self.activations = Some(Self::application_activations(self.backend));
        self.exact_below_parameters = std::env::var_os("MLXCEL_ACTIVATIONS")
            .is_none()
            .then_some(SMALL_MODEL_PARAMETERS);
    }

    /// The activations a model of `parameters` weights runs under these options: for a model
    /// under `exact_below_parameters` whose default was int8, `mixed` on the MLX backend (int8
    /// where it costs no answers) and f32 on OpenXLA (whose program multiplies every matrix
    /// alike).
    pub fn activations_for(&self, parameters: u64) -> Option<Activations> {
        match (self.activations, self.exact_below_parameters) {
            (Some(Activations::Int8), Some(limit)) if parameters < limit => {
                Some(match self.backend {
                    BackendKind::Mlx => Activations::Mixed,
                    BackendKind::Xla => Activations::F32,
                })
            }
            (activations, _) => activations,
        }
    }

    /// The activations an application (the `mlxcel` CLI, `mlxcel-server`) runs when neither
    /// its `--activations` flag nor `MLXCEL_ACTIVATIONS` chooses: int8 on the MLX backend where
    /// mlxcel's kernels have a fast int8 path (AVX2, or AVX-512 with VNNI), as llama.cpp
    /// quantizes the activations of its quantized matmuls there, and on the OpenXLA backend
    /// where its kernels run (AVX-512 with VNNI: `mlxcel_xla::kernels::supported`); f32
    /// otherwise (`MLXCEL_KERNELS=mlx`, `MLXCEL_KERNEL_ISA=scalar`, a CPU without them). An
    /// embedder's default (`activations: None`) stays `MLXCEL_ACTIVATIONS`, else f32. A malformed
    /// variable is left for the backend's load to refuse by name.
    pub fn application_activations(backend: BackendKind) -> Activations {
        if backend == BackendKind::Xla {
            #[cfg(feature = "xla")]
            {
                if let Ok(value) = std::env::var("MLXCEL_ACTIVATIONS") {
                    return value.parse().unwrap_or(Activations::F32);
                }
                if mlxcel_xla::kernels::supported() {
                    return Activations::Int8;
                }
            }
            return Activations::F32;
        }
        #[cfg(feature = "mlx")]
        {
            use mlxcel_core::{Isa, KernelBackend, Kernels};
            let Ok(kernels) = Kernels::from_env() else {
                return Activations::F32;
            };
            if std::env::var_os("MLXCEL_ACTIVATIONS").is_some() {
                return kernels.activations;
            }
            if kernels.backend == KernelBackend::Native && kernels.isa >= Isa::Avx2 {
                return Activations::Int8;
            }
        }
        Activations::F32
    }
}

impl EngineOptions {
    /// The options the draft model's backend loads with: these without the control vector,
    /// which llama.cpp applies to the target model only.
    pub(crate) fn for_draft(&self) -> EngineOptions {
        EngineOptions {
            control_vector: mlxcel_model::ControlVectorSpec::default(),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_draft_model_loads_without_the_control_vector() {
        let options = EngineOptions {
            control_vector: mlxcel_model::ControlVectorSpec {
                files: vec![("steer.gguf".into(), 0.5)],
                layer_range: Some((2, 4)),
            },
            lora_adapters: vec!["a.gguf".into()],
            ..EngineOptions::default()
        };
        let draft = options.for_draft();
        assert!(draft.control_vector.is_empty());
        assert_eq!(draft.lora_adapters, options.lora_adapters);
    }

    #[test]
    fn small_models_run_mixed_activations_only_under_the_application_default() {
        let mut options = EngineOptions {
            activations: Some(Activations::Int8),
            exact_below_parameters: Some(SMALL_MODEL_PARAMETERS),
            ..EngineOptions::default()
        };
        assert_eq!(
            options.activations_for(134_515_008),
            Some(Activations::Mixed)
        );
        assert_eq!(
            options.activations_for(SMALL_MODEL_PARAMETERS),
            Some(Activations::Int8)
        );
        // The OpenXLA program has no per-matrix choice: a small model runs f32 there.
        options.backend = BackendKind::Xla;
        assert_eq!(options.activations_for(134_515_008), Some(Activations::F32));
        assert_eq!(
            options.activations_for(SMALL_MODEL_PARAMETERS),
            Some(Activations::Int8)
        );
        options.backend = BackendKind::Mlx;
        // A choice made by flag (no limit set) is kept whatever the size.
        options.exact_below_parameters = None;
        assert_eq!(
            options.activations_for(134_515_008),
            Some(Activations::Int8)
        );
        // f32 stays f32 and mixed stays mixed, whatever the size.
        options.exact_below_parameters = Some(SMALL_MODEL_PARAMETERS);
        for kept in [Activations::F32, Activations::Mixed] {
            options.activations = Some(kept);
            assert_eq!(options.activations_for(1), Some(kept));
            assert_eq!(options.activations_for(u64::MAX), Some(kept));
        }
    }

    #[test]
    fn mixed_parses_by_name_and_reads_back() {
        for name in Activations::NAMES {
            let parsed: Activations = name.parse().unwrap();
            assert_eq!(parsed.as_str(), name);
        }
        assert_eq!(" Mixed ".parse::<Activations>(), Ok(Activations::Mixed));
        let err = "half".parse::<Activations>().unwrap_err();
        assert!(err.contains("f32, int8, mixed"), "{err}");
    }
}
