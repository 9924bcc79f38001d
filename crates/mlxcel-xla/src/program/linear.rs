//! Matrix products of a function's activations by its weights: dense, blocked (wide weights),
//! packed (dequantized in the graph), or by mlxcel's kernels (one dispatch for several weights
//! packed alike), and the embedding lookup.

use super::emitter::{Emitter, Weight};
use crate::abi::WeightFormat;
use crate::error::EmitError;
use crate::hlo::{DotDims, ElementType, TensorType, Value};
use crate::kernels;

impl Emitter<'_> {
    /// `scale · q + bias` in f32 for packed `q` (`[rows, groups, group]`) with `scales` and
    /// `biases` (`[rows, groups]`): `[rows, groups, group]`.
    fn dequantize(
        &mut self,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let dims = q.dims().to_vec();
        let values = self.b.convert(q, ElementType::F32);
        let scales = self.widen(scales);
        let biases = self.widen(biases);
        let scales = self.b.broadcast_in_dim(&scales, &dims, &[0, 1])?;
        let biases = self.b.broadcast_in_dim(&biases, &dims, &[0, 1])?;
        let scaled = self.b.mul(&values, &scales)?;
        self.b.add(&scaled, &biases)
    }

    /// `x · wᵀ` for `x` `[n, in]` and a packed `w` (`[out, in]` as `[out, in / group, group]`):
    /// `[n, out]`.
    fn packed_matmul(
        &mut self,
        x: &Value,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let w = self.dequantize(q, scales, biases)?;
        let [out, groups, group] = [w.dims()[0], w.dims()[1], w.dims()[2]];
        let w = self.b.reshape(&w, &[out, groups * group])?;
        self.b.dot_general(
            x,
            &w,
            &DotDims {
                lhs_contract: vec![1],
                rhs_contract: vec![1],
                ..DotDims::default()
            },
        )
    }

    /// `x · wᵀ` as [`Self::packed_matmul`], by mlxcel's kernel (`kernels`): for 4-bit codes the
    /// input's blocks of 32 are reordered to `[evens, odds]` (the kernel reads a byte's two
    /// nibbles against the two halves), or, under [`WeightFormat::KernelInt8`], quantized by one
    /// more dispatch (once per input value and bits); the codes are reinterpreted as signless
    /// integers (a `ui4` operand of a dispatch would be rewritten by StableHLO's conversion), and
    /// one dispatch computes `[n, out]`.
    fn kernel_matmul(
        &mut self,
        x: &Value,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Result<Value, EmitError> {
        let y = self.kernel_matmuls(x, &[(q, scales, biases)])?;
        Ok(y.into_iter().next().expect("one product"))
    }

    /// The packing of a packed weight's arguments, if mlxcel's kernels under this format take it
    /// against an input of `input` values.
    fn kernel_packing(
        &self,
        input: i64,
        q: &Value,
        scales: &Value,
        biases: &Value,
    ) -> Option<crate::abi::Packing> {
        let [out, groups, group] = [q.dims()[0], q.dims()[1], q.dims()[2]];
        let bits = match q.element() {
            ElementType::U4 => 4,
            ElementType::U8 => 8,
            _ => return None,
        };
        let packing = crate::abi::Packing {
            bits,
            group: group as usize,
            scales: scales.element(),
        };
        let fits = if self.format == WeightFormat::KernelInt8 {
            kernels::fits_int8(&packing)
        } else {
            kernels::fits(&packing)
        };
        (fits
            && input == groups * group
            && scales.dims() == [out, groups]
            && biases.ty() == scales.ty())
        .then_some(packing)
    }

    /// `x · wᵀ` for one to [`kernels::MAX_FUSED`] packed weights of the same packing over the
    /// same `x`, in one dispatch with a result per weight.
    fn kernel_matmuls(
        &mut self,
        x: &Value,
        weights: &[(&Value, &Value, &Value)],
    ) -> Result<Vec<Value>, EmitError> {
        let [n, input] = [x.dims()[0], x.dims()[1]];
        let packings: Vec<_> = weights
            .iter()
            .map(|(q, s, b)| self.kernel_packing(input, q, s, b))
            .collect();
        let packing = match packings[..] {
            [Some(first), ..]
                if packings.iter().all(|p| *p == Some(first))
                    && (1..=kernels::MAX_FUSED).contains(&weights.len()) =>
            {
                first
            }
            _ => {
                let (q, scales, biases) = weights[0];
                return Err(EmitError::Shape {
                    op: "kernel_matmul",
                    detail: format!(
                        "{} against {} weights, the first codes {}, scales {}, biases {}",
                        x.ty(),
                        weights.len(),
                        q.ty(),
                        scales.ty(),
                        biases.ty()
                    ),
                });
            }
        };
        let bits = packing.bits;
        let signless = if bits == 4 {
            ElementType::I4
        } else {
            ElementType::I8
        };
        let int8 = self.format == WeightFormat::KernelInt8;
        let x = if int8 {
            let key = (x.to_string(), bits);
            match self.quantized.get(&key) {
                Some(xq) => xq.clone(),
                None => {
                    let entry = format!(
                        "@{}::@{}",
                        kernels::EXECUTABLE,
                        kernels::quantize_export(bits)
                    );
                    let row = kernels::quantized_row_bytes(input as usize, bits) as i64;
                    let xq = self.b.dispatch(
                        &entry,
                        &[x],
                        &[n, input],
                        TensorType::new(&[n, row], ElementType::I8),
                    );
                    self.quantized.insert(key, xq.clone());
                    xq
                }
            }
        } else if bits == 4 {
            let pairs = self.b.reshape(x, &[n, input / 32, 16, 2])?;
            let halves = self.b.transpose(&pairs, &[0, 1, 3, 2])?;
            self.b.reshape(&halves, &[n, input])?
        } else {
            x.clone()
        };
        let mut operands = vec![x];
        let mut outs = Vec::with_capacity(weights.len());
        for (q, scales, biases) in weights {
            operands.push(self.b.bitcast_convert(q, signless)?);
            operands.push((*scales).clone());
            operands.push((*biases).clone());
            outs.push(q.dims()[0]);
        }
        let total: i64 = outs.iter().sum();
        let entry = format!(
            "@{}::@{}",
            kernels::EXECUTABLE,
            kernels::fused_export(&packing, int8, weights.len())
        );
        let per = kernels::columns_per_workgroup(total as usize) as i64;
        let mut constants = vec![n, input];
        constants.extend(&outs);
        constants.extend([packing.group as i64, per]);
        let refs: Vec<&Value> = operands.iter().collect();
        let results: Vec<TensorType> = outs
            .iter()
            .map(|&out| TensorType::new(&[n, out], ElementType::F32))
            .collect();
        Ok(self.b.dispatch_results(&entry, &refs, &constants, &results))
    }

    /// [`Self::linear`] of several weights over one `x`: under the kernel formats, weights packed
    /// alike go through one dispatch ([`Self::kernel_matmuls`]); otherwise one by one.
    pub(super) fn linears<const K: usize>(
        &mut self,
        x: &Value,
        weights: [&(Weight, Option<Value>); K],
    ) -> Result<[Value; K], EmitError> {
        let packed: Vec<(&Value, &Value, &Value)> = weights
            .iter()
            .filter_map(|w| match &w.0 {
                Weight::Packed { q, scales, biases } => Some((q, scales, biases)),
                Weight::Dense(_) => None,
            })
            .collect();
        let input = x.dims()[1];
        let fused = self.format.uses_kernels()
            && K > 1
            && packed.len() == K
            && K <= kernels::MAX_FUSED
            && {
                let first = self.kernel_packing(input, packed[0].0, packed[0].1, packed[0].2);
                first.is_some()
                    && packed
                        .iter()
                        .all(|(q, s, b)| self.kernel_packing(input, q, s, b) == first)
            };
        let mut ys: Vec<Value> = if fused {
            self.kernel_matmuls(x, &packed)?
        } else {
            return weights
                .iter()
                .map(|w| self.linear(x, w))
                .collect::<Result<Vec<_>, _>>()
                .map(|v| v.try_into().expect("K results"));
        };
        for (y, w) in ys.iter_mut().zip(weights) {
            if let Some(bias) = &w.1 {
                let bias = self.b.broadcast_in_dim(bias, y.dims(), &[1])?;
                *y = self.b.add(y, &bias)?;
            }
        }
        Ok(ys.try_into().expect("K results"))
    }

    /// `x · w` for `x` `[n, in]` and a blocked `w` (`[out / block, in, block]`,
    /// `abi::WeightSpec::block`): `x` broadcast to every block, one batched matmul over the
    /// blocks, the blocks' columns put back in order. `[n, out]`.
    fn blocked_matmul(&mut self, x: &Value, w: &Value) -> Result<Value, EmitError> {
        let w = self.widen(w);
        let [blocks, input, block] = [w.dims()[0], w.dims()[1], w.dims()[2]];
        let n = x.dims()[0];
        let x = self.b.broadcast_in_dim(x, &[blocks, n, input], &[1, 2])?;
        let y = self.b.dot_general(
            &x,
            &w,
            &DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
        )?;
        let y = self.b.transpose(&y, &[1, 0, 2])?;
        self.b.reshape(&y, &[n, blocks * block])
    }

    /// Rows `ids` of an embedding table, as f32 `[n, hidden]`.
    pub(super) fn embed(&mut self, table: &Weight, ids: &Value) -> Result<Value, EmitError> {
        match table {
            // A tied table is `[hidden, vocab]` (`abi::weight_specs`), blocked or not.
            Weight::Dense(t) if self.d.tied_embeddings && t.ty().rank() == 3 => {
                let t = self.widen(t);
                self.b.take_blocked_columns(&t, ids)
            }
            Weight::Dense(t) if self.d.tied_embeddings => {
                let t = self.widen(t);
                self.b.take_columns(&t, ids)
            }
            Weight::Dense(t) => {
                let t = self.widen(t);
                self.b.take_rows(&t, ids)
            }
            Weight::Packed { q, scales, biases } => {
                let [rows, groups, group] = [q.dims()[0], q.dims()[1], q.dims()[2]];
                let n = ids.dims()[0];
                let flat = self.b.reshape(q, &[rows, groups * group])?;
                let picked = self.b.take_rows(&flat, ids)?;
                let picked = self.b.reshape(&picked, &[n, groups, group])?;
                let s = self.b.take_rows(scales, ids)?;
                let b = self.b.take_rows(biases, ids)?;
                let x = self.dequantize(&picked, &s, &b)?;
                self.b.reshape(&x, &[n, groups * group])
            }
        }
    }

    pub(super) fn linear(
        &mut self,
        x: &Value,
        w: &(Weight, Option<Value>),
    ) -> Result<Value, EmitError> {
        let y = match &w.0 {
            Weight::Dense(weight) if weight.ty().rank() == 3 => self.blocked_matmul(x, weight)?,
            Weight::Dense(weight) => {
                let weight = self.widen(weight);
                self.b.matmul(x, &weight)?
            }
            Weight::Packed { q, scales, biases } if self.format.uses_kernels() => {
                self.kernel_matmul(x, q, scales, biases)?
            }
            Weight::Packed { q, scales, biases } => self.packed_matmul(x, q, scales, biases)?,
        };
        match &w.1 {
            Some(bias) => {
                let bias = self.b.broadcast_in_dim(bias, y.dims(), &[1])?;
                self.b.add(&y, &bias)
            }
            None => Ok(y),
        }
    }
}
