//! The tokenizer (`tokenizer.json` through the `tokenizers` crate) and incremental detokenization.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::error::{ModelError, Result};

/// A checkpoint's tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special-token parsing off, built on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
    path: PathBuf,
    /// A BERT vocabulary read from a GGUF file: [`Tokenizer::encode`] runs llama.cpp's WPM
    /// tokenizer over it; `inner` is its WordPiece form, for decoding and the vocabulary.
    wpm: Option<Arc<crate::encoder::WpmVocab>>,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        // The `tokenizers` crate panics (`expect("Helper")`) on a JSON syntax error inside the
        // `decoder` object instead of returning its error (found by the `tokenizer` fuzz target):
        // check the syntax first.
        serde_json::from_str::<serde::de::IgnoredAny>(&text).map_err(|e| {
            ModelError::Tokenizer {
                path: path.to_owned(),
                reason: format!("not valid JSON: {e}"),
            }
        })?;
        Self::parse(&text, path, None)
    }

    /// A tokenizer from `tokenizer.json` text (`path` names it in errors), encoding with `wpm`
    /// where given.
    fn parse(text: &str, path: &Path, wpm: Option<Arc<crate::encoder::WpmVocab>>) -> Result<Self> {
        let inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| ModelError::Tokenizer {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
        Ok(Self {
            inner,
            plain: OnceLock::new(),
            path: path.to_owned(),
            wpm,
        })
    }

    /// The tokenizer of a BERT GGUF's WordPiece vocabulary (`path` is the GGUF file): encoding
    /// is llama.cpp's WPM tokenizer ([`crate::encoder::WpmVocab::encode`]); decoding is the
    /// WordPiece decoder's (pieces joined, `##` continuations glued).
    pub fn from_wpm(vocab: Arc<crate::encoder::WpmVocab>, path: &Path) -> Result<Self> {
        let json = crate::encoder::wordpiece_json(&vocab).to_string();
        Self::parse(&json, path, Some(vocab))
    }

    /// Token ids of `text`. `add_special` applies the tokenizer's post-processor (e.g. a BOS);
    /// `parse_special` recognises special tokens written in the text (`<|im_start|>`), otherwise
    /// they are tokenized as plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        if let Some(wpm) = &self.wpm {
            return Ok(wpm.encode(text, add_special, parse_special));
        }
        let tokenizer = if parse_special {
            &self.inner
        } else {
            self.plain.get_or_init(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            })
        };
        let encoding = tokenizer
            .encode(text, add_special)
            .map_err(|e| ModelError::Tokenize {
                operation: "encode",
                reason: e.to_string(),
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The tokens `encode(text, add_special = true, _)` puts before the text (a BOS for
    /// vocabularies that add one; empty for most byte-level BPE ones).
    pub fn leading_special_tokens(&self) -> Result<Vec<u32>> {
        let with = self.encode("a", true, false)?;
        let without = self.encode("a", false, false)?;
        Ok(with
            .strip_suffix(without.as_slice())
            .or_else(|| {
                // A post-processor that also appends (an EOS): what comes before the text.
                let at = with.windows(without.len()).position(|w| w == without)?;
                Some(&with[..at])
            })
            .unwrap_or_default()
            .to_vec())
    }

    /// Text of `ids`; `skip_special` drops special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenize {
                operation: "decode",
                reason: e.to_string(),
            })
    }

    /// Whether `decode` drops this id: one the vocabulary lacks, or a special token when
    /// `skip_special` (the filter `decode` itself applies before the decoder runs).
    pub fn is_dropped_by_decode(&self, id: u32, skip_special: bool) -> bool {
        match self.inner.id_to_token(id) {
            None => true,
            Some(token) => {
                skip_special && self.inner.get_added_vocabulary().is_special_token(&token)
            }
        }
    }

    /// The id of a token string, e.g. `<|im_end|>`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary string of a token (byte-level pieces look like `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Vocabulary size including added tokens (the `tokenizers` crate copies its vocabulary to
    /// count it: not for hot loops).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Every token's bytes, by id, as the text it stands for (what a grammar engine matches
    /// output against): byte-level pieces (`Ġthe`) mapped back through GPT-2's byte alphabet,
    /// SentencePiece pieces with `▁` as a space and `<0xNN>` as the byte NN. Special tokens
    /// (added tokens marked special, or of the form `<…>`) are flagged and keep their text; ids
    /// the vocabulary lacks are empty.
    pub fn token_bytes(&self) -> Vec<TokenBytes> {
        let size = self.vocab_size();
        let mut out = vec![TokenBytes::default(); size];
        let byte_level = byte_level_alphabet();
        let added = self.inner.get_added_tokens_decoder();
        for (id, entry) in out.iter_mut().enumerate() {
            let id = id as u32;
            if let Some(token) = added.get(&id) {
                entry.special = token.special
                    || (token.content.starts_with('<') && token.content.ends_with('>'));
                entry.bytes = token.content.clone().into_bytes();
                continue;
            }
            let Some(piece) = self.inner.id_to_token(id) else {
                continue;
            };
            entry.bytes = if let Some(hex) = piece
                .strip_prefix("<0x")
                .and_then(|h| h.strip_suffix('>'))
                .filter(|h| h.len() == 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                vec![hex]
            } else if let Some(bytes) = piece
                .chars()
                .map(|c| byte_level.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .filter(|_| self.is_byte_level())
            {
                bytes
            } else {
                piece.replace('▁', " ").into_bytes()
            };
        }
        out
    }

    /// Whether the vocabulary is GPT-2-style byte-level BPE (its pre-tokenizer or decoder is
    /// `ByteLevel`).
    fn is_byte_level(&self) -> bool {
        let json = |v: Option<String>| v.unwrap_or_default();
        let decoder = json(
            self.inner
                .get_decoder()
                .and_then(|d| serde_json::to_string(d).ok()),
        );
        let pre = json(
            self.inner
                .get_pre_tokenizer()
                .and_then(|p| serde_json::to_string(p).ok()),
        );
        decoder.contains("ByteLevel") || pre.contains("ByteLevel")
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh incremental detokenizer over this tokenizer.
    pub fn detokenizer(&self, skip_special: bool) -> Detokenizer<'_> {
        Detokenizer {
            tokenizer: TokenizerRef::Borrowed(self),
            ids: Vec::new(),
            window: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special,
            partial: false,
        }
    }
}

