//! config.json of each supported architecture, MLX quantization metadata, and the errors that name
//! the file and field.

use std::path::Path;

use mlxcel_model::{
    FeedForward, HiddenActivation, ModelConfig, ModelError, PerLayerInput, QuantSpec, RopeScaling,
    RoutedExperts, Routing,
};
use serde_json::{Value, json};

fn parse(value: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(Path::new("/ckpt/config.json"), &value.to_string())
}

fn smollm2() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "vocab_size": 49152, "tie_word_embeddings": true, "eos_token_id": 2, "bos_token_id": 1
    })
}

#[test]
fn smollm2_llama() {
    let c = parse(&smollm2()).unwrap();
    assert_eq!(c.architecture.model_type(), "llama");
    assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (64, 576, 192));
    assert_eq!(c.window(), 8192);
    assert!(c.tie_word_embeddings && !c.attention_qkv_bias);
    assert_eq!(c.eos_token_ids, [2]);
    assert_eq!(c.quantization, None);
}

#[test]
fn llama3_with_rope_scaling_and_eos_list() {
    let c = parse(&json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "vocab_size": 128256, "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    }))
    .unwrap();
    assert_eq!(c.head_dim, 128);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.eos_token_ids, [128001, 128008, 128009]);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        })
    );
}

#[test]
fn mistral_slides_every_layer_when_it_has_a_window() {
    let mut v = smollm2();
    v["architectures"] = json!(["MistralForCausalLM"]);
    v["sliding_window"] = Value::Null;
    let c = parse(&v).unwrap();
    assert_eq!(c.architecture.model_type(), "mistral");
    assert_eq!(c.sliding_window(), None);
    v["sliding_window"] = json!(4096);
    let c = parse(&v).unwrap();
    assert!(c.layers.iter().all(|l| l.rope && l.window == Some(4096)));
    assert!(
        c.describe()
            .contains("sliding window 4096 on 30 of 30 layers")
    );
    v["sliding_window"] = json!(0);
    let message = parse(&v).unwrap_err().to_string();
    assert!(
        message.contains("sliding_window") && message.contains("/ckpt/config.json"),
        "{message}"
    );
}

#[test]
fn qwen2_slides_from_max_window_layers_when_asked() {
    let mut v = smollm2();
    v["architectures"] = json!(["Qwen2ForCausalLM"]);
    v["num_hidden_layers"] = json!(4);
    v["sliding_window"] = json!(64);
    v["max_window_layers"] = json!(2);
    v["use_sliding_window"] = json!(false);
    assert_eq!(parse(&v).unwrap().sliding_window(), None);
    v["use_sliding_window"] = json!(true);
    let windows: Vec<_> = parse(&v).unwrap().layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [None, None, Some(64), Some(64)]);
    // `layer_types`, when present, decides.
    v["layer_types"] = json!([
        "sliding_attention",
        "full_attention",
        "full_attention",
        "sliding_attention"
    ]);
    let windows: Vec<_> = parse(&v).unwrap().layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(64), None, None, Some(64)]);
    v["layer_types"] = json!(["full_attention"]);
    let message = parse(&v).unwrap_err().to_string();
    assert!(
        message.contains("layer_types") && message.contains("lists 1 layers"),
        "{message}"
    );
}

#[test]
fn qwen3_has_qk_norms_and_no_biases() {
    let mut v = smollm2();
    v["architectures"] = json!(["Qwen3ForCausalLM"]);
    v["head_dim"] = json!(128);
    let c = parse(&v).unwrap();
    assert_eq!(c.architecture.model_type(), "qwen3");
    assert!(c.qk_norm && !c.attention_qkv_bias);
    assert_eq!(c.q_dim(), 9 * 128);
    assert_eq!(
        c.describe(),
        "qwen3: 30 layers, q/k norm, grouped-query attention (3 kv heads), tied embeddings"
    );
}

#[test]
fn smollm3_skips_rope_on_every_fourth_layer() {
    let mut v = smollm2();
    v["architectures"] = json!(["SmolLM3ForCausalLM"]);
    v["num_hidden_layers"] = json!(8);
    let rope: Vec<bool> = parse(&v).unwrap().layers.iter().map(|l| l.rope).collect();
    assert_eq!(rope, [true, true, true, false, true, true, true, false]);
    v["no_rope_layer_interval"] = json!(2);
    let rope: Vec<bool> = parse(&v).unwrap().layers.iter().map(|l| l.rope).collect();
    assert_eq!(rope, [true, false, true, false, true, false, true, false]);
    // An explicit list wins (1 = the layer uses RoPE).
    v["no_rope_layers"] = json!([1, 1, 0, 1, 1, 1, 1, 0]);
    let c = parse(&v).unwrap();
    let rope: Vec<bool> = c.layers.iter().map(|l| l.rope).collect();
    assert_eq!(rope, [true, true, false, true, true, true, true, false]);
    assert!(
        c.describe().contains("2 layers without RoPE"),
        "{}",
        c.describe()
    );
}

#[test]
fn mixture_of_experts_and_vision_configs_are_refused_naming_the_field() {
    for (field, value) in [
        ("num_experts", json!(8)),
        ("num_local_experts", json!(8)),
        ("vision_config", json!({"hidden_size": 1152})),
    ] {
        let mut v = smollm2();
        v[field] = value;
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(&format!("field `{field}`")), "{message}");
    }
}

fn qwen3_moe() -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960, "vocab_size": 151936,
        "tie_word_embeddings": false, "eos_token_id": 151645
    })
}

#[test]
fn qwen3_moe_layers_route_to_experts() {
    let c = parse(&qwen3_moe()).unwrap();
    assert_eq!(c.architecture.model_type(), "qwen3_moe");
    assert!(c.qk_norm);
    let moe = *c.layer_spec(0).ffn.routed().unwrap();
    assert_eq!(
        moe,
        RoutedExperts {
            num_experts: 128,
            top_k: 8,
            expert_intermediate_size: 768,
            activation: HiddenActivation::Silu,
            biases: false,
            routing: Routing::SoftmaxTopK { renormalize: true },
            shared_expert_intermediate_size: None,
            parallel_dense: None,
        }
    );
    // `mlp_only_layers` and `decoder_sparse_step` keep layers dense, as transformers reads them.
    let mut v = qwen3_moe();
    v["mlp_only_layers"] = json!([0]);
    v["decoder_sparse_step"] = json!(2);
    let c = parse(&v).unwrap();
    let routed: Vec<bool> = (0..4)
        .map(|i| c.layer_spec(i).ffn.routed().is_some())
        .collect();
    assert_eq!(routed, [false, true, false, true]);
    assert_eq!(
        c.layer_spec(0).ffn,
        FeedForward::Dense {
            intermediate_size: 6144,
            activation: HiddenActivation::Silu
        }
    );
}

