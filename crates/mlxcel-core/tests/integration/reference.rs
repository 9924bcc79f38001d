//! The llama forward against a plain-Rust f32 reference, on tiny random checkpoints written by the
//! test itself: dense (f32, f16, bf16) and 4/8-bit quantized weights, Qwen2 biases, llama3 RoPE,
//! Qwen3's q/k norms, SmolLM3's layers without RoPE, Mistral's sliding window, Gemma 2 and 3
//! (scaled embeddings, `1 + w` norms before and after attention and MLP, GeGLU, soft-capping,
//! alternating windows, a local RoPE base), routed-expert MLPs (Qwen3-MoE; `experts.rs` holds
//! their tests) and OLMoE's q/k norms over whole projections, tied and untied output; prefill,
//! several decode steps, and batches of different lengths.

use std::collections::HashMap;
use std::path::Path;

use mlxcel_core::{Activations, ForwardSeq, KV_CHUNK, KernelBackend, Kernels, LlamaModel};
use mlxcel_model::{
    Checkpoint, FeedForward, ModelConfig, QuantSpec, Routing, SafetensorsFiles, dequantize_affine,
    pack,
};
use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView;

use crate::{argmax, greedy, pseudo_random};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const FFN: usize = 128;
const LAYERS: usize = 2;
const VOCAB: usize = 96;
const EPS: f32 = 1e-5;
const THETA: f32 = 10_000.0;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Storage {
    F32,
    F16,
    BF16,
    /// `f16_scales`: scales and biases stored as f16 (as GGUF conversions store them).
    Quantized {
        bits: u32,
        group_size: usize,
        f16_scales: bool,
    },
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Variant {
    pub(crate) storage: Storage,
    pub(crate) qwen2_biases: bool,
    pub(crate) llama3_rope: bool,
    pub(crate) tied: bool,
    /// Qwen3: a per-head RMSNorm on q and k before RoPE.
    pub(crate) qk_norm: bool,
    /// SmolLM3 with `no_rope_layer_interval` 2: the second layer has no RoPE.
    pub(crate) nope: bool,
    /// Mistral: every layer attends to this many positions (itself included).
    pub(crate) window: Option<usize>,
    /// Gemma 2 or 3 (2 or 3): the first layer slides over [`GEMMA_WINDOW`], the second is global.
    pub(crate) gemma: Option<u8>,
    /// Phi-3: fused `qkv_proj`/`gate_up_proj` in the file, half the head rotated, LongRoPE.
    pub(crate) phi3: bool,
    /// v stored otherwise than q and k (llama.cpp's Q4_K_M keeps v in Q6_K beside Q4_K q and k;
    /// or dense beside quantized weights): a per-module entry in the config's `quantization`.
    pub(crate) v_storage: Option<Storage>,
    /// OLMoE: `qk_norm` spans the whole q and k projections (`[q_dim]`, `[kv_dim]`).
    pub(crate) qk_norm_whole: bool,
    /// A Qwen3-MoE checkpoint whose MLPs are routed experts.
    pub(crate) moe: Option<Moe>,
    /// gpt-oss's attention sinks: a `self_attn.sinks` logit per head in every layer's softmax
    /// (`ModelConfig::attention_sinks`, set on the parsed config as the family will set it).
    pub(crate) sinks: bool,
}

/// A routed-expert MLP's shape and routing, written as a `qwen3_moe` config; the routings and
/// the shared expert Qwen3-MoE does not have are set on the validated config before loading.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moe {
    pub(crate) experts: usize,
    pub(crate) top_k: usize,
    pub(crate) ffn: usize,
    pub(crate) routing: Routing,
    /// A shared expert of this hidden size (Qwen2-MoE).
    pub(crate) shared: Option<usize>,
    /// The first layer keeps a dense MLP (`mlp_only_layers: [0]`).
    pub(crate) dense_first: bool,
}

impl Moe {
    /// Whether layer `layer` routes.
    fn routes(&self, layer: usize) -> bool {
        !(self.dense_first && layer == 0)
    }
}

/// Phi-3 variants: the rotated features, the positions, and the LongRoPE factors (one per pair).
const PHI3_ROTARY: usize = HEAD_DIM / 2;
const PHI3_ORIGINAL: usize = 64;
fn phi3_factors() -> Vec<f32> {
    (0..PHI3_ROTARY / 2)
        .map(|i| 1.0 + 0.25 * i as f32)
        .collect()
}
/// √(1 + ln(1024 / 64) / ln 64): LongRoPE's default attention factor.
fn phi3_mscale() -> f32 {
    (1.0 + (1024f64 / PHI3_ORIGINAL as f64).ln() / (PHI3_ORIGINAL as f64).ln()).sqrt() as f32
}

/// Gemma variants' constants: the first layer's window, Gemma 2's caps, the attention scalar,
/// Gemma 3's bases and linear scaling of the global layer.
const GEMMA_WINDOW: usize = 4;
const GEMMA_ATTN_CAP: f32 = 1.0;
const GEMMA_FINAL_CAP: f32 = 3.0;
const GEMMA_QUERY_SCALAR: f32 = 32.0;
const GEMMA3_GLOBAL_THETA: f32 = 1_000_000.0;
const GEMMA3_LINEAR: f32 = 4.0;

/// The family features a variant does not switch on.
pub(crate) const PLAIN: Variant = Variant {
    storage: Storage::F32,
    qwen2_biases: false,
    llama3_rope: false,
    tied: false,
    qk_norm: false,
    nope: false,
    window: None,
    gemma: None,
    phi3: false,
    v_storage: None,
    qk_norm_whole: false,
    moe: None,
    sinks: false,
};

/// Llama 3 scaling parameters used by the `llama3_rope` variants.
const LLAMA3: (f32, f32, f32, f32) = (8.0, 1.0, 4.0, 64.0);

/// A tiny checkpoint on disk plus the f32 values the reference computes with (exactly the values
/// the file encodes, after rounding or dequantization).
pub(crate) struct Tiny {
    dir: tempfile::TempDir,
    weights: HashMap<String, Vec<f32>>,
    variant: Variant,
}

fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Collects a tiny checkpoint's tensors (as file bytes) and the f32 values they encode.
struct Builder {
    variant: Variant,
    seed: u64,
    tensors: Vec<(String, StDtype, Vec<usize>, Vec<u8>)>,
    weights: HashMap<String, Vec<f32>>,
}

impl Builder {
    fn random(&mut self, n: usize, scale: f32) -> Vec<f32> {
        self.seed += 1;
        pseudo_random(n, self.seed)
            .into_iter()
            .map(|x| x * scale)
            .collect()
    }

    /// A float tensor stored as `storage` (f32 for anything but f16/bf16).
    fn float(&mut self, name: String, shape: Vec<usize>, values: Vec<f32>, storage: Storage) {
        let (dtype, rounded, bytes): (StDtype, Vec<f32>, Vec<u8>) = match storage {
            Storage::F16 => {
                let r: Vec<f32> = values.iter().map(|&x| round_f16(x)).collect();
                let b = r
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect();
                (StDtype::F16, r, b)
            }
            Storage::BF16 => {
                let r: Vec<f32> = values.iter().map(|&x| round_bf16(x)).collect();
                let b = r
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect();
                (StDtype::BF16, r, b)
            }
            _ => {
                let b = values.iter().flat_map(|x| x.to_le_bytes()).collect();
                (StDtype::F32, values, b)
            }
        };
        self.tensors.push((name.clone(), dtype, shape, bytes));
        self.weights.insert(name, rounded);
    }

