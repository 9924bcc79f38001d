//! The tokenizer built from GGUF metadata: round trips on tricky text, special-token parsing, and
//! incremental detokenization that only emits complete UTF-8.

use mlxcel_model::{Tokenizer, convert_gguf};

use crate::fixtures::{TinyLlama, byte_token_id};

/// A converted tiny model's tokenizer (byte-level BPE with a few merges).
fn tiny_tokenizer() -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    TinyLlama::default().write(&gguf, 5);
    let out = dir.path().join("ckpt");
    convert_gguf(&gguf, &out).unwrap();
    let tokenizer = Tokenizer::from_dir(&out).unwrap();
    (dir, tokenizer)
}

pub const TRICKY: &[&str] = &[
    "the the  then",
    "héllo wörld — naïve café",
    "日本語のテキスト",
    "emoji 🌍🎉👩‍👩‍👧 and flags 🇫🇷",
    "   leading, trailing   ",
    "tabs\tand\nnewlines\r\n\n  mixed \u{a0}nbsp",
    "digits 1234567890 and 3.14159",
    "",
];

#[test]
fn round_trips_tricky_text() {
    let (_dir, tok) = tiny_tokenizer();
    for text in TRICKY {
        let ids = tok.encode(text, true, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), *text);
    }
}

#[test]
fn merges_apply_and_digits_split() {
    let (_dir, tok) = tiny_tokenizer();
    let the = tok.token_to_id("Ġthe").unwrap();
    let ids = tok.encode("the the", true, true).unwrap();
    let he = tok.token_to_id("he").unwrap();
    assert_eq!(ids, [byte_token_id(b't'), he, the]);
    let digits = tok.encode("123", true, true).unwrap();
    assert_eq!(
        digits,
        [
            byte_token_id(b'1'),
            byte_token_id(b'2'),
            byte_token_id(b'3')
        ]
    );
}

#[test]
fn special_tokens_parse_unless_disabled() {
    let (_dir, tok) = tiny_tokenizer();
    assert_eq!(tok.encode("<|im_start|>", true, true).unwrap(), [1]);
    let plain = tok.encode("<|im_start|>", true, false).unwrap();
    assert_eq!(plain.len(), "<|im_start|>".len());
    assert_eq!(tok.decode(&plain, false).unwrap(), "<|im_start|>");
    assert_eq!(tok.decode(&[1, byte_token_id(b'a')], true).unwrap(), "a");
}

#[test]
fn detokenizer_emits_complete_utf8_byte_by_byte() {
    let (_dir, tok) = tiny_tokenizer();
    for text in TRICKY {
        let mut detok = tok.detokenizer(false);
        let mut out = String::new();
        for &b in text.as_bytes() {
            if let Some(piece) = detok.push(byte_token_id(b)).unwrap() {
                assert!(!piece.contains('\u{FFFD}'), "{text:?}: emitted {piece:?}");
                out.push_str(&piece);
            }
        }
        out.extend(detok.flush().unwrap());
        assert_eq!(out, *text);
    }
}

