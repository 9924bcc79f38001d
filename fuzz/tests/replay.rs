//! Runs every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` through its target:
//! the seeds and every input a fuzz run found (crashes included, once fixed) stay passing in
//! `cargo test`. A panic names the file.

use std::path::Path;

#[test]
fn every_corpus_and_regression_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for &(name, target) in mlxcel_fuzz::TARGETS {
        for kind in ["corpus", "regressions"] {
            let dir = root.join(kind).join(name);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files.iter().filter(|f| f.is_file()) {
                let data = std::fs::read(file).unwrap();
                let outcome = std::panic::catch_unwind(|| target(&data));
                assert!(outcome.is_ok(), "{name}: {} panics", file.display());
                ran += 1;
            }
        }
    }
    // Every target has seeds.
    for &(name, _) in mlxcel_fuzz::TARGETS {
        let seeds = root.join("corpus").join(name);
        assert!(
            std::fs::read_dir(&seeds).is_ok_and(|mut d| d.next().is_some()),
            "no seeds in {}",
            seeds.display()
        );
    }
    eprintln!("replayed {ran} inputs");
}

#[test]
fn every_target_is_listed_once() {
    let mut names: Vec<&str> = mlxcel_fuzz::TARGETS.iter().map(|&(n, _)| n).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), mlxcel_fuzz::TARGETS.len());
}
