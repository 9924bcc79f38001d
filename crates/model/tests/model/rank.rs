//! A reranker's classification head read from GGUF: llama.cpp's `cls.output.weight`, with the
//! keys its converter writes for a Qwen3-Reranker (rank pooling, the output labels, the rerank
//! prompt), is imported as `score.weight` with a `rank_head.json` saying how llama.cpp reads it.

use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter};
use mlxcel_model::{
    LoadedModel, RANK_HEAD_FILE, RankHeadFile, RankToken, convert_gguf, prepare_gguf,
};

use crate::fixtures::{TinyLlama, assert_lossless};

const PROMPT: &str = "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n";

/// The head's rows, `[2][hidden]`: fixed values exact in f16.
fn head_rows(hidden: usize) -> Vec<f32> {
    (0..2 * hidden)
        .map(|i| ((i * 7 % 33) as f32 - 16.0) / 16.0)
        .collect()
}

fn reranker(arch: &'static str, with_keys: bool, ty: GgmlType) -> (TinyLlama, GgufWriter) {
    let tiny = TinyLlama {
        arch,
        qk_norm: arch == "qwen3",
        ..TinyLlama::default()
    };
    let mut w = tiny.metadata();
    if with_keys {
        w.metadata(&format!("{arch}.pooling_type"), GgufValue::U32(4))
            .metadata(
                &format!("{arch}.classifier.output_labels"),
                GgufValue::Array(vec![
                    GgufValue::String("yes".into()),
                    GgufValue::String("no".into()),
                ]),
            )
            .metadata(
                "tokenizer.chat_template.rerank",
                GgufValue::String(PROMPT.into()),
            );
    }
    let rows = head_rows(tiny.hidden);
    let data: Vec<u8> = match ty {
        GgmlType::F32 => rows.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => rows
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        other => panic!("no fixture for {other:?}"),
    };
    w.tensor("cls.output.weight", &[tiny.hidden as u64, 2], ty, data);
    (tiny, w)
}

#[test]
fn a_qwen3_reranker_gguf_imports_its_head_as_llama_cpp_reads_it() {
    for ty in [GgmlType::F32, GgmlType::F16] {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("reranker.gguf");
        let (tiny, w) = reranker("qwen3", true, ty);
        tiny.write_with(w, &gguf, 5);
        let out = dir.path().join("converted");
        convert_gguf(&gguf, &out).unwrap();
        let file: RankHeadFile =
            serde_json::from_str(&std::fs::read_to_string(out.join(RANK_HEAD_FILE)).unwrap())
                .unwrap();
        assert_eq!(
            file,
            RankHeadFile {
                token: RankToken::Last,
                softmax: true,
                labels: vec!["yes".into(), "no".into()],
                prompt: Some(PROMPT.into()),
            }
        );
        let model = LoadedModel::open(&out).unwrap();
        // Every tensor, the head's included, converted without loss.
        assert_lossless(&gguf, &model.checkpoint);
        let head = model.rank_head.as_ref().expect("a reranker");
        assert_eq!(head.outputs(), 2);
        // A one-hot state reads column j of both rows; the outputs are their softmax.
        let rows = head_rows(tiny.hidden);
        for j in [0, 5, tiny.hidden - 1] {
            let mut state = vec![0.0f32; tiny.hidden];
            state[j] = 1.0;
            let (yes, no) = (f64::from(rows[j]), f64::from(rows[tiny.hidden + j]));
            let p_yes = 1.0 / (1.0 + (no - yes).exp());
            let got = head.outputs_of(&state);
            assert!((got[0] - p_yes).abs() < 1e-12, "{got:?} against {p_yes}");
            assert!((got[0] + got[1] - 1.0).abs() < 1e-12);
            // The score reads the last position.
            let states = vec![vec![0.0; tiny.hidden], state];
            assert_eq!(head.score(&states), Some(got[0]));
        }
        assert_eq!(
            head.prompt("q", "d").unwrap(),
            "<|im_start|>user\n<Query>: q\n<Document>: d<|im_end|>\n"
        );
        // The checkpoint prepared to read its weights from the GGUF says the same.
        let prepared = dir.path().join("prepared");
        prepare_gguf(&gguf, &prepared, "unchecked").unwrap();
        let on_demand = LoadedModel::open(&prepared).unwrap();
        assert_eq!(on_demand.rank_head, model.rank_head);
    }
}

/// llama.cpp applies the softmax to Qwen3's head only: another family's first output is the
/// score as it is. A file without the keys still has a head (no labels, no prompt); a file
/// without `cls.output.weight` has none.
#[test]
fn other_heads_are_raw_and_plain_models_have_none() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("llama-head.gguf");
    let (tiny, w) = reranker("llama", false, GgmlType::F32);
    tiny.write_with(w, &gguf, 6);
    let out = dir.path().join("llama-head");
    convert_gguf(&gguf, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    let head = model.rank_head.as_ref().expect("a head");
    assert!(!head.file.softmax);
    assert_eq!(
        (head.file.labels.len(), head.file.prompt.as_deref()),
        (0, None)
    );
    let rows = head_rows(tiny.hidden);
    let mut state = vec![0.0f32; tiny.hidden];
    state[3] = 2.0;
    assert_eq!(head.score(&[state]), Some(2.0 * f64::from(rows[3])));

    let plain = dir.path().join("plain.gguf");
    TinyLlama::default().write(&plain, 7);
    let out = dir.path().join("plain");
    convert_gguf(&plain, &out).unwrap();
    assert!(!out.join(RANK_HEAD_FILE).exists());
    assert!(LoadedModel::open(&out).unwrap().rank_head.is_none());
}

/// A head file whose tensor is missing, or whose labels do not match the head, is refused by
/// name.
#[test]
fn a_head_file_that_does_not_fit_the_tensor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("reranker.gguf");
    let (tiny, w) = reranker("qwen3", true, GgmlType::F32);
    tiny.write_with(w, &gguf, 8);
    let out = dir.path().join("converted");
    convert_gguf(&gguf, &out).unwrap();
    let path = out.join(RANK_HEAD_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"no\"", "\"no\", \"maybe\"")).unwrap();
    let message = LoadedModel::open(&out).unwrap_err().to_string();
    assert!(
        message.contains("3 labels for a head of 2 outputs"),
        "{message}"
    );

    let plain = dir.path().join("plain.gguf");
    TinyLlama::default().write(&plain, 9);
    let plain_out = dir.path().join("plain");
    convert_gguf(&plain, &plain_out).unwrap();
    std::fs::write(plain_out.join(RANK_HEAD_FILE), text).unwrap();
    let message = LoadedModel::open(&plain_out).unwrap_err().to_string();
    assert!(message.contains("no `score.weight` tensor"), "{message}");
}