    /// Norm weights are f32 around 1.
    fn norm(&mut self, name: String) {
        self.norm_of(name, HIDDEN);
    }

    fn norm_of(&mut self, name: String, dim: usize) {
        // Gemma stores norms as offsets from one.
        let center = if self.variant.gemma.is_some() {
            0.0
        } else {
            1.0
        };
        let values = self.random(dim, 0.1).iter().map(|x| center + x).collect();
        self.float(name, vec![dim], values, Storage::F32);
    }

    /// Several matrices stacked by rows under one name (Phi-3's fused projections); the reference
    /// gets each part under its own name, next to the fused module (`…qkv_proj` → `…q_proj`).
    fn fused(&mut self, module: &str, parts: &[(&str, usize)], cols: usize) {
        let rows: usize = parts.iter().map(|(_, r)| r).sum();
        self.matrix(module, rows, cols);
        let all = self.weights[&format!("{module}.weight")].clone();
        let stem = module.rsplit_once('.').expect("a dotted module").0;
        let mut row = 0;
        for (name, part_rows) in parts {
            let values = all[row * cols..(row + part_rows) * cols].to_vec();
            self.weights.insert(format!("{stem}.{name}.weight"), values);
            row += part_rows;
        }
    }

    /// A `[rows, cols]` matrix in the variant's storage; the reference gets the exact values the
    /// file encodes (rounded, or dequantized with mlxcel-model's reference dequantizer).
    fn matrix(&mut self, module: &str, rows: usize, cols: usize) {
        self.matrix_stored(module, rows, cols, self.variant.storage);
    }

    /// [`Builder::matrix`] in a given storage.
    fn matrix_stored(&mut self, module: &str, rows: usize, cols: usize, storage: Storage) {
        let values = self.random(rows * cols, 1.0);
        match storage {
            Storage::Quantized {
                bits,
                group_size,
                f16_scales,
            } => {
                let levels = (1u32 << bits) as f32;
                let q: Vec<u8> = values
                    .iter()
                    .map(|&x| ((x + 1.0) / 2.0 * levels).floor().clamp(0.0, levels - 1.0) as u8)
                    .collect();
                let packed: Vec<u8> = q
                    .chunks_exact(cols)
                    .flat_map(|row| pack(row, bits))
                    .flat_map(u32::to_le_bytes)
                    .collect();
                let groups = cols / group_size;
                let scales: Vec<f32> = self
                    .random(rows * groups, 1.0)
                    .iter()
                    .map(|s| 0.02 + s.abs() * 0.05)
                    .collect();
                // Centred (bias ≈ -scale·(levels - 1)/2, as real quantizers produce), so that
                // the weights have no common offset that would swamp the rest of the model.
                let offsets = self.random(rows * groups, 0.1);
                let biases: Vec<f32> = scales
                    .iter()
                    .zip(&offsets)
                    .map(|(s, o)| -s * (levels - 1.0) / 2.0 + o * s)
                    .collect();
                let (dtype, st_dtype) = if f16_scales {
                    (mlxcel_model::Dtype::F16, StDtype::F16)
                } else {
                    (mlxcel_model::Dtype::F32, StDtype::F32)
                };
                let bytes = |v: &[f32]| -> Vec<u8> {
                    if f16_scales {
                        v.iter()
                            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                            .collect()
                    } else {
                        v.iter().flat_map(|x| x.to_le_bytes()).collect()
                    }
                };
                let (sb, bb) = (bytes(&scales), bytes(&biases));
                let dequantized = dequantize_affine(
                    QuantSpec { bits, group_size },
                    rows,
                    cols,
                    &packed,
                    (dtype, &sb),
                    (dtype, &bb),
                )
                .expect("consistent sizes");
                let packed_shape = vec![rows, cols * bits as usize / 32];
                self.tensors.push((
                    format!("{module}.weight"),
                    StDtype::U32,
                    packed_shape,
                    packed,
                ));
                self.tensors
                    .push((format!("{module}.scales"), st_dtype, vec![rows, groups], sb));
                self.tensors
                    .push((format!("{module}.biases"), st_dtype, vec![rows, groups], bb));
                self.weights.insert(format!("{module}.weight"), dequantized);
            }
            storage => {
                let scaled = values.iter().map(|x| x * 0.2).collect();
                self.float(
                    format!("{module}.weight"),
                    vec![rows, cols],
                    scaled,
                    storage,
                );
            }
        }
    }
}

pub(crate) fn write_tiny(variant: Variant, seed: u64) -> Tiny {
    let mut b = Builder {
        variant,
        seed,
        tensors: Vec::new(),
        weights: HashMap::new(),
    };
    b.matrix("model.embed_tokens", VOCAB, HIDDEN);
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        b.norm(format!("{p}.input_layernorm.weight"));
        if variant.phi3 {
            b.fused(
                &format!("{p}.self_attn.qkv_proj"),
                &[
                    ("q_proj", HEADS * HEAD_DIM),
                    ("k_proj", KV_HEADS * HEAD_DIM),
                    ("v_proj", KV_HEADS * HEAD_DIM),
                ],
                HIDDEN,
            );
        } else {
            b.matrix(&format!("{p}.self_attn.q_proj"), HEADS * HEAD_DIM, HIDDEN);
            b.matrix(
                &format!("{p}.self_attn.k_proj"),
                KV_HEADS * HEAD_DIM,
                HIDDEN,
            );
            b.matrix_stored(
                &format!("{p}.self_attn.v_proj"),
                KV_HEADS * HEAD_DIM,
                HIDDEN,
                variant.v_storage.unwrap_or(variant.storage),
            );
        }
        b.matrix(&format!("{p}.self_attn.o_proj"), HIDDEN, HEADS * HEAD_DIM);
        if variant.qwen2_biases {
            for (proj, rows) in [
                ("q_proj", HEADS * HEAD_DIM),
                ("k_proj", KV_HEADS * HEAD_DIM),
                ("v_proj", KV_HEADS * HEAD_DIM),
            ] {
                let bias = b.random(rows, 0.1);
                b.float(
                    format!("{p}.self_attn.{proj}.bias"),
                    vec![rows],
                    bias,
                    Storage::F32,
                );
            }
        }
        if variant.qk_norm || variant.gemma == Some(3) {
            let (q, k) = if variant.qk_norm_whole {
                (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)
            } else {
                (HEAD_DIM, HEAD_DIM)
            };
            b.norm_of(format!("{p}.self_attn.q_norm.weight"), q);
            b.norm_of(format!("{p}.self_attn.k_norm.weight"), k);
        }
        b.norm(format!("{p}.post_attention_layernorm.weight"));
        if variant.gemma.is_some() {
            b.norm(format!("{p}.pre_feedforward_layernorm.weight"));
            b.norm(format!("{p}.post_feedforward_layernorm.weight"));
        }
        if let Some(moe) = variant.moe.filter(|m| m.routes(layer)) {
            b.matrix(&format!("{p}.mlp.gate"), moe.experts, HIDDEN);
            let mut mlps: Vec<(String, usize)> = (0..moe.experts)
                .map(|j| (format!("{p}.mlp.experts.{j}"), moe.ffn))
                .collect();
            if let Some(shared) = moe.shared {
                b.matrix(&format!("{p}.mlp.shared_expert_gate"), 1, HIDDEN);
                mlps.push((format!("{p}.mlp.shared_expert"), shared));
            }
            for (mlp, ffn) in mlps {
                b.matrix(&format!("{mlp}.gate_proj"), ffn, HIDDEN);
                b.matrix(&format!("{mlp}.up_proj"), ffn, HIDDEN);
                b.matrix(&format!("{mlp}.down_proj"), HIDDEN, ffn);
            }
            continue;
        }
        if variant.phi3 {
            b.fused(
                &format!("{p}.mlp.gate_up_proj"),
                &[("gate_proj", FFN), ("up_proj", FFN)],
                HIDDEN,
            );
        } else {
            b.matrix(&format!("{p}.mlp.gate_proj"), FFN, HIDDEN);
            b.matrix(&format!("{p}.mlp.up_proj"), FFN, HIDDEN);
        }
        b.matrix(&format!("{p}.mlp.down_proj"), HIDDEN, FFN);
        if variant.sinks {
            // Logits of the scores' size and beyond, stored as f32 (the loader widens others).
            let sinks = b.random(HEADS, 3.0);
            let bytes = sinks.iter().flat_map(|v| v.to_le_bytes()).collect();
            let name = format!("{p}.self_attn.sinks");
            b.tensors
                .push((name.clone(), StDtype::F32, vec![HEADS], bytes));
            b.weights.insert(name, sinks);
        }
    }
    b.norm("model.norm.weight".into());
    if !variant.tied {
        b.matrix("lm_head", VOCAB, HIDDEN);
    }

    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), variant);
    let views: Vec<(String, TensorView<'_>)> = b
        .tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    Tiny {
        dir,
        weights: b.weights,
        variant,
    }
}

