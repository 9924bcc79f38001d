//! Gemma 4's per-layer token inputs ([`mlxcel_model::PerLayerInput`]): once per step, every
//! token's small vector per layer, made from its row of a second embedding table and from a
//! projection of its (scaled) embedding; in each layer, that vector gates a residual update
//! after the MLP.

use mlxcel_model::PerLayerInput;

use super::linear::{Linear, linear_arrays};
use super::weights::Embedding;
use crate::array::Array;
use crate::error::Result;
use crate::fast::rms_norm;
use crate::kernels::Kernels;

/// The model-level tensors of the per-layer inputs.
#[derive(Debug)]
pub(super) struct PerLayerInputs {
    /// `model.embed_tokens_per_layer`: `[vocab, layers · hidden]`.
    pub(super) table: Embedding,
    /// `model.per_layer_model_projection`: the embeddings to `layers · hidden` values.
    pub(super) projection: Linear,
    /// `model.per_layer_projection_norm`: `[hidden]`, over each layer's part of the projection.
    pub(super) norm: Array,
    pub(super) spec: PerLayerInput,
    /// Decoder layers of the model (each token has one part per layer).
    pub(super) layers: usize,
}

/// One layer's use of its input: `h + norm(projection(gelu_tanh(gate(h)) · input))`.
#[derive(Debug)]
pub(super) struct PerLayerGate {
    /// `per_layer_input_gate`: `[per-layer hidden, hidden]`.
    pub(super) gate: Linear,
    /// `per_layer_projection`: `[hidden, per-layer hidden]`.
    pub(super) projection: Linear,
    /// `post_per_layer_input_norm`: `[hidden]`.
    pub(super) norm: Array,
}

impl PerLayerInputs {
    /// Every token's inputs for every layer, `[tokens, layers, hidden]`: its row of the table
    /// times `√hidden`, plus the normed projection of `embedded` (the step's embeddings,
    /// already scaled by the model's embedding scale) times `1/√hidden_size`, the sum times
    /// `1/√2`. The factors are rounded to f32 once, as mlx-lm multiplies by Python floats.
    pub(super) fn compute(
        &self,
        ids: &[u32],
        embedded: &Array,
        hidden_size: usize,
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        let tokens = ids.len() as i32;
        let (layers, hidden) = (self.layers as i32, self.spec.hidden as i32);
        let per_layer = [tokens, layers, hidden];
        let rows = self
            .table
            .lookup(&Array::from_u32(ids, &[tokens])?)?
            .multiply(&Array::scalar_f32((self.spec.hidden as f64).sqrt() as f32))?
            .reshape(&per_layer)?;
        let projected = self
            .projection
            .forward(embedded, kernels)?
            .multiply(&Array::scalar_f32((hidden_size as f64).powf(-0.5) as f32))?
            .reshape(&per_layer)?;
        rms_norm(&projected, &self.norm, eps)?
            .add(&rows)?
            .multiply(&Array::scalar_f32(0.5f64.sqrt() as f32))
    }

    /// Every array held, pushed onto `arrays`.
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        match &self.table {
            Embedding::Dense(table) => arrays.push(table),
            Embedding::Quantized(q) => arrays.extend([&q.weight, &q.scales, &q.biases]),
        }
        linear_arrays(&self.projection, arrays);
        arrays.push(&self.norm);
    }
}

/// Layer `layer`'s part of `inputs` (`[tokens, layers, hidden]`): `[tokens, hidden]`.
pub(super) fn layer_part(inputs: &Array, layer: usize) -> Result<Array> {
    let shape = inputs.shape();
    let (tokens, hidden, layer) = (shape[0], shape[2], layer as i32);
    inputs
        .slice(&[0, layer, 0], &[tokens, layer + 1, hidden])?
        .reshape(&[tokens, hidden])
}

impl PerLayerGate {
    /// `h` plus the layer's gated use of its input (`input`, `[tokens, per-layer hidden]`).
    pub(super) fn apply(
        &self,
        h: &Array,
        input: &Array,
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        let gated = self
            .gate
            .forward(h, kernels)?
            .gelu_tanh()?
            .multiply(input)?;
        let update = self.projection.forward(&gated, kernels)?;
        h.add(&rms_norm(&update, &self.norm, eps)?)
    }

    /// Every array held, pushed onto `arrays`.
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        linear_arrays(&self.gate, arrays);
        linear_arrays(&self.projection, arrays);
        arrays.push(&self.norm);
    }
}
