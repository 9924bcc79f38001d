//! GBNF, llama.cpp's grammar format (llama-server's `grammar` field), converted to the Lark
//! dialect that llguidance compiles.
//!
//! GBNF describes text character by character: a rule is a context-free production over Unicode
//! code points, with no lexer. llguidance splits a Lark grammar into lexemes (each string literal
//! and `/regex/`) and a parser over them, and its lexer is greedy: of the lexemes the parser allows
//! at a point it follows the longest match and never backtracks. A multi-character lexeme next to
//! a competing one would therefore reject text that GBNF accepts (with `"return"` and an identifier
//! `[a-z] [a-z]*` both allowed, `result` dies at the `s`). So every lexeme we emit matches exactly
//! one character: a string literal becomes a sequence of one-character literals, a character class
//! a one-character regex, and the language stays the one llama.cpp accepts.
//!
//! The mapping, what is refused and why, is documented in docs/server.md ("GBNF grammars").
//!
//! The conversion runs in three passes, one file each: [`parser`] reads the text into the
//! definitions of [`ast`] (following llama.cpp's parser, so both accept the same grammars),
//! [`grammar`] resolves them into one body per rule, and [`lark`] writes the Lark text (with
//! [`one_char`] finding the rules that always match one character). [`error`] is what a refused
//! grammar reports.

mod ast;
mod error;
mod grammar;
mod lark;
mod one_char;
mod parser;
#[cfg(test)]
mod tests;

pub(crate) use error::GbnfError;
use grammar::Grammar;
use lark::Emitter;
use parser::Parser;

/// Converts a GBNF grammar to a Lark grammar for llguidance whose `start` rule is GBNF's `root`.
///
/// The error names the line and column (1-based, in characters) and what is wrong there, in
/// words fit for the user who sent the grammar.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    convert(gbnf).map_err(|e| e.to_string())
}

pub(crate) fn convert(gbnf: &str) -> Result<String, GbnfError> {
    let mut parser = Parser::new(gbnf);
    let definitions = parser.grammar()?;
    let grammar = Grammar::resolve(definitions, &parser)?;
    Ok(Emitter::new(&grammar).lark())
}
