//! The embedding API: a loaded model, a scheduler on its own thread, and streams of events.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlxcel_model::{
    ChatMessage, ChatTemplate, FimTokens, LoadedModel, Tokenizer, resolve_model_with,
};
use tokio::sync::mpsc as events;
use tokio::sync::oneshot;

use crate::backends;
use crate::error::EngineError;
use crate::lora::LoraInfo;
use crate::metrics::EngineMetrics;
use crate::options::{BackendKind, EngineOptions};
use crate::reasoning_budget::ReasoningEnd;
use crate::request::{Event, FinishReason, GenerationRequest, RequestId, Usage};
use crate::resident::{Loaded, Loader, Resident, open_draft};
use crate::sampling::BreakerVocabulary;
use crate::scheduler::{CachedPrefix, ConstraintSource, SchedulerConfig, SchedulerStats};
use crate::text::TokenizerDecoder;

/// What the engine knows about its model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// A short name: the directory's name.
    pub name: String,
    /// The backend running it.
    pub backend: BackendKind,
    /// The checkpoint's window (`max_position_embeddings`).
    pub window: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The vocabulary's fill-in-the-middle tokens (llama-server's `/infill` needs prefix,
    /// suffix and middle).
    pub fim_tokens: FimTokens,
    /// Bytes of weights as stored in the checkpoint.
    pub weight_bytes: u64,
    /// Parameter count (quantized weights counted unpacked).
    pub parameters: u64,
    /// Width of the hidden states (and of the embeddings [`Engine::embed`] returns).
    pub hidden_size: usize,
    /// The family and the features detected in its config, e.g.
    /// `qwen3: 28 layers, q/k norm, tied embeddings` ([`mlxcel_model::ModelConfig::describe`]).
    pub features: String,
    /// The weight format as llama-server's `/props` `model_ftype` names it: a GGUF's file type
    /// in llama.cpp's words (`Q4_1`), an MLX checkpoint's bits and group size, a dense one's
    /// dtype (`mlxcel_model::Checkpoint::ftype_name`).
    pub model_ftype: String,
}

impl ModelInfo {
    /// Describes an opened checkpoint.
    pub fn from_loaded(loaded: &LoadedModel, backend: BackendKind) -> Self {
        let config = loaded.config();
        let (weight_bytes, parameters) = weight_totals(loaded);
        Self {
            name: config.name.clone().unwrap_or_else(|| {
                loaded.dir().file_name().map_or_else(
                    || loaded.dir().display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                )
            }),
            dir: loaded.dir().to_owned(),
            features: config.describe(),
            hidden_size: config.hidden_size,
            backend,
            window: config.window(),
            vocab_size: config.vocab_size,
            eos_token_ids: loaded.eos_token_ids.clone(),
            fim_tokens: loaded.fim_tokens,
            weight_bytes,
            parameters,
            model_ftype: loaded
                .checkpoint
                .ftype_name()
                .unwrap_or_else(|err| format!("unknown ({err})")),
        }
    }
}

