//! GGUF: reading metadata and every tensor type against known values, refusing K-quants, the q/k
//! permutation, and lossless conversion of a tiny llama.

use half::{bf16, f16};
use mlxcel_model::gguf::dequant::{
    affine_bits, affine_group_size, affine_groups, dequantize_reference,
};
use mlxcel_model::gguf::permute::{gguf_row_of_hf_row, permute_rows, unpermute_rows};
use mlxcel_model::gguf::{GgmlType, GgufFile, GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, LoadedModel, ModelError, RopeScaling, convert_gguf, converted};

use crate::fixtures::{Rng, TinyLlama, assert_lossless};

fn write(writer: &GgufWriter) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fixture.gguf");
    writer
        .write(&mut std::fs::File::create(&path).unwrap())
        .unwrap();
    (dir, path)
}

#[test]
fn metadata_of_every_type_round_trips() {
    let values = [
        ("u8", GgufValue::U8(200)),
        ("i8", GgufValue::I8(-100)),
        ("u16", GgufValue::U16(60_000)),
        ("i16", GgufValue::I16(-30_000)),
        ("u32", GgufValue::U32(4_000_000_000)),
        ("i32", GgufValue::I32(-2_000_000_000)),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f32", GgufValue::F32(1.5)),
        ("f64", GgufValue::F64(-2.25)),
        ("bool", GgufValue::Bool(true)),
        ("string", GgufValue::String("héllo 🌍".into())),
        (
            "array",
            GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)]),
        ),
        (
            "nested",
            GgufValue::Array(vec![GgufValue::Array(vec![GgufValue::String("a".into())])]),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.metadata(k, v.clone());
    }
    let (_dir, path) = write(&w);
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version, 3);
    for (k, v) in &values {
        assert_eq!(file.get(k), Some(v), "{k}");
    }
}

/// One tensor of each type, with hand-computed expected values (llama.cpp's formulas).
#[test]
fn every_tensor_type_reads_known_values() {
    let h = |v: f32| f16::from_f32(v).to_le_bytes();
    // Q4_0: d = 0.5; byte 0x19 holds element j = 9 (low) and j+16 = 1 (high): (9-8)*0.5, (1-8)*0.5.
    let q4_0: Vec<u8> = h(0.5).into_iter().chain([0x19; 16]).collect();
    // Q4_1: d = 0.25, m = -1; nibbles 4 and 15: 4*0.25-1 = 0, 15*0.25-1 = 2.75.
    let q4_1: Vec<u8> = h(0.25)
        .into_iter()
        .chain(h(-1.0))
        .chain([0xF4; 16])
        .collect();
    // Q8_0: d = 2; q = -3 → -6, q = 127 → 254.
    let q8_0: Vec<u8> = h(2.0)
        .into_iter()
        .chain([(-3i8) as u8; 16])
        .chain([127u8; 16])
        .collect();
    let mut w = GgufWriter::new();
    w.tensor(
        "f32",
        &[2],
        GgmlType::F32,
        [3.25f32, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    )
    .tensor("f16", &[1], GgmlType::F16, h(1.5).to_vec())
    .tensor(
        "bf16",
        &[1],
        GgmlType::BF16,
        bf16::from_f32(-2.0).to_le_bytes().to_vec(),
    )
    .tensor("q4_0", &[32], GgmlType::Q4_0, q4_0)
    .tensor("q4_1", &[32], GgmlType::Q4_1, q4_1)
    .tensor("q8_0", &[32], GgmlType::Q8_0, q8_0);
    let (_dir, path) = write(&w);
    let file = GgufFile::open(&path).unwrap();
    let read = |name: &str| {
        let info = file.tensor_info(name).unwrap();
        dequantize_reference(info.ggml_type, file.tensor_data(info).unwrap()).unwrap()
    };
    assert_eq!(read("f32"), [3.25, -1.0]);
    assert_eq!(read("f16"), [1.5]);
    assert_eq!(read("bf16"), [-2.0]);
    let halves = |a: f32, b: f32| [[a; 16], [b; 16]].concat();
    assert_eq!(read("q4_0"), halves(0.5, -3.5));
    assert_eq!(read("q4_1"), halves(0.0, 2.75));
    assert_eq!(read("q8_0"), halves(-6.0, 254.0));
}

#[test]
fn affine_blocks_reproduce_llama_cpp_exactly() {
    let mut rng = Rng::new(7);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
        GgmlType::Q2_K,
    ] {
        let (bits, len) = (affine_bits(ty).unwrap(), affine_group_size(ty));
        for round in 0..1000 {
            let mut block = crate::fixtures::random_block(ty, &mut rng);
            if round % 2 == 1 {
                // Any finite f16 in the super-block's `d` and `dmin` (subnormal, huge, negative,
                // zero), not only the small positive ones real files have.
                extreme_halves(ty, &mut block, &mut rng);
            }
            let expected = dequantize_reference(ty, &block).unwrap();
            let groups = affine_groups(ty, &block);
            assert_eq!(groups.len() * len, expected.len(), "{ty}");
            for (i, e) in expected.iter().enumerate() {
                let g = &groups[i / len];
                assert_eq!(g.len, len);
                let q = g.values()[i % len];
                assert!(
                    u32::from(q) < 1 << bits,
                    "{ty}: {q} needs more than {bits} bits"
                );
                let v = g.scale * q as f32 + g.bias;
                // The kernels may fuse the multiply-add: the product is exact, so it agrees.
                let fused = g.scale.mul_add(q as f32, g.bias);
                for v in [v, fused] {
                    assert!(
                        same_value(v, *e),
                        "{ty} element {i}: {v} ({:#x}) vs {e} ({:#x})",
                        v.to_bits(),
                        e.to_bits()
                    );
                }
            }
        }
    }
}

