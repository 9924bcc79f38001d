use std::path::{Path, PathBuf};

use serde_json::json;

use super::types::{LoraAdapter, LoraTarget};
use crate::config::ModelConfig;
use crate::gguf::permute::permute_rows;
use crate::gguf::{GgmlType, GgufValue, GgufWriter};

/// A llama of 2 layers: hidden 8, 2 heads of 4 (1 kv head), intermediate 12.
fn config() -> ModelConfig {
    let value = json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 12,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "vocab_size": 32
    });
    ModelConfig::from_json(Path::new("/ckpt/config.json"), &value.to_string()).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxcel-lora-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ramp(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| seed + i as f32 * 0.25).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A GGUF adapter with `pairs` of (gguf base name, rank, out, in), values ramps; the b rows
/// stored as `b_rows` gives them (llama.cpp's permuted order for q and k).
fn write_gguf(path: &Path, arch: &str, alpha: f32, pairs: &[(&str, usize, usize, usize)]) {
    let mut w = GgufWriter::new();
    w.metadata("general.type", GgufValue::String("adapter".into()))
        .metadata("general.architecture", GgufValue::String(arch.into()))
        .metadata("adapter.type", GgufValue::String("lora".into()))
        .metadata("adapter.lora.alpha", GgufValue::F32(alpha))
        .metadata(
            "adapter.lora.task_name",
            GgufValue::String("summary".into()),
        );
    for &(base, rank, out, inp) in pairs {
        let a = ramp(rank * inp, 0.5);
        let mut b = bytes(&ramp(out * rank, -1.0));
        if base.contains("attn_q") || base.contains("attn_k") {
            b = permute_rows(&b, out, 4);
        }
        w.tensor(
            &format!("{base}.lora_a"),
            &[inp as u64, rank as u64],
            GgmlType::F32,
            bytes(&a),
        );
        w.tensor(
            &format!("{base}.lora_b"),
            &[rank as u64, out as u64],
            GgmlType::F32,
            b,
        );
    }
    let mut out = Vec::new();
    w.write(&mut out).unwrap();
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_gguf_adapter_reads_its_pairs_alpha_and_unpermutes_q_and_k() {
    let path = dir("gguf").join("a.gguf");
    write_gguf(
        &path,
        "llama",
        32.0,
        &[
            ("blk.1.attn_q.weight", 4, 8, 8),
            ("blk.0.attn_k.weight", 4, 4, 8),
            ("blk.0.ffn_down.weight", 2, 8, 12),
        ],
    );
    let adapter = LoraAdapter::open(&path, &config()).unwrap();
    assert_eq!(adapter.alpha, 32.0);
    assert_eq!(adapter.task_name, "summary");
    let keys: Vec<_> = adapter
        .weights
        .iter()
        .map(|w| (w.layer, w.target, w.rank))
        .collect();
    assert_eq!(
        keys,
        [
            (0, LoraTarget::K, 4),
            (0, LoraTarget::Down, 2),
            (1, LoraTarget::Q, 4)
        ]
    );
    // Stored permuted, read back in Hugging Face order: the ramp again.
    assert_eq!(adapter.weights[2].b, ramp(8 * 4, -1.0));
    assert_eq!(adapter.weights[0].b, ramp(4 * 4, -1.0));
    assert_eq!(adapter.weights[1].a, ramp(2 * 12, 0.5));
    // llama.cpp's scale: user scale · alpha / rank.
    assert_eq!(
        adapter.weight_scale(&adapter.weights[1], 0.5),
        0.5 * 32.0 / 2.0
    );
}

#[test]
fn a_gguf_adapter_of_another_architecture_or_shape_is_refused_by_name() {
    let d = dir("refuse");
    let other = d.join("qwen.gguf");
    write_gguf(&other, "qwen2", 8.0, &[("blk.0.attn_q.weight", 4, 8, 8)]);
    let e = LoraAdapter::open(&other, &config())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`qwen2`") && e.contains("`llama`"), "{e}");

    let wide = d.join("wide.gguf");
    write_gguf(&wide, "llama", 8.0, &[("blk.0.attn_v.weight", 4, 8, 8)]);
    let e = LoraAdapter::open(&wide, &config()).unwrap_err().to_string();
    assert!(
        e.contains("blk.0.attn_v.weight") && e.contains("[4, 8]"),
        "{e}"
    );

    let deep = d.join("deep.gguf");
    write_gguf(&deep, "llama", 8.0, &[("blk.5.attn_q.weight", 4, 8, 8)]);
    let e = LoraAdapter::open(&deep, &config()).unwrap_err().to_string();
    assert!(
        e.contains("blk.5.attn_q.weight") && e.contains("2 layers"),
        "{e}"
    );

    let head = d.join("head.gguf");
    write_gguf(&head, "llama", 8.0, &[("output.weight", 4, 32, 8)]);
    let e = LoraAdapter::open(&head, &config()).unwrap_err().to_string();
    assert!(e.contains("`output.weight`"), "{e}");
}

fn write_peft(dir: &Path, config: serde_json::Value, tensors: &[(&str, Vec<usize>)]) {
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            (name.to_string(), bytes(&ramp(n, 0.125)), shape.clone())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .iter()
        .map(|(name, b, shape)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    let out = safetensors::tensor::serialize(views, None).unwrap();
    std::fs::write(dir.join("adapter_model.safetensors"), out).unwrap();
}

#[test]
fn a_peft_adapter_reads_lora_alpha_and_its_pairs() {
    let d = dir("peft");
    let p = "base_model.model.model.layers";
    write_peft(
        &d,
        json!({"peft_type": "LORA", "r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "up_proj"]}),
        &[
            (&format!("{p}.0.self_attn.q_proj.lora_A.weight"), vec![4, 8]),
            (&format!("{p}.0.self_attn.q_proj.lora_B.weight"), vec![8, 4]),
            (&format!("{p}.1.mlp.up_proj.lora_A.weight"), vec![4, 8]),
            (&format!("{p}.1.mlp.up_proj.lora_B.weight"), vec![12, 4]),
        ],
    );
    let adapter = LoraAdapter::open(&d, &config()).unwrap();
    assert_eq!(adapter.alpha, 16.0);
    let keys: Vec<_> = adapter
        .weights
        .iter()
        .map(|w| (w.layer, w.target))
        .collect();
    assert_eq!(keys, [(0, LoraTarget::Q), (1, LoraTarget::Up)]);
    assert_eq!(adapter.weights[1].b, ramp(12 * 4, 0.125));
    // The safetensors file itself, with the config beside it, is the same adapter.
    let file = LoraAdapter::open(&d.join("adapter_model.safetensors"), &config()).unwrap();
    assert_eq!(file.weights, adapter.weights);
}

#[test]
fn a_peft_adapter_with_options_that_change_the_arithmetic_is_refused() {
    let d = dir("peft-refuse");
    let p = "base_model.model.model.layers";
    let pair = [
        (format!("{p}.0.self_attn.q_proj.lora_A.weight"), vec![4, 8]),
        (format!("{p}.0.self_attn.q_proj.lora_B.weight"), vec![8, 4]),
    ];
    let pair: Vec<(&str, Vec<usize>)> = pair.iter().map(|(n, s)| (n.as_str(), s.clone())).collect();
    write_peft(
        &d,
        json!({"r": 4, "lora_alpha": 8, "use_dora": true}),
        &pair,
    );
    let e = LoraAdapter::open(&d, &config()).unwrap_err().to_string();
    assert!(e.contains("use_dora"), "{e}");
    write_peft(
        &d,
        json!({"r": 4, "lora_alpha": 8}),
        &[(&format!("{p}.0.self_attn.q_proj.lora_A.weight"), vec![4, 8])],
    );
    let e = LoraAdapter::open(&d, &config()).unwrap_err().to_string();
    assert!(e.contains("lora_B is missing"), "{e}");
    write_peft(
        &d,
        json!({"r": 4, "lora_alpha": 8}),
        &[(&format!("{p}.0.self_attn.rotary.lora_A.weight"), vec![4, 8])],
    );
    let e = LoraAdapter::open(&d, &config()).unwrap_err().to_string();
    assert!(e.contains("self_attn.rotary.lora_A.weight"), "{e}");
}
