//! Control vectors (llama.cpp's `--control-vector`): a vector added to decoder layers' outputs,
//! the same for every sequence and position, fixed for the model's life. The vectors come
//! summed and range-selected from `mlxcel_model::ControlVector`; here they become arrays and
//! join the step after each layer that has one, in the per-op graph and between runs of the
//! fused decoder-layer node alike (`control_model.rs` sets them on the model and runs the fused
//! node between them).

use crate::array::Array;
use crate::error::Result;

/// The arrays added after the model's decoder layers, by the model's layer index.
#[derive(Debug, Default)]
pub(super) struct ControlVectors {
    /// `[hidden]` f32 per decoder layer of the whole model; `None` where nothing is added.
    layers: Vec<Option<Array>>,
}

impl ControlVectors {
    /// The vectors of `layers` (by the model's layer index).
    pub(super) fn new(layers: Vec<Option<Array>>) -> Self {
        Self { layers }
    }

    /// Whether any layer has a vector.
    pub(super) fn active(&self) -> bool {
        self.layers.iter().any(Option::is_some)
    }

    /// Whether the model's layer `layer` has a vector.
    pub(super) fn has(&self, layer: usize) -> bool {
        matches!(self.layers.get(layer), Some(Some(_)))
    }

    /// `x` (rows of the hidden size) after the model's layer `layer`, with its vector added.
    pub(super) fn apply(&self, x: Array, layer: usize) -> Result<Array> {
        match self.layers.get(layer) {
            Some(Some(v)) if v.dtype() == x.dtype() => x.add(v),
            Some(Some(v)) => x.add(&v.astype(x.dtype())?),
            _ => Ok(x),
        }
    }
}
