//! LFM2 and LFM2-MoE: their config.json as Liquid AI writes it (its own spellings, read into
//! mlxcel's keys), which layers are short convolutions, the MLP size LFM2 derives, the sigmoid
//! routing of LFM2-MoE, and the keys refused by name.

use std::path::Path;

use mlxcel_model::{FeedForward, ModelConfig, ModelError, Routing, ShortConv};
use serde_json::{Value, json};

fn parse(value: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(Path::new("/ckpt/config.json"), &value.to_string())
}

/// LiquidAI/LFM2-350M's config.json (its keys as released).
fn lfm2_350m() -> Value {
    let layer_types: Vec<&str> = [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0]
        .iter()
        .map(|&a| if a == 1 { "full_attention" } else { "conv" })
        .collect();
    json!({
        "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": true,
        "block_dim": 1024, "block_ff_dim": 6656, "block_ffn_dim_multiplier": 1.0,
        "block_mlp_init_scale": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-5,
        "block_out_init_scale": 1.0, "block_use_swiglu": true, "block_use_xavier_init": true,
        "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": false, "conv_dim": 1024,
        "conv_dim_out": 1024, "conv_use_xavier_init": true, "eos_token_id": 7,
        "hidden_size": 1024, "initializer_range": 0.02, "layer_types": layer_types,
        "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-5,
        "num_attention_heads": 16, "num_heads": 16, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pad_token_id": 0, "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16", "use_cache": true, "use_pos_enc": true, "vocab_size": 65536
    })
}

fn conv_layers(c: &ModelConfig) -> Vec<usize> {
    (0..c.num_hidden_layers)
        .filter(|&i| c.layers[i].conv.is_some())
        .collect()
}

#[test]
fn lfm2_350m_reads_its_own_keys() {
    let c = parse(&lfm2_350m()).unwrap();
    assert_eq!(conv_layers(&c), [0, 1, 3, 4, 6, 7, 9, 11, 13, 15]);
    assert_eq!(c.layers[0].conv, Some(ShortConv { kernel: 3 }));
    assert!(c.layers[2].conv.is_none() && c.layers[2].rope);
    // int(2 * 6656 / 3) = 4437, rounded up to 256: 4608 (the released MLP's size).
    assert_eq!(c.intermediate_size, 4608);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings && c.qk_norm);
    assert_eq!((c.head_dim, c.num_key_value_heads), (64, 8));
    assert_eq!(c.rope_theta, 1_000_000.0);
}

#[test]
fn full_attn_idxs_place_the_attention_layers() {
    let mut v = lfm2_350m();
    v.as_object_mut().unwrap().remove("layer_types");
    v["full_attn_idxs"] = json!([2, 5, 8, 10, 12, 14]);
    let c = parse(&v).unwrap();
    assert_eq!(conv_layers(&c), [0, 1, 3, 4, 6, 7, 9, 11, 13, 15]);
    // Both keys, agreeing, are read; disagreeing, refused by name.
    v["layer_types"] = lfm2_350m()["layer_types"].clone();
    assert!(parse(&v).is_ok());
    v["full_attn_idxs"] = json!([2]);
    let e = parse(&v).unwrap_err().to_string();
    assert!(
        e.contains("full_attn_idxs") && e.contains("layer_types"),
        "{e}"
    );
    v["full_attn_idxs"] = json!([16]);
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("full_attn_idxs")
    );
    // Neither key: every layer attention, as transformers builds it.
    let mut v = lfm2_350m();
    v.as_object_mut().unwrap().remove("layer_types");
    assert!(conv_layers(&parse(&v).unwrap()).is_empty());
}

#[test]
fn the_mlp_size_follows_transformers_and_mlx_lm() {
    let size = |f: &dyn Fn(&mut Value)| {
        let mut v = lfm2_350m();
        f(&mut v);
        parse(&v).map(|c| c.intermediate_size)
    };
    assert_eq!(
        size(&|v| v["block_auto_adjust_ff_dim"] = json!(false)).unwrap(),
        6656
    );
    assert_eq!(
        size(&|v| v["block_ffn_dim_multiplier"] = json!(1.5)).unwrap(),
        6656
    );
    // Without block_ff_dim, intermediate_size is the one adjusted.
    assert_eq!(
        size(&|v| {
            v.as_object_mut().unwrap().remove("block_ff_dim");
            v["intermediate_size"] = json!(3072);
        })
        .unwrap(),
        2048
    );
    // A null multiplier: transformers does not round, mlx-lm does; refused unless they agree.
    let e = size(&|v| v["block_ffn_dim_multiplier"] = Value::Null).unwrap_err();
    assert!(e.to_string().contains("block_ffn_dim_multiplier"), "{e}");
    assert_eq!(
        size(&|v| {
            v["block_ffn_dim_multiplier"] = Value::Null;
            v["block_ff_dim"] = json!(768);
        })
        .unwrap(),
        512
    );
}

#[test]
fn what_lfm2_cannot_honour_is_refused_by_name() {
    for (key, value) in [
        ("conv_bias", json!(true)),
        ("block_dim", json!(512)),
        ("conv_dim", json!(512)),
        ("conv_dim_out", json!(512)),
        ("block_use_swiglu", json!(false)),
        ("use_pos_enc", json!(false)),
        ("attention_bias", json!(true)),
        ("head_dim", json!(128)),
        ("num_heads", json!(8)),
        ("block_norm_eps", json!(1e-6)),
        ("rms_norm_eps", json!(1e-6)),
        ("tie_word_embeddings", json!(false)),
        ("conv_L_cache", json!(0)),
        ("conv_L_cache", json!(65)),
    ] {
        let mut v = lfm2_350m();
        if key == "tie_word_embeddings" {
            v["tie_embedding"] = json!(true);
        }
        v[key] = value;
        let e = parse(&v).expect_err(key).to_string();
        let named = if key == "tie_word_embeddings" {
            "tie_embedding"
        } else {
            key
        };
        assert!(e.contains(named), "{key}: {e}");
    }
    let mut v = lfm2_350m();
    v["layer_types"][0] = json!("sliding_attention");
    assert!(parse(&v).unwrap_err().to_string().contains("layer_types"));
}

#[test]
fn lfm2_moe_routes_past_its_dense_layers_by_sigmoid() {
    let v = json!({
        "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "num_dense_layers": 1,
        "norm_topk_prob": true, "use_expert_bias": true, "routed_scaling_factor": 1.0,
        "full_attn_idxs": [1, 3], "norm_eps": 1e-5, "conv_L_cache": 3, "conv_bias": false,
        "vocab_size": 384
    });
    let c = parse(&v).unwrap();
    assert_eq!(conv_layers(&c), [0, 2]);
    assert!(matches!(
        c.feed_forward[0],
        FeedForward::Dense {
            intermediate_size: 96,
            ..
        }
    ));
    let moe = c.feed_forward[1].routed().copied().unwrap();
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
    assert!(moe.shared_expert_intermediate_size.is_none());
    let mut scaled = v.clone();
    scaled["routed_scaling_factor"] = json!(2.5);
    assert!(
        parse(&scaled)
            .unwrap_err()
            .to_string()
            .contains("routed_scaling_factor")
    );
    // transformers' defaults of the expert keys: 32 experts, 4 per token, 1792 wide, 2 dense.
    let c = parse(&json!({"architectures": ["Lfm2MoeForCausalLM"]})).unwrap();
    assert!(c.feed_forward[1].routed().is_none());
    let moe = c.feed_forward[2].routed().copied().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate_size),
        (32, 4, 1792)
    );
}