#[test]
fn parameter_counts_match_the_published_sizes() {
    // SmolLM2-135M: 134,515,008 weights (tied embeddings), as its model card and
    // `sum(p.numel())` count them.
    assert_eq!(parse(&smollm2()).unwrap().parameter_count(), 134_515_008);
    // A Qwen3-30B-A3B layer count with its real shape: 30.5 B weights, 3.3 B active.
    let mut v = qwen3_moe();
    v["num_hidden_layers"] = json!(48);
    v["num_attention_heads"] = json!(32);
    v["num_key_value_heads"] = json!(4);
    let c = parse(&v).unwrap();
    let (total, active) = (c.parameter_count(), c.active_parameter_count());
    assert!((30_400_000_000..30_600_000_000).contains(&total), "{total}");
    assert!((3_300_000_000..3_400_000_000).contains(&active), "{active}");
}

#[test]
fn qwen3_moe_errors_name_the_expert_key() {
    for (field, value) in [
        ("num_experts_per_tok", Value::Null),
        ("num_experts_per_tok", json!(129)),
        ("moe_intermediate_size", json!(0)),
        ("num_experts", json!(100000)),
        ("decoder_sparse_step", json!(0)),
    ] {
        let mut v = qwen3_moe();
        if value.is_null() {
            v.as_object_mut().unwrap().remove(field);
        } else {
            v[field] = value;
        }
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(field), "{field}: {message}");
    }
}

fn mixtral() -> Value {
    json!({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
        "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
        "max_position_embeddings": 32768, "vocab_size": 32000, "sliding_window": null,
        "router_aux_loss_coef": 0.02, "eos_token_id": 2
    })
}

#[test]
fn mixtral_routes_every_layer_by_the_softmax_of_the_top_logits() {
    let c = parse(&mixtral()).unwrap();
    assert_eq!(c.architecture.model_type(), "mixtral");
    // transformers' MixtralConfig defaults.
    assert_eq!((c.rope_theta, c.rms_norm_eps), (1e6, 1e-5));
    assert!(!c.tie_word_embeddings && !c.attention_qkv_bias && !c.qk_norm);
    assert_eq!(c.sliding_window(), None);
    for layer in 0..2 {
        assert_eq!(
            c.layer_spec(layer).ffn,
            FeedForward::RoutedExperts(RoutedExperts {
                num_experts: 8,
                top_k: 2,
                expert_intermediate_size: 14336,
                activation: HiddenActivation::Silu,
                biases: false,
                routing: Routing::TopKSoftmax,
                shared_expert_intermediate_size: None,
                parallel_dense: None,
            })
        );
    }
    assert_eq!(
        c.describe(),
        "mixtral: 2 layers, grouped-query attention (8 kv heads), 8 experts, top-2 on 2 of 2 layers"
    );
    // A window slides every layer, as for Mistral.
    let mut v = mixtral();
    v["sliding_window"] = json!(4096);
    let c = parse(&v).unwrap();
    assert!(c.layers.iter().all(|l| l.window == Some(4096)));
    // `num_experts` is transformers' alias of the count: read when alone, refused when it
    // contradicts.
    let mut v = mixtral();
    v.as_object_mut().unwrap().remove("num_local_experts");
    v["num_experts"] = json!(4);
    assert_eq!(
        parse(&v)
            .unwrap()
            .layer_spec(0)
            .ffn
            .routed()
            .unwrap()
            .num_experts,
        4
    );
    v["num_local_experts"] = json!(8);
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("field `num_experts`"), "{message}");
    // Mixtral routes every layer: the Qwen keys that keep layers dense are refused, not ignored.
    for (field, value) in [
        ("mlp_only_layers", json!([0])),
        ("decoder_sparse_step", json!(2)),
        ("num_local_experts", Value::Null),
        ("num_experts_per_tok", json!(9)),
    ] {
        let mut v = mixtral();
        if value.is_null() {
            v.as_object_mut().unwrap().remove(field);
        } else {
            v[field] = value;
        }
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(field), "{field}: {message}");
    }
}

fn olmoe() -> Value {
    json!({
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
        "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
        "max_position_embeddings": 4096, "vocab_size": 50304, "clip_qkv": null,
        "rope_theta": 10000.0, "eos_token_id": 50279
    })
}

#[test]
fn olmoe_normalises_whole_q_and_k_and_routes_every_layer() {
    let c = parse(&olmoe()).unwrap();
    assert_eq!(c.architecture.model_type(), "olmoe");
    assert!(c.qk_norm && c.qk_norm_whole);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(!c.tie_word_embeddings && !c.attention_qkv_bias);
    let moe = *c.layer_spec(15).ffn.routed().unwrap();
    assert_eq!(
        moe,
        RoutedExperts {
            num_experts: 64,
            top_k: 8,
            // OLMoE's experts are `intermediate_size` wide.
            expert_intermediate_size: 1024,
            activation: HiddenActivation::Silu,
            biases: false,
            // transformers' OlmoeConfig: `norm_topk_prob` false unless set.
            routing: Routing::SoftmaxTopK { renormalize: false },
            shared_expert_intermediate_size: None,
            parallel_dense: None,
        }
    );
    assert!(c.describe().contains("whole q/k norm"), "{}", c.describe());
    let mut v = olmoe();
    v["norm_topk_prob"] = json!(true);
    v["attention_bias"] = json!(true);
    let c = parse(&v).unwrap();
    assert_eq!(
        c.layer_spec(0).ffn.routed().unwrap().routing,
        Routing::SoftmaxTopK { renormalize: true }
    );
    assert!(c.attention_qkv_bias && c.attention_out_bias);
    // `clip_qkv` is not implemented: refused by name, not ignored.
    let mut v = olmoe();
    v["clip_qkv"] = json!(8.0);
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("field `clip_qkv`"), "{message}");
}

