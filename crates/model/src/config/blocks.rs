//! What each decoder layer is made of, as the backends build it: its attention and its
//! feed-forward block. A family produces one [`LayerSpec`] per layer; a block that is not
//! llama-shaped is a new variant here that each backend implements once.

/// What one decoder layer's attention does that its neighbours may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerAttention {
    /// Whether q and k are rotated; `false` for SmolLM3's NoPE layers.
    pub rope: bool,
    /// A sliding-window layer's window: the query at position `p` sees the keys at positions
    /// `p - window + 1 ..= p` (itself and the `window - 1` before it), as Hugging Face, mlx-lm and
    /// llama.cpp mask them. `None`: every earlier position.
    pub window: Option<usize>,
    /// `Some`: the layer is not softmax attention but linear attention, a gated DeltaNet
    /// (Qwen3-Next, Qwen3.5): no keys or values are cached for it; each sequence carries its
    /// recurrent state instead. `rope` and `window` do not apply then.
    pub linear: Option<GatedDeltaNet>,
    /// `Some`: the layer is not attention but LFM2's short convolution ([`ShortConv`]): no keys
    /// or values are cached for it; each sequence carries the convolution's tail instead.
    /// `rope` and `window` do not apply then.
    pub conv: Option<ShortConv>,
}

impl LayerAttention {
    /// Softmax attention over every earlier position, rotated.
    pub const FULL: Self = Self {
        rope: true,
        window: None,
        linear: None,
        conv: None,
    };
}

/// LFM2's short-convolution layer, in place of attention. Per token, under
/// `model.layers.{i}.conv.`: `in_proj` (`[3 · hidden, hidden]`) gives `B`, `C` and `x` (each
/// `hidden` wide, in that order); `B · x` goes through a causal depthwise convolution over time
/// (`conv.weight`, `kernel` taps per channel, no bias; the sequence keeps the last `kernel - 1`
/// products), and `C` times its output goes through `out_proj` (`[hidden, hidden]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortConv {
    /// Taps of the convolution (`conv_L_cache`).
    pub kernel: usize,
}

/// A gated DeltaNet layer (linear attention, as Qwen3-Next and Qwen3.5 have it). Per token `t`,
/// under `model.layers.{i}.linear_attn.`:
///
/// 1. projections of the normed input: `q`, `k` (`key_heads × key_head_dim` each), `v` and the
///    output gate `z` (`value_heads × value_head_dim` each), and per value head `b` and `a`;
///    stored as `in_proj_qkvz` and `in_proj_ba` (grouped by key head: per key head its q, k, its
///    value heads' v, then z; its value heads' b, then a) when `fused_projections`, else as
///    `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`;
/// 2. a causal depthwise convolution over time (`conv1d.weight`, `conv_kernel` taps per channel
///    of q‖k‖v, no bias; the sequence keeps the last `conv_kernel - 1` inputs), then SiLU;
/// 3. q and k L2-normalised per head (eps 1e-6), q scaled by `1/√key_head_dim`;
/// 4. the gated delta rule per value head (a value head reads key head `h / (value_heads /
///    key_heads)`, or `h % key_heads` when `tiled_value_heads`), with `β = sigmoid(b)` and decay `g = exp(-exp(A_log) · softplus(a +
///    dt_bias))`: `S ← g·S; S ← S + k ⊗ β(v − S·k); y = S·q` (`S` is `value_head_dim ×
///    key_head_dim`, f32, per sequence);
/// 5. `y` RMS-normed per head with `norm.weight` (`[value_head_dim]`, not zero-centred), times
///    `silu(z)`, through `out_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedDeltaNet {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// Taps of the causal convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// q, k, v, z and b, a stored as two projections grouped by key head (Qwen3-Next), not four.
    pub fused_projections: bool,
    /// The value heads (of v, z, b, a, `A_log`, `dt_bias` and `out_proj`'s columns) are in
    /// llama.cpp's tiled order, each key head's first value head, then each one's second, ...
    /// (its `qwen35` files), not grouped by key head (Hugging Face's).
    pub tiled_value_heads: bool,
}

