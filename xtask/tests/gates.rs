//! Each gate passes on the real tree and fails on a mutated copy of it, naming what is wrong.
//!
//! Modules: `versions` (the crate-version gate), `env_docs` (the environment-variable docs gate),
//! `layers` (the dependency-direction gate), `circles` (no import circles between files of a
//! crate), `compat` (the llama-server compatibility manifest).

use std::fs;
use std::path::Path;

use tempfile::TempDir;

/// Copies the workspace (without build outputs and VCS data) into a temporary directory.
fn copy_of_tree() -> TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    copy_dir(&xtask::workspace_root(), dir.path());
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if ["target", ".git", ".cache"]
            .iter()
            .any(|skip| name == *skip)
        {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else if path.is_file() {
            fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

fn edit(root: &Path, file: &str, change: impl FnOnce(String) -> String) {
    let path = root.join(file);
    let text = fs::read_to_string(&path).unwrap();
    let changed = change(text.clone());
    assert_ne!(text, changed, "the mutation of {file} changed nothing");
    fs::write(path, changed).unwrap();
}

mod versions {
    use super::*;

    #[test]
    fn real_tree_passes() {
        let summary = xtask::check_versions(&xtask::workspace_root()).unwrap();
        assert!(summary.contains("carry version"), "{summary}");
    }

    #[test]
    fn a_crate_with_its_own_version_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/capacity/Cargo.toml", |t| {
            t.replace("version.workspace = true", "version = \"9.9.9\"")
        });
        let err = xtask::check_versions(tree.path()).unwrap_err().to_string();
        assert!(err.contains("mlxcel-capacity"), "{err}");
        assert!(
            err.contains("does not carry the workspace version"),
            "{err}"
        );
    }

    #[test]
    fn a_declared_independent_crate_passes() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/capacity/Cargo.toml", |t| {
            t.replace("version.workspace = true", "version = \"9.9.9\"")
                + "\n[package.metadata.mlxcel]\nindependent-version = \"released on its own\"\n"
        });
        xtask::check_versions(tree.path()).unwrap();
    }

    #[test]
    fn an_empty_independence_reason_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/capacity/Cargo.toml", |t| {
            t.replace("version.workspace = true", "version = \"9.9.9\"")
                + "\n[package.metadata.mlxcel]\nindependent-version = \" \"\n"
        });
        assert!(xtask::check_versions(tree.path()).is_err());
    }

    #[test]
    fn a_stale_internal_dependency_version_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "Cargo.toml", |t| {
            t.replace(
                "mlxcel-capacity = { path = \"crates/capacity\", version = \"0.1.0\" }",
                "mlxcel-capacity = { path = \"crates/capacity\", version = \"0.0.9\" }",
            )
        });
        let err = xtask::check_versions(tree.path()).unwrap_err().to_string();
        assert!(err.contains("mlxcel-capacity asks for version"), "{err}");
    }
}

mod env_docs {
    use super::*;

    #[test]
    fn real_tree_passes() {
        xtask::check_env_docs(&xtask::workspace_root()).unwrap();
        let in_code = xtask::variables_in_code(&xtask::workspace_root()).unwrap();
        assert!(
            in_code.contains("MLXCEL_XLA_CONTEXT_CAPACITY"),
            "{in_code:?}"
        );
        assert!(
            in_code.contains("MLXCEL_XLA_CONTEXT_BUCKETS"),
            "{in_code:?}"
        );
    }

    #[test]
    fn an_undocumented_variable_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/capacity/src/env.rs", |t| {
            t + "\npub const SNEAKY: &str = \"MLXCEL_SNEAKY_KNOB\";\n"
        });
        let err = xtask::check_env_docs(tree.path()).unwrap_err().to_string();
        assert!(
            err.contains("MLXCEL_SNEAKY_KNOB is read by the code but has no row"),
            "{err}"
        );
    }

    #[test]
    fn a_removed_row_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "docs/environment.md", |t| {
            t.lines()
                .filter(|l| !l.starts_with("| `MLXCEL_XLA_CONTEXT_BUCKETS`"))
                .collect::<Vec<_>>()
                .join("\n")
        });
        let err = xtask::check_env_docs(tree.path()).unwrap_err().to_string();
        assert!(
            err.contains("MLXCEL_XLA_CONTEXT_BUCKETS is read by the code but has no row"),
            "{err}"
        );
    }

    #[test]
    fn a_documented_variable_nothing_reads_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "docs/environment.md", |t| {
            t + "| `MLXCEL_FORGOTTEN` | — | Once did something. |\n"
        });
        let err = xtask::check_env_docs(tree.path()).unwrap_err().to_string();
        assert!(
            err.contains(
                "MLXCEL_FORGOTTEN is documented in docs/environment.md but nothing reads it"
            ),
            "{err}"
        );
    }
}

