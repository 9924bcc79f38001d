//! What a refused GBNF grammar reports: where, and what is wrong there.

use std::fmt;

/// Why a GBNF grammar was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GbnfError {
    pub(crate) line: usize,
    pub(crate) column: usize,
    pub(crate) message: String,
}

impl fmt::Display for GbnfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for GbnfError {}