fn qwen2_moe() -> Value {
    json!({
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
        "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
        "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": false,
        "sliding_window": 32768, "max_window_layers": 21, "rope_theta": 1000000.0,
        "max_position_embeddings": 8192, "vocab_size": 151936, "eos_token_id": 151643
    })
}

#[test]
fn qwen2_moe_has_a_gated_shared_expert_and_qkv_biases() {
    let c = parse(&qwen2_moe()).unwrap();
    assert_eq!(c.architecture.model_type(), "qwen2_moe");
    assert!(c.attention_qkv_bias && !c.attention_out_bias && !c.qk_norm);
    let moe = *c.layer_spec(0).ffn.routed().unwrap();
    assert_eq!(
        moe,
        RoutedExperts {
            num_experts: 60,
            top_k: 4,
            expert_intermediate_size: 1408,
            activation: HiddenActivation::Silu,
            biases: false,
            routing: Routing::SoftmaxTopK { renormalize: false },
            shared_expert_intermediate_size: Some(5632),
            parallel_dense: None,
        }
    );
    assert!(
        c.describe()
            .contains("60 experts, top-4 and a shared expert on 4 of 4 layers"),
        "{}",
        c.describe()
    );
    let mut v = qwen2_moe();
    v["qkv_bias"] = json!(false);
    v["norm_topk_prob"] = json!(true);
    v["mlp_only_layers"] = json!([3]);
    let c = parse(&v).unwrap();
    assert!(!c.attention_qkv_bias);
    assert_eq!(
        c.layer_spec(0).ffn.routed().unwrap().routing,
        Routing::SoftmaxTopK { renormalize: true }
    );
    assert_eq!(
        c.layer_spec(3).ffn,
        FeedForward::Dense {
            intermediate_size: 5632,
            activation: HiddenActivation::Silu
        }
    );
    for (field, value) in [
        ("shared_expert_intermediate_size", Value::Null),
        ("moe_intermediate_size", Value::Null),
        ("use_sliding_window", json!(true)),
    ] {
        let mut v = qwen2_moe();
        if value.is_null() {
            v.as_object_mut().unwrap().remove(field);
        } else {
            v[field] = value;
        }
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(field), "{field}: {message}");
    }
}

#[test]
fn an_expert_config_of_a_family_without_experts_names_the_moe_families() {
    let mut v = smollm2();
    v["num_experts"] = json!(8);
    let message = parse(&v).unwrap_err().to_string();
    for family in ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"] {
        assert!(message.contains(family), "{message}");
    }
    // DeepSeek's MoE is not a family mlxcel reads: refused by its name.
    let mut v = smollm2();
    v["architectures"] = json!(["DeepseekV3ForCausalLM"]);
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("DeepseekV3ForCausalLM"), "{message}");
}

#[test]
fn qwen2_has_qkv_biases() {
    let mut v = smollm2();
    v["architectures"] = json!(["Qwen2ForCausalLM"]);
    v["use_sliding_window"] = json!(false);
    v["sliding_window"] = json!(32768);
    let c = parse(&v).unwrap();
    assert_eq!(c.architecture.model_type(), "qwen2");
    assert!(c.attention_qkv_bias && !c.attention_out_bias);
}

#[test]
fn errors_name_the_file_and_field() {
    let cases: [(&str, Value, &str); 6] = [
        (
            "architectures",
            json!(["GPT2LMHeadModel"]),
            "unsupported architecture `GPT2LMHeadModel`",
        ),
        // An absent size is transformers' default; zero is refused.
        (
            "hidden_size",
            json!(0),
            "field `hidden_size`: must be at least 1",
        ),
        (
            "num_key_value_heads",
            json!(4),
            "field `num_key_value_heads`: 4 does not divide",
        ),
        (
            "rope_scaling",
            json!({"type": "dynamic", "factor": 4.0}),
            "field `rope_scaling`: type `dynamic`",
        ),
        ("eos_token_id", json!("x"), "field `eos_token_id`"),
        (
            "quantization",
            json!({"bits": 7, "group_size": 64}),
            "field `quantization`: bits 7",
        ),
    ];
    for (field, value, expected) in cases {
        let mut v = smollm2();
        v[field] = value;
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.starts_with("/ckpt/config.json: "), "{message}");
        assert!(message.contains(expected), "{field}: {message}");
    }
}

/// Groups of 16 (GGUF Q6_K/Q3_K/Q2_K converted) only under mode `mlxcel-affine`, which records
/// them per module as MLX records other group sizes; unknown modes and group 16 without the mode
/// are refused, naming the field.
#[test]
fn group16_needs_the_mlxcel_affine_mode() {
    let mut v = smollm2();
    v["quantization"] = json!({
        "group_size": 32, "bits": 4, "mode": "mlxcel-affine",
        "lm_head": {"group_size": 16, "bits": 8},
        "model.layers.0.mlp.down_proj": {"group_size": 16, "bits": 4}
    });
    let q = parse(&v).unwrap().quantization.unwrap();
    assert!(q.mlxcel_affine);
    assert_eq!(
        q.for_module("lm_head"),
        Some(QuantSpec {
            bits: 8,
            group_size: 16
        })
    );
    assert_eq!(q.to_json(), v["quantization"]);
    v["quantization"]["mode"] = json!("affine");
    let message = parse(&v).unwrap_err().to_string();
    assert!(
        message.contains("quantization.lm_head") && message.contains("mlxcel-affine"),
        "{message}"
    );
    v["quantization"]["mode"] = json!("mxfp4");
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("`mxfp4` is not supported"), "{message}");
    v["quantization"] = json!({"group_size": 16, "bits": 4});
    assert!(
        parse(&v)
            .unwrap_err()
            .to_string()
            .contains("group_size 16 needs")
    );
    v["quantization"] = json!({"group_size": 24, "bits": 4, "mode": "mlxcel-affine"});
    assert!(parse(&v).unwrap_err().to_string().contains("group_size 24"));
}

