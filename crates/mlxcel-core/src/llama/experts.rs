//! The routed-expert MLP (a mixture of experts: Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE's shared
//! expert, Gemma 4's experts beside a dense MLP) on the per-op graph. The router runs on the host in f32 (`routing.rs`); the step's
//! tokens are then grouped by expert, so that each routed expert's weights are read once per
//! step, however many tokens go to it: its tokens' rows are gathered, multiplied by its gate/up
//! (with the activation as the matmul's epilogue) and down projections, scaled by their weights,
//! and added into each token's output in the token's own route order.
//!
//! On mlxcel's kernels with fused layers, a layer whose experts the fused routed-expert node
//! takes (`crate::moe`: stacked gate/up and an unbiased down, or the three apart, all biased or
//! none, in the native kernels' layouts; any router but LFM2-MoE's sigmoid one)
//! runs as that one node instead, with the same numbers; this graph is its reference and the
//! path for everything else.

use mlxcel_model::{HiddenActivation, Routing};

use super::linear::{GateUp, Linear, linear_arrays};
use super::routing::Router;
use crate::array::Array;
use crate::error::Result;
use crate::fast::rms_norm;
use crate::kernels::{Int8Layout, KernelBackend, Kernels};
use crate::moe::{ExpertMatrices, GateUpMatrices, MoeNode, MoeShape};
use crate::quantized::QuantizedWeight;

/// One expert: a gated MLP.
#[derive(Debug)]
pub(super) struct Expert {
    pub(super) gate_up: GateUp,
    pub(super) down: Linear,
}

impl Expert {
    /// `down(act(h · gateᵀ) · (h · upᵀ))` of normed rows `h`.
    fn forward(&self, h: &Array, activation: HiddenActivation, kernels: &Kernels) -> Result<Array> {
        self.down
            .forward(&self.gate_up.forward(h, activation, kernels)?, kernels)
    }

    fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        self.gate_up.interleave_int8(layout, threads)?;
        self.down.interleave_int8(layout, threads)
    }

    fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        self.gate_up.arrays(arrays);
        linear_arrays(&self.down, arrays);
    }
}

/// A layer's routed-expert MLP: the router, the experts, and the shared expert if any.
#[derive(Debug)]
pub(super) struct RoutedMlp {
    pub(super) router: Router,
    pub(super) experts: Vec<Expert>,
    /// Every token's expert, weighted by `sigmoid(x · shared_expert_gateᵀ)` (the router's last
    /// row).
    pub(super) shared: Option<Expert>,
    pub(super) activation: HiddenActivation,
    /// The layer as one fused node ([`RoutedMlp::prepare_node`]), when its experts allow it.
    pub(super) node: Option<MoeNode>,
    /// Gemma 4's dense MLP beside the experts, with the norms of each side and the router's
    /// own ([`mlxcel_model::RoutedExperts::parallel_dense`]).
    pub(super) parallel: Option<Box<ParallelDense>>,
}

/// Gemma 4's block around its experts: a dense MLP every token passes through, and a norm
/// of its own for the dense MLP's output, the experts' input, their output and the router's
/// input.
#[derive(Debug)]
pub(super) struct ParallelDense {
    /// The dense gated MLP, on the block's input normed by the layer's MLP norm.
    pub(super) mlp: Expert,
    /// `post_feedforward_layernorm_1`, on the dense MLP's output.
    pub(super) dense_post_norm: Array,
    /// `pre_feedforward_layernorm_2`, the experts' input norm.
    pub(super) experts_norm: Array,
    /// `post_feedforward_layernorm_2`, on the experts' weighted sum.
    pub(super) experts_post_norm: Array,
    /// The router's input norm: `router.scale` × `1/√hidden`.
    pub(super) router_norm: Array,
}

impl ParallelDense {
    fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        self.mlp.arrays(arrays);
        arrays.extend([
            &self.dense_post_norm,
            &self.experts_norm,
            &self.experts_post_norm,
            &self.router_norm,
        ]);
    }
}