fn write_config(dir: &Path, variant: Variant) {
    let (architecture, model_type) = if variant.phi3 {
        ("Phi3ForCausalLM", "phi3")
    } else if variant.gemma == Some(2) {
        ("Gemma2ForCausalLM", "gemma2")
    } else if variant.gemma == Some(3) {
        ("Gemma3ForCausalLM", "gemma3_text")
    } else if variant.moe.is_some() {
        ("Qwen3MoeForCausalLM", "qwen3_moe")
    } else if variant.qwen2_biases {
        ("Qwen2ForCausalLM", "qwen2")
    } else if variant.qk_norm {
        ("Qwen3ForCausalLM", "qwen3")
    } else if variant.nope {
        ("SmolLM3ForCausalLM", "smollm3")
    } else if variant.window.is_some() {
        ("MistralForCausalLM", "mistral")
    } else {
        ("LlamaForCausalLM", "llama")
    };
    let mut config = serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "vocab_size": VOCAB,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": variant.tied,
        "eos_token_id": 0,
    });
    if variant.nope {
        config["no_rope_layer_interval"] = serde_json::json!(2);
    }
    if let Some(moe) = variant.moe {
        config["num_experts"] = serde_json::json!(moe.experts);
        config["num_experts_per_tok"] = serde_json::json!(moe.top_k);
        config["moe_intermediate_size"] = serde_json::json!(moe.ffn);
        config["norm_topk_prob"] = serde_json::json!(matches!(
            moe.routing,
            Routing::SoftmaxTopK { renormalize: true }
        ));
        config["decoder_sparse_step"] = serde_json::json!(1);
        let dense: Vec<usize> = (0..LAYERS).filter(|&l| !moe.routes(l)).collect();
        config["mlp_only_layers"] = serde_json::json!(dense);
    }
    if variant.phi3 {
        config["partial_rotary_factor"] = serde_json::json!(0.5);
        config["original_max_position_embeddings"] = serde_json::json!(PHI3_ORIGINAL);
        config["rope_scaling"] = serde_json::json!({
            "type": "longrope", "long_factor": phi3_factors(), "short_factor": phi3_factors(),
        });
    }
    if let Some(version) = variant.gemma {
        config["sliding_window"] = serde_json::json!(GEMMA_WINDOW);
        config["query_pre_attn_scalar"] = serde_json::json!(GEMMA_QUERY_SCALAR);
        if version == 2 {
            config["attn_logit_softcapping"] = serde_json::json!(GEMMA_ATTN_CAP);
            config["final_logit_softcapping"] = serde_json::json!(GEMMA_FINAL_CAP);
        } else {
            config["sliding_window_pattern"] = serde_json::json!(2);
            config["rope_local_base_freq"] = serde_json::json!(THETA);
            config["rope_theta"] = serde_json::json!(GEMMA3_GLOBAL_THETA);
            config["rope_scaling"] =
                serde_json::json!({"rope_type": "linear", "factor": GEMMA3_LINEAR});
        }
    }
    if let Some(window) = variant.window {
        config["sliding_window"] = serde_json::json!(window);
    }
    if variant.llama3_rope {
        let (factor, low, high, original) = LLAMA3;
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original as usize,
        });
    }
    if let Storage::Quantized {
        bits, group_size, ..
    } = variant.storage
    {
        config["quantization"] = serde_json::json!({"bits": bits, "group_size": group_size});
        let mut group16 = group_size == 16;
        match variant.v_storage {
            Some(Storage::Quantized {
                bits, group_size, ..
            }) => {
                for layer in 0..LAYERS {
                    config["quantization"][format!("model.layers.{layer}.self_attn.v_proj")] =
                        serde_json::json!({"bits": bits, "group_size": group_size});
                }
                group16 |= group_size == 16;
            }
            // A dense v beside quantized weights: left out of the quantization, as mlx-lm
            // writes a module it did not quantize.
            Some(_) => {
                for layer in 0..LAYERS {
                    config["quantization"][format!("model.layers.{layer}.self_attn.v_proj")] =
                        serde_json::json!(false);
                }
            }
            None => {}
        }
        if group16 {
            // Groups of 16 (GGUF Q6_K/Q3_K/Q2_K) are mlxcel's extension of MLX's format.
            config["quantization"]["mode"] = serde_json::json!(mlxcel_model::GROUP16_AFFINE_MODE);
        }
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
}

