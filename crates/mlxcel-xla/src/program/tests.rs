//! The program's emission tests, on a tiny model.

use std::collections::BTreeMap;

use super::{decode_batches, decode_function, emit_llama};
use crate::abi::{
    Layout, LlamaDims, Packing, ProgramShape, WeightFormat, weight_specs, weight_type, weight_types,
};
use crate::error::EmitError;
use crate::hlo::{ElementType, TensorType};
use crate::kernels;

/// A two-layer model small enough to compile in seconds.
pub(crate) fn tiny_dims(tied: bool, qkv_bias: bool) -> LlamaDims {
    let head_dim = 8;
    LlamaDims {
        layers: 2,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim,
        intermediate: 32,
        vocab: 64,
        rms_norm_eps: 1e-5,
        inv_freq: (0..head_dim / 2)
            .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / head_dim as f32))
            .collect(),
        qkv_bias,
        out_bias: false,
        tied_embeddings: tied,
        qk_norm: false,
        layer_attention: vec![
            mlxcel_model::LayerAttention {
                rope: true,
                window: None,
                linear: None,
                conv: None
            };
            2
        ],
        local_inv_freq: None,
        rotary_dim: head_dim,
        rope_mscale: 1.0,
        norm_offset: false,
        sandwich_norms: false,
        gelu: false,
        embedding_scale: None,
        attention_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        packed: BTreeMap::new(),
    }
}

pub(crate) const TINY_SHAPE: ProgramShape = ProgramShape {
    context_capacity: 16,
    batch: 2,
    chunk: 4,
    min_window: 0,
};

#[test]
fn weight_specs_cover_every_tensor_in_order() {
    let d = tiny_dims(false, true);
    let specs = weight_specs(&d);
    // embed, per layer (norm, 3 × (w, b), o, norm, gate, up, down), norm, lm_head.
    assert_eq!(specs.len(), 1 + 2 * 12 + 2);
    assert_eq!(specs[0].name, "model.embed_tokens.weight");
    assert_eq!(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(specs[2].dims, vec![16, 32]);
    assert_eq!(
        specs.last().map(|s| s.name.as_str()),
        Some("lm_head.weight")
    );
    assert_eq!(
        (specs[0].dims.clone(), specs[0].layout),
        (vec![64, 16], Layout::AsIs)
    );
    let tied = weight_specs(&tiny_dims(true, false));
    assert_eq!(tied.len(), 1 + 2 * 9 + 1);
    // A tied table is passed `[hidden, vocab]`: the output projection's `[in, out]`.
    assert_eq!(
        (tied[0].dims.clone(), tied[0].layout),
        (vec![16, 64], Layout::Transposed)
    );
    // Too narrow to be blocked: its columns gathered for the embedding, `[in, out]` for the
    // logits.
    assert_eq!(
        weight_type(&tied[0], WeightFormat::F16),
        TensorType::new(&[16, 64], ElementType::F16)
    );
    let text = emit_llama(&tiny_dims(true, false), &TINY_SHAPE, WeightFormat::F32).unwrap();
    assert!(text.contains("collapsed_slice_dims = [1]"));
    assert!(!text.contains("collapsed_slice_dims = [0]"));
    assert!(text.contains(
        "contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x64xf32>) -> tensor<2x64xf32>"
    ));
    // A vocabulary of 2048 is blocked like every wide transposed weight: `[2048 / 256,
    // hidden, 256]`, its (block, column) pairs gathered, one batched matmul for the logits.
    let wide = LlamaDims {
        vocab: 2048,
        ..tiny_dims(true, false)
    };
    let wide_specs = weight_specs(&wide);
    assert_eq!(
        weight_type(&wide_specs[0], WeightFormat::F16),
        TensorType::new(&[8, 16, 256], ElementType::F16)
    );
    assert_eq!(
        weight_type(&wide_specs[2], WeightFormat::F32),
        TensorType::new(&[16, 32], ElementType::F32)
    );
    let text = emit_llama(&wide, &TINY_SHAPE, WeightFormat::F32).unwrap();
    assert!(text.contains("collapsed_slice_dims = [0, 2], start_index_map = [0, 2]"));
    assert!(text.contains(
        "batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x2x16xf32>, \
         tensor<8x16x256xf32>) -> tensor<8x2x256xf32>"
    ));
}

#[test]
fn wide_weights_are_blocked_by_the_widest_divisor_up_to_256_columns() {
    use crate::abi::block_columns;
    // Llama-3.2-1B / SmolLM2 / Qwen2.5-3B / Llama-3.1-8B widths and vocabularies.
    for (out, block) in [
        (1536, Some(256)),
        (1024, Some(256)),
        (49152, Some(256)),
        (11008, Some(256)),
        (128256, Some(256)),
        (151936, Some(128)),
        (1056, Some(176)),
    ] {
        assert_eq!(block_columns(out), block, "{out}");
    }
    // Narrower than 1024 columns, or no divisor of at least 32 columns: `[in, out]`.
    for out in [576, 192, 1000, 1031, 32003, 16] {
        assert_eq!(block_columns(out), None, "{out}");
    }
}

#[test]
fn emits_prefill_and_decode_with_caches_threaded_through() {
    let d = tiny_dims(true, false);
    let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::F32).unwrap();
    assert!(text.contains("func.func @prefill("));
    assert!(text.contains("func.func @decode("));
    // Each function returns the logits and 2 layers × (keys, values), each
    // `[batch, kv_heads, positions, head_dim]`.
    let cache = "tensor<2x2x20x8xf32>";
    let returns = format!("(tensor<1x64xf32>, {cache}, {cache}, {cache}, {cache})");
    assert!(text.contains(&returns), "{text}");
    assert!(text.contains(&format!(
        "(tensor<2x64xf32>, {cache}, {cache}, {cache}, {cache})"
    )));
}

