//! The linear layers of the backend: one matrix (dense or quantized, with an optional bias) and
//! the MLP's gate and up projections, with how each multiplies and how it is rewritten for the
//! int8 kernels. Decoder layers (`weights.rs`) and routed experts (`experts.rs`) are made of them.

use mlxcel_model::HiddenActivation;

use crate::array::Array;
use crate::error::{Error, Result};
use crate::fast::rms_norm;
use crate::kernels::{Activations, Int8Layout, Kernels};
use crate::quantized::{Epilogue, QuantizedWeight};

/// A linear layer, dense or affine-quantized, with an optional bias.
#[derive(Debug)]
pub(super) enum Linear {
    /// `weight_t` is the `[in, out]` view of the checkpoint's `[out, in]` weight.
    Dense {
        weight_t: Array,
        bias: Option<Array>,
    },
    Quantized {
        weight: QuantizedWeight,
        bias: Option<Array>,
    },
}

impl Linear {
    pub(super) fn forward(&self, x: &Array, kernels: &Kernels) -> Result<Array> {
        let (y, bias) = match self {
            Self::Dense { weight_t, bias } => (x.matmul(weight_t)?, bias),
            Self::Quantized { weight, bias } => (weight.linear(x, kernels)?, bias),
        };
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

impl Linear {
    /// `forward(x) + residual`; one op on mlxcel's kernels.
    pub(super) fn forward_add(
        &self,
        x: &Array,
        residual: &Array,
        kernels: &Kernels,
    ) -> Result<Array> {
        match self {
            Self::Quantized { weight, bias: None } => {
                weight.linear_then(x, kernels, Epilogue::Residual(residual))
            }
            _ => self.forward(x, kernels)?.add(residual),
        }
    }

    /// The layer made of the output rows `rows` of this one, in that order (a gated `q_proj`'s
    /// query rows, or its gate rows). Taken before any int8 rewrite: the checkpoint's layout
    /// keeps each output row whole.
    pub(super) fn rows(&self, rows: &[u32]) -> Result<Self> {
        let index = Array::from_u32(rows, &[rows.len() as i32])?;
        let bias = |b: &Option<Array>| b.as_ref().map(|b| b.take(&index, 0)).transpose();
        Ok(match self {
            Self::Dense { weight_t, bias: b } => Self::Dense {
                weight_t: weight_t.take(&index, 1)?,
                bias: bias(b)?,
            },
            Self::Quantized { weight, bias: b } => {
                if weight.int8 {
                    return Err(Error::Mlx {
                        op: "rows",
                        message: "a weight already in the int8 layout cannot be cut by rows".into(),
                    });
                }
                Self::Quantized {
                    weight: QuantizedWeight {
                        weight: weight.weight.take(&index, 0)?,
                        scales: weight.scales.take(&index, 0)?,
                        biases: weight.biases.take(&index, 0)?,
                        group_size: weight.group_size,
                        bits: weight.bits,
                        int8: false,
                        activations: None,
                    },
                    bias: bias(b)?,
                }
            }
        })
    }

    /// Rewrites a quantized weight for the int8 kernels when they take its layout.
    pub(super) fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        if let Self::Quantized { weight, .. } = self {
            interleave_in_place(weight, layout, threads)?;
        }
        Ok(())
    }

    /// Readies a quantized weight to multiply `activations` ([`prepare_in_place`]).
    pub(super) fn prepare_for(
        &mut self,
        kernels: &Kernels,
        activations: Activations,
    ) -> Result<()> {
        if let Self::Quantized { weight, .. } = self {
            prepare_in_place(weight, kernels, activations)?;
        }
        Ok(())
    }
}

/// Readies `weight` to multiply `activations` (f32 or int8, the kernels' choice for its
/// matrix): rewritten into the int8 layout where that is what such a matrix reads
/// ([`Kernels::int8_layout_for`]), and under a per-matrix policy ([`Activations::Mixed`]) told
/// what it multiplies, so that every path through the model (the fused layer node, the per-op
/// graph) runs the policy's choice for it.
pub(super) fn prepare_in_place(
    weight: &mut QuantizedWeight,
    kernels: &Kernels,
    activations: Activations,
) -> Result<()> {
    if kernels.int8_layout_for(activations) {
        interleave_in_place(weight, kernels.int8_layout, kernels.threads)?;
    }
    if weight.int8 && kernels.activations == Activations::Mixed {
        weight.activations = Some(activations);
    }
    Ok(())
}

pub(super) fn interleave_in_place(
    weight: &mut QuantizedWeight,
    layout: Int8Layout,
    threads: usize,
) -> Result<()> {
    if weight.int8_capable() {
        *weight = weight.interleave_int8_on(layout, threads)?;
    }
    Ok(())
}

/// The MLP's gate and up projections: stacked into one quantized matrix when they share a
/// layout (one matmul with a SwiGLU epilogue instead of four ops), separate otherwise.
#[derive(Debug)]
pub(super) enum GateUp {
    Stacked(QuantizedWeight),
    Separate { gate: Linear, up: Linear },
}

impl GateUp {
    pub(super) fn new(gate: Linear, up: Linear) -> Result<Self> {
        match (&gate, &up) {
            (
                Linear::Quantized {
                    weight: g,
                    bias: None,
                },
                Linear::Quantized {
                    weight: u,
                    bias: None,
                },
            ) if g.group_size == u.group_size && g.bits == u.bits => {
                Ok(Self::Stacked(QuantizedWeight::concat_rows(&[g, u])?))
            }
            _ => Ok(Self::Separate { gate, up }),
        }
    }