/// Bit for bit, except the sign of a zero: where llama.cpp multiplies a negative scale by a zero
/// level (Q4_0, Q6_K, Q3_K: `s · (q − c)` with q = c) it gets −0, and no `scale · q + bias` can
/// (`x + (−x)` is +0). Only a sum whose every term is −0 could tell them apart.
fn same_value(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a == 0.0 && b == 0.0)
}

/// Overwrites the f16 super-block scales of a K-quant block (`d`, and `dmin` where the type has
/// one) with random finite halves of any exponent and sign.
fn extreme_halves(ty: GgmlType, block: &mut [u8], rng: &mut Rng) {
    let fields: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        _ => &[],
    };
    for &at in fields {
        let h = loop {
            let b = rng.bytes(2);
            let h = f16::from_le_bytes([b[0], b[1]]);
            if h.is_finite() {
                break h;
            }
        };
        block[at..at + 2].copy_from_slice(&h.to_le_bytes());
    }
}

/// A type mlxcel cannot read (IQ2_XXS) is refused when its data is asked for and by conversion,
/// naming type and tensor.
#[test]
fn unreadable_types_are_refused_naming_type_and_tensor() {
    let mut w = TinyLlama::default().metadata();
    w.tensor("blk.0.attn_q.weight", &[256, 1], GgmlType(16), vec![0; 66]);
    let (dir, path) = write(&w);
    let file = GgufFile::open(&path).unwrap();
    let iq = file.tensor_info("blk.0.attn_q.weight").unwrap();
    let err = file.tensor_data(iq).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedGgmlType { .. }));
    let message = convert_gguf(&path, &dir.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("IQ2_XXS") && message.contains("blk.0.attn_q.weight"),
        "{message}"
    );
    assert_eq!(GgmlType(16).to_string(), "IQ2_XXS (type id 16)");
}

