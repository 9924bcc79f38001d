//! llama.cpp's LoRA flags, `--lora FNAME[,FNAME...]`, `--lora-scaled FNAME:SCALE[,...]` and
//! `--lora-init-without-apply`, flattened into [`crate::ServerArgs`] (and `mlxcel generate`'s
//! options). Adapters take their ids in command-line order across both flags, as llama.cpp
//! numbers them, so clap's matches are read with their indices.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The adapters and how they start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraArgs {
    /// Each adapter's path and scale, in command-line order (its id is its place).
    pub adapters: Vec<(PathBuf, f32)>,
    /// `--lora-init-without-apply`: every adapter starts at scale 0 (`POST /lora-adapters`, or a
    /// request's `lora`, sets them).
    pub init_without_apply: bool,
}

const LORA: &str = "lora";
const SCALED: &str = "lora-scaled";
const INIT: &str = "lora-init-without-apply";

impl LoraArgs {
    /// The adapters' paths, by id ([`mlxcel_engine::EngineOptions::lora_adapters`]).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.adapters.iter().map(|(p, _)| p.clone()).collect()
    }

    /// The scales requests run with until changed: the flags', or 0 with
    /// `--lora-init-without-apply`.
    pub fn initial_scales(&self) -> Vec<f32> {
        self.adapters
            .iter()
            .map(|&(_, s)| if self.init_without_apply { 0.0 } else { s })
            .collect()
    }

    /// Reads `--lora` and `--lora-scaled` values, each with its command-line index.
    pub fn from_values(
        lora: &[(usize, String)],
        scaled: &[(usize, String)],
        init_without_apply: bool,
    ) -> Result<Self, String> {
        let mut items: Vec<(usize, PathBuf, f32)> = Vec::new();
        for (index, value) in lora {
            for path in value.split(',').filter(|p| !p.is_empty()) {
                items.push((*index, PathBuf::from(path), 1.0));
            }
        }
        for (index, value) in scaled {
            for item in value.split(',').filter(|p| !p.is_empty()) {
                let parts: Vec<&str> = item.split(':').collect();
                let [path, scale] = parts[..] else {
                    return Err(format!(
                        "--lora-scaled {item}: expected FNAME:SCALE (comma-separated for several)"
                    ));
                };
                let scale: f32 = scale
                    .trim()
                    .parse()
                    .ok()
                    .filter(|s: &f32| s.is_finite())
                    .ok_or_else(|| {
                        format!("--lora-scaled {item}: the scale `{scale}` is not a number")
                    })?;
                items.push((*index, PathBuf::from(path), scale));
            }
        }
        // Stable: the adapters of one comma-separated value keep their order.
        items.sort_by_key(|(index, _, _)| *index);
        Ok(Self {
            adapters: items.into_iter().map(|(_, p, s)| (p, s)).collect(),
            init_without_apply,
        })
    }
}

fn indexed(matches: &ArgMatches, id: &str) -> Vec<(usize, String)> {
    match (matches.get_many::<String>(id), matches.indices_of(id)) {
        (Some(values), Some(indices)) => indices.zip(values.cloned()).collect(),
        _ => Vec::new(),
    }
}

impl clap::FromArgMatches for LoraArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_values(
            &indexed(matches, LORA),
            &indexed(matches, SCALED),
            matches.get_flag(INIT),
        )
        .map_err(|message| clap::Error::raw(ErrorKind::InvalidValue, format!("{message}\n")))?;
        Ok(())
    }
}

impl clap::Args for LoraArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new(LORA)
                .long(LORA)
                .value_name("FNAME")
                .action(ArgAction::Append)
                .help(
                    "LoRA adapter (GGUF from convert_lora_to_gguf.py, or a PEFT directory or \
                     adapter_model.safetensors) at scale 1; comma-separated for several",
                ),
        )
        .arg(
            Arg::new(SCALED)
                .long(SCALED)
                .value_name("FNAME:SCALE,...")
                .action(ArgAction::Append)
                .help("LoRA adapter with its scale; comma-separated for several"),
        )
        .arg(Arg::new(INIT).long(INIT).action(ArgAction::SetTrue).help(
            "load the LoRA adapters at scale 0 (set them later with POST /lora-adapters \
                     or a request's `lora`)",
        ))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args as _, FromArgMatches as _};

    fn parse(args: &[&str]) -> Result<LoraArgs, String> {
        let cmd = LoraArgs::augment_args(Command::new("t"));
        let matches = cmd
            .try_get_matches_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        LoraArgs::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    #[test]
    fn adapters_take_their_ids_in_command_line_order_across_both_flags() {
        let args = parse(&[
            "--lora-scaled",
            "a.gguf:0.5",
            "--lora",
            "b.gguf,c.gguf",
            "--lora-scaled",
            "d:2,e:-1",
        ])
        .unwrap();
        let names: Vec<_> = args
            .adapters
            .iter()
            .map(|(p, s)| (p.to_str().unwrap(), *s))
            .collect();
        assert_eq!(
            names,
            [
                ("a.gguf", 0.5),
                ("b.gguf", 1.0),
                ("c.gguf", 1.0),
                ("d", 2.0),
                ("e", -1.0)
            ]
        );
        assert_eq!(args.initial_scales(), [0.5, 1.0, 1.0, 2.0, -1.0]);
    }

    #[test]
    fn init_without_apply_starts_every_adapter_at_zero() {
        let args = parse(&["--lora", "a.gguf", "--lora-init-without-apply"]).unwrap();
        assert!(args.init_without_apply);
        assert_eq!(args.initial_scales(), [0.0]);
        assert_eq!(args.paths(), [PathBuf::from("a.gguf")]);
    }

    #[test]
    fn a_scaled_value_without_a_scale_is_refused_naming_the_format() {
        let e = parse(&["--lora-scaled", "a.gguf"]).unwrap_err();
        assert!(e.contains("FNAME:SCALE"), "{e}");
        let e = parse(&["--lora-scaled", "a.gguf:x"]).unwrap_err();
        assert!(e.contains("`x` is not a number"), "{e}");
    }
}
