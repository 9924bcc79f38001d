//! The RoPE overrides against ggml's closed form (`ggml_rope_yarn_corr_dims`, `rope_yarn`),
//! written out here in f64 from llama.cpp's definitions, and their refusals.

use std::path::Path;

use serde_json::{Value, json};

use super::*;

/// SmolLM2-135M's config (the default model): llama, head 64, base 100000, window 8192.
fn smollm2(extra: Value) -> ModelConfig {
    let mut value = json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "vocab_size": 49152, "tie_word_embeddings": true
    });
    for (k, v) in extra.as_object().unwrap() {
        value[k] = v.clone();
    }
    ModelConfig::from_json(Path::new("/ckpt/config.json"), &value.to_string()).unwrap()
}

/// ggml's periods for `dims` rotated features: inverse frequency
/// `base^(-2i/dims) · (s·(1 − r·e) + r·e)` with r = 1 − clamp((i − lo)/max(0.001, hi − lo)),
/// lo = max(0, floor(corr(beta_fast))), hi = min(dims − 1, ceil(corr(beta_slow))),
/// corr(b) = dims·ln(orig/(2πb)) / (2 ln base).
fn ggml_periods(
    dims: usize,
    base: f64,
    scale: f64,
    ext: f64,
    orig: f64,
    fast: f64,
    slow: f64,
) -> Vec<f64> {
    let d = dims as f64;
    let corr = |b: f64| d * (orig / (b * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    let lo = corr(fast).floor().max(0.0);
    let hi = corr(slow).ceil().min(d - 1.0);
    (0..dims / 2)
        .map(|i| {
            let y = (i as f64 - lo) / (hi - lo).max(0.001);
            let r = 1.0 - y.clamp(0.0, 1.0);
            let plain = base.powf(-2.0 * i as f64 / d);
            let mix = r * ext;
            1.0 / (plain * (scale * (1.0 - mix) + mix))
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let rel = (f64::from(*g) - w).abs() / w.abs();
        assert!(rel < 2e-5, "pair {i}: {g} against {w} (relative {rel})");
    }
}

fn apply(config: &mut ModelConfig, o: RopeOverrides) -> Result<()> {
    o.apply(config)
}

#[test]
fn no_flags_leave_the_config_alone() {
    let mut c = smollm2(json!({}));
    let before = c.clone();
    apply(&mut c, RopeOverrides::default()).unwrap();
    assert_eq!(c, before);
    // llama.cpp's "from the model" values are no override either.
    let unset = RopeOverrides {
        freq_base: Some(0.0),
        freq_scale: Some(0.0),
        yarn_orig_ctx: Some(0),
        yarn_ext_factor: Some(-1.0),
        yarn_attn_factor: Some(-1.0),
        ..RopeOverrides::default()
    };
    apply(&mut c, unset).unwrap();
    assert_eq!(c.rope_periods(), before.rope_periods());
    assert_eq!(c.rope_attention_factor, 1.0);
}

#[test]
fn freq_base_and_linear_scale_change_the_periods() {
    let mut c = smollm2(json!({}));
    let o = RopeOverrides {
        freq_base: Some(20000.0),
        rope_scale: Some(4.0),
        ..RopeOverrides::default()
    };
    apply(&mut c, o).unwrap();
    assert_eq!(c.rope_theta, 20000.0);
    // The model has no scaling: llama.cpp's type is linear, so --rope-scale stretches every pair.
    assert_close(
        &c.rope_periods(),
        &ggml_periods(64, 20000.0, 0.25, 0.0, 8192.0, 32.0, 1.0),
    );
    assert_eq!(c.rope_attention_factor, 1.0);
    assert_eq!(c.max_position_embeddings, 4 * 8192);
}

#[test]
fn yarn_matches_ggml() {
    let mut c = smollm2(json!({}));
    let o = RopeOverrides {
        scaling: Some(RopeScalingType::Yarn),
        rope_scale: Some(4.0),
        yarn_orig_ctx: Some(2048),
        ..RopeOverrides::default()
    };
    apply(&mut c, o).unwrap();
    assert_close(
        &c.rope_periods(),
        &ggml_periods(64, 100000.0, 0.25, 1.0, 2048.0, 32.0, 1.0),
    );
    // ggml's magnitude: 1 + 0.1 ln 4 on q and k.
    assert!((f64::from(c.rope_attention_factor) - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-6);
    // llama.cpp's training context under a custom YaRN scale: the original window stretched.
    assert_eq!(c.max_position_embeddings, 4 * 2048);
}

#[test]
fn partial_extrapolation_mix_and_betas_match_ggml() {
    let mut c = smollm2(json!({}));
    let o = RopeOverrides {
        scaling: Some(RopeScalingType::Yarn),
        freq_scale: Some(0.5),
        yarn_ext_factor: Some(0.5),
        yarn_beta_fast: Some(16.0),
        yarn_beta_slow: Some(2.0),
        ..RopeOverrides::default()
    };
    apply(&mut c, o).unwrap();
    assert_close(
        &c.rope_periods(),
        &ggml_periods(64, 100000.0, 0.5, 0.5, 8192.0, 16.0, 2.0),
    );
    assert!((f64::from(c.rope_attention_factor) - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-6);
}

#[test]
fn attn_factor_scales_q_and_k_without_the_mix() {
    let mut c = smollm2(json!({}));
    let o = RopeOverrides {
        yarn_attn_factor: Some(1.5),
        ..RopeOverrides::default()
    };
    apply(&mut c, o).unwrap();
    assert_eq!(c.rope_attention_factor, 1.5);
    assert_eq!(c.rope_scaling, None);
}

#[test]
fn a_yarn_checkpoint_keeps_its_rope_under_neutral_flags() {
    let yarn = json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 2048}});
    let mut c = smollm2(yarn);
    let before = c.rope_periods();
    let attention = c.rope_attention_factor;
    // The model's own type, scale and window, spelled out: no change.
    let o = RopeOverrides {
        scaling: Some(RopeScalingType::Yarn),
        rope_scale: Some(4.0),
        yarn_orig_ctx: Some(2048),
        ..RopeOverrides::default()
    };
    apply(&mut c, o).unwrap();
    assert_close(
        &c.rope_periods(),
        &before.iter().map(|&p| f64::from(p)).collect::<Vec<_>>(),
    );
    assert!((c.rope_attention_factor - attention).abs() < 1e-6);
    assert_eq!(c.max_position_embeddings, 8192);
    // --rope-scaling none turns it off: plain periods, no magnitude.
    let mut c = smollm2(json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}));
    let none = RopeOverrides {
        scaling: Some(RopeScalingType::None),
        ..RopeOverrides::default()
    };
    apply(&mut c, none).unwrap();
    assert_close(
        &c.rope_periods(),
        &ggml_periods(64, 100000.0, 1.0, 0.0, 8192.0, 32.0, 1.0),
    );
    assert_eq!(c.rope_attention_factor, 1.0);
}

