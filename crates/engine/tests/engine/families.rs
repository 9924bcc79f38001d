//! Each model family's features on both backends: tiny random checkpoints (dense f32, two or
//! three layers) with the family's features switched on are run through the MLX backend and the
//! OpenXLA backend, prefill then greedy decode, and their logits compared. The MLX backend's
//! forward is checked against a plain-Rust reference in mlxcel-core's tests; this carries that
//! check over to the OpenXLA emitter (q/k norms, layers without RoPE, sliding-window masks).

use std::path::Path;

use mlxcel_engine::{
    BackendKind, EngineOptions, MaxNewTokens, RequestShape, SequenceStep, argmax, load_backend,
};
use mlxcel_model::Checkpoint;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 64;
pub(crate) const VOCAB: usize = 64;

/// Deterministic values in `[-0.5, 0.5)` scaled by `scale`, around `center`, on a grid of
/// 2⁻¹⁰: every value below 2 in magnitude is then exact in f16, the OpenXLA backend's default
/// weight format, so both backends multiply the same weights.
fn random(n: usize, seed: &mut u64, scale: f32, center: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = center + scale * ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
            assert!(x.abs() < 2.0);
            (x * 1024.0).round() / 1024.0
        })
        .collect()
}

/// Writes a tiny checkpoint for `config` (the family keys on top of the shared sizes): dense f32,
/// or with every linear layer and the embedding quantized in affine groups of 16
/// (`group16`, as `mlxcel convert` writes GGUF Q6_K/Q3_K/Q2_K) when asked: 8-bit for the
/// embedding and the attention, 4-bit for the MLP, f32 scales on a grid where every weight is
/// exact in f16 (the OpenXLA backend's default format), so both backends use the same weights.
pub(crate) fn write_tiny_with(dir: &Path, family: &Value, seed: u64, group16: bool) -> Checkpoint {
    let mut config = json!({
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "vocab_size": VOCAB, "max_position_embeddings": 256,
        "tie_word_embeddings": false, "eos_token_id": 0,
    });
    for (key, value) in family.as_object().expect("an object") {
        config[key] = value.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let parsed = mlxcel_model::ModelConfig::from_dir(dir).unwrap();
    let mut seed = seed;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    let mut overrides = serde_json::Map::new();
    for module in fused_for_phi3(&parsed) {
        let (shape, scale, center, bias) = match module.kind {
            mlxcel_model::ModuleKind::Embedding { vocab, hidden } => {
                (vec![vocab, hidden], 2.0, 0.0, None)
            }
            mlxcel_model::ModuleKind::Linear { out, inp, bias } => (
                vec![out, inp],
                2.0 / (inp as f32).sqrt(),
                0.0,
                bias.then_some(out),
            ),
            mlxcel_model::ModuleKind::Norm { dim } => (vec![dim], 0.4, 1.0, None),
        };
        let n = shape.iter().product();
        let quantized = group16
            && matches!(
                module.kind,
                mlxcel_model::ModuleKind::Linear { .. }
                    | mlxcel_model::ModuleKind::Embedding { .. }
            );
        if quantized {
            let bits = if module.name.contains("mlp") { 4 } else { 8 };
            let (rows, cols) = (shape[0], shape[1]);
            // value = k·2^-e · q − j·2^-e: an integer below 2048 times a power of two.
            let (unit, levels) = if bits == 4 {
                (1.0 / 128.0, 16u32)
            } else {
                (1.0 / 2048.0, 256u32)
            };
            let mut q = Vec::with_capacity(n);
            let (mut scales, mut biases) = (Vec::new(), Vec::new());
            for _ in 0..rows * cols / 16 {
                let k = 1 + (random(1, &mut seed, 1.0, 0.5)[0] * 3.99) as u32;
                scales.push(k as f32 * unit);
                biases.push(-((k * (levels - 1)) as f32 / 2.0).round() * unit);
                for v in random(16, &mut seed, 1.0, 0.5) {
                    q.push(((v * levels as f32) as u32).min(levels - 1) as u8);
                }
            }
            let words = mlxcel_model::pack(&q, bits);
            let word_bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let name = &module.name;
            tensors.push((
                format!("{name}.weight"),
                vec![rows, cols * bits as usize / 32],
                word_bytes,
                Dtype::U32,
            ));
            for (part, values) in [("scales", &scales), ("biases", &biases)] {
                tensors.push((
                    format!("{name}.{part}"),
                    vec![rows, cols / 16],
                    bytes(values),
                    Dtype::F32,
                ));
            }
            overrides.insert(name.clone(), json!({"bits": bits, "group_size": 16}));
            continue;
        }
        let values = random(n, &mut seed, scale, center);
        tensors.push((
            format!("{}.weight", module.name),
            shape,
            bytes(&values),
            Dtype::F32,
        ));
        if let Some(rows) = bias {
            let values = random(rows, &mut seed, 0.2, 0.0);
            tensors.push((
                format!("{}.bias", module.name),
                vec![rows],
                bytes(&values),
                Dtype::F32,
            ));
        }
    }
    // A hybrid's linear-attention layers carry tensors that are not modules: the convolution's
    // taps (Hugging Face's `[channels, 1, taps]`), `A_log` and `dt_bias`.
    for (layer, attention) in parsed.layers.iter().enumerate() {
        if let Some(net) = attention.linear {
            let a = format!("model.layers.{layer}.linear_attn");
            let shape = vec![net.conv_dim(), 1, net.conv_kernel];
            let values = random(net.conv_dim() * net.conv_kernel, &mut seed, 1.0, 0.0);
            tensors.push((
                format!("{a}.conv1d.weight"),
                shape,
                bytes(&values),
                Dtype::F32,
            ));
            for (name, center) in [("A_log", 0.0), ("dt_bias", 0.5)] {
                let values = random(net.value_heads, &mut seed, 1.0, center);
                tensors.push((
                    format!("{a}.{name}"),
                    vec![net.value_heads],
                    bytes(&values),
                    Dtype::F32,
                ));
            }
        }
    }
    if group16 {
        // Norms stay dense; every quantized module names its own spec.
        for module in fused_for_phi3(&parsed) {
            if let mlxcel_model::ModuleKind::Norm { .. } = module.kind {
                overrides.insert(module.name, Value::Bool(false));
            }
        }
        let mut quantization = json!({
            "bits": 8, "group_size": 16, "mode": mlxcel_model::GROUP16_AFFINE_MODE,
        });
        for (module, spec) in overrides {
            quantization[module] = spec;
        }
        config["quantization"] = quantization;
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, data, dtype)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    Checkpoint::open(dir).unwrap()
}

/// The modules as the file stores them: Phi-3 keeps q/k/v and gate/up fused.
fn fused_for_phi3(config: &mlxcel_model::ModelConfig) -> Vec<mlxcel_model::Module> {
    use mlxcel_model::{Module, ModuleKind};
    let modules = mlxcel_model::expected_modules(config);
    if config.architecture.fused_projections().is_empty() {
        return modules;
    }
    let mut out = Vec::new();
    for m in modules {
        let fused = |name: String, out| Module {
            name,
            kind: ModuleKind::Linear {
                out,
                inp: HIDDEN,
                bias: false,
            },
        };
        if let Some(stem) = m.name.strip_suffix(".q_proj") {
            out.push(fused(
                format!("{stem}.qkv_proj"),
                config.q_dim() + 2 * config.kv_dim(),
            ));
        } else if let Some(stem) = m.name.strip_suffix(".gate_proj") {
            out.push(fused(format!("{stem}.gate_up_proj"), 2 * FFN));
        } else if !(m.name.ends_with(".k_proj")
            || m.name.ends_with(".v_proj")
            || m.name.ends_with(".up_proj"))
        {
            out.push(m);
        }
    }
    out
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The prompt prefilled in one step, then `steps` greedy decode steps: every step's logits.
fn run(
    checkpoint: &Checkpoint,
    backend: BackendKind,
    prompt: &[u32],
    steps: usize,
) -> Vec<Vec<f32>> {
    let options = EngineOptions {
        backend,
        ..EngineOptions::default()
    };
    let mut backend = load_backend(checkpoint, &options).unwrap();
    let plan = backend
        .create_session_for_request(&RequestShape {
            prompt_len: prompt.len(),
            image_tokens: 0,
            max_new_tokens: MaxNewTokens::Limited(steps),
        })
        .unwrap();
    let slot = backend.allocate_slot(&plan).unwrap();
    let (mut input, mut position, mut all) = (prompt.to_vec(), 0, Vec::new());
    for _ in 0..=steps {
        let logits = backend
            .step(&[SequenceStep {
                slot,
                tokens: &input,
                start_position: position,
            }])
            .unwrap()
            .remove(0);
        position += input.len();
        input = vec![argmax(&logits)];
        all.push(logits);
    }
    backend.release_slot(slot);
    all
}

fn check_family(name: &str, family: Value, seed: u64) {
    check_family_with(name, family, seed, false);
}

fn check_family_with(name: &str, family: Value, seed: u64, group16: bool) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = write_tiny_with(dir.path(), &family, seed, group16);
    let prompt: Vec<u32> = (0..14).map(|i| (i * 11 + 3) % VOCAB as u32).collect();
    let mlx = run(&checkpoint, BackendKind::Mlx, &prompt, 6);
    let xla = run(&checkpoint, BackendKind::Xla, &prompt, 6);
    for (step, (a, b)) in mlx.iter().zip(&xla).enumerate() {
        let scale = a.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale,
            "{name} step {step}: MLX and OpenXLA logits differ by {worst} (scale {scale})"
        );
        assert_eq!(
            argmax(a),
            argmax(b),
            "{name} step {step}: greedy tokens differ"
        );
    }
}

