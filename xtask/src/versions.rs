//! The version gate.

use std::path::Path;

use anyhow::{Context, Result, bail};
use toml::Value;

fn read_toml(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Checks crate versions against `[workspace.package] version`; returns a one-line summary.
pub fn check_versions(root: &Path) -> Result<String> {
    let manifest = read_toml(&root.join("Cargo.toml"))?;
    let workspace = manifest
        .get("workspace")
        .context("Cargo.toml has no [workspace]")?;
    let version = workspace
        .get("package")
        .and_then(|p| p.get("version"))
        .and_then(Value::as_str)
        .context("Cargo.toml has no [workspace.package] version")?;
    let members = workspace
        .get("members")
        .and_then(Value::as_array)
        .context("Cargo.toml has no [workspace] members")?;

    let mut problems = Vec::new();
    let mut checked = 0;
    for member in members.iter().filter_map(Value::as_str) {
        let path = root.join(member).join("Cargo.toml");
        let crate_manifest = read_toml(&path)?;
        let package = crate_manifest
            .get("package")
            .with_context(|| format!("{} has no [package]", path.display()))?;
        let name = package
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(member);
        let inherits = package
            .get("version")
            .and_then(|v| v.get("workspace"))
            .and_then(Value::as_bool)
            == Some(true);
        let independent_reason = package
            .get("metadata")
            .and_then(|m| m.get("mlxcel"))
            .and_then(|m| m.get("independent-version"))
            .and_then(Value::as_str)
            .filter(|reason| !reason.trim().is_empty());
        match (inherits, independent_reason) {
            (true, _) | (false, Some(_)) => {}
            (false, None) => problems.push(format!(
                "{name} ({member}/Cargo.toml) does not carry the workspace version {version}: \
                 use `version.workspace = true`, or declare `[package.metadata.mlxcel] \
                 independent-version = \"<reason>\"`"
            )),
        }
        checked += 1;
    }

    if let Some(deps) = workspace.get("dependencies").and_then(Value::as_table) {
        for (name, spec) in deps {
            if spec.get("path").is_none() {
                continue;
            }
            let wanted = spec.get("version").and_then(Value::as_str);
            if wanted != Some(version) {
                problems.push(format!(
                    "[workspace.dependencies] {name} asks for version {wanted:?}, \
                     but the workspace version is {version}"
                ));
            }
        }
    }

    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(format!("{checked} crates carry version {version}"))
}
