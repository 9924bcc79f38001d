//! A routed-expert MLP as one MLX node on mlxcel's CPU kernels (`cpp/kernels/moe.cc`): the
//! RMSNorm, the router (with its bias, if any) and its top k in f32, every routed expert's
//! gate/up (stacked, or apart with their biases as gpt-oss's) with the activation (SwiGLU,
//! GeGLU or gpt-oss's clamped SwiGLU) and down projections over the tokens routed to it, the
//! weighted sum, a gated shared expert, and the residual, in one dispatched task.
//!
//! The per-op graph (`llama/experts.rs`) evaluates the graph at every MoE layer to read the
//! normed rows back and route them on the host, then builds ~40 nodes per layer (per routed
//! expert a gate/up matmul, a down matmul and a scaling, then the adds). This node routes on
//! the kernel thread with the host's arithmetic and runs the experts' matmuls as one parallel
//! region per projection, so a decode step no longer stops at each layer; the numbers are the
//! per-op graph's (see `cpp/kernels/moe.h`).
//!
//! When every layer of a model passes the fused-layer checks, the same kernel runs inside the
//! fused decoder-layer node instead (`layer.rs`, with the plan `MoeNode::experts` gives), so a
//! whole step is one node; this per-layer node serves the MoE models that are not fused.

use mlxcel_model::{HiddenActivation, Routing};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::kernels::{Activations, Kernels};
use crate::quantized::QuantizedWeight;
use crate::sys::{self, ExpertsHandle, ffi};

/// One expert's matrices as the node takes them: gate and up (stacked,
/// `[2·intermediate, hidden]`, or apart) and down (`[hidden, intermediate]`).
#[derive(Clone, Copy)]
pub(crate) struct ExpertMatrices<'a> {
    pub gate_up: GateUpMatrices<'a>,
    pub down: &'a QuantizedWeight,
    /// The gate's, up's and down's f32 biases (`[intermediate]`, `[intermediate]`, `[hidden]`;
    /// gpt-oss), each added after its product; only with gate and up apart.
    pub biases: Option<[&'a Array; 3]>,
}

/// An expert's gate and up projections.
#[derive(Clone, Copy)]
pub(crate) enum GateUpMatrices<'a> {
    /// One matrix, the gate's rows then the up's.
    Stacked(&'a QuantizedWeight),
    /// Two matrices (biased, or quantized differently).
    Split {
        gate: &'a QuantizedWeight,
        up: &'a QuantizedWeight,
    },
}

/// What a layer's node is made of besides its experts.
#[derive(Clone, Copy)]
pub(crate) struct MoeShape<'a> {
    pub hidden: usize,
    pub top_k: usize,
    pub routing: Routing,
    /// SwiGLU, GeGLU, or gpt-oss's clamped SwiGLU.
    pub activation: HiddenActivation,
    /// `[experts (+ 1), hidden]` f32 router rows, the shared expert's gate last.
    pub router: &'a [f32],
    /// One bias per routed expert added to its logit (gpt-oss), when the router has them.
    pub router_bias: Option<&'a [f32]>,
}

/// A layer's routed experts checked and held for the node, made once (after the weights reach
/// their final layout).
pub(crate) struct MoeNode {
    handle: ExpertsHandle,
    experts: usize,
}

impl std::fmt::Debug for MoeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeNode")
            .field("experts", &self.experts)
            .finish_non_exhaustive()
    }
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Mlx {
        op: "routed_experts",
        message: format!("{v} does not fit in i32"),
    })
}

