//! Which models are loaded, and which loads next: the router's bookkeeping, generic over what a
//! loaded model is (`C`, the server's per-model state) so that it can be tested without one.
//!
//! - At most `max` models are loaded or loading (0: no limit). A model that must load when the
//!   limit is reached waits in one FIFO queue; a model is queued once however many requests wait
//!   for it (they share one load, so one eviction).
//! - When the queue's first model needs a place, the least recently used *idle* model goes: one
//!   that serves no request ([`Lease`]) and that no request waits to use. A busy model is never
//!   evicted; the queue waits until one is idle.
//! - A request that leaves while its model waits in the queue takes the model out of the queue
//!   when it was the last to want it, so it costs no running model its place.
//! - Loads run on blocking threads, so other models keep serving while one loads; every status
//!   change is an event for `GET /models/sse`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, broadcast, watch};

use crate::router::spec::ModelSpec;

/// A model's status, as `/models` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Unloaded,
    Loading,
    Loaded,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unloaded => "unloaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
        }
    }
}

/// Why a model could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    #[error("model '{name}' not found; this server serves: {known}")]
    NotFound { name: String, known: String },
    #[error("model is not loaded")]
    NotLoaded,
    #[error("model '{name}' failed to load: {reason}")]
    LoadFailed { name: String, reason: String },
}

/// Loads a model's state from its spec (on a blocking thread).
pub type Loader<C> = Arc<dyn Fn(&ModelSpec) -> Result<C, String> + Send + Sync>;

/// Reads the list of models again (the models directory and the preset file).
pub type Rescan = Box<dyn Fn() -> Result<Vec<ModelSpec>, String> + Send + Sync>;

/// One model and where it stands.
struct Entry<C> {
    spec: ModelSpec,
    status: Status,
    loaded: Option<Arc<C>>,
    /// Requests it serves now.
    busy: usize,
    /// Requests waiting to use it (queued for a load, or woken and about to take it).
    waiting: usize,
    /// Loads asked with `POST /models/load` not yet started: they keep the queue entry alone.
    explicit: bool,
    /// When it last served (a tick of the registry's clock), for least-recently-used eviction.
    last_used: u64,
    loads: u64,
    error: Option<String>,
}

struct Inner<C> {
    entries: BTreeMap<String, Entry<C>>,
    queue: VecDeque<String>,
    clock: u64,
}

/// What a listing shows of one model.
#[derive(Debug, Clone)]
pub struct Snapshot<C> {
    pub spec: ModelSpec,
    pub status: Status,
    pub loaded: Option<Arc<C>>,
    pub busy: usize,
    pub error: Option<String>,
}

/// The models and their loads.
pub struct Registry<C> {
    inner: Mutex<Inner<C>>,
    changed: Notify,
    events: broadcast::Sender<String>,
    loader: Loader<C>,
    max: usize,
    autoload: bool,
    rescan: Option<Rescan>,
    /// `true` once the server shuts down: open status streams end.
    closing: watch::Sender<bool>,
    runtime: tokio::runtime::Handle,
}

impl<C> std::fmt::Debug for Registry<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("max", &self.max).finish()
    }
}

