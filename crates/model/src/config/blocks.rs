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

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenActivation {
    /// `silu(gate) · up` (SwiGLU; `silu`).
    Silu,
    /// `gelu_tanh(gate) · up` (GeGLU with GELU's tanh approximation; `gelu_pytorch_tanh`).
    GeluTanh,
}

/// One decoder layer as the backends build it: its attention, then its feed-forward block
/// ([`crate::ModelConfig::layer_spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    pub attention: LayerAttention,
    pub ffn: FeedForward,
}

/// A decoder layer's feed-forward block. Each backend builds every kind in one function (a
/// `match` on this), so that a block that is not llama-shaped (a routed-expert MLP) is a new
/// variant here, produced by its family and implemented once per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedForward {
    /// The gated MLP: `down_proj(act(gate_proj(x)) · up_proj(x))`, gate and up
    /// `[intermediate_size, hidden]`, down `[hidden, intermediate_size]`.
    Dense {
        intermediate_size: usize,
        activation: HiddenActivation,
    },
}