enum Command {
    Submit {
        request: Box<GenerationRequest>,
        events: events::UnboundedSender<Event>,
        reply: Reply,
    },
    Cancel(RequestId),
    /// Ends a running request's reasoning block now ([`Engine::end_reasoning`]).
    EndReasoning {
        id: RequestId,
        reply: mpsc::Sender<ReasoningEnd>,
    },
    /// Embeddings: the hidden states of `tokens`, computed between steps.
    Hidden {
        tokens: Vec<u32>,
        reply: mpsc::Sender<Result<Vec<Vec<f32>>, EngineError>>,
    },
    /// The prefix cache's entry for a request ([`Engine::cached_prefix`]).
    ExportCached {
        id: RequestId,
        reply: mpsc::Sender<Result<Option<CachedPrefix>, EngineError>>,
    },
    /// A saved entry put back into the prefix cache ([`Engine::restore_prefix`]).
    RestoreCached {
        prefix: CachedPrefix,
        reply: mpsc::Sender<Result<RequestId, EngineError>>,
    },
    /// An entry dropped from the prefix cache ([`Engine::erase_prefix`]).
    EraseCached {
        id: RequestId,
        reply: mpsc::Sender<usize>,
    },
    /// The plan of a queued or running request ([`Engine::plan`]).
    Plan {
        id: RequestId,
        reply: mpsc::Sender<Option<crate::SessionPlan>>,
    },
    /// Load the model again if it sleeps, and start its idle time again ([`Engine::wake`]).
    Wake {
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Unload the model now ([`Engine::sleep`]), or once idle for a while
    /// ([`Engine::sleep_when_idle`]).
    Sleep {
        reply: mpsc::Sender<()>,
    },
    /// Sleep after this long without a command that needs the model (`None`: never).
    SleepWhenIdle(Option<Duration>),
    Shutdown,
}

/// Where the worker answers a submission: a thread that waits, or a future that is awaited.
enum Reply {
    Blocking(mpsc::Sender<Result<RequestId, EngineError>>),
    Async(oneshot::Sender<Result<RequestId, EngineError>>),
}

impl Reply {
    /// Answers the caller; `false` when it has gone (an async caller whose future was dropped).
    fn send(self, result: Result<RequestId, EngineError>) -> bool {
        match self {
            Self::Blocking(tx) => tx.send(result).is_ok(),
            Self::Async(tx) => tx.send(result).is_ok(),
        }
    }
}

/// A loaded model behind a continuous-batching scheduler on its own thread.
///
/// Cheap to share: `&Engine` is all submitting needs, from any thread.
pub struct Engine {
    commands: mpsc::Sender<Command>,
    worker: Option<JoinHandle<()>>,
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    metrics: Arc<Mutex<EngineMetrics>>,
    /// The default for requests that do not choose ([`EngineOptions::speculative`]).
    speculative: Option<crate::SpeculativeConfig>,
    /// The scheduler's limits ([`EngineOptions::scheduler`]).
    scheduler: SchedulerConfig,
    /// Whether the model is unloaded ([`Engine::sleep_when_idle`]); the worker sets it.
    sleeping: Arc<AtomicBool>,
    /// Why the engine cannot sleep, if it cannot (a pipeline's ranks hold their stages).
    cannot_sleep: Option<&'static str>,
    /// The LoRA adapters loaded beside the model, by id ([`EngineOptions::lora_adapters`]).
    lora: Vec<LoraInfo>,
    /// [`mlxcel_model::ControlVector::digest`] of the control vectors the model runs with.
    control_digest: Option<String>,
    /// A reranker's classification head ([`Engine::rank`]).
    rank_head: Option<Arc<mlxcel_model::RankHead>>,
    /// An encoder's vocabulary ([`Engine::load_encoder`]); `None` for a decoder.
    encoder: Option<Arc<mlxcel_model::encoder::WpmVocab>>,
}

/// What the engine thread builds its scheduler from.
enum Source {
    /// A decoder checkpoint and its draft model.
    Decoder(Box<LoadedModel>, Option<Box<LoadedModel>>),
    /// An encoder.
    Encoder(Box<mlxcel_model::encoder::BertCheckpoint>),
}

/// What [`Engine::start`] takes.
struct Start {
    source: Source,
    info: ModelInfo,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    options: EngineOptions,
    speculative: Option<crate::SpeculativeConfig>,
    lora: Vec<LoraInfo>,
    control_digest: Option<String>,
    rank_head: Option<Arc<mlxcel_model::RankHead>>,
    /// The first end token (structured output's end).
    eos: u32,
    vocab_size: usize,
    dir: PathBuf,
    encoder: Option<Arc<mlxcel_model::encoder::WpmVocab>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("info", &self.info).finish()
    }
}

impl Engine {
    /// Loads a model: `None` is the default model, else a checkpoint directory or a `.gguf` file.
    pub fn load(model: Option<&str>, options: EngineOptions) -> Result<Self, EngineError> {
        if let Some(path) = model.map(std::path::Path::new)
            && mlxcel_model::encoder::is_encoder_gguf(path)
        {
            return Self::load_encoder(path, options);
        }
        let dir = resolve_model_with(model, &options.kv_overrides)?;
        let loaded = LoadedModel::open(&dir)?;
        Self::from_loaded(loaded, options)
    }

    /// Starts an engine over an opened checkpoint.
    pub fn from_loaded(
        mut loaded: LoadedModel,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        options.scheduler.validate()?;
        loaded.checkpoint.apply_rope_overrides(&options.rope)?;
        if let Some(speculative) = &options.speculative {
            speculative.validate()?;
        }
        let speculative = options.speculative;
        if speculative.is_some() && options.backend == crate::BackendKind::Xla {
            return Err(EngineError::InvalidSpeculation(
                crate::speculative::NEEDS_SCORING.into(),
            ));
        }
        if speculative.is_some_and(|s| s.proposer.uses_draft()) && options.draft_model.is_none() {
            return Err(EngineError::InvalidSpeculation(
                "the draft-model proposer needs a draft model (EngineOptions::draft_model, \
                 --spec-draft-model)"
                    .into(),
            ));
        }
        let draft = match &options.draft_model {
            Some(path) => Some(open_draft(path, &loaded.tokenizer)?),
            None => None,
        };
        // Each adapter is checked against the model here, before the backend loads it.
        let lora = crate::lora::open_adapters(&options.lora_adapters, loaded.config())?;
        // The control vectors too: a malformed file is refused here, named, before loading.
        let control_digest = mlxcel_model::ControlVector::load(
            &options.control_vector,
            loaded.config().hidden_size,
            loaded.config().num_hidden_layers,
        )?
        .map(|v| v.digest());
        let info = ModelInfo::from_loaded(&loaded, options.backend);
        let tokenizer = Arc::new(loaded.tokenizer.clone());
        let chat_template = match &options.chat_template {
            Some(source) => {
                let (bos, eos) = loaded
                    .chat_template
                    .as_ref()
                    .map_or(("", ""), |t| (t.bos_token(), t.eos_token()));
                Some(mlxcel_model::ChatTemplate::new(source, bos, eos)?)
            }
            None => loaded.chat_template.take(),
        };
        let rank_head = loaded.rank_head.take().map(Arc::new);
        Self::start(Start {
            eos: loaded.eos_token_ids.first().copied().unwrap_or(0),
            vocab_size: loaded.checkpoint.config().vocab_size,
            dir: loaded.dir().to_owned(),
            source: Source::Decoder(Box::new(loaded), draft.map(Box::new)),
            info,
            tokenizer,
            chat_template,
            options,
            speculative,
            lora,
            control_digest,
            rank_head,
            encoder: None,
        })
    }