/// The plain-Rust forward: every position of `tokens` (the whole sequence so far), last logits.
fn reference_logits(tiny: &Tiny, tokens: &[u32]) -> Vec<f32> {
    let w = |name: &str| -> &[f32] { &tiny.weights[name] };
    let n = tokens.len();
    let linear =
        |x: &[f32], weight: &[f32], bias: Option<&[f32]>, rows: usize, cols: usize| -> Vec<f32> {
            let mut out = vec![0.0; x.len() / cols * rows];
            for (t, xin) in x.chunks_exact(cols).enumerate() {
                for r in 0..rows {
                    let mut acc = bias.map_or(0.0, |b| b[r]);
                    for c in 0..cols {
                        acc += xin[c] * weight[r * cols + c];
                    }
                    out[t * rows + r] = acc;
                }
            }
            out
        };
    let gemma = tiny.variant.gemma;
    // Gemma's norms multiply by 1 + w.
    let offset = if gemma.is_some() { 1.0 } else { 0.0 };
    let rms_of = |x: &[f32], weight: &[f32], dim: usize| -> Vec<f32> {
        x.chunks_exact(dim)
            .flat_map(|row| {
                let mean = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                let inv = 1.0 / (mean + EPS).sqrt();
                row.iter()
                    .zip(weight)
                    .map(move |(v, g)| v * inv * (g + offset))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let rms = |x: &[f32], weight: &[f32]| rms_of(x, weight, HIDDEN);
    let periods: Vec<f32> = if tiny.variant.llama3_rope {
        let (factor, low, high, original) = LLAMA3;
        // Llama 3.1's schedule, written out independently of the implementation.
        (0..HEAD_DIM / 2)
            .map(|i| {
                let period = THETA.powf((2 * i) as f32 / HEAD_DIM as f32);
                let wavelen = 2.0 * std::f32::consts::PI * period;
                if wavelen > original / low {
                    period * factor
                } else if wavelen < original / high {
                    period
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    period / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect()
    } else {
        (0..HEAD_DIM / 2)
            .map(|i| THETA.powf((2 * i) as f32 / HEAD_DIM as f32))
            .collect()
    };
    // Gemma 3: the sliding first layer rotates with THETA, the global second with the global
    // base stretched by the linear factor.
    let gemma3_global: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|i| GEMMA3_GLOBAL_THETA.powf((2 * i) as f32 / HEAD_DIM as f32) * GEMMA3_LINEAR)
        .collect();
    // Phi-3: the first PHI3_ROTARY features rotate, with LongRoPE's factors on the periods and
    // its attention factor on the rotated features.
    let phi3_periods: Vec<f32> = (0..PHI3_ROTARY / 2)
        .zip(phi3_factors())
        .map(|(i, f)| THETA.powf((2 * i) as f32 / PHI3_ROTARY as f32) * f)
        .collect();
    let rope = |x: &mut [f32], heads: usize, layer: usize| {
        let (periods, rotary, mscale) = if tiny.variant.phi3 {
            (&phi3_periods, PHI3_ROTARY, phi3_mscale())
        } else if gemma == Some(3) && layer == 1 {
            (&gemma3_global, HEAD_DIM, 1.0)
        } else {
            (&periods, HEAD_DIM, 1.0)
        };
        let half = rotary / 2;
        for (pos, row) in x.chunks_exact_mut(heads * HEAD_DIM).enumerate() {
            for head in row.chunks_exact_mut(HEAD_DIM) {
                for i in 0..half {
                    let angle = pos as f32 / periods[i];
                    let (sin, cos) = angle.sin_cos();
                    let (a, b) = (head[i] * mscale, head[i + half] * mscale);
                    head[i] = a * cos - b * sin;
                    head[i + half] = a * sin + b * cos;
                }
            }
        }
    };

    let mut x: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| w("model.embed_tokens.weight")[t as usize * HIDDEN..][..HIDDEN].to_vec())
        .collect();
    if gemma.is_some() {
        // √64 = 8, exact in bf16.
        x.iter_mut().for_each(|v| *v *= (HIDDEN as f32).sqrt());
    }
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        let bias = |proj: &str| {
            tiny.variant
                .qwen2_biases
                .then(|| w(&format!("{p}.self_attn.{proj}.bias")))
        };
        let h = rms(&x, w(&format!("{p}.input_layernorm.weight")));
        let mut q = linear(
            &h,
            w(&format!("{p}.self_attn.q_proj.weight")),
            bias("q_proj"),
            HEADS * HEAD_DIM,
            HIDDEN,
        );
        let mut k = linear(
            &h,
            w(&format!("{p}.self_attn.k_proj.weight")),
            bias("k_proj"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
        );
        let v = linear(
            &h,
            w(&format!("{p}.self_attn.v_proj.weight")),
            bias("v_proj"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
        );
        if tiny.variant.qk_norm || gemma == Some(3) {
            for (m, heads, norm) in [(&mut q, HEADS, "q_norm"), (&mut k, KV_HEADS, "k_norm")] {
                // Per head, or (OLMoE) over the whole projection.
                let dim = if tiny.variant.qk_norm_whole {
                    heads * HEAD_DIM
                } else {
                    HEAD_DIM
                };
                let normed = rms_of(m, w(&format!("{p}.self_attn.{norm}.weight")), dim);
                assert_eq!(normed.len(), n * heads * HEAD_DIM);
                *m = normed;
            }
        }
        // SmolLM3 with interval 2: every second layer has no RoPE.
        if !(tiny.variant.nope && layer % 2 == 1) {
            rope(&mut q, HEADS, layer);
            rope(&mut k, KV_HEADS, layer);
        }
        // Gemma: the first layer slides, the second is global.
        let window = match gemma {
            Some(_) if layer == 0 => Some(GEMMA_WINDOW),
            Some(_) => None,
            None => tiny.variant.window,
        };
        let mut attended = vec![0.0; n * HEADS * HEAD_DIM];
        let scale = if gemma.is_some() {
            1.0 / GEMMA_QUERY_SCALAR.sqrt()
        } else {
            1.0 / (HEAD_DIM as f32).sqrt()
        };
        let cap = (gemma == Some(2)).then_some(GEMMA_ATTN_CAP);
        for head in 0..HEADS {
            let kv = head / (HEADS / KV_HEADS);
            for i in 0..n {
                let qi = &q[i * HEADS * HEAD_DIM + head * HEAD_DIM..][..HEAD_DIM];
                let first = window.map_or(0, |w| (i + 1).saturating_sub(w));
                let scores: Vec<f32> = (first..=i)
                    .map(|j| {
                        let kj = &k[j * KV_HEADS * HEAD_DIM + kv * HEAD_DIM..][..HEAD_DIM];
                        let s = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                        cap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                // A sink joins the softmax's denominator and brings no value.
                let sink = tiny
                    .variant
                    .sinks
                    .then(|| w(&format!("{p}.self_attn.sinks"))[head]);
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = exps.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - max).exp());
                for (j, e) in (first..=i).zip(&exps) {
                    let vj = &v[j * KV_HEADS * HEAD_DIM + kv * HEAD_DIM..][..HEAD_DIM];
                    for d in 0..HEAD_DIM {
                        attended[i * HEADS * HEAD_DIM + head * HEAD_DIM + d] += e / total * vj[d];
                    }
                }
            }
        }
        let o = linear(
            &attended,
            w(&format!("{p}.self_attn.o_proj.weight")),
            None,
            HIDDEN,
            HEADS * HEAD_DIM,
        );
        let (o, mlp_norm) = match gemma {
            Some(_) => (
                rms(&o, w(&format!("{p}.post_attention_layernorm.weight"))),
                "pre_feedforward_layernorm",
            ),
            None => (o, "post_attention_layernorm"),
        };
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let h = rms(&x, w(&format!("{p}.{mlp_norm}.weight")));
        if let Some(moe) = tiny.variant.moe.filter(|m| m.routes(layer)) {
            let out = reference_moe(&h, &p, moe, &tiny.weights);
            x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
            continue;
        }
        let gate = linear(
            &h,
            w(&format!("{p}.mlp.gate_proj.weight")),
            None,
            FFN,
            HIDDEN,
        );
        let up = linear(&h, w(&format!("{p}.mlp.up_proj.weight")), None, FFN, HIDDEN);
        let act: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, u)| {
                let activated = if gemma.is_some() {
                    let c = (2.0 / std::f32::consts::PI).sqrt();
                    0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh())
                } else {
                    g / (1.0 + (-g).exp())
                };
                activated * u
            })
            .collect();
        let down = linear(
            &act,
            w(&format!("{p}.mlp.down_proj.weight")),
            None,
            HIDDEN,
            FFN,
        );
        let down = match gemma {
            Some(_) => rms(&down, w(&format!("{p}.post_feedforward_layernorm.weight"))),
            None => down,
        };
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
    }
    let last = rms(&x[(n - 1) * HIDDEN..], w("model.norm.weight"));
    let head = if tiny.variant.tied {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    let logits = linear(&last, w(head), None, VOCAB, HIDDEN);
    match gemma {
        Some(2) => logits
            .iter()
            .map(|l| GEMMA_FINAL_CAP * (l / GEMMA_FINAL_CAP).tanh())
            .collect(),
        _ => logits,
    }
}

/// The routed-expert MLP of normed rows `h` in layer `p`, one token at a time: the router's
/// logits, softmax and top-k in f32 as mlx-lm computes them, then every chosen expert's dense
/// gated MLP, weighted, plus the shared expert gated by its sigmoid.
fn reference_moe(h: &[f32], p: &str, moe: Moe, weights: &HashMap<String, Vec<f32>>) -> Vec<f32> {
    let w = |name: &str| -> &[f32] { &weights[name] };
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let softmax = |v: &[f32]| -> Vec<f32> {
        let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = v.iter().map(|x| (x - max).exp()).collect();
        let total: f32 = e.iter().sum();
        e.iter().map(|x| x / total).collect()
    };
    let top = |v: &[f32]| -> Vec<usize> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
        order.truncate(moe.top_k);
        order
    };
    let mlp = |x: &[f32], prefix: &str, ffn: usize| -> Vec<f32> {
        let gate = w(&format!("{prefix}.gate_proj.weight"));
        let up = w(&format!("{prefix}.up_proj.weight"));
        let down = w(&format!("{prefix}.down_proj.weight"));
        let act: Vec<f32> = (0..ffn)
            .map(|r| {
                let g = dot(x, &gate[r * HIDDEN..][..HIDDEN]);
                let u = dot(x, &up[r * HIDDEN..][..HIDDEN]);
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        (0..HIDDEN)
            .map(|r| dot(&act, &down[r * ffn..][..ffn]))
            .collect()
    };
    let router = w(&format!("{p}.mlp.gate.weight"));
    let mut out = Vec::with_capacity(h.len());
    for x in h.chunks_exact(HIDDEN) {
        let logits: Vec<f32> = (0..moe.experts)
            .map(|e| dot(x, &router[e * HIDDEN..][..HIDDEN]))
            .collect();
        let (chosen, scores) = match moe.routing {
            Routing::SoftmaxTopK { renormalize } => {
                let probs = softmax(&logits);
                let chosen = top(&probs);
                let mut scores: Vec<f32> = chosen.iter().map(|&e| probs[e]).collect();
                if renormalize {
                    let total: f32 = scores.iter().sum();
                    scores.iter_mut().for_each(|s| *s /= total);
                }
                (chosen, scores)
            }
            Routing::TopKSoftmax => {
                let chosen = top(&logits);
                let picked: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
                (chosen, softmax(&picked))
            }
            Routing::SigmoidTopK { .. } => {
                panic!(
                    "the reference model routes by softmax only (LFM2-MoE is checked by the family oracle)"
                )
            }
        };
        let mut y = vec![0.0f32; HIDDEN];
        for (e, s) in chosen.iter().zip(&scores) {
            let expert = mlp(x, &format!("{p}.mlp.experts.{e}"), moe.ffn);
            y.iter_mut().zip(&expert).for_each(|(a, b)| *a += s * b);
        }
        if let Some(shared) = moe.shared {
            let gate = dot(x, w(&format!("{p}.mlp.shared_expert_gate.weight")));
            let sigmoid = 1.0 / (1.0 + (-gate).exp());
            let expert = mlp(x, &format!("{p}.mlp.shared_expert"), shared);
            y.iter_mut()
                .zip(&expert)
                .for_each(|(a, b)| *a += sigmoid * b);
        }
        out.extend(y);
    }
    out
}

/// Opens a tiny checkpoint, with the features its config.json cannot say set on the validated
/// config first (no family yet writes OLMoE's whole q/k norms, another routing, or a shared
/// expert into a `qwen3_moe` config).
pub(crate) fn open_tiny(tiny: &Tiny) -> Checkpoint {
    let dir = tiny.dir.path();
    let mut config = ModelConfig::from_dir(dir).expect("the tiny config validates");
    config.qk_norm_whole = tiny.variant.qk_norm_whole;
    config.attention_sinks = tiny.variant.sinks;
    if let Some(moe) = tiny.variant.moe {
        for ffn in &mut config.feed_forward {
            if let FeedForward::RoutedExperts(routed) = ffn {
                routed.routing = moe.routing;
                routed.shared_expert_intermediate_size = moe.shared;
            }
        }
    }
    let files = SafetensorsFiles::open_dir(dir).expect("the tiny safetensors open");
    Checkpoint::new(dir, config, files).expect("the tiny checkpoint validates")
}

/// Relative closeness: |a - e| ≤ tol · max(1, max |e|) over the whole vector.
#[track_caller]
pub(crate) fn assert_logits_close(actual: &[f32], expected: &[f32], tol: f32, what: &str) {
    let scale = expected.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = actual
        .iter()
        .zip(expected)
        .map(|(a, e)| (a - e).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol * scale,
        "{what}: max |Δ| = {worst} > {tol} × {scale}"
    );
}

fn check_variant(variant: Variant, seed: u64) {
    check_variant_on(variant, seed, None);
    // Where f32 activations read quantized weights in the int8 layout (AVX-512), MLX's layout
    // (`MLXCEL_F32_LAYOUT=mlx`) too.
    let kernels = Kernels::from_env().unwrap();
    if matches!(variant.storage, Storage::Quantized { .. })
        && kernels.activations == Activations::F32
        && kernels.int8_layout_weights()
    {
        let mlx = Kernels {
            f32_layout: mlxcel_core::F32Layout::Mlx,
            ..kernels
        };
        assert!(!mlx.int8_layout_weights());
        check_variant_on(variant, seed, Some(mlx));
    }
}

/// [`check_variant`] on the given kernels (`None`: the environment's). With int8 activations
/// the logits are held to the loose bound of the dense int8 checks (0.15: random tiny weights
/// give wide activations) instead of 1e-4.
pub(crate) fn check_variant_on(variant: Variant, seed: u64, kernels: Option<Kernels>) {
    let tiny = write_tiny(variant, seed);
    let checkpoint = open_tiny(&tiny);
    let model = match kernels {
        Some(k) => LlamaModel::load_with(&checkpoint, k),
        None => LlamaModel::load(&checkpoint),
    }
    .expect("the tiny checkpoint loads");
    let what = format!("{variant:?} on {:?}", model.kernels());
    let tol = match model.kernels().activations {
        Activations::Int8 | Activations::Mixed => 0.15,
        Activations::F32 => 1e-4,
    };
    // Quantized weights on mlxcel's kernels with fused layers on take the fused node (q/k/v
    // biases and OLMoE's whole-projection q/k norms included); the other paths say why not.
    if matches!(variant.storage, Storage::Quantized { .. })
        && model.kernels().backend == KernelBackend::Native
        && model.kernels().fused_layers
        && variant.moe.is_none()
    {
        assert_eq!(model.execution(), "fused layers", "{what}");
    }

    // Prefill of 7 tokens, then 4 decode steps, each compared with the reference over the whole
    // sequence so far.
    let mut tokens: Vec<u32> = vec![3, 17, 42, 5, 88, 61, 9];
    let mut cache = model.new_cache(64);
    let mut logits = model
        .forward(&mut [ForwardSeq {
            cache: &mut cache,
            tokens: &tokens,
        }])
        .unwrap()
        .remove(0);
    assert_logits_close(
        &logits,
        &reference_logits(&tiny, &tokens),
        tol,
        &format!("{what} prefill"),
    );
    for step in 0..4 {
        let next = argmax(&logits);
        tokens.push(next);
        logits = model
            .forward(&mut [ForwardSeq {
                cache: &mut cache,
                tokens: &[next],
            }])
            .unwrap()
            .remove(0);
        assert_logits_close(
            &logits,
            &reference_logits(&tiny, &tokens),
            tol,
            &format!("{what} decode {step}"),
        );
    }
}

#[test]
fn dense_f32_matches_the_reference() {
    check_variant(
        Variant {
            storage: Storage::F32,
            qwen2_biases: false,
            llama3_rope: false,
            tied: false,
            ..PLAIN
        },
        10,
    );
}

#[test]
fn dense_f16_and_bf16_match_the_reference() {
    check_variant(
        Variant {
            storage: Storage::F16,
            qwen2_biases: false,
            llama3_rope: false,
            tied: true,
            ..PLAIN
        },
        20,
    );
    check_variant(
        Variant {
            storage: Storage::BF16,
            qwen2_biases: false,
            llama3_rope: false,
            tied: false,
            ..PLAIN
        },
        30,
    );
}

#[test]
fn quantized_4_and_8_bit_match_the_reference() {
    check_variant(
        Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 32,
                f16_scales: true,
            },
            qwen2_biases: false,
            llama3_rope: false,
            tied: true,
            ..PLAIN
        },
        40,
    );
    check_variant(
        Variant {
            storage: Storage::Quantized {
                bits: 8,
                group_size: 64,
                f16_scales: false,
            },
            qwen2_biases: false,
            llama3_rope: false,
            tied: false,
            ..PLAIN
        },
        50,
    );
    check_variant(
        Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 64,
                f16_scales: false,
            },
            qwen2_biases: false,
            llama3_rope: false,
            tied: false,
            ..PLAIN
        },
        55,
    );
}

