//! Writes the GGUF seeds of `corpus/gguf/` (`cargo test -p mlxcel-fuzz --test seeds -- --ignored`):
//! a tiny llama with a byte-level vocabulary and chat template, its tensors in several types, and
//! one tensor of every readable type.

use std::path::Path;

use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter};

fn bytes_of(ty: GgmlType, elements: u64, seed: u8) -> Vec<u8> {
    let len = ty.bytes_for(elements).expect("a readable type") as usize;
    let (_, block) = ty.layout().expect("a readable type");
    (0..len)
        .map(|i| {
            // Small positive f16 scales at the start of each block, other bytes varied.
            if i % block < 2 && block > 4 {
                if i % block == 0 { 0x00 } else { 0x2C }
            } else {
                (i as u8).wrapping_mul(31).wrapping_add(seed)
            }
        })
        .collect()
}

fn write(path: &Path, w: &GgufWriter) {
    let mut out = Vec::new();
    w.write(&mut out).unwrap();
    std::fs::write(path, out).unwrap();
}

#[test]
#[ignore = "writes the committed seeds"]
fn write_gguf_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/gguf");
    std::fs::create_dir_all(&dir).unwrap();

    // GPT-2's byte alphabet, two specials.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut tokens = vec!["<s>".to_owned(), "</s>".to_owned()];
    let mut next = 256u32;
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        tokens.push(char::from_u32(c).unwrap().to_string());
    }
    tokens.push("he".into());
    let mut types = vec![3i32, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    let (hidden, ffn, vocab) = (32u64, 64u64, tokens.len() as u64);
    let u32v = GgufValue::U32;
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", GgufValue::String("llama".into()))
        .metadata("llama.block_count", u32v(1))
        .metadata("llama.context_length", u32v(256))
        .metadata("llama.embedding_length", u32v(hidden as u32))
        .metadata("llama.feed_forward_length", u32v(ffn as u32))
        .metadata("llama.attention.head_count", u32v(2))
        .metadata("llama.attention.head_count_kv", u32v(1))
        .metadata("llama.rope.freq_base", GgufValue::F32(10000.0))
        .metadata(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        )
        .metadata("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", GgufValue::String("smollm".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            GgufValue::Array(tokens.into_iter().map(GgufValue::String).collect()),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
        )
        .metadata(
            "tokenizer.ggml.merges",
            GgufValue::Array(vec![GgufValue::String("h e".into())]),
        )
        .metadata("tokenizer.ggml.bos_token_id", u32v(0))
        .metadata("tokenizer.ggml.eos_token_id", u32v(1))
        .metadata(
            "tokenizer.chat_template",
            GgufValue::String(
                "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}".into(),
            ),
        );
    let kv = hidden / 2;
    let tensors: [(&str, &[u64], GgmlType); 11] = [
        ("token_embd.weight", &[hidden, vocab], GgmlType::Q8_0),
        ("blk.0.attn_norm.weight", &[hidden], GgmlType::F32),
        ("blk.0.attn_q.weight", &[hidden, hidden], GgmlType::Q4_0),
        ("blk.0.attn_k.weight", &[hidden, kv], GgmlType::Q4_1),
        ("blk.0.attn_v.weight", &[hidden, kv], GgmlType::Q5_0),
        (
            "blk.0.attn_output.weight",
            &[hidden, hidden],
            GgmlType::BF16,
        ),
        ("blk.0.ffn_norm.weight", &[hidden], GgmlType::F32),
        ("blk.0.ffn_gate.weight", &[hidden, ffn], GgmlType::Q5_1),
        ("blk.0.ffn_up.weight", &[hidden, ffn], GgmlType::F16),
        ("blk.0.ffn_down.weight", &[ffn, hidden], GgmlType::Q8_0),
        ("output_norm.weight", &[hidden], GgmlType::F32),
    ];
    for (i, (name, dims, ty)) in tensors.iter().enumerate() {
        let elements = dims.iter().product();
        let data = if *ty == GgmlType::F32 {
            (0..elements).flat_map(|_| 1.0f32.to_le_bytes()).collect()
        } else {
            bytes_of(*ty, elements, i as u8)
        };
        w.tensor(name, dims, *ty, data);
    }
    write(&dir.join("tiny-llama.gguf"), &w);

    let mut w = GgufWriter::new();
    for (i, ty) in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        w.tensor(&format!("t{i}"), &[256], ty, bytes_of(ty, 256, i as u8));
    }
    write(&dir.join("every-type.gguf"), &w);
}

#[test]
#[ignore = "writes the committed seeds"]
fn write_tokenizer_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/tokenizer");
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = mlxcel_fuzz::tiny_tokenizer_json().to_string().into_bytes();
    data.push(0);
    data.extend_from_slice("hello é 你好 😀 <s></s> x".as_bytes());
    std::fs::write(dir.join("byte-level-bpe"), data).unwrap();
}
