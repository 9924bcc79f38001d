//! Indexed reads and writes: gathers of rows and columns, scatters into leading dimensions, and
//! dynamic slices.

use super::{FunctionBuilder, dims_str};
use crate::error::EmitError;
use crate::hlo::types::{Binary, ElementType, TensorType, Value};

impl FunctionBuilder {
    /// Rows of `table` (`[rows, width]`) picked by `ids` (`[n]`, i32): `[n, width]`.
    pub fn take_rows(&mut self, table: &Value, ids: &Value) -> Result<Value, EmitError> {
        self.take(table, ids, 0)
    }

    /// Columns of `table` (`[height, columns]`) picked by `ids` (`[n]`, i32), as rows:
    /// `[n, height]`.
    pub fn take_columns(&mut self, table: &Value, ids: &Value) -> Result<Value, EmitError> {
        self.take(table, ids, 1)
    }

    /// Columns of a blocked table (`[blocks, height, width]`, column `c` of the whole table at
    /// block `c / width`, position `c % width`) picked by `ids` (`[n]`, i32), as rows:
    /// `[n, height]`.
    pub fn take_blocked_columns(&mut self, table: &Value, ids: &Value) -> Result<Value, EmitError> {
        if table.ty.rank() != 3 || ids.ty.rank() != 1 || ids.element() != ElementType::I32 {
            return Err(Self::err(
                "gather",
                format!("blocked columns of {} by {}", table.ty, ids.ty),
            ));
        }
        let (n, height, width) = (ids.dims()[0], table.dims()[1], table.dims()[2]);
        let w = self.splat_int(width, &[n], ElementType::I32);
        let block = self.div(ids, &w)?;
        let start = self.mul(&block, &w)?;
        let column = self.binary(Binary::Subtract, ids, &start)?;
        let block = self.reshape(&block, &[n, 1])?;
        let column = self.reshape(&column, &[n, 1])?;
        let indices = self.concatenate(&[&block, &column], 1)?;
        let out = self.fresh(TensorType::new(&[n, height], table.element()));
        self.line(format!(
            "{out} = \"stablehlo.gather\"({table}, {indices}) {{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0, 2], start_index_map = [0, 2], index_vector_dim = 1>, slice_sizes = array<i64: 1, {height}, 1>, indices_are_sorted = false}} : ({}, {}) -> {}",
            table.ty, indices.ty, out.ty
        ));
        Ok(out)
    }

    /// Slices of a 2-D `table` along dimension `along` (0: rows, 1: columns) picked by `ids`,
    /// `[n, the other dimension]`.
    fn take(&mut self, table: &Value, ids: &Value, along: usize) -> Result<Value, EmitError> {
        if table.ty.rank() != 2 || ids.ty.rank() != 1 || ids.element() != ElementType::I32 {
            let what = ["rows", "columns"][along];
            return Err(Self::err(
                "gather",
                format!("{what} of {} by {}", table.ty, ids.ty),
            ));
        }
        let n = ids.dims()[0];
        let width = table.dims()[1 - along];
        let sizes = if along == 0 {
            format!("1, {width}")
        } else {
            format!("{width}, 1")
        };
        let indices = self.reshape(ids, &[n, 1])?;
        let out = self.fresh(TensorType::new(&[n, width], table.element()));
        self.line(format!(
            "{out} = \"stablehlo.gather\"({table}, {indices}) {{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [{along}], start_index_map = [{along}], index_vector_dim = 1>, slice_sizes = array<i64: {sizes}>, indices_are_sorted = false}} : ({}, {}) -> {}",
            table.ty, indices.ty, out.ty
        ));
        Ok(out)
    }

    /// Writes `updates` (`[n, rest...]`) into `operand` (`[a_1, ..., a_k, rest...]`) at the index
    /// tuples of `indices` (`[n, k]`, i32, unique), each addressing the operand's first `k`
    /// dimensions. Out-of-range indices are the caller's to prevent. (IREE lowers a scatter only
    /// when the indexed dimensions lead the operand.)
    pub fn scatter_leading(
        &mut self,
        operand: &Value,
        indices: &Value,
        updates: &Value,
    ) -> Result<Value, EmitError> {
        let r = operand.ty.rank();
        let k = if indices.ty.rank() == 2 {
            indices.dims()[1] as usize
        } else {
            0
        };
        let ok = (1..r).contains(&k)
            && indices.element() == ElementType::I32
            && updates.element() == operand.element()
            && updates.ty.rank() == r - k + 1
            && updates.dims()[0] == indices.dims()[0]
            && updates.dims()[1..] == operand.dims()[k..];
        if !ok {
            return Err(Self::err(
                "scatter",
                format!("{} into {} at {}", updates.ty, operand.ty, indices.ty),
            ));
        }
        let window: Vec<i64> = (1..(r - k + 1) as i64).collect();
        let indexed = dims_str(&(0..k as i64).collect::<Vec<_>>());
        let out = self.fresh(operand.ty.clone());
        let scalar = TensorType::new(&[], operand.element());
        self.line(format!(
            "{out} = \"stablehlo.scatter\"({operand}, {indices}, {updates}) ({{\n      ^bb0(%old: {scalar}, %new: {scalar}):\n        stablehlo.return %new : {scalar}\n    }}) {{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [{}], inserted_window_dims = [{indexed}], scatter_dims_to_operand_dims = [{indexed}], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = true}} : ({}, {}, {}) -> {}",
            dims_str(&window),
            operand.ty,
            indices.ty,
            updates.ty,
            out.ty
        ));
        Ok(out)
    }

    /// Slice of `sizes` at dynamic `starts` (scalar i32 values, one per dimension).
    pub fn dynamic_slice(
        &mut self,
        a: &Value,
        starts: &[&Value],
        sizes: &[i64],
    ) -> Result<Value, EmitError> {
        let ok = starts.len() == a.ty.rank()
            && sizes.len() == a.ty.rank()
            && starts
                .iter()
                .all(|s| s.ty == TensorType::new(&[], ElementType::I32))
            && sizes.iter().zip(a.dims()).all(|(&s, &d)| 0 <= s && s <= d);
        if !ok {
            return Err(Self::err(
                "dynamic_slice",
                format!("sizes [{}] of {}", dims_str(sizes), a.ty),
            ));
        }
        let out = self.fresh(TensorType::new(sizes, a.element()));
        let names = starts
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let types = std::iter::once(a.ty.to_string())
            .chain(starts.iter().map(|s| s.ty.to_string()))
            .collect::<Vec<_>>()
            .join(", ");
        self.line(format!(
            "{out} = stablehlo.dynamic_slice {a}, {names}, sizes = [{}] : ({types}) -> {}",
            dims_str(sizes),
            out.ty
        ));
        Ok(out)
    }
}
