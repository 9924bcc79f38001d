//! One libFuzzer binary for every target of `mlxcel-fuzz`: `MLXCEL_FUZZ_TARGET` names the one to
//! run (scripts/fuzz sets it).

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn chosen() -> fn(&[u8]) {
    static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("MLXCEL_FUZZ_TARGET").unwrap_or_default();
        mlxcel_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = mlxcel_fuzz::TARGETS.iter().map(|&(n, _)| n).collect();
            eprintln!(
                "MLXCEL_FUZZ_TARGET=`{name}` names no target; one of: {}",
                names.join(", ")
            );
            std::process::exit(2)
        })
    })
}

fuzz_target!(|data: &[u8]| {
    chosen()(data);
});
