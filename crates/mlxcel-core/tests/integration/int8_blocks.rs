//! The int8 layout written straight from GGUF blocks against the general way (the blocks
//! converted to the affine form, then interleaved with the compact layout): the same
//! dequantized rows and the same matmul bits on every path, for every block type, alone and
//! stacked, and the same logits from a whole model.

use std::path::Path;

use mlxcel_core::{
    Activations, Array, Dtype, ForwardSeq, Int8Layout, Isa, Kernels, LlamaModel, QuantizedWeight,
};
use mlxcel_model::gguf::GgmlType;
use mlxcel_model::{Checkpoint, convert_gguf, converted};

#[allow(dead_code)]
#[path = "../../../model/tests/model/fixtures.rs"]
pub(crate) mod fixtures;

use fixtures::TinyLlama;

use crate::pseudo_random;

/// Every GGUF type with an affine form, over the linears of three tiny models.
pub(crate) fn mixes() -> [TinyLlama; 3] {
    let base = TinyLlama {
        hidden: 256,
        ffn: 512,
        tied: false,
        embed_type: GgmlType::Q4_K,
        ..TinyLlama::default()
    };
    [
        TinyLlama {
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
            ..base
        },
        TinyLlama {
            // q, k and v alike and gate and up alike: the stacked forms; 272 vocabulary rows
            // (a multiple of 16), so the untied table is written from its blocks too.
            extra_tokens: 9,
            linear_type: |part| match part {
                "attn_q" | "attn_k" | "attn_v" => GgmlType::Q4_K,
                "attn_output" => GgmlType::Q4_1,
                "ffn_gate" | "ffn_up" => GgmlType::Q5_0,
                "ffn_down" => GgmlType::Q5_1,
                _ => GgmlType::Q6_K,
            },
            ..base
        },
        TinyLlama {
            // MXFP4 (gpt-oss's experts), alone and stacked, and as the untied output.
            extra_tokens: 9,
            linear_type: |part| match part {
                "attn_output" => GgmlType::Q4_0,
                _ => GgmlType::MXFP4,
            },
            ..base
        },
    ]
}

/// A GGUF fixture, as `-m FILE.gguf` reads it (weights from the file's blocks) and as
/// `mlxcel convert` writes it (safetensors: no blocks to read, the general path).
pub(crate) fn prepared(model: &TinyLlama, dir: &Path, seed: u64) -> (Checkpoint, Checkpoint) {
    let gguf = dir.join(format!("m{seed}.gguf"));
    model.write(&gguf, seed);
    let written = dir.join(format!("written{seed}"));
    convert_gguf(&gguf, &written).unwrap();
    let lazy = converted(&dir.join("cache"), &gguf, &format!("{seed:08x}")).unwrap();
    (
        Checkpoint::open(&lazy).unwrap(),
        Checkpoint::open(&written).unwrap(),
    )
}

/// The last position's logits of one fixed six-token prompt.
pub(crate) fn six_token_logits(model: &LlamaModel) -> Vec<f32> {
    let mut cache = model.new_cache(16);
    model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &[5, 80, 200, 17, 3, 99],
        }])
        .unwrap()
        .remove(0)
}

/// The general path: the converted affine tensors, stacked, then interleaved (compact).
fn general(ckpt: &Checkpoint, modules: &[String]) -> QuantizedWeight {
    let array = |name: String| {
        let t = ckpt.tensor(&name).unwrap();
        let dtype = match t.dtype {
            mlxcel_model::Dtype::U32 => Dtype::U32,
            mlxcel_model::Dtype::F16 => Dtype::F16,
            mlxcel_model::Dtype::F32 => Dtype::F32,
            other => panic!("{name}: {other:?}"),
        };
        let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
        Array::from_bytes(t.data, &shape, dtype).unwrap()
    };
    let parts: Vec<QuantizedWeight> = modules
        .iter()
        .map(|m| {
            let spec = ckpt.quantization_of(m).unwrap();
            QuantizedWeight {
                weight: array(format!("{m}.weight")),
                scales: array(format!("{m}.scales")),
                biases: array(format!("{m}.biases")),
                group_size: spec.group_size as i32,
                bits: spec.bits as i32,
                int8: false,
                activations: None,
            }
        })
        .collect();
    let stacked = QuantizedWeight::concat_rows(&parts.iter().collect::<Vec<_>>()).unwrap();
    stacked.interleave_int8_as(Int8Layout::Compact).unwrap()
}

