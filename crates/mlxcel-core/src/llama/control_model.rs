//! [`LlamaModel`]'s control vectors (`control.rs`): setting them, and the fused decoder-layer
//! node run between the layers that have one.

use mlxcel_model::ControlVector;

use super::control::ControlVectors;
use super::model::LlamaModel;
use crate::array::Array;
use crate::error::{Error, Result};
use crate::layer::{LayerSeq, LayerShape, LayerTensors, StackLora, decoder_stack};

impl LlamaModel {
    /// Adds `vector`'s directions to the decoder layers' outputs from now on (`None` removes
    /// them). Refused when its hidden size or layer count is not the model's. The layers run
    /// are the stage's; the vector is indexed by the whole model's layers.
    pub fn set_control_vector(&mut self, vector: Option<&ControlVector>) -> Result<()> {
        let Some(vector) = vector else {
            self.control = ControlVectors::default();
            return Ok(());
        };
        let c = &self.config;
        if vector.hidden != c.hidden_size || vector.layers.len() != c.num_hidden_layers {
            return Err(Error::ControlVector {
                reason: format!(
                    "made for a hidden size of {} over {} layers; the model has {} over {}",
                    vector.hidden,
                    vector.layers.len(),
                    c.hidden_size,
                    c.num_hidden_layers
                ),
            });
        }
        let hidden = i32::try_from(vector.hidden).map_err(|_| Error::ControlVector {
            reason: format!("a hidden size of {} does not fit in i32", vector.hidden),
        })?;
        let layers = vector
            .layers
            .iter()
            .map(|v| {
                v.as_ref()
                    .map(|values| Array::from_f32(values, &[hidden]))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        self.control = ControlVectors::new(layers);
        Ok(())
    }

    /// The fused decoder-layer node over the stage's `layers`: one node for them all without a
    /// control vector, else one per run of layers up to each layer with a vector, the vector
    /// added after it. `keep` (rows, ascending; empty: all): the one node's last MLP runs on
    /// those rows only and it returns them alone ([`decoder_stack`]); with a control vector or
    /// LoRA every row is returned, and the caller is told which (`true`: only `keep`'s).
    pub(super) fn fused_stack(
        &self,
        mut x: Array,
        layers: &[(LayerTensors<'_>, Vec<LayerSeq<'_>>)],
        shape: &LayerShape,
        lora: Option<&StackLora<'_>>,
        keep: &[u32],
    ) -> Result<(Array, bool)> {
        if !self.control.active() {
            let keep = if lora.is_none() { keep } else { &[] };
            let x = decoder_stack(&x, layers, shape, &self.kernels, lora, keep)?;
            return Ok((x, !keep.is_empty()));
        }
        let first = self.stage.first;
        let mut start = 0;
        for end in 0..layers.len() {
            if self.control.has(first + end) || end + 1 == layers.len() {
                let piece = lora.map(|l| l.layers(start..=end));
                x = decoder_stack(
                    &x,
                    &layers[start..=end],
                    shape,
                    &self.kernels,
                    piece.as_ref(),
                    &[],
                )?;
                x = self.control.apply(x, first + end)?;
                start = end + 1;
            }
        }
        Ok((x, false))
    }

    /// Whether a control vector is set (on any layer).
    pub fn has_control_vector(&self) -> bool {
        self.control.active()
    }
}