/// One token's text as bytes (see [`Tokenizer::token_bytes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    /// A special token (`<|im_end|>`, `<s>`): never produced by matching plain text.
    pub special: bool,
}

/// GPT-2's byte alphabet inverted: the printable character each byte is written as in a
/// byte-level vocabulary, mapped back to the byte.
fn byte_level_alphabet() -> std::collections::HashMap<char, u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut map = std::collections::HashMap::new();
    let mut next = 256u32;
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        map.insert(char::from_u32(c).expect("a valid code point"), b as u8);
    }
    map
}

/// A detokenizer that shares ownership of its tokenizer, for streams that outlive any borrow
/// (one per request in the engine).
pub fn shared_detokenizer(tokenizer: Arc<Tokenizer>, skip_special: bool) -> Detokenizer<'static> {
    Detokenizer {
        tokenizer: TokenizerRef::Shared(tokenizer),
        ids: Vec::new(),
        window: Vec::new(),
        prefix_offset: 0,
        read_offset: 0,
        skip_special,
        partial: false,
    }
}

#[derive(Debug)]
enum TokenizerRef<'a> {
    Borrowed(&'a Tokenizer),
    Shared(Arc<Tokenizer>),
}

impl std::ops::Deref for TokenizerRef<'_> {
    type Target = Tokenizer;

    fn deref(&self) -> &Tokenizer {
        match self {
            Self::Borrowed(tokenizer) => tokenizer,
            Self::Shared(tokenizer) => tokenizer,
        }
    }
}

