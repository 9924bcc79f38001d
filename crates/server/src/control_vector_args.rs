//! llama.cpp's control-vector flags, `--control-vector FNAME[,FNAME...]`,
//! `--control-vector-scaled FNAME:SCALE[,...]` and `--control-vector-layer-range START END`,
//! flattened into [`crate::ServerArgs`] (and `mlxcel generate`'s and `serve`'s options). The
//! files are summed in command-line order across both flags, as llama.cpp loads them; the
//! engine reads them (`mlxcel_model::ControlVector`), refusing a malformed one by name at start.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{Arg, ArgAction, ArgMatches, Command};
use mlxcel_model::ControlVectorSpec;

/// The control vectors and their layer range.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlVectorArgs {
    /// The files, scales and range the engine loads.
    pub spec: ControlVectorSpec,
}

const VECTOR: &str = "control-vector";
const SCALED: &str = "control-vector-scaled";
const RANGE: &str = "control-vector-layer-range";

fn integer(flag: &str, value: &str) -> Result<i32, String> {
    value.trim().parse().map_err(|_| {
        format!("--{flag} {value}: `{value}` is not an integer layer index (START END, inclusive)")
    })
}

impl ControlVectorArgs {
    /// Reads `--control-vector` and `--control-vector-scaled` values, each with its
    /// command-line index, and the last `--control-vector-layer-range` pair.
    pub fn from_values(
        plain: &[(usize, String)],
        scaled: &[(usize, String)],
        range: Option<(&str, &str)>,
    ) -> Result<Self, String> {
        let mut items: Vec<(usize, PathBuf, f32)> = Vec::new();
        for (index, value) in plain {
            for path in value.split(',').filter(|p| !p.is_empty()) {
                items.push((*index, PathBuf::from(path), 1.0));
            }
        }
        for (index, value) in scaled {
            for item in value.split(',').filter(|p| !p.is_empty()) {
                let parts: Vec<&str> = item.split(':').collect();
                let [path, scale] = parts[..] else {
                    return Err(format!(
                        "--{SCALED} {item}: expected FNAME:SCALE (comma-separated for several)"
                    ));
                };
                let scale: f32 = scale
                    .trim()
                    .parse()
                    .ok()
                    .filter(|s: &f32| s.is_finite())
                    .ok_or_else(|| {
                        format!("--{SCALED} {item}: the scale `{scale}` is not a number")
                    })?;
                items.push((*index, PathBuf::from(path), scale));
            }
        }
        // Stable: the files of one comma-separated value keep their order.
        items.sort_by_key(|(index, _, _)| *index);
        let layer_range = match range {
            Some((start, end)) => Some((integer(RANGE, start)?, integer(RANGE, end)?)),
            None => None,
        };
        Ok(Self {
            spec: ControlVectorSpec {
                files: items.into_iter().map(|(_, p, s)| (p, s)).collect(),
                layer_range,
            },
        })
    }
}

fn indexed(matches: &ArgMatches, id: &str) -> Vec<(usize, String)> {
    match (matches.get_many::<String>(id), matches.indices_of(id)) {
        (Some(values), Some(indices)) => indices.zip(values.cloned()).collect(),
        _ => Vec::new(),
    }
}

impl clap::FromArgMatches for ControlVectorArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        // Each occurrence of the range replaces the one before, as llama.cpp's.
        let range: Vec<&String> = matches
            .get_many::<String>(RANGE)
            .map(|v| v.collect())
            .unwrap_or_default();
        let last = match range.len() {
            0 => None,
            n => Some((range[n - 2].as_str(), range[n - 1].as_str())),
        };
        *self = Self::from_values(&indexed(matches, VECTOR), &indexed(matches, SCALED), last)
            .map_err(|message| clap::Error::raw(ErrorKind::InvalidValue, format!("{message}\n")))?;
        Ok(())
    }
}

impl clap::Args for ControlVectorArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new(VECTOR)
                .long(VECTOR)
                .value_name("FNAME")
                .action(ArgAction::Append)
                .help(
                    "add a control vector (GGUF of direction.N tensors) at scale 1; \
                     comma-separated for several, summed",
                ),
        )
        .arg(
            Arg::new(SCALED)
                .long(SCALED)
                .value_name("FNAME:SCALE,...")
                .action(ArgAction::Append)
                .help("add a control vector with its scale; comma-separated for several"),
        )
        .arg(
            Arg::new(RANGE)
                .long(RANGE)
                .value_names(["START", "END"])
                .num_args(2)
                .allow_negative_numbers(true)
                .action(ArgAction::Append)
                .help(
                    "layers to apply the control vectors to, start and end inclusive \
                     (default: 1 to the last layer)",
                ),
        )
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args as _, FromArgMatches as _};

    fn parse(args: &[&str]) -> Result<ControlVectorArgs, String> {
        let cmd = ControlVectorArgs::augment_args(Command::new("t"));
        let matches = cmd
            .try_get_matches_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        ControlVectorArgs::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    #[test]
    fn files_keep_command_line_order_across_both_flags_with_their_scales() {
        let args = parse(&[
            "--control-vector-scaled",
            "a.gguf:0.5",
            "--control-vector",
            "b.gguf,c.gguf",
            "--control-vector-scaled",
            "d:2,e:-1.5",
        ])
        .unwrap();
        let files: Vec<_> = args
            .spec
            .files
            .iter()
            .map(|(p, s)| (p.to_str().unwrap(), *s))
            .collect();
        assert_eq!(
            files,
            [
                ("a.gguf", 0.5),
                ("b.gguf", 1.0),
                ("c.gguf", 1.0),
                ("d", 2.0),
                ("e", -1.5)
            ]
        );
        assert_eq!(args.spec.layer_range, None);
    }

    #[test]
    fn the_layer_range_takes_two_integers_and_the_last_one_wins() {
        let args = parse(&[
            "--control-vector",
            "a.gguf",
            "--control-vector-layer-range",
            "2",
            "9",
            "--control-vector-layer-range",
            "-1",
            "5",
        ])
        .unwrap();
        assert_eq!(args.spec.layer_range, Some((-1, 5)));
        let e = parse(&["--control-vector-layer-range", "2", "x"]).unwrap_err();
        assert!(e.contains("`x` is not an integer"), "{e}");
        let e = parse(&["--control-vector-layer-range", "2"]).unwrap_err();
        assert!(e.contains("control-vector-layer-range"), "{e}");
    }

    #[test]
    fn a_scaled_value_without_a_scale_is_refused_naming_the_format() {
        let e = parse(&["--control-vector-scaled", "a.gguf"]).unwrap_err();
        assert!(e.contains("FNAME:SCALE"), "{e}");
        let e = parse(&["--control-vector-scaled", "a.gguf:x"]).unwrap_err();
        assert!(e.contains("`x` is not a number"), "{e}");
        let e = parse(&["--control-vector-scaled", "a.gguf:inf"]).unwrap_err();
        assert!(e.contains("`inf` is not a number"), "{e}");
    }
}
