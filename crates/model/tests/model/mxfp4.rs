//! MXFP4 (gpt-oss's expert weights): hand-built blocks against llama.cpp's values worked by hand
//! (nibble order, the doubled E2M1 table, the halved E8M0 scale at its extremes), the affine form
//! at every scale byte it accepts, refusals of short and malformed tensors, and a model with
//! MXFP4 linears converted and opened lazily without loss.

use mlxcel_model::gguf::dequant::{
    ExactScales, MXFP4_MAX_AFFINE_SCALE_BYTE, affine_bits, affine_form_refusal, affine_group_size,
    affine_groups, bias_multiple, dequantize_reference, exact_scales, mxfp4_scale,
};
use mlxcel_model::gguf::{GgmlType, GgufFile, GgufWriter};
use mlxcel_model::{Checkpoint, Dtype, LoadedModel, convert_gguf, converted};

use crate::fixtures::{TinyLlama, assert_lossless};

/// One MXFP4 block: scale byte `e`, then byte `j` holding code `low[j]` (element `j`) in its low
/// nibble and `high[j]` (element `j + 16`) in its high one.
fn block(e: u8, low: [u8; 16], high: [u8; 16]) -> Vec<u8> {
    let mut out = vec![e];
    out.extend(low.iter().zip(&high).map(|(&l, &h)| l | (h << 4)));
    out
}

/// Codes 0..16 in the low nibbles and 15..0 in the high ones.
fn every_code(e: u8) -> Vec<u8> {
    let low: [u8; 16] = std::array::from_fn(|j| j as u8);
    block(e, low, low.map(|c| 15 - c))
}

