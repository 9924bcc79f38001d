//! A GGUF WordPiece vocabulary in Hugging Face's `tokenizer.json` form (the `tokenizers` crate's
//! WordPiece model and decoder), for what the engine's tokenizer does besides encoding: decoding,
//! the vocabulary, token texts. Encoding is llama.cpp's WPM ([`WpmVocab::encode`]).

use serde_json::{Map, Value, json};

use crate::encoder::wpm::WpmVocab;

/// The `tokenizer.json` of `vocab`: a word-initial GGUF piece (`▁x`) is `x`, a continuation
/// (`x`) is `##x`, a special token (`[CLS]`, its text in brackets) stays as it is and is an added
/// special token. A text that two ids share keeps the first.
pub fn wordpiece_json(vocab: &WpmVocab) -> Value {
    let mut map = Map::new();
    let mut added = Vec::new();
    for (id, token) in vocab.tokens().iter().enumerate() {
        let special = token.starts_with('[') && token.ends_with(']') && token.len() > 2;
        let text = if special {
            token.clone()
        } else if let Some(word) = token.strip_prefix('\u{2581}') {
            word.to_owned()
        } else {
            format!("##{token}")
        };
        if map.contains_key(&text) {
            continue;
        }
        if special {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }));
        }
        map.insert(text, json!(id));
    }
    let unk = vocab
        .tokens()
        .get(vocab.options.unk as usize)
        .cloned()
        .unwrap_or_else(|| "[UNK]".into());
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {
            "type": "WordPiece",
            "unk_token": unk,
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": map,
        },
    })
}