/// Every K-quant and Q5 type converts without loss: Q4_K as 4-bit affine groups of 32, Q5_0, Q5_1
/// and Q5_K as 8-bit ones (f32 scales where f16 cannot hold them), Q6_K as 8-bit groups of 16,
/// Q3_K and Q2_K as 4-bit groups of 16, recorded per module under mode `mlxcel-affine`;
/// dequantized, every tensor equals llama.cpp's values bit for bit.
#[test]
fn k_quants_and_q5_convert_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("k.gguf");
    TinyLlama {
        hidden: 256,
        ffn: 512,
        tied: false,
        linear_type: |part| match part {
            "attn_q" => GgmlType::Q4_K,
            "attn_k" => GgmlType::Q5_K,
            "attn_v" => GgmlType::Q6_K,
            "attn_output" => GgmlType::Q5_0,
            "ffn_gate" => GgmlType::Q5_1,
            "ffn_up" => GgmlType::Q3_K,
            "ffn_down" => GgmlType::Q2_K,
            _ => GgmlType::Q6_K,
        },
        embed_type: GgmlType::Q4_K,
        ..TinyLlama::default()
    }
    .write(&gguf, 5);
    let out = dir.path().join("k");
    let summary = convert_gguf(&gguf, &out).unwrap();
    // attn_v, ffn_up and ffn_down of both layers, and the output.
    assert_eq!(summary.group16, 7);
    assert!(summary.group16_note().unwrap().contains("mlx-lm cannot"));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["mode"], "mlxcel-affine");
    let model = LoadedModel::open(&out).unwrap();
    let ckpt: &Checkpoint = &model.checkpoint;
    assert_eq!(assert_lossless(&gguf, ckpt), 2 + 9 * 2 + 1);
    let spec = |m: &str| ckpt.quantization_of(m).map(|s| (s.bits, s.group_size));
    assert_eq!(spec("model.embed_tokens"), Some((4, 32)));
    assert_eq!(spec("model.layers.0.self_attn.q_proj"), Some((4, 32)));
    assert_eq!(spec("model.layers.0.self_attn.k_proj"), Some((8, 32)));
    assert_eq!(spec("model.layers.0.self_attn.o_proj"), Some((8, 32)));
    assert_eq!(spec("model.layers.0.mlp.gate_proj"), Some((8, 32)));
    assert_eq!(spec("model.layers.0.self_attn.v_proj"), Some((8, 16)));
    assert_eq!(spec("model.layers.0.mlp.up_proj"), Some((4, 16)));
    assert_eq!(spec("model.layers.0.mlp.down_proj"), Some((4, 16)));
    assert_eq!(spec("lm_head"), Some((8, 16)));
    let scales = ckpt.tensor("lm_head.scales").unwrap();
    assert_eq!(scales.shape[1], 256 / 16);
}

/// Q4_K's packed 6-bit scales and mins, worked by hand: sub-blocks 0-3 take theirs from the low
/// six bits of bytes 0-3 and 4-7, sub-blocks 4-7 from the nibbles of bytes 8-11 plus the top two
/// bits of bytes 0-7; even sub-blocks read low nibbles, odd ones high nibbles.
#[test]
fn q4_k_unpacks_scales_mins_and_nibbles_as_llama_cpp() {
    let mut block = vec![0u8; 144];
    block[0..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes()); // d
    block[2..4].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes()); // dmin
    let packed = &mut block[4..16];
    packed[0..4].fill(2 | (1 << 6)); // scales 2 (sub-blocks 0-3); top bits 1 → scale of 4-7 + 16
    packed[4..8].fill(1); // mins 1 (sub-blocks 0-3)
    packed[8..12].fill(3 | (4 << 4)); // sub-blocks 4-7: scale 3 | 16 = 19, min 4
    block[16..144].fill(0x51); // low nibble 1, high nibble 5
    let y = dequantize_reference(GgmlType::Q4_K, &block).unwrap();
    assert_eq!(y[0], 2.0 * 1.0 - 0.5); // sub-block 0: low nibble
    assert_eq!(y[32], 2.0 * 5.0 - 0.5); // sub-block 1: high nibble
    assert_eq!(y[128], 19.0 * 1.0 - 0.5 * 4.0); // sub-block 4: scale 3 + 16 from byte 0's top bits
    assert_eq!(y[255], 19.0 * 5.0 - 0.5 * 4.0); // sub-block 7
}

