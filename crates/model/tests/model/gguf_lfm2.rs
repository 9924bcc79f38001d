//! LFM2 and LFM2-MoE GGUF files as llama.cpp writes them: the per-layer
//! `attention.head_count_kv` (0 for a short-convolution layer), `shortconv.l_cache`, the
//! `shortconv.*` tensors (the taps squeezed to `[hidden, taps]`), the final norm
//! `token_embd_norm`, and LFM2-MoE's leading dense layers, sigmoid routing and `exp_probs_b`.

use mlxcel_model::gguf::{GgmlType, GgufFile, GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, Routing, ShortConv, converted};

use crate::fixtures::{Rng, TinyLlama, floats, random_tensor};

const HIDDEN: u64 = 64;
const FFN: u64 = 96;
const EXPERTS: u64 = 4;
const EXPERT_FFN: u64 = 32;

/// A two-layer file of `arch`: layer 0 a short convolution with a dense MLP, layer 1 attention
/// (q/k norms) with a dense MLP (`lfm2`) or routed experts (`lfm2moe`).
fn write_lfm2(path: &std::path::Path, arch: &'static str) {
    let tiny = TinyLlama {
        arch,
        hidden: HIDDEN as usize,
        ffn: FFN as usize,
        ..TinyLlama::default()
    };
    let mut w: GgufWriter = tiny.metadata();
    let key = |k: &str| format!("{arch}.{k}");
    // Replaces the fixture's single count (the reader keeps a key's last value).
    w.metadata(
        &key("attention.head_count_kv"),
        GgufValue::Array(vec![GgufValue::U32(0), GgufValue::U32(2)]),
    )
    .metadata(&key("shortconv.l_cache"), GgufValue::U32(3));
    if arch == "lfm2moe" {
        w.metadata(&key("expert_count"), GgufValue::U32(EXPERTS as u32))
            .metadata(&key("expert_used_count"), GgufValue::U32(2))
            .metadata(
                &key("expert_feed_forward_length"),
                GgufValue::U32(EXPERT_FFN as u32),
            )
            .metadata(&key("leading_dense_block_count"), GgufValue::U32(1))
            .metadata(&key("expert_gating_func"), GgufValue::U32(2));
    }
    let mut rng = Rng::new(59);
    let h = HIDDEN;
    let kv = 2 * h / 4;
    let vocab = tiny.tokens().0.len() as u64;
    let mut add = |w: &mut GgufWriter, name: String, dims: &[u64], ty: GgmlType| {
        let n = dims.iter().product::<u64>() as usize;
        w.tensor(&name, dims, ty, random_tensor(ty, n, &mut rng));
    };
    add(
        &mut w,
        "token_embd.weight".into(),
        &[h, vocab],
        GgmlType::F32,
    );
    add(&mut w, "token_embd_norm.weight".into(), &[h], GgmlType::F32);
    for l in 0..2 {
        let b = |p: &str| format!("blk.{l}.{p}.weight");
        add(&mut w, b("attn_norm"), &[h], GgmlType::F32);
        add(&mut w, b("ffn_norm"), &[h], GgmlType::F32);
        if l == 0 {
            add(&mut w, b("shortconv.conv"), &[3, h], GgmlType::F32);
            add(&mut w, b("shortconv.in_proj"), &[h, 3 * h], GgmlType::Q8_0);
            add(&mut w, b("shortconv.out_proj"), &[h, h], GgmlType::F16);
        } else {
            add(&mut w, b("attn_q"), &[h, h], GgmlType::Q8_0);
            add(&mut w, b("attn_k"), &[h, kv], GgmlType::F32);
            add(&mut w, b("attn_v"), &[h, kv], GgmlType::F32);
            add(&mut w, b("attn_output"), &[h, h], GgmlType::F32);
            add(&mut w, b("attn_q_norm"), &[16], GgmlType::F32);
            add(&mut w, b("attn_k_norm"), &[16], GgmlType::F32);
        }
        if arch == "lfm2moe" && l == 1 {
            let (e, f) = (EXPERTS, EXPERT_FFN);
            add(&mut w, b("ffn_gate_inp"), &[h, e], GgmlType::F32);
            add(&mut w, b("ffn_gate_exps"), &[h, f, e], GgmlType::Q8_0);
            add(&mut w, b("ffn_up_exps"), &[h, f, e], GgmlType::Q8_0);
            add(&mut w, b("ffn_down_exps"), &[f, h, e], GgmlType::F16);
            add(
                &mut w,
                format!("blk.{l}.exp_probs_b.bias"),
                &[e],
                GgmlType::F32,
            );
        } else {
            add(&mut w, b("ffn_gate"), &[h, FFN], GgmlType::Q8_0);
            add(&mut w, b("ffn_up"), &[h, FFN], GgmlType::Q8_0);
            add(&mut w, b("ffn_down"), &[FFN, h], GgmlType::F32);
        }
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    w.write(&mut out).unwrap();
}

/// The f32 values of GGUF tensor `name`.
fn gguf_f32(gguf: &GgufFile, name: &str) -> Vec<f32> {
    let data = gguf.tensor_data(gguf.tensor_info(name).unwrap()).unwrap();
    data.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn lfm2_reads_its_convolution_layers_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfm2.gguf");
    write_lfm2(&path, "lfm2");
    let lazy = converted(&dir.path().join("cache"), &path, "0123abcd").unwrap();
    let ckpt = Checkpoint::open(&lazy).unwrap();
    let c = ckpt.config();
    assert_eq!(c.architecture.model_type(), "lfm2");
    assert_eq!(c.layers[0].conv, Some(ShortConv { kernel: 3 }));
    assert!(c.layers[1].conv.is_none());
    // The file's feed-forward length is the MLP's size as it stands (not adjusted again).
    assert_eq!((c.intermediate_size, c.num_key_value_heads), (96, 2));
    assert!(c.tie_word_embeddings && c.qk_norm);
    let gguf = GgufFile::open(&path).unwrap();
    let taps = ckpt.tensor("model.layers.0.conv.conv.weight").unwrap();
    assert_eq!(taps.shape, [64, 3]);
    assert_eq!(
        floats(taps.dtype, taps.data),
        gguf_f32(&gguf, "blk.0.shortconv.conv.weight")
    );
    let norm = ckpt.tensor("model.norm.weight").unwrap();
    assert_eq!(
        floats(norm.dtype, norm.data),
        gguf_f32(&gguf, "token_embd_norm.weight")
    );
    assert_eq!(
        ckpt.quantization_of("model.layers.0.conv.in_proj")
            .map(|s| s.bits),
        Some(8)
    );
    assert!(
        ckpt.tensor("model.layers.1.self_attn.q_norm.weight")
            .is_some()
    );
}

#[test]
fn lfm2moe_routes_by_sigmoid_past_its_leading_dense_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfm2moe.gguf");
    write_lfm2(&path, "lfm2moe");
    let lazy = converted(&dir.path().join("cache"), &path, "0123abcd").unwrap();
    let ckpt = Checkpoint::open(&lazy).unwrap();
    let c = ckpt.config();
    assert_eq!(c.architecture.model_type(), "lfm2_moe");
    assert!(c.feed_forward[0].routed().is_none());
    let moe = *c.feed_forward[1].routed().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate_size),
        (4, 2, 32)
    );
    assert_eq!(
        moe.routing,
        Routing::SigmoidTopK {
            renormalize: true,
            selection_bias: true
        }
    );
    let gguf = GgufFile::open(&path).unwrap();
    let bias = ckpt.tensor("model.layers.1.mlp.expert_bias").unwrap();
    assert_eq!(
        floats(bias.dtype, bias.data),
        gguf_f32(&gguf, "blk.1.exp_probs_b.bias")
    );
    assert!(
        ckpt.tensor("model.layers.1.mlp.experts.3.down_proj.weight")
            .is_some()
    );
}