#[test]
fn nonsense_is_refused_naming_the_flag() {
    let cases: [(RopeOverrides, &str); 9] = [
        (
            RopeOverrides {
                rope_scale: Some(0.0),
                ..Default::default()
            },
            "--rope-scale 0",
        ),
        (
            RopeOverrides {
                freq_base: Some(-1.0),
                ..Default::default()
            },
            "--rope-freq-base -1",
        ),
        (
            RopeOverrides {
                freq_scale: Some(f32::INFINITY),
                ..Default::default()
            },
            "--rope-freq-scale inf",
        ),
        (
            RopeOverrides {
                rope_scale: Some(2.0),
                freq_scale: Some(0.5),
                ..Default::default()
            },
            "--rope-scale/--rope-freq-scale",
        ),
        (
            RopeOverrides {
                yarn_orig_ctx: Some(-4),
                ..Default::default()
            },
            "--yarn-orig-ctx -4",
        ),
        (
            RopeOverrides {
                yarn_ext_factor: Some(-2.0),
                ..Default::default()
            },
            "--yarn-ext-factor -2",
        ),
        (
            RopeOverrides {
                scaling: Some(RopeScalingType::Yarn),
                yarn_attn_factor: Some(2.0),
                ..Default::default()
            },
            "--yarn-attn-factor",
        ),
        (
            RopeOverrides {
                yarn_beta_fast: Some(8.0),
                ..Default::default()
            },
            "--yarn-beta-fast",
        ),
        (
            RopeOverrides {
                scaling: Some(RopeScalingType::Yarn),
                yarn_beta_fast: Some(1.0),
                yarn_beta_slow: Some(2.0),
                ..Default::default()
            },
            "--yarn-beta-fast/--yarn-beta-slow",
        ),
    ];
    for (o, flag) in cases {
        let err = apply(&mut smollm2(json!({})), o).unwrap_err().to_string();
        assert!(err.starts_with(flag), "{o:?}: {err}");
    }
    let none_scaled = RopeOverrides {
        scaling: Some(RopeScalingType::None),
        rope_scale: Some(2.0),
        ..Default::default()
    };
    assert!(apply(&mut smollm2(json!({})), none_scaled).is_err());
    assert_eq!(
        "ntk".parse::<RopeScalingType>().unwrap_err(),
        "`ntk` is not a RoPE scaling type (expected none, linear or yarn)"
    );
}

#[test]
fn sliding_window_models_are_refused() {
    let mut c = smollm2(json!({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}));
    assert!(c.sliding_window().is_some(), "the fixture slides");
    let o = RopeOverrides {
        freq_base: Some(20000.0),
        ..RopeOverrides::default()
    };
    let err = apply(&mut c, o).unwrap_err().to_string();
    assert!(
        err.starts_with("--rope-freq-base: ") && err.contains("sliding-window"),
        "{err}"
    );
}