    /// Loads an encoder (a BERT GGUF, [`mlxcel_model::encoder::BertCheckpoint`]): it serves
    /// [`Engine::embed`] and, with a classification head, [`Engine::rank`]; generation is
    /// refused. Options that apply to decoders only are refused by name
    /// ([`crate::encoder::check_options`]).
    pub fn load_encoder(
        path: &std::path::Path,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        crate::encoder::check_options(&options)?;
        let bert = mlxcel_model::encoder::BertCheckpoint::open(path)?;
        let vocab = Arc::new(bert.vocab.clone());
        let tokenizer = Arc::new(Tokenizer::from_wpm(vocab.clone(), path)?);
        let info = ModelInfo {
            dir: path.to_owned(),
            name: bert.name.clone(),
            backend: options.backend,
            window: bert.config.positions,
            vocab_size: bert.config.vocab,
            eos_token_ids: bert.vocab.options.sep.into_iter().collect(),
            fim_tokens: FimTokens::default(),
            weight_bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
            parameters: bert.parameters(),
            hidden_size: bert.config.hidden,
            features: crate::encoder::describe(&bert),
            model_ftype: bert.ftype.clone(),
        };
        Self::start(Start {
            eos: bert.vocab.options.sep.unwrap_or(0),
            vocab_size: bert.config.vocab,
            dir: path.to_owned(),
            rank_head: bert.head.clone().map(Arc::new),
            source: Source::Encoder(Box::new(bert)),
            info,
            tokenizer,
            chat_template: None,
            options,
            speculative: None,
            lora: Vec::new(),
            control_digest: None,
            encoder: Some(vocab),
        })
    }

    /// Starts the engine thread, which builds the backend and the scheduler over `start.source`,
    /// and returns the handle once they are built.
    fn start(start: Start) -> Result<Self, EngineError> {
        let Start {
            source,
            info,
            tokenizer,
            chat_template,
            options,
            speculative,
            lora,
            control_digest,
            rank_head,
            eos,
            vocab_size,
            dir,
            encoder,
        } = start;
        let scheduler_config = options.scheduler;
        let metrics = Arc::new(Mutex::new(EngineMetrics::default()));

        let (commands, inbox) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let decoder = Arc::new(
            TokenizerDecoder::new(tokenizer.clone()).with_special_tokens(options.special_tokens),
        );
        // Structured output compiles against the tokenizer's vocabulary, padded to the model's;
        // the first end token closes a complete output.
        let constraint_tokenizer = tokenizer.clone();
        let breakers = Arc::new(BreakerVocabulary::new(tokenizer.clone()));
        let worker_metrics = metrics.clone();
        let backend_name = options.backend.as_str();
        let sleeping = Arc::new(AtomicBool::new(false));
        let worker_sleeping = sleeping.clone();
        let cannot_sleep = options
            .pipeline
            .is_some()
            .then_some("a pipeline's ranks hold their stages of the model");
        let loader_tokenizer = tokenizer.clone();
        let worker = std::thread::Builder::new()
            .name("mlxcel-engine".into())
            .spawn(move || {
                // The backend is built on the thread that runs it; the loader is kept to build
                // it again when the engine wakes from sleep.
                let encoder_path = matches!(source, Source::Encoder(_)).then(|| dir.clone());
                let loader = Loader {
                    dir,
                    options,
                    tokenizer: loader_tokenizer,
                    decoder,
                    constraints: Arc::new(ConstraintSource::new(
                        constraint_tokenizer,
                        eos,
                        vocab_size,
                    )),
                    breakers,
                    encoder: encoder_path,
                };
                let scheduler = match &source {
                    Source::Decoder(loaded, draft) => {
                        loader.build(&loaded.checkpoint, draft.as_deref())
                    }
                    Source::Encoder(bert) => loader.build_encoder(bert),
                };
                match scheduler {
                    Ok(scheduler) => {
                        let _ = ready_tx.send(Ok(()));
                        drop(source);
                        let resident = Resident::new(scheduler, loader, worker_sleeping);
                        run_worker(resident, inbox, worker_metrics);
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                    }
                }
            })
            .map_err(|e| {
                EngineError::backend(
                    backend_name,
                    std::io::Error::new(e.kind(), format!("cannot start the engine thread: {e}")),
                )
            })?;
        ready_rx.recv().map_err(|_| EngineError::Stopped)??;
        Ok(Self {
            commands,
            worker: Some(worker),
            info,
            tokenizer,
            chat_template,
            metrics,
            speculative,
            scheduler: scheduler_config,
            sleeping,
            cannot_sleep,
            lora,
            control_digest,
            rank_head,
            encoder,
        })
    }

