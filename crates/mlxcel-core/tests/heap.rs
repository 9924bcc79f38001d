//! `keep_freed_heap_memory`: after it, a step's worth of logits allocated, touched and freed over
//! and over faults its pages in once, not every time. Runs without the test harness so that it
//! allocates on the process's main thread, whose heap glibc trims (the harness runs each test on
//! a thread of its own, whose arena glibc shrinks less eagerly).

use mlxcel_core::HeapSettings;

/// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
    let after_name = stat.rsplit(')').next().expect("a stat line");
    after_name
        .split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .expect("minflt")
}

/// One verification pass's logits as the MLX backend hands them back: a 17 × 49,152 array
/// read into one vector per row, everything freed at the end.
fn one_pass(vocab: usize, rows: usize) -> f32 {
    let array = vec![1.5f32; rows * vocab];
    let rows: Vec<Vec<f32>> = array.chunks_exact(vocab).map(<[f32]>::to_vec).collect();
    let sum = rows.iter().map(|r| r[vocab / 2]).sum::<f32>() + array[7];
    drop(rows);
    drop(array);
    std::hint::black_box(sum)
}

fn main() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        println!("heap: not glibc on Linux; nothing to check");
        return;
    }
    match mlxcel_core::keep_freed_heap_memory() {
        HeapSettings::Set {
            mmap_threshold,
            trim_threshold,
        } => {
            assert_eq!(mmap_threshold, mlxcel_core::HEAP_MMAP_THRESHOLD);
            assert_eq!(trim_threshold, mlxcel_core::HEAP_TRIM_THRESHOLD);
        }
        HeapSettings::Environment(variable) => {
            println!("heap: {variable} configures malloc here; nothing to check");
            return;
        }
        HeapSettings::Unavailable => panic!("glibc refused the heap thresholds"),
    }
    let (vocab, rows, rounds) = (49_152usize, 17usize, 20);
    let pages = (2 * vocab * rows * 4).div_ceil(4096) as u64;
    let faults: Vec<u64> = (0..rounds)
        .map(|_| {
            let before = minor_faults();
            one_pass(vocab, rows);
            minor_faults() - before
        })
        .collect();
    // The first rounds map the pages; later ones reuse them (glibc's defaults: ~1,600 a round).
    let later: u64 = faults[2..].iter().sum();
    assert!(
        later < pages / 10,
        "rounds 3-{rounds} faulted {later} pages in, {pages} touched a round: {faults:?}"
    );
    println!("heap: ok ({faults:?} page faults a round, {pages} pages touched)");
}