#[test]
fn truncated_and_foreign_files_are_refused() {
    let (_dir, path) = write(&TinyLlama::default().metadata());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let message = GgufFile::open(&path).unwrap_err().to_string();
    assert!(
        message.contains("fixture.gguf") && message.contains("truncated"),
        "{message}"
    );
    std::fs::write(&path, b"PK\x03\x04 not gguf").unwrap();
    assert!(
        GgufFile::open(&path)
            .unwrap_err()
            .to_string()
            .contains("bad magic")
    );
}

#[test]
fn permutation_matches_llama_cpp_and_round_trips() {
    // convert_hf_to_gguf.py: reshape(n_head, 2, head_dim/2).swapaxes(1, 2) on rows.
    let head_dim = 4;
    let order: Vec<usize> = (0..8).map(|hf| gguf_row_of_hf_row(hf, head_dim)).collect();
    assert_eq!(order, [0, 2, 1, 3, 4, 6, 5, 7]);
    let mut rng = Rng::new(3);
    for (rows, head_dim, row_len) in [(8, 4, 3), (576, 64, 20), (192, 64, 34)] {
        let data = rng.bytes(rows * row_len);
        let permuted = permute_rows(&data, rows, head_dim);
        assert_ne!(permuted, data);
        assert_eq!(unpermute_rows(&permuted, rows, head_dim), data);
    }
}

#[test]
fn tiny_llama_converts_losslessly_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    for tied in [true, false] {
        TinyLlama {
            tied,
            ..TinyLlama::default()
        }
        .write(&gguf, 11);
        let out = dir.path().join(format!("tiny-{tied}"));
        let summary = convert_gguf(&gguf, &out).unwrap();
        assert_eq!(summary.config.tie_word_embeddings, tied);
        let model = LoadedModel::open(&out).unwrap();
        let ckpt: &Checkpoint = &model.checkpoint;
        let compared = assert_lossless(&gguf, ckpt);
        assert_eq!(compared, 2 + 9 * 2 + usize::from(!tied));
        let spec = |m: &str| ckpt.quantization_of(m).map(|s| (s.bits, s.group_size));
        assert_eq!(spec("model.embed_tokens"), Some((8, 32)));
        assert_eq!(spec("model.layers.0.self_attn.q_proj"), Some((4, 32)));
        assert_eq!(spec("model.layers.0.self_attn.v_proj"), None);
        assert_eq!(spec("model.layers.1.mlp.gate_proj"), Some((8, 32)));
        assert_eq!(model.eos_token_ids, [2]);
        assert_eq!(model.config().window(), 2048);
    }
}

/// Qwen3 (q/k norms, no permutation) and SmolLM3 (permuted like a llama, every fourth layer
/// without RoPE, as llama.cpp runs it) convert losslessly into the family's own config.
#[test]
fn qwen3_and_smollm3_convert_with_their_features() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, qk_norm, layers) in [("qwen3", true, 2), ("smollm3", false, 4)] {
        let gguf = dir.path().join(format!("{arch}.gguf"));
        TinyLlama {
            arch,
            qk_norm,
            layers,
            ..TinyLlama::default()
        }
        .write(&gguf, 12);
        let out = dir.path().join(arch);
        let summary = convert_gguf(&gguf, &out).unwrap();
        assert_eq!(summary.config.architecture.model_type(), arch);
        let model = LoadedModel::open(&out).unwrap();
        let compared = assert_lossless(&gguf, &model.checkpoint);
        assert_eq!(compared, 2 + (9 + 2 * usize::from(qk_norm)) * layers);
        let config = model.config();
        assert_eq!(config.qk_norm, qk_norm);
        let rope: Vec<bool> = config.layers.iter().map(|l| l.rope).collect();
        match arch {
            "smollm3" => assert_eq!(rope, [true, true, true, false]),
            _ => assert!(rope.iter().all(|&r| r)),
        }
    }
}

