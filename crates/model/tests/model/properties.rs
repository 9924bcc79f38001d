//! Property tests of the invariants: packing round-trips, the GGUF reader never panics on damaged
//! input, and streamed detokenization always adds up to the whole decode.

use std::sync::OnceLock;

use mlxcel_model::gguf::GgufFile;
use mlxcel_model::{Tokenizer, convert_gguf, pack, unpack};
use proptest::prelude::*;

use crate::fixtures::{MERGES, SPECIALS, TinyLlama};

/// A tiny model's GGUF bytes and tokenizer, built once.
fn fixture() -> &'static (Vec<u8>, Tokenizer) {
    static FIXTURE: OnceLock<(Vec<u8>, Tokenizer)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("tiny.gguf");
        TinyLlama {
            layers: 1,
            ..TinyLlama::default()
        }
        .write(&gguf, 9);
        convert_gguf(&gguf, &dir.path().join("ckpt")).unwrap();
        let tokenizer = Tokenizer::from_dir(&dir.path().join("ckpt")).unwrap();
        (std::fs::read(&gguf).unwrap(), tokenizer)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pack_unpack_round_trip(bits in prop::sample::select(vec![4u32, 8]), seed in prop::collection::vec(any::<u8>(), 32..=256)) {
        let n = seed.len() / 32 * 32;
        let values: Vec<u8> = seed[..n].iter().map(|v| v & ((1u16 << bits) - 1) as u8).collect();
        let words = pack(&values, bits);
        prop_assert_eq!(words.len(), n * bits as usize / 32);
        for (i, &v) in values.iter().enumerate() {
            prop_assert_eq!(unpack(&words, bits, i), u32::from(v));
        }
    }

    #[test]
    fn gguf_reader_survives_truncation_and_corruption(cut in 0.0f64..1.0, flips in prop::collection::vec((0.0f64..1.0, any::<u8>()), 0..8)) {
        let (bytes, _) = fixture();
        let mut damaged = bytes[..(bytes.len() as f64 * cut) as usize].to_vec();
        let len = damaged.len();
        for (at, value) in flips {
            if len > 0 {
                damaged[((len - 1) as f64 * at) as usize] = value;
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.gguf");
        std::fs::write(&path, &damaged).unwrap();
        // Errors are fine; panics, hangs and huge allocations are not. Whatever opens must also
        // hand out every tensor's bytes without panicking.
        if let Ok(file) = GgufFile::open(&path) {
            for info in &file.tensors {
                let _ = file.tensor_data(info);
            }
        }
    }

    #[test]
    fn streamed_detokenization_adds_up_to_decode(ids in prop::collection::vec(0u32..(SPECIALS.len() + 256 + MERGES.len()) as u32, 0..40)) {
        let (_, tokenizer) = fixture();
        let mut detok = tokenizer.detokenizer(false);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(piece) = detok.push(id).unwrap() {
                streamed.push_str(&piece);
            }
        }
        streamed.extend(detok.flush().unwrap());
        prop_assert_eq!(streamed, tokenizer.decode(&ids, false).unwrap());
    }
}
