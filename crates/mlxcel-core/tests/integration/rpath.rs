//! Binaries find libmlx.so through an rpath, never LD_LIBRARY_PATH: this package's own test
//! and example binaries, and those of a dependent crate using snippets/dependent-build.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn libdir() -> &'static str {
    mlxcel_core::mlx_build_info().libdir
}

fn assert_has_rpath(binary: &Path) {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(binary)
        .output()
        .expect("readelf runs");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let has = dynamic
        .lines()
        .filter(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)"))
        .any(|l| l.contains(libdir()));
    assert!(
        has,
        "{} has no rpath to {}:\n{dynamic}",
        binary.display(),
        libdir()
    );
}

fn run_without_ld_library_path(binary: &Path, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("binary starts");
    assert!(
        out.status.success(),
        "{} failed without LD_LIBRARY_PATH: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn test_binary_runs_without_ld_library_path() {
    let me = std::env::current_exe().expect("test binary path");
    assert_has_rpath(&me);
    let out = run_without_ld_library_path(&me, &["--ignored", "--exact", "rpath::child_uses_mlx"]);
    assert!(out.contains("1 passed"), "{out}");
}

/// Run by `test_binary_runs_without_ld_library_path` in a child process.
#[test]
#[ignore = "run as a child process by test_binary_runs_without_ld_library_path"]
fn child_uses_mlx() {
    assert!(std::env::var_os("LD_LIBRARY_PATH").is_none());
    let a = mlxcel_core::Array::from_f32(&[3.0], &[1]).unwrap();
    assert_eq!(a.multiply(&a).unwrap().to_vec_f32().unwrap(), [9.0]);
}

#[test]
fn example_binary_runs_without_ld_library_path() {
    // `cargo test` builds examples next to deps/: target/<profile>/examples/.
    let me = std::env::current_exe().expect("test binary path");
    let example = me
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("examples/rpath_probe"));
    match example.filter(|p| p.exists()) {
        Some(example) => {
            assert_has_rpath(&example);
            let out = run_without_ld_library_path(&example, &[]);
            assert!(out.contains("[2.0, 4.0]"), "{out}");
        }
        None => eprintln!("examples not built in this invocation; skipped"),
    }
}

/// Builds a throwaway crate that depends on mlxcel-core and uses the documented build.rs
/// snippet, then runs its binary without LD_LIBRARY_PATH. The first run compiles
/// mlxcel-core again (about a minute on two cores); later runs are incremental.
#[test]
fn dependent_crate_binary_runs_without_ld_library_path() {
    let core = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixture = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mlx-dependent-fixture");
    std::fs::create_dir_all(fixture.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"mlx-dependent-fixture\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n[workspace]\n\n[dependencies]\nmlxcel-core = {{ path = {:?} }}\n",
        core.display().to_string()
    );
    let write = |name: &str, text: &str| {
        let path = fixture.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(path, text).unwrap();
        }
    };
    write("Cargo.toml", &manifest);
    write(
        "build.rs",
        include_str!("../../snippets/dependent-build.rs"),
    );
    write("src/main.rs", include_str!("../../examples/rpath_probe.rs"));
    // Reuse the workspace's resolution so the build is offline and matches ours.
    if !fixture.join("Cargo.lock").exists() {
        std::fs::copy(core.join("../../Cargo.lock"), fixture.join("Cargo.lock")).unwrap();
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(fixture.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(fixture.join("target"))
        .env_remove("LD_LIBRARY_PATH")
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the dependent fixture failed");
    let binary = fixture.join("target/debug/mlx-dependent-fixture");
    assert_has_rpath(&binary);
    let out = run_without_ld_library_path(&binary, &[]);
    assert!(out.contains("[2.0, 4.0]"), "{out}");
}