    /// `act(h · gateᵀ) · (h · upᵀ)` where `h = rms_norm(x, norm, eps)` and `act` is SiLU or
    /// GELU-tanh (or gpt-oss's clamped SwiGLU of the two halves).
    pub(super) fn forward_normed(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        activation: HiddenActivation,
        kernels: &Kernels,
    ) -> Result<Array> {
        match (self, epilogue_of(activation)) {
            (Self::Stacked(w), Some(epilogue)) => {
                w.linear_normed_then(x, norm, eps, kernels, epilogue)
            }
            _ => self.forward(&rms_norm(x, norm, eps)?, activation, kernels),
        }
    }

    /// `act(h · gateᵀ) · (h · upᵀ)` of rows `h` already normed (a routed expert's tokens).
    pub(super) fn forward(
        &self,
        h: &Array,
        activation: HiddenActivation,
        kernels: &Kernels,
    ) -> Result<Array> {
        match (self, epilogue_of(activation)) {
            (Self::Stacked(w), Some(epilogue)) => w.linear_then(h, kernels, epilogue),
            // No epilogue computes the activation: the stacked product's halves are gate and up.
            (Self::Stacked(w), None) => {
                let y = w.linear(h, kernels)?;
                let shape = y.shape();
                let (rows, width) = (shape[0], shape[1] / 2);
                let g = y.slice(&[0, 0], &[rows, width])?;
                let u = y.slice(&[0, width], &[rows, 2 * width])?;
                combine(&g, &u, activation)
            }
            (Self::Separate { gate, up }, _) => combine(
                &gate.forward(h, kernels)?,
                &up.forward(h, kernels)?,
                activation,
            ),
        }
    }

    /// `(h · gateᵀ, h · upᵀ)` before the activation (where a LoRA delta joins each).
    pub(super) fn projections(&self, h: &Array, kernels: &Kernels) -> Result<(Array, Array)> {
        match self {
            Self::Stacked(w) => {
                let y = w.linear(h, kernels)?;
                let shape = y.shape();
                let (rows, width) = (shape[0], shape[1] / 2);
                Ok((
                    y.slice(&[0, 0], &[rows, width])?,
                    y.slice(&[0, width], &[rows, 2 * width])?,
                ))
            }
            Self::Separate { gate, up } => Ok((gate.forward(h, kernels)?, up.forward(h, kernels)?)),
        }
    }

    /// Rewrites the quantized matrices for the int8 kernels where they take their layout.
    pub(super) fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        match self {
            Self::Stacked(w) => interleave_in_place(w, layout, threads),
            Self::Separate { gate, up } => {
                gate.interleave_int8(layout, threads)?;
                up.interleave_int8(layout, threads)
            }
        }
    }

    /// Readies the quantized matrices to multiply `activations` ([`prepare_in_place`]).
    pub(super) fn prepare_for(
        &mut self,
        kernels: &Kernels,
        activations: Activations,
    ) -> Result<()> {
        match self {
            Self::Stacked(w) => prepare_in_place(w, kernels, activations),
            Self::Separate { gate, up } => {
                gate.prepare_for(kernels, activations)?;
                up.prepare_for(kernels, activations)
            }
        }
    }

    /// Every array the projections hold, pushed onto `arrays`.
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        match self {
            Self::Stacked(w) => arrays.extend([&w.weight, &w.scales, &w.biases]),
            Self::Separate { gate, up } => {
                linear_arrays(gate, arrays);
                linear_arrays(up, arrays);
            }
        }
    }
}

/// The matmul epilogue that applies `activation` to the gate half and multiplies by the up half;
/// `None` for gpt-oss's clamped SwiGLU, which no epilogue computes.
fn epilogue_of(activation: HiddenActivation) -> Option<Epilogue<'static>> {
    match activation {
        HiddenActivation::Silu => Some(Epilogue::Swiglu),
        HiddenActivation::GeluTanh => Some(Epilogue::Geglu),
        HiddenActivation::ClampedSwiglu { .. } => None,
    }
}

/// The gated activation of gate `g` and up `u` (rows of the two projections), as separate ops.
pub(super) fn combine(g: &Array, u: &Array, activation: HiddenActivation) -> Result<Array> {
    match activation {
        HiddenActivation::Silu => g.silu()?.multiply(u),
        HiddenActivation::GeluTanh => g.gelu_tanh()?.multiply(u),
        HiddenActivation::ClampedSwiglu { alpha, limit } => g.clamped_swiglu(u, alpha, limit),
    }
}

/// Every array `linear` holds, pushed onto `arrays`.
pub(super) fn linear_arrays<'a>(linear: &'a Linear, arrays: &mut Vec<&'a Array>) {
    match linear {
        Linear::Dense { weight_t, bias } => {
            arrays.push(weight_t);
            arrays.extend(bias);
        }
        Linear::Quantized { weight, bias } => {
            arrays.extend([&weight.weight, &weight.scales, &weight.biases]);
            arrays.extend(bias);
        }
    }
}
