//! The int8 layout cache: a model loaded from a GGUF file writes its int8 layout into the
//! prepared directory, and the next load maps that file (its arrays are the file's pages)
//! instead of writing the layout again: the same logits bit for bit, the file unmapped when the
//! model is gone, a damaged file rewritten, and the layout's bytes fingerprinted so that a
//! change to them cannot go unnoticed by the cache's version.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlxcel_core::{Activations, Kernels, LlamaModel, QuantizedWeight};
use mlxcel_model::Checkpoint;

use crate::int8_blocks::{mixes, prepared, six_token_logits as logits_of};

fn kernels() -> Kernels {
    Kernels {
        activations: Activations::Int8,
        ..Kernels::native()
    }
}

fn logits(ckpt: &Checkpoint) -> Vec<f32> {
    logits_of(&LlamaModel::load_with(ckpt, kernels()).unwrap())
}

/// The cache files in `dir` (any state: being written, pending, done).
fn cache_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("int8-layout-")
        })
        .collect();
    files.sort();
    files
}

/// Whether this process maps a file under `dir` (its current name, as /proc shows it).
fn mapped_under(dir: &Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let dir = dir.to_str().unwrap();
    maps.lines()
        .any(|l| l.contains(dir) && l.contains("int8-layout-"))
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// Waits (a few seconds at most) for the background rename of the pending file.
fn wait_for_done(dir: &Path) -> PathBuf {
    let start = Instant::now();
    loop {
        let files = cache_files(dir);
        let done: Vec<&PathBuf> = files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "bin"))
            .collect();
        let pending = files
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "pending"));
        if let ([one], false) = (done.as_slice(), pending) {
            return (*one).clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no .bin after 30 s: {files:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the ignored test `name` of this binary in a child process with `MLXCEL_LAYOUT_MEMORY`
/// set to `residence` (the variable is read at each load, so a test of one residence must not
/// share its process with loads of another).
fn in_child(name: &str, residence: &str) {
    let stderr = crate::run_ignored_test_in_child(name, &[("MLXCEL_LAYOUT_MEMORY", residence)]);
    // A move that stopped says so (and would leave part of the layout mapped).
    assert!(!stderr.contains("into memory"), "{stderr}");
}

#[test]
fn a_second_load_maps_the_layout_the_first_one_kept() {
    in_child(
        "layout_cache::child_a_second_load_maps_the_layout_the_first_one_kept",
        "map",
    );
}

/// Run by `a_second_load_maps_the_layout_the_first_one_kept` in a child process.
#[test]
#[ignore = "run as a child process with MLXCEL_LAYOUT_MEMORY=map"]
fn child_a_second_load_maps_the_layout_the_first_one_kept() {
    assert_eq!(std::env::var("MLXCEL_LAYOUT_MEMORY").as_deref(), Ok("map"));
    let dir = tempfile::tempdir().unwrap();
    for (seed, model) in mixes().iter().enumerate() {
        let (lazy, written) = prepared(model, dir.path(), seed as u64 + 40);
        let prepared_dir = lazy.dir().to_path_buf();
        assert!(cache_files(&prepared_dir).is_empty());
        // The first load writes the file (its arrays are the file's pages already).
        let first = LlamaModel::load_with(&lazy, kernels()).unwrap();
        let a = logits_of(&first);
        assert!(
            mapped_under(&prepared_dir),
            "mix {seed}: the first load maps the file it writes"
        );
        drop(first);
        assert!(
            !mapped_under(&prepared_dir),
            "mix {seed}: the file stays mapped after its model is gone"
        );
        let done = wait_for_done(&prepared_dir);
        // The second load maps it, and computes the same bits as both the first and the
        // general path's load from the converted checkpoint.
        let second = LlamaModel::load_with(&lazy, kernels()).unwrap();
        assert!(
            mapped_under(&prepared_dir),
            "mix {seed}: the second load maps {done:?}"
        );
        let b = logits_of(&second);
        drop(second);
        let c = logits(&written);
        assert!(a.iter().all(|v| v.is_finite()));
        assert!(
            same_bits(&a, &b),
            "mix {seed}: mapped logits differ from the first load's"
        );
        assert!(
            same_bits(&a, &c),
            "mix {seed}: logits differ from the general path's"
        );
        assert_eq!(cache_files(&prepared_dir), vec![done]);
    }
}

/// With `MLXCEL_LAYOUT_MEMORY=move`, a load that writes the layout and one that maps it both
/// move it into memory after the load: the logits are the same bits before and after the move,
/// and the second load's file is no longer mapped once its move is done.
#[test]
fn a_layout_moved_into_memory_gives_the_same_bits() {
    in_child(
        "layout_cache::child_a_layout_moved_into_memory_gives_the_same_bits",
        "move",
    );
}

/// Run by `a_layout_moved_into_memory_gives_the_same_bits` in a child process.
#[test]
#[ignore = "run as a child process with MLXCEL_LAYOUT_MEMORY=move"]
fn child_a_layout_moved_into_memory_gives_the_same_bits() {
    assert_eq!(std::env::var("MLXCEL_LAYOUT_MEMORY").as_deref(), Ok("move"));
    let moved = || mlxcel_core::wait_for_layout_moves(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    for (seed, model) in mixes().iter().enumerate() {
        let (lazy, written) = prepared(model, dir.path(), seed as u64 + 80);
        let prepared_dir = lazy.dir().to_path_buf();
        let first = LlamaModel::load_with(&lazy, kernels()).unwrap();
        let a = logits_of(&first);
        assert!(moved(), "mix {seed}: the first load's move is not done");
        assert!(
            same_bits(&a, &logits_of(&first)),
            "mix {seed}: the first load's logits changed with the move"
        );
        drop(first);
        wait_for_done(&prepared_dir);
        let second = LlamaModel::load_with(&lazy, kernels()).unwrap();
        let b = logits_of(&second);
        assert!(moved(), "mix {seed}: the second load's move is not done");
        assert!(
            !mapped_under(&prepared_dir),
            "mix {seed}: the file is still mapped after the move"
        );
        let c = logits_of(&second);
        drop(second);
        let general = logits(&written);
        assert!(a.iter().all(|v| v.is_finite()));
        for (what, x) in [("mapped", &b), ("moved", &c), ("general path's", &general)] {
            assert!(same_bits(&a, x), "mix {seed}: the {what} logits differ");
        }
    }
}

/// Files of another layout version, and temporaries of processes that are gone, are removed
/// by the next load; a temporary of a live process is left alone.
#[test]
fn stale_layout_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let [model, _, _] = mixes();
    let (lazy, _) = prepared(&model, dir.path(), 71);
    let prepared_dir = lazy.dir().to_path_buf();
    // pid 1 is always alive (and is not this process, whose own temporary this load writes).
    let live = 1;
    let names = [
        "int8-layout-v0.bin".to_owned(),
        "int8-layout-v0-layers-0-1-eh.pending".to_owned(),
        "int8-layout-v9999.bin".to_owned(),
        // No process has pid 0 in /proc.
        "int8-layout-v2.tmp.0".to_owned(),
        format!("int8-layout-v2.tmp.{live}"),
    ];
    for name in &names {
        std::fs::write(prepared_dir.join(name), b"old").unwrap();
    }
    let _ = logits(&lazy);
    let done = wait_for_done(&prepared_dir);
    let left: Vec<String> = cache_files(&prepared_dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        [
            done.file_name().unwrap().to_string_lossy().into_owned(),
            format!("int8-layout-v2.tmp.{live}")
        ]
    );
}

#[test]
fn a_damaged_layout_cache_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let [_, model, _] = mixes();
    let (lazy, _) = prepared(&model, dir.path(), 61);
    let prepared_dir = lazy.dir().to_path_buf();
    let a = logits(&lazy);
    let done = wait_for_done(&prepared_dir);
    let good = std::fs::read(&done).unwrap();
    // Cut short (no trailer), then garbage in the index, then another format's header: each
    // time the load is exact and the file is whole again afterwards.
    fn cut(b: &mut Vec<u8>) {
        b.truncate(b.len() / 2);
    }
    #[allow(clippy::ptr_arg)] // one signature for the three damages
    fn garbled_index(b: &mut Vec<u8>) {
        let n = b.len();
        b[n - 40..n - 24].fill(b'#');
    }
    #[allow(clippy::ptr_arg)]
    fn other_format(b: &mut Vec<u8>) {
        b[8] = b[8].wrapping_add(1);
    }
    let damages: [fn(&mut Vec<u8>); 3] = [cut, garbled_index, other_format];
    for (i, damage) in damages.iter().enumerate() {
        let mut bytes = good.clone();
        damage(&mut bytes);
        std::fs::write(&done, &bytes).unwrap();
        assert!(same_bits(&a, &logits(&lazy)), "damage {i}: logits differ");
        let again = wait_for_done(&prepared_dir);
        assert_eq!(
            std::fs::read(&again).unwrap().len(),
            good.len(),
            "damage {i}"
        );
        assert!(
            same_bits(&a, &logits(&lazy)),
            "damage {i}: mapped logits differ"
        );
    }
}

/// FNV-1a over the bytes of every weight the mixes write from their blocks: the layout the
/// cache holds. If this changes, so did the bytes a cached file holds for the same blocks, and
/// `VERSION` in src/layout_cache.rs must be raised with the new digest, or older files would
/// be mapped as if they held the new layout.
#[test]
fn the_cached_layouts_bytes_are_those_of_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    };
    for (seed, model) in mixes().iter().enumerate() {
        let (lazy, _) = prepared(model, dir.path(), seed as u64 + 80);
        for module in [
            "self_attn.q_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.down_proj",
        ] {
            let name = format!("model.layers.0.{module}.weight");
            let blocks = lazy.gguf_blocks(&name).unwrap();
            let w = QuantizedWeight::int8_from_gguf_blocks(&[blocks], 2)
                .unwrap()
                .unwrap_or_else(|| panic!("{name} takes the layout"));
            feed(&[w.bits as u8, w.group_size as u8]);
            for v in w.weight.to_vec_u32().unwrap() {
                feed(&v.to_le_bytes());
            }
            for a in [&w.scales, &w.biases] {
                for v in a.to_vec_f32().unwrap() {
                    feed(&v.to_le_bytes());
                }
            }
        }
    }
    assert_eq!(
        format!("{hash:016x}"),
        "51a2cd811f64bbf3",
        "the int8 layout's bytes changed: raise VERSION in crates/mlxcel-core/src/layout_cache.rs \
         and put the new digest here"
    );
}
