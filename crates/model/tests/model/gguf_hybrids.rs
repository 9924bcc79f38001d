//! GGUF files of the gated-DeltaNet hybrids (llama.cpp's `qwen35`, `qwen35moe`, `qwen3next`):
//! their linear-attention tensors mapped to Hugging Face's, with what llama.cpp's converter did
//! undone (`ssm_a = -exp(A_log)`, norms as `1 + w` but the gated norm, `[channels, taps]`
//! convolution taps, Qwen3-Next's fused `ssm_ba`), the value heads' order kept as the file has
//! it, and the multi-token-prediction layers left out.

use std::path::Path;

use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter};
use mlxcel_model::{Checkpoint, LoadedModel, ModelConfig, convert_gguf};

use crate::fixtures::{Rng, TinyLlama, floats};

/// The shape of the tiny hybrids below.
const HIDDEN: u64 = 64;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const HEAD_DIM: u64 = 16;
const KEY_HEADS: u64 = 2;
const VALUE_HEADS: u64 = 4;
const KEY_DIM: u64 = 16;
const VALUE_DIM: u64 = 8;
const TAPS: u64 = 4;
const LAYERS: usize = 4;
const EXPERTS: u64 = 4;
const EXPERT_FFN: u64 = 32;

/// A tiny hybrid GGUF of `arch` (every fourth layer softmax attention), with experts when
/// `experts`, and one multi-token-prediction layer after the model's own. Returns what was
/// written, by tensor name.
fn write_hybrid(arch: &'static str, experts: bool, path: &Path) -> Vec<(String, Vec<f32>)> {
    let tiny = TinyLlama {
        arch,
        layers: LAYERS + 1,
        hidden: HIDDEN as usize,
        heads: HEADS as usize,
        kv_heads: KV_HEADS as usize,
        ffn: 96,
        ..TinyLlama::default()
    };
    let mut w: GgufWriter = tiny.metadata();
    let key = |k: &str| format!("{arch}.{k}");
    let u32v = GgufValue::U32;
    w.metadata(&key("nextn_predict_layers"), u32v(1))
        .metadata(&key("attention.key_length"), u32v(HEAD_DIM as u32))
        .metadata(&key("attention.value_length"), u32v(HEAD_DIM as u32))
        .metadata(&key("rope.dimension_count"), u32v(4))
        .metadata(&key("ssm.conv_kernel"), u32v(TAPS as u32))
        .metadata(&key("ssm.state_size"), u32v(KEY_DIM as u32))
        .metadata(&key("ssm.group_count"), u32v(KEY_HEADS as u32))
        .metadata(&key("ssm.time_step_rank"), u32v(VALUE_HEADS as u32))
        .metadata(
            &key("ssm.inner_size"),
            u32v((VALUE_HEADS * VALUE_DIM) as u32),
        )
        .metadata(&key("full_attention_interval"), u32v(4));
    if experts {
        w.metadata(&key("expert_count"), u32v(EXPERTS as u32))
            .metadata(&key("expert_used_count"), u32v(2))
            .metadata(&key("expert_feed_forward_length"), u32v(EXPERT_FFN as u32))
            .metadata(
                &key("expert_shared_feed_forward_length"),
                u32v(EXPERT_FFN as u32),
            );
    }
    let mut rng = Rng::new(3);
    let mut written = Vec::new();
    let mut add = |w: &mut GgufWriter, name: String, dims: &[u64], lo: f32, hi: f32| {
        let n = dims.iter().product::<u64>() as usize;
        let values: Vec<f32> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor(&name, dims, GgmlType::F32, data);
        written.push((name, values));
    };
    let vocab = tiny.tokens().0.len() as u64;
    add(
        &mut w,
        "token_embd.weight".into(),
        &[HIDDEN, vocab],
        -1.0,
        1.0,
    );
    add(&mut w, "output_norm.weight".into(), &[HIDDEN], 0.5, 1.5);
    let conv_dim = 2 * KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM;
    let value_dim = VALUE_HEADS * VALUE_DIM;
    for l in 0..LAYERS {
        let b = |part: &str| format!("blk.{l}.{part}");
        add(&mut w, b("attn_norm.weight"), &[HIDDEN], 0.5, 1.5);
        add(&mut w, b("post_attention_norm.weight"), &[HIDDEN], 0.5, 1.5);
        if (l + 1) % 4 == 0 {
            let q = HEADS * HEAD_DIM;
            add(&mut w, b("attn_q.weight"), &[HIDDEN, 2 * q], -0.1, 0.1);
            add(
                &mut w,
                b("attn_k.weight"),
                &[HIDDEN, KV_HEADS * HEAD_DIM],
                -0.1,
                0.1,
            );
            add(
                &mut w,
                b("attn_v.weight"),
                &[HIDDEN, KV_HEADS * HEAD_DIM],
                -0.1,
                0.1,
            );
            add(&mut w, b("attn_output.weight"), &[q, HIDDEN], -0.1, 0.1);
            add(&mut w, b("attn_q_norm.weight"), &[HEAD_DIM], 0.5, 1.5);
            add(&mut w, b("attn_k_norm.weight"), &[HEAD_DIM], 0.5, 1.5);
        } else {
            add(&mut w, b("attn_qkv.weight"), &[HIDDEN, conv_dim], -0.1, 0.1);
            add(
                &mut w,
                b("attn_gate.weight"),
                &[HIDDEN, value_dim],
                -0.1,
                0.1,
            );
            if arch == "qwen3next" {
                add(
                    &mut w,
                    b("ssm_ba.weight"),
                    &[HIDDEN, 2 * VALUE_HEADS],
                    -0.1,
                    0.1,
                );
            } else {
                add(
                    &mut w,
                    b("ssm_beta.weight"),
                    &[HIDDEN, VALUE_HEADS],
                    -0.1,
                    0.1,
                );
                add(
                    &mut w,
                    b("ssm_alpha.weight"),
                    &[HIDDEN, VALUE_HEADS],
                    -0.1,
                    0.1,
                );
            }
            add(&mut w, b("ssm_conv1d.weight"), &[TAPS, conv_dim], -0.5, 0.5);
            add(&mut w, b("ssm_a"), &[VALUE_HEADS], -8.0, -0.5);
            add(&mut w, b("ssm_dt.bias"), &[VALUE_HEADS], -1.0, 1.0);
            add(&mut w, b("ssm_norm.weight"), &[VALUE_DIM], 0.5, 1.5);
            add(&mut w, b("ssm_out.weight"), &[value_dim, HIDDEN], -0.1, 0.1);
        }
        if experts {
            add(
                &mut w,
                b("ffn_gate_inp.weight"),
                &[HIDDEN, EXPERTS],
                -0.1,
                0.1,
            );
            for part in ["ffn_gate_exps", "ffn_up_exps"] {
                add(
                    &mut w,
                    b(&format!("{part}.weight")),
                    &[HIDDEN, EXPERT_FFN, EXPERTS],
                    -0.1,
                    0.1,
                );
            }
            add(
                &mut w,
                b("ffn_down_exps.weight"),
                &[EXPERT_FFN, HIDDEN, EXPERTS],
                -0.1,
                0.1,
            );
            add(&mut w, b("ffn_gate_inp_shexp.weight"), &[HIDDEN], -0.1, 0.1);
            add(
                &mut w,
                b("ffn_gate_shexp.weight"),
                &[HIDDEN, EXPERT_FFN],
                -0.1,
                0.1,
            );
            add(
                &mut w,
                b("ffn_up_shexp.weight"),
                &[HIDDEN, EXPERT_FFN],
                -0.1,
                0.1,
            );
            add(
                &mut w,
                b("ffn_down_shexp.weight"),
                &[EXPERT_FFN, HIDDEN],
                -0.1,
                0.1,
            );
        } else {
            add(&mut w, b("ffn_gate.weight"), &[HIDDEN, 96], -0.1, 0.1);
            add(&mut w, b("ffn_up.weight"), &[HIDDEN, 96], -0.1, 0.1);
            add(&mut w, b("ffn_down.weight"), &[96, HIDDEN], -0.1, 0.1);
        }
    }
    // The prediction layer's tensors, which the import leaves out.
    add(
        &mut w,
        format!("blk.{LAYERS}.nextn.eh_proj.weight"),
        &[2 * HIDDEN, HIDDEN],
        -0.1,
        0.1,
    );
    add(
        &mut w,
        format!("blk.{LAYERS}.attn_norm.weight"),
        &[HIDDEN],
        0.5,
        1.5,
    );
    w.write(&mut std::fs::File::create(path).unwrap()).unwrap();
    written
}

