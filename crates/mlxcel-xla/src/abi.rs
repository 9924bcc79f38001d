//! The program's argument ABI: what the host passes to every function of a compiled module, in
//! order, and in which element types. The emitter (`program/`) declares its arguments from
//! these, and the host (`weights.rs`, `model.rs`) uploads buffers from the same lists, so the two
//! cannot disagree.
//!
//! Weights come first ([`weight_specs`] fixes the order), in a [`WeightFormat`]; then the KV caches
//! ([`cache_type`], keys then values, one per layer); then the step's indices.

use std::collections::BTreeMap;

use crate::hlo::{ElementType, TensorType};

/// The model's dimensions and the constants the graph bakes in.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaDims {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_norm_eps: f32,
    /// Rotary inverse frequencies, `rotary_dim / 2` of them (1 / period).
    pub inv_freq: Vec<f32>,
    /// Leading features of each head that RoPE rotates (`head_dim` unless partial).
    pub rotary_dim: usize,
    /// The factor on the rotated features of q and k (LongRoPE's attention factor; 1: none).
    pub rope_mscale: f32,
    pub qkv_bias: bool,
    pub out_bias: bool,
    pub tied_embeddings: bool,
    /// Whether each head of q and k has its own RMSNorm before RoPE (weights `[head_dim]`).
    pub qk_norm: bool,
    /// Per layer: RoPE or not, and its sliding window (`layers` entries).
    pub layer_attention: Vec<mlxcel_model::LayerAttention>,
    /// The sliding layers' own inverse frequencies, when they differ (Gemma 3).
    pub local_inv_freq: Option<Vec<f32>>,
    /// Norm weights are offsets from one (Gemma): the graph multiplies by `1 + w`.
    pub norm_offset: bool,
    /// Gemma's pre- and post-norms: the attention's and the MLP's outputs are normed before
    /// their residual adds, and the MLP's input norm is `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// GeGLU (GELU-tanh) instead of SwiGLU.
    pub gelu: bool,
    /// A factor on the embeddings.
    pub embedding_scale: Option<f32>,
    /// The attention scores' scale.
    pub attention_scale: f32,
    /// `cap · tanh(x / cap)` on the attention scores and on the logits.
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// The checkpoint's quantized weights (by tensor name) that [`WeightFormat::Packed`] passes
    /// packed; every other weight is dense.
    pub packed: BTreeMap<String, Packing>,
}

/// How one quantized weight is packed: MLX affine quantization, `scale · q + bias` per group of
/// `group` consecutive input elements, `q` unsigned of `bits` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packing {
    /// 4 or 8.
    pub bits: u32,
    pub group: usize,
    /// The element type of the scales and biases arguments (f16 or f32).
    pub scales: ElementType,
}

/// The static shape of one compiled module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramShape {
    /// Positions each sequence may occupy.
    pub context_capacity: usize,
    /// Cache rows, and decode's batch size.
    pub batch: usize,
    /// Tokens per prefill call.
    pub chunk: usize,
    /// The smallest attention window (0: none). Each function also comes in a version that
    /// attends over only the first `w` positions of each row, for every `w` from this one
    /// doubling while below the capacity ([`ProgramShape::windows`]), so that a step's attention
    /// costs what its sequences' lengths need rather than the whole capacity.
    pub min_window: usize,
}

impl ProgramShape {
    /// The IREE module name of this shape under `format`: `<name>.prefill`, `<name>.decode`.
    pub fn module_name(&self, format: WeightFormat) -> String {
        let window = match self.min_window {
            0 => String::new(),
            w => format!("_w{w}"),
        };
        format!(
            "mlxcel_c{}_b{}_t{}{window}_{}",
            self.context_capacity,
            self.batch,
            self.chunk,
            // A symbol name: `kernel-int8` is spelled `kernel_int8`.
            format.name().replace('-', "_")
        )
    }

    /// The attention windows of the module's functions, smallest first: `min_window` doubling
    /// while below the capacity, then the whole row (`cache_len`, scratch included).
    pub fn windows(&self) -> Vec<usize> {
        let mut windows = Vec::new();
        let mut w = self.min_window;
        while w > 0 && w < self.context_capacity {
            windows.push(w);
            w = w.saturating_mul(2);
        }
        windows.push(self.cache_len());
        windows
    }

    /// The smallest window that holds `positions` positions (every window holds the capacity).
    pub fn window_for(&self, positions: usize) -> usize {
        self.windows()
            .into_iter()
            .find(|&w| w >= positions)
            .unwrap_or(self.cache_len())
    }

    /// The name of function `base` (`prefill`, `decode`, `decode_2`, …) attending over `window`
    /// positions: `base` for the whole row, else `<base>_w<window>`.
    pub fn function(&self, base: &str, window: usize) -> String {
        if window >= self.cache_len() {
            base.to_owned()
        } else {
            format!("{base}_w{window}")
        }
    }

