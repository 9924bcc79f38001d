//! The environment-variable documentation gate.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

const PREFIX: &str = "MLXCEL_";
const DOC: &str = "docs/environment.md";
/// Where variables are read: code, build scripts, and the project's shell scripts.
const SCANNED: &[&str] = &[
    "crates", "bins", "benches", "examples", "fuzz", "scripts", ".ci", "Makefile",
];
const SCANNED_EXTENSIONS: &[&str] = &["rs", "sh", "py", "cpp", "h", "hpp", "toml", "txt"];

/// Checks both directions between code and `docs/environment.md`; returns a one-line summary.
pub fn check_env_docs(root: &Path) -> Result<String> {
    let in_code = variables_in_code(root)?;
    let documented = documented_variables(root)?;
    let mut problems = Vec::new();
    for name in in_code.difference(&documented) {
        problems.push(format!(
            "{name} is read by the code but has no row in {DOC}"
        ));
    }
    for name in documented.difference(&in_code) {
        problems.push(format!(
            "{name} is documented in {DOC} but nothing reads it"
        ));
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(format!("{} variables documented and read", in_code.len()))
}

/// The variables named in `docs/environment.md`'s table rows (lines starting with `` | `MLXCEL_ ``).
pub fn documented_variables(root: &Path) -> Result<BTreeSet<String>> {
    let path = root.join(DOC);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // Only the first cell names the variable; other cells may mention related ones.
    Ok(text
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|cell| cell.starts_with(PREFIX))
        .flat_map(names_in)
        .collect())
}

/// Every `MLXCEL_*` name mentioned in the scanned source files.
pub fn variables_in_code(root: &Path) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for entry in SCANNED {
        scan(&root.join(entry), &mut names)?;
    }
    Ok(names)
}

fn scan(path: &Path, names: &mut BTreeSet<String>) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if path.is_dir() {
        let skip = path
            .file_name()
            .is_some_and(|n| n == "target" || n.to_string_lossy().starts_with('.') && n != ".ci");
        if skip {
            return Ok(());
        }
        for entry in
            std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))?
        {
            scan(&entry?.path(), names)?;
        }
        return Ok(());
    }
    let scanned_extension = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SCANNED_EXTENSIONS.contains(&e));
    let extensionless_script = path.extension().is_none();
    if !(scanned_extension || extensionless_script) {
        return Ok(());
    }
    // Binary files are not code; skip what is not UTF-8.
    if let Ok(text) = std::fs::read_to_string(path) {
        names.extend(names_in(&text));
    }
    Ok(())
}

/// The `MLXCEL_[A-Z0-9_]+` names in `text`, without a trailing underscore (so that a prefix used to
/// build names, like `"MLXCEL_"`, is not taken for a variable).
fn names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(PREFIX) {
        let preceded_by_ident = rest[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start + PREFIX.len()..];
        let len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let suffix = tail[..len].trim_end_matches('_');
        if !preceded_by_ident && !suffix.is_empty() {
            names.push(format!("{PREFIX}{suffix}"));
        }
        rest = &tail[len..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::names_in;

    #[test]
    fn names_are_whole_identifiers() {
        assert_eq!(
            names_in("env MLXCEL_A_B=1 and \"MLXCEL_\" and XMLXCEL_C and MLXCEL_D_"),
            vec!["MLXCEL_A_B".to_owned(), "MLXCEL_D".to_owned()]
        );
    }
}
