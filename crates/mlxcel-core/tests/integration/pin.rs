//! The MLX pin is read identically by build.rs, provision-mlx (in this crate), the linked library
//! and docs/mlx.md.

use std::path::PathBuf;
use std::process::Command;

use mlxcel_core::pin::MlxPin;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn provision_script(arg: &str) -> String {
    let out = Command::new("bash")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("provision-mlx"))
        .arg(arg)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn provisioning_script_reads_the_same_pin_as_build_rs() {
    assert_eq!(
        provision_script("--print-pin"),
        MlxPin::embedded().to_key_value_lines()
    );
}

#[test]
fn linked_mlx_is_the_pinned_release() {
    let info = mlxcel_core::mlx_build_info();
    if info.from_pinned_cache {
        assert_eq!(mlxcel_core::mlx_version(), MlxPin::embedded().version);
        let root = provision_script("--print-dir");
        assert_eq!(
            PathBuf::from(root.trim()).join("mlx/lib"),
            PathBuf::from(info.libdir)
        );
    } else {
        eprintln!("built against MLX_DIR ({}); pin not enforced", info.libdir);
    }
}

#[test]
fn docs_name_the_pinned_release() {
    let docs = std::fs::read_to_string(repo_root().join("docs/mlx.md")).expect("docs/mlx.md");
    let pin = MlxPin::embedded();
    assert!(
        docs.contains(&format!("{}=={}", pin.package, pin.version)),
        "docs/mlx.md is stale"
    );
}

#[test]
fn pin_parser_rejects_malformed_pins() {
    let good = mlxcel_core::pin::PIN_TEXT;
    assert!(MlxPin::parse(good).is_ok());
    assert!(MlxPin::parse(&good.replace("sha256 =", "# sha256 =")).is_err());
    let pin = MlxPin::embedded();
    assert!(MlxPin::parse(&good.replace(&pin.sha256, "abc")).is_err());
    assert!(
        MlxPin::parse(&good.replace(&format!("version = {}", pin.version), "version = 9.9.9"))
            .is_err()
    );
}
