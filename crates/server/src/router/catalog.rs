//! The models a router serves: every checkpoint in `--models-dir`, and the sections of a
//! `--models-preset` file, each a [`ModelSpec`]: a name, the checkpoint, and the command-line
//! options its own engine and slots are built with.
//!
//! A models directory holds GGUF files (named by the file name without `.gguf`; multimodal
//! projectors, whose names hold `mmproj`, and draft sidecars are not models) and directories (named by the
//! directory's name): an MLX or Hugging Face checkpoint (a `config.json`), or a folder holding a
//! GGUF (its first shard `-00001-of-` when split). A preset section is a model name; its keys are
//! mlxcel-server's long options without the dashes (`ctx-size = 4096`), their short letters, or
//! their `LLAMA_ARG_*` names; `model = PATH` names the checkpoint, `[*]` holds options every
//! model takes, and a section named like a models-directory entry adds options to that entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args as _;

use crate::args::ServerArgs;
use crate::llama_flags::normalize_llama_args;
use crate::router::ini;
pub use crate::router::spec::{ModelSpec, Source};

/// Preset keys that belong to the whole server, not to one model.
const ROUTER_KEYS: &[&str] = &[
    "host",
    "port",
    "api-key",
    "api-key-file",
    "models-dir",
    "models-preset",
    "models-max",
    "models-autoload",
    "no-models-autoload",
];

/// Every model of `models_dir` and `preset`, sorted by name.
pub fn load(models_dir: Option<&Path>, preset: Option<&Path>) -> Result<Vec<ModelSpec>, String> {
    let mut models: BTreeMap<String, ModelSpec> = BTreeMap::new();
    if let Some(dir) = models_dir {
        for spec in scan_dir(dir)? {
            models.insert(spec.name.clone(), spec);
        }
    }
    if let Some(path) = preset {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("--models-preset {}: {err}", path.display()))?;
        apply_preset(&text, &mut models)
            .map_err(|err| format!("--models-preset {}: {err}", path.display()))?;
    }
    Ok(models.into_values().collect())
}

/// The checkpoints directly in `dir`.
pub fn scan_dir(dir: &Path) -> Result<Vec<ModelSpec>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|err| format!("--models-dir {}: {err}", dir.display()))?;
    let mut models = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| format!("--models-dir {}: {err}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let found = if path.is_dir() {
            checkpoint_in(&path).map(|p| (name, p))
        } else {
            name.strip_suffix(".gguf")
                .filter(|_| is_model_gguf(&name))
                .map(|stem| (stem.to_owned(), path.clone()))
        };
        if let Some((name, path)) = found {
            models.push(ModelSpec {
                name,
                aliases: Vec::new(),
                path,
                args: Vec::new(),
                source: Source::ModelsDir,
                preset: None,
            });
        }
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// A GGUF that is a model of its own: not a multimodal projector, and not one of the draft
/// sidecars llama-server pairs with a model (`mtp-`, `dspark-`, `dflash-`).
fn is_model_gguf(name: &str) -> bool {
    name.ends_with(".gguf")
        && !name.contains("mmproj")
        && !["mtp-", "dspark-", "dflash-"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
}

/// The checkpoint a directory of the models directory holds: itself when it has a
/// `config.json`, else its GGUF (the first shard when split).
fn checkpoint_in(dir: &Path) -> Option<PathBuf> {
    if dir.join("config.json").is_file() {
        return Some(dir.to_path_buf());
    }
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_model_gguf)
        })
        .collect();
    ggufs.sort();
    let first_shard = ggufs.iter().find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("-00001-of-"))
    });
    first_shard.or(ggufs.first()).cloned()
}

/// Adds the sections of a preset file to `models` (options of `[*]` to every one).
fn apply_preset(text: &str, models: &mut BTreeMap<String, ModelSpec>) -> Result<(), String> {
    let sections = ini::parse(text)?;
    let flags = Flags::of_server();
    let mut global = Vec::new();
    for section in &sections {
        if section.name != "*" {
            continue;
        }
        for entry in &section.entries {
            if entry.key == "model" {
                return Err(format!(
                    "line {}: `model` names one model's checkpoint; set it in that model's section",
                    entry.line
                ));
            }
            global.extend(flags.tokens(entry, "*")?);
        }
    }
    for section in &sections {
        if section.name == "*"
            || (section.name == ini::DEFAULT_SECTION && section.entries.is_empty())
        {
            continue;
        }
        let mut path = None;
        let mut aliases = Vec::new();
        let mut args = Vec::new();
        for entry in &section.entries {
            match entry.key.as_str() {
                "version" => {}
                "model" | "m" | "LLAMA_ARG_MODEL" => path = Some(PathBuf::from(&entry.value)),
                "alias" | "a" | "LLAMA_ARG_ALIAS" => aliases.extend(
                    entry
                        .value
                        .split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_owned),
                ),
                _ => args.extend(flags.tokens(entry, &section.name)?),
            }
        }
        let existing = models.get(&section.name);
        let path = match (path, existing) {
            (Some(path), _) => path,
            (None, Some(spec)) => spec.path.clone(),
            (None, None) => {
                return Err(format!(
                    "line {}: section `[{}]` names no checkpoint: add `model = PATH` (a GGUF file \
                     or a checkpoint directory)",
                    section.line, section.name
                ));
            }
        };
        let source = existing.map_or(Source::Preset, |s| s.source);
        models.insert(
            section.name.clone(),
            ModelSpec {
                name: section.name.clone(),
                aliases,
                path,
                args,
                source,
                preset: Some(section_text(section)),
            },
        );
    }
    for spec in models.values_mut() {
        let mut all = global.clone();
        all.append(&mut spec.args);
        spec.args = all;
    }
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    for spec in models.values() {
        for alias in &spec.aliases {
            if let Some(other) = names.insert(alias, &spec.name).or_else(|| {
                models
                    .contains_key(alias.as_str())
                    .then_some(alias.as_str())
            }) {
                return Err(format!(
                    "the alias `{alias}` of `[{}]` is already the name or an alias of `{other}`",
                    spec.name
                ));
            }
        }
    }
    Ok(())
}