/// Gemma 3 (q/k norms, post-attention and post-MLP norms, llama.cpp's `1 + w` norms, a sliding
/// window on five of every six layers, the local RoPE base, linear scaling) converts losslessly
/// into a `gemma3_text` config with the same features.
#[test]
fn gemma3_converts_with_its_norms_windows_and_bases() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("gemma3.gguf");
    let tiny = TinyLlama {
        arch: "gemma3",
        qk_norm: true,
        sandwich: true,
        layers: 7,
        ..TinyLlama::default()
    };
    let mut w = tiny.metadata();
    w.metadata("gemma3.attention.sliding_window", GgufValue::U32(512))
        .metadata("gemma3.rope.freq_base_swa", GgufValue::F32(10_000.0))
        .metadata(
            "gemma3.rope.scaling.type",
            GgufValue::String("linear".into()),
        )
        .metadata("gemma3.rope.scaling.factor", GgufValue::F32(8.0));
    tiny.write_with(w, &gguf, 13);
    let out = dir.path().join("out");
    convert_gguf(&gguf, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    assert_eq!(assert_lossless(&gguf, &model.checkpoint), 2 + 13 * 7);
    let c = model.config();
    assert_eq!(c.architecture.model_type(), "gemma3_text");
    assert!(c.qk_norm && c.sandwich_norms && c.norm_weight_offset && c.tie_word_embeddings);
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    let s = Some(512);
    assert_eq!(windows, [s, s, s, s, s, None, s]);
    assert_eq!(c.rope_local_theta, Some(10_000.0));
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    // No query_pre_attn_scalar in GGUF: llama.cpp's 1/√head_dim.
    assert_eq!(c.attention_scale, 1.0 / (c.head_dim as f32).sqrt());
    assert_eq!(c.attn_logit_softcapping, None);
}

/// Phi-3: fused `attn_qkv` and `ffn_up` (gate then up) split at load into the usual modules,
/// partial rotary from `rope.dimension_count`, LongRoPE's factors (a tensor) and attention factor.
#[test]
fn phi3_converts_fused_projections_and_long_rope() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("phi3.gguf");
    let tiny = TinyLlama {
        arch: "phi3",
        tied: false,
        ..TinyLlama::default()
    };
    // head_dim 16, 12 of it rotated: 6 pairs.
    let factors: Vec<f32> = (0..6).map(|i| 1.0 + i as f32 / 4.0).collect();
    let mut w = tiny.metadata();
    w.metadata("phi3.rope.dimension_count", GgufValue::U32(12))
        .metadata("phi3.rope.scaling.attn_factor", GgufValue::F32(1.25))
        .metadata(
            "phi3.rope.scaling.original_context_length",
            GgufValue::U32(512),
        );
    let bytes: Vec<u8> = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
    w.tensor(
        "rope_factors_long.weight",
        &[6],
        GgmlType::F32,
        bytes.clone(),
    );
    w.tensor("rope_factors_short.weight", &[6], GgmlType::F32, bytes);
    tiny.write_with(w, &gguf, 14);
    let out = dir.path().join("out");
    convert_gguf(&gguf, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    // Embedding, final norm, output, and per layer 2 norms + qkv + o + gate_up + down.
    assert_eq!(assert_lossless(&gguf, &model.checkpoint), 3 + 6 * 2);
    let c = model.config();
    assert_eq!(c.architecture.model_type(), "phi3");
    assert_eq!((c.head_dim, c.rotary_dim), (16, 12));
    assert_eq!(c.rope_factors.as_deref(), Some(factors.as_slice()));
    assert_eq!(c.rope_attention_factor, 1.25);
    assert!(
        model
            .checkpoint
            .tensor("model.layers.1.mlp.up_proj.weight")
            .is_some()
    );
}