/// Groups of 16 (GGUF Q6_K/Q3_K/Q2_K converted), 4-bit tied (the embedding lookup and the output
/// head) and 8-bit untied, on the fused node, the per-op graph on mlxcel's kernels, and with MLX's
/// kernels chosen (`MLXCEL_KERNELS=mlx`), where group-16 matmuls still take mlxcel's kernels.
#[test]
fn group16_matches_the_reference_on_every_path() {
    let native = Kernels::native();
    for (bits, tied, f16_scales, seed) in [(4, true, false, 80), (8, false, true, 85)] {
        let variant = Variant {
            storage: Storage::Quantized {
                bits,
                group_size: 16,
                f16_scales,
            },
            qwen2_biases: false,
            llama3_rope: false,
            tied,
            ..PLAIN
        };
        check_variant_on(variant, seed, Some(native));
        check_variant_on(
            variant,
            seed,
            Some(Kernels {
                fused_layers: false,
                ..native
            }),
        );
        check_variant_on(
            variant,
            seed,
            Some(Kernels {
                backend: KernelBackend::Mlx,
                ..native
            }),
        );
    }
}

#[test]
fn qwen2_biases_and_llama3_rope_match_the_reference() {
    check_variant(
        Variant {
            storage: Storage::F32,
            qwen2_biases: true,
            llama3_rope: false,
            tied: true,
            ..PLAIN
        },
        60,
    );
    check_variant(
        Variant {
            storage: Storage::Quantized {
                bits: 8,
                group_size: 32,
                f16_scales: false,
            },
            qwen2_biases: false,
            llama3_rope: true,
            tied: true,
            ..PLAIN
        },
        70,
    );
}

