//! A tiny random BERT reranker GGUF, laid out as llama.cpp's convert_hf_to_gguf.py writes a
//! `BertForSequenceClassification` (one output, `cls.output`), for tests and tools: no download.

use std::io;
use std::path::Path;

use crate::gguf::{GgmlType, GgufValue, GgufWriter};

/// The fixture's WordPiece vocabulary, in GGUF form (`▁` before word-initial pieces).
pub const TINY_BERT_TOKENS: &[&str] = &[
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "▁the",
    "▁cat",
    "▁sat",
    "▁on",
    "▁mat",
    "▁a",
    "▁dog",
    "▁paris",
    "▁is",
    "▁capital",
    "▁of",
    "▁france",
    "▁what",
    "▁?",
    "▁.",
    "▁,",
    "▁!",
    "s",
    "ing",
    "▁run",
    "▁中",
    "▁文",
    "▁cafe",
    "▁un",
    "known",
];

/// What to vary in the fixture.
#[derive(Debug, Clone)]
pub struct TinyBert {
    pub seed: u64,
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    pub ffn: usize,
    pub positions: usize,
    /// Weight type of the matrices: F32, F16 or Q8_0 (the row length must be a multiple of 32
    /// for Q8_0).
    pub matrix_type: GgmlType,
    /// Leave this tensor out (a hostile file).
    pub drop_tensor: Option<String>,
    /// Give this tensor one row too many (a hostile file).
    pub grow_tensor: Option<String>,
    /// Write a `cls` dense layer before `cls.output`.
    pub pooler: bool,
}

impl Default for TinyBert {
    fn default() -> Self {
        Self {
            seed: 1,
            hidden: 32,
            heads: 4,
            layers: 2,
            ffn: 64,
            positions: 64,
            matrix_type: GgmlType::F32,
            drop_tensor: None,
            grow_tensor: None,
            pooler: false,
        }
    }
}

/// A small deterministic generator (splitmix64) of values in [-scale, scale).
struct Rng(u64);

impl Rng {
    fn next(&mut self, scale: f32) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

fn encode(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => values
            .chunks(32)
            .flat_map(|block| {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d == 0.0 { 0.0 } else { 1.0 / d };
                let mut out = half::f16::from_f32(d).to_le_bytes().to_vec();
                out.extend(block.iter().map(|v| (v * id).round() as i8 as u8));
                out
            })
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes the fixture to `path`.
pub fn write_tiny_bert(path: &Path, spec: &TinyBert) -> io::Result<()> {
    let mut rng = Rng(spec.seed);
    let mut w = GgufWriter::new();
    let (h, f) = (spec.hidden as u64, spec.ffn as u64);
    let s = |v: &str| GgufValue::String(v.to_owned());
    w.metadata("general.architecture", s("bert"))
        .metadata("general.name", s("tiny-bert-reranker"))
        .metadata("general.file_type", GgufValue::U32(0))
        .metadata("bert.block_count", GgufValue::U32(spec.layers as u32))
        .metadata("bert.context_length", GgufValue::U32(spec.positions as u32))
        .metadata("bert.embedding_length", GgufValue::U32(spec.hidden as u32))
        .metadata("bert.feed_forward_length", GgufValue::U32(spec.ffn as u32))
        .metadata(
            "bert.attention.head_count",
            GgufValue::U32(spec.heads as u32),
        )
        .metadata("bert.attention.layer_norm_epsilon", GgufValue::F32(1e-12))
        .metadata("bert.attention.causal", GgufValue::Bool(false))
        .metadata("bert.pooling_type", GgufValue::U32(4))
        .metadata("tokenizer.ggml.token_type_count", GgufValue::U32(2))
        .metadata("tokenizer.ggml.model", s("bert"))
        .metadata("tokenizer.ggml.pre", s("default"))
        .metadata(
            "tokenizer.ggml.tokens",
            GgufValue::Array(TINY_BERT_TOKENS.iter().map(|t| s(t)).collect()),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            GgufValue::Array(
                TINY_BERT_TOKENS
                    .iter()
                    .map(|t| GgufValue::I32(if t.starts_with('[') { 3 } else { 1 }))
                    .collect(),
            ),
        )
        .metadata("tokenizer.ggml.unknown_token_id", GgufValue::U32(1))
        .metadata("tokenizer.ggml.bos_token_id", GgufValue::U32(2))
        .metadata("tokenizer.ggml.eos_token_id", GgufValue::U32(3))
        .metadata("tokenizer.ggml.seperator_token_id", GgufValue::U32(3))
        .metadata("tokenizer.ggml.padding_token_id", GgufValue::U32(0))
        .metadata("tokenizer.ggml.add_bos_token", GgufValue::Bool(true))
        .metadata("tokenizer.ggml.add_eos_token", GgufValue::Bool(true))
        .metadata("tokenizer.ggml.add_sep_token", GgufValue::Bool(false))
        .metadata("tokenizer.ggml.normalizer.lowercase", GgufValue::Bool(true));
    let vocab = TINY_BERT_TOKENS.len() as u64;
    let mut tensors: Vec<(String, Vec<u64>, bool)> = vec![
        ("token_embd.weight".into(), vec![h, vocab], false),
        ("token_types.weight".into(), vec![h, 2], false),
        (
            "position_embd.weight".into(),
            vec![h, spec.positions as u64],
            false,
        ),
        ("token_embd_norm.weight".into(), vec![h], false),
        ("token_embd_norm.bias".into(), vec![h], false),
    ];
    for i in 0..spec.layers {
        for (name, dims, matrix) in [
            ("attn_q.weight", vec![h, h], true),
            ("attn_q.bias", vec![h], false),
            ("attn_k.weight", vec![h, h], true),
            ("attn_k.bias", vec![h], false),
            ("attn_v.weight", vec![h, h], true),
            ("attn_v.bias", vec![h], false),
            ("attn_output.weight", vec![h, h], true),
            ("attn_output.bias", vec![h], false),
            ("attn_output_norm.weight", vec![h], false),
            ("attn_output_norm.bias", vec![h], false),
            ("ffn_up.weight", vec![h, f], true),
            ("ffn_up.bias", vec![f], false),
            ("ffn_down.weight", vec![f, h], true),
            ("ffn_down.bias", vec![h], false),
            ("layer_output_norm.weight", vec![h], false),
            ("layer_output_norm.bias", vec![h], false),
        ] {
            tensors.push((format!("blk.{i}.{name}"), dims, matrix));
        }
    }
    if spec.pooler {
        tensors.push(("cls.weight".into(), vec![h, h], true));
        tensors.push(("cls.bias".into(), vec![h], false));
    }
    tensors.push(("cls.output.weight".into(), vec![h, 1], false));
    tensors.push(("cls.output.bias".into(), vec![1], false));
    for (name, mut dims, matrix) in tensors {
        if spec.drop_tensor.as_deref() == Some(name.as_str()) {
            continue;
        }
        if spec.grow_tensor.as_deref() == Some(name.as_str()) {
            *dims.last_mut().expect("a dimension") += 1;
        }
        let n: u64 = dims.iter().product();
        let norm_weight = name.ends_with("norm.weight");
        let values: Vec<f32> = (0..n)
            .map(|_| {
                if norm_weight {
                    1.0 + rng.next(0.2)
                } else {
                    rng.next(0.5)
                }
            })
            .collect();
        let ty = if matrix && dims.len() == 2 {
            spec.matrix_type
        } else {
            GgmlType::F32
        };
        w.tensor(&name, &dims, ty, encode(ty, &values));
    }
    let mut out = Vec::new();
    w.write(&mut out)?;
    std::fs::write(path, out)
}