/// `name`'s f32 values in the converted checkpoint, and its shape.
fn tensor(checkpoint: &Checkpoint, name: &str) -> (Vec<f32>, Vec<usize>) {
    let view = checkpoint
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    (floats(view.dtype, view.data), view.shape.to_vec())
}

fn written<'a>(all: &'a [(String, Vec<f32>)], name: &str) -> &'a [f32] {
    &all.iter().find(|(n, _)| n == name).unwrap().1
}

/// Converts `arch`'s tiny file and opens it as the engine would.
fn convert(
    arch: &'static str,
    experts: bool,
) -> (
    tempfile::TempDir,
    ModelConfig,
    LoadedModel,
    Vec<(String, Vec<f32>)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join(format!("{arch}.gguf"));
    let all = write_hybrid(arch, experts, &gguf);
    let out = dir.path().join("out");
    let summary = convert_gguf(&gguf, &out).unwrap();
    let model = LoadedModel::open(&out).unwrap();
    (dir, summary.config, model, all)
}

#[test]
fn qwen35_maps_linear_attention_and_undoes_llama_cpp_transforms() {
    let (_dir, _, model, all) = convert("qwen35", false);
    let c = model.config();
    let ck = &model.checkpoint;
    assert_eq!(c.architecture.model_type(), "qwen3_5");
    assert_eq!(
        c.num_hidden_layers, LAYERS,
        "the prediction layer is left out"
    );
    assert!(c.norm_weight_offset && c.attention_output_gate && c.qk_norm);
    assert_eq!(c.rotary_dim, 4);
    let linear: Vec<bool> = c.layers.iter().map(|l| l.linear.is_some()).collect();
    assert_eq!(linear, [true, true, true, false]);
    let net = c.layers[0].linear.unwrap();
    assert_eq!(
        (
            net.key_heads,
            net.value_heads,
            net.key_head_dim,
            net.value_head_dim,
            net.conv_kernel
        ),
        (2, 4, 16, 8, 4)
    );
    // llama.cpp's qwen35 files order the value heads tiled; the projections are apart.
    assert!(net.tiled_value_heads && !net.fused_projections);

    let a = "model.layers.0.linear_attn";
    let (a_log, shape) = tensor(ck, &format!("{a}.A_log"));
    assert_eq!(shape, [4]);
    for (got, ssm_a) in a_log.iter().zip(written(&all, "blk.0.ssm_a")) {
        assert_eq!(*got, (-ssm_a).ln());
        assert!(((-got.exp() - ssm_a) / ssm_a).abs() < 1e-6);
    }
    assert_eq!(
        tensor(ck, &format!("{a}.dt_bias")).0,
        written(&all, "blk.0.ssm_dt.bias")
    );
    let (conv, shape) = tensor(ck, &format!("{a}.conv1d.weight"));
    assert_eq!(shape, [96, 1, 4]);
    assert_eq!(conv, written(&all, "blk.0.ssm_conv1d.weight"));
    // The gated norm is kept; every other norm was stored as 1 + w.
    assert_eq!(
        tensor(ck, &format!("{a}.norm.weight")).0,
        written(&all, "blk.0.ssm_norm.weight")
    );
    let (norm, _) = tensor(ck, "model.layers.0.post_attention_layernorm.weight");
    let stored = written(&all, "blk.0.post_attention_norm.weight");
    assert!(norm.iter().zip(stored).all(|(w, s)| w + 1.0 == *s));
    let (q_norm, _) = tensor(ck, "model.layers.3.self_attn.q_norm.weight");
    let stored = written(&all, "blk.3.attn_q_norm.weight");
    assert!(q_norm.iter().zip(stored).all(|(w, s)| w + 1.0 == *s));
    for (ours, theirs) in [
        ("in_proj_qkv", "attn_qkv"),
        ("in_proj_z", "attn_gate"),
        ("in_proj_b", "ssm_beta"),
        ("in_proj_a", "ssm_alpha"),
        ("out_proj", "ssm_out"),
    ] {
        let got = tensor(ck, &format!("{a}.{ours}.weight")).0;
        assert_eq!(
            got,
            written(&all, &format!("blk.0.{theirs}.weight")),
            "{ours}"
        );
    }
    assert_eq!(
        tensor(ck, "model.layers.3.self_attn.q_proj.weight").1,
        [128, 64]
    );
}