#[test]
fn detokenizer_holds_a_split_character_then_flushes_it_lossily() {
    let (_dir, tok) = tiny_tokenizer();
    let mut detok = tok.detokenizer(false);
    let euro = "€".as_bytes();
    assert_eq!(
        detok.push(byte_token_id(b'a')).unwrap().as_deref(),
        Some("a")
    );
    assert_eq!(detok.push(byte_token_id(euro[0])).unwrap(), None);
    assert_eq!(detok.push(byte_token_id(euro[1])).unwrap(), None);
    assert_eq!(detok.flush().unwrap().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn detokenizer_matches_decode_on_merged_tokens() {
    let (_dir, tok) = tiny_tokenizer();
    let text = "the then 🌍 the";
    let ids = tok.encode(text, true, true).unwrap();
    let mut detok = tok.detokenizer(false);
    let mut out = String::new();
    for &id in &ids {
        out.extend(detok.push(id).unwrap());
    }
    out.extend(detok.flush().unwrap());
    assert_eq!(out, text);
}

#[test]
fn shared_detokenizer_streams_like_the_borrowed_one() {
    let (_dir, tok) = tiny_tokenizer();
    let ids = tok.encode("the 🌍", true, true).unwrap();
    let mut shared = mlxcel_model::shared_detokenizer(std::sync::Arc::new(tok.clone()), false);
    let mut out = String::new();
    for &id in &ids {
        out.extend(shared.push(id).unwrap());
    }
    out.extend(shared.flush().unwrap());
    assert_eq!(out, "the 🌍");
    assert_eq!(shared.ids(), ids.as_slice());
}

/// Streams `ids` through a detokenizer (special tokens skipped) and returns the text.
fn stream(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut detok = tok.detokenizer(true);
    let mut out = String::new();
    for &id in ids {
        out.extend(detok.push(id).unwrap());
    }
    out.extend(detok.flush().unwrap());
    assert_eq!(detok.ids(), ids);
    out
}

/// Long runs of tokens that add no text (special tokens, ids past the vocabulary) or keep ending
/// in U+FFFD (stray continuation bytes, split characters among them) stream exactly the text of
/// decoding everything at once, and each push decodes a bounded window (before, a run cost
/// quadratic time).
#[test]
fn long_runs_without_complete_text_stream_exactly_in_bounded_time() {
    let (_dir, tok) = tiny_tokenizer();
    let vocab = tok.vocab_size() as u32;
    let euro = "€".as_bytes();
    let mut runs: Vec<Vec<u32>> = Vec::new();
    // Stray continuation bytes, then a character split across three tokens, then text.
    let mut stray = vec![byte_token_id(b'a')];
    stray.extend(std::iter::repeat_n(byte_token_id(0x80), 6000));
    stray.extend(euro.iter().map(|&b| byte_token_id(b)));
    stray.push(byte_token_id(b'z'));
    runs.push(stray);
    // Split characters between runs of stray bytes, at every offset near the early-emit bound.
    for gap in 14..22 {
        let mut ids = Vec::new();
        for _ in 0..40 {
            ids.extend(std::iter::repeat_n(byte_token_id(0xbf), gap));
            ids.extend(euro.iter().map(|&b| byte_token_id(b)));
            ids.push(byte_token_id(0xe2));
        }
        runs.push(ids);
    }
    // Special tokens and ids past the vocabulary between words.
    let mut silent = tok.encode("the ", true, true).unwrap();
    silent.extend((0..6000).map(|i| if i % 3 == 0 { 1 } else { vocab + i }));
    silent.extend(tok.encode("then 🌍", true, true).unwrap());
    runs.push(silent);
    // Found by the `detokenize` fuzz target: special tokens between the bytes of a character
    // once many tokens are held (each held token must add a byte for the early emit to be right).
    let mut split = vec![0; 14];
    split.push(byte_token_id(0xd2));
    split.extend([0; 13]);
    split.extend([byte_token_id(0x96), byte_token_id(b'z')]);
    runs.push(split);
    let start = std::time::Instant::now();
    for ids in &runs {
        let known: Vec<u32> = ids.iter().copied().filter(|&id| id < vocab).collect();
        assert_eq!(stream(&tok, ids), tok.decode(&known, true).unwrap());
    }
    // ~20,000 pushes: 0.5 s here in a debug build; with unbounded windows, 40 s.
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Found by the `tokenizer` fuzz target: a JSON syntax error inside `decoder` made the
/// `tokenizers` crate panic (`expect("Helper")`); it is now refused with the file named.
#[test]
fn a_tokenizer_json_with_a_syntax_error_is_refused_not_a_panic() {
    let (dir, _) = tiny_tokenizer();
    let path = dir.path().join("ckpt/tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.find("\"decoder\":").expect("a decoder") + "\"decoder\":".len();
    let broken = format!("{}{{\"type\" \"ByteLevel\"}}{}", &text[..at], &text[at..]);
    std::fs::write(&path, broken).unwrap();
    let err = Tokenizer::from_file(&path).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json: tokenizer: not valid JSON"),
        "{err}"
    );
}