impl<C: Send + Sync + 'static> Registry<C> {
    /// A registry of `specs`, none loaded; must be built inside a tokio runtime.
    pub fn new(specs: Vec<ModelSpec>, max: usize, loader: Loader<C>) -> Arc<Self> {
        Self::with_settings(specs, max, true, None, loader)
    }

    /// A registry whose requests load the models they name when `autoload`, and whose listing
    /// can be read again with `rescan`.
    pub fn with_settings(
        specs: Vec<ModelSpec>,
        max: usize,
        autoload: bool,
        rescan: Option<Rescan>,
        loader: Loader<C>,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(256);
        let registry = Arc::new(Self {
            inner: Mutex::new(Inner {
                entries: BTreeMap::new(),
                queue: VecDeque::new(),
                clock: 0,
            }),
            changed: Notify::new(),
            events,
            loader,
            max,
            autoload,
            rescan,
            closing: watch::Sender::new(false),
            runtime: tokio::runtime::Handle::current(),
        });
        registry.replace_specs(specs);
        registry
    }

    /// `--models-max` (0: no limit).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether requests load the models they name (`--models-autoload`).
    pub fn autoload(&self) -> bool {
        self.autoload
    }

    /// The list of models as the sources give it now.
    pub fn rescan(&self) -> Result<Vec<ModelSpec>, String> {
        match &self.rescan {
            Some(rescan) => rescan(),
            None => Ok(self.snapshot().into_iter().map(|s| s.spec).collect()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<C>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the status streams (the server shuts down: they would hold their connections open).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Changes to `true` when the server shuts down.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Status events (JSON text), from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.events.subscribe()
    }

    fn emit(&self, name: &str, status: Status, error: Option<&str>) {
        let mut data = serde_json::json!({ "status": status.as_str() });
        if let Some(error) = error {
            data["failed"] = true.into();
            data["error"] = error.into();
        }
        let event = serde_json::json!({ "model": name, "event": "status_change", "data": data });
        let _ = self.events.send(event.to_string());
    }

    /// Every model, by name.
    pub fn snapshot(&self) -> Vec<Snapshot<C>> {
        self.lock()
            .entries
            .values()
            .map(|e| Snapshot {
                spec: e.spec.clone(),
                status: e.status,
                loaded: e.loaded.clone(),
                busy: e.busy,
                error: e.error.clone(),
            })
            .collect()
    }

    /// The canonical name of `name` (a model's name or one of its aliases).
    pub fn resolve(&self, name: &str) -> Result<String, AcquireError> {
        let inner = self.lock();
        resolve(&inner, name)
    }

    /// Takes up a new list of models (`GET /models?reload=1`): new ones are added, gone ones
    /// unloaded and dropped, the others keep their state.
    pub fn replace_specs(self: &Arc<Self>, specs: Vec<ModelSpec>) {
        let mut dropped = Vec::new();
        {
            let mut inner = self.lock();
            let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
            let gone: Vec<String> = inner
                .entries
                .keys()
                .filter(|n| !names.contains(n))
                .cloned()
                .collect();
            for name in gone {
                if let Some(entry) = inner.entries.remove(&name) {
                    dropped.extend(entry.loaded);
                }
                inner.queue.retain(|q| *q != name);
            }
            for spec in specs {
                match inner.entries.get_mut(&spec.name) {
                    Some(entry) => entry.spec = spec,
                    None => {
                        inner.entries.insert(
                            spec.name.clone(),
                            Entry {
                                spec,
                                status: Status::Unloaded,
                                loaded: None,
                                busy: 0,
                                waiting: 0,
                                explicit: false,
                                last_used: 0,
                                loads: 0,
                                error: None,
                            },
                        );
                    }
                }
            }
            self.schedule(&mut inner);
        }
        self.release(dropped);
    }

    /// `POST /models/load`: queues a load of `name` (`false` when it is already loaded or loading).
    pub fn load(self: &Arc<Self>, name: &str) -> Result<bool, AcquireError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let name = resolve(inner, name)?;
        let Some(entry) = inner.entries.get_mut(&name) else {
            return Ok(false);
        };
        if entry.status != Status::Unloaded {
            return Ok(false);
        }
        entry.explicit = true;
        if !inner.queue.contains(&name) {
            inner.queue.push_back(name);
        }
        self.schedule(inner);
        Ok(true)
    }

    /// `POST /models/unload`: unloads `name` now (requests it serves finish on the state they
    /// hold; its memory goes when the last ends). `false` when it is not loaded or loading.
    pub fn unload(self: &Arc<Self>, name: &str) -> Result<bool, AcquireError> {
        let dropped;
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let name = resolve(inner, name)?;
            let Some(entry) = inner.entries.get_mut(&name) else {
                return Ok(false);
            };
            if entry.status == Status::Unloaded {
                inner.queue.retain(|q| *q != name);
                return Ok(false);
            }
            dropped = self.unload_locked(inner, &name);
            self.schedule(inner);
        }
        self.release(dropped.into_iter().collect());
        self.changed.notify_waiters();
        Ok(true)
    }

    /// The loaded state of `name`, marked busy until the lease drops; loads it first (waiting in
    /// the queue when the limit is reached) when `autoload`, else refuses with `NotLoaded`.
    pub async fn acquire(
        self: &Arc<Self>,
        name: &str,
        autoload: bool,
    ) -> Result<Lease<C>, AcquireError> {
        let name = self.resolve(name)?;
        let mut ticket: Option<Ticket<C>> = None;
        let mut loads_seen = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut guard = self.lock();
                let inner = &mut *guard;
                inner.clock += 1;
                let clock = inner.clock;
                let Some(entry) = inner.entries.get_mut(&name) else {
                    let known = known(inner);
                    return Err(AcquireError::NotFound { name, known });
                };
                if let (Status::Loaded, Some(state)) = (entry.status, &entry.loaded) {
                    let state = state.clone();
                    entry.busy += 1;
                    entry.last_used = clock;
                    return Ok(Lease {
                        registry: self.clone(),
                        name,
                        state,
                    });
                }
                if entry.status == Status::Unloaded && !autoload {
                    return Err(AcquireError::NotLoaded);
                }
                if ticket.is_none() {
                    entry.waiting += 1;
                    ticket = Some(Ticket {
                        registry: self.clone(),
                        name: name.clone(),
                    });
                }
                if entry.status == Status::Unloaded {
                    if let (Some(seen), Some(reason)) = (loads_seen, &entry.error)
                        && entry.loads > seen
                    {
                        return Err(AcquireError::LoadFailed {
                            name,
                            reason: reason.clone(),
                        });
                    }
                    loads_seen = Some(entry.loads);
                    if !inner.queue.contains(&name) {
                        inner.queue.push_back(name.clone());
                    }
                    self.schedule(inner);
                } else if loads_seen.is_none() {
                    loads_seen = Some(entry.loads);
                }
            }
            notified.await;
        }
    }

    /// Starts what the queue allows: its first model loads when there is a place, or when an
    /// idle model can give one up.
    fn schedule(self: &Arc<Self>, inner: &mut Inner<C>) {
        let mut dropped = Vec::new();
        while let Some(front) = inner.queue.front().cloned() {
            let startable = inner
                .entries
                .get(&front)
                .is_some_and(|e| e.status == Status::Unloaded);
            if !startable {
                inner.queue.pop_front();
                continue;
            }
            let active = inner
                .entries
                .values()
                .filter(|e| e.status != Status::Unloaded)
                .count();
            if self.max == 0 || active < self.max {
                inner.queue.pop_front();
                self.start_load(inner, &front);
                continue;
            }
            let victim = inner
                .entries
                .iter()
                .filter(|(_, e)| e.status == Status::Loaded && e.busy == 0 && e.waiting == 0)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(n, _)| n.clone());
            match victim {
                Some(victim) => {
                    tracing::info!(model = %victim, next = %front, "unloading the least recently used idle model to load another");
                    dropped.extend(self.unload_locked(inner, &victim));
                }
                None => break,
            }
        }
        self.release(dropped);
    }

    fn unload_locked(&self, inner: &mut Inner<C>, name: &str) -> Option<Arc<C>> {
        let entry = inner.entries.get_mut(name)?;
        entry.status = Status::Unloaded;
        entry.error = None;
        let dropped = entry.loaded.take();
        self.emit(name, Status::Unloaded, None);
        tracing::info!(model = %name, "model unloaded");
        dropped
    }

    /// Drops unloaded states on a blocking thread: an engine joins its threads as it drops.
    fn release(&self, dropped: Vec<Arc<C>>) {
        if !dropped.is_empty() {
            self.runtime.spawn_blocking(move || drop(dropped));
        }
    }

    fn start_load(self: &Arc<Self>, inner: &mut Inner<C>, name: &str) {
        let Some(entry) = inner.entries.get_mut(name) else {
            return;
        };
        entry.status = Status::Loading;
        entry.explicit = false;
        entry.loads += 1;
        entry.error = None;
        let load_number = entry.loads;
        let spec = entry.spec.clone();
        self.emit(name, Status::Loading, None);
        tracing::info!(model = %name, path = %spec.path.display(), "loading model");
        let registry = self.clone();
        let loader = self.loader.clone();
        self.runtime.spawn_blocking(move || {
            let result = loader(&spec);
            registry.finish_load(&spec.name, load_number, result);
        });
    }

    fn finish_load(self: &Arc<Self>, name: &str, load_number: u64, result: Result<C, String>) {
        let mut stale = None;
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let clock = inner.clock;
            match inner.entries.get_mut(name) {
                Some(entry) if entry.status == Status::Loading && entry.loads == load_number => {
                    match result {
                        Ok(state) => {
                            entry.status = Status::Loaded;
                            entry.loaded = Some(Arc::new(state));
                            entry.last_used = clock;
                            self.emit(name, Status::Loaded, None);
                            tracing::info!(model = %name, "model loaded");
                        }
                        Err(reason) => {
                            tracing::error!(model = %name, %reason, "model failed to load");
                            entry.status = Status::Unloaded;
                            self.emit(name, Status::Unloaded, Some(&reason));
                            entry.error = Some(reason);
                        }
                    }
                }
                // Unloaded (or removed) while it loaded: what loaded is not kept.
                _ => stale = result.ok(),
            }
            self.schedule(&mut inner);
        }
        drop(stale);
        self.changed.notify_waiters();
    }
}