#[test]
fn qwen3next_splits_ssm_ba_into_b_and_a_per_key_head() {
    let (_dir, _, model, all) = convert("qwen3next", true);
    let c = model.config();
    assert_eq!(c.architecture.model_type(), "qwen3_next");
    let net = c.layers[1].linear.unwrap();
    // Its family stores the projections fused; the file has them apart, grouped by key head.
    assert!(!net.fused_projections && !net.tiled_value_heads);
    let ba = written(&all, "blk.1.ssm_ba.weight");
    let row = |r: usize| &ba[r * HIDDEN as usize..(r + 1) * HIDDEN as usize];
    let a = "model.layers.1.linear_attn";
    let (b_rows, shape) = tensor(&model.checkpoint, &format!("{a}.in_proj_b.weight"));
    assert_eq!(shape, [4, 64]);
    let (a_rows, _) = tensor(&model.checkpoint, &format!("{a}.in_proj_a.weight"));
    // Per key head (2), its two value heads' b rows, then their a rows.
    let want_b: Vec<f32> = [0, 1, 4, 5].iter().flat_map(|&r| row(r).to_vec()).collect();
    let want_a: Vec<f32> = [2, 3, 6, 7].iter().flat_map(|&r| row(r).to_vec()).collect();
    assert_eq!(b_rows, want_b);
    assert_eq!(a_rows, want_a);
    let moe = c.feed_forward[0].routed().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate_size),
        (4, 2, 32)
    );
    assert_eq!(moe.shared_expert_intermediate_size, Some(32));
    assert_eq!(
        moe.routing,
        mlxcel_model::Routing::SoftmaxTopK { renormalize: true }
    );
}

