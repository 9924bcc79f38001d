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
}

/// How the router's logits become the routed experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over all experts, then the `top_k` largest; with `renormalize` their scores are
    /// divided by their sum (Qwen3-MoE's `norm_topk_prob`, OLMoE's `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The `top_k` largest logits, then a softmax over those (Mixtral, gpt-oss).
    TopKSoftmax,
}
