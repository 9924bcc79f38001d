//! SentencePiece (`tokenizer.ggml.model = llama`) vocabularies: merges derived from scores, byte
//! fallback, the leading `▁`, BOS, and streaming.

use mlxcel_model::gguf::GgufValue;
use mlxcel_model::{Tokenizer, convert_gguf};
use proptest::prelude::*;

use crate::fixtures::TinyLlama;

/// `<unk>`, `<s>`, `</s>`, 256 byte pieces, then scored pieces (higher score merges first).
const PIECES: [(&str, f32); 12] = [
    ("▁", -1.0),
    ("h", -2.0),
    ("e", -3.0),
    ("l", -4.0),
    ("o", -5.0),
    ("▁h", -6.0),
    ("ll", -7.0),
    ("▁he", -8.0),
    ("llo", -9.0),
    ("▁hello", -10.0),
    ("he", -11.0),
    ("▁▁", -12.0),
];
const FIRST_PIECE: u32 = 3 + 256;

fn byte_piece(b: u8) -> u32 {
    3 + u32::from(b)
}

fn piece(text: &str) -> u32 {
    FIRST_PIECE + PIECES.iter().position(|(p, _)| *p == text).unwrap() as u32
}

fn spm_tokenizer() -> (tempfile::TempDir, Tokenizer) {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (p, score) in PIECES {
        tokens.push(p.to_owned());
        types.push(1);
        scores.push(score);
    }
    let mut w = TinyLlama::default().metadata();
    let array = |items: Vec<GgufValue>| GgufValue::Array(items);
    // Later keys replace the gpt2 vocabulary written by `metadata()`.
    w.metadata("tokenizer.ggml.model", GgufValue::String("llama".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            array(tokens.into_iter().map(GgufValue::String).collect()),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            array(types.into_iter().map(GgufValue::I32).collect()),
        )
        .metadata(
            "tokenizer.ggml.scores",
            array(scores.into_iter().map(GgufValue::F32).collect()),
        )
        .metadata("tokenizer.ggml.unknown_token_id", GgufValue::U32(0))
        .metadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("spm.gguf");
    w.write(&mut std::fs::File::create(&gguf).unwrap()).unwrap();
    // The tensors do not matter here; write the tokenizer through a full conversion anyway.
    let model = dir.path().join("model.gguf");
    TinyLlama::default().write(&model, 2);
    merge_metadata(&gguf, &model);
    let out = dir.path().join("ckpt");
    convert_gguf(&model, &out).unwrap();
    let tokenizer = Tokenizer::from_dir(&out).unwrap();
    (dir, tokenizer)
}

/// Rewrites `model` with the tokenizer metadata of `vocab_source` (keys of the latter win).
fn merge_metadata(vocab_source: &std::path::Path, model: &std::path::Path) {
    use mlxcel_model::gguf::{GgufFile, GgufWriter};
    let vocab = GgufFile::open(vocab_source).unwrap();
    let weights = GgufFile::open(model).unwrap();
    let mut w = GgufWriter::new();
    let mut metadata = weights.metadata.clone();
    metadata.extend(vocab.metadata.clone());
    for (k, v) in metadata {
        w.metadata(&k, v);
    }
    for info in &weights.tensors {
        w.tensor(
            &info.name,
            &info.dims,
            info.ggml_type,
            weights.tensor_data(info).unwrap().to_vec(),
        );
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes).unwrap();
    drop(weights);
    std::fs::write(model, bytes).unwrap();
}

#[test]
fn merges_follow_scores_with_bos_and_byte_fallback() {
    let (_dir, tok) = spm_tokenizer();
    assert_eq!(
        tok.encode("hello", true, true).unwrap(),
        [1, piece("▁hello")]
    );
    assert_eq!(
        tok.encode("hello hello", false, true).unwrap(),
        [piece("▁hello"), piece("▁hello")]
    );
    // "▁he" outranks "he": the leading piece merges as ▁h + e, never ▁ + he.
    assert_eq!(tok.encode("he", false, true).unwrap(), [piece("▁he")]);
    let expected = [
        piece("▁h"),
        byte_piece(0xC3),
        byte_piece(0xA9),
        byte_piece(b'!'),
    ];
    assert_eq!(tok.encode("hé!", false, true).unwrap(), expected);
    assert_eq!(tok.decode(&expected, false).unwrap(), "hé!");
    assert_eq!(tok.decode(&[1, piece("▁hello")], true).unwrap(), "hello");
}

#[test]
fn round_trips_tricky_text() {
    let (_dir, tok) = spm_tokenizer();
    for text in crate::tokenizer::TRICKY {
        let ids = tok.encode(text, false, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), *text, "{ids:?}");
    }
}

/// The tokenizer, built once for the property tests.
fn shared() -> &'static Tokenizer {
    static TOKENIZER: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOKENIZER.get_or_init(|| spm_tokenizer().1)
}

fn stream(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut detok = tok.detokenizer(false);
    let mut streamed = String::new();
    for &id in ids {
        streamed.extend(detok.push(id).unwrap());
    }
    streamed.extend(detok.flush().unwrap());
    streamed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Text the model could produce streams exactly as it decodes.
    #[test]
    fn streamed_text_adds_up_to_decode(text in "[ hélo!🌍\\n]{0,24}") {
        let tok = shared();
        let ids = tok.encode(&text, false, true).unwrap();
        prop_assert_eq!(stream(tok, &ids), tok.decode(&ids, false).unwrap());
    }

    /// Arbitrary ids, including invalid byte runs, which the ByteFallback decoder replaces as a whole
    /// run (so streaming, having emitted the valid head of a run, can differ from `decode`): no
    /// errors, and valid text is never lost.
    #[test]
    fn arbitrary_ids_stream_without_errors(ids in prop::collection::vec(0u32..FIRST_PIECE + PIECES.len() as u32, 0..30)) {
        let tok = shared();
        let streamed = stream(tok, &ids);
        let decoded = tok.decode(&ids, false).unwrap();
        if !decoded.contains('\u{FFFD}') {
            prop_assert_eq!(streamed, decoded);
        }
    }
}
