//! LoRA adapters on the decoder layers' projections: per adapter and projection the low-rank
//! pair `A` (`[rank, in]`) and `B` (`[out, rank]`), applied per sequence as
//! `y = W x + s · B (A x)` with each sequence's own scale `s` (its scale for the adapter times
//! `alpha / rank`), so that sequences with different adapters, or none, share a step.
//!
//! Where the model's layers run as the fused decoder-layer node, the pairs and each row's scales
//! go into the node ([`StepAdapters::for_stack`]), which adds the deltas inside it
//! (`cpp/kernels/lora.h`); in the per-op graph (`forward.rs`) they run as MLX matmuls in f32
//! beside the projections ([`StepAdapters::delta`]). The two differ only in the order of the
//! sums inside the rank-`r` products.

use mlxcel_model::{LoraAdapter, LoraTarget};

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::layer::{LayerMlp, LayerTensors, StackLora, StackLoraPair};

/// One projection's pair, transposed for `x · Aᵀ · Bᵀ`.
#[derive(Debug)]
struct Pair {
    /// `[in, rank]`.
    a_t: Array,
    /// `[rank, out]`.
    b_t: Array,
    /// `alpha / rank`, or 1 where alpha is 0: the user's scale times this multiplies the delta.
    factor: f32,
}

/// One adapter's pairs: `layers[i][target]`.
#[derive(Debug)]
struct AdapterPairs {
    layers: Vec<[Option<Pair>; 7]>,
}

/// The adapters a model holds, in the order they were given (their ids).
#[derive(Debug, Default)]
pub(super) struct Adapters {
    adapters: Vec<AdapterPairs>,
}

/// Each sequence of a step: its row count and its scale per adapter (missing entries are 0).
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqScales<'a> {
    pub rows: usize,
    pub scales: &'a [f32],
}

/// What a step's layers need to add the adapters' deltas.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepAdapters<'a> {
    pub adapters: &'a Adapters,
    pub seqs: &'a [SeqScales<'a>],
}

fn target_index(target: LoraTarget) -> usize {
    LoraTarget::ALL
        .iter()
        .position(|&t| t == target)
        .unwrap_or_default()
}

/// Whether every value is an f16 bit for bit (widening its f16 gives it back).
fn exact_in_f16(values: &[f32]) -> bool {
    values
        .iter()
        .all(|&v| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits())
}

/// A pair's matrix as f32 for the per-op graph's matmuls (an f16 one widened, exactly).
fn widened(m: &Array) -> Result<Array> {
    if m.dtype() == Dtype::F16 {
        m.astype(Dtype::F32)
    } else {
        Ok(m.clone())
    }
}

impl Adapters {
    /// Builds the pairs of `adapters` for a model of `layers` decoder layers.
    pub(super) fn new(adapters: &[LoraAdapter], layers: usize) -> Result<Self> {
        let mut out = Vec::with_capacity(adapters.len());
        for adapter in adapters {
            let mut pairs = AdapterPairs {
                layers: (0..layers).map(|_| Default::default()).collect(),
            };
            for w in &adapter.weights {
                let slot = pairs
                    .layers
                    .get_mut(w.layer)
                    .ok_or_else(|| Error::Adapter {
                        reason: format!(
                            "{}: layer {} is past the model's {layers}",
                            adapter.path.display(),
                            w.layer
                        ),
                    })?;
                let (rank, din, dout) = (w.rank as i32, w.in_dim as i32, w.out_dim as i32);
                let mut a_t = Array::from_f32(&w.a, &[rank, din])?.transpose(&[1, 0])?;
                let mut b_t = Array::from_f32(&w.b, &[dout, rank])?.transpose(&[1, 0])?;
                // A pair whose every value is an f16 (llama.cpp's converter writes adapters in
                // f16 by default; PEFT's f16 ones) is kept in f16: half the bytes each step
                // reads, widened back to the same values.
                if exact_in_f16(&w.a) && exact_in_f16(&w.b) {
                    a_t = a_t.astype(Dtype::F16)?;
                    b_t = b_t.astype(Dtype::F16)?;
                }
                // Contiguous copies, so that each step reads them as they are.
                let (a_t, b_t) = (a_t.deep_copy()?, b_t.deep_copy()?);
                crate::array::eval(&[&a_t, &b_t])?;
                slot[target_index(w.target)] = Some(Pair {
                    a_t,
                    b_t,
                    factor: adapter.weight_scale(w, 1.0),
                });
            }
            out.push(pairs);
        }
        Ok(Self { adapters: out })
    }

    /// How many adapters there are.
    pub(super) fn len(&self) -> usize {
        self.adapters.len()
    }
}