/// Turns a stream of token ids into text, emitting only complete UTF-8.
///
/// Byte-level tokens may carry part of a character; decoding them alone yields U+FFFD. We decode a
/// short window of recent tokens twice, with and without the newest ones, and emit the difference
/// only once it no longer ends in U+FFFD (the approach of Hugging Face text-generation-inference).
/// Decoding a window rather than single tokens also keeps tokenizer-specific spacing right.
///
/// Tokens that decoding drops (special tokens skipped, ids past the vocabulary) never enter the
/// window, and the tokens held back are bounded ([`MAX_PENDING`]): a long run of tokens that add
/// no text or keep ending in U+FFFD (stray UTF-8 continuation bytes) would otherwise make every
/// push decode a growing window, quadratic time in the length of the run.
#[derive(Debug)]
pub struct Detokenizer<'a> {
    tokenizer: TokenizerRef<'a>,
    /// Every id pushed.
    ids: Vec<u32>,
    /// The ids decoded for text: `ids` less those `decode` drops (special tokens skipped, ids
    /// past the vocabulary) and runs of ids found to add no text.
    window: Vec<u32>,
    /// Start (in `window`) of the context decoded for comparison.
    prefix_offset: usize,
    /// End (in `window`) of what has already been emitted.
    read_offset: usize,
    skip_special: bool,
    /// The last push left a character unfinished (its text so far ends in U+FFFD).
    partial: bool,
}

/// Tokens held back (not yet emitted) before the detokenizer looks for text it can emit early, or
/// drops tokens that add none.
pub const MAX_PENDING: usize = 16;

/// Context tokens kept in front of the window when it is trimmed.
const WINDOW_KEEP: usize = 64;

impl Detokenizer<'_> {
    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        if self.tokenizer.is_dropped_by_decode(id, self.skip_special) {
            // Decoding drops it before the decoder sees it: the window's text is the same
            // without it.
            return Ok(None);
        }
        self.window.push(id);
        let text = self.pending(false)?;
        Ok(text)
    }

    /// Returns whatever is still held back (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> Result<Option<String>> {
        self.pending(true)
    }

    /// Whether the ids pushed so far end in the middle of a character: its bytes are still
    /// arriving, so its text is held back.
    pub fn holds_partial_character(&self) -> bool {
        self.partial
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn pending(&mut self, force: bool) -> Result<Option<String>> {
        let tok = &*self.tokenizer;
        let prefix = tok.decode(
            &self.window[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let full = tok.decode(&self.window[self.prefix_offset..], self.skip_special)?;
        let held = self.window.len() - self.read_offset;
        self.partial = false;
        if full.len() <= prefix.len() {
            if held > MAX_PENDING {
                // The held tokens add no text to their context (empty pieces, or a decoder that
                // drops them). Later text does not depend on them; stop decoding them.
                self.window.truncate(self.read_offset);
            }
            return Ok(None);
        }
        if !force && full.ends_with('\u{FFFD}') {
            if held > MAX_PENDING {
                return self.emit_settled(&prefix, &full);
            }
            self.partial = true;
            return Ok(None);
        }
        let end = self.window.len();
        Ok(Some(self.emit(&prefix, &full, end)))
    }

    /// Emits the text of `full` past `prefix` and moves the window: what was read becomes the
    /// context, `end` the new read position.
    fn emit(&mut self, prefix: &str, full: &str, end: usize) -> String {
        // The window's text normally extends the prefix; if a tokenizer rewrote it, emit from the
        // first byte where they differ, on a character boundary.
        let mut split = prefix.len();
        if !full.starts_with(prefix) {
            split = full
                .bytes()
                .zip(prefix.bytes())
                .take_while(|(a, b)| a == b)
                .count();
        }
        while !full.is_char_boundary(split) {
            split -= 1;
        }
        let text = full[split..].to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = end;
        if self.prefix_offset > WINDOW_KEEP * 2 {
            let cut = self.prefix_offset - WINDOW_KEEP;
            self.window.drain(..cut);
            self.prefix_offset -= cut;
            self.read_offset -= cut;
        }
        text
    }

    /// Many held tokens and the text still ends in U+FFFD: emits the text of all but the last
    /// few. A character still incomplete has at most three bytes, so it lies in the last three
    /// tokens when each adds a byte; the text before them is settled once decoding the tokens
    /// before the cut gives a prefix of the whole window's text (no character straddles the cut).
    fn emit_settled(&mut self, prefix: &str, full: &str) -> Result<Option<String>> {
        let tok = &*self.tokenizer;
        let last = self.window.len().saturating_sub(3);
        // The cut just before the last three tokens, or up to three earlier.
        for cut in (self.read_offset + 1..=last).rev().take(4) {
            let settled = tok.decode(&self.window[self.prefix_offset..cut], self.skip_special)?;
            if settled.len() > prefix.len() && full.starts_with(&settled) {
                return Ok(Some(self.emit(prefix, &settled, cut)));
            }
        }
        Ok(None)
    }
}
