//! Ops that move elements without computing: reshape, transpose, broadcast, slice and
//! concatenate.

use super::{FunctionBuilder, dims_str, distinct, in_range};
use crate::error::EmitError;
use crate::hlo::types::{TensorType, Value};

impl FunctionBuilder {
    /// Reshape to `dims` (same element count).
    pub fn reshape(&mut self, a: &Value, dims: &[i64]) -> Result<Value, EmitError> {
        let ty = TensorType::new(dims, a.element());
        if ty.elements() != a.ty.elements() || dims.iter().any(|&d| d < 0) {
            return Err(Self::err("reshape", format!("{} to {ty}", a.ty)));
        }
        let out = self.fresh(ty);
        self.line(format!(
            "{out} = stablehlo.reshape {a} : ({}) -> {}",
            a.ty, out.ty
        ));
        Ok(out)
    }

    /// Permutes dimensions: result dim `i` is operand dim `perm[i]`.
    pub fn transpose(&mut self, a: &Value, perm: &[i64]) -> Result<Value, EmitError> {
        if perm.len() != a.ty.rank() || !in_range(perm, a.ty.rank()) || !distinct(perm) {
            return Err(Self::err(
                "transpose",
                format!("permutation [{}] of {}", dims_str(perm), a.ty),
            ));
        }
        let dims: Vec<i64> = perm.iter().map(|&p| a.dims()[p as usize]).collect();
        let out = self.fresh(TensorType::new(&dims, a.element()));
        self.line(format!(
            "{out} = stablehlo.transpose {a}, dims = [{}] : ({}) -> {}",
            dims_str(perm),
            a.ty,
            out.ty
        ));
        Ok(out)
    }

    /// Broadcasts `a` into `dims`; operand dim `i` maps to result dim `mapping[i]`.
    pub fn broadcast_in_dim(
        &mut self,
        a: &Value,
        dims: &[i64],
        mapping: &[i64],
    ) -> Result<Value, EmitError> {
        let ok = mapping.len() == a.ty.rank()
            && in_range(mapping, dims.len())
            && mapping.windows(2).all(|w| w[0] < w[1])
            && mapping.iter().zip(a.dims()).all(|(&m, &d)| {
                let target = dims[m as usize];
                d == target || d == 1
            });
        if !ok {
            return Err(Self::err(
                "broadcast_in_dim",
                format!(
                    "{} into {} with dims [{}]",
                    a.ty,
                    TensorType::new(dims, a.element()),
                    dims_str(mapping)
                ),
            ));
        }
        let out = self.fresh(TensorType::new(dims, a.element()));
        self.line(format!(
            "{out} = stablehlo.broadcast_in_dim {a}, dims = [{}] : ({}) -> {}",
            dims_str(mapping),
            a.ty,
            out.ty
        ));
        Ok(out)
    }

    /// Static slice `[start, limit)` with stride 1.
    pub fn slice(&mut self, a: &Value, start: &[i64], limit: &[i64]) -> Result<Value, EmitError> {
        let rank = a.ty.rank();
        let ok = start.len() == rank
            && limit.len() == rank
            && start
                .iter()
                .zip(limit)
                .zip(a.dims())
                .all(|((&s, &l), &d)| 0 <= s && s <= l && l <= d);
        if !ok {
            return Err(Self::err(
                "slice",
                format!("[{}]..[{}] of {}", dims_str(start), dims_str(limit), a.ty),
            ));
        }
        let dims: Vec<i64> = start.iter().zip(limit).map(|(s, l)| l - s).collect();
        let out = self.fresh(TensorType::new(&dims, a.element()));
        let strides = vec![1; rank];
        self.line(format!(
            "{out} = stablehlo.slice {a} [{}] : ({}) -> {}",
            start
                .iter()
                .zip(limit)
                .zip(&strides)
                .map(|((s, l), st)| format!("{s}:{l}:{st}"))
                .collect::<Vec<_>>()
                .join(", "),
            a.ty,
            out.ty
        ));
        Ok(out)
    }

    /// Concatenates along `dim`.
    pub fn concatenate(&mut self, parts: &[&Value], dim: i64) -> Result<Value, EmitError> {
        let Some(first) = parts.first() else {
            return Err(Self::err("concatenate", "no operands".to_owned()));
        };
        let rank = first.ty.rank();
        let ok = in_range(&[dim], rank)
            && parts.iter().all(|p| {
                p.element() == first.element()
                    && p.ty.rank() == rank
                    && (0..rank).all(|i| i == dim as usize || p.dims()[i] == first.dims()[i])
            });
        if !ok {
            return Err(Self::err(
                "concatenate",
                format!(
                    "along {dim}: {}",
                    parts
                        .iter()
                        .map(|p| p.ty.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let mut dims = first.dims().to_vec();
        dims[dim as usize] = parts.iter().map(|p| p.dims()[dim as usize]).sum();
        let out = self.fresh(TensorType::new(&dims, first.element()));
        let names = parts
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let types = parts
            .iter()
            .map(|p| p.ty.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.line(format!(
            "{out} = stablehlo.concatenate {names}, dim = {dim} : ({types}) -> {}",
            out.ty
        ));
        Ok(out)
    }
}