#[test]
fn mlx_quantization_with_overrides() {
    let mut v = smollm2();
    v["quantization"] = json!({
        "group_size": 64, "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
        "lm_head": false
    });
    let q = parse(&v).unwrap().quantization.unwrap();
    assert_eq!(
        q.default,
        QuantSpec {
            bits: 4,
            group_size: 64
        }
    );
    assert_eq!(
        q.for_module("model.layers.3.mlp.up_proj"),
        Some(QuantSpec {
            bits: 4,
            group_size: 64
        })
    );
    assert_eq!(
        q.for_module("model.embed_tokens"),
        Some(QuantSpec {
            bits: 8,
            group_size: 32
        })
    );
    assert_eq!(q.for_module("lm_head"), None);
    assert_eq!(q.to_json(), v["quantization"]);
    assert_eq!(
        QuantSpec {
            bits: 4,
            group_size: 32
        }
        .packed_width(576),
        72
    );
}

#[test]
fn pack_is_low_nibble_first() {
    let values: Vec<u8> = (0..8).collect();
    assert_eq!(mlxcel_model::pack(&values, 4), [0x7654_3210]);
    assert_eq!(mlxcel_model::pack(&[1, 2, 3, 255], 8), [0xFF03_0201]);
    for i in 0..8 {
        assert_eq!(mlxcel_model::unpack(&[0x7654_3210], 4, i), i as u32);
    }
}

/// A config claiming more layers than any model has is refused before anything is allocated per
/// layer (the gguf fuzzer's block count of billions grew the layer list to gigabytes).
#[test]
fn absurd_layer_counts_are_refused_before_allocating() {
    let mut v = smollm2();
    v["num_hidden_layers"] = json!(1_u64 << 40);
    let message = parse(&v).unwrap_err().to_string();
    assert!(
        message.contains("field `num_hidden_layers`") && message.contains("more than the 4096"),
        "{message}"
    );
    v["num_hidden_layers"] = json!(mlxcel_model::MAX_LAYERS);
    assert!(parse(&v).is_ok());
}

/// A llama-shaped config with gpt-oss's attention geometry (head_dim 64, θ 150000) and the
/// given `rope_scaling`.
fn yarn_config(head_dim: usize, theta: f64, scaling: Value) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": head_dim,
        "intermediate_size": 256, "rope_theta": theta, "max_position_embeddings": 131072,
        "vocab_size": 100, "rope_scaling": scaling
    })
}

fn assert_periods(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = ((f64::from(*g) - w) / w).abs();
        assert!(
            err < 2e-6,
            "pair {i}: {g} against {w} (relative error {err:e})"
        );
    }
}

/// gpt-oss's YaRN with the band rounded to whole pairs, against mlx-lm 0.32.2's `YarnRoPE`:
/// `YarnRoPE(64, base=150000, scaling_factor=32.0, original_max_position_embeddings=4096,
/// beta_fast=32.0, beta_slow=1.0)`, its `_freqs` (periods) and `mscale`, loaded from
/// mlx_lm/models/rope_utils.py in the oracle venv and printed with `.tolist()`.
#[test]
fn yarn_periods_and_attention_factor_match_mlx_lm() {
    let c = parse(&yarn_config(
        64,
        150000.0,
        json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
               "original_max_position_embeddings": 4096}),
    ))
    .unwrap();
    const MLX_LM: [f64; 32] = [
        1.0,
        1.451285481452942,
        2.106229543685913,
        3.0567402839660645,
        4.4362030029296875,
        6.438197135925293,
        9.34366226196289,
        13.560321807861328,
        19.67989730834961,
        31.624799728393555,
        51.411319732666016,
        84.8018798828125,
        142.5371551513672,
        245.72711181640625,
        439.1219482421875,
        829.0973510742188,
        1721.3260498046875,
        4386.96875,
        26103.654296875,
        37883.85546875,
        54980.2890625,
        79792.09375,
        115801.1015625,
        168060.46875,
        243903.734375,
        353973.9375,
        513717.21875,
        745550.375,
        1082006.375,
        1570300.25,
        2278953.75,
        3307412.5,
    ];
    assert_periods(&c.rope_periods(), &MLX_LM);
    assert!((c.rope_attention_factor - 1.346_573_6).abs() < 1e-6);
    assert!(c.describe().contains("YaRN"), "{}", c.describe());
}

/// `truncate: false` (gpt-oss's config.json) keeps the band's edges where they fall, as
/// transformers and OpenAI's reference implementation compute them; mlx-lm 0.32.2 ignores the
/// key. Expected values from the closed form in f64 (Python `math`): low = 64·ln(4096 /
/// (32·2π)) / (2 ln 150000), high likewise with 1, ramp = clamp((i - low) / (high - low), 0, 1),
/// period = 1 / ((1 - ramp) / p + ramp / (32 p)) with p = 150000^(2i/64).
#[test]
fn yarn_without_truncation_keeps_the_fractional_band() {
    let c = parse(&yarn_config(
        64,
        150000.0,
        json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
               "original_max_position_embeddings": 4096, "truncate": false}),
    ))
    .unwrap();
    const UNTRUNCATED: [f64; 32] = [
        1.0,
        1.4512854854972228,
        2.10622956041491,
        3.0567403901553547,
        4.436202961165585,
        6.438196968259414,
        9.343661812807111,
        13.56032077032163,
        19.679896712654305,
        31.540073877441174,
        51.719676324577044,
        86.2660240558978,
        147.16791196637564,
        259.0432438624329,
        477.6022732932474,
        950.0266042438489,
        2190.6576724578017,
        7732.833614721873,
        26103.65443448549,
        37883.854799204004,
        54980.288604769084,
        79792.09484054973,
        115801.10909950768,
        168060.46884059586,
        243903.7191142151,
        353973.9274092519,
        513717.22309349495,
        745550.3495255279,
        1082006.40097378,
        1570300.1849483352,
        2278953.8662891234,
        3307412.668263184,
    ];
    assert_periods(&c.rope_periods(), &UNTRUNCATED);
}