    /// The digest of the control vectors the model runs with (`--control-vector` ...), `None`
    /// without: keys and values computed under them are valid under the same ones only.
    pub fn control_vector_digest(&self) -> Option<&str> {
        self.control_digest.as_deref()
    }

    /// The LoRA adapters loaded beside the model, by id.
    pub fn lora_adapters(&self) -> &[LoraInfo] {
        &self.lora
    }

    /// Checks a request's LoRA scales against the loaded adapters.
    pub fn check_lora(&self, scales: &[f32]) -> Result<(), EngineError> {
        crate::lora::check_scales(scales, self.lora.len())
    }

    /// Unloads the model once nothing has needed it for `after` (`None`: never, the default),
    /// as llama-server's `--sleep-idle-seconds` does: the weights, the KV memory and the prefix
    /// cache are dropped and their memory handed back, and the first request that needs the
    /// model loads it again from the checkpoint with the same options (it waits for the load).
    /// What needs only the tokenizer, the chat template or [`Engine::metrics`] (the snapshot
    /// taken before sleeping) never wakes it. Refused for a pipeline of ranks.
    pub fn sleep_when_idle(&self, after: Option<Duration>) -> Result<(), EngineError> {
        if let (Some(reason), Some(_)) = (self.cannot_sleep, after) {
            return Err(EngineError::Unsupported {
                what: "unloading the model when idle (--sleep-idle-seconds)".into(),
                backend: self.info.backend.as_str(),
                reason,
            });
        }
        self.commands
            .send(Command::SleepWhenIdle(after))
            .map_err(|_| EngineError::Stopped)
    }

    /// Unloads the model now if no request is queued or running (else it stays loaded); returns
    /// once the worker has handled it.
    pub fn sleep(&self) -> Result<(), EngineError> {
        if let Some(reason) = self.cannot_sleep {
            return Err(EngineError::Unsupported {
                what: "unloading the model (sleep)".into(),
                backend: self.info.backend.as_str(),
                reason,
            });
        }
        self.ask(|reply| Command::Sleep { reply })
    }

