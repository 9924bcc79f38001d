//! An LFM2 hybrid (short convolutions beside attention with q/k norms, LFM2-MoE's sigmoid-routed
//! experts on one layer) on a tiny random checkpoint written here in Hugging Face's names and
//! layout: its convolution tails are per sequence (batched or alone, the same logits), carried
//! across prefill pieces and decode steps, and counted.

use std::path::Path;

use mlxcel_core::{ForwardSeq, Kernels, LlamaModel};
use mlxcel_model::Checkpoint;
use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView;

use crate::pseudo_random;
use crate::reference::assert_logits_close;

const HIDDEN: usize = 64;
const VOCAB: usize = 128;
const TAPS: usize = 3;
const EXPERTS: usize = 4;

/// Writes a random LFM2-MoE (layers 0 and 2 short convolutions, 1 and 3 attention; layer 0
/// dense, the others 4 experts, top-2) in Hugging Face's layout (`conv.weight`
/// `[hidden, 1, taps]`, `feed_forward.w1`/`w3`/`w2`, `experts.{j}.w1`, ...).
fn write_lfm2_moe(dir: &Path) {
    let config = serde_json::json!({
        "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
        "hidden_size": HIDDEN, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": EXPERTS, "num_experts_per_tok": 2, "num_dense_layers": 1,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "norm_eps": 1e-5,
        "conv_L_cache": TAPS, "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "tie_embedding": true
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut seed = 100u64;
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        seed += 1;
        let n: usize = shape.iter().product();
        let values: Vec<u8> = pseudo_random(n, seed)
            .into_iter()
            .flat_map(|v| (offset + scale * v).to_le_bytes())
            .collect();
        tensors.push((name, shape, values));
    };
    let gain = |inputs: usize| 2.0 * (3.0 / inputs as f32).sqrt();
    let h = HIDDEN;
    add("model.embed_tokens.weight".into(), vec![VOCAB, h], 0.5, 0.0);
    for layer in 0..4 {
        let p = format!("model.layers.{layer}");
        add(format!("{p}.operator_norm.weight"), vec![h], 0.1, 1.0);
        add(format!("{p}.ffn_norm.weight"), vec![h], 0.1, 1.0);
        if layer % 2 == 0 {
            add(format!("{p}.conv.conv.weight"), vec![h, 1, TAPS], 0.5, 0.0);
            add(
                format!("{p}.conv.in_proj.weight"),
                vec![3 * h, h],
                gain(h),
                0.0,
            );
            add(
                format!("{p}.conv.out_proj.weight"),
                vec![h, h],
                gain(h),
                0.0,
            );
        } else {
            let a = format!("{p}.self_attn");
            add(format!("{a}.q_proj.weight"), vec![h, h], gain(h), 0.0);
            add(format!("{a}.k_proj.weight"), vec![32, h], gain(h), 0.0);
            add(format!("{a}.v_proj.weight"), vec![32, h], gain(h), 0.0);
            add(format!("{a}.out_proj.weight"), vec![h, h], gain(h), 0.0);
            add(format!("{a}.q_layernorm.weight"), vec![16], 0.1, 1.0);
            add(format!("{a}.k_layernorm.weight"), vec![16], 0.1, 1.0);
        }
        let f = format!("{p}.feed_forward");
        let mut mlp = |m: String, ffn: usize| {
            add(format!("{m}.w1.weight"), vec![ffn, h], gain(h), 0.0);
            add(format!("{m}.w3.weight"), vec![ffn, h], gain(h), 0.0);
            add(format!("{m}.w2.weight"), vec![h, ffn], gain(ffn), 0.0);
        };
        if layer == 0 {
            mlp(f.clone(), 96);
        } else {
            for j in 0..EXPERTS {
                mlp(format!("{f}.experts.{j}"), 32);
            }
        }
        if layer > 0 {
            add(format!("{f}.gate.weight"), vec![EXPERTS, h], gain(h), 0.0);
            add(format!("{f}.expert_bias"), vec![EXPERTS], 0.3, 0.0);
        }
    }
    add("model.embedding_norm.weight".into(), vec![h], 0.1, 1.0);
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(StDtype::F32, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn prompt(len: usize, seed: u64) -> Vec<u32> {
    pseudo_random(len, seed)
        .into_iter()
        .map(|v| ((v + 1.0) * 0.5 * (VOCAB - 1) as f32) as u32)
        .collect()
}

/// The last position's logits of `tokens` fed in `pieces` (lengths) through one cache.
fn in_pieces(model: &LlamaModel, tokens: &[u32], pieces: &[usize]) -> Vec<f32> {
    let mut cache = model.new_cache(tokens.len());
    let (mut at, mut logits) = (0, Vec::new());
    for &piece in pieces {
        let mut seqs = [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens[at..at + piece],
        }];
        logits = model.forward(&mut seqs).unwrap().remove(0);
        at += piece;
    }
    logits
}

#[test]
fn lfm2_tails_are_per_sequence_across_pieces_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    write_lfm2_moe(dir.path());
    let checkpoint = Checkpoint::open(dir.path()).expect("the tiny LFM2-MoE validates");
    let model = LlamaModel::load_with(&checkpoint, Kernels::from_env().unwrap()).unwrap();
    assert!(model.is_hybrid());
    let tokens = prompt(40, 5);
    let whole = in_pieces(&model, &tokens, &[40]);
    let pieces = in_pieces(&model, &tokens, &[1, 2, 17, 1, 1, 18]);
    assert_logits_close(&pieces, &whole, 1e-5, "pieces and decode steps");
    // Batched with another sequence of another length: the same logits as alone.
    let other = prompt(9, 6);
    let alone = in_pieces(&model, &other, &[9]);
    let (mut a, mut b) = (model.new_cache(40), model.new_cache(9));
    let mut seqs = [
        ForwardSeq {
            cache: &mut a,
            tokens: &tokens,
        },
        ForwardSeq {
            cache: &mut b,
            tokens: &other,
        },
    ];
    let batched = model.forward(&mut seqs).unwrap();
    assert_logits_close(&batched[0], &whole, 1e-5, "first batched");
    assert_logits_close(&batched[1], &alone, 1e-5, "second batched");
    // Two convolution tails of (taps - 1) rows of hidden f32 values; KV for two layers only.
    assert_eq!(
        model.recurrent_bytes_per_sequence(),
        2 * (TAPS - 1) * HIDDEN * 4
    );
    assert_eq!(a.recurrent().unwrap().position(), 40);
    assert_eq!(model.kv_bytes_per_position(), 2 * 2 * 2 * 16 * 4);
}