/// `mscale` and `mscale_all_dim` (DeepSeek's form) and the defaults of `beta_fast`/`beta_slow`,
/// against mlx-lm 0.32.2: `YarnRoPE(16, base=10000, scaling_factor=4.0,
/// original_max_position_embeddings=2048, mscale=1.0, mscale_all_dim=0.5)`.
#[test]
fn yarn_mscale_ratio_and_defaults_match_mlx_lm() {
    let c = parse(&yarn_config(
        16,
        10000.0,
        json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
               "mscale": 1.0, "mscale_all_dim": 0.5}),
    ))
    .unwrap();
    assert_periods(
        &c.rope_periods(),
        &[
            1.0,
            3.1622776985168457,
            10.0,
            38.92033767700195,
            160.0,
            722.8063354492188,
            4000.0,
            12649.111328125,
        ],
    );
    assert!((c.rope_attention_factor - 1.064_821_6).abs() < 1e-6);
    // An explicit attention_factor wins (transformers), and a missing factor is named.
    let c = parse(&yarn_config(
        16,
        10000.0,
        json!({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5}),
    ))
    .unwrap();
    assert_eq!(c.rope_attention_factor, 1.5);
    match c.rope_scaling {
        Some(RopeScaling::Yarn(y)) => {
            // No original window anywhere: max_position_embeddings, as transformers.
            assert_eq!(y.original_max_position_embeddings, 131072);
            assert!(y.truncate && y.beta_fast == 32.0 && y.beta_slow == 1.0);
        }
        other => panic!("{other:?}"),
    }
    let err = parse(&yarn_config(16, 10000.0, json!({"rope_type": "yarn"})))
        .unwrap_err()
        .to_string();
    assert!(err.contains("rope_scaling.factor"), "{err}");
    let err = parse(&yarn_config(
        16,
        10000.0,
        json!({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("rope_scaling.truncate"), "{err}");
}

fn qwen3_5() -> Value {
    json!({
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5", "hidden_size": 1024,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 256, "intermediate_size": 3584, "vocab_size": 248320,
        "max_position_embeddings": 262144, "full_attention_interval": 4,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}
    })
}

#[test]
fn qwen3_5_interleaves_gated_delta_net_with_gated_attention() {
    let c = parse(&qwen3_5()).unwrap();
    assert_eq!(c.architecture.model_type(), "qwen3_5");
    let linear: Vec<bool> = c.layers.iter().map(|l| l.linear.is_some()).collect();
    assert_eq!(linear, [true, true, true, false, true, true, true, false]);
    let net = c.layers[0].linear.unwrap();
    assert_eq!(
        (net.key_dim(), net.value_dim(), net.conv_dim()),
        (2048, 2048, 6144)
    );
    assert!(!net.fused_projections);
    assert_eq!(net.state_floats(), 3 * 6144 + 16 * 128 * 128);
    // RoPE from rope_parameters: a quarter of each 256-wide head, base 1e7.
    assert_eq!((c.rotary_dim, c.rope_theta), (64, 1e7));
    assert!(c.qk_norm && c.norm_weight_offset && c.attention_output_gate);
    assert!(
        c.describe()
            .contains("gated-DeltaNet linear attention on 6 of 8 layers"),
        "{}",
        c.describe()
    );
}

#[test]
fn qwen3_next_reads_transformers_defaults_and_its_experts() {
    let mut v = qwen3_5();
    v["architectures"] = json!(["Qwen3NextForCausalLM"]);
    v["model_type"] = json!("qwen3_next");
    v.as_object_mut().unwrap().remove("rope_parameters");
    v.as_object_mut().unwrap().remove("full_attention_interval");
    v.as_object_mut().unwrap().remove("linear_conv_kernel_dim");
    for (key, value) in [
        ("num_experts", json!(8)),
        ("num_experts_per_tok", json!(2)),
        ("moe_intermediate_size", json!(64)),
        ("shared_expert_intermediate_size", json!(128)),
        ("mlp_only_layers", json!([0])),
    ] {
        v[key] = value;
    }
    let c = parse(&v).unwrap();
    // full_attention_interval 4, conv 4, RoPE base 10000 on a quarter of each head.
    assert_eq!(c.layers.iter().filter(|l| l.linear.is_some()).count(), 6);
    assert_eq!(c.layers[0].linear.unwrap().conv_kernel, 4);
    assert!(c.layers[0].linear.unwrap().fused_projections);
    assert_eq!((c.rotary_dim, c.rope_theta), (64, 10000.0));
    assert!(c.layer_spec(0).ffn.routed().is_none());
    let moe = *c.layer_spec(1).ffn.routed().unwrap();
    assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: true });
    assert_eq!(moe.shared_expert_intermediate_size, Some(128));
}

#[test]
fn hybrid_configs_that_cannot_run_are_refused_by_name() {
    let refused = |edit: &dyn Fn(&mut Value), needle: &str| {
        let mut v = qwen3_5();
        edit(&mut v);
        let message = parse(&v).unwrap_err().to_string();
        assert!(message.contains(needle), "{message}");
    };
    refused(
        &|v| {
            v["layer_types"] = json!(vec!["linear_attention"; 8]);
        },
        "field `layer_types`",
    );
    refused(
        &|v| {
            v.as_object_mut().unwrap().remove("linear_num_value_heads");
        },
        "linear_num_value_heads",
    );
    refused(
        &|v| {
            v["linear_num_value_heads"] = json!(24);
        },
        "is not a multiple of linear_num_key_heads",
    );
    refused(
        &|v| {
            // `rope_parameters` fills the old keys: a YaRN there is read as `rope_scaling`, whose
            // factor it lacks.
            v["rope_parameters"]["rope_type"] = json!("yarn");
        },
        "rope_scaling.factor",
    );
    refused(
        &|v| {
            v["attention_bias"] = json!(true);
        },
        "field `attention_bias`",
    );
    refused(
        &|v| {
            v["num_experts"] = json!(8);
        },
        "field `num_experts`",
    );
    // A `linear_attention` layer in a family without them.
    let mut v = qwen2_moe();
    v["layer_types"] = json!(vec!["linear_attention"; 4]);
    let message = parse(&v).unwrap_err().to_string();
    assert!(
        message.contains("`linear_attention` layers are not part of"),
        "{message}"
    );
}

