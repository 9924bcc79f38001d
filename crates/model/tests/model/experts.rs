//! Mixture-of-experts checkpoints: one tensor per expert, mlx-lm's stacked `switch_mlp` (dense and
//! quantized), Mixtral's Hugging Face names and mlx-lm's Mixtral form all read as the same
//! per-expert views, without copying, and validation naming the missing tensor.

use std::collections::BTreeMap;

use mlxcel_model::{Checkpoint, ModelError, QuantSpec};
use safetensors::Dtype as StDtype;
use serde_json::{Value, json};

use super::checkpoint::{T, f32s, parsed, tensors, write_dir};

const EXPERTS: usize = 4;

fn qwen3_moe(quantization: Option<Value>) -> Value {
    let mut v = json!({
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": EXPERTS,
        "num_experts_per_tok": 2, "norm_topk_prob": true, "mlp_only_layers": [1],
        "max_position_embeddings": 512, "vocab_size": 40, "tie_word_embeddings": false
    });
    if let Some(q) = quantization {
        v["quantization"] = q;
    }
    v
}

fn mixtral() -> Value {
    json!({
        "architectures": ["MixtralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32,
        "num_local_experts": EXPERTS, "num_experts_per_tok": 2,
        "max_position_embeddings": 512, "vocab_size": 40, "sliding_window": null
    })
}

/// Distinct bytes for every tensor, so that a view of the wrong expert is caught.
fn distinct(mut tensors: BTreeMap<String, T>) -> BTreeMap<String, T> {
    for (i, t) in tensors.values_mut().enumerate() {
        for (k, b) in t.2.iter_mut().enumerate() {
            *b = (i * 7 + k * 13) as u8;
        }
    }
    tensors
}

/// Replaces each routed layer's per-expert tensors by stacked ones under `stacked(layer,
/// projection, suffix)`, as mlx-lm saves them.
fn stack(
    mut tensors: BTreeMap<String, T>,
    layers: &[usize],
    stacked: impl Fn(usize, &str, &str) -> String,
) -> BTreeMap<String, T> {
    for &layer in layers {
        for projection in ["gate_proj", "up_proj", "down_proj"] {
            for suffix in ["weight", "scales", "biases"] {
                let name = |j: usize| {
                    format!("model.layers.{layer}.mlp.experts.{j}.{projection}.{suffix}")
                };
                let Some(first) = tensors.get(&name(0)) else {
                    continue;
                };
                let (dtype, mut shape) = (first.0, vec![EXPERTS]);
                shape.extend_from_slice(&first.1);
                let mut bytes = Vec::new();
                for j in 0..EXPERTS {
                    bytes.extend(tensors.remove(&name(j)).unwrap().2);
                }
                tensors.insert(stacked(layer, projection, suffix), T(dtype, shape, bytes));
            }
        }
    }
    tensors
}

fn open(config: &Value, tensors: &BTreeMap<String, T>) -> Result<Checkpoint, ModelError> {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path(), config, tensors, 1);
    // The checkpoint's maps outlive the directory's removal (the files stay mapped).
    Checkpoint::open(dir.path())
}

/// Every per-expert tensor of `canonical` reads the same bytes from `ckpt`.
fn assert_same_experts(ckpt: &Checkpoint, canonical: &BTreeMap<String, T>) {
    let mut seen = 0;
    for (name, t) in canonical
        .iter()
        .filter(|(n, _)| n.contains(".mlp.experts."))
    {
        let view = ckpt
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((view.shape, view.data), (&t.1[..], &t.2[..]), "{name}");
        seen += 1;
    }
    assert!(seen >= EXPERTS * 3, "{seen}");
}

#[test]
fn per_expert_tensors_validate_and_answer_quantization_per_expert() {
    let v = qwen3_moe(Some(json!({
        "bits": 4, "group_size": 32, "model.layers.0.mlp.gate": {"bits": 8, "group_size": 32}
    })));
    let mut canonical = tensors(&parsed(&v), true);
    // The router of layer 0 is 8-bit (mlx-lm's quant_predicate for Qwen MoE routers).
    canonical.insert(
        "model.layers.0.mlp.gate.weight".into(),
        T(StDtype::U32, vec![EXPERTS, 16], vec![0; EXPERTS * 64]),
    );
    let ckpt = open(&v, &canonical).unwrap();
    assert_eq!(
        ckpt.quantization_of("model.layers.0.mlp.experts.3.down_proj"),
        Some(QuantSpec {
            bits: 4,
            group_size: 32
        })
    );
    assert_eq!(
        ckpt.quantization_of("model.layers.0.mlp.gate"),
        Some(QuantSpec {
            bits: 8,
            group_size: 32
        })
    );
    // Layer 1 is in `mlp_only_layers`: a dense MLP, no experts.
    assert!(ckpt.tensor("model.layers.1.mlp.up_proj.weight").is_some());
    assert!(
        ckpt.tensor_info("model.layers.1.mlp.experts.0.up_proj.weight")
            .is_none()
    );
}

