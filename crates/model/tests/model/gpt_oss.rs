//! gpt-oss: its config.json (OpenAI's as released, and transformers' defaults for what it leaves
//! out), the refusals, mlx-lm's checkpoint layout read as per-expert views with their biases,
//! Hugging Face's fused expert layout refused by name, and llama.cpp's tensor names.

use std::collections::BTreeMap;
use std::path::Path;

use mlxcel_model::gguf::hf_name_in;
use mlxcel_model::{
    Architecture, Checkpoint, HiddenActivation, ModelConfig, ModelError, RopeScaling,
    RoutedExperts, Routing,
};
use safetensors::Dtype as StDtype;
use serde_json::{Value, json};

use super::checkpoint::{T, f32s, write_dir};

fn parse(value: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(Path::new("/ckpt/config.json"), &value.to_string())
}

/// openai/gpt-oss-20b's config.json, less `quantization_config` (its MXFP4 tensors are
/// Hugging Face's fused layout, which the checkpoint test below refuses).
fn gpt_oss_20b() -> Value {
    let layer_types: Vec<&str> = (0..24)
        .map(|i| {
            if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    json!({
        "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": 2880, "layer_types": layer_types,
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
        "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
        "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": false},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": false, "use_cache": true,
        "vocab_size": 201088
    })
}

fn gpt_oss_experts(limit: f32) -> RoutedExperts {
    RoutedExperts {
        num_experts: 32,
        top_k: 4,
        expert_intermediate_size: 2880,
        activation: HiddenActivation::ClampedSwiglu {
            alpha: 1.702,
            limit,
        },
        routing: Routing::TopKSoftmax,
        biases: true,
        shared_expert_intermediate_size: None,
        parallel_dense: None,
    }
}

#[test]
fn gpt_oss_20b_reads_every_feature() {
    let c = parse(&gpt_oss_20b()).unwrap();
    assert_eq!(c.architecture.model_type(), "gpt_oss");
    assert!(c.attention_sinks && c.attention_qkv_bias && c.attention_out_bias);
    assert_eq!((c.head_dim, c.num_key_value_heads), (64, 8));
    let windows: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows[..4], [Some(128), None, Some(128), None]);
    assert!(c.layers.iter().all(|l| l.rope));
    let Some(RopeScaling::Yarn(yarn)) = c.rope_scaling else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(
        (
            yarn.factor,
            yarn.original_max_position_embeddings,
            yarn.truncate
        ),
        (32.0, 4096, false)
    );
    // m(32, 1) = 0.1·ln 32 + 1.
    assert!((c.rope_attention_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
    for layer in 0..24 {
        assert_eq!(
            c.layer_spec(layer).ffn.routed(),
            Some(&gpt_oss_experts(7.0)),
            "layer {layer}"
        );
    }
    let line = c.describe();
    assert!(
        line.contains("attention sinks") && line.contains("clamped SwiGLU"),
        "{line}"
    );
    // 20.9B weights, as OpenAI's model card counts them (biases and sinks aside); 4.2B read per
    // token counting the embedding table, which the card's 3.6B active leaves out (a lookup).
    assert_eq!(c.parameter_count() / 100_000_000, 209);
    assert_eq!(c.active_parameter_count() / 100_000_000, 41);
}

#[test]
fn missing_keys_take_transformers_defaults() {
    let v = json!({
        "architectures": ["GptOssForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 128,
        "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 131072,
        "vocab_size": 100
    });
    let c = parse(&v).unwrap();
    // head_dim 64 (not hidden / heads = 32), rope_theta 150000, eps 1e-5, biases on.
    assert_eq!(c.head_dim, 64);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (150_000.0, 1e-5));
    assert!(c.attention_qkv_bias && c.attention_out_bias && !c.tie_word_embeddings);
    // Layer types alternate from a sliding first layer with the window of 128.
    let windows: Vec<Option<usize>> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(128), None, Some(128), None]);
    // transformers' default YaRN (factor 32 over 4096 positions, not truncated).
    let Some(RopeScaling::Yarn(yarn)) = c.rope_scaling else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(
        (
            yarn.factor,
            yarn.original_max_position_embeddings,
            yarn.truncate
        ),
        (32.0, 4096, false)
    );
    let moe = c.layer_spec(0).ffn.routed().copied().unwrap();
    assert_eq!(
        moe.activation,
        HiddenActivation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    // An explicit null is no scaling; `experts_per_token` alone gives the experts per token;
    // `swiglu_limit` sets the clamp.
    let mut v = v;
    v["rope_scaling"] = Value::Null;
    v.as_object_mut().unwrap().remove("num_experts_per_tok");
    v["experts_per_token"] = json!(3);
    v["swiglu_limit"] = json!(5.5);
    v["layer_types"] = json!(vec!["full_attention"; 4]);
    let c = parse(&v).unwrap();
    assert_eq!(c.rope_scaling, None);
    assert!(c.layers.iter().all(|l| l.window.is_none()));
    let moe = c.layer_spec(3).ffn.routed().copied().unwrap();
    assert_eq!(moe.top_k, 3);
    assert_eq!(
        moe.activation,
        HiddenActivation::ClampedSwiglu {
            alpha: 1.702,
            limit: 5.5
        }
    );
}

#[test]
fn bad_gpt_oss_keys_are_refused_naming_them() {
    for (key, value, expect) in [
        ("swiglu_limit", json!(0.0), "not a positive number"),
        (
            "experts_per_token",
            json!(2),
            "contradicts num_experts_per_tok 4",
        ),
        ("hidden_act", json!("gelu"), "clamped SwiGLU"),
        ("num_local_experts", Value::Null, "num_local_experts"),
    ] {
        let mut v = gpt_oss_20b();
        if value.is_null() {
            v.as_object_mut().unwrap().remove(key);
        } else {
            v[key] = value;
        }
        let message = parse(&v).unwrap_err().to_string();
        assert!(
            message.contains(key) && message.contains(expect),
            "{key}: {message}"
        );
    }
}

const EXPERTS: usize = 4;
const HIDDEN: usize = 64;
const FFN: usize = 32;

fn tiny() -> Value {
    json!({
        "architectures": ["GptOssForCausalLM"], "hidden_size": HIDDEN, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": FFN, "num_local_experts": EXPERTS, "num_experts_per_tok": 2,
        "sliding_window": 8, "max_position_embeddings": 512, "vocab_size": 40
    })
}

/// A tensor of `shape` whose f32 values are `seed`, `seed + 1`, ... (so that a view of the
/// wrong expert, or a bias taken from the wrong place, reads other numbers).
fn counting(shape: &[usize], seed: f32) -> T {
    let n: usize = shape.iter().product();
    let bytes = (0..n)
        .flat_map(|i| (seed + i as f32).to_le_bytes())
        .collect();
    T(StDtype::F32, shape.to_vec(), bytes)
}

/// The tiny model as mlx-lm's gpt_oss saves it: `mlp.router`, the experts stacked under
/// `mlp.experts.{gate,up,down}_proj` with their biases, the sinks.
fn mlx_lm_layout() -> BTreeMap<String, T> {
    let mut t = BTreeMap::new();
    t.insert("model.embed_tokens.weight".into(), f32s(&[40, HIDDEN]));
    t.insert("model.norm.weight".into(), f32s(&[HIDDEN]));
    t.insert("lm_head.weight".into(), f32s(&[40, HIDDEN]));
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            t.insert(format!("{p}.{norm}.weight"), f32s(&[HIDDEN]));
        }
        for (m, out, inp) in [
            ("q_proj", 64, HIDDEN),
            ("k_proj", 32, HIDDEN),
            ("v_proj", 32, HIDDEN),
            ("o_proj", HIDDEN, 64),
        ] {
            t.insert(format!("{p}.self_attn.{m}.weight"), f32s(&[out, inp]));
            t.insert(format!("{p}.self_attn.{m}.bias"), f32s(&[out]));
        }
        t.insert(format!("{p}.self_attn.sinks"), f32s(&[4]));
        t.insert(format!("{p}.mlp.router.weight"), f32s(&[EXPERTS, HIDDEN]));
        t.insert(format!("{p}.mlp.router.bias"), counting(&[EXPERTS], 0.0));
        for (m, out, inp) in [
            ("gate_proj", FFN, HIDDEN),
            ("up_proj", FFN, HIDDEN),
            ("down_proj", HIDDEN, FFN),
        ] {
            t.insert(
                format!("{p}.mlp.experts.{m}.weight"),
                counting(&[EXPERTS, out, inp], 1000.0),
            );
            t.insert(
                format!("{p}.mlp.experts.{m}.bias"),
                counting(&[EXPERTS, out], 10.0),
            );
        }
    }
    t
}