impl GatedDeltaNet {
    /// Width of q and of k (`key_heads × key_head_dim`).
    pub fn key_dim(&self) -> usize {
        self.key_heads * self.key_head_dim
    }

    /// Width of v and of z (`value_heads × value_head_dim`).
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    /// Channels of the convolution: q‖k‖v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values a sequence keeps for the layer: the convolution's last `conv_kernel - 1`
    /// inputs and the matrix state of every value head.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
            + self.value_heads * self.value_head_dim * self.key_head_dim
    }
}

/// The MLP's gate activation: how a gated MLP combines its gate and up halves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HiddenActivation {
    /// `silu(gate) · up` (SwiGLU; `silu`).
    Silu,
    /// `gelu_tanh(gate) · up` (GeGLU with GELU's tanh approximation; `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's experts: `g · sigmoid(alpha · g) · (u + 1)` with `g = min(gate, limit)` and
    /// `u = clamp(up, −limit, limit)` (`swiglu_limit`; alpha is 1.702 in transformers and
    /// mlx-lm alike). Only routed experts use it: config.json's `hidden_act` never names it.
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl HiddenActivation {
    /// gpt-oss's alpha, a constant of its transformers and mlx-lm code.
    pub const GPT_OSS_ALPHA: f32 = 1.702;
}

/// One decoder layer as the backends build it: its attention, then its feed-forward block
/// ([`crate::ModelConfig::layer_spec`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    pub attention: LayerAttention,
    pub ffn: FeedForward,
}

/// A decoder layer's feed-forward block. Each backend builds every kind in one function (a
/// `match` on this), so that a block that is not llama-shaped (a routed-expert MLP) is a new
/// variant here, produced by its family and implemented once per backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeedForward {
    /// The gated MLP: `down_proj(act(gate_proj(x)) · up_proj(x))`, gate and up
    /// `[intermediate_size, hidden]`, down `[hidden, intermediate_size]`.
    Dense {
        intermediate_size: usize,
        activation: HiddenActivation,
    },
    /// A routed mixture of experts: a router (`mlp.gate`, `[num_experts, hidden]`, f32 logits)
    /// picks `top_k` experts per token, each a gated MLP of `expert_intermediate_size`; the
    /// token's output is the routed experts' outputs weighted by [`Routing`]'s scores, plus an
    /// optional shared expert. Tensors, one set per expert `j`, under `model.layers.{i}.mlp.`:
    /// `gate.weight`, `experts.{j}.{gate_proj,up_proj,down_proj}.weight` (and quantization's
    /// `scales`/`biases`), `shared_expert.{gate_proj,up_proj,down_proj}` and
    /// `shared_expert_gate.weight` (`[1, hidden]`) when there is a shared expert. Checkpoints that
    /// store experts stacked (mlx-lm's `switch_mlp`, GGUF's `ffn_*_exps`) are read as these
    /// per-expert views. With [`RoutedExperts::biases`], the router and every expert's
    /// projections also have a `bias`.
    RoutedExperts(RoutedExperts),
}

impl FeedForward {
    /// The routed-expert block, if this is one.
    pub fn routed(&self) -> Option<&RoutedExperts> {
        match self {
            Self::RoutedExperts(moe) => Some(moe),
            Self::Dense { .. } => None,
        }
    }
}