impl StepAdapters<'_> {
    /// Whether any sequence has a non-zero scale for an adapter.
    pub(super) fn active(&self) -> bool {
        self.seqs.iter().any(|s| s.scales.iter().any(|&x| x != 0.0))
    }

    /// The step's pairs and per-row scales for the fused node over `layers` (the model's decoder
    /// layers in order), or `None` when a pair cannot go into it (an MLP target on a layer of
    /// routed experts): then the step runs the per-op graph. Adapters at scale 0 in every
    /// sequence of the step add no pairs.
    pub(super) fn for_stack<'s>(&'s self, layers: &[LayerTensors<'_>]) -> Option<StackLora<'s>> {
        let count = self.adapters.adapters.len();
        let total: usize = self.seqs.iter().map(|s| s.rows).sum();
        let mut scales = Vec::with_capacity(count * total);
        for j in 0..count {
            for s in self.seqs {
                let scale = s.scales.get(j).copied().unwrap_or(0.0);
                scales.extend(std::iter::repeat_n(scale, s.rows));
            }
        }
        let mut pairs = Vec::new();
        for (j, adapter) in self.adapters.adapters.iter().enumerate() {
            for (layer, targets) in adapter.layers.iter().enumerate() {
                for (t, pair) in targets.iter().enumerate() {
                    let Some(pair) = pair else { continue };
                    // The per-op graph's test: skipped when every sequence's scale is 0.
                    let scale_of =
                        |s: &SeqScales<'_>| s.scales.get(j).copied().unwrap_or(0.0) * pair.factor;
                    if self.seqs.iter().all(|s| scale_of(s) == 0.0) {
                        continue;
                    }
                    let routed = matches!(layers.get(layer)?.mlp, LayerMlp::Routed(_));
                    if routed && t >= target_index(LoraTarget::Gate) {
                        return None;
                    }
                    // `t` is the place in `LoraTarget::ALL`, whose order (q, k, v, o, gate, up,
                    // down) is the node's target codes (`cpp/kernels/lora.h`).
                    pairs.push(StackLoraPair {
                        layer,
                        target: t as i32,
                        adapter: j,
                        a_t: &pair.a_t,
                        b_t: &pair.b_t,
                        factor: pair.factor,
                    });
                }
            }
        }
        Some(StackLora { pairs, scales })
    }

    /// Whether layer `layer`'s `target` gets a delta this step.
    pub(super) fn applies(&self, layer: usize, target: LoraTarget) -> bool {
        let t = target_index(target);
        self.adapters.adapters.iter().enumerate().any(|(j, a)| {
            a.layers.get(layer).is_some_and(|l| l[t].is_some())
                && self
                    .seqs
                    .iter()
                    .any(|s| s.scales.get(j).copied().unwrap_or(0.0) != 0.0)
        })
    }

    /// The delta of layer `layer`'s `target` for the step's rows `x` (`[rows, in]`, the
    /// sequences' rows in order): `Σ_j s_j(row) · (x Aⱼᵀ) Bⱼᵀ`, `None` when no adapter at a
    /// non-zero scale has a pair there.
    pub(super) fn delta(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &Array,
    ) -> Result<Option<Array>> {
        let t = target_index(target);
        let total: usize = self.seqs.iter().map(|s| s.rows).sum();
        let mut sum: Option<Array> = None;
        for (j, adapter) in self.adapters.adapters.iter().enumerate() {
            let Some(pair) = adapter.layers.get(layer).and_then(|l| l[t].as_ref()) else {
                continue;
            };
            let scale_of =
                |s: &SeqScales<'_>| s.scales.get(j).copied().unwrap_or(0.0) * pair.factor;
            if self.seqs.iter().all(|s| scale_of(s) == 0.0) {
                continue;
            }
            let low = x.matmul(&widened(&pair.a_t)?)?;
            // One scale for every row when the sequences agree (a scalar), else one per row.
            let first = scale_of(&self.seqs[0]);
            let low = if self.seqs.iter().all(|s| scale_of(s) == first) {
                low.multiply(&Array::scalar_f32(first))?
            } else {
                let mut rows = Vec::with_capacity(total);
                for s in self.seqs {
                    rows.extend(std::iter::repeat_n(scale_of(s), s.rows));
                }
                low.multiply(&Array::from_f32(&rows, &[total as i32, 1])?)?
            };
            let d = low.matmul(&widened(&pair.b_t)?)?;
            sum = Some(match sum {
                Some(acc) => acc.add(&d)?,
                None => d,
            });
        }
        Ok(sum)
    }

    /// `y + delta` (or `y`).
    pub(super) fn add_to(
        &self,
        layer: usize,
        target: LoraTarget,
        x: &Array,
        y: Array,
    ) -> Result<Array> {
        match self.delta(layer, target, x)? {
            Some(d) => y.add(&d),
            None => Ok(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_storage_only_for_values_an_f16_holds_exactly() {
        let smallest = 2f32.powi(-24); // f16's smallest subnormal
        let near_tenth = half::f16::from_f32(0.1).to_f32();
        assert!(exact_in_f16(&[
            0.0, -0.0, 1.0, -2.5, 65504.0, smallest, near_tenth
        ]));
        assert!(!exact_in_f16(&[0.1]));
        assert!(!exact_in_f16(&[1.0, 70000.0]));
        assert!(!exact_in_f16(&[1.0e-9]));
        let one = |v: f32| {
            let adapter = LoraAdapter {
                path: "t".into(),
                alpha: 2.0,
                task_name: String::new(),
                prompt_prefix: String::new(),
                weights: vec![mlxcel_model::LoraWeight {
                    layer: 0,
                    target: LoraTarget::Q,
                    rank: 1,
                    a: vec![v; 16],
                    b: vec![0.5; 16],
                    in_dim: 16,
                    out_dim: 16,
                }],
            };
            let adapters = Adapters::new(&[adapter], 1).unwrap();
            let pair = adapters.adapters[0].layers[0][0].as_ref().unwrap();
            (pair.a_t.dtype(), pair.b_t.dtype())
        };
        assert_eq!(one(0.25), (Dtype::F16, Dtype::F16));
        assert_eq!(one(0.1), (Dtype::F32, Dtype::F32));
    }
}