#[test]
fn f16_weights_are_widened_in_the_graph() {
    let d = tiny_dims(false, false);
    let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::F16).unwrap();
    assert!(text.contains("tensor<64x16xf16>"));
    assert!(text.contains("-> tensor<64x16xf32>"));
}

fn packed_tiny(bits: u32, group: usize) -> LlamaDims {
    let mut d = tiny_dims(true, false);
    for spec in weight_specs(&d) {
        if !spec.always_f32 {
            let scales = ElementType::F16;
            d.packed.insert(
                spec.name.clone(),
                Packing {
                    bits,
                    group,
                    scales,
                },
            );
        }
    }
    d
}

#[test]
fn packed_weights_are_integers_scales_and_biases() {
    let d = packed_tiny(4, 8);
    let specs = weight_specs(&d);
    // The q projection `[in 16, out 32]` is passed as the checkpoint's `[32, 16]` in groups.
    let q = &specs[2];
    assert_eq!(q.name, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(
        weight_types(q, WeightFormat::Packed),
        [
            TensorType::new(&[32, 2, 8], ElementType::U4),
            TensorType::new(&[32, 2], ElementType::F16),
            TensorType::new(&[32, 2], ElementType::F16),
        ]
    );
    // Other formats ignore the packing; norms are never packed.
    assert_eq!(weight_types(q, WeightFormat::F16).len(), 1);
    assert_eq!(weight_types(&specs[1], WeightFormat::Packed).len(), 1);
    let text = emit_llama(&d, &TINY_SHAPE, WeightFormat::Packed).unwrap();
    assert!(text.contains("%arg0: tensor<64x2x8xui4>, %arg1: tensor<64x2xf16>"));
    assert!(text.contains("(tensor<32x2x8xui4>) -> tensor<32x2x8xf32>"));
    assert!(!text.contains("ui4>) -> tensor<16x32xf32>"));
    let eight = emit_llama(&packed_tiny(8, 8), &TINY_SHAPE, WeightFormat::Packed).unwrap();
    assert!(eight.contains("tensor<64x2x8xui8>"));
}

/// Under the kernel formats (where the kernels exist) every packed linear is a dispatch to
/// mlxcel's executable: q, k and v in one, gate and up in one; int8 activations quantize
/// each distinct input once. Groups the int8 kernels do not take are refused by name.
#[test]
fn kernel_formats_dispatch_to_mlxcels_kernels() {
    let mut d = tiny_dims(true, true);
    // Inputs of 64 and 128 values, so that groups of 32 divide them.
    d.hidden = 64;
    d.intermediate = 128;
    d.heads = 8;
    d.kv_heads = 4;
    let mut packed = d.clone();
    for spec in weight_specs(&d) {
        if !spec.always_f32 {
            let p = Packing {
                bits: 4,
                group: 32,
                scales: ElementType::F16,
            };
            packed.packed.insert(spec.name.clone(), p);
        }
    }
    if kernels::object_file_name().is_none() {
        assert!(emit_llama(&packed, &TINY_SHAPE, WeightFormat::Kernel).is_err());
        return;
    }
    let f32x = emit_llama(&packed, &TINY_SHAPE, WeightFormat::Kernel).unwrap();
    assert!(f32x.contains("stream.executable private @mlxcel_qmm"));
    assert!(f32x.contains("func.call @mlxcel_qmm4_f16_x3("));
    // Per function (prefill, two decodes): one q/k/v and one gate/up dispatch a layer, o
    // and down one each, and the tied head.
    let calls =
        |text: &str, export: &str| text.matches(&format!("@mlxcel_qmm::@{export}[")).count();
    let functions =
        f32x.matches("func.func @prefill").count() + f32x.matches("func.func @decode").count();
    assert!(functions >= 2);
    assert_eq!(calls(&f32x, "qmm4_f16_x3"), 2 * functions);
    assert_eq!(calls(&f32x, "qmm4_f16_x2"), 2 * functions);
    assert_eq!(calls(&f32x, "qmm4_f16"), (2 * 2 + 1) * functions);
    assert!(!f32x.contains("@quantize_x4["));
    let int8 = emit_llama(&packed, &TINY_SHAPE, WeightFormat::KernelInt8).unwrap();
    assert_eq!(calls(&int8, "qmm4i_f16_x3"), 2 * functions);
    // The inputs of q/k/v, o, gate/up, down per layer, and the head's.
    assert_eq!(
        int8.matches("@mlxcel_qmm::@quantize_x4[").count(),
        (2 * 4 + 1) * functions
    );
    // Groups of 16 fit neither kernel.
    for p in packed.packed.values_mut() {
        p.group = 16;
    }
    let err = emit_llama(&packed, &TINY_SHAPE, WeightFormat::KernelInt8).unwrap_err();
    assert!(
        err.to_string().contains("kernel-int8 weight format"),
        "{err}"
    );
}

#[test]
fn refuses_packing_it_cannot_pass() {
    for (bits, group) in [(3, 8), (4, 5), (4, 0)] {
        assert!(
            matches!(
                emit_llama(&packed_tiny(bits, group), &TINY_SHAPE, WeightFormat::Packed),
                Err(EmitError::Shape { op: "llama", .. })
            ),
            "{bits} bits, groups of {group}"
        );
        // Widened formats dequantize on the host and need no packing.
        emit_llama(&packed_tiny(bits, group), &TINY_SHAPE, WeightFormat::F16).unwrap();
    }
}

#[test]
fn decode_functions_cover_powers_of_two_then_the_batch() {
    assert_eq!(decode_batches(1), [1]);
    assert_eq!(decode_batches(2), [2]);
    assert_eq!(decode_batches(6), [2, 4, 6]);
    assert_eq!(decode_batches(8), [2, 4, 8]);
    assert_eq!(decode_function(8, 8), "decode");
    assert_eq!(decode_function(2, 8), "decode_2");
    let shape = ProgramShape {
        batch: 4,
        ..TINY_SHAPE
    };
    let text = emit_llama(&tiny_dims(true, false), &shape, WeightFormat::F32).unwrap();
    // Batch 4: `decode_2` reads the first two cache rows, `decode` all four.
    assert!(text.contains("func.func @decode_2("));
    assert!(text.contains("-> (tensor<2x64xf32>, tensor<4x2x20x8xf32>"));
    assert!(text.contains("[0:2:1, 0:2:1, 0:20:1, 0:8:1]"));
    assert!(!text.contains("func.func @decode_1("));
}

#[test]
fn windowed_functions_attend_over_the_first_positions() {
    let shape = ProgramShape {
        min_window: 4,
        ..TINY_SHAPE
    };
    assert_eq!(shape.windows(), [4, 8, 20]);
    assert_eq!(TINY_SHAPE.windows(), [20]);
    let big = ProgramShape {
        context_capacity: 2048,
        batch: 8,
        chunk: 32,
        min_window: 256,
    };
    assert_eq!(big.windows(), [256, 512, 1024, 2080]);
    assert_eq!(big.window_for(1), 256);
    assert_eq!(big.window_for(257), 512);
    assert_eq!(big.window_for(2048), 2080);
    assert_eq!(big.function("decode_2", 512), "decode_2_w512");
    assert_eq!(big.function("prefill", 2080), "prefill");
    assert_eq!(
        big.module_name(WeightFormat::F16),
        "mlxcel_c2048_b8_t32_w256_f16"
    );
    let text = emit_llama(&tiny_dims(true, false), &shape, WeightFormat::F32).unwrap();
    for f in [
        "prefill",
        "decode",
        "prefill_w4",
        "decode_w4",
        "prefill_w8",
        "decode_w8",
    ] {
        assert!(text.contains(&format!("func.func @{f}(")), "{f}");
    }
    // Prefill reads the first 4 positions of its row; decode the first 8 of both rows.
    assert!(text.contains("tensor<1x2x4x8xf32>"));
    assert!(text.contains("[0:2:1, 0:2:1, 0:8:1, 0:8:1]"));
}

#[test]
fn refuses_heads_that_do_not_group() {
    let mut d = tiny_dims(true, false);
    d.kv_heads = 3;
    assert!(matches!(
        emit_llama(&d, &TINY_SHAPE, WeightFormat::F32),
        Err(EmitError::Shape { op: "llama", .. })
    ));
}