    /// Whether the model is unloaded ([`Engine::sleep_when_idle`]).
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::SeqCst)
    }

    /// Loads the model again if it sleeps, waiting for the load, and starts its idle time again
    /// (callers that use the model without the engine's thread, such as a tokenizer route, call
    /// it so that the engine counts them as activity).
    pub fn wake(&self) -> Result<(), EngineError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Wake { reply })
            .map_err(|_| EngineError::Stopped)?;
        answer.blocking_recv().map_err(|_| EngineError::Stopped)?
    }

    /// [`Engine::wake`] for async callers.
    pub async fn wake_async(&self) -> Result<(), EngineError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Wake { reply })
            .map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// The speculative decoding a request that does not choose gets (`None`: plain decoding).
    pub fn default_speculative(&self) -> Option<crate::SpeculativeConfig> {
        self.speculative
    }

    /// The scheduler's limits: its batch, and how many requests may wait for a slot.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        self.scheduler
    }

    /// The model's description.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Scheduler counters as of the last step.
    pub fn stats(&self) -> SchedulerStats {
        self.metrics().scheduler
    }

    /// Counters, latency histograms and bucket occupancy as of the last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Refuses the first token id the model does not have. The one vocabulary check: `submit`
    /// runs it on every prompt, and callers that take ids from users (the server's token-id
    /// prompts and `/detokenize`) run it before anything else.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let vocab_size = self.info.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab_size) {
            Some(&token) => Err(EngineError::TokenOutOfVocabulary { token, vocab_size }),
            None => Ok(()),
        }
    }

    /// Tokenizes `text` as a prompt (the tokenizer's special handling on, as llama.cpp does).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode(text, true, true)?)
    }

    /// Renders `messages` through the chat template, ready to tokenize.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(EngineError::NoChatTemplate)?;
        Ok(template.render(messages, true)?)
    }

    /// [`Engine::apply_chat_template`] with Hugging Face's full context: `context` serializes to
    /// a map with `messages` (tool calls and tool results included) and optionally `tools`,
    /// `add_generation_prompt` and other keyword arguments ([`mlxcel_model::ChatTemplate::render_with`]).
    pub fn apply_chat_template_with<C: serde::Serialize + ?Sized>(
        &self,
        context: &C,
    ) -> Result<String, EngineError> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or(EngineError::NoChatTemplate)?;
        Ok(template.render_with(context)?)
    }

    /// The embedding of `tokens`: the model's final hidden states pooled and normalized (one
    /// vector, or one per token with [`crate::Pooling::None`]), computed on the engine's thread
    /// between generation steps. A text longer than the window is refused with the numbers.
    pub fn embed(
        &self,
        tokens: Vec<u32>,
        pooling: crate::Pooling,
        normalize: crate::Normalize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let states = self.hidden_states(tokens)?;
        Ok(crate::embedding::pool(states, pooling, normalize))
    }

    /// The final hidden state of every position of `tokens`, on the engine's thread between
    /// generation steps; an empty or too long input is refused with the numbers.
    fn hidden_states(&self, tokens: Vec<u32>) -> Result<Vec<Vec<f32>>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_tokens(&tokens)?;
        if tokens.len() > self.info.window {
            return Err(EngineError::InputTooLong {
                tokens: tokens.len(),
                window: self.info.window,
            });
        }
        self.ask(|reply| Command::Hidden { tokens, reply })?
    }

    /// A reranker's classification head ([`mlxcel_model::RankHead`]); `None` for other models.
    pub fn rank_head(&self) -> Option<&mlxcel_model::RankHead> {
        self.rank_head.as_deref()
    }

    /// An encoder's tokens of a (query, document) pair for [`Engine::rank`], as llama-server's
    /// `/rerank` puts them together for a model without a rerank prompt
    /// ([`mlxcel_model::encoder::WpmVocab::rerank_pair`]); `None` for a decoder.
    pub fn rank_pair(&self, query: &str, document: &str) -> Option<Vec<u32>> {
        Some(self.encoder.as_ref()?.rerank_pair(query, document))
    }

    /// A reranker's relevance score of `tokens` (a query and a document put together, e.g. by
    /// [`mlxcel_model::RankHead::prompt`]): its classification head over the final hidden
    /// states, as llama.cpp's rank pooling computes it. Refused for a model without a head and
    /// on a backend without hidden states.
    pub fn rank(&self, tokens: Vec<u32>) -> Result<f64, EngineError> {
        let head = self.rank_head.clone().ok_or(EngineError::NotAReranker)?;
        if self.info.backend == crate::BackendKind::Xla {
            return Err(EngineError::Unsupported {
                what: "reranking".into(),
                backend: self.info.backend.as_str(),
                reason: "its programs return logits only, not the hidden states a \
                         classification head reads: use the mlx backend",
            });
        }
        let states = self.hidden_states(tokens)?;
        head.score(&states).ok_or(EngineError::EmptyPrompt)
    }

    /// Sends the worker a command that carries a reply channel, and waits for the answer
    /// (between steps).
    fn ask<T>(&self, command: impl FnOnce(mpsc::Sender<T>) -> Command) -> Result<T, EngineError> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(command(reply))
            .map_err(|_| EngineError::Stopped)?;
        answer.recv().map_err(|_| EngineError::Stopped)
    }

    /// What the prefix cache holds for request `id` once it has finished (its prompt and the
    /// tokens it generated, but the last), with their keys and values; `None` when its slot was
    /// not kept (the prefix cache off, a cancelled or failed request, fewer than 8 positions) or
    /// has been evicted since. llama-server's `POST /slots/{id}?action=save` reads it.
    pub fn cached_prefix(&self, id: RequestId) -> Result<Option<CachedPrefix>, EngineError> {
        self.ask(|reply| Command::ExportCached { id, reply })?
    }

    /// Puts a [`CachedPrefix`] exported by this model and backend back into the prefix cache,
    /// evicting its least recently used entries to make room, so that a request starting with
    /// its tokens reuses their keys and values; returns the entry's id (for
    /// [`Engine::cached_prefix`] and [`Engine::erase_prefix`]). Refused with the numbers when
    /// the prefix cache is off or smaller than the entry, or a token is outside the vocabulary.
    pub fn restore_prefix(&self, prefix: CachedPrefix) -> Result<RequestId, EngineError> {
        self.check_tokens(&prefix.tokens)?;
        if prefix.tokens.len() > self.info.window {
            return Err(EngineError::InputTooLong {
                tokens: prefix.tokens.len(),
                window: self.info.window,
            });
        }
        self.ask(|reply| Command::RestoreCached { prefix, reply })?
    }

    /// Ends running request `id`'s reasoning block now: the request's reasoning budget
    /// ([`crate::GenerationRequest::reasoning_budget`]) writes the block's end next, and the
    /// reply goes on to its answer (llama-server's `reasoning_end` control action).
    pub fn end_reasoning(&self, id: RequestId) -> Result<ReasoningEnd, EngineError> {
        self.ask(|reply| Command::EndReasoning { id, reply })
    }

    /// Drops entry `id` (a finished request's or a restored one's) from the prefix cache;
    /// returns the tokens it held (0 when there was none).
    pub fn erase_prefix(&self, id: RequestId) -> Result<usize, EngineError> {
        self.ask(|reply| Command::EraseCached { id, reply })
    }

    /// The plan request `id` runs under while it is queued or running (`None` once it has
    /// finished): its positions, and the budget it was admitted with (an unlimited one as
    /// clamped by the window and the KV budget).
    pub fn plan(&self, id: RequestId) -> Result<Option<crate::SessionPlan>, EngineError> {
        self.ask(|reply| Command::Plan { id, reply })
    }

    /// The chat template's source, if the checkpoint has one.
    pub fn chat_template_source(&self) -> Option<String> {
        self.chat_template.as_ref().map(|t| t.source())
    }

    /// The prompt tokens of a conversation: the messages through the chat template with the
    /// generation prompt, tokenized without adding special tokens (the template writes them).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let text = self.apply_chat_template(messages)?;
        Ok(self.tokenizer.encode(&text, false, true)?)
    }

    /// Starts the assistant's reply to `messages`; `request` supplies everything but the prompt
    /// (its `prompt` is replaced).
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        mut request: GenerationRequest,
    ) -> Result<GenerationStream, EngineError> {
        request.prompt = self.chat_prompt(messages)?;
        self.submit(request)
    }

    /// Queues a request and returns its stream of events. Refusals (too long, bad settings, a full
    /// queue) are returned here. The checkpoint's EOS ids are added to the request's stop tokens.
    /// The calling thread waits for the engine thread to size and queue the request (until its
    /// current step ends); async code uses [`Engine::submit_async`] instead.
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream, EngineError> {
        let (reply, answer) = mpsc::channel();
        let events = self.send_submission(request, Reply::Blocking(reply))?;
        let id = answer.recv().map_err(|_| EngineError::Stopped)??;
        Ok(self.stream(id, events))
    }

    /// [`Engine::submit`] for async callers: the same checks and refusals, awaited without
    /// blocking a thread (a server's submission no longer hops through a blocking pool).
    pub async fn submit_async(
        &self,
        request: GenerationRequest,
    ) -> Result<GenerationStream, EngineError> {
        let (reply, answer) = oneshot::channel();
        let events = self.send_submission(request, Reply::Async(reply))?;
        let id = answer.await.map_err(|_| EngineError::Stopped)??;
        Ok(self.stream(id, events))
    }

    /// Checks what needs no backend, completes the stop tokens, and hands the request to the
    /// engine thread; returns the receiver of its events.
    fn send_submission(
        &self,
        mut request: GenerationRequest,
        reply: Reply,
    ) -> Result<events::UnboundedReceiver<Event>, EngineError> {
        if self.encoder.is_some() {
            return Err(crate::encoder::generation_refused());
        }
        self.check_tokens(&request.prompt)?;
        self.check_lora(&request.lora)?;
        if request.speculative.is_none() {
            request.speculative = self.speculative;
        }
        for &eos in &self.info.eos_token_ids {
            if !request.stop_token_ids.contains(&eos) {
                request.stop_token_ids.push(eos);
            }
        }
        let (events_tx, events_rx) = events::unbounded_channel();
        self.commands
            .send(Command::Submit {
                request: Box::new(request),
                events: events_tx,
                reply,
            })
            .map_err(|_| EngineError::Stopped)?;
        Ok(events_rx)
    }

    fn stream(&self, id: RequestId, events: events::UnboundedReceiver<Event>) -> GenerationStream {
        GenerationStream {
            id,
            events,
            commands: self.commands.clone(),
            finished: false,
        }
    }

    /// Generates to the end and returns the whole completion.
    pub fn generate(&self, request: GenerationRequest) -> Result<Completion, EngineError> {
        self.submit(request)?.collect_completion()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
            // The model's buffers are free now; give them back to the system, as sleeping does
            // (a router unloads one model while the others keep serving).
            backends::release_unused_memory();
        }
    }
}

