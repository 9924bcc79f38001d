//! Project gates that cargo does not provide.
//!
//! - [`check_versions`]: every workspace crate carries the workspace version, unless its manifest
//!   declares itself independent with a reason (`[package.metadata.mlxcel] independent-version`),
//!   and every internal dependency in `[workspace.dependencies]` asks for that version.
//! - [`check_env_docs`]: every `MLXCEL_*` variable the code reads is documented in
//!   `docs/environment.md`, and every documented one is read somewhere.
//!
//! - [`check_layers`]: workspace crates depend only on crates of lower layers ([`LAYERS`]), and
//!   inside each crate no two files depend on each other ([`check_circles`], counting arrows
//!   that go through `crate::` re-exports).
//! - [`check_compat`]: the llama-server compatibility manifest (`compat/llama-server/`) is
//!   curated, lists every spelling mlxcel-server accepts, and each supported entry has a test.
//!
//! Each takes the workspace root as a value so that tests can run it on a mutated copy.

mod circles;
mod compat;
mod env_docs;
mod layers;
mod versions;

pub use circles::check_circles;
pub use compat::check_compat;
pub use env_docs::{check_env_docs, documented_variables, variables_in_code};
pub use layers::{LAYERS, check_layers};
pub use versions::check_versions;

use std::path::PathBuf;

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}