mod layers {
    use super::*;

    #[test]
    fn real_tree_passes() {
        let summary = xtask::check_layers(&xtask::workspace_root()).unwrap();
        assert!(
            summary.contains("all pointing to lower layers"),
            "{summary}"
        );
    }

    #[test]
    fn a_dependency_pointing_up_fails_and_names_both_crates() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/model/Cargo.toml", |t| {
            t.replace(
                "[dependencies]\n",
                "[dependencies]\nmlxcel-engine.workspace = true\n",
            )
        });
        let err = xtask::check_layers(tree.path()).unwrap_err().to_string();
        assert!(
            err.contains("mlxcel-model (layer 0) depends on mlxcel-engine (layer 2)"),
            "{err}"
        );
    }

    #[test]
    fn a_backend_depending_on_its_sibling_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "crates/mlxcel-xla/Cargo.toml", |t| {
            t.replace(
                "[dev-dependencies]\n",
                "[dev-dependencies]\nmlxcel-core.workspace = true\n",
            )
        });
        let err = xtask::check_layers(tree.path()).unwrap_err().to_string();
        assert!(err.contains("depends on mlxcel-core (layer 1)"), "{err}");
    }

    #[test]
    fn a_crate_without_a_layer_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), "benches/Cargo.toml", |t| {
            t.replace("name = \"mlxcel-benches\"", "name = \"mlxcel-benchmarks\"")
        });
        let err = xtask::check_layers(tree.path()).unwrap_err().to_string();
        assert!(
            err.contains("mlxcel-benchmarks (benches) has no layer"),
            "{err}"
        );
    }
}

mod compat {
    use super::*;

    const MANIFEST: &str = "compat/llama-server/0c1e570/manifest.toml";
    const ACCEPTED: &str = "compat/llama-server/accepted-flags.txt";

    fn fails_with(tree: &TempDir, needle: &str) {
        let err = xtask::check_compat(tree.path()).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }

    #[test]
    fn real_tree_passes() {
        let summary = xtask::check_compat(&xtask::workspace_root()).unwrap();
        assert!(summary.contains("supported"), "{summary}");
    }

    #[test]
    fn a_flag_the_binary_accepts_but_the_manifest_lacks_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), ACCEPTED, |t| t + "--sneaky-flag\n");
        fails_with(&tree, "mlxcel-server accepts `--sneaky-flag`");
    }

    #[test]
    fn a_not_applicable_flag_the_binary_refuses_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), ACCEPTED, |t| t.replace("-ngl\n", ""));
        fails_with(
            &tree,
            "option `-ngl` is not_applicable but mlxcel-server does not accept `-ngl`",
        );
    }

    #[test]
    fn a_supported_entry_no_test_names_fails() {
        // A route marked supported that no test names and the router lacks (every route of the
        // pinned build is reviewed, so the entry is added here).
        let tree = copy_of_tree();
        edit(tree.path(), MANIFEST, |t| {
            t + "\n[[route]]\nkey = \"POST /unserved-route\"\nstate = \"supported\"\n"
        });
        fails_with(
            &tree,
            "route `POST /unserved-route` is supported but no test",
        );
        fails_with(&tree, "has no route `/unserved-route`");
    }

    #[test]
    fn an_unreviewed_or_unexplained_entry_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), MANIFEST, |t| {
            t.replacen(
                "state = \"deferred\"\nnote = ",
                "state = \"unreviewed\"\nnote = ",
                1,
            )
            .replacen(
                "state = \"by_design\"\nnote = ",
                "state = \"aliased\"\nnote = ",
                1,
            )
        });
        fails_with(&tree, "has state `unreviewed`");
        fails_with(&tree, "is aliased but names no `to`");
    }

    #[test]
    fn a_deferred_flag_the_binary_accepts_fails() {
        let tree = copy_of_tree();
        edit(tree.path(), ACCEPTED, |t| t + "--mmproj\n");
        fails_with(
            &tree,
            "option `-mm` is deferred but mlxcel-server accepts `--mmproj`",
        );
    }
}

