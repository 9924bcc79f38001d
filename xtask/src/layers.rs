//! The dependency-direction gate: workspace crates form layers, and a crate depends only on crates
//! of lower layers (normal, build and dev dependencies alike). This is the rule
//! docs/architecture.md states: checkpoints and capacity rules know nothing of backends, backends
//! nothing of the engine, the engine nothing of HTTP, and only programs sit on top.

use std::path::Path;

use anyhow::{Context, Result, bail};
use toml::Value;

/// Each workspace package and its layer; a package may depend on packages of lower layers only.
pub const LAYERS: &[(&str, u8)] = &[
    ("mlxcel-capacity", 0),
    ("mlxcel-model", 0),
    ("mlxcel-core", 1),
    ("mlxcel-xla", 1),
    ("mlxcel-engine", 2),
    ("mlxcel-server", 3),
    ("mlxcel", 4),
    ("mlxcel-server-bin", 4),
    ("mlxcel-benches", 4),
    ("xtask", 4),
    ("mlxcel-fuzz", 4),
];

fn layer_of(name: &str) -> Option<u8> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|&(_, l)| l)
}

/// Checks every member's workspace dependencies against [`LAYERS`]; returns a one-line summary.
pub fn check_layers(root: &Path) -> Result<String> {
    let read = |path: &Path| -> Result<Value> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    };
    let manifest = read(&root.join("Cargo.toml"))?;
    let members = manifest
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(Value::as_array)
        .context("Cargo.toml has no [workspace] members")?;
    let mut packages = Vec::new();
    for member in members.iter().filter_map(Value::as_str) {
        let path = root.join(member).join("Cargo.toml");
        let crate_manifest = read(&path)?;
        let name = crate_manifest
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .with_context(|| format!("{} has no package name", path.display()))?
            .to_owned();
        packages.push((name, member.to_owned(), crate_manifest));
    }
    let workspace_names: Vec<&str> = packages.iter().map(|(n, _, _)| n.as_str()).collect();

    let mut problems = Vec::new();
    let mut edges = 0;
    for (name, member, crate_manifest) in &packages {
        let Some(layer) = layer_of(name) else {
            problems.push(format!(
                "{name} ({member}) has no layer: add it to LAYERS in xtask/src/layers.rs"
            ));
            continue;
        };
        for table in ["dependencies", "build-dependencies", "dev-dependencies"] {
            let Some(deps) = crate_manifest.get(table).and_then(Value::as_table) else {
                continue;
            };
            for dep in deps
                .keys()
                .filter(|d| workspace_names.contains(&d.as_str()))
            {
                edges += 1;
                match layer_of(dep) {
                    Some(dep_layer) if dep_layer < layer => {}
                    Some(dep_layer) => problems.push(format!(
                        "{name} (layer {layer}) depends on {dep} (layer {dep_layer}) in \
                         [{table}] of {member}/Cargo.toml: dependencies point to lower layers only"
                    )),
                    None => {} // reported above, as a package without a layer
                }
            }
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(format!(
        "{} crates, {edges} workspace dependencies, all pointing to lower layers",
        packages.len()
    ))
}