#[test]
fn mlx_lm_switch_mlp_is_read_as_per_expert_views_without_copying() {
    let v = qwen3_moe(None);
    let canonical = distinct(tensors(&parsed(&v), false));
    let stacked = stack(canonical.clone_tensors(), &[0], |l, p, s| {
        format!("model.layers.{l}.mlp.switch_mlp.{p}.{s}")
    });
    assert!(stacked.contains_key("model.layers.0.mlp.switch_mlp.up_proj.weight"));
    let ckpt = open(&v, &stacked).unwrap();
    assert_same_experts(&ckpt, &canonical);
    // Views of one mapped tensor: expert 1's bytes follow expert 0's.
    let e0 = ckpt
        .tensor("model.layers.0.mlp.experts.0.up_proj.weight")
        .unwrap();
    let e1 = ckpt
        .tensor("model.layers.0.mlp.experts.1.up_proj.weight")
        .unwrap();
    assert_eq!(
        e1.data.as_ptr() as usize - e0.data.as_ptr() as usize,
        e0.data.len()
    );
    assert!(
        ckpt.tensor_info("model.layers.0.mlp.switch_mlp.up_proj.weight")
            .is_none()
    );
}

#[test]
fn quantized_switch_mlp_and_its_overrides_apply_to_each_expert() {
    // mlx-lm's override of a stacked module (here: down_proj left dense) names `switch_mlp`.
    let v = qwen3_moe(Some(json!({
        "bits": 4, "group_size": 32, "model.layers.0.mlp.switch_mlp.down_proj": false
    })));
    let mut canonical = tensors(&parsed(&v), true);
    for j in 0..EXPERTS {
        let down = format!("model.layers.0.mlp.experts.{j}.down_proj");
        canonical.remove(&format!("{down}.scales"));
        canonical.remove(&format!("{down}.biases"));
        canonical.insert(format!("{down}.weight"), f32s(&[64, 32]));
    }
    let canonical = distinct(canonical);
    let stacked = stack(canonical.clone_tensors(), &[0], |l, p, s| {
        format!("model.layers.{l}.mlp.switch_mlp.{p}.{s}")
    });
    let ckpt = open(&v, &stacked).unwrap();
    assert_same_experts(&ckpt, &canonical);
    for j in 0..EXPERTS {
        let e = format!("model.layers.0.mlp.experts.{j}");
        assert_eq!(
            ckpt.quantization_of(&format!("{e}.gate_proj")),
            Some(QuantSpec {
                bits: 4,
                group_size: 32
            })
        );
        assert_eq!(ckpt.quantization_of(&format!("{e}.down_proj")), None);
    }
    let scales = ckpt
        .tensor_info("model.layers.0.mlp.experts.2.up_proj.scales")
        .unwrap();
    assert_eq!(scales.shape, &[32, 2]);
}

#[test]
fn mixtral_hugging_face_and_mlx_lm_names_are_read_as_the_canonical_experts() {
    let v = mixtral();
    let canonical = distinct(tensors(&parsed(&v), false));
    // Hugging Face: `block_sparse_moe`, experts' w1 (gate), w3 (up), w2 (down).
    let hf: BTreeMap<String, T> = canonical
        .clone_tensors()
        .into_iter()
        .map(|(name, t)| {
            let name = name
                .replace(".mlp.", ".block_sparse_moe.")
                .replace(".gate_proj.", ".w1.")
                .replace(".up_proj.", ".w3.")
                .replace(".down_proj.", ".w2.");
            (name, t)
        })
        .collect();
    assert!(hf.contains_key("model.layers.1.block_sparse_moe.experts.3.w3.weight"));
    assert!(hf.contains_key("model.layers.1.block_sparse_moe.gate.weight"));
    let ckpt = open(&v, &hf).unwrap();
    assert_same_experts(&ckpt, &canonical);
    assert!(ckpt.tensor("model.layers.1.mlp.gate.weight").is_some());
    // mlx-lm's Mixtral: `block_sparse_moe.switch_mlp`, stacked.
    let mlx: BTreeMap<String, T> = stack(canonical.clone_tensors(), &[0, 1], |l, p, s| {
        format!("model.layers.{l}.block_sparse_moe.switch_mlp.{p}.{s}")
    })
    .into_iter()
    .map(|(name, t)| (name.replace(".mlp.gate.", ".block_sparse_moe.gate."), t))
    .collect();
    let ckpt = open(&v, &mlx).unwrap();
    assert_same_experts(&ckpt, &canonical);
}