/// A section as INI text.
fn section_text(section: &ini::Section) -> String {
    let mut text = format!("[{}]\n", section.name);
    for entry in &section.entries {
        text.push_str(&format!("{} = {}\n", entry.key, entry.value));
    }
    text
}

/// What a preset key may name: the server's options by long name, short letter or environment
/// variable.
struct Flags(Vec<Flag>);

struct Flag {
    long: String,
    names: Vec<String>,
    takes_value: bool,
}

impl Flags {
    fn of_server() -> Self {
        let command = ServerArgs::augment_args(clap::Command::new("mlxcel-server"));
        let flags = command
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?.to_owned();
                let mut names = vec![long.clone()];
                names.extend(
                    arg.get_all_aliases()
                        .unwrap_or_default()
                        .into_iter()
                        .map(str::to_owned),
                );
                names.extend(arg.get_short().map(|c| c.to_string()));
                names.extend(arg.get_env().and_then(|e| e.to_str()).map(str::to_owned));
                Some(Flag {
                    long,
                    names,
                    takes_value: arg.get_action().takes_values(),
                })
            })
            .collect();
        Self(flags)
    }

    fn find(&self, name: &str) -> Option<&Flag> {
        self.0.iter().find(|f| f.names.iter().any(|n| n == name))
    }

    /// The command-line tokens of one preset line.
    fn tokens(&self, entry: &ini::Entry, section: &str) -> Result<Vec<String>, String> {
        let line = entry.line;
        let key = entry.key.as_str();
        // llama-server's multi-letter shorts (`ngl`, `np`) are spelled as their long forms.
        let normalized = normalize_llama_args([format!("-{key}")]);
        let long_of_short = normalized
            .first()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("--"))
            .map(str::to_owned);
        let flag = self
            .find(key)
            .or_else(|| long_of_short.as_deref().and_then(|l| self.find(l)))
            .ok_or_else(|| {
                format!(
                    "line {line}: option `{key}` in section `[{section}]` is not an option of \
                     mlxcel-server (see `mlxcel-server --help`)"
                )
            })?;
        if ROUTER_KEYS.contains(&flag.long.as_str()) {
            return Err(format!(
                "line {line}: `{key}` in section `[{section}]` is a setting of the whole router; \
                 give it on the command line"
            ));
        }
        if flag.takes_value {
            return Ok(vec![format!("--{}={}", flag.long, entry.value)]);
        }
        let on = match entry.value.to_ascii_lowercase().as_str() {
            "" | "1" | "true" | "on" | "enabled" | "yes" => true,
            "0" | "false" | "off" | "disabled" | "no" => false,
            other => {
                return Err(format!(
                    "line {line}: `{key} = {other}` in section `[{section}]`: expected true or \
                     false"
                ));
            }
        };
        if on {
            return Ok(vec![format!("--{}", flag.long)]);
        }
        // Off: the negated spelling when there is one; otherwise the flag stays unset (its default).
        let negated = match flag.long.strip_prefix("no-") {
            Some(positive) => self.find(positive),
            None => self.find(&format!("no-{}", flag.long)),
        };
        Ok(negated
            .map(|f| vec![format!("--{}", f.long)])
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(text: &str) -> Result<Vec<ModelSpec>, String> {
        let mut models = BTreeMap::new();
        apply_preset(text, &mut models)?;
        Ok(models.into_values().collect())
    }

    #[test]
    fn preset_sections_become_models_with_their_options() {
        let specs = preset(
            "[*]\nctx-size = 512\n\n[small]\nmodel = /m/s.gguf\nparallel = 2\nalias = s1,s2\n\
             [big]\nm = /m/big\nLLAMA_ARG_N_PREDICT = 7\nngl = 99\n",
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        let small = specs.iter().find(|s| s.name == "small").unwrap();
        assert_eq!(small.path, PathBuf::from("/m/s.gguf"));
        assert_eq!(small.args, vec!["--ctx-size=512", "--parallel=2"]);
        assert_eq!(small.aliases, vec!["s1", "s2"]);
        let big = specs.iter().find(|s| s.name == "big").unwrap();
        assert_eq!(big.args[0], "--ctx-size=512");
        assert!(big.args[1].starts_with("--n-predict=7"), "{:?}", big.args);
    }

    #[test]
    fn bad_presets_name_the_line() {
        let err = preset("[a]\nmodel = /x\nno-such-option = 1\n").unwrap_err();
        assert!(
            err.starts_with("line 3:") && err.contains("no-such-option"),
            "{err}"
        );
        let err = preset("[a]\nctx-size = 5\n").unwrap_err();
        assert!(
            err.starts_with("line 1:") && err.contains("model = PATH"),
            "{err}"
        );
        let err = preset("[a]\nmodel = /x\nport = 9\n").unwrap_err();
        assert!(
            err.starts_with("line 3:") && err.contains("router"),
            "{err}"
        );
        let err = preset("[a]\nmodel = /x\nalias = b\n[b]\nmodel = /y\n").unwrap_err();
        assert!(err.contains("alias `b`"), "{err}");
    }
}