#[test]
fn qwen35moe_routes_every_layer_beside_a_shared_expert() {
    let (dir, _, model, _) = convert("qwen35moe", true);
    let c = model.config();
    assert_eq!(c.architecture.model_type(), "qwen3_5_moe");
    assert!(c.feed_forward.iter().all(|f| f.routed().is_some()));
    assert!(c.layers[0].linear.unwrap().tiled_value_heads);
    let config = std::fs::read_to_string(dir.path().join("out/config.json")).unwrap();
    assert!(config.contains("\"linear_value_head_order\": \"tiled\""));
    assert!(!config.contains("decoder_sparse_step"), "{config}");
}

#[test]
fn a_hybrid_file_without_its_ssm_keys_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qwen35.gguf");
    write_hybrid("qwen35", false, &gguf);
    // Drop one key by rewriting the file without it.
    let file = mlxcel_model::gguf::GgufFile::open(&gguf).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &file.metadata {
        if k != "qwen35.ssm.group_count" {
            w.metadata(k, v.clone());
        }
    }
    for info in &file.tensors {
        w.tensor(
            &info.name,
            &info.dims,
            info.ggml_type,
            file.tensor_data(info).unwrap().to_vec(),
        );
    }
    let stripped = dir.path().join("stripped.gguf");
    w.write(&mut std::fs::File::create(&stripped).unwrap())
        .unwrap();
    let err = convert_gguf(&stripped, &dir.path().join("out")).unwrap_err();
    assert!(err.to_string().contains("qwen35.ssm.group_count"), "{err}");
}