/// Llama 3.1's rope scaling, which llama.cpp's converter precomputes into a `rope_freqs` tensor
/// (a factor per rotated pair on its period), becomes per-pair RoPE factors with no attention
/// factor; attention biases in a llama-architecture file set `attention_bias`.
#[test]
fn llama_rope_freqs_and_attention_biases_are_imported() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("llama31.gguf");
    let tiny = TinyLlama::default();
    let head_dim = tiny.hidden / tiny.heads;
    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + i as f32).collect();
    let mut w = tiny.metadata();
    let bytes: Vec<u8> = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
    w.tensor(
        "rope_freqs.weight",
        &[factors.len() as u64],
        GgmlType::F32,
        bytes,
    );
    let mut rng = Rng::new(3);
    for l in 0..tiny.layers {
        for (part, rows) in [
            ("attn_q", tiny.hidden),
            ("attn_k", tiny.kv_heads * head_dim),
            ("attn_v", tiny.kv_heads * head_dim),
            ("attn_output", tiny.hidden),
        ] {
            let values: Vec<u8> = (0..rows)
                .flat_map(|_| rng.uniform(-1.0, 1.0).to_le_bytes())
                .collect();
            w.tensor(
                &format!("blk.{l}.{part}.bias"),
                &[rows as u64],
                GgmlType::F32,
                values,
            );
        }
    }
    tiny.write_with(w, &gguf, 15);
    let out = dir.path().join("out");
    convert_gguf(&gguf, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    let c = model.config();
    assert!(c.attention_qkv_bias && c.attention_out_bias);
    assert_eq!(c.rope_factors.as_deref(), Some(factors.as_slice()));
    assert_eq!(c.rope_attention_factor, 1.0);
    assert!(
        model
            .checkpoint
            .tensor("model.layers.1.self_attn.o_proj.bias")
            .is_some()
    );
}

#[test]
fn tensors_without_a_llama_counterpart_are_refused_by_name() {
    let mut w = TinyLlama::default().metadata();
    w.tensor("mystery_norm.weight", &[32], GgmlType::F32, vec![0; 128]);
    let (dir, path) = write(&w);
    let message = convert_gguf(&path, &dir.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("tensor `mystery_norm.weight`: has no Hugging Face llama counterpart"),
        "{message}"
    );
}

/// A q projection with no rows (a hostile file; the fuzzer found it dividing by zero while
/// un-permuting) is refused, naming the tensor.
#[test]
fn empty_tensors_are_refused_by_name() {
    let mut w = TinyLlama::default().metadata();
    w.tensor("blk.0.attn_q.weight", &[32, 0], GgmlType::F32, Vec::new());
    let (dir, path) = write(&w);
    let message = convert_gguf(&path, &dir.path().join("out"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("tensor `blk.0.attn_q.weight`: has no elements (shape [0, 32])"),
        "{message}"
    );
}

/// The FIM token ids of GGUF metadata (the current keys, and the deprecated `prefix_token_id`)
/// reach the converted checkpoint's `tokenizer_config.json` and the loaded model; without them
/// the tokens are looked for by their text, and this vocabulary has none.
#[test]
fn fim_token_ids_of_the_metadata_reach_the_loaded_model() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("fim.gguf");
    let tiny = TinyLlama::default();
    let mut w = tiny.metadata();
    w.metadata("tokenizer.ggml.prefix_token_id", GgufValue::U32(1))
        .metadata("tokenizer.ggml.fim_suf_token_id", GgufValue::U32(2))
        .metadata("tokenizer.ggml.fim_mid_token_id", GgufValue::U32(0))
        .metadata("tokenizer.ggml.fim_sep_token_id", GgufValue::U32(5));
    tiny.write_with(w, &gguf, 3);
    let out = dir.path().join("fim");
    convert_gguf(&gguf, &out).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config[mlxcel_model::FIM_CONFIG_KEY],
        serde_json::json!({"pre": 1, "suf": 2, "mid": 0, "sep": 5})
    );
    let model = LoadedModel::open(&out).unwrap();
    assert_eq!(model.fim_tokens.infill(), Ok((1, 2, 0)));
    assert_eq!(model.fim_tokens.sep, Some(5));
    assert_eq!(model.fim_tokens.rep, None);

    let plain = dir.path().join("plain.gguf");
    tiny.write(&plain, 3);
    let out = dir.path().join("plain");
    convert_gguf(&plain, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    assert_eq!(model.fim_tokens, mlxcel_model::FimTokens::default());
    assert_eq!(
        model.fim_tokens.infill(),
        Err(vec!["prefix", "suffix", "middle"])
    );
}