/// Each family feature on every path that runs it: the fused node (quantized weights, mlxcel's
/// kernels), the per-op graph on mlxcel's kernels (dense weights, or fused layers off) and on
/// MLX's (`MLXCEL_KERNELS=mlx`: MLX's attention with an explicit window mask).
fn check_feature(feature: Variant, seed: u64) {
    let quantized = Variant {
        storage: Storage::Quantized {
            bits: 4,
            group_size: 32,
            f16_scales: true,
        },
        ..feature
    };
    check_variant_on(quantized, seed, Some(Kernels::native()));
    check_variant_on(
        quantized,
        seed,
        Some(Kernels {
            fused_layers: false,
            ..Kernels::native()
        }),
    );
    check_variant_on(feature, seed + 1, Some(Kernels::native()));
    check_variant_on(
        feature,
        seed + 1,
        Some(Kernels {
            backend: KernelBackend::Mlx,
            ..Kernels::native()
        }),
    );
}

#[test]
fn qwen2_biases_match_the_reference_on_every_path() {
    check_feature(
        Variant {
            qwen2_biases: true,
            tied: true,
            ..PLAIN
        },
        90,
    );
}

#[test]
fn qwen3_qk_norms_match_the_reference() {
    check_feature(
        Variant {
            qk_norm: true,
            tied: true,
            ..PLAIN
        },
        100,
    );
}

#[test]
fn smollm3_layers_without_rope_match_the_reference() {
    check_feature(
        Variant {
            nope: true,
            ..PLAIN
        },
        110,
    );
}

#[test]
fn gemma2_matches_the_reference() {
    check_feature(
        Variant {
            gemma: Some(2),
            tied: true,
            ..PLAIN
        },
        130,
    );
}

#[test]
fn gemma3_matches_the_reference() {
    check_feature(
        Variant {
            gemma: Some(3),
            tied: true,
            ..PLAIN
        },
        140,
    );
}

#[test]
fn phi3_matches_the_reference() {
    check_feature(
        Variant {
            phi3: true,
            ..PLAIN
        },
        150,
    );
}

#[test]
fn mistral_sliding_window_matches_the_reference() {
    // A window of 4 under a 7-token prompt and 4 decode steps: every query past the fourth
    // position loses keys.
    check_feature(
        Variant {
            window: Some(4),
            ..PLAIN
        },
        120,
    );
}

/// gpt-oss's attention sinks on every path (fused node, per-op graph on mlxcel's kernels and on
/// MLX's), on full layers and on layers that slide (a window of 4 under 7 + 4 positions).
#[test]
fn attention_sinks_match_the_reference_on_every_path() {
    check_feature(
        Variant {
            sinks: true,
            ..PLAIN
        },
        170,
    );
    check_feature(
        Variant {
            sinks: true,
            window: Some(4),
            ..PLAIN
        },
        180,
    );
}

