//! Finds MLX (from `MLX_DIR`, or the pinned wheel provisioned into the mlxcel cache), compiles
//! the C++ shims in `cpp/` against it, links `libmlx.so`, and publishes its directory.
//!
//! Because this package declares `links = "mlx"`, `cargo::metadata=libdir=...` reaches the
//! build scripts of direct dependents as `DEP_MLX_LIBDIR`; they turn it into an rpath for
//! their own binaries (see docs/mlx.md). `cargo::rustc-link-arg` below only covers this
//! package's own tests, examples and benches.

#[path = "src/pin.rs"]
#[allow(dead_code)]
mod pin;

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    // The script ships inside this crate, so a packaged copy of it builds too.
    let script = manifest_dir.join("provision-mlx");
    for path in ["mlx.pin", "cpp", "src/sys.rs", "src/pin.rs"] {
        println!("cargo::rerun-if-changed={path}");
    }
    println!("cargo::rerun-if-changed={}", script.display());
    for var in [
        "MLX_DIR",
        "MLXCEL_CACHE_DIR",
        "XDG_CACHE_HOME",
        "HOME",
        "MLXCEL_PYTHON",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }

    let pin = pin::MlxPin::parse(pin::PIN_TEXT).unwrap_or_else(|e| panic!("{e}"));
    let (prefix, source) = match env::var_os("MLX_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => (mlx_dir_prefix(Path::new(&dir)), "MLX_DIR"),
        None => (provision(&script, &pin).join("mlx"), "cache"),
    };
    let include = prefix.join("include");
    let libdir = prefix.join("lib");
    for required in [include.join("mlx/mlx.h"), libdir.join("libmlx.so")] {
        if !required.exists() {
            panic!(
                "MLX install at {} ({source}) lacks {}; point MLX_DIR at an MLX prefix \
                 (include/ and lib/) or unset it to use the pinned wheel",
                prefix.display(),
                required.display()
            );
        }
    }

    cxx_build::bridge("src/sys.rs")
        .files([
            "cpp/array.cc",
            "cpp/ops.cc",
            "cpp/fast.cc",
            "cpp/distributed.cc",
            "cpp/kernels/primitive.cc",
            "cpp/kernels/qmatmul.cc",
            "cpp/kernels/qmatmul_scalar.cc",
            "cpp/kernels/qmatmul_avx2.cc",
            "cpp/kernels/qmatmul_avx512.cc",
            "cpp/kernels/qmatmul_int8.cc",
            "cpp/kernels/qmatmul_int8_avx2.cc",
            "cpp/kernels/qmatmul_int8_avx512.cc",
            "cpp/kernels/qmatmul_f32x_avx512.cc",
            "cpp/kernels/pool.cc",
            "cpp/kernels/rowops.cc",
            "cpp/kernels/rowops_avx512.cc",
            "cpp/kernels/layer.cc",
            "cpp/kernels/lora.cc",
            "cpp/kernels/lora_plan.cc",
            "cpp/kernels/moe.cc",
            "cpp/kernels/moe_node.cc",
            "cpp/kernels/attention.cc",
            "cpp/kernels/attention_scalar.cc",
            "cpp/kernels/attention_avx2.cc",
            "cpp/kernels/attention_avx512.cc",
            "cpp/kernels/delta_rule.cc",
            "cpp/kernels/delta_rule_scalar.cc",
            "cpp/kernels/delta_rule_avx2.cc",
            "cpp/kernels/delta_rule_avx512.cc",
        ])
        // No -march: the SIMD kernels carry function-level target attributes and are chosen at
        // run time (cpp/kernels/dispatch.h), so one build runs on any x86-64.
        .opt_level(3)
        // Only `#pragma omp simd` (reductions the vectorizer may reassociate); no OpenMP runtime.
        .flag_if_supported("-fopenmp-simd")
        .include(&include)
        .std("c++20")
        // The wheel is built with the default (cxx11) libstdc++ ABI; say so explicitly in
        // case the environment's CXXFLAGS asks for the old one.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag_if_supported("-Wno-unused-parameter")
        // GCC 12's own AVX-512 intrinsic headers trip these warnings (their `__Y = __Y` idiom).
        .flag_if_supported("-Wno-maybe-uninitialized")
        .flag_if_supported("-Wno-uninitialized")
        .compile("mlxcel-core-shim");

    // Deleting the cache (or the MLX_DIR install) re-runs this script, which re-provisions,
    // instead of leaving binaries with an rpath to nothing.
    println!(
        "cargo::rerun-if-changed={}",
        libdir.join("libmlx.so").display()
    );
    println!("cargo::rustc-link-search=native={}", libdir.display());
    println!("cargo::rustc-link-lib=dylib=mlx");
    println!("cargo::rustc-link-arg=-Wl,-rpath,{}", libdir.display());
    println!("cargo::metadata=libdir={}", libdir.display());
    println!("cargo::metadata=include={}", include.display());
    println!(
        "cargo::rustc-env=MLXCORE_BUILD_MLX_LIBDIR={}",
        libdir.display()
    );
    println!("cargo::rustc-env=MLXCORE_BUILD_MLX_SOURCE={source}");
}

/// Accepts an install prefix (`include/`, `lib/`) or a wheel root (`mlx/include`, ...).
fn mlx_dir_prefix(dir: &Path) -> PathBuf {
    if dir.join("include/mlx/mlx.h").exists() {
        dir.to_path_buf()
    } else {
        dir.join("mlx")
    }
}

/// Runs provision-mlx (a no-op when the cache is complete) and returns the install
/// root it prints on its last line of stdout.
fn provision(script: &Path, pin: &pin::MlxPin) -> PathBuf {
    let output = Command::new("bash")
        .arg(script)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} to provision MLX {}: {e}",
                script.display(),
                pin.version
            )
        });
    if !output.status.success() {
        panic!(
            "{} failed ({}); set MLX_DIR to an MLX install to skip provisioning.\n{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let root = stdout.lines().last().unwrap_or_default().trim();
    if root.is_empty() {
        panic!("{} printed no install directory", script.display());
    }
    PathBuf::from(root)
}