/// A checkpoint prepared from a GGUF file (what `-m FILE.gguf` resolves to) holds no weights:
/// its tensors are converted from the file as they are read, byte for byte what `convert_gguf`
/// writes, and again after they are released; the directory follows the file when it moves and
/// refuses it, naming `-m`, when it changes.
#[test]
fn gguf_weights_are_converted_on_demand_as_convert_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("k.gguf");
    TinyLlama {
        hidden: 256,
        ffn: 512,
        tied: false,
        linear_type: |part| match part {
            "attn_q" => GgmlType::Q4_K,
            "attn_k" => GgmlType::Q5_K,
            "attn_v" => GgmlType::Q6_K,
            "attn_output" => GgmlType::Q4_0,
            "ffn_gate" => GgmlType::Q8_0,
            "ffn_up" => GgmlType::Q3_K,
            "ffn_down" => GgmlType::Q2_K,
            _ => GgmlType::Q6_K,
        },
        embed_type: GgmlType::Q4_K,
        ..TinyLlama::default()
    }
    .write(&gguf, 23);
    let written = dir.path().join("written");
    convert_gguf(&gguf, &written).unwrap();
    let cache = dir.path().join("cache");
    let lazy = converted(&cache, &gguf, "0123abcd").unwrap();
    let files: Vec<String> = std::fs::read_dir(&lazy)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.iter().all(|f| !f.ends_with(".safetensors")),
        "{files:?}"
    );
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(written.join(f)).unwrap(),
            std::fs::read(lazy.join(f)).unwrap(),
            "{f}"
        );
    }
    let expected = Checkpoint::open(&written).unwrap();
    let model = LoadedModel::open(&lazy).unwrap();
    let ckpt = &model.checkpoint;
    assert_eq!(ckpt.tensor_infos().count(), expected.tensors().count());
    for t in expected.tensors() {
        let info = ckpt.tensor_info(t.name).unwrap();
        assert_eq!(
            (info.dtype, info.shape, info.byte_len),
            (t.dtype, t.shape, t.data.len()),
            "{}",
            t.name
        );
        assert_eq!(ckpt.tensor(t.name).unwrap().data, t.data, "{}", t.name);
        // SAFETY: the view above was compared and dropped.
        unsafe { ckpt.release_tensor(t.name) };
        assert_eq!(
            ckpt.tensor(t.name).unwrap().data,
            t.data,
            "{} again",
            t.name
        );
    }
    assert_lossless(&gguf, ckpt);

    // Moved: the next resolve of the same bytes points the directory at the new path.
    let moved = dir.path().join("moved.gguf");
    std::fs::rename(&gguf, &moved).unwrap();
    assert!(LoadedModel::open(&lazy).is_err());
    assert_eq!(converted(&cache, &moved, "0123abcd").unwrap(), lazy);
    let again = Checkpoint::open(&lazy).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    assert_eq!(
        again.tensor(name).unwrap().data,
        expected.tensor(name).unwrap().data
    );
    // Changed under the directory: refused, saying what to do.
    let mut bytes = std::fs::read(&moved).unwrap();
    bytes.extend_from_slice(&[0; 64]);
    std::fs::write(&moved, bytes).unwrap();
    let err = Checkpoint::open(&lazy).unwrap_err().to_string();
    assert!(err.contains("has changed") && err.contains("-m"), "{err}");
}

