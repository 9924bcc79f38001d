//! Entry points for the fuzz targets (`fuzz/`, docs/reliability.md) into what the engine keeps
//! private: constraint compilation over a tiny vocabulary and the detokenizing stream the
//! scheduler uses. Not part of the stable API.

use std::sync::{Arc, OnceLock};

use llguidance::{Matcher, ParserFactory};
use mlxcel_model::Tokenizer;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::constraint::Constraint;
use crate::decode::TextDecoder;
use crate::text::TokenizerDecoder;

/// A parser factory over a toy vocabulary: one token per byte, then an end-of-sequence token.
fn byte_factory() -> &'static ParserFactory {
    static FACTORY: OnceLock<ParserFactory> = OnceLock::new();
    FACTORY.get_or_init(|| {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF<eos>".to_vec());
        let trie = TokTrie::from(&TokRxInfo::new(257, 256), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).expect("a byte vocabulary is valid");
        factory.quiet();
        factory
    })
}

/// Compiles `constraint` as the engine compiles a request's (the same grammar, llguidance's
/// parser and matcher) over a 257-token byte vocabulary, then computes the first token mask;
/// the error is what a request would be refused with.
pub fn compile_constraint(constraint: &Constraint) -> Result<(), String> {
    let parser = byte_factory()
        .create_parser(constraint.grammar())
        .map_err(|e| e.to_string())?;
    let mut matcher = Matcher::new(Ok(parser));
    if let Some(error) = matcher.get_error() {
        return Err(error);
    }
    matcher.compute_mask().map(drop).map_err(|e| e.to_string())
}

/// Decodes `ids` with the engine's detokenizing stream over `tokenizer` (special tokens
/// skipped), one token at a time, then flushes; the concatenated text.
pub fn decode_stream(tokenizer: Arc<Tokenizer>, ids: &[u32]) -> String {
    let mut stream = TokenizerDecoder::new(tokenizer).stream(&[]);
    let mut text = String::new();
    for &id in ids {
        text.push_str(&stream.push(id));
    }
    text.push_str(&stream.flush());
    text
}