fn open(tensors: &BTreeMap<String, T>) -> Result<Checkpoint, ModelError> {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), &tiny(), tensors, 1);
    Checkpoint::open(dir.path())
}

fn f32_values(ckpt: &Checkpoint, name: &str) -> Vec<f32> {
    let view = ckpt
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    view.data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn mlx_lm_layout_reads_as_per_expert_views_with_biases() {
    let ckpt = open(&mlx_lm_layout()).unwrap();
    let p = "model.layers.1.mlp";
    assert_eq!(
        f32_values(&ckpt, &format!("{p}.gate.bias")),
        [0.0, 1.0, 2.0, 3.0]
    );
    // Expert 2's up bias is the third row of the stacked `[4, 32]` bias.
    let bias = f32_values(&ckpt, &format!("{p}.experts.2.up_proj.bias"));
    assert_eq!((bias.len(), bias[0]), (FFN, 10.0 + 2.0 * FFN as f32));
    let down = ckpt
        .tensor(&format!("{p}.experts.3.down_proj.weight"))
        .unwrap();
    assert_eq!(down.shape, [HIDDEN, FFN]);
    assert_eq!(
        f32_values(&ckpt, &format!("{p}.experts.3.down_proj.weight"))[0],
        1000.0 + 3.0 * (HIDDEN * FFN) as f32
    );
    assert!(ckpt.tensor("model.layers.0.self_attn.sinks").is_some());
}

#[test]
fn a_missing_expert_bias_or_sink_is_named() {
    for missing in [
        "model.layers.0.mlp.experts.down_proj.bias",
        "model.layers.1.mlp.router.bias",
        "model.layers.0.self_attn.sinks",
    ] {
        let mut t = mlx_lm_layout();
        t.remove(missing);
        let message = open(&t).unwrap_err().to_string();
        let named = match missing {
            "model.layers.0.mlp.experts.down_proj.bias" => {
                "model.layers.0.mlp.experts.0.down_proj.bias"
            }
            "model.layers.1.mlp.router.bias" => "model.layers.1.mlp.gate.bias",
            other => other,
        };
        assert!(message.contains(named), "{missing}: {message}");
    }
}

#[test]
fn hugging_face_fused_experts_are_refused_by_name() {
    let mut t = mlx_lm_layout();
    for m in ["gate_proj", "up_proj"] {
        for s in ["weight", "bias"] {
            t.remove(&format!("model.layers.0.mlp.experts.{m}.{s}"));
        }
    }
    t.insert(
        "model.layers.0.mlp.experts.gate_up_proj".into(),
        f32s(&[EXPERTS, HIDDEN, 2 * FFN]),
    );
    let message = open(&t).unwrap_err().to_string();
    assert!(
        message.contains("model.layers.0.mlp.experts.gate_up_proj")
            && message.contains("mlx_lm.convert"),
        "{message}"
    );
}

#[test]
fn llama_cpp_tensor_names_map_to_hugging_face_names() {
    let arch = Architecture::from_gguf_name("gpt-oss").unwrap();
    assert_eq!(arch.model_type(), "gpt_oss");
    let name = |n: &str| hf_name_in(arch, n).map(|(m, s)| format!("{m}.{s}"));
    for (gguf, hf) in [
        ("blk.3.attn_sinks.weight", "model.layers.3.self_attn.sinks"),
        (
            "blk.3.post_attention_norm.weight",
            "model.layers.3.post_attention_layernorm.weight",
        ),
        (
            "blk.3.attn_output.bias",
            "model.layers.3.self_attn.o_proj.bias",
        ),
        ("blk.3.ffn_gate_inp.bias", "model.layers.3.mlp.gate.bias"),
        (
            "blk.3.ffn_gate_exps.bias",
            "model.layers.3.mlp.switch_mlp.gate_proj.bias",
        ),
        (
            "blk.3.ffn_down_exps.weight",
            "model.layers.3.mlp.switch_mlp.down_proj.weight",
        ),
    ] {
        assert_eq!(name(gguf).as_deref(), Some(hf), "{gguf}");
    }
    // gpt-oss has no `ffn_norm`: one in a file is not silently taken for another norm.
    assert_eq!(name("blk.0.ffn_norm.weight"), None);
}