/// Phi-3's fused projections, read on demand: releasing one part of a fused tensor and reading
/// its siblings converts the region again, the same bytes.
#[test]
fn fused_projections_read_on_demand_survive_releasing_a_part() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("phi3.gguf");
    TinyLlama {
        arch: "phi3",
        tied: false,
        ..TinyLlama::default()
    }
    .write(&gguf, 29);
    let written = dir.path().join("written");
    convert_gguf(&gguf, &written).unwrap();
    let lazy = converted(&dir.path().join("cache"), &gguf, "phi3").unwrap();
    let expected = Checkpoint::open(&written).unwrap();
    let ckpt = Checkpoint::open(&lazy).unwrap();
    let p = "model.layers.0.self_attn";
    let q = format!("{p}.q_proj.weight");
    assert_eq!(
        ckpt.tensor(&q).unwrap().data,
        expected.tensor(&q).unwrap().data
    );
    // SAFETY: no view of q (or of its region) is read after this.
    unsafe { ckpt.release_tensor(&q) };
    for part in ["k_proj", "v_proj", "q_proj"] {
        let name = format!("{p}.{part}.weight");
        assert_eq!(
            ckpt.tensor(&name).unwrap().data,
            expected.tensor(&name).unwrap().data,
            "{name}"
        );
    }
}

/// A Gemma 4 GGUF (`general.architecture` `gemma4`, as llama.cpp's converter writes it) is
/// read as Gemma 4: its sliding layers from `sliding_window_pattern`, the sliding layers' head
/// from `key_length_swa`, the full layers' proportional RoPE from `rope_freqs` (1 on the pairs
/// that rotate, 1e30 on the others), the layer scalars from `layer_output_scale`, its norms as
/// plain weights. (Before, such a file was refused by name.)
#[test]
fn gemma4_gguf_reads_its_layer_types_heads_and_proportional_rope() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("gemma4.gguf");
    let tiny = TinyLlama {
        arch: "gemma4",
        qk_norm: true,
        sandwich: true,
        ..TinyLlama::default()
    };
    let mut w = tiny.metadata();
    let u32v = GgufValue::U32;
    let pattern = GgufValue::Array(vec![GgufValue::Bool(true), GgufValue::Bool(false)]);
    w.metadata("gemma4.attention.sliding_window", u32v(8))
        .metadata("gemma4.attention.sliding_window_pattern", pattern)
        .metadata("gemma4.attention.key_length", u32v(16))
        .metadata("gemma4.attention.key_length_swa", u32v(16))
        .metadata("gemma4.rope.freq_base_swa", GgufValue::F32(10_000.0))
        .metadata("gemma4.attention.shared_kv_layers", u32v(0))
        .metadata("gemma4.embedding_length_per_layer_input", u32v(0))
        .metadata("gemma4.final_logit_softcapping", GgufValue::F32(30.0));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let freqs = [1.0, 1.0, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30];
    w.tensor("rope_freqs.weight", &[8], GgmlType::F32, f32s(&freqs));
    for l in 0..2 {
        let name = format!("blk.{l}.layer_output_scale.weight");
        w.tensor(&name, &[1], GgmlType::F32, f32s(&[0.5 + l as f32]));
    }
    tiny.write_with(w, &gguf, 13);
    let out = dir.path().join("out");
    convert_gguf(&gguf, &out).unwrap();
    let ckpt = Checkpoint::open(&out).unwrap();
    let c = ckpt.config();
    assert_eq!(c.architecture.model_type(), "gemma4_text");
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(8), None]);
    assert!(!c.norm_weight_offset && c.layer_scalars && c.value_norm);
    assert_eq!(c.final_logit_softcapping, Some(30.0));
    // The full layer rotates 2 of its 8 pairs over the whole head's schedule at 100000.
    let full = c.layer_rope_periods(1);
    assert_eq!(full[0], 1.0);
    assert!((full[1] - 1e5f32.powf(2.0 / 16.0)).abs() < 1e-3, "{full:?}");
    assert!(full[2..].iter().all(|p| p.is_infinite()), "{full:?}");
    let local = c.layer_rope_periods(0);
    assert!((local[7] - 1e4f32.powf(14.0 / 16.0)).abs() / local[7] < 1e-6);
    let scalar = ckpt.tensor("model.layers.1.layer_scalar").unwrap();
    assert_eq!(scalar.data, &1.5f32.to_le_bytes());
    // Norms are stored as `w` (no one added or subtracted).
    let norm = ckpt
        .tensor("model.layers.0.pre_feedforward_layernorm.weight")
        .unwrap();
    assert_eq!(norm.shape, &[64]);
}