/// A family's expected defaults: architecture, vocab, hidden, intermediate, layers, heads, kv
/// heads, head_dim, window (max_position_embeddings), rms_norm_eps, rope_theta, tied, and the
/// sliding window of layer 0.
type Defaults = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    f32,
    f32,
    bool,
    Option<usize>,
);

/// Every family's config.json may leave out any key its transformers config class defaults: a
/// config of nothing but the architecture loads with transformers' numbers (its `__init__`
/// defaults, transformers 5.7.0), as `from_pretrained` would build it.
#[test]
fn every_family_defaults_what_transformers_defaults() {
    // (architecture, vocab, hidden, intermediate, layers, heads, kv heads, head_dim, window
    // (max_position_embeddings), rms_norm_eps, rope_theta, tied, sliding window of layer 0)
    #[rustfmt::skip]
    let cases: [Defaults; 14] = [
        ("LlamaForCausalLM", 32_000, 4096, 11_008, 32, 32, 32, 128, 2048, 1e-6, 10_000.0, false, None),
        ("MistralForCausalLM", 32_000, 4096, 14_336, 32, 32, 8, 128, 131_072, 1e-6, 10_000.0, false, Some(4096)),
        ("Qwen2ForCausalLM", 151_936, 4096, 22_016, 32, 32, 32, 128, 32_768, 1e-6, 10_000.0, false, None),
        ("Qwen3ForCausalLM", 151_936, 4096, 22_016, 32, 32, 32, 128, 32_768, 1e-6, 10_000.0, false, None),
        ("SmolLM3ForCausalLM", 128_256, 2048, 11_008, 36, 16, 4, 128, 32_768, 1e-6, 2_000_000.0, true, None),
        ("Gemma2ForCausalLM", 256_000, 2304, 9216, 26, 8, 4, 256, 8192, 1e-6, 10_000.0, true, Some(4096)),
        ("Gemma3ForCausalLM", 262_208, 2304, 9216, 26, 8, 4, 256, 131_072, 1e-6, 1_000_000.0, true, Some(4096)),
        ("Phi3ForCausalLM", 32_064, 3072, 8192, 32, 32, 32, 96, 4096, 1e-5, 10_000.0, false, None),
        ("MixtralForCausalLM", 32_000, 4096, 14_336, 32, 32, 8, 128, 131_072, 1e-5, 1_000_000.0, false, None),
        ("OlmoeForCausalLM", 50_304, 2048, 2048, 16, 16, 16, 128, 4096, 1e-5, 10_000.0, false, None),
        ("Qwen2MoeForCausalLM", 151_936, 2048, 5632, 24, 16, 16, 128, 32_768, 1e-6, 10_000.0, false, None),
        ("Qwen3MoeForCausalLM", 151_936, 2048, 6144, 24, 32, 4, 64, 32_768, 1e-6, 10_000.0, false, None),
        // LFM2's MLP: two thirds of 12288, times 1.0, rounded up to 256.
        ("Lfm2ForCausalLM", 65_536, 2560, 8192, 32, 32, 8, 80, 128_000, 1e-5, 1_000_000.0, true, None),
        ("Lfm2MoeForCausalLM", 65_536, 2048, 7168, 32, 32, 8, 64, 128_000, 1e-5, 1_000_000.0, true, None),
    ];
    for (arch, vocab, hidden, ffn, layers, heads, kv, head_dim, window, eps, theta, tied, slide) in
        cases
    {
        let mut v = json!({"architectures": [arch]});
        // The mixtures of experts need their expert keys (refused by name when absent).
        match arch {
            "MixtralForCausalLM" => v["num_experts_per_tok"] = json!(2),
            "OlmoeForCausalLM" | "Qwen2MoeForCausalLM" | "Qwen3MoeForCausalLM" => {
                v["num_experts"] = json!(8);
                v["num_experts_per_tok"] = json!(2);
                v["moe_intermediate_size"] = json!(64);
                v["shared_expert_intermediate_size"] = json!(64);
            }
            _ => {}
        }
        if arch == "MixtralForCausalLM" {
            v["num_local_experts"] = json!(8);
        }
        let c = parse(&v).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(
            (
                c.vocab_size,
                c.hidden_size,
                c.num_hidden_layers,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.window(),
            ),
            (vocab, hidden, layers, heads, kv, head_dim, window),
            "{arch}"
        );
        assert_eq!(c.intermediate_size, ffn, "{arch}");
        assert_eq!((c.rms_norm_eps, c.rope_theta), (eps, theta), "{arch}");
        assert_eq!(c.tie_word_embeddings, tied, "{arch}");
        assert_eq!(c.layers[0].window, slide, "{arch}");
    }
}

/// A Gemma 2 config without `max_position_embeddings` loads with transformers' 8192 (it was
/// refused as missing).
#[test]
fn gemma2_without_max_position_embeddings_has_transformers_window() {
    let c = parse(&json!({
        "architectures": ["Gemma2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 384
    }))
    .unwrap();
    assert_eq!(c.window(), 8192);
    assert_eq!(c.head_dim, 16);
}

/// An absent `sliding_window` is the family's default (Mistral's 4096 on every layer); `null`
/// is no window.
#[test]
fn an_absent_window_is_the_default_and_null_is_none() {
    let mut v = smollm2();
    v["architectures"] = json!(["MistralForCausalLM"]);
    v.as_object_mut().unwrap().remove("sliding_window");
    let c = parse(&v).unwrap();
    assert!(c.layers.iter().all(|l| l.window == Some(4096)));
    v["sliding_window"] = Value::Null;
    assert_eq!(parse(&v).unwrap().sliding_window(), None);
}

/// Qwen2's `use_sliding_window` without `max_window_layers` slides from transformers' layer 28.
#[test]
fn qwen2_slides_from_layer_28_by_default() {
    let mut v = smollm2();
    v["architectures"] = json!(["Qwen2ForCausalLM"]);
    v["sliding_window"] = json!(64);
    v["use_sliding_window"] = json!(true);
    let c = parse(&v).unwrap();
    let sliding: Vec<usize> = (0..30).filter(|&i| c.layers[i].window.is_some()).collect();
    assert_eq!(sliding, [28, 29]);
}

/// Phi-3's LongRoPE without `original_max_position_embeddings` uses transformers' 4096.
#[test]
fn phi3_long_rope_defaults_its_original_window() {
    let c = parse(&json!({
        "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 384,
        "max_position_embeddings": 131_072,
        "rope_scaling": {"type": "longrope", "short_factor": vec![1.0; 8], "long_factor": vec![1.0; 8]}
    }))
    .unwrap();
    let want = (1.0 + (32.0f64).ln() / (4096.0f64).ln()).sqrt() as f32;
    assert_eq!(c.rope_attention_factor, want);
}

fn gemma4() -> Value {
    json!({
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 16,
        "intermediate_size": 128, "vocab_size": 384, "sliding_window": 8,
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
        "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}
        }
    })
}

