//! Per-sequence recurrent state of a hybrid model's linear-attention layers (gated DeltaNet): for
//! each such layer, the last inputs of its causal convolution and its f32 matrix state. A
//! [`crate::KvCache`] carries one beside its key/value blocks, so that the state is created,
//! stepped and freed with its sequence, and counted with its memory.
//!
//! Unlike keys and values, the state summarises every position it has consumed: it is the state
//! *after* exactly [`RecurrentState::position`] tokens, and cannot be cut back to fewer.

/// The sizes of one linear-attention layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerStateShape {
    /// f32 values of the convolution's tail: `(taps - 1) × channels`.
    pub(crate) conv: usize,
    /// f32 values of the matrix state: `value_heads × value_dim × key_dim`.
    pub(crate) matrix: usize,
}

/// One linear-attention layer's state for one sequence.
#[derive(Debug, Clone)]
pub(crate) struct LayerState {
    /// The convolution's last `taps - 1` input rows, `[taps - 1, channels]`.
    pub(crate) conv: Vec<f32>,
    /// The delta rule's state, `[value_heads, value_dim, key_dim]`.
    pub(crate) matrix: Vec<f32>,
}

/// Every linear-attention layer's state for one sequence, in layer order.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    layers: Vec<LayerState>,
    /// Tokens the state has consumed.
    position: usize,
}

impl RecurrentState {
    /// A new sequence's state (zeros), one per linear-attention layer.
    pub(crate) fn new(shapes: &[LayerStateShape]) -> Self {
        Self {
            layers: shapes
                .iter()
                .map(|s| LayerState {
                    conv: vec![0.0; s.conv],
                    matrix: vec![0.0; s.matrix],
                })
                .collect(),
            position: 0,
        }
    }

    /// Tokens consumed: the state is the one after exactly this many positions.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes the state holds (f32 values of every layer).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| 4 * (l.conv.len() + l.matrix.len()))
            .sum()
    }

    /// Linear-attention layer `index`'s state (its place among the linear layers).
    pub(crate) fn layer_mut(&mut self, index: usize) -> &mut LayerState {
        &mut self.layers[index]
    }

    /// Records that a step consumed `n` more tokens in every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.position = self.position.saturating_add(n);
    }

    /// Marks the state as not matching any position: a cache rewound or cut to fewer positions
    /// than the state consumed. The next step then fails, by name, rather than continue from
    /// the wrong state.
    pub(crate) fn invalidate(&mut self) {
        self.position = usize::MAX;
    }
}