fn resolve<C>(inner: &Inner<C>, name: &str) -> Result<String, AcquireError> {
    if inner.entries.contains_key(name) {
        return Ok(name.to_owned());
    }
    inner
        .entries
        .values()
        .find(|e| e.spec.aliases.iter().any(|a| a == name))
        .map(|e| e.spec.name.clone())
        .ok_or_else(|| AcquireError::NotFound {
            name: name.to_owned(),
            known: known(inner),
        })
}

fn known<C>(inner: &Inner<C>) -> String {
    let names: Vec<&str> = inner.entries.keys().map(String::as_str).collect();
    if names.is_empty() {
        "no models".to_owned()
    } else {
        names.join(", ")
    }
}

/// A request's claim on a loaded model: the model is busy (never evicted) until it drops.
pub struct Lease<C: Send + Sync + 'static> {
    registry: Arc<Registry<C>>,
    name: String,
    state: Arc<C>,
}

impl<C: Send + Sync + 'static> std::fmt::Debug for Lease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("name", &self.name).finish()
    }
}

impl<C: Send + Sync + 'static> Lease<C> {
    /// The model's state.
    pub fn state(&self) -> &Arc<C> {
        &self.state
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<C: Send + Sync + 'static> Drop for Lease<C> {
    fn drop(&mut self) {
        {
            let mut inner = self.registry.lock();
            inner.clock += 1;
            let clock = inner.clock;
            if let Some(entry) = inner.entries.get_mut(&self.name) {
                entry.busy = entry.busy.saturating_sub(1);
                entry.last_used = clock;
            }
            self.registry.schedule(&mut inner);
        }
        self.registry.changed.notify_waiters();
    }
}

/// A request waiting for a model: while it waits the model is not evicted; when the last
/// waiter leaves before the model started loading, the model leaves the queue.
struct Ticket<C: Send + Sync + 'static> {
    registry: Arc<Registry<C>>,
    name: String,
}

impl<C: Send + Sync + 'static> Drop for Ticket<C> {
    fn drop(&mut self) {
        {
            let mut inner = self.registry.lock();
            let Some(entry) = inner.entries.get_mut(&self.name) else {
                return;
            };
            entry.waiting = entry.waiting.saturating_sub(1);
            let abandoned =
                entry.waiting == 0 && !entry.explicit && entry.status == Status::Unloaded;
            if abandoned {
                let name = self.name.clone();
                inner.queue.retain(|q| *q != name);
            }
            self.registry.schedule(&mut inner);
        }
        self.registry.changed.notify_waiters();
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