impl RoutedMlp {
    /// Prepares the fused routed-expert node when `kernels` run it and every expert is in a
    /// form it takes (after the weights reach their final layout: it holds them as they are).
    pub(super) fn prepare_node(&mut self, kernels: &Kernels) -> Result<()> {
        self.node = None;
        // The node does not route by sigmoid scores (LFM2-MoE: the per-op graph).
        // Nor does it scale its experts' weights or norm its router's input apart (Gemma 4).
        let routing_in_node = !matches!(self.router.routing, Routing::SigmoidTopK { .. })
            && self.parallel.is_none()
            && self.router.expert_scales.is_none();
        if !runs_node(kernels) || !routing_in_node {
            return Ok(());
        }
        let Some(experts) = self
            .experts
            .iter()
            .map(matrices)
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(());
        };
        let shared = match &self.shared {
            Some(e) => match matrices(e) {
                Some(m) => Some(m),
                None => return Ok(()),
            },
            None => None,
        };
        self.node = Some(MoeNode::new(
            &experts,
            shared,
            MoeShape {
                hidden: self.router.hidden,
                top_k: self.router.top_k,
                routing: self.router.routing,
                activation: self.activation,
                router: &self.router.weights,
                router_bias: self.router.bias.as_deref(),
            },
        )?);
        Ok(())
    }

    /// `x + forward(x, ..)`: one node when the fused routed-expert node runs.
    pub(super) fn forward_add(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        match &self.node {
            Some(node) if runs_node(kernels) => node.forward(x, norm, eps, true, kernels),
            _ => x.add(&self.forward(x, norm, eps, kernels)?),
        }
    }

    /// The MLP's output for the step's rows `x` (`[tokens, hidden]`), normed by `norm` first:
    /// `Σ score_e · expert_e(h)` over each token's routed experts, plus the gated shared expert.
    /// Reads the normed rows back to route them (the graph so far is evaluated). With Gemma 4's
    /// dense MLP beside the experts: `post_1(mlp(h)) + post_2(Σ score_e · expert_e(norm_2(x)))`,
    /// routed by `x` normed with the router's own norm.
    pub(super) fn forward(
        &self,
        x: &Array,
        norm: &Array,
        eps: f32,
        kernels: &Kernels,
    ) -> Result<Array> {
        if let Some(node) = self.node.as_ref().filter(|_| runs_node(kernels)) {
            return node.forward(x, norm, eps, false, kernels);
        }
        let h = rms_norm(x, norm, eps)?;
        let Some(p) = &self.parallel else {
            let rows = h.to_vec_f32()?;
            return self.routed(&h, &rows, kernels);
        };
        let dense = rms_norm(
            &p.mlp.forward(&h, self.activation, kernels)?,
            &p.dense_post_norm,
            eps,
        )?;
        let rows = rms_norm(x, &p.router_norm, eps)?.to_vec_f32()?;
        let experts = self.routed(&rms_norm(x, &p.experts_norm, eps)?, &rows, kernels)?;
        dense.add(&rms_norm(&experts, &p.experts_post_norm, eps)?)
    }

    /// `Σ score_e · expert_e(h)` over each token's routed experts of the rows `h`, plus the
    /// gated shared expert, routed by `rows` (the router's input, on the host).
    fn routed(&self, h: &Array, rows: &[f32], kernels: &Kernels) -> Result<Array> {
        let tokens = rows.len() / self.router.hidden;
        let k = self.router.top_k;
        let routes = self.router.route(rows, kernels.threads);
        // Each expert's outputs, scaled by their weights, one after another; `row_of[route]` is
        // where a route's output landed.
        let mut outputs = Vec::new();
        let mut row_of = vec![0u32; tokens * k];
        let mut next_row = 0u32;
        for group in routes.groups(self.router.num_experts, k) {
            let n = group.tokens.len();
            let every_token = n == tokens && (0u32..).zip(&group.tokens).all(|(i, &t)| i == t);
            let picked = if every_token {
                h.clone()
            } else {
                h.take(&Array::from_u32(&group.tokens, &[n as i32])?, 0)?
            };
            let expert = &self.experts[group.expert as usize];
            let y = expert.forward(&picked, self.activation, kernels)?;
            outputs.push(y.multiply(&Array::from_f32(&group.scores, &[n as i32, 1])?)?);
            for &route in &group.routes {
                row_of[route as usize] = next_row;
                next_row += 1;
            }
        }
        // One token (a decode step of one sequence): each expert's output is one row, summed
        // as they are, without gathering them into one array first.
        let routed = match (tokens, outputs.as_slice()) {
            (1, _) => None,
            (_, [one]) => Some(one.clone()),
            (_, many) => Some(Array::concatenate(&many.iter().collect::<Vec<_>>(), 0)?),
        };
        // Each token's outputs summed in its route order (the highest weight first), a fixed
        // order whatever else the step holds.
        let mut out: Option<Array> = None;
        for slot in 0..k {
            let rows: Vec<u32> = (0..tokens).map(|t| row_of[t * k + slot]).collect();
            let identity =
                (0u32..).zip(&rows).all(|(i, &r)| i == r) && rows.len() == next_row as usize;
            let part = match &routed {
                None => outputs[rows[0] as usize].clone(),
                Some(all) if identity => all.clone(),
                Some(all) => all.take(&Array::from_u32(&rows, &[tokens as i32])?, 0)?,
            };
            out = Some(match out {
                None => part,
                Some(sum) => sum.add(&part)?,
            });
        }
        let mut out = match out {
            Some(out) => out,
            None => h.multiply(&Array::scalar_f32(0.0))?,
        };
        if let (Some(shared), Some(gates)) = (&self.shared, &routes.shared) {
            let y = shared.forward(h, self.activation, kernels)?;
            out = out.add(&y.multiply(&Array::from_f32(gates, &[tokens as i32, 1])?)?)?;
        }
        Ok(out)
    }

    /// Rewrites the experts' quantized matrices for the int8 kernels where they take their
    /// layout.
    pub(super) fn interleave_int8(&mut self, layout: Int8Layout, threads: usize) -> Result<()> {
        for expert in self.experts.iter_mut().chain(&mut self.shared) {
            expert.interleave_int8(layout, threads)?;
        }
        if let Some(p) = &mut self.parallel {
            p.mlp.interleave_int8(layout, threads)?;
        }
        Ok(())
    }

    /// Every array the experts hold, pushed onto `arrays` (the router is host memory:
    /// [`RoutedMlp::host_bytes`]).
    pub(super) fn arrays<'a>(&'a self, arrays: &mut Vec<&'a Array>) {
        for expert in self.experts.iter().chain(&self.shared) {
            expert.arrays(arrays);
        }
        if let Some(p) = &self.parallel {
            p.arrays(arrays);
        }
    }

    /// Bytes of the routed experts' arrays a decode token does not read: all but `top_k` of
    /// the experts' (every expert is the same size).
    pub(super) fn unread_bytes(&self) -> u64 {
        let mut arrays = Vec::new();
        for expert in &self.experts {
            expert.arrays(&mut arrays);
        }
        let all: u64 = arrays
            .iter()
            .map(|a| (a.size() * a.dtype().size_in_bytes()) as u64)
            .sum();
        let n = self.experts.len().max(1) as u64;
        all - all * (self.router.top_k as u64).min(n) / n
    }

    /// Whether the layer runs as the fused routed-expert node.
    pub(super) fn fused(&self) -> bool {
        self.node.is_some()
    }

    /// Bytes of the router's f32 weights, held on the host.
    pub(super) fn host_bytes(&self) -> u64 {
        (self.router.weights.len() * std::mem::size_of::<f32>()) as u64
    }
}

