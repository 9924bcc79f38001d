//! What every request handler shares: the settings, the engine once it has loaded, the metrics,
//! and the requests in flight (for `/slots`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use mlxcel_engine::{Engine, ModelInfo};

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// One request the server is serving.
#[derive(Debug, Clone)]
pub struct ActiveRequest {
    /// The engine's request id.
    pub request_id: u64,
    /// The `/slots` id it holds, from submission to its end; `None` while every one of the
    /// `--parallel` slots is held by an earlier request (it waits in the engine's queue).
    pub slot: Option<usize>,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The token budget (`None`: unlimited).
    pub budget: Option<usize>,
    /// Tokens generated so far.
    pub generated: usize,
    /// Text generated so far (stop strings withheld).
    pub text: String,
    /// Its settings, as `/slots` shows them.
    pub params: serde_json::Value,
    /// When it was submitted.
    pub started: Instant,
    /// The `/slots` id it asked for (llama-server's `id_slot`); it waits for that one.
    pub pinned: Option<usize>,
    /// The id its reply carries (`chatcmpl-…`), by which `POST /v1/chat/completions/control`
    /// names it.
    pub completion_id: Option<String>,
}

/// Shared state of one server.
#[derive(Debug)]
pub struct AppState {
    config: ServerConfig,
    engine: OnceLock<Arc<Engine>>,
    metrics: Metrics,
    active: Mutex<BTreeMap<u64, ActiveRequest>>,
    next_key: AtomicU64,
    /// Per `/slots` id, the prefix-cache entry of the last request it ran (or the one restored
    /// into it): what `POST /slots/{id}?action=save` writes.
    slot_entries: Mutex<BTreeMap<usize, u64>>,
    /// The model's fingerprint for slot files, computed on first use.
    fingerprint: OnceLock<String>,
    /// When the server started, in seconds since the Unix epoch (`/metrics`' header
    /// `Process-Start-Time-Unix`, as llama-server sends it).
    started_unix: u64,
    /// Router mode: the models this server routes to, each with a state of its own.
    router: OnceLock<Arc<crate::router::registry::Registry<AppState>>>,
    /// The agent features (`/tools`, `/cors-proxy`), set once at start; unset: all off.
    agent: OnceLock<Arc<crate::agent::Agent>>,
    /// The LoRA adapters' scales requests without `lora` run with, by id
    /// (`POST /lora-adapters` sets them).
    lora_scales: Mutex<Vec<f32>>,
    /// Resumable streams, by conversation id (`X-Conversation-Id`; [`crate::streams`]).
    streams: crate::streams::StreamSessions,
}