/// A one-layer Gemma 4 with its mixture-of-experts block (`enable_moe_block`).
fn gemma4_moe() -> Value {
    json!({
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 16,
        "intermediate_size": 96, "vocab_size": 40, "sliding_window": 8,
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
        "layer_types": ["full_attention"], "enable_moe_block": true, "num_experts": EXPERTS,
        "top_k_experts": 2, "moe_intermediate_size": 32
    })
}

/// Gemma 4's router (`router.proj`) and experts in mlx-lm's form (`experts.switch_glu.*`,
/// stacked) and Hugging Face's (`experts.gate_up_proj`, each expert's gate rows then its up
/// rows, and `experts.down_proj`, without `.weight`) are read as the canonical per-expert
/// views; its dense MLP keeps `mlp.{gate,up,down}_proj`.
#[test]
fn gemma4_hugging_face_and_mlx_lm_expert_names_are_read_as_the_canonical_experts() {
    let v = gemma4_moe();
    let mut canonical = distinct(tensors(&parsed(&v), false));
    let p = "model.layers.0";
    canonical.insert(format!("{p}.layer_scalar"), f32s(&[1]));
    canonical.insert(format!("{p}.router.scale"), f32s(&[64]));
    canonical.insert(format!("{p}.router.per_expert_scale"), f32s(&[EXPERTS]));
    assert!(canonical.contains_key(&format!("{p}.post_feedforward_layernorm_2.weight")));
    let router = |mut t: BTreeMap<String, T>| {
        let r = t.remove(&format!("{p}.mlp.gate.weight")).unwrap();
        t.insert(format!("{p}.router.proj.weight"), r);
        t
    };
    let mlx = router(stack(canonical.clone_tensors(), &[0], |l, p, s| {
        format!("model.layers.{l}.experts.switch_glu.{p}.{s}")
    }));
    let ckpt = open(&v, &mlx).unwrap();
    assert_same_experts(&ckpt, &canonical);
    let dense = format!("{p}.mlp.gate_proj.weight");
    assert_eq!(ckpt.tensor(&dense).unwrap().data, &canonical[&dense].2[..]);
    let gate = format!("{p}.mlp.gate.weight");
    assert_eq!(ckpt.tensor(&gate).unwrap().data, &canonical[&gate].2[..]);

    let mut hf = router(canonical.clone_tensors());
    let (mut gate_up, mut down) = (Vec::new(), Vec::new());
    for j in 0..EXPERTS {
        let e = |m: &str| format!("{p}.mlp.experts.{j}.{m}.weight");
        gate_up.extend(hf.remove(&e("gate_proj")).unwrap().2);
        gate_up.extend(hf.remove(&e("up_proj")).unwrap().2);
        down.extend(hf.remove(&e("down_proj")).unwrap().2);
    }
    hf.insert(
        format!("{p}.experts.gate_up_proj"),
        T(StDtype::F32, vec![EXPERTS, 64, 64], gate_up),
    );
    hf.insert(
        format!("{p}.experts.down_proj"),
        T(StDtype::F32, vec![EXPERTS, 64, 32], down),
    );
    let ckpt = open(&v, &hf).unwrap();
    assert_same_experts(&ckpt, &canonical);
}

#[test]
fn a_missing_or_misshapen_expert_is_named() {
    let v = qwen3_moe(None);
    let canonical = tensors(&parsed(&v), false);
    let mut stacked = stack(canonical.clone_tensors(), &[0], |l, p, s| {
        format!("model.layers.{l}.mlp.switch_mlp.{p}.{s}")
    });
    stacked.remove("model.layers.0.mlp.switch_mlp.up_proj.weight");
    let message = open(&v, &stacked).unwrap_err().to_string();
    assert!(
        message.contains("model.layers.0.mlp.experts.0.up_proj.weight"),
        "{message}"
    );
    // A stack of 3 experts where the config has 4.
    stacked.insert(
        "model.layers.0.mlp.switch_mlp.up_proj.weight".into(),
        f32s(&[3, 32, 64]),
    );
    let message = open(&v, &stacked).unwrap_err().to_string();
    assert!(
        message.contains("model.layers.0.mlp.switch_mlp.up_proj.weight")
            && message.contains("4 experts"),
        "{message}"
    );
    // One expert missing from the per-expert form.
    let mut missing = canonical.clone_tensors();
    missing.remove("model.layers.0.mlp.experts.2.gate_proj.weight");
    let message = open(&v, &missing).unwrap_err().to_string();
    assert!(
        message.contains("model.layers.0.mlp.experts.2.gate_proj.weight"),
        "{message}"
    );
}

/// A copy of a tensor map (the test type is not `Clone`).
trait CloneTensors {
    fn clone_tensors(&self) -> BTreeMap<String, T>;
}

impl CloneTensors for BTreeMap<String, T> {
    fn clone_tensors(&self) -> BTreeMap<String, T> {
        self.iter()
            .map(|(n, t)| (n.clone(), T(t.0, t.1.clone(), t.2.clone())))
            .collect()
    }
}