/// Same rows (every one, dequantized) and same products on every path, for x of 1, 3 and 9
/// rows (the GEMV and GEMM forms).
fn assert_same(direct: &QuantizedWeight, general: &QuantizedWeight, what: &str) {
    // (MXFP4 from its blocks keeps its 4-bit E2M1 indices, the general path 5-bit codes: the
    // same codes, read the same by every kernel.)
    let bits = if direct.e2m1_codes() { 5 } else { direct.bits };
    assert_eq!(
        (bits, direct.group_size, direct.int8),
        (general.bits, general.group_size, general.int8),
        "{what}"
    );
    let shape = direct.weight.shape();
    let (n, k) = (shape[0], shape[1] * 32 / direct.bits);
    let ids = Array::from_u32(&(0..n as u32).collect::<Vec<_>>(), &[n]).unwrap();
    let rows = |w: &QuantizedWeight| w.int8_rows(&ids).unwrap().to_vec_f32().unwrap();
    let (a, b) = (rows(direct), rows(general));
    assert!(
        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: dequantized rows differ"
    );
    for (m, isa) in [
        (1, Isa::Avx512),
        (3, Isa::Avx2),
        (9, Isa::Scalar),
        (9, Isa::Avx512),
    ] {
        let x = Array::from_f32(&pseudo_random((m * k) as usize, m as u64), &[m, k]).unwrap();
        let y = |w: &QuantizedWeight| w.matmul_native(&x, isa, 2).unwrap().to_vec_f32().unwrap();
        let (a, b) = (y(direct), y(general));
        assert!(
            a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: products differ for {m} rows on {isa:?}"
        );
    }
}

#[test]
fn int8_weights_from_gguf_blocks_match_the_general_path() {
    let dir = tempfile::tempdir().unwrap();
    for (seed, model) in mixes().iter().enumerate() {
        let (lazy, _) = prepared(model, dir.path(), seed as u64 + 41);
        let p = "model.layers.1";
        let mut stacks: Vec<Vec<String>> = [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ]
        .iter()
        .map(|m| vec![format!("{p}.{m}")])
        .collect();
        stacks.push(vec![
            format!("{p}.self_attn.q_proj"),
            format!("{p}.self_attn.k_proj"),
        ]);
        stacks.push(vec![
            format!("{p}.mlp.gate_proj"),
            format!("{p}.mlp.up_proj"),
        ]);
        for modules in stacks {
            let blocks: Vec<_> = modules
                .iter()
                .map(|m| lazy.gguf_blocks(&format!("{m}.weight")).unwrap())
                .collect();
            let types: Vec<GgmlType> = blocks.iter().map(|b| b.ggml_type).collect();
            let direct = QuantizedWeight::int8_from_gguf_blocks(&blocks, 2).unwrap();
            if types.iter().any(|&t| t != types[0]) {
                assert!(direct.is_none(), "{modules:?}: types {types:?} stacked");
                continue;
            }
            let direct = direct.unwrap_or_else(|| panic!("{modules:?} ({types:?}) not written"));
            assert_eq!(
                direct.derived_biases(),
                matches!(
                    types[0],
                    GgmlType::Q4_0
                        | GgmlType::Q5_0
                        | GgmlType::Q8_0
                        | GgmlType::Q6_K
                        | GgmlType::Q3_K
                        | GgmlType::MXFP4
                )
            );
            let what = format!("{modules:?} ({:?})", types[0]);
            assert_same(&direct, &general(&lazy, &modules), &what);
        }
        // A weight not read from a GGUF file has no blocks.
        let (_, written) = prepared(model, dir.path(), seed as u64 + 41);
        assert!(
            written
                .gguf_blocks(&format!("{p}.mlp.up_proj.weight"))
                .is_none()
        );
    }
}

/// A whole model loaded for int8 activations from the GGUF's blocks gives the logits, bit for
/// bit, of the same model loaded from its converted checkpoint (the general path), Phi-3's
/// fused projections included.
#[test]
fn a_model_loaded_from_gguf_blocks_gives_the_general_paths_logits() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = Kernels {
        activations: Activations::Int8,
        ..Kernels::native()
    };
    // Phi-3 stores q, k and v (and gate and up) fused: its parts are row ranges of one tensor.
    let phi3 = TinyLlama {
        arch: "phi3",
        tied: false,
        ..TinyLlama::default()
    };
    let [a, b, c] = mixes();
    for (seed, model) in [a, b, c, phi3].iter().enumerate() {
        let (lazy, written) = prepared(model, dir.path(), seed as u64 + 7);
        let up = "model.layers.0.mlp.up_proj.weight";
        assert!(lazy.gguf_blocks(up).is_some(), "{}", model.arch);
        let logits =
            |ckpt: &Checkpoint| six_token_logits(&LlamaModel::load_with(ckpt, kernels).unwrap());
        let (a, b) = (logits(&lazy), logits(&written));
        assert!(a.iter().all(|v| v.is_finite()));
        assert!(
            a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
            "mix {seed}: logits differ"
        );
    }
}