/// Gemma 4's text model: plain-weight norms, v norm, layer scalars, attention scale 1,
/// √hidden unrounded, RoPE per layer type (the full layers' proportional schedule: 2 of 8 pairs
/// rotate with the whole head's periods, the rest not at all).
#[test]
fn gemma4_reads_its_blocks_and_rope_per_layer_type() {
    let c = parse(&gemma4()).unwrap();
    assert_eq!(c.architecture.model_type(), "gemma4_text");
    assert!(c.qk_norm && c.sandwich_norms && c.value_norm && c.layer_scalars);
    assert!(!c.norm_weight_offset && c.tie_word_embeddings);
    assert_eq!(c.attention_scale, 1.0);
    assert_eq!(c.embedding_scale, Some(8.0));
    assert_eq!(c.final_logit_softcapping, Some(30.0));
    assert_eq!(c.attn_logit_softcapping, None);
    let windows: Vec<_> = c.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(8), None, Some(8), None]);
    let full = c.layer_rope_periods(1);
    assert_eq!(full.len(), 8);
    assert_eq!(full[0], 1.0);
    assert!((full[1] - 1e6f32.powf(2.0 / 16.0)).abs() < 1e-3, "{full:?}");
    assert!(full[2..].iter().all(|p| p.is_infinite()), "{full:?}");
    let local = c.layer_rope_periods(0);
    assert!((local[7] - 1e4f32.powf(14.0 / 16.0)).abs() / local[7] < 1e-6);
    assert!(c.describe().contains("v norm") && c.describe().contains("layer scalars"));
    // Without `layer_types`: five sliding layers of six, the last one full (transformers).
    let mut v = gemma4();
    v["num_hidden_layers"] = json!(8);
    v.as_object_mut().unwrap().remove("layer_types");
    let windows: Vec<bool> = parse(&v)
        .unwrap()
        .layers
        .iter()
        .map(|l| l.window.is_some())
        .collect();
    assert_eq!(windows, [true, true, true, true, true, false, true, false]);
}

/// Gemma 4's mixture-of-experts block (`enable_moe_block`, the 26B-A4B's): every layer's
/// experts beside its dense MLP (`intermediate_size`), routed by the top-k logits' softmax;
/// the keys it needs are named when missing or wrong.
#[test]
fn gemma4_reads_its_mixture_of_experts_block() {
    let mut v = gemma4();
    v["enable_moe_block"] = json!(true);
    v["num_experts"] = json!(4);
    v["top_k_experts"] = json!(2);
    v["moe_intermediate_size"] = json!(32);
    let c = parse(&v).unwrap();
    let want = FeedForward::RoutedExperts(RoutedExperts {
        num_experts: 4,
        top_k: 2,
        expert_intermediate_size: 32,
        activation: HiddenActivation::GeluTanh,
        routing: Routing::TopKSoftmax,
        biases: false,
        shared_expert_intermediate_size: None,
        parallel_dense: Some(128),
    });
    assert!((0..4).all(|i| c.layer_spec(i).ffn == want));
    assert!(
        c.describe()
            .contains("4 experts, top-2 beside the dense MLP on 4 of 4 layers")
    );
    // Per layer beside the dense model: the router (4 × 64), the experts (4 × 3 × 64 × 32;
    // two of them active), three norms and the router's scale (4 × 64), per-expert scales (4).
    let mut dense = gemma4();
    dense["enable_moe_block"] = json!(false);
    let base = parse(&dense).unwrap();
    let extra = |experts: u64| 4 * (4 * 64 + experts * 3 * 64 * 32 + 4 * 64 + 4);
    assert_eq!(c.parameter_count(), base.parameter_count() + extra(4));
    assert_eq!(
        c.active_parameter_count(),
        base.active_parameter_count() + extra(2)
    );
    // Off (or absent), the same keys leave the dense model as it is (transformers ignores them).
    v["enable_moe_block"] = json!(false);
    assert_eq!(parse(&v).unwrap().layer_spec(0).ffn, base.layer_spec(0).ffn);
    for (field, value, expected) in [
        ("top_k_experts", Value::Null, "top_k_experts"),
        (
            "top_k_experts",
            json!(5),
            "5 experts per token, but the layer has 4",
        ),
        ("num_experts", Value::Null, "num_experts"),
        ("moe_intermediate_size", json!(0), "must be at least 1"),
    ] {
        let mut v = gemma4();
        v["enable_moe_block"] = json!(true);
        v["num_experts"] = json!(4);
        v["top_k_experts"] = json!(2);
        v["moe_intermediate_size"] = json!(32);
        v[field] = value;
        let message = parse(&v).unwrap_err().to_string();
        assert!(
            message.contains(field) && message.contains(expected),
            "{field}: {message}"
        );
    }
}