    /// Positions per cache row, scratch included.
    pub fn cache_len(&self) -> usize {
        self.context_capacity + self.chunk
    }
}

/// How weights are stored in the argument buffers; the graph widens them to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Every weight dequantized on the host, stored as f32.
    F32,
    /// Every weight dequantized on the host, stored as f16.
    F16,
    /// Quantized weights stay packed (4- or 8-bit integers plus their scales and biases) and are
    /// dequantized in the graph, inside the matmul that reads them; dense weights are f16.
    Packed,
    /// The arguments of [`Self::Packed`], but every packed linear is multiplied by mlxcel's own
    /// kernel (`kernels/qmm.c`), which `iree-compile` links into the module: it reads the
    /// checkpoint's packed bytes directly. Only where [`crate::kernels::supported`].
    Kernel,
    /// [`Self::Kernel`] with int8 activations: each linear's input quantized per block of 32
    /// values, integer dot products (see [`crate::kernels`]).
    KernelInt8,
}

impl WeightFormat {
    /// The element type of dense (not packed) weights.
    pub fn element(self) -> ElementType {
        match self {
            Self::F32 => ElementType::F32,
            Self::F16 | Self::Packed | Self::Kernel | Self::KernelInt8 => ElementType::F16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Packed => "packed",
            Self::Kernel => "kernel",
            Self::KernelInt8 => "kernel-int8",
        }
    }

    /// Whether quantized weights are passed packed (every format but f32 and f16).
    pub fn is_packed(self) -> bool {
        matches!(self, Self::Packed | Self::Kernel | Self::KernelInt8)
    }

    /// Whether packed linears are multiplied by mlxcel's kernels ([`Self::Kernel`],
    /// [`Self::KernelInt8`]).
    pub fn uses_kernels(self) -> bool {
        matches!(self, Self::Kernel | Self::KernelInt8)
    }

    /// The format named `name` (`f32`, `f16`, `packed`, `kernel` or `kernel-int8`).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::F32,
            Self::F16,
            Self::Packed,
            Self::Kernel,
            Self::KernelInt8,
        ]
        .into_iter()
        .find(|f| f.name() == name)
    }
}

/// How a weight argument is laid out relative to the checkpoint tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As stored.
    AsIs,
    /// Transposed: the checkpoint's `[out, in]` becomes `[in, out]`.
    Transposed,
}

/// One weight argument: the checkpoint tensor it comes from and its argument shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSpec {
    /// The checkpoint tensor name (for quantized modules, the module's `.weight`).
    pub name: String,
    pub dims: Vec<i64>,
    pub layout: Layout,
    /// Norm weights and biases stay f32 whatever the weight format: they are tiny.
    pub always_f32: bool,
    /// How the checkpoint packs it, if quantized (from [`LlamaDims::packed`]).
    pub packed: Option<Packing>,
}

impl WeightSpec {
    /// Columns per block when the weight is passed dense and blocked: a transposed `[in, out]`
    /// weight is passed as `[out / block, in, block]`, each block's `in × block` values
    /// contiguous, and multiplied as a batched matmul over the blocks (see
    /// [`block_columns`]). `None` for other weights.
    pub fn block(&self) -> Option<i64> {
        match (self.layout, &self.dims[..]) {
            (Layout::Transposed, [_, out]) => block_columns(*out),
            _ => None,
        }
    }
}

/// The widest block IREE's matmuls read well: a two-row matmul against `[in, out]` weights
/// reads `in` strided pieces of each workgroup's columns; against `[out / 256, in, 256]` blocks
/// each workgroup reads one contiguous block (the tied head of the default model: ~4.8 → ~2.4
/// ms; docs/xla.md).
pub const BLOCK_COLUMNS: i64 = 256;

/// The block width for `out` columns: the largest divisor of `out` up to [`BLOCK_COLUMNS`]; or
/// `None`, the weight staying `[in, out]`, when that is below 32 columns or `out` is below
/// [`MIN_BLOCKED_COLUMNS`].
pub fn block_columns(out: i64) -> Option<i64> {
    if out < MIN_BLOCKED_COLUMNS {
        return None;
    }
    (32..=BLOCK_COLUMNS.min(out)).rev().find(|&b| out % b == 0)
}

/// Weights narrower than this stay `[in, out]`: at most four blocks, whose gain did not pay for
/// broadcasting the input to them (one more dispatch a weight). The default model's 576-column
/// down, q and o projections took 2.5, 1.2 and 1.0 ms a step blocked, plus 0.56 ms of
/// broadcasts, against 2.6, 1.06 and 1.06 ms unblocked (docs/xla.md).
pub const MIN_BLOCKED_COLUMNS: i64 = 1024;

