//! The model resident on the engine's thread, or asleep.
//!
//! [`Resident`] holds the scheduler (the backend with the weights and the KV memory, the prefix
//! cache and the draft model) while the engine is awake. With an idle time set
//! ([`crate::Engine::sleep_when_idle`], llama-server's `--sleep-idle-seconds`) it drops all of
//! it once nothing has needed the model for that long, and hands the freed memory back to the
//! system; the first command that needs the model again rebuilds it from the checkpoint with the
//! same options ([`Loader`]). The tokenizer and chat template stay with the engine, so what
//! needs only them never wakes it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlxcel_model::encoder::BertCheckpoint;
use mlxcel_model::{Checkpoint, LoadedModel, Tokenizer, resolve_model};

use crate::backend::Backend;
use crate::backends;
use crate::decode::TextDecoder;
use crate::error::EngineError;
use crate::options::EngineOptions;
use crate::sampling::BreakerVocabulary;
use crate::scheduler::{Carried, ConstraintSource, Scheduler};

/// The scheduler the engine's thread runs.
pub(crate) type Loaded = Scheduler<Box<dyn Backend>>;

/// What building the scheduler takes, kept to build it again on waking.
pub(crate) struct Loader {
    /// The checkpoint directory the engine was loaded from.
    pub(crate) dir: PathBuf,
    pub(crate) options: EngineOptions,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) decoder: Arc<dyn TextDecoder>,
    pub(crate) constraints: Arc<ConstraintSource>,
    pub(crate) breakers: Arc<BreakerVocabulary>,
    /// The GGUF file of an encoder model (BERT), read again on waking; `None` for a decoder.
    pub(crate) encoder: Option<PathBuf>,
}

impl Loader {
    /// Builds the backend over `checkpoint` (and the draft model's), and the scheduler over it.
    pub(crate) fn build(
        &self,
        checkpoint: &Checkpoint,
        draft: Option<&LoadedModel>,
    ) -> Result<Loaded, EngineError> {
        let backend = backends::load(checkpoint, &self.options)?;
        let scheduler = Scheduler::new(backend, self.decoder.clone(), self.options.scheduler)?
            .with_constraints(self.constraints.clone())
            .with_breaker_vocabulary(self.breakers.clone())
            .with_prefix_cache(self.options.prefix_cache_bytes);
        match draft {
            Some(draft) => scheduler.with_draft(backends::load(
                &draft.checkpoint,
                &self.options.for_draft(),
            )?),
            None => Ok(scheduler),
        }
    }

    /// Builds an encoder's backend over `checkpoint`, and the scheduler over it (which serves
    /// its hidden states and refuses to generate).
    pub(crate) fn build_encoder(&self, checkpoint: &BertCheckpoint) -> Result<Loaded, EngineError> {
        let backend = backends::load_encoder(checkpoint, &self.options)?;
        Scheduler::new(backend, self.decoder.clone(), self.options.scheduler)
    }

    /// Opens the checkpoint (and the draft model) again and builds the scheduler over them.
    fn reload(&self) -> Result<Loaded, EngineError> {
        if let Some(path) = &self.encoder {
            return self.build_encoder(&BertCheckpoint::open(path)?);
        }
        let mut checkpoint = Checkpoint::open(&self.dir)?;
        checkpoint.apply_rope_overrides(&self.options.rope)?;
        let draft = match &self.options.draft_model {
            Some(path) => Some(open_draft(path, &self.tokenizer)?),
            None => None,
        };
        self.build(&checkpoint, draft.as_ref())
    }
}

/// The scheduler while the engine is awake; what rebuilding it needs while it sleeps.
pub(crate) struct Resident {
    scheduler: Option<Loaded>,
    /// The last scheduler's request ids and counters, for the next one.
    carried: Option<Carried>,
    loader: Loader,
    /// Sleep after this long without a command that needs the model (`None`: never).
    idle_after: Option<Duration>,
    last_active: Instant,
    /// Shared with the engine's handle, which reports it without asking this thread.
    sleeping: Arc<AtomicBool>,
}