#[test]
fn the_llama_baseline_agrees_on_both_backends() {
    check_family(
        "llama",
        json!({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}),
        0,
    );
}

/// A checkpoint with affine groups of 16 (what `mlxcel convert` makes of GGUF Q6_K/Q3_K/Q2_K):
/// the MLX backend runs it on mlxcel's kernels, the OpenXLA backend dequantizes it at load, and
/// both give the same logits.
#[test]
fn group16_weights_agree_on_both_backends() {
    check_family_with(
        "llama group 16",
        json!({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}),
        7,
        true,
    );
}

#[test]
fn qwen3_q_k_norms_agree_on_both_backends() {
    check_family(
        "qwen3",
        json!({"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": true,
               "num_hidden_layers": 2}),
        1,
    );
}

#[test]
fn smollm3_layers_without_rope_agree_on_both_backends() {
    check_family(
        "smollm3",
        json!({"architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 3,
               "no_rope_layer_interval": 2}),
        2,
    );
}

#[test]
fn sliding_windows_agree_on_both_backends() {
    // Every layer slides (Mistral), a window far shorter than the 14-token prompt.
    check_family(
        "mistral",
        json!({"architectures": ["MistralForCausalLM"], "num_hidden_layers": 2,
               "sliding_window": 5}),
        3,
    );
    // Only the layers from `max_window_layers` on slide (Qwen2, with its q/k/v biases).
    check_family(
        "qwen2",
        json!({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
               "use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1}),
        4,
    );
}

#[test]
fn gemma2_agrees_on_both_backends() {
    // Alternating windows (layer 0 slides over 5 of the 14 prompt positions), both soft-caps
    // set low enough to bend these small logits, a query scalar that is not head_dim.
    check_family(
        "gemma2",
        json!({"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 2,
               "sliding_window": 5, "attn_logit_softcapping": 1.0,
               "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 24}),
        5,
    );
}

#[test]
fn gemma3_agrees_on_both_backends() {
    // Local layers 0 and 2 (window 5, base 10000) around a global layer 1 (base 1e6, linear
    // scaling ×4), q/k norms.
    check_family(
        "gemma3",
        json!({"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 3,
               "sliding_window": 5, "sliding_window_pattern": 2,
               "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
        6,
    );
}

#[test]
fn phi3_agrees_on_both_backends() {
    // Fused qkv_proj and gate_up_proj in the file, half of each head rotated, LongRoPE (factors
    // per pair, the attention factor of 256 / 64 positions).
    let factors: Vec<f64> = (0..HEAD_DIM / 4).map(|i| 1.0 + 0.5 * i as f64).collect();
    check_family(
        "phi3",
        json!({"architectures": ["Phi3ForCausalLM"], "num_hidden_layers": 2,
               "partial_rotary_factor": 0.5, "original_max_position_embeddings": 64,
               "rope_scaling": {"type": "longrope", "long_factor": factors,
                                "short_factor": factors}}),
        7,
    );
}

/// A gated-DeltaNet hybrid (Qwen3.5: layers 0 and 2 linear attention) on the MLX backend: its
/// slots carry a recurrent state that the KV budget counts, sequences batched get the logits
/// they get alone, and the features that rewind or share sequence state are on (tested in
/// `hybrid_state`; the OpenXLA backend refuses the model by name: `mlxcel-xla`'s
/// `a_hybrid_model_is_refused_by_name`).
#[test]
fn a_hybrid_keeps_state_per_slot_and_batches_like_any_model() {
    let dir = tempfile::tempdir().unwrap();
    let family = json!({
        "architectures": ["Qwen3_5ForCausalLM"], "num_hidden_layers": 4,
        "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
    });
    let checkpoint = write_tiny_with(dir.path(), &family, 77, false);
    let prompts: [Vec<u32>; 2] = [
        (0..90).map(|i| (i * 7 + 1) % VOCAB as u32).collect(),
        (0..9).map(|i| (i * 5 + 2) % VOCAB as u32).collect(),
    ];
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| run(&checkpoint, BackendKind::Mlx, p, 3))
        .collect();

    let options = EngineOptions {
        backend: BackendKind::Mlx,
        ..EngineOptions::default()
    };
    let mut backend = load_backend(&checkpoint, &options).unwrap();
    assert!(backend.recurrent_state());
    assert!(backend.can_copy_prefix() && backend.can_score());
    // Per linear layer: the convolution's last 3 rows of 2·32 + 32 channels, 4 heads of 8 × 16.
    let state = 2 * 4 * (3 * 96 + 4 * 8 * 16);
    // One block of 256 positions of the two attention layers' f32 keys and values.
    let block = 256 * 2 * KV_HEADS * HEAD_DIM * 2 * 4;
    let mut slots = Vec::new();
    for p in &prompts {
        let plan = backend
            .create_session_for_request(&RequestShape {
                prompt_len: p.len(),
                image_tokens: 0,
                max_new_tokens: MaxNewTokens::Limited(3),
            })
            .unwrap();
        slots.push(backend.allocate_slot(&plan).unwrap());
    }
    assert_eq!(backend.kv_usage().unwrap().0, 2 * (block + state));
    // Both prefills in one step, then decode steps of both.
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    let mut positions = [0usize; 2];
    // Each step's rows alone, in sequence order.
    let per_step: Vec<Vec<&Vec<f32>>> = (0..=3)
        .map(|step| alone.iter().map(|steps| &steps[step]).collect())
        .collect();
    for (step, wants) in per_step.iter().enumerate() {
        let batch: Vec<SequenceStep<'_>> = slots
            .iter()
            .zip(&inputs)
            .zip(positions)
            .map(|((&slot, tokens), start_position)| SequenceStep {
                slot,
                tokens,
                start_position,
            })
            .collect();
        let logits = backend.step(&batch).unwrap();
        for (i, row) in logits.iter().enumerate() {
            let want = wants[i];
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            let worst = row
                .iter()
                .zip(want)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(worst <= 1e-5 * scale, "sequence {i} step {step}: {worst}");
            positions[i] += inputs[i].len();
            inputs[i] = vec![argmax(row)];
        }
    }
    // Slot files: the attention layers' keys and values, and the state after the positions
    // held; a state the slot kept no copy of is refused by name.
    let held = positions[0];
    assert_eq!(
        backend.export_kv(slots[0], held).unwrap().len(),
        held * 2 * KV_HEADS * HEAD_DIM * 2
    );
    assert_eq!(
        backend.export_state(slots[0], held).unwrap().len() * 4,
        state
    );
    let err = backend.export_state(slots[0], 10).unwrap_err().to_string();
    assert!(
        err.contains("linear-attention state of a hybrid model"),
        "{err}"
    );
    for slot in slots {
        backend.release_slot(slot);
    }
    assert_eq!(backend.kv_usage().unwrap().0, 0);
}
