//! The checkpoint tokenizer as the engine's [`TextDecoder`].

use std::sync::Arc;

use mlxcel_model::{Detokenizer, Tokenizer, shared_detokenizer};

use crate::decode::{DecodeStream, TextDecoder};

/// Decodes with the checkpoint's tokenizer, skipping special tokens (EOS never shows as text)
/// unless `special` asks for them ([`crate::EngineOptions::special_tokens`]).
#[derive(Debug)]
pub(crate) struct TokenizerDecoder {
    tokenizer: Arc<Tokenizer>,
    special: bool,
}

impl TokenizerDecoder {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            tokenizer,
            special: false,
        }
    }

    /// Special tokens show as their text.
    pub(crate) fn with_special_tokens(mut self, special: bool) -> Self {
        self.special = special;
        self
    }
}

impl TextDecoder for TokenizerDecoder {
    fn stream(&self, _prompt: &[u32]) -> Box<dyn DecodeStream> {
        Box::new(TokenizerStream(shared_detokenizer(
            self.tokenizer.clone(),
            !self.special,
        )))
    }
}

struct TokenizerStream(Detokenizer<'static>);

impl DecodeStream for TokenizerStream {
    fn push(&mut self, token: u32) -> String {
        // A token the tokenizer cannot decode contributes no text rather than ending the request.
        self.0.push(token).ok().flatten().unwrap_or_default()
    }

    fn flush(&mut self) -> String {
        self.0.flush().ok().flatten().unwrap_or_default()
    }

    fn holds_partial_character(&self) -> bool {
        self.0.holds_partial_character()
    }
}
