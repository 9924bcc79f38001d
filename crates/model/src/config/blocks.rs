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