/// Every program's build script is the engine's embedder snippet, so the one rpath mechanism
/// cannot drift into several (docs/mlx.md).
#[test]
fn program_build_scripts_are_the_embedder_snippet() {
    let root = xtask::workspace_root();
    let snippet =
        fs::read_to_string(root.join("crates/engine/snippets/embedder-build.rs")).unwrap();
    for crate_dir in [
        "crates/server",
        "bins/mlxcel",
        "bins/mlxcel-server",
        "benches",
    ] {
        let script = fs::read_to_string(root.join(crate_dir).join("build.rs")).unwrap();
        assert_eq!(
            script, snippet,
            "{crate_dir}/build.rs differs from the snippet"
        );
    }
}

mod circles {
    use super::*;

    /// A workspace of one crate `a` with the given `src/` files.
    fn crate_with(files: &[(&str, &str)]) -> TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        fs::write(
            dir.path().join("Cargo.toml"),
            "[workspace]\nmembers = [\"a\"]\n",
        )
        .unwrap();
        for (path, text) in files {
            let path = dir.path().join("a/src").join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        dir
    }

    fn circle_error(tree: &TempDir) -> String {
        xtask::check_circles(tree.path())
            .expect_err("a circle")
            .to_string()
    }

    const LIB: &str = "mod x;\nmod y;\npub use x::X;\npub use y::Y;\n";

    #[test]
    fn real_tree_passes() {
        let summary = xtask::check_circles(&xtask::workspace_root()).unwrap();
        assert!(summary.ends_with("no circles"), "{summary}");
    }

    #[test]
    fn one_way_arrows_pass() {
        let tree = crate_with(&[
            ("lib.rs", LIB),
            ("x.rs", "pub struct X;\n"),
            ("y.rs", "use crate::X;\npub struct Y(X);\n"),
        ]);
        let summary = xtask::check_circles(tree.path()).unwrap();
        assert!(summary.contains("1 crates, 3 files, 1 arrows"), "{summary}");
    }

    #[test]
    fn a_circle_through_a_crate_reexport_fails_and_names_both_files() {
        let tree = crate_with(&[
            ("lib.rs", LIB),
            ("x.rs", "pub struct X;\npub fn f(_: crate::Y) {}\n"),
            ("y.rs", "use crate::X;\npub struct Y(X);\n"),
        ]);
        let err = circle_error(&tree);
        assert!(err.contains("circle of 2 files"), "{err}");
        assert!(err.contains("a/src/x.rs -> a/src/y.rs: crate::Y"), "{err}");
        assert!(err.contains("a/src/y.rs -> a/src/x.rs: crate::X"), "{err}");
    }

    #[test]
    fn a_circle_through_super_and_a_module_alias_fails() {
        let tree = crate_with(&[
            ("lib.rs", "mod m;\n"),
            ("m/mod.rs", "mod a;\nmod b;\npub use a::A;\n"),
            (
                "m/a.rs",
                "use super::b;\npub struct A;\nfn g() { b::helper(); }\n",
            ),
            ("m/b.rs", "pub fn helper() {}\nfn h(_: super::A) {}\n"),
        ]);
        let err = circle_error(&tree);
        assert!(
            err.contains("a/src/m/a.rs -> a/src/m/b.rs: super::b"),
            "{err}"
        );
        assert!(
            err.contains("a/src/m/b.rs -> a/src/m/a.rs: super::A"),
            "{err}"
        );
    }

    #[test]
    fn a_circle_through_a_glob_reexport_fails() {
        let tree = crate_with(&[
            ("lib.rs", "mod x;\nmod y;\npub use x::*;\npub use y::*;\n"),
            ("x.rs", "use crate::{Y as Other};\npub struct X(Other);\n"),
            ("y.rs", "pub struct Y;\nfn f() -> crate::X { todo!() }\n"),
        ]);
        let err = circle_error(&tree);
        assert!(err.contains("a/src/x.rs -> a/src/y.rs"), "{err}");
        assert!(err.contains("a/src/y.rs -> a/src/x.rs"), "{err}");
    }

    #[test]
    fn tests_comments_and_strings_are_not_arrows() {
        let tree = crate_with(&[
            ("lib.rs", LIB),
            (
                "x.rs",
                "pub struct X;\n// crate::Y\n/* crate::Y */\nconst S: &str = \"crate::Y\";\n\
                 const R: &str = r#\"crate::Y\"#;\nconst C: char = '\\'';\n\
                 #[cfg(test)]\nmod tests {\n    use crate::Y;\n}\n",
            ),
            ("y.rs", "use crate::X;\npub struct Y(X);\n"),
        ]);
        xtask::check_circles(tree.path()).unwrap();
    }
}
