//! Contractions: `dot_general`, the matrix product, and reductions over dimensions.

use std::fmt::Write as _;

use super::{FunctionBuilder, dims_str, distinct, in_range};
use crate::error::EmitError;
use crate::hlo::types::{DotDims, ElementType, Reduce, TensorType, Value};

impl FunctionBuilder {
    /// `dot_general`; the result is batch dims, then lhs free dims, then rhs free dims.
    pub fn dot_general(
        &mut self,
        lhs: &Value,
        rhs: &Value,
        dims: &DotDims,
    ) -> Result<Value, EmitError> {
        let (lr, rr) = (lhs.ty.rank(), rhs.ty.rank());
        let ok = lhs.element() == rhs.element()
            && dims.lhs_batch.len() == dims.rhs_batch.len()
            && dims.lhs_contract.len() == dims.rhs_contract.len()
            && in_range(&dims.lhs_batch, lr)
            && in_range(&dims.lhs_contract, lr)
            && in_range(&dims.rhs_batch, rr)
            && in_range(&dims.rhs_contract, rr)
            && distinct(&[dims.lhs_batch.clone(), dims.lhs_contract.clone()].concat())
            && distinct(&[dims.rhs_batch.clone(), dims.rhs_contract.clone()].concat())
            && dims
                .lhs_batch
                .iter()
                .zip(&dims.rhs_batch)
                .chain(dims.lhs_contract.iter().zip(&dims.rhs_contract))
                .all(|(&l, &r)| lhs.dims()[l as usize] == rhs.dims()[r as usize]);
        if !ok {
            return Err(Self::err(
                "dot_general",
                format!(
                    "{} · {} with batch [{}]/[{}] contracting [{}]/[{}]",
                    lhs.ty,
                    rhs.ty,
                    dims_str(&dims.lhs_batch),
                    dims_str(&dims.rhs_batch),
                    dims_str(&dims.lhs_contract),
                    dims_str(&dims.rhs_contract)
                ),
            ));
        }
        let free = |rank: usize, batch: &[i64], contract: &[i64]| -> Vec<i64> {
            (0..rank as i64)
                .filter(|d| !batch.contains(d) && !contract.contains(d))
                .collect()
        };
        let mut out_dims: Vec<i64> = dims
            .lhs_batch
            .iter()
            .map(|&d| lhs.dims()[d as usize])
            .collect();
        out_dims.extend(
            free(lr, &dims.lhs_batch, &dims.lhs_contract)
                .iter()
                .map(|&d| lhs.dims()[d as usize]),
        );
        out_dims.extend(
            free(rr, &dims.rhs_batch, &dims.rhs_contract)
                .iter()
                .map(|&d| rhs.dims()[d as usize]),
        );
        let out = self.fresh(TensorType::new(&out_dims, lhs.element()));
        let mut attr = String::new();
        if !dims.lhs_batch.is_empty() {
            let _ = write!(
                attr,
                "batching_dims = [{}] x [{}], ",
                dims_str(&dims.lhs_batch),
                dims_str(&dims.rhs_batch)
            );
        }
        let _ = write!(
            attr,
            "contracting_dims = [{}] x [{}]",
            dims_str(&dims.lhs_contract),
            dims_str(&dims.rhs_contract)
        );
        self.line(format!(
            "{out} = stablehlo.dot_general {lhs}, {rhs}, {attr} : ({}, {}) -> {}",
            lhs.ty, rhs.ty, out.ty
        ));
        Ok(out)
    }

    /// `[.., k] x [k, n] -> [.., n]` for a rank-2 rhs: the common linear layer.
    pub fn matmul(&mut self, lhs: &Value, rhs: &Value) -> Result<Value, EmitError> {
        let last = lhs.ty.rank() as i64 - 1;
        self.dot_general(
            lhs,
            rhs,
            &DotDims {
                lhs_contract: vec![last],
                rhs_contract: vec![0],
                ..DotDims::default()
            },
        )
    }

    /// Reduces `a` over `dims` with a float sum or max.
    pub fn reduce(&mut self, kind: Reduce, a: &Value, dims: &[i64]) -> Result<Value, EmitError> {
        if !a.element().is_float() || !in_range(dims, a.ty.rank()) || !distinct(dims) {
            return Err(Self::err(
                "reduce",
                format!("dims [{}] of {}", dims_str(dims), a.ty),
            ));
        }
        let init = match kind {
            Reduce::Sum => self.splat_f32(0.0, &[]),
            Reduce::Max => self.splat_f32(f32::NEG_INFINITY, &[]),
        };
        let init = if a.element() == ElementType::F32 {
            init
        } else {
            self.convert(&init, a.element())
        };
        let kept: Vec<i64> = (0..a.ty.rank())
            .filter(|d| !dims.contains(&(*d as i64)))
            .map(|d| a.dims()[d])
            .collect();
        let out = self.fresh(TensorType::new(&kept, a.element()));
        let body = match kind {
            Reduce::Sum => "stablehlo.add",
            Reduce::Max => "stablehlo.maximum",
        };
        self.line(format!(
            "{out} = stablehlo.reduce({a} init: {init}) applies {body} across dimensions = [{}] : ({}, {}) -> {}",
            dims_str(dims),
            a.ty,
            init.ty,
            out.ty
        ));
        Ok(out)
    }
}