/// A checkpoint whose config asks for sinks and that has none is refused, naming the tensor.
#[test]
fn missing_sinks_are_refused_by_name() {
    let tiny = write_tiny(PLAIN, 190);
    let dir = tiny.dir.path();
    let mut config = mlxcel_model::ModelConfig::from_dir(dir).unwrap();
    config.attention_sinks = true;
    let files = mlxcel_model::SafetensorsFiles::open_dir(dir).unwrap();
    let err = Checkpoint::new(dir, config, files).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.self_attn.sinks"), "{err}");
}

/// Four sequences of different lengths, prefilled and decoded together, give each the tokens it
/// gets alone.
#[test]
fn batched_decode_of_four_sequences_matches_each_alone() {
    let tiny = write_tiny(
        Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 32,
                f16_scales: false,
            },
            qwen2_biases: true,
            llama3_rope: false,
            tied: true,
            ..PLAIN
        },
        80,
    );
    let checkpoint = Checkpoint::open(tiny.dir.path()).unwrap();
    let model = LlamaModel::load(&checkpoint).unwrap();
    let prompts: [&[u32]; 4] = [
        &[1],
        &[5, 9, 2],
        &[7, 7, 7, 7, 7, 7],
        &[11, 3, 50, 2, 90, 4, 8, 33, 21, 6],
    ];
    let steps = 6;

    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|prompt| greedy(&model, prompt, steps))
        .collect();

    let mut caches: Vec<_> = (0..4).map(|_| model.new_cache(64)).collect();
    let mut seqs: Vec<ForwardSeq<'_>> = caches
        .iter_mut()
        .zip(prompts)
        .map(|(cache, tokens)| ForwardSeq { cache, tokens })
        .collect();
    let mut logits = model.forward(&mut seqs).unwrap();
    drop(seqs);
    let mut together: Vec<Vec<u32>> = vec![Vec::new(); 4];
    for _ in 0..steps {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        for (out, &t) in together.iter_mut().zip(&next) {
            out.push(t);
        }
        let mut seqs: Vec<ForwardSeq<'_>> = caches
            .iter_mut()
            .zip(&next)
            .map(|(cache, token)| ForwardSeq {
                cache,
                tokens: std::slice::from_ref(token),
            })
            .collect();
        logits = model.forward(&mut seqs).unwrap();
    }
    assert_eq!(together, alone);
}

/// The fused decoder-layer node (one MLX node per layer for all sequences, KV written in place)
/// against the per-op graph on the same kernels, over steps that mix a long prefill with decode
/// tokens of other sequences and that grow the caches past a [`KV_CHUNK`] boundary.
#[test]
fn fused_layers_match_the_per_op_graph_across_cache_growth() {
    check_fused_against_per_op(
        Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 32,
                f16_scales: true,
            },
            qwen2_biases: false,
            llama3_rope: false,
            tied: true,
            ..PLAIN
        },
        90,
    );
}

/// q and k in 4 bits (groups of 32) beside v in 8 bits (groups of 16), as a Q4_K_M GGUF converts
/// (Q4_K and Q6_K): the fused node takes the three matrices apart instead of falling back on the
/// per-op graph, and matches it (and, with the q/k/v biases of Qwen2, the reference).
#[test]
fn fused_layers_take_q_k_and_v_quantized_differently() {
    let variant = Variant {
        storage: Storage::Quantized {
            bits: 4,
            group_size: 32,
            f16_scales: false,
        },
        v_storage: Some(Storage::Quantized {
            bits: 8,
            group_size: 16,
            f16_scales: false,
        }),
        tied: true,
        ..PLAIN
    };
    check_fused_against_per_op(variant, 91);
    let biased = Variant {
        qwen2_biases: true,
        ..variant
    };
    check_fused_against_per_op(biased, 92);
    check_variant_on(biased, 93, Some(Kernels::native()));
}

fn check_fused_against_per_op(variant: Variant, seed: u64) {
    let tiny = write_tiny(variant, seed);
    let checkpoint = Checkpoint::open(tiny.dir.path()).unwrap();
    let fused = LlamaModel::load_with(&checkpoint, Kernels::native()).unwrap();
    assert_eq!(fused.execution(), "fused layers", "{variant:?}");
    let per_op = LlamaModel::load_with(
        &checkpoint,
        Kernels {
            fused_layers: false,
            ..Kernels::native()
        },
    )
    .unwrap();
    let long: Vec<u32> = (0..KV_CHUNK as u32 - 3).map(|i| (i * 7 + 1) % 96).collect();
    let prompts: [&[u32]; 3] = [&[4, 8, 15], &long, &[16, 23, 42, 4, 8]];
    let run = |model: &LlamaModel| -> Vec<Vec<f32>> {
        let mut caches: Vec<_> = (0..3).map(|_| model.new_cache(KV_CHUNK + 40)).collect();
        let mut all = Vec::new();
        // Step 1: the short prompts alone. Step 2: decode of those two plus the long prefill.
        let mut logits = {
            let (a, rest) = caches.split_at_mut(1);
            model
                .forward(&mut [
                    ForwardSeq {
                        cache: &mut a[0],
                        tokens: prompts[0],
                    },
                    ForwardSeq {
                        cache: &mut rest[1],
                        tokens: prompts[2],
                    },
                ])
                .unwrap()
        };
        all.extend(logits.clone());
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        logits = {
            let [a, b, c] = caches.as_mut_slice() else {
                unreachable!("three caches")
            };
            model
                .forward(&mut [
                    ForwardSeq {
                        cache: a,
                        tokens: &next[..1],
                    },
                    ForwardSeq {
                        cache: b,
                        tokens: prompts[1],
                    },
                    ForwardSeq {
                        cache: c,
                        tokens: &next[1..],
                    },
                ])
                .unwrap()
        };
        all.extend(logits.clone());
        // Decode all three until the long one has crossed the chunk boundary.
        for _ in 0..8 {
            let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
            let mut seqs: Vec<ForwardSeq<'_>> = caches
                .iter_mut()
                .zip(&next)
                .map(|(cache, token)| ForwardSeq {
                    cache,
                    tokens: std::slice::from_ref(token),
                })
                .collect();
            logits = model.forward(&mut seqs).unwrap();
            all.extend(logits.clone());
        }
        assert!(
            caches[1].len() > KV_CHUNK,
            "the long cache grew past one chunk"
        );
        all
    };
    let ours = run(&fused);
    let reference = run(&per_op);
    assert_eq!(ours.len(), reference.len());
    for (step, (a, b)) in ours.iter().zip(&reference).enumerate() {
        assert_logits_close(a, b, 1e-5, &format!("fused vs per-op, logits row {step}"));
    }

    // The same with int8 activations (every matrix of this model takes the interleaved layout):
    // the fused node and the per-op graph pass the int8 layout to the same row-invariant
    // kernels, so they give the same bits, and both stay near the f32 numbers.
    let int8 = |fused_layers| Kernels {
        activations: Activations::Int8,
        fused_layers,
        ..Kernels::native()
    };
    let fused_int8 = run(&LlamaModel::load_with(&checkpoint, int8(true)).unwrap());
    let per_op_int8 = run(&LlamaModel::load_with(&checkpoint, int8(false)).unwrap());
    assert_eq!(fused_int8.len(), per_op_int8.len());
    for (step, (a, b)) in fused_int8.iter().zip(&per_op_int8).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "int8 fused vs per-op, logits row {step}: not the same bits"
        );
    }
    for (step, (a, b)) in fused_int8.iter().zip(&ours).take(2).enumerate() {
        // Random tiny weights give wide activations: a loose sanity bound (measured 7.6%); the
        // default model's perplexity test is the quality check.
        assert_logits_close(a, b, 0.15, &format!("int8 vs f32, logits row {step}"));
    }
    assert_ne!(
        fused_int8, ours,
        "int8 activations must not be the f32 path"
    );
}