impl MoeNode {
    /// Checks and holds `experts` (and `shared`) for the node. Errors name the expert and the
    /// layout the kernel does not take. The routed experts are all stacked or all split, and
    /// all biased or none; a shared expert is stacked and unbiased.
    pub(crate) fn new(
        experts: &[ExpertMatrices<'_>],
        shared: Option<ExpertMatrices<'_>>,
        shape: MoeShape<'_>,
    ) -> Result<MoeNode> {
        let routing = match shape.routing {
            Routing::SoftmaxTopK { renormalize: false } => 0,
            Routing::SoftmaxTopK { renormalize: true } => 1,
            Routing::TopKSoftmax => 2,
            Routing::SigmoidTopK { .. } => {
                return Err(Error::Mlx {
                    op: "routed_experts",
                    message: "the fused node does not route by sigmoid scores (LFM2-MoE runs the \
                              per-op graph)"
                        .into(),
                });
            }
        };
        let (activation, alpha, limit) = match shape.activation {
            HiddenActivation::Silu => (0, 0.0, 0.0),
            HiddenActivation::GeluTanh => (1, 0.0, 0.0),
            HiddenActivation::ClampedSwiglu { alpha, limit } => (2, alpha, limit),
        };
        let refuse = |message: &str| Error::Mlx {
            op: "routed_experts",
            message: message.into(),
        };
        let split = matches!(
            experts.first().map(|e| e.gate_up),
            Some(GateUpMatrices::Split { .. })
        );
        let biased = experts.first().is_some_and(|e| e.biases.is_some());
        if experts.iter().any(|e| {
            matches!(e.gate_up, GateUpMatrices::Split { .. }) != split
                || e.biases.is_some() != biased
        }) {
            return Err(refuse(
                "the routed experts must all stack gate and up or all keep them apart, and all \
                 have biases or none",
            ));
        }
        if shared
            .is_some_and(|e| e.biases.is_some() || !matches!(e.gate_up, GateUpMatrices::Stacked(_)))
        {
            return Err(refuse(
                "the shared expert must stack gate and up, without biases",
            ));
        }
        let mut quant = Vec::with_capacity(9 * (experts.len() + 1));
        let handle = sys::with_lock(|| {
            let mut list = ffi::array_list_new();
            let mut bias_list = ffi::array_list_new();
            for e in experts.iter().chain(&shared) {
                let matrices = match e.gate_up {
                    GateUpMatrices::Stacked(gate_up) => vec![gate_up, e.down],
                    GateUpMatrices::Split { gate, up } => vec![gate, up, e.down],
                };
                for w in matrices {
                    for a in [&w.weight, &w.scales, &w.biases] {
                        ffi::array_list_push(list.pin_mut(), a.raw());
                    }
                    quant.extend([w.group_size, w.bits, i32::from(w.int8)]);
                }
                for b in e.biases.iter().flatten() {
                    ffi::array_list_push(bias_list.pin_mut(), b.raw());
                }
            }
            ffi::routed_experts_new(
                &list,
                &quant,
                &bias_list,
                shape.router,
                shape.router_bias.unwrap_or_default(),
                to_i32(shape.hidden)?,
                to_i32(experts.len())?,
                to_i32(shape.top_k)?,
                routing,
                activation,
                alpha,
                limit,
                shared.is_some(),
                split,
            )
            .map_err(Error::mlx("routed_experts"))
        })?;
        Ok(MoeNode {
            handle: ExpertsHandle::new(handle),
            experts: experts.len(),
        })
    }

    /// The prepared experts, for the decoder stack's routed layers (`crate::layer`).
    pub(crate) fn experts(&self) -> &ffi::RoutedExperts {
        self.handle.get()
    }

    /// The layer's MLP output of `x` (`[tokens, hidden]`), normed by `norm` first, plus `x`
    /// when `residual`.
    pub(crate) fn forward(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        residual: bool,
        kernels: &Kernels,
    ) -> Result<Array> {
        let threads = kernels.threads.min(i32::MAX as usize) as i32;
        sys::with_lock(|| {
            ffi::native_routed_experts(
                x.raw(),
                norm.raw(),
                self.handle.get(),
                eps,
                residual,
                kernels.activations == Activations::Int8,
                kernels.isa as u8,
                threads,
            )
            .map(sys::Handle::new)
        })
        .map(Array::from_handle)
        .map_err(Error::mlx("routed_experts"))
    }
}