/// A mixture-of-experts feed-forward block ([`FeedForward::RoutedExperts`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutedExperts {
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each expert's gated MLP hidden size (`moe_intermediate_size`).
    pub expert_intermediate_size: usize,
    /// How each expert combines its gate and up halves (gpt-oss's clamped SwiGLU).
    pub activation: HiddenActivation,
    pub routing: Routing,
    /// The router (`gate.bias`, `[num_experts]`, added to its logits before routing) and each
    /// expert's gate, up and down projections (`experts.{j}.{gate,up,down}_proj.bias`) carry
    /// biases (gpt-oss).
    pub biases: bool,
    /// Qwen2-MoE's shared expert: a gated MLP of this hidden size every token passes through,
    /// its output multiplied by `sigmoid(shared_expert_gate · x)`.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Gemma 4's block (`enable_moe_block`): a dense gated MLP of this hidden size beside the
    /// experts, each with norms of its own, under `model.layers.{i}.`:
    ///
    /// - the dense MLP (`mlp.{gate,up,down}_proj`) on `pre_feedforward_layernorm(x)`, its
    ///   output through `post_feedforward_layernorm_1`;
    /// - the router's logits (`mlp.gate`, Gemma 4's `router.proj`) of `rms_norm(x)` times
    ///   `router.scale` (`[hidden]`) times `1/√hidden`, routed by [`Routing`], each picked
    ///   expert's weight then times its `router.per_expert_scale` (`[num_experts]`);
    /// - the experts on `pre_feedforward_layernorm_2(x)`, their weighted sum through
    ///   `post_feedforward_layernorm_2`;
    /// - the two outputs added (the layer's `post_feedforward_layernorm` follows as in every
    ///   Gemma layer).
    pub parallel_dense: Option<usize>,
}

/// How the router's logits become the routed experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts, then the `top_k` largest; with `renormalize` their scores are
    /// divided by their sum (Qwen3-MoE's `norm_topk_prob`, OLMoE's `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The `top_k` largest logits, then a softmax over those (Mixtral, gpt-oss).
    TopKSoftmax,
    /// A sigmoid of each logit; the `top_k` largest of those (plus `mlp.expert_bias`,
    /// `[num_experts]` f32, when `selection_bias`: it picks the experts, it does not weight
    /// them) are the experts, weighted by their sigmoids, divided by their sum plus 1e-6 when
    /// `renormalize` (LFM2-MoE's `use_expert_bias` and `norm_topk_prob`).
    SigmoidTopK {
        renormalize: bool,
        selection_bias: bool,
    },
}

/// Gemma 4's per-layer token inputs (`hidden_size_per_layer_input`): besides the hidden state,
/// each layer receives a vector of `hidden` values per token, made once per step from two
/// sources and mixed into the layer's output through a gate. Tensors:
///
/// - `model.embed_tokens_per_layer` (`[vocab, layers · hidden]`): each token's row, times
///   `√hidden`, cut into one `hidden`-wide part per layer;
/// - `model.per_layer_model_projection` (`[layers · hidden, hidden_size]`) of the scaled
///   embeddings, times `1/√hidden_size`, cut per layer and RMS-normed per part with
///   `model.per_layer_projection_norm` (`[hidden]`);
/// - the two added and multiplied by `1/√2`: layer `i`'s input is part `i`.
///
/// In layer `i`, after the MLP's residual add: `h + norm(per_layer_projection(gelu_tanh(
/// per_layer_input_gate(h)) · input_i))` with `per_layer_input_gate` (`[hidden, hidden_size]`),
/// `per_layer_projection` (`[hidden_size, hidden]`) and `post_per_layer_input_norm`
/// (`[hidden_size]`), before the layer scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInput {
    /// Values per layer and token (`hidden_size_per_layer_input`).
    pub hidden: usize,
    /// Rows of `embed_tokens_per_layer` (`vocab_size_per_layer_input`).
    pub vocab: usize,
}

/// How a family's attention layers differ from one another ([`crate::ModelConfig`]'s
/// `global_head_dim`, `kv_shared_layers`, `per_layer_input`); the default: not at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AttentionLayout {
    pub global_head_dim: Option<usize>,
    pub kv_shared_layers: usize,
    pub per_layer_input: Option<PerLayerInput>,
    pub keys_as_values: bool,
    pub global_key_value_heads: Option<usize>,
}
