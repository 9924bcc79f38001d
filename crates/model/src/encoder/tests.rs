//! Reading BERT GGUF files: the fixture as written, and hostile ones refused by name.

use super::*;
use crate::error::ModelError;
use crate::gguf::GgmlType;

fn write(spec: &TinyBert) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-bert.gguf");
    write_tiny_bert(&path, spec).unwrap();
    (dir, path)
}

#[test]
fn the_fixture_reads_back_with_its_head_and_vocabulary() {
    let (_dir, path) = write(&TinyBert::default());
    assert!(is_encoder_gguf(&path));
    let bert = BertCheckpoint::open(&path).unwrap();
    assert_eq!(bert.config.hidden, 32);
    assert_eq!(bert.config.layers, 2);
    assert_eq!(bert.config.pooling, Some(EncoderPooling::Rank));
    assert_eq!(bert.weights.layers.len(), 2);
    assert_eq!(bert.vocab.len(), TINY_BERT_TOKENS.len());
    let head = bert.head.as_ref().expect("a reranker head");
    assert_eq!(head.outputs(), 1);
    // [CLS] the cat [SEP] a dog [SEP]
    assert_eq!(
        bert.vocab.rerank_pair("The cat", "a DOG"),
        [2, 5, 6, 3, 10, 11, 3]
    );
    assert!(bert.parameters() > 0);
}

#[test]
fn f16_and_q8_0_matrices_read_as_llama_cpp_dequantizes_them() {
    let (_d1, f32_path) = write(&TinyBert::default());
    let reference = BertCheckpoint::open(&f32_path).unwrap();
    for ty in [GgmlType::F16, GgmlType::Q8_0] {
        let (_d, path) = write(&TinyBert {
            matrix_type: ty,
            ..TinyBert::default()
        });
        let bert = BertCheckpoint::open(&path).unwrap();
        let (a, b) = (
            &bert.weights.layers[1].up.0,
            &reference.weights.layers[1].up.0,
        );
        assert_eq!(a.shape, b.shape);
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        // Q8_0's step is at most 0.5/127; f16's far finer. Both are not the f32 values.
        assert!(worst > 0.0 && worst < 0.5 / 127.0, "{ty}: {worst}");
    }
}

#[test]
fn a_missing_tensor_is_refused_by_name() {
    for name in [
        "blk.1.attn_k.weight",
        "token_embd_norm.bias",
        "position_embd.weight",
    ] {
        let (_d, path) = write(&TinyBert {
            drop_tensor: Some(name.into()),
            ..TinyBert::default()
        });
        let err = BertCheckpoint::open(&path).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingTensor { tensor, .. } if tensor == name),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn a_tensor_of_the_wrong_shape_is_refused_by_name() {
    for name in [
        "blk.0.ffn_up.weight",
        "token_embd.weight",
        "blk.0.attn_q.bias",
    ] {
        let (_d, path) = write(&TinyBert {
            grow_tensor: Some(name.into()),
            ..TinyBert::default()
        });
        let err = BertCheckpoint::open(&path).unwrap_err();
        assert!(
            matches!(&err, ModelError::TensorShape { tensor, .. } if tensor == name),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_head_with_a_pooler_reads_it_and_a_pooler_without_output_is_refused() {
    let (_d, path) = write(&TinyBert {
        pooler: true,
        ..TinyBert::default()
    });
    assert!(BertCheckpoint::open(&path).unwrap().head.is_some());
    let (_d, path) = write(&TinyBert {
        pooler: true,
        drop_tensor: Some("cls.output.weight".into()),
        ..TinyBert::default()
    });
    let err = BertCheckpoint::open(&path).unwrap_err().to_string();
    assert!(err.contains("cls.output.weight"), "{err}");
    // Without any head it is an embedding model.
    let (_d, path) = write(&TinyBert {
        drop_tensor: Some("cls.output.weight".into()),
        ..TinyBert::default()
    });
    assert!(BertCheckpoint::open(&path).unwrap().head.is_none());
}

#[test]
fn bad_metadata_and_a_unigram_vocabulary_are_refused_by_key() {
    use crate::gguf::{GgufFile, GgufValue, GgufWriter};
    let (_d, path) = write(&TinyBert::default());
    let gguf = GgufFile::open(&path).unwrap();
    let rewrite = |key: &str, value: GgufValue| {
        let mut w = GgufWriter::new();
        for (k, v) in &gguf.metadata {
            w.metadata(k, if k == key { value.clone() } else { v.clone() });
        }
        for t in &gguf.tensors {
            w.tensor(
                &t.name,
                &t.dims,
                t.ggml_type,
                gguf.tensor_data(t).unwrap().to_vec(),
            );
        }
        let out = path.with_extension("bad.gguf");
        let mut bytes = Vec::new();
        w.write(&mut bytes).unwrap();
        std::fs::write(&out, bytes).unwrap();
        BertCheckpoint::open(&out).unwrap_err().to_string()
    };
    let err = rewrite("tokenizer.ggml.model", GgufValue::String("t5".into()));
    assert!(
        err.contains("tokenizer.ggml.model") && err.contains("UGM"),
        "{err}"
    );
    let err = rewrite("bert.attention.head_count", GgufValue::U32(5));
    assert!(err.contains("bert.attention.head_count"), "{err}");
    let err = rewrite("bert.attention.causal", GgufValue::Bool(true));
    assert!(err.contains("bert.attention.causal"), "{err}");
    let err = rewrite("tokenizer.ggml.bos_token_id", GgufValue::U32(9999));
    assert!(err.contains("tokenizer.ggml.bos_token_id"), "{err}");
}

#[test]
fn the_engine_tokenizer_of_a_bert_gguf_encodes_with_wpm_and_decodes_wordpiece() {
    let (_d, path) = write(&TinyBert::default());
    let bert = BertCheckpoint::open(&path).unwrap();
    let vocab = std::sync::Arc::new(bert.vocab.clone());
    let tokenizer = crate::Tokenizer::from_wpm(vocab, &path).unwrap();
    // "runs" is ▁run + s; "running" cannot be covered (no "n" piece after ▁run): one [UNK];
    // "café" loses its accent (uncased).
    let ids = tokenizer
        .encode("The cat runs, running Café!", false, false)
        .unwrap();
    assert_eq!(ids, [5, 6, 24, 22, 20, 1, 27, 21]);
    assert_eq!(
        tokenizer.decode(&ids, false).unwrap(),
        "the cat runs, [UNK] cafe!"
    );
    // add_special: [CLS] before and [SEP] after, as llama.cpp's WPM.
    assert_eq!(tokenizer.encode("cat", true, false).unwrap(), [2, 6, 3]);
    assert_eq!(tokenizer.encode("cat[SEP]", false, true).unwrap(), [6, 3]);
    assert_eq!(tokenizer.token_to_id("[SEP]"), Some(3));
    assert_eq!(tokenizer.id_to_token(22).as_deref(), Some("##s"));
}
