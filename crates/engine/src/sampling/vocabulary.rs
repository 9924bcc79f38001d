//! DRY's sequence breakers against the model's vocabulary: each token's text read once per
//! engine, and the last set of breakers resolved kept, so that requests with the default breakers
//! (nearly all) do not scan the vocabulary again.

use std::sync::{Arc, Mutex, OnceLock};

use super::dry::{DryBreakers, resolve_breakers};

/// The model's tokenizer, with what DRY's breakers need of it.
pub(crate) struct BreakerVocabulary {
    tokenizer: Arc<mlxcel_model::Tokenizer>,
    texts: OnceLock<Vec<Vec<u8>>>,
    last: Mutex<Option<(Vec<String>, Arc<DryBreakers>)>>,
}

impl BreakerVocabulary {
    pub(crate) fn new(tokenizer: Arc<mlxcel_model::Tokenizer>) -> Self {
        Self {
            tokenizer,
            texts: OnceLock::new(),
            last: Mutex::new(None),
        }
    }

    /// `breakers` as token sequences (the last set resolved is reused).
    pub(crate) fn resolve(&self, breakers: &[String]) -> Arc<DryBreakers> {
        if let Ok(last) = self.last.lock()
            && let Some((texts, resolved)) = last.as_ref()
            && texts == breakers
        {
            return resolved.clone();
        }
        let texts = self.texts.get_or_init(|| {
            self.tokenizer
                .token_bytes()
                .into_iter()
                .map(|t| t.bytes)
                .collect()
        });
        // A piece the tokenizer cannot encode has no tail: it never matches.
        let tokenize = |text: &str| {
            self.tokenizer
                .encode(text, false, false)
                .unwrap_or_default()
        };
        let resolved = Arc::new(resolve_breakers(breakers, texts, &tokenize));
        if let Ok(mut last) = self.last.lock() {
            *last = Some((breakers.to_vec(), resolved.clone()));
        }
        resolved
    }
}

impl std::fmt::Debug for BreakerVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerVocabulary").finish_non_exhaustive()
    }
}