impl AppState {
    /// State with no engine yet: `/health` answers 503 until [`AppState::set_engine`].
    pub fn new(config: ServerConfig) -> Self {
        Self {
            lora_scales: Mutex::new(config.lora_scales.clone()),
            config,
            engine: OnceLock::new(),
            metrics: Metrics::default(),
            active: Mutex::new(BTreeMap::new()),
            next_key: AtomicU64::new(0),
            slot_entries: Mutex::new(BTreeMap::new()),
            fingerprint: OnceLock::new(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            router: OnceLock::new(),
            agent: OnceLock::new(),
            streams: crate::streams::StreamSessions::default(),
        }
    }

    /// Sets the agent features (a second set is ignored).
    pub fn set_agent(&self, agent: Arc<crate::agent::Agent>) {
        let _ = self.agent.set(agent);
    }

    /// The agent features, once started.
    pub fn agent(&self) -> Option<&Arc<crate::agent::Agent>> {
        self.agent.get()
    }

    /// Makes this server a router over `router`'s models (a second router is ignored).
    pub fn set_router(&self, router: Arc<crate::router::registry::Registry<AppState>>) {
        let _ = self.router.set(router);
    }

    /// The router, in router mode.
    pub fn router(&self) -> Option<&Arc<crate::router::registry::Registry<AppState>>> {
        self.router.get()
    }

    /// When the server started, in seconds since the Unix epoch.
    pub fn started_unix(&self) -> u64 {
        self.started_unix
    }

    /// The LoRA adapters' global scales, by id.
    pub fn lora_scales(&self) -> Vec<f32> {
        self.lora_scales
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets the LoRA adapters' global scales (`POST /lora-adapters`).
    pub fn set_lora_scales(&self, scales: Vec<f32>) {
        *self
            .lora_scales
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = scales;
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The resumable streams.
    pub(crate) fn streams(&self) -> &crate::streams::StreamSessions {
        &self.streams
    }

    /// Makes the server ready, and lets the engine sleep after `--sleep-idle-seconds`. A
    /// second engine is ignored.
    pub fn set_engine(&self, engine: Arc<Engine>) {
        if let Some(after) = self.config.sleep_idle
            && let Err(err) = engine.sleep_when_idle(Some(after))
        {
            tracing::warn!("--sleep-idle-seconds: {err}; the model stays loaded");
        }
        let _ = self.engine.set(engine);
    }

    /// The engine, or 503 while it loads. For what needs no model weights (its description,
    /// its tokenizer's metadata, the metrics snapshot): it does not wake a sleeping engine;
    /// routes that run the model or count as activity use [`AppState::awake_engine`].
    pub fn engine(&self) -> Result<&Arc<Engine>, ApiError> {
        self.engine.get().ok_or(ApiError::Loading)
    }

    /// The engine, woken first if it sleeps (`--sleep-idle-seconds`: the caller waits for the
    /// model to load again), with its idle time started again; 503 while it first loads.
    pub async fn awake_engine(&self) -> Result<Arc<Engine>, ApiError> {
        let engine = self.engine()?.clone();
        if self.config.sleep_idle.is_some() {
            if engine.is_sleeping() {
                tracing::info!("waking the model: loading it again");
            }
            engine.wake_async().await?;
        }
        Ok(engine)
    }

    /// Whether the model is unloaded for idleness (`/props`' `is_sleeping`).
    pub fn is_sleeping(&self) -> bool {
        self.engine.get().is_some_and(|e| e.is_sleeping())
    }

    /// Whether the model has loaded.
    pub fn is_ready(&self) -> bool {
        self.engine.get().is_some()
    }

    /// The name replies carry: the first `--alias`, else the model's own name (a converted GGUF's
    /// stem, or the directory's).
    pub fn model_name(&self, info: &ModelInfo) -> String {
        self.config
            .aliases
            .first()
            .cloned()
            .unwrap_or_else(|| info.name.clone())
    }

    /// The names the model answers to (`/v1/models`' `aliases`): every `--alias`, else the
    /// model's own name.
    pub fn model_names(&self, info: &ModelInfo) -> Vec<String> {
        if self.config.aliases.is_empty() {
            vec![info.name.clone()]
        } else {
            self.config.aliases.clone()
        }
    }

    /// Refuses a model name this server does not serve: under `--strict-model-names`, one that is
    /// not an alias, the `-m` value as given, or the model's file or directory name; without it,
    /// none (the one model answers every name, as llama-server's does, since tools send names
    /// such as `gpt-4o`). `None` (not given) is always accepted.
    pub fn check_model(&self, info: &ModelInfo, requested: Option<&str>) -> Result<(), ApiError> {
        let Some(requested) = requested else {
            return Ok(());
        };
        if !self.config.strict_model_names {
            return Ok(());
        }
        let known = self.config.aliases.iter().any(|a| a == requested)
            || requested == info.name
            || self.config.model_arg.as_deref() == Some(requested)
            || requested == info.dir.to_string_lossy();
        if known {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound {
                model: requested.to_owned(),
                served: self.model_names(info).join("`, `"),
            })
        }
    }

    /// The most positions (prompt + budget) one request may use: `--ctx-size` (a `--parallel`-th
    /// of it when the slots share it, llama-server's `n_ctx_slot`) capped by the window.
    pub fn context_limit(&self, info: &ModelInfo) -> usize {
        self.config.ctx_size.map_or(info.window, |ctx| {
            let per_request = if self.config.ctx_per_slot {
                (ctx / self.config.parallel.max(1)).max(1)
            } else {
                ctx
            };
            per_request.min(info.window)
        })
    }

    /// Static capacity buckets of the engine's backend, from its metrics; empty for dynamic
    /// shapes (MLX). `/props` and the startup log report them.
    pub fn capacity_buckets(&self, engine: &Engine) -> Vec<usize> {
        engine
            .metrics()
            .buckets
            .iter()
            .map(|b| b.context_capacity)
            .collect()
    }

    /// The `/metrics` exposition text.
    pub fn render_metrics(&self) -> String {
        let engine = self.engine.get();
        let model = engine.map_or_else(
            || self.config.aliases.first().cloned().unwrap_or_default(),
            |e| self.model_name(e.info()),
        );
        let metrics = engine.map(|e| e.metrics());
        self.metrics
            .render(metrics.as_ref(), self.active_requests().len(), &model)
    }

    /// Requests in flight, oldest first.
    pub fn active_requests(&self) -> Vec<ActiveRequest> {
        self.lock_active().values().cloned().collect()
    }

    fn lock_active(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ActiveRequest>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names tracked request `key` by the id its reply carries.
    pub(crate) fn name_request(&self, key: u64, completion_id: &str) {
        if let Some(request) = self.lock_active().get_mut(&key) {
            request.completion_id = Some(completion_id.to_owned());
        }
    }

    /// The engine's id of the request in flight whose reply carries `completion_id`.
    pub(crate) fn request_named(&self, completion_id: &str) -> Option<u64> {
        self.lock_active()
            .values()
            .find(|r| r.completion_id.as_deref() == Some(completion_id))
            .map(|r| r.request_id)
    }

    /// Starts tracking `request`: it takes the lowest free slot, if one of the `--parallel`
    /// slots is free (the engine admits in submission order, so the requests holding slots are
    /// the ones it runs).
    /// A request pinned to a slot (`id_slot`) waits for that one.
    pub(crate) fn register(&self, mut request: ActiveRequest) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let mut active = self.lock_active();
        request.slot = match request.pinned {
            Some(slot) => (!active.values().any(|r| r.slot == Some(slot))).then_some(slot),
            None => free_slot(&active, self.config.parallel),
        };
        let launched = request.slot;
        active.insert(key, request);
        if let Some(slot) = launched {
            self.cache_idle_slots(&active, slot);
        }
        key
    }

    /// A request launched in `slot`: with `--cache-idle-slots`, every idle slot whose last
    /// request's KV is still its own gives it up to the prefix cache, so that only the running
    /// requests hold KV of their own. In this engine a finished request's KV already is a
    /// prefix-cache entry (kept within `--cache-ram`, evicted least recently used first, and
    /// reused by any prompt that starts the same way), so what the slot gives up is its claim on
    /// the entry: with `--kv-unified` it is cleared (llama-server clears the slot there too), and
    /// `POST /slots/{id}?action=save` on it then saves an empty slot. The debug lines carry
    /// llama-server's test tags, which its own test suite looks for (docs/server.md).
    fn cache_idle_slots(&self, active: &BTreeMap<u64, ActiveRequest>, launched: usize) {
        if !self.config.cache_idle_slots {
            return;
        }
        let mut entries = self.slot_entries.lock().unwrap_or_else(|e| e.into_inner());
        let idle: Vec<usize> = entries
            .keys()
            .copied()
            .filter(|&slot| slot != launched && !active.values().any(|r| r.slot == Some(slot)))
            .collect();
        for slot in idle {
            let entry = if self.config.kv_unified {
                entries.remove(&slot)
            } else {
                entries.get(&slot).copied()
            };
            tracing::debug!(
                slot,
                entry,
                cleared = self.config.kv_unified,
                "__TEST_TAG_CACHE_IDLE_SLOT__ idle slot {slot}: its KV is left to the prefix cache"
            );
        }
    }

    pub(crate) fn note_generated(&self, key: u64, generated: usize, text: &str) {
        if let Some(entry) = self.lock_active().get_mut(&key) {
            entry.generated = generated;
            entry.text.push_str(text);
        }
    }

    /// Stops tracking a request; the slot it held passes to the oldest request waiting for one,
    /// and keeps the request's prefix-cache entry as its cache.
    pub(crate) fn unregister(&self, key: u64) {
        let mut active = self.lock_active();
        let Some(request) = active.remove(&key) else {
            return;
        };
        if let Some(slot) = request.slot {
            self.slot_entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(slot, request.request_id);
            if let Some(next) = active
                .values_mut()
                .find(|r| r.slot.is_none() && r.pinned.is_none_or(|p| p == slot))
            {
                next.slot = Some(slot);
                self.cache_idle_slots(&active, slot);
            }
        }
    }

    /// llama-server's `id_slot` of tracked request `key`: the `/slots` id it holds, -1 while it
    /// waits for one.
    pub(crate) fn id_slot(&self, key: u64) -> i64 {
        self.lock_active()
            .get(&key)
            .and_then(|r| r.slot)
            .map_or(-1, |slot| slot as i64)
    }

    /// Whether a request holds `/slots` id `slot` now.
    pub(crate) fn slot_is_busy(&self, slot: usize) -> bool {
        self.lock_active().values().any(|r| r.slot == Some(slot))
    }

    /// The prefix-cache entry of slot `slot`'s last request (or of what was restored into it).
    pub(crate) fn slot_entry(&self, slot: usize) -> Option<u64> {
        self.slot_entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&slot)
            .copied()
    }

    pub(crate) fn set_slot_entry(&self, slot: usize, entry: Option<u64>) {
        let mut entries = self.slot_entries.lock().unwrap_or_else(|e| e.into_inner());
        match entry {
            Some(id) => entries.insert(slot, id),
            None => entries.remove(&slot),
        };
    }

    /// The model's fingerprint, which slot files carry ([`crate::fingerprint::model_fingerprint`]).
    pub(crate) fn model_fingerprint(&self) -> Result<String, ApiError> {
        if let Some(known) = self.fingerprint.get() {
            return Ok(known.clone());
        }
        let engine = self.engine()?;
        let dir = engine.info().dir.clone();
        let computed = crate::fingerprint::model_fingerprint(&dir).map_err(|e| {
            ApiError::Internal(format!(
                "fingerprinting the model in {}: {e}",
                dir.display()
            ))
        })?;
        // Keys and values computed under a control vector hold only under the same vector.
        let computed =
            crate::fingerprint::with_control_vector(&computed, engine.control_vector_digest());
        Ok(self.fingerprint.get_or_init(|| computed).clone())
    }
}

/// The lowest slot id below `parallel` no tracked request holds.
fn free_slot(active: &BTreeMap<u64, ActiveRequest>, parallel: usize) -> Option<usize> {
    (0..parallel).find(|&id| !active.values().any(|r| r.slot == Some(id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64) -> ActiveRequest {
        ActiveRequest {
            request_id: id,
            slot: None,
            prompt: vec![1],
            prompt_tokens: 1,
            budget: None,
            generated: 0,
            text: String::new(),
            params: serde_json::Value::Null,
            started: Instant::now(),
            pinned: None,
            completion_id: None,
        }
    }

    fn slots(state: &AppState) -> Vec<(u64, Option<usize>)> {
        state
            .active_requests()
            .iter()
            .map(|r| (r.request_id, r.slot))
            .collect()
    }

    #[test]
    fn slot_ids_are_stable_and_pass_in_order() {
        let state = AppState::new(ServerConfig {
            parallel: 2,
            ..ServerConfig::default()
        });
        let a = state.register(request(10));
        let b = state.register(request(11));
        let _c = state.register(request(12));
        let _d = state.register(request(13));
        assert_eq!(
            slots(&state),
            vec![(10, Some(0)), (11, Some(1)), (12, None), (13, None)]
        );
        // B ends: its slot goes to C, the oldest waiting; A keeps slot 0.
        state.unregister(b);
        assert_eq!(
            slots(&state),
            vec![(10, Some(0)), (12, Some(1)), (13, None)]
        );
        state.unregister(a);
        assert_eq!(slots(&state), vec![(12, Some(1)), (13, Some(0))]);
        // A new request takes the lowest free id.
        let all: Vec<_> = slots(&state);
        assert_eq!(all.len(), 2);
        let e = state.register(request(14));
        assert_eq!(slots(&state).last(), Some(&(14, None)));
        state.unregister(e);
    }
}
