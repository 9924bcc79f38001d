//! The registry's scheduling with a stand-in for a loaded model.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::router::spec::Source;

fn spec(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.to_owned(),
        aliases: vec![format!("{name}-alias")],
        path: PathBuf::from(format!("/models/{name}")),
        args: Vec::new(),
        source: Source::ModelsDir,
        preset: None,
    }
}

/// A registry of models `a`, `b`, `c` whose loads take 20 ms (`c`: 400 ms), counting live models.
fn registry(max: usize, live: Arc<AtomicUsize>) -> Arc<Registry<Live>> {
    let loader: Loader<Live> = Arc::new(move |spec: &ModelSpec| {
        let slow = if spec.name == "c" { 400 } else { 20 };
        std::thread::sleep(Duration::from_millis(slow));
        if spec.name == "broken" {
            return Err("no such file".to_owned());
        }
        live.fetch_add(1, Ordering::SeqCst);
        Ok(Live(live.clone()))
    });
    Registry::new(
        vec![spec("a"), spec("b"), spec("c"), spec("broken")],
        max,
        loader,
    )
}

struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn status(registry: &Registry<Live>, name: &str) -> Status {
    registry
        .snapshot()
        .into_iter()
        .find(|s| s.spec.name == name)
        .map(|s| s.status)
        .unwrap()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_recently_used_idle_model_goes_and_its_memory_with_it() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(2, live.clone());
    drop(registry.acquire("a", true).await.unwrap());
    drop(registry.acquire("b-alias", true).await.unwrap());
    drop(registry.acquire("a", true).await.unwrap());
    assert_eq!(live.load(Ordering::SeqCst), 2);
    drop(registry.acquire("c", true).await.unwrap());
    settle().await;
    assert_eq!(status(&registry, "b"), Status::Unloaded);
    assert_eq!(status(&registry, "a"), Status::Loaded);
    assert_eq!(status(&registry, "c"), Status::Loaded);
    assert_eq!(
        live.load(Ordering::SeqCst),
        2,
        "the evicted model was dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_model_is_not_evicted_and_the_queue_is_fifo() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(1, live.clone());
    let busy = registry.acquire("a", true).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (r1, o1) = (registry.clone(), order.clone());
    let first = tokio::spawn(async move {
        let lease = r1.acquire("b", true).await.unwrap();
        o1.lock().unwrap().push("b");
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(lease);
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (r2, o2) = (registry.clone(), order.clone());
    let second = tokio::spawn(async move {
        let _lease = r2.acquire("c", true).await.unwrap();
        o2.lock().unwrap().push("c");
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status(&registry, "a"), Status::Loaded, "busy: not evicted");
    assert!(order.lock().unwrap().is_empty());
    drop(busy);
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(*order.lock().unwrap(), vec!["b", "c"]);
    settle().await;
    assert_eq!(status(&registry, "a"), Status::Unloaded);
    assert_eq!(live.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_for_one_model_share_one_eviction() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(2, live.clone());
    let busy = registry.acquire("a", true).await.unwrap();
    drop(registry.acquire("b", true).await.unwrap());
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let r = registry.clone();
            tokio::spawn(async move { drop(r.acquire("c", true).await.unwrap()) })
        })
        .collect();
    for w in waiters {
        w.await.unwrap();
    }
    drop(busy);
    settle().await;
    assert_eq!(status(&registry, "a"), Status::Loaded);
    assert_eq!(status(&registry, "b"), Status::Unloaded);
    assert_eq!(status(&registry, "c"), Status::Loaded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_costs_no_model_its_place() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(1, live.clone());
    let busy = registry.acquire("a", true).await.unwrap();
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), registry.acquire("b", true)).await;
    assert!(gave_up.is_err());
    drop(busy);
    settle().await;
    assert_eq!(status(&registry, "a"), Status::Loaded);
    assert_eq!(status(&registry, "b"), Status::Unloaded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_model() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(0, live);
    let err = registry.acquire("zzz", true).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "model 'zzz' not found; this server serves: a, b, broken, c"
    );
    assert_eq!(
        registry.acquire("a", false).await.err().unwrap(),
        AcquireError::NotLoaded
    );
    let err = registry.acquire("broken", true).await.err().unwrap();
    assert!(err.to_string().contains("no such file"), "{err}");
    assert!(registry.load("a").unwrap());
    assert!(!registry.load("a").unwrap());
    settle().await;
    assert_eq!(status(&registry, "a"), Status::Loaded);
    assert!(registry.unload("a").unwrap());
    assert!(!registry.unload("a").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loading_model_does_not_hold_up_a_loaded_one() {
    let live = Arc::new(AtomicUsize::new(0));
    let registry = registry(0, live);
    drop(registry.acquire("a", true).await.unwrap());
    assert!(registry.load("c").unwrap());
    let start = std::time::Instant::now();
    for _ in 0..10 {
        drop(registry.acquire("a", true).await.unwrap());
    }
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(status(&registry, "c"), Status::Loading);
    drop(registry.acquire("c", true).await.unwrap());
}