/// An expert's matrices as the fused node takes them, each in a layout mlxcel's kernels cover:
/// stacked gate/up and a down without bias, or gate, up and down apart, all three biased
/// (gpt-oss) or none.
fn matrices(e: &Expert) -> Option<ExpertMatrices<'_>> {
    let Linear::Quantized {
        weight: down,
        bias: down_bias,
    } = &e.down
    else {
        return None;
    };
    let (gate_up, biases) = match &e.gate_up {
        GateUp::Stacked(gate_up) if down_bias.is_none() => (GateUpMatrices::Stacked(gate_up), None),
        GateUp::Separate {
            gate:
                Linear::Quantized {
                    weight: gate,
                    bias: gate_bias,
                },
            up:
                Linear::Quantized {
                    weight: up,
                    bias: up_bias,
                },
        } => {
            let biases = match (gate_bias, up_bias, down_bias) {
                (Some(g), Some(u), Some(d)) => Some([g, u, d]),
                (None, None, None) => None,
                _ => return None,
            };
            (GateUpMatrices::Split { gate, up }, biases)
        }
        _ => return None,
    };
    let all = match gate_up {
        GateUpMatrices::Stacked(w) => vec![w, down],
        GateUpMatrices::Split { gate, up } => vec![gate, up, down],
    };
    all.into_iter()
        .all(QuantizedWeight::native_layout)
        .then_some(ExpertMatrices {
            gate_up,
            down,
            biases,
        })
}

/// Whether `kernels` run the fused routed-expert node where a layer has one: mlxcel's kernels
/// with fused layers (`MLXCEL_FUSED_LAYERS=off` keeps the per-op graph, the reference).
fn runs_node(kernels: &Kernels) -> bool {
    kernels.backend == KernelBackend::Native && kernels.fused_layers
}