fn weight_totals(loaded: &LoadedModel) -> (u64, u64) {
    let mut bytes = 0u64;
    let mut parameters = 0u64;
    for tensor in loaded.checkpoint.tensor_infos() {
        bytes += tensor.byte_len as u64;
        let elements: u64 = tensor.shape.iter().map(|&d| d as u64).product();
        if tensor.name.ends_with(".scales") || tensor.name.ends_with(".biases") {
            continue;
        }
        let unpacked = match (
            tensor.dtype,
            loaded
                .checkpoint
                .quantization_of(tensor.name.trim_end_matches(".weight")),
        ) {
            (mlxcel_model::Dtype::U32, Some(spec)) => elements * 32 / u64::from(spec.bits),
            _ => elements,
        };
        parameters += unpacked;
    }
    (bytes, parameters)
}

/// Per-request timing, for the latency histograms.
struct Timing {
    submitted: Instant,
    /// The start of the step that gave the request a slot.
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

fn run_worker(
    mut resident: Resident,
    inbox: mpsc::Receiver<Command>,
    metrics: Arc<Mutex<EngineMetrics>>,
) {
    let mut streams: HashMap<RequestId, (events::UnboundedSender<Event>, Timing)> = HashMap::new();
    let mut local = EngineMetrics::default();
    let mut released = Instant::now();
    // What loading freed (the checkpoint read and rewritten) counts as a step's: the first time
    // the engine is idle, it goes back to the system too.
    let mut stepped = true;
    loop {
        // Block for a command while idle (until the model's idle time runs out, when it sleeps
        // after a while); otherwise take what has arrived and keep stepping.
        let first = if resident.get().is_some_and(|s| s.has_work()) {
            inbox.try_recv().ok()
        } else {
            // Going idle: hand back what the steps freed before blocking.
            if stepped {
                backends::release_unused_memory();
                released = Instant::now();
                stepped = false;
            }
            let received = match resident.sleep_deadline() {
                Some(deadline) => {
                    match inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                        Ok(command) => Ok(command),
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            // The metrics keep the snapshot published before: what a reader
                            // sees while the model sleeps is what it saw last while awake.
                            resident.sleep();
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => inbox.recv(),
            };
            match received {
                Ok(command) => Some(command),
                Err(_) => return,
            }
        };
        let mut next = first;
        while let Some(command) = next {
            match command {
                Command::Submit {
                    request,
                    events,
                    reply,
                } => {
                    let result = resident.wake().and_then(|s| s.submit(*request));
                    let accepted = result.as_ref().ok().copied();
                    if let Some(id) = accepted {
                        let timing = Timing {
                            submitted: Instant::now(),
                            admitted: None,
                            first_token: None,
                            last_token: None,
                        };
                        streams.insert(id, (events, timing));
                        local.requests_submitted += 1;
                    }
                    // A caller that went away before hearing back never gets a stream to cancel
                    // with: cancel for it, so that no slot runs for nobody.
                    if !reply.send(result)
                        && let Some(id) = accepted
                        && let Some(scheduler) = resident.get_mut()
                    {
                        scheduler.cancel(id);
                    }
                }
                Command::Cancel(id) => {
                    if let Some(scheduler) = resident.get_mut() {
                        scheduler.cancel(id);
                    }
                }
                Command::EndReasoning { id, reply } => {
                    // A sleeping engine runs no request.
                    let _ = reply.send(
                        resident
                            .get_mut()
                            .map_or(ReasoningEnd::UnknownRequest, |s| s.end_reasoning(id)),
                    );
                }
                Command::Hidden { tokens, reply } => {
                    let _ = reply.send(
                        resident
                            .wake()
                            .and_then(|s| s.backend_mut().hidden_states(&tokens)),
                    );
                }
                Command::ExportCached { id, reply } => {
                    // A sleeping engine's prefix cache went with its backend.
                    let _ =
                        reply.send(resident.get_mut().map_or(Ok(None), |s| s.export_cached(id)));
                }
                Command::RestoreCached { prefix, reply } => match resident.wake() {
                    Ok(scheduler) => {
                        let _ = reply.send(scheduler.restore_cached_state(
                            prefix.tokens,
                            &prefix.kv,
                            &prefix.state,
                        ));
                        publish(&metrics, &mut local, scheduler);
                    }
                    Err(err) => {
                        let _ = reply.send(Err(err));
                    }
                },
                Command::EraseCached { id, reply } => match resident.get_mut() {
                    Some(scheduler) => {
                        let _ = reply.send(scheduler.erase_cached(id));
                        publish(&metrics, &mut local, scheduler);
                    }
                    None => {
                        let _ = reply.send(0);
                    }
                },
                Command::Plan { id, reply } => {
                    let _ = reply.send(resident.get().and_then(|s| s.plan(id)));
                }
                Command::Wake { reply } => {
                    let woken = resident.wake().map(|scheduler| {
                        publish(&metrics, &mut local, scheduler);
                    });
                    let _ = reply.send(woken);
                }
                Command::Sleep { reply } => {
                    if !resident.get().is_some_and(|s| s.has_work()) {
                        resident.sleep();
                    }
                    let _ = reply.send(());
                }
                Command::SleepWhenIdle(after) => resident.set_idle_after(after),
                Command::Shutdown => return,
            }
            next = inbox.try_recv().ok();
        }
        let Some(scheduler) = resident.get_mut() else {
            continue;
        };
        if !scheduler.has_work() {
            publish(&metrics, &mut local, scheduler);
            continue;
        }
        if released.elapsed() >= backends::RELEASE_EVERY {
            backends::release_unused_memory();
            released = Instant::now();
        }
        stepped = true;
        let step_start = Instant::now();
        let events = scheduler.step();
        let now = Instant::now();
        // A request in a slot after this step was admitted by it at the latest (one that ends
        // in the step it was admitted by is seen by its events below).
        for id in scheduler.running_ids() {
            if let Some((_, timing)) = streams.get_mut(&id) {
                admit(&mut local, timing, step_start);
            }
        }
        // Count first and publish, then deliver: a caller that sees its request finish also
        // sees it in the metrics.
        for (id, event) in &events {
            let Some((_, timing)) = streams.get_mut(id) else {
                continue;
            };
            match event {
                Event::Token { .. } => {
                    admit(&mut local, timing, step_start);
                    match timing.last_token {
                        None => {
                            local.time_to_first_token.observe(now - timing.submitted);
                            if let Some(admitted) = timing.admitted {
                                local.prefill_time.observe(now - admitted);
                            }
                        }
                        Some(last) => local.inter_token_latency.observe(now - last),
                    }
                    timing.first_token.get_or_insert(now);
                    timing.last_token = Some(now);
                }
                Event::Finished { reason, usage, .. } => {
                    local.finished.record(*reason);
                    local.e2e_request_latency.observe(now - timing.submitted);
                    if let Some(first) = timing.first_token {
                        local.decode_time.observe(now - first);
                    }
                    let positions = (usage.prompt_tokens + usage.completion_tokens) as u64;
                    local.max_request_tokens = local.max_request_tokens.max(positions);
                }
            }
        }
        publish(&metrics, &mut local, scheduler);
        for (id, event) in events {
            let Some((sender, _)) = streams.get(&id) else {
                continue;
            };
            let finished = matches!(event, Event::Finished { .. });
            let delivered = sender.send(event).is_ok();
            if finished {
                streams.remove(&id);
            } else if !delivered {
                // The caller dropped the stream: stop spending steps on it.
                scheduler.cancel(id);
            }
        }
        // The idle time before sleeping counts from the end of the last step.
        resident.touch();
    }
}

/// Notes when a request got its slot (once): the start of the step that admitted it.
fn admit(local: &mut EngineMetrics, timing: &mut Timing, step_start: Instant) {
    if timing.admitted.is_none() {
        let at = step_start.max(timing.submitted);
        timing.admitted = Some(at);
        local.queue_time.observe(at - timing.submitted);
    }
}

/// Copies the worker's metrics, with the scheduler's current counters, where readers see them.
fn publish(shared: &Mutex<EngineMetrics>, local: &mut EngineMetrics, scheduler: &Loaded) {
    local.scheduler = scheduler.stats();
    local.buckets = scheduler.bucket_occupancy();
    local.compilations = scheduler.backend().compilations();
    local.kv_usage = scheduler.backend().kv_usage();
    local.kv_blocks = scheduler.backend().kv_blocks();
    local.running_requests = scheduler.running_progress().collect();
    local.backend_fault = scheduler.backend().fault();
    *shared.lock().unwrap_or_else(|e| e.into_inner()) = local.clone();
}

/// The events of one request. Dropping it cancels the request.
#[derive(Debug)]
pub struct GenerationStream {
    id: RequestId,
    events: events::UnboundedReceiver<Event>,
    commands: mpsc::Sender<Command>,
    finished: bool,
}

impl GenerationStream {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, waiting for it asynchronously; `None` after `Finished`.
    pub async fn next_event(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        self.note(&event);
        event
    }

    /// Asks the engine to end this request; a `Finished { reason: Cancelled }` event follows.
    pub fn cancel(&self) {
        let _ = self.commands.send(Command::Cancel(self.id));
    }

    fn note(&mut self, event: &Option<Event>) {
        if matches!(event, None | Some(Event::Finished { .. })) {
            self.finished = true;
        }
    }

    /// Waits for the end and gathers the text, tokens and usage.
    pub fn collect_completion(mut self) -> Result<Completion, EngineError> {
        let mut completion = Completion::default();
        for event in self.by_ref() {
            match event {
                Event::Token { token, text, .. } => {
                    completion.tokens.push(token);
                    completion.text.push_str(&text);
                }
                Event::Finished {
                    reason,
                    text,
                    usage,
                    error,
                } => {
                    completion.text.push_str(&text);
                    if let (FinishReason::Error, Some(message)) = (reason, error) {
                        return Err(EngineError::backend("engine", message));
                    }
                    completion.finish_reason = Some(reason);
                    completion.usage = usage;
                }
            }
        }
        if completion.finish_reason.is_none() {
            return Err(EngineError::Stopped);
        }
        Ok(completion)
    }
}

impl Iterator for GenerationStream {
    type Item = Event;

    /// Blocks for the next event. Do not call from inside an async runtime; use `next_event`.
    fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.events.blocking_recv();
        self.note(&event);
        event
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if !self.finished {
            self.cancel();
        }
    }
}

/// A finished generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    /// The generated text (stop strings excluded).
    pub text: String,
    /// The generated tokens (including a final EOS token).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub finish_reason: Option<FinishReason>,
    /// Token counts.
    pub usage: Usage,
}