/// What neither reference reads is refused, naming the key; so are shared layers without an
/// earlier layer of their kind. (The mixture-of-experts block, refused here before, is read:
/// `gemma4_reads_its_mixture_of_experts_block`.)
#[test]
fn gemma4_refuses_what_it_does_not_run_by_name() {
    let cases: [(&str, Value, &str); 3] = [
        (
            "attn_logit_softcapping",
            json!(50.0),
            "no attention soft-capping",
        ),
        (
            "layer_types",
            json!([
                "full_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention"
            ]),
            "the last layer must be `full_attention`",
        ),
        (
            "rope_parameters",
            json!({"full_attention": {"rope_type": "yarn", "factor": 2.0},
                   "sliding_attention": {"rope_type": "default"}}),
            "`yarn` (supported: proportional, default)",
        ),
    ];
    for (field, value, expected) in cases {
        let mut v = gemma4();
        v[field] = value;
        let message = parse(&v).unwrap_err().to_string();
        assert!(
            message.contains(field) && message.contains(expected),
            "{field}: {message}"
        );
    }
    // A shared layer needs an earlier layer of its kind; every layer shared is refused.
    for shared in [3, 4] {
        let mut v = gemma4();
        v["num_kv_shared_layers"] = json!(shared);
        let message = parse(&v).unwrap_err().to_string();
        assert!(
            message.contains("num_kv_shared_layers") && message.contains("no earlier layer"),
            "{shared}: {message}"
        );
    }
    let mut v = gemma4();
    v.as_object_mut().unwrap().remove("layer_types");
    v["sliding_window_pattern"] = json!(5);
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("sliding_window_pattern"), "{message}");
    // Bidirectional attention over text is refused; the released configs' "vision" (image
    // tokens only) and false read as the causal text model they are for text.
    for (value, refused) in [
        (json!(true), true),
        (json!("all"), true),
        (json!("vision"), false),
        (json!(false), false),
    ] {
        let mut v = gemma4();
        v["use_bidirectional_attention"] = value.clone();
        match parse(&v) {
            Ok(_) => assert!(!refused, "{value} was accepted"),
            Err(err) => {
                let message = err.to_string();
                assert!(refused, "{value}: {message}");
                assert!(message.contains("use_bidirectional_attention"), "{message}");
            }
        }
    }
}

/// What Gemma 4's released models add: a larger head on the full layers (its RoPE rotating the
/// first quarter of its pairs over the whole head's schedule), shared keys and values with a
/// double-wide MLP there, and per-layer token inputs; transformers' defaults where keys are
/// absent (a 512 head, 256 per-layer values from a table of 262144 rows).
#[test]
fn gemma4_reads_the_released_models_layout() {
    let mut v = gemma4();
    v["global_head_dim"] = json!(32);
    v["num_hidden_layers"] = json!(6);
    v["layer_types"] = json!([
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention"
    ]);
    v["num_kv_shared_layers"] = json!(2);
    v["use_double_wide_mlp"] = json!(true);
    v["hidden_size_per_layer_input"] = json!(8);
    v["vocab_size_per_layer_input"] = json!(384);
    let c = parse(&v).unwrap();
    assert_eq!(c.global_head_dim, Some(32));
    let dims: Vec<_> = (0..6).map(|i| c.layer_head_dim(i)).collect();
    assert_eq!(dims, [16, 16, 16, 32, 16, 32]);
    assert_eq!(c.rotary_dim, 32);
    assert_eq!(c.local_rotary_dim(), 16);
    let full = c.layer_rope_periods(3);
    assert_eq!(full.len(), 16);
    assert!((full[1] - 1e6f32.powf(2.0 / 32.0)).abs() < 1e-3, "{full:?}");
    assert!(full[3].is_finite() && full[4..].iter().all(|p| p.is_infinite()));
    assert_eq!(c.layer_rope_periods(0).len(), 8);
    let sources: Vec<_> = (0..6).map(|i| c.kv_source(i)).collect();
    assert_eq!(sources, [None, None, None, None, Some(2), Some(3)]);
    assert_eq!(c.kv_shapes(0..6), [(2, 16), (2, 16), (2, 16), (2, 32)]);
    let widths: Vec<_> = c
        .feed_forward
        .iter()
        .map(|f| match f {
            FeedForward::Dense {
                intermediate_size, ..
            } => *intermediate_size,
            FeedForward::RoutedExperts(_) => 0,
        })
        .collect();
    assert_eq!(widths, [128, 128, 128, 128, 256, 256]);
    assert_eq!(
        c.per_layer_input,
        Some(PerLayerInput {
            hidden: 8,
            vocab: 384
        })
    );
    assert!(
        c.describe().contains("per-layer token inputs of 8"),
        "{}",
        c.describe()
    );
    // The 31B's keys as values: no v on the full layers, one key/value head there.
    let mut v = gemma4();
    v["attention_k_eq_v"] = json!(true);
    v["num_global_key_value_heads"] = json!(1);
    let c = parse(&v).unwrap();
    assert!(c.layer_keys_as_values(1) && !c.layer_keys_as_values(0));
    assert_eq!(c.kv_shapes(0..4), [(2, 16), (1, 16), (2, 16), (1, 16)]);
    assert!(c.has_varied_layers());
    v["num_global_key_value_heads"] = json!(3);
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("num_global_key_value_heads"), "{message}");
    // Absent keys: transformers' defaults.
    let mut v = gemma4();
    for field in ["global_head_dim", "hidden_size_per_layer_input", "head_dim"] {
        v.as_object_mut().unwrap().remove(field);
    }
    let c = parse(&v).unwrap();
    assert_eq!((c.head_dim, c.global_head_dim), (256, Some(512)));
    assert_eq!(
        c.per_layer_input,
        Some(PerLayerInput {
            hidden: 256,
            vocab: 262_144
        })
    );
}

/// Gemma 4's multimodal config (`Gemma4ForConditionalGeneration`) is read as its text model.
#[test]
fn gemma4_multimodal_config_reads_its_text_config() {
    let mut text = gemma4();
    text.as_object_mut().unwrap().remove("architectures");
    let v = json!({
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": text, "vision_config": {"hidden_size": 32}, "eos_token_id": [1, 106]
    });
    let c = parse(&v).unwrap();
    assert!(c.multimodal && c.value_norm);
    assert_eq!(c.architecture.model_type(), "gemma4_text");
    assert_eq!(c.eos_token_ids, [1, 106]);
}

/// transformers 5's `rope_parameters` (one object) fills `rope_theta` and the scaling where
/// config.json leaves them out; one set per layer type is refused outside Gemma 4.
#[test]
fn flat_rope_parameters_fill_the_old_keys() {
    let mut v = smollm2();
    v.as_object_mut().unwrap().remove("rope_theta");
    v["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 500_000.0});
    let c = parse(&v).unwrap();
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
    v["rope_parameters"] = json!({"full_attention": {"rope_type": "default"}});
    let message = parse(&v).unwrap_err().to_string();
    assert!(message.contains("rope_parameters"), "{message}");
}
