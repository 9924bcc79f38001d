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
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated so far.
    pub generated: usize,
    /// When it was submitted.
    pub started: Instant,
}

/// Shared state of one server.
#[derive(Debug)]
pub struct AppState {
    config: ServerConfig,
    engine: OnceLock<Arc<Engine>>,
    metrics: Metrics,
    active: Mutex<BTreeMap<u64, ActiveRequest>>,
    next_key: AtomicU64,
}

impl AppState {
    /// State with no engine yet: `/health` answers 503 until [`AppState::set_engine`].
    pub fn new(config: ServerConfig) -> Self {
        Self {
            config,
            engine: OnceLock::new(),
            metrics: Metrics::default(),
            active: Mutex::new(BTreeMap::new()),
            next_key: AtomicU64::new(0),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Makes the server ready. A second engine is ignored.
    pub fn set_engine(&self, engine: Arc<Engine>) {
        let _ = self.engine.set(engine);
    }

    /// The engine, or 503 while it loads.
    pub fn engine(&self) -> Result<&Arc<Engine>, ApiError> {
        self.engine.get().ok_or(ApiError::Loading)
    }

    /// Whether the model has loaded.
    pub fn is_ready(&self) -> bool {
        self.engine.get().is_some()
    }

    /// The name clients see for the model.
    /// The `--alias`, else the model's own name (a converted GGUF's stem, or the directory's).
    pub fn model_name(&self, info: &ModelInfo) -> String {
        self.config
            .alias
            .clone()
            .unwrap_or_else(|| info.name.clone())
    }

    /// Refuses a model name this server does not serve; `None` (not given) is accepted.
    pub fn check_model(&self, info: &ModelInfo, requested: Option<&str>) -> Result<(), ApiError> {
        let Some(requested) = requested else {
            return Ok(());
        };
        let served = self.model_name(info);
        let known = requested == served
            || requested == info.name
            || self.config.model_arg.as_deref() == Some(requested)
            || requested == info.dir.to_string_lossy();
        if known {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound {
                model: requested.to_owned(),
                served,
            })
        }
    }

    /// The most positions (prompt + budget) one request may use: `--ctx-size` capped by the window.
    pub fn context_limit(&self, info: &ModelInfo) -> usize {
        self.config
            .ctx_size
            .map_or(info.window, |ctx| ctx.min(info.window))
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
        let engine = self.engine.get().map(|e| e.metrics());
        self.metrics
            .render(engine.as_ref(), self.active_requests().len())
    }

    /// Requests in flight, oldest first.
    pub fn active_requests(&self) -> Vec<ActiveRequest> {
        self.lock_active().values().cloned().collect()
    }

    fn lock_active(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ActiveRequest>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, request: ActiveRequest) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.lock_active().insert(key, request);
        key
    }

    pub(crate) fn note_generated(&self, key: u64, generated: usize) {
        if let Some(entry) = self.lock_active().get_mut(&key) {
            entry.generated = generated;
        }
    }

    pub(crate) fn unregister(&self, key: u64) {
        self.lock_active().remove(&key);
    }
}
