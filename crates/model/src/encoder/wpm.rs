//! BERT's WordPiece vocabulary as a GGUF file holds it (`tokenizer.ggml.model = "bert"`), and
//! the tokenizer llama.cpp runs over it (its WPM tokenizer), so that token ids are llama.cpp's.
//!
//! In the GGUF vocabulary a word-initial piece carries the phantom space `▁` and a continuation
//! piece is bare (Hugging Face's `##` removed); control tokens (`[CLS]`) are as written. A text is
//! split into words: codepoints mapped to their canonical decomposition's first codepoint and
//! combining marks dropped (with accent stripping), controls dropped, lowercased (when the vocab
//! says so), cut at whitespace, and every punctuation mark, ASCII symbol and CJK ideograph made a
//! word of its own. Each word, with `▁` before it, is covered greedily by the longest pieces
//! from the left; a word that cannot be covered becomes the unknown token.

use std::collections::HashMap;

use unicode_categories::UnicodeCategories;

/// The phantom space that marks a word-initial piece.
const PHANTOM: char = '\u{2581}';

/// GGUF token types (`tokenizer.ggml.token_type`) whose texts special-token parsing recognises.
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// What the vocabulary's metadata says around its pieces.
#[derive(Debug, Clone, PartialEq)]
pub struct WpmOptions {
    pub unk: u32,
    /// `[CLS]` in BERT's vocabularies (llama.cpp's BOS: `tokenizer.ggml.bos_token_id`, 101
    /// without it).
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id` (none without it).
    pub eos: Option<u32>,
    /// `[SEP]` (`tokenizer.ggml.seperator_token_id`, 102 without it).
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    /// `tokenizer.ggml.normalizer.lowercase`.
    pub lowercase: bool,
    /// `tokenizer.ggml.normalizer.strip_accents` (as `lowercase` without it).
    pub strip_accents: bool,
}

/// A WordPiece vocabulary and its tokenizer.
#[derive(Debug, Clone)]
pub struct WpmVocab {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Control and user-defined tokens, longest first: what `parse_special` recognises.
    specials: Vec<(String, u32)>,
    /// The longest piece, in bytes.
    max_token_len: usize,
    pub options: WpmOptions,
}

impl WpmVocab {
    /// A vocabulary of `tokens` (GGUF texts) with their GGUF token types (`types` may be empty:
    /// all normal).
    pub fn new(tokens: Vec<String>, types: &[i32], options: WpmOptions) -> Self {
        let mut ids = HashMap::with_capacity(tokens.len());
        let mut specials = Vec::new();
        for (i, token) in tokens.iter().enumerate() {
            // A repeated text maps to its last id, as llama.cpp's map does.
            ids.insert(token.clone(), i as u32);
            let ty = types.get(i).copied().unwrap_or(1);
            if (ty == CONTROL || ty == USER_DEFINED) && !token.is_empty() {
                specials.push((token.clone(), i as u32));
            }
        }
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        Self {
            tokens,
            ids,
            specials,
            max_token_len,
            options,
        }
    }

    /// How many tokens the vocabulary has.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The GGUF texts of the tokens, by id.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Token ids of `text`, as `llama_tokenize` gives them: `add_special` puts the BOS before
    /// and the SEP after (llama.cpp's WPM adds both whatever the vocabulary's add flags say),
    /// `parse_special` recognises control tokens written in the text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && let Some(bos) = self.options.bos {
            out.push(bos);
        }
        if parse_special {
            let mut rest = text;
            while !rest.is_empty() {
                match self.next_special(rest) {
                    Some((at, token, id)) => {
                        self.tokenize_into(&rest[..at], &mut out);
                        out.push(id);
                        rest = &rest[at + token.len()..];
                    }
                    None => {
                        self.tokenize_into(rest, &mut out);
                        break;
                    }
                }
            }
        } else {
            self.tokenize_into(text, &mut out);
        }
        if add_special && let Some(sep) = self.options.sep {
            out.push(sep);
        }
        out
    }

    /// A query and a document put together as llama-server's `/rerank` does for a model without
    /// a rerank prompt: BOS, the query, EOS (SEP without one), SEP, the document, EOS, each
    /// special token only where the vocabulary adds it; both texts without special tokens.
    pub fn rerank_pair(&self, query: &str, document: &str) -> Vec<u32> {
        let o = &self.options;
        let eos = o.eos.or(o.sep);
        let mut out = Vec::new();
        if o.add_bos
            && let Some(bos) = o.bos
        {
            out.push(bos);
        }
        self.tokenize_into(query, &mut out);
        if o.add_eos
            && let Some(eos) = eos
        {
            out.push(eos);
        }
        if o.add_sep
            && let Some(sep) = o.sep
        {
            out.push(sep);
        }
        self.tokenize_into(document, &mut out);
        if o.add_eos
            && let Some(eos) = eos
        {
            out.push(eos);
        }
        out
    }

    /// The first special token in `text`: its byte offset, text and id (the longest at the
    /// earliest offset).
    fn next_special<'a>(&'a self, text: &str) -> Option<(usize, &'a str, u32)> {
        self.specials
            .iter()
            .filter_map(|(token, id)| {
                text.find(token.as_str())
                    .map(|at| (at, token.as_str(), *id))
            })
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))
    }

    /// The pieces of `text` (no special tokens), appended to `out`.
    fn tokenize_into(&self, text: &str, out: &mut Vec<u32>) {
        for word in words(text, self.options.lowercase, self.options.strip_accents) {
            let word: String = std::iter::once(PHANTOM).chain(word.chars()).collect();
            let start = out.len();
            let bytes = word.len();
            let mut i = 0;
            while i < bytes {
                let longest = (i + self.max_token_len).min(bytes);
                let found = (i + 1..=longest)
                    .rev()
                    .filter(|&j| word.is_char_boundary(j))
                    .find_map(|j| self.ids.get(&word[i..j]).map(|&id| (j, id)));
                match found {
                    Some((j, id)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(start);
                        break;
                    }
                }
            }
            if out.len() == start {
                out.push(self.options.unk);
            }
        }
    }
}

/// The words of `text` as llama.cpp's WPM pre-processing cuts them.
pub fn words(text: &str, lowercase: bool, strip_accents: bool) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if strip_accents { decomposed_base(c) } else { c };
        if c.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || is_control(c) {
            continue;
        }
        if strip_accents && c.is_mark() {
            continue;
        }
        let c = if lowercase { simple_lowercase(c) } else { c };
        if c.is_punctuation() || ((c as u32) < 0x7F && c.is_symbol()) || is_chinese_char(c) {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            words.last_mut().expect("a word").push(c);
            words.push(String::new());
        } else {
            words.last_mut().expect("a word").push(c);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// The first codepoint of `c`'s canonical decomposition (llama.cpp maps each codepoint to one:
/// `é` to `e`, the accent gone).
fn decomposed_base(c: char) -> char {
    let mut first = None;
    unicode_normalization_alignments::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// Unicode's other categories that a codepoint can be (`\p{C}` less the unassigned).
fn is_control(c: char) -> bool {
    c.is_other_control() || c.is_other_format() || c.is_other_private_use()
}

/// The one-codepoint lowercase of `c` (Unicode's simple mapping: `İ` is `i`).
fn simple_lowercase(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// The CJK ideograph blocks BERT isolates (Hugging Face's ranges, as llama.cpp uses them).
fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(lowercase: bool) -> WpmOptions {
        WpmOptions {
            unk: 1,
            bos: Some(2),
            eos: Some(3),
            sep: Some(3),
            add_bos: true,
            add_eos: true,
            add_sep: false,
            lowercase,
            strip_accents: lowercase,
        }
    }

    fn vocab(lowercase: bool) -> WpmVocab {
        let tokens = [
            "[PAD]",
            "[UNK]",
            "[CLS]",
            "[SEP]",
            "▁hello",
            "▁world",
            "▁un",
            "aff",
            "able",
            "▁cafe",
            "▁!",
            "▁,",
            "▁中",
            "▁文",
            "▁résumé",
            "▁naive",
            "▁$",
            "▁a",
            "▁ab",
            "b",
            "c",
        ];
        let types = [
            3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        ];
        WpmVocab::new(
            tokens.iter().map(|t| (*t).to_owned()).collect(),
            &types,
            options(lowercase),
        )
    }

    #[test]
    fn words_split_at_whitespace_punctuation_symbols_and_ideographs() {
        assert_eq!(
            words("Hello,  World!\tcafé $5 中文x", true, true),
            [
                "hello", ",", "world", "!", "cafe", "$", "5", "中", "文", "x"
            ]
        );
        // Without accent stripping the accent stays; a non-ASCII symbol stays inside its word.
        assert_eq!(words("Café a©b", false, false), ["Café", "a©b"]);
        // Controls and NUL are dropped; a lone combining mark goes with accent stripping.
        assert_eq!(
            words("a\u{200B}b\u{0}c e\u{0301}", true, true),
            ["abc", "e"]
        );
        assert_eq!(words("İ", true, true), ["i"]);
        assert!(words("  \n ", true, true).is_empty());
    }

    #[test]
    fn pieces_are_the_longest_from_the_left_and_unknown_words_are_one_unk() {
        let v = vocab(true);
        assert_eq!(v.encode("hello unaffable", false, false), [4, 6, 7, 8]);
        // "unaffablex" cannot be covered: the whole word is [UNK], the next word still counts.
        assert_eq!(v.encode("unaffablex world", false, false), [1, 5]);
        assert_eq!(v.encode("Café, 中文!", false, false), [9, 11, 12, 13, 10]);
        // "abc": ▁ab then c (not ▁a then b then c).
        assert_eq!(v.encode("abc", false, false), [18, 20]);
        // Without lowercasing "Hello" is unknown.
        assert_eq!(vocab(false).encode("Hello hello", false, false), [1, 4]);
        // The accented piece is reachable only without accent stripping.
        assert_eq!(vocab(false).encode("résumé", false, false), [14]);
        assert_eq!(vocab(true).encode("résumé", false, false), [1]);
    }

    #[test]
    fn special_tokens_are_parsed_only_when_asked_and_added_as_the_vocab_says() {
        let v = vocab(true);
        assert_eq!(v.encode("hello[SEP]world", false, true), [4, 3, 5]);
        // As text, the brackets are punctuation and "sep" is unknown.
        assert_eq!(v.encode("[SEP]", false, false), [1, 1, 1]);
        // add_special: BOS before and SEP after, whatever the add flags (as llama.cpp's WPM).
        assert_eq!(v.encode("hello", true, false), [2, 4, 3]);
        let mut flags_off = v.clone();
        flags_off.options.add_bos = false;
        flags_off.options.add_sep = false;
        assert_eq!(flags_off.encode("hello", true, false), [2, 4, 3]);
    }

    #[test]
    fn a_rerank_pair_is_cls_query_sep_document_sep() {
        let v = vocab(true);
        assert_eq!(v.rerank_pair("hello", "world"), [2, 4, 3, 5, 3]);
        // llama.cpp's default BERT flags (add_sep, no add_eos, no EOS): [CLS] q [SEP] d.
        let mut defaults = v.clone();
        defaults.options.add_eos = false;
        defaults.options.add_sep = true;
        defaults.options.eos = None;
        assert_eq!(defaults.rerank_pair("hello", "world"), [2, 4, 3, 5]);
    }
}
