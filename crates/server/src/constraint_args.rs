//! llama.cpp's output-constraint flags (`--grammar`, `--grammar-file`, `-j`, `-jf`): in the
//! server, the constraint of requests that bring none of their own; in `mlxcel generate` and
//! `run`, the constraint of every answer.

use std::path::{Path, PathBuf};

use clap::Args;
use mlxcel_engine::Constraint;

use crate::error::ServerError;

/// The flags, as given (at most one of them).
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct ConstraintArgs {
    /// The output must match this GBNF grammar (llama.cpp's grammar format).
    #[arg(long, conflicts_with_all = ["grammar_file", "json_schema", "json_schema_file"])]
    pub grammar: Option<String>,

    /// The output must match the GBNF grammar in this file.
    #[arg(long = "grammar-file", conflicts_with_all = ["json_schema", "json_schema_file"])]
    pub grammar_file: Option<PathBuf>,

    /// The output must be JSON valid under this JSON Schema (`'{"type": "object"}'`).
    #[arg(short = 'j', long = "json-schema", conflicts_with = "json_schema_file")]
    pub json_schema: Option<String>,

    /// The output must be JSON valid under the JSON Schema in this file (`-jf`).
    #[arg(long = "json-schema-file")]
    pub json_schema_file: Option<PathBuf>,
}

impl ConstraintArgs {
    /// The constraint the flags give; errors name the flag (a grammar's name its line and column).
    pub fn constraint(&self) -> Result<Option<Constraint>, ServerError> {
        let read = |path: &Path, flag: &str| {
            std::fs::read_to_string(path)
                .map_err(|err| ServerError::Flag(format!("{flag} {}: {err}", path.display())))
        };
        let gbnf = match (&self.grammar, &self.grammar_file) {
            (Some(text), _) => Some(("--grammar", text.clone())),
            (None, Some(path)) => Some(("--grammar-file", read(path, "--grammar-file")?)),
            (None, None) => None,
        };
        if let Some((flag, gbnf)) = gbnf {
            let lark = mlxcel_engine::gbnf_to_lark(&gbnf)
                .map_err(|err| ServerError::Flag(format!("{flag}: {err}")))?;
            return Ok(Some(Constraint::Lark(lark)));
        }
        let schema = match (&self.json_schema, &self.json_schema_file) {
            (Some(text), _) => Some(("--json-schema", text.clone())),
            (None, Some(path)) => Some(("--json-schema-file", read(path, "--json-schema-file")?)),
            (None, None) => None,
        };
        schema
            .map(|(flag, text)| {
                serde_json::from_str(&text)
                    .map(Constraint::JsonSchema)
                    .map_err(|err| ServerError::Flag(format!("{flag}: not JSON: {err}")))
            })
            .transpose()
    }
}