/// The bytes a loaded model holds: with int8 activations the interleaved layout has the
/// checkpoint's sizes, so a tied model holds what the f32 model holds (its table once: the
/// lookups read the interleaved table, no second copy), and the compact layout no more.
#[test]
fn int8_models_hold_their_tied_table_once() {
    use mlxcel_core::Int8Layout;
    let variant = Variant {
        storage: Storage::Quantized {
            bits: 8,
            group_size: 32,
            f16_scales: false,
        },
        tied: true,
        ..PLAIN
    };
    let tiny = write_tiny(variant, 97);
    let checkpoint = Checkpoint::open(tiny.dir.path()).unwrap();
    let load = |activations, int8_layout| {
        LlamaModel::load_with(
            &checkpoint,
            Kernels {
                activations,
                int8_layout,
                ..Kernels::native()
            },
        )
        .unwrap()
        .weight_bytes()
    };
    let f32 = load(Activations::F32, Int8Layout::Wide);
    let wide = load(Activations::Int8, Int8Layout::Wide);
    let compact = load(Activations::Int8, Int8Layout::Compact);
    assert!(f32 > 0);
    assert_eq!(wide, f32, "int8 (wide) holds the f32 model's bytes");
    assert!(compact <= wide, "compact {compact} > wide {wide}");
}

/// KV blocks under random sharing, on the fused layer with int8 activations (whose logits are
/// invariant to batching and chunking, so a cache that shares blocks must give the bits of one
/// that shares nothing): caches start from random prompts, copy random prefixes of one another
/// (sharing the full blocks), are truncated at random points (also into shared blocks, which a
/// later write must copy first), dropped at random (the blocks they shared live on in the
/// others), and extended by steps over random subsets of them, batched. After every step each
/// extended cache's logits are bitwise those of a fresh cache prefilled with its whole history.
#[test]
fn shared_kv_blocks_under_random_copies_truncations_and_drops() {
    use mlxcel_core::{KV_BLOCK, KvCache};
    let tiny = write_tiny(
        Variant {
            storage: Storage::Quantized {
                bits: 4,
                group_size: 32,
                f16_scales: true,
            },
            tied: true,
            ..PLAIN
        },
        94,
    );
    let checkpoint = Checkpoint::open(tiny.dir.path()).unwrap();
    let kernels = Kernels {
        activations: Activations::Int8,
        ..Kernels::native()
    };
    let model = LlamaModel::load_with(&checkpoint, kernels).unwrap();
    assert_eq!(model.execution(), "fused layers");
    let max = 3 * KV_BLOCK;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |below: usize| -> usize {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % below.max(1) as u64) as usize
    };
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let fresh_logits = |history: &[u32]| {
        let mut cache = model.new_cache(max);
        bits(
            &model
                .forward(&mut [ForwardSeq {
                    cache: &mut cache,
                    tokens: history,
                }])
                .unwrap()[0],
        )
    };
    let mut caches: Vec<(KvCache, Vec<u32>)> = Vec::new();
    let (mut copies, mut shared_writes, mut steps) = (0, 0, 0);
    for _ in 0..200 {
        match next(6) {
            // A new cache with a prompt of its own.
            0 if caches.len() < 4 => {
                let len = 1 + next(2 * KV_BLOCK + 100);
                let tokens: Vec<u32> = (0..len).map(|_| next(96) as u32).collect();
                let mut cache = model.new_cache(max);
                model
                    .forward(&mut [ForwardSeq {
                        cache: &mut cache,
                        tokens: &tokens,
                    }])
                    .unwrap();
                caches.push((cache, tokens));
            }
            // A copy of a random prefix of another cache.
            1 | 2 if !caches.is_empty() && caches.len() < 4 => {
                let source = next(caches.len());
                let len = 1 + next(caches[source].1.len());
                let mut cache = model.new_cache(max);
                cache.copy_prefix_from(&caches[source].0, len).unwrap();
                assert_eq!(cache.shared_blocks(), len / KV_BLOCK);
                let history = caches[source].1[..len].to_vec();
                caches.push((cache, history));
                copies += 1;
            }
            3 if !caches.is_empty() => {
                // Half the time the cache sharing the most blocks (rewinding into them).
                let at = if next(2) == 0 {
                    (0..caches.len())
                        .max_by_key(|&i| caches[i].0.shared_blocks())
                        .unwrap()
                } else {
                    next(caches.len())
                };
                let len = 1 + next(caches[at].1.len());
                caches[at].0.truncate(len);
                caches[at].1.truncate(len);
            }
            4 if caches.len() > 1 => {
                caches.remove(next(caches.len()));
            }
            _ if !caches.is_empty() => {
                // A batched step over a random subset, each with 1..48 new tokens.
                let mut picked: Vec<usize> = (0..caches.len()).filter(|_| next(2) == 0).collect();
                if picked.is_empty() {
                    picked.push(next(caches.len()));
                }
                let mut news = Vec::new();
                for &i in &picked {
                    let room = max - caches[i].1.len();
                    let n = (1 + next(48)).min(room);
                    news.push((0..n).map(|_| next(96) as u32).collect::<Vec<u32>>());
                    // Its next position falls in a shared block: the write must copy it.
                    let cache = &caches[i].0;
                    if n > 0 && cache.reserved_blocks() > max.div_ceil(KV_BLOCK).max(cache.blocks())
                    {
                        shared_writes += 1;
                    }
                }
                let runnable: Vec<(usize, Vec<u32>)> = picked
                    .into_iter()
                    .zip(news)
                    .filter(|(_, t)| !t.is_empty())
                    .collect();
                if runnable.is_empty() {
                    continue;
                }
                let mut slots: Vec<&mut (KvCache, Vec<u32>)> = Vec::new();
                for (i, entry) in caches.iter_mut().enumerate() {
                    if runnable.iter().any(|(j, _)| *j == i) {
                        slots.push(entry);
                    }
                }
                let mut seqs: Vec<ForwardSeq<'_>> = slots
                    .iter_mut()
                    .zip(&runnable)
                    .map(|(entry, (_, tokens))| ForwardSeq {
                        cache: &mut entry.0,
                        tokens,
                    })
                    .collect();
                let logits = model.forward(&mut seqs).unwrap();
                drop(seqs);
                for ((entry, (_, tokens)), got) in slots.iter_mut().zip(&runnable).zip(&logits) {
                    entry.1.extend(tokens);
                    assert_eq!(entry.0.len(), entry.1.len());
                    assert_eq!(
                        bits(got),
                        fresh_logits(&entry.1),
                        "a cache of {} positions sharing {} blocks",
                        entry.1.len(),
                        entry.0.shared_blocks()
                    );
                }
                steps += 1;
            }
            _ => {}
        }
    }
    assert!(
        copies >= 5 && shared_writes >= 1 && steps >= 10,
        "copies {copies}, writes into shared blocks {shared_writes}, steps {steps}"
    );
}