/// `2^p` as an f32 (exact for every p used here, subnormals included).
fn pow2(p: i32) -> f32 {
    2f64.powi(p) as f32
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Values worked out by hand from the OCP format and llama.cpp's conventions, read back through
/// a GGUF file: E2M1 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0-7) and their negations (8-15, code 8 a
/// +0), times 2^(e − 127); element j from the low nibble of byte j, j + 16 from the high one.
#[test]
fn mxfp4_blocks_read_llama_cpps_values() {
    let e2m1 = [
        0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let scales = [0u8, 1, 2, 127, 128, 140, 251, 252, 253, 254, 255];
    let data: Vec<u8> = scales.iter().flat_map(|&e| every_code(e)).collect();
    let mut w = GgufWriter::new();
    w.tensor("blk.0.ffn_up_exps.weight", &[32, 11], GgmlType::MXFP4, data);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mxfp4.gguf");
    w.write(&mut std::fs::File::create(&path).unwrap()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let info = &file.tensors[0];
    assert_eq!(info.ggml_type, GgmlType::MXFP4);
    assert_eq!(info.ggml_type.to_string(), "MXFP4 (type id 39)");
    let values = dequantize_reference(info.ggml_type, file.tensor_data(info).unwrap()).unwrap();
    assert_eq!(values.len(), 32 * scales.len());
    for (b, &e) in scales.iter().enumerate() {
        let expected: Vec<f32> = (0..32)
            .map(|j| {
                let code = if j < 16 { j } else { 31 - j };
                // E2M1 times 2^(e − 127), rounded once to f32 (f64 holds it exactly): the f32
                // product llama.cpp computes, overflow to ±∞ included.
                (f64::from(e2m1[code]) * 2f64.powi(i32::from(e) - 127)) as f32
            })
            .collect();
        let got = &values[32 * b..32 * b + 32];
        assert_eq!(bits(got), bits(&expected), "scale byte {e}");
    }
    // The extremes, spelled out: byte 0 is 2^−128 (an f32 subnormal), byte 255 is 2^127 (not
    // NaN), and from byte 254 up llama.cpp's products overflow; code 8 is +0.
    let at = |b: usize, j: usize| values[32 * b + j];
    assert_eq!(at(0, 1).to_bits(), 0x0020_0000);
    assert_eq!(at(0, 7), 12.0 * pow2(-128));
    assert_eq!(at(1, 25), 8.0 * pow2(-127)); // element 25: high nibble of byte 9, code 6
    assert_eq!(at(1, 16), -12.0 * pow2(-127)); // element 16: code 15
    assert_eq!(at(9, 3), 3.0 * pow2(126));
    assert_eq!(at(9, 4), f32::INFINITY);
    assert_eq!(at(10, 1), pow2(127));
    assert_eq!(at(10, 2), f32::INFINITY);
    assert_eq!(at(10, 9), f32::from_bits(0xFF00_0000)); // code 9: −2^127
    assert_eq!(at(10, 10), f32::NEG_INFINITY);
    assert_eq!(at(10, 8).to_bits(), 0, "code 8 is +0");
    assert_eq!(mxfp4_scale(255), pow2(127));
    assert_eq!(mxfp4_scale(128), 1.0);
    assert_eq!(mxfp4_scale(0), pow2(-128));
}

/// The affine form (8-bit codes, groups of 32, bias −16 · scale) gives llama.cpp's values bit
/// for bit at every scale byte up to 251, unfused or fused; its codes fit 5 bits; the exact
/// scales are the power of two. Above 251 there is no form, and the refusal names the block.
#[test]
fn mxfp4_affine_form_is_exact_at_every_scale_byte_it_accepts() {
    let ty = GgmlType::MXFP4;
    assert_eq!(
        (affine_bits(ty), affine_group_size(ty), bias_multiple(ty)),
        (Some(8), 32, Some(-16.0))
    );
    for e in 0..=255u8 {
        // Every code in both halves, in two orders.
        let data: Vec<u8> = [every_code(e), block(e, [7; 16], [15; 16])].concat();
        let expected = dequantize_reference(ty, &data).unwrap();
        if e > MXFP4_MAX_AFFINE_SCALE_BYTE {
            let reason = affine_form_refusal(ty, &data).expect("refused");
            assert!(
                reason.contains("block 0") && reason.contains(&format!("scale byte {e}")),
                "{reason}"
            );
            assert_eq!(exact_scales(ty, &data[..17]), None);
            continue;
        }
        assert_eq!(affine_form_refusal(ty, &data), None, "byte {e}");
        for (b, chunk) in data.chunks_exact(17).enumerate() {
            let groups = affine_groups(ty, chunk);
            assert_eq!(groups.len(), 1);
            let g = &groups[0];
            assert_eq!(
                (g.len, g.scale, g.bias),
                (32, mxfp4_scale(e), -16.0 * mxfp4_scale(e))
            );
            assert_eq!(
                exact_scales(ty, chunk),
                Some(ExactScales::Single {
                    scale: mxfp4_scale(e)
                })
            );
            for (j, &q) in g.values().iter().enumerate() {
                assert!((4..=28).contains(&q), "code {q} outside 5 bits' 4..=28");
                let want = expected[32 * b + j].to_bits();
                let plain = g.scale * f32::from(q) + g.bias;
                let fused = g.scale.mul_add(f32::from(q), g.bias);
                assert_eq!(plain.to_bits(), want, "byte {e} element {j}");
                assert_eq!(fused.to_bits(), want, "byte {e} element {j} fused");
            }
        }
    }
    // A later block is named by its index; other types always have their form.
    let data: Vec<u8> = [every_code(120), every_code(130), every_code(253)].concat();
    let reason = affine_form_refusal(ty, &data).unwrap();
    assert!(
        reason.contains("block 2") && reason.contains("2^125"),
        "{reason}"
    );
    assert_eq!(affine_form_refusal(GgmlType::Q4_0, &[0xFF; 18]), None);
}

/// A tensor that is not whole blocks is refused where it is read, naming tensor and type; data
/// that is not whole blocks does not dequantize.
#[test]
fn short_and_malformed_mxfp4_tensors_are_refused() {
    let ty = GgmlType::MXFP4;
    assert_eq!(ty.bytes_for(64), Some(34));
    assert_eq!(
        ty.bytes_for(48),
        None,
        "48 values are not whole blocks of 32"
    );
    assert_eq!(dequantize_reference(ty, &every_code(128)[..16]), None);
    assert_eq!(
        dequantize_reference(ty, &[every_code(128), vec![0]].concat()),
        None
    );
    let dir = tempfile::tempdir().unwrap();
    let refused = |dims: &[u64], data: Vec<u8>| {
        let mut w = GgufWriter::new();
        w.tensor("blk.0.ffn_down_exps.weight", dims, ty, data);
        let path = dir.path().join("short.gguf");
        w.write(&mut std::fs::File::create(&path).unwrap()).unwrap();
        GgufFile::open(&path).unwrap_err().to_string()
    };
    // 48 values: not whole blocks.
    let message = refused(&[48], [every_code(128), every_code(128)].concat());
    assert!(
        message.contains("blk.0.ffn_down_exps.weight") && message.contains("MXFP4"),
        "{message}"
    );
    // 96 values stored as one block: the file ends before the tensor does.
    let message = refused(&[96], every_code(128));
    assert!(
        message.contains("blk.0.ffn_down_exps.weight")
            && message.contains("does not lie within the file"),
        "{message}"
    );
}

/// A model whose linears are MXFP4 converts to 8-bit affine groups of 32 (f16 scales and biases:
/// real weights' scales fit f16) and opens lazily from the GGUF, every tensor llama.cpp's values
/// bit for bit either way.
#[test]
fn an_mxfp4_model_converts_and_opens_lazily_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("mxfp4.gguf");
    TinyLlama {
        linear_type: |part| match part {
            "attn_output" => GgmlType::Q4_0,
            "output" => GgmlType::Q8_0,
            _ => GgmlType::MXFP4,
        },
        ..TinyLlama::default()
    }
    .write(&gguf, 39);
    let written = dir.path().join("written");
    convert_gguf(&gguf, &written).unwrap();
    let lazy = converted(&dir.path().join("cache"), &gguf, "00000039").unwrap();
    for ckpt_dir in [written, lazy] {
        let model = LoadedModel::open(&ckpt_dir).unwrap();
        let ckpt: &Checkpoint = &model.checkpoint;
        assert_eq!(assert_lossless(&gguf, ckpt), 2 + 9 * 2);
        for m in [
            "model.layers.0.self_attn.q_proj",
            "model.layers.1.mlp.down_proj",
        ] {
            let spec = ckpt.quantization_of(m).map(|s| (s.bits, s.group_size));
            assert_eq!(spec, Some((8, 32)), "{m}");
            assert_eq!(
                ckpt.tensor(&format!("{m}.scales")).unwrap().dtype,
                Dtype::F16
            );
        }
        let ggml = |name: &str| {
            ckpt.gguf_blocks(name)
                .map(|b| (b.ggml_type, b.rows, b.cols))
        };
        let up = ggml("model.layers.0.mlp.up_proj.weight");
        assert!(
            up.is_none() || up == Some((GgmlType::MXFP4, 96, 64)),
            "{up:?}"
        );
    }
}