/// The weight arguments, in argument order.
pub fn weight_specs(d: &LlamaDims) -> Vec<WeightSpec> {
    let (h, q, kv, i) = (
        d.hidden as i64,
        (d.heads * d.head_dim) as i64,
        (d.kv_heads * d.head_dim) as i64,
        d.intermediate as i64,
    );
    // A tied table is also the output projection: `[hidden, vocab]`, the `[in, out]` layout
    // IREE multiplies fastest (the embedding gathers its columns).
    let (embed_dims, embed_layout) = if d.tied_embeddings {
        (vec![h, d.vocab as i64], Layout::Transposed)
    } else {
        (vec![d.vocab as i64, h], Layout::AsIs)
    };
    let mut specs = vec![WeightSpec {
        name: "model.embed_tokens.weight".into(),
        dims: embed_dims,
        layout: embed_layout,
        always_f32: false,
        packed: d.packed.get("model.embed_tokens.weight").copied(),
    }];
    let mut push = |name: String, dims: Vec<i64>, layout: Layout, always_f32: bool| {
        let packed = d.packed.get(&name).copied();
        specs.push(WeightSpec {
            name,
            dims,
            layout,
            always_f32,
            packed,
        })
    };
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        push(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            Layout::AsIs,
            true,
        );
        for (m, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(
                format!("{p}.self_attn.{m}.weight"),
                vec![h, out],
                Layout::Transposed,
                false,
            );
            if d.qkv_bias {
                push(
                    format!("{p}.self_attn.{m}.bias"),
                    vec![out],
                    Layout::AsIs,
                    true,
                );
            }
        }
        push(
            format!("{p}.self_attn.o_proj.weight"),
            vec![q, h],
            Layout::Transposed,
            false,
        );
        if d.out_bias {
            push(
                format!("{p}.self_attn.o_proj.bias"),
                vec![h],
                Layout::AsIs,
                true,
            );
        }
        if d.qk_norm {
            for norm in ["q_norm", "k_norm"] {
                push(
                    format!("{p}.self_attn.{norm}.weight"),
                    vec![d.head_dim as i64],
                    Layout::AsIs,
                    true,
                );
            }
        }
        push(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Layout::AsIs,
            true,
        );
        if d.sandwich_norms {
            for norm in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                push(format!("{p}.{norm}.weight"), vec![h], Layout::AsIs, true);
            }
        }
        push(
            format!("{p}.mlp.gate_proj.weight"),
            vec![h, i],
            Layout::Transposed,
            false,
        );
        push(
            format!("{p}.mlp.up_proj.weight"),
            vec![h, i],
            Layout::Transposed,
            false,
        );
        push(
            format!("{p}.mlp.down_proj.weight"),
            vec![i, h],
            Layout::Transposed,
            false,
        );
    }
    push("model.norm.weight".into(), vec![h], Layout::AsIs, true);
    if !d.tied_embeddings {
        push(
            "lm_head.weight".into(),
            vec![h, d.vocab as i64],
            Layout::Transposed,
            false,
        );
    }
    specs
}

/// The argument type of a dense weight under `format`: `spec.dims`, or blocked
/// ([`WeightSpec::block`]).
pub fn weight_type(spec: &WeightSpec, format: WeightFormat) -> TensorType {
    let element = if spec.always_f32 {
        ElementType::F32
    } else {
        format.element()
    };
    match (spec.block(), &spec.dims[..]) {
        (Some(block), [input, out]) => TensorType::new(&[out / block, *input, block], element),
        _ => TensorType::new(&spec.dims, element),
    }
}

/// The argument types of a weight under `format`: one dense tensor, or, for a packed weight
/// under a packed format ([`WeightFormat::is_packed`]), the integers `[rows, cols / group, group]` (the checkpoint's
/// `[out, in]` layout, never transposed), then the scales and the biases `[rows, cols / group]`.
pub fn weight_types(spec: &WeightSpec, format: WeightFormat) -> Vec<TensorType> {
    match (format, spec.packed) {
        (format, Some(p)) if format.is_packed() => {
            let [a, b] = spec.dims[..] else {
                return vec![weight_type(spec, format)];
            };
            let (rows, cols) = match spec.layout {
                Layout::AsIs => (a, b),
                Layout::Transposed => (b, a),
            };
            let group = p.group as i64;
            let element = ElementType::unsigned(p.bits).unwrap_or(ElementType::U32);
            vec![
                TensorType::new(&[rows, cols / group, group], element),
                TensorType::new(&[rows, cols / group], p.scales),
                TensorType::new(&[rows, cols / group], p.scales),
            ]
        }
        _ => vec![weight_type(spec, format)],
    }
}

/// The type of one layer's key (or value) cache.
pub fn cache_type(d: &LlamaDims, shape: &ProgramShape) -> TensorType {
    TensorType::new(
        &[
            shape.batch as i64,
            d.kv_heads as i64,
            shape.cache_len() as i64,
            d.head_dim as i64,
        ],
        ElementType::F32,
    )
}