impl Resident {
    /// A resident `scheduler`, built by `loader`; `sleeping` is set while it is dropped.
    pub(crate) fn new(scheduler: Loaded, loader: Loader, sleeping: Arc<AtomicBool>) -> Self {
        Self {
            scheduler: Some(scheduler),
            carried: None,
            loader,
            idle_after: None,
            last_active: Instant::now(),
            sleeping,
        }
    }

    /// The scheduler, `None` while asleep.
    pub(crate) fn get(&self) -> Option<&Loaded> {
        self.scheduler.as_ref()
    }

    /// The scheduler, mutably, `None` while asleep.
    pub(crate) fn get_mut(&mut self) -> Option<&mut Loaded> {
        self.scheduler.as_mut()
    }

    /// Something needed the model now: the idle time starts again.
    pub(crate) fn touch(&mut self) {
        self.last_active = Instant::now();
    }

    /// Sets how long the engine stays awake without work (`None`: always).
    pub(crate) fn set_idle_after(&mut self, after: Option<Duration>) {
        self.idle_after = after;
        self.touch();
    }

    /// The scheduler, rebuilt from the checkpoint first if the engine sleeps (the caller waits
    /// for the load); counts as activity.
    pub(crate) fn wake(&mut self) -> Result<&mut Loaded, EngineError> {
        let scheduler = match self.scheduler.take() {
            Some(scheduler) => scheduler,
            None => {
                let mut scheduler = self.loader.reload()?;
                if let Some(carried) = self.carried.take() {
                    scheduler = scheduler.carry_on(carried);
                }
                self.sleeping.store(false, Ordering::SeqCst);
                scheduler
            }
        };
        // From the end of the load: a load longer than the idle time must not put the model
        // back to sleep before the caller has used it.
        self.touch();
        Ok(self.scheduler.insert(scheduler))
    }

    /// When the engine falls asleep if no command comes first: `None` when it never sleeps, is
    /// asleep, or has work.
    pub(crate) fn sleep_deadline(&self) -> Option<Instant> {
        let after = self.idle_after?;
        let scheduler = self.scheduler.as_ref()?;
        (!scheduler.has_work()).then_some(self.last_active + after)
    }

    /// Drops the scheduler (the weights, the KV memory, the prefix cache) and hands the freed
    /// memory back to the system; a no-op while asleep. The caller makes sure no request is
    /// queued or running.
    pub(crate) fn sleep(&mut self) {
        if let Some(scheduler) = self.scheduler.take() {
            self.carried = Some(scheduler.carried());
            drop(scheduler);
            backends::release_unused_memory();
            self.sleeping.store(true, Ordering::SeqCst);
        }
    }
}

/// Opens the draft model at `path` and checks that its tokenizer is the model's: the same
/// vocabulary, token for token (proposals are token ids, so they must mean the same text).
pub(crate) fn open_draft(path: &str, tokenizer: &Tokenizer) -> Result<LoadedModel, EngineError> {
    let dir = resolve_model(Some(path))?;
    let draft = LoadedModel::open(&dir)?;
    let refuse = |what: String| {
        EngineError::InvalidSpeculation(format!(
            "the draft model {} does not share the model's tokenizer ({what}); give a draft \
             model of the same family and tokenizer",
            dir.display()
        ))
    };
    let (ours, theirs) = (tokenizer.vocab_size(), draft.tokenizer.vocab_size());
    if ours != theirs {
        return Err(refuse(format!("{theirs} tokens against {ours}")));
    }
    if let Some(id) =
        (0..ours as u32).find(|&id| tokenizer.id_to_token(id) != draft.tokenizer.id_to_token(id))
    {
        return Err(refuse(format!(
            "token {id} is {:?} in the draft, {:?} in the model",
            draft.tokenizer.id_to_token(id).unwrap_or_default(),
            tokenizer.id_to_token(id).unwrap_or_default()
        )));
    }
    Ok(draft)
}
