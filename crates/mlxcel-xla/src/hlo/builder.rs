//! [`FunctionBuilder`]: one `func.func`, every op's operand shapes checked and its result type
//! computed as it is emitted.

use std::fmt::Write as _;

use super::module::Function;
use super::types::{Binary, Compare, DotDims, ElementType, Reduce, TensorType, Unary, Value};
use crate::error::EmitError;

/// Builds one `func.func`, checking every op's shapes.
#[derive(Debug)]
pub struct FunctionBuilder {
    name: String,
    args: Vec<(Value, Option<String>)>,
    body: String,
    next: usize,
}

fn dims_str(dims: &[i64]) -> String {
    dims.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn in_range(dims: &[i64], rank: usize) -> bool {
    dims.iter().all(|&d| d >= 0 && (d as usize) < rank)
}

fn distinct(dims: &[i64]) -> bool {
    let mut v = dims.to_vec();
    v.sort_unstable();
    v.windows(2).all(|w| w[0] != w[1])
}

/// Renders an f32 so that MLIR parses it back exactly (hex bit pattern for non-finite values).
fn f32_literal(x: f32) -> String {
    if x.is_finite() {
        let s = format!("{x:e}");
        // MLIR wants a mantissa with a decimal point: `1e0` → `1.0e0`.
        match s.split_once('e') {
            Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
            _ => s,
        }
    } else {
        format!("0x{:08X}", x.to_bits())
    }
}

impl FunctionBuilder {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            args: Vec::new(),
            body: String::new(),
            next: 0,
        }
    }

    /// Adds an argument.
    pub fn arg(&mut self, ty: TensorType) -> Value {
        self.arg_with_attrs(ty, None)
    }

    /// Adds an argument with an MLIR attribute dictionary body (e.g. `iree.abi.name = "x"`).
    pub fn arg_with_attrs(&mut self, ty: TensorType, attrs: Option<String>) -> Value {
        let v = Value {
            name: format!("%arg{}", self.args.len()),
            ty,
        };
        self.args.push((v.clone(), attrs));
        v
    }

    fn fresh(&mut self, ty: TensorType) -> Value {
        let v = Value {
            name: format!("%{}", self.next),
            ty,
        };
        self.next += 1;
        v
    }

    fn line(&mut self, text: String) {
        self.body.push_str("    ");
        self.body.push_str(&text);
        self.body.push('\n');
    }

    fn err(op: &'static str, detail: String) -> EmitError {
        EmitError::Shape { op, detail }
    }

    /// A scalar or splat constant.
    pub fn splat_f32(&mut self, value: f32, dims: &[i64]) -> Value {
        let ty = TensorType::new(dims, ElementType::F32);
        let out = self.fresh(ty.clone());
        self.line(format!(
            "{out} = stablehlo.constant dense<{}> : {ty}",
            f32_literal(value)
        ));
        out
    }

    /// A splat integer constant of an integer type.
    pub fn splat_int(&mut self, value: i64, dims: &[i64], element: ElementType) -> Value {
        let ty = TensorType::new(dims, element);
        let out = self.fresh(ty.clone());
        self.line(format!("{out} = stablehlo.constant dense<{value}> : {ty}"));
        out
    }

    /// A rank-1 f32 constant.
    pub fn vector_f32(&mut self, values: &[f32]) -> Value {
        let ty = TensorType::new(&[values.len() as i64], ElementType::F32);
        let out = self.fresh(ty.clone());
        let body = values
            .iter()
            .map(|&v| f32_literal(v))
            .collect::<Vec<_>>()
            .join(", ");
        self.line(format!("{out} = stablehlo.constant dense<[{body}]> : {ty}"));
        out
    }

    /// `iota` along `dim` of a tensor of `dims`.
    pub fn iota(
        &mut self,
        dims: &[i64],
        dim: i64,
        element: ElementType,
    ) -> Result<Value, EmitError> {
        if !in_range(&[dim], dims.len()) {
            return Err(Self::err(
                "iota",
                format!("dimension {dim} of a rank-{} result", dims.len()),
            ));
        }
        let ty = TensorType::new(dims, element);
        let out = self.fresh(ty.clone());
        self.line(format!("{out} = stablehlo.iota dim = {dim} : {ty}"));
        Ok(out)
    }

    /// An elementwise binary op over operands of one type.
    pub fn binary(&mut self, op: Binary, a: &Value, b: &Value) -> Result<Value, EmitError> {
        if a.ty != b.ty {
            return Err(Self::err(
                op.name(),
                format!("operands {} and {} differ", a.ty, b.ty),
            ));
        }
        let needs_int = matches!(op, Binary::And | Binary::ShiftRightLogical);
        if needs_int && !(a.element().is_integer() || a.element() == ElementType::I1) {
            return Err(Self::err(
                op.name(),
                format!("needs integer operands, got {}", a.ty),
            ));
        }
        let out = self.fresh(a.ty.clone());
        self.line(format!(
            "{out} = stablehlo.{} {a}, {b} : {}",
            op.name(),
            a.ty
        ));
        Ok(out)
    }

    pub fn add(&mut self, a: &Value, b: &Value) -> Result<Value, EmitError> {
        self.binary(Binary::Add, a, b)
    }

    pub fn sub(&mut self, a: &Value, b: &Value) -> Result<Value, EmitError> {
        self.binary(Binary::Subtract, a, b)
    }

    pub fn mul(&mut self, a: &Value, b: &Value) -> Result<Value, EmitError> {
        self.binary(Binary::Multiply, a, b)
    }

    pub fn div(&mut self, a: &Value, b: &Value) -> Result<Value, EmitError> {
        self.binary(Binary::Divide, a, b)
    }

    /// An elementwise unary op over floats.
    pub fn unary(&mut self, op: Unary, a: &Value) -> Result<Value, EmitError> {
        if !a.element().is_float() {
            return Err(Self::err(
                op.name(),
                format!("needs a float operand, got {}", a.ty),
            ));
        }
        let out = self.fresh(a.ty.clone());
        self.line(format!("{out} = stablehlo.{} {a} : {}", op.name(), a.ty));
        Ok(out)
    }

    /// Elementwise comparison; the result is `i1`.
    pub fn compare(&mut self, dir: Compare, a: &Value, b: &Value) -> Result<Value, EmitError> {
        if a.ty != b.ty {
            return Err(Self::err(
                "compare",
                format!("operands {} and {} differ", a.ty, b.ty),
            ));
        }
        let out = self.fresh(a.ty.with_element(ElementType::I1));
        self.line(format!(
            "{out} = stablehlo.compare {}, {a}, {b} : ({}, {}) -> {}",
            dir.name(),
            a.ty,
            b.ty,
            out.ty
        ));
        Ok(out)
    }

    /// `pred ? on_true : on_false`, elementwise.
    pub fn select(
        &mut self,
        pred: &Value,
        on_true: &Value,
        on_false: &Value,
    ) -> Result<Value, EmitError> {
        if pred.element() != ElementType::I1 || pred.dims() != on_true.dims() {
            return Err(Self::err(
                "select",
                format!(
                    "predicate {} must be i1 of the operands' shape {}",
                    pred.ty, on_true.ty
                ),
            ));
        }
        if on_true.ty != on_false.ty {
            return Err(Self::err(
                "select",
                format!("branches {} and {} differ", on_true.ty, on_false.ty),
            ));
        }
        let out = self.fresh(on_true.ty.clone());
        self.line(format!(
            "{out} = stablehlo.select {pred}, {on_true}, {on_false} : {}, {}",
            pred.ty, out.ty
        ));
        Ok(out)
    }

    /// Element type conversion.
    pub fn convert(&mut self, a: &Value, element: ElementType) -> Value {
        let out = self.fresh(a.ty.with_element(element));
        self.line(format!(
            "{out} = stablehlo.convert {a} : ({}) -> {}",
            a.ty, out.ty
        ));
        out
    }

    /// Reinterprets `a`'s bits as `element`, which must have the same width (shape unchanged).
    pub fn bitcast_convert(&mut self, a: &Value, element: ElementType) -> Result<Value, EmitError> {
        if element.bits() != a.element().bits() {
            return Err(Self::err(
                "bitcast_convert",
                format!("{} to {}", a.ty, a.ty.with_element(element)),
            ));
        }
        let out = self.fresh(a.ty.with_element(element));
        self.line(format!(
            "{out} = stablehlo.bitcast_convert {a} : ({}) -> {}",
            a.ty, out.ty
        ));
        Ok(out)
    }

    /// A dispatch of `entry` (`@executable::@export`, declared at module level by
    /// [`Module::push_text`](super::Module::push_text)) over tensor `operands`, followed by
    /// `constants` as `index` operands, which are also the dispatch's workload. The executable's
    /// signature is not visible here: the caller matches it.
    pub fn dispatch(
        &mut self,
        entry: &str,
        operands: &[&Value],
        constants: &[i64],
        result: TensorType,
    ) -> Value {
        let mut results = self.dispatch_results(entry, operands, constants, &[result]);
        results.pop().expect("one result")
    }

    /// [`Self::dispatch`] with several results (at least one).
    pub fn dispatch_results(
        &mut self,
        entry: &str,
        operands: &[&Value],
        constants: &[i64],
        results: &[TensorType],
    ) -> Vec<Value> {
        let mut names = Vec::with_capacity(constants.len());
        for c in constants {
            let name = format!("%c{}", self.next);
            self.next += 1;
            self.line(format!("{name} = arith.constant {c} : index"));
            names.push(name);
        }
        let workload = names.join(", ");
        let args = operands
            .iter()
            .map(|v| v.to_string())
            .chain(names.iter().cloned())
            .collect::<Vec<_>>()
            .join(", ");
        let types = operands
            .iter()
            .map(|v| v.ty.to_string())
            .chain(names.iter().map(|_| "index".to_owned()))
            .collect::<Vec<_>>()
            .join(", ");
        let base = format!("%{}", self.next);
        self.next += 1;
        let result_types = results
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let (lhs, out_types, values) = if results.len() == 1 {
            let v = Value {
                name: base.clone(),
                ty: results[0].clone(),
            };
            (base, result_types, vec![v])
        } else {
            let values = results
                .iter()
                .enumerate()
                .map(|(i, t)| Value {
                    name: format!("{base}#{i}"),
                    ty: t.clone(),
                })
                .collect();
            (
                format!("{base}:{}", results.len()),
                format!("({result_types})"),
                values,
            )
        };
        self.line(format!(
            "{lhs} = flow.dispatch {entry}[{workload}]({args}) : ({types}) -> {out_types}"
        ));
        values
    }

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

    /// Ends the function, returning `results`.
    pub fn finish(mut self, results: &[&Value]) -> Function {
        let args = self
            .args
            .iter()
            .map(|(v, attrs)| match attrs {
                Some(a) => format!("{v}: {} {{{a}}}", v.ty),
                None => format!("{v}: {}", v.ty),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let result_types = results
            .iter()
            .map(|r| r.ty.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let names = results
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        self.line(format!("return {names} : {result_types}"));
        Function {
            text: format!(
                "  func.func @{}({args}) -> ({result_types}) {{\n{}  }}\n",
                self.name, self.body
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ElementType::{F32, I1, I32};
    use super::*;
    use crate::hlo::Module;

    fn t(dims: &[i64]) -> TensorType {
        TensorType::new(dims, F32)
    }

    fn last_line(b: &FunctionBuilder) -> &str {
        b.body.trim_end().lines().last().unwrap_or("").trim()
    }

    fn shape_err(r: Result<Value, EmitError>, op: &str) {
        match r {
            Err(EmitError::Shape { op: o, .. }) => assert_eq!(o, op),
            other => panic!("expected a {op} shape error, got {other:?}"),
        }
    }

    #[test]
    fn tensor_types_render_as_mlir() {
        assert_eq!(t(&[2, 3]).to_string(), "tensor<2x3xf32>");
        assert_eq!(TensorType::new(&[], I32).to_string(), "tensor<i32>");
        assert_eq!(
            TensorType::new(&[4], ElementType::U32).to_string(),
            "tensor<4xui32>"
        );
    }

    #[test]
    fn narrow_unsigned_types_render_and_convert_to_float() {
        assert_eq!(ElementType::unsigned(4), Some(ElementType::U4));
        assert_eq!(ElementType::unsigned(8), Some(ElementType::U8));
        assert_eq!(ElementType::unsigned(3), None);
        assert_eq!(ElementType::U4.bits(), 4);
        let mut b = FunctionBuilder::new("f");
        let q = b.arg(TensorType::new(&[6, 2, 8], ElementType::U4));
        let f = b.convert(&q, F32);
        assert_eq!(f.ty(), &t(&[6, 2, 8]));
        assert_eq!(
            last_line(&b),
            "%0 = stablehlo.convert %arg0 : (tensor<6x2x8xui4>) -> tensor<6x2x8xf32>"
        );
        // Integer-only ops accept the narrow types; float-only ones refuse them.
        let r = b.arg(TensorType::new(&[4], ElementType::U8));
        b.binary(Binary::And, &r, &r).unwrap();
        shape_err(b.unary(Unary::Exp, &r), "exponential");
        shape_err(b.reduce(Reduce::Sum, &q, &[2]), "reduce");
    }

    #[test]
    fn f32_literals_round_trip() {
        assert_eq!(f32_literal(1.0), "1.0e0");
        assert_eq!(f32_literal(f32::NEG_INFINITY), "0xFF800000");
        let x = 0.1f32;
        assert_eq!(f32_literal(x).parse::<f32>().unwrap(), x);
    }

    #[test]
    fn binary_ops_need_equal_types() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[2, 3]));
        let y = b.arg(t(&[2, 3]));
        let z = b.add(&x, &y).unwrap();
        assert_eq!(z.dims(), &[2, 3]);
        assert_eq!(
            last_line(&b),
            "%0 = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>"
        );
        let w = b.arg(t(&[3, 2]));
        shape_err(b.mul(&x, &w), "multiply");
        shape_err(b.binary(Binary::And, &x, &y), "and");
    }

    #[test]
    fn unary_ops_need_floats() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[4]));
        b.unary(Unary::Rsqrt, &x).unwrap();
        assert_eq!(last_line(&b), "%0 = stablehlo.rsqrt %arg0 : tensor<4xf32>");
        let i = b.arg(TensorType::new(&[4], I32));
        shape_err(b.unary(Unary::Exp, &i), "exponential");
    }

    #[test]
    fn compare_yields_i1_and_select_checks_the_predicate() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[4]));
        let y = b.arg(t(&[4]));
        let p = b.compare(Compare::Le, &x, &y).unwrap();
        assert_eq!(p.element(), I1);
        assert!(last_line(&b).contains("stablehlo.compare LE, %arg0, %arg1"));
        b.select(&p, &x, &y).unwrap();
        shape_err(b.select(&x, &x, &y), "select");
        let z = b.arg(t(&[5]));
        shape_err(b.compare(Compare::Eq, &x, &z), "compare");
    }

    #[test]
    fn reshape_keeps_the_element_count() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[2, 6]));
        assert_eq!(b.reshape(&x, &[3, 4]).unwrap().dims(), &[3, 4]);
        shape_err(b.reshape(&x, &[5, 2]), "reshape");
    }

    #[test]
    fn transpose_permutes_dims() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[2, 3, 4]));
        assert_eq!(b.transpose(&x, &[2, 0, 1]).unwrap().dims(), &[4, 2, 3]);
        shape_err(b.transpose(&x, &[0, 0, 1]), "transpose");
        shape_err(b.transpose(&x, &[0, 1]), "transpose");
    }

    #[test]
    fn broadcast_in_dim_checks_the_mapping() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[3]));
        let y = b.broadcast_in_dim(&x, &[2, 3], &[1]).unwrap();
        assert_eq!(y.dims(), &[2, 3]);
        shape_err(b.broadcast_in_dim(&x, &[3, 2], &[1]), "broadcast_in_dim");
        let one = b.arg(t(&[1]));
        assert_eq!(
            b.broadcast_in_dim(&one, &[2, 5], &[1]).unwrap().dims(),
            &[2, 5]
        );
    }

    #[test]
    fn slice_and_concatenate() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[2, 8]));
        let lo = b.slice(&x, &[0, 0], &[2, 4]).unwrap();
        let hi = b.slice(&x, &[0, 4], &[2, 8]).unwrap();
        assert_eq!(lo.dims(), &[2, 4]);
        assert!(last_line(&b).contains("[0:2:1, 4:8:1]"));
        shape_err(b.slice(&x, &[0, 4], &[2, 9]), "slice");
        assert_eq!(b.concatenate(&[&hi, &lo], 1).unwrap().dims(), &[2, 8]);
        let y = b.arg(t(&[3, 4]));
        shape_err(b.concatenate(&[&lo, &y], 1), "concatenate");
    }

    #[test]
    fn dot_general_orders_batch_then_free_dims() {
        let mut b = FunctionBuilder::new("f");
        let q = b.arg(t(&[2, 5, 3, 4]));
        let k = b.arg(t(&[2, 7, 3, 4]));
        let dims = DotDims {
            lhs_batch: vec![0, 2],
            rhs_batch: vec![0, 2],
            lhs_contract: vec![3],
            rhs_contract: vec![3],
        };
        assert_eq!(b.dot_general(&q, &k, &dims).unwrap().dims(), &[2, 3, 5, 7]);
        assert!(
            last_line(&b).contains("batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3]")
        );
        let bad = b.arg(t(&[2, 7, 3, 5]));
        shape_err(b.dot_general(&q, &bad, &dims), "dot_general");
        let x = b.arg(t(&[6, 4]));
        let w = b.arg(t(&[4, 9]));
        assert_eq!(b.matmul(&x, &w).unwrap().dims(), &[6, 9]);
        shape_err(b.matmul(&w, &x), "dot_general");
    }

    #[test]
    fn reduce_drops_the_reduced_dims() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[2, 3, 4]));
        assert_eq!(b.reduce(Reduce::Max, &x, &[2]).unwrap().dims(), &[2, 3]);
        assert!(last_line(&b).contains("applies stablehlo.maximum across dimensions = [2]"));
        shape_err(b.reduce(Reduce::Sum, &x, &[3]), "reduce");
    }

    #[test]
    fn gather_rows_and_scatter_rows() {
        let mut b = FunctionBuilder::new("f");
        let table = b.arg(t(&[10, 4]));
        let ids = b.arg(TensorType::new(&[3], I32));
        assert_eq!(b.take_rows(&table, &ids).unwrap().dims(), &[3, 4]);
        assert!(last_line(&b).contains("collapsed_slice_dims = [0]"));
        shape_err(b.take_rows(&ids, &table), "gather");
        assert_eq!(b.take_columns(&table, &ids).unwrap().dims(), &[3, 10]);
        let line = last_line(&b);
        assert!(line.contains("collapsed_slice_dims = [1], start_index_map = [1]"));
        assert!(line.contains("slice_sizes = array<i64: 10, 1>"));
        shape_err(b.take_columns(&ids, &table), "gather");
        let blocked = b.arg(t(&[5, 4, 2]));
        assert_eq!(
            b.take_blocked_columns(&blocked, &ids).unwrap().dims(),
            &[3, 4]
        );
        let line = last_line(&b);
        assert!(line.contains("collapsed_slice_dims = [0, 2], start_index_map = [0, 2]"));
        assert!(line.contains("slice_sizes = array<i64: 1, 4, 1>"));
        shape_err(b.take_blocked_columns(&table, &ids), "gather");
        let cache = b.arg(t(&[2, 8, 3, 4]));
        let idx = b.arg(TensorType::new(&[5, 2], I32));
        let upd = b.arg(t(&[5, 3, 4]));
        let out = b.scatter_leading(&cache, &idx, &upd).unwrap();
        assert_eq!(out.ty(), cache.ty());
        assert!(last_line(&b).contains(
            "update_window_dims = [1, 2], inserted_window_dims = [0, 1], \
             scatter_dims_to_operand_dims = [0, 1]"
        ));
        let bad = b.arg(t(&[5, 4, 3]));
        shape_err(b.scatter_leading(&cache, &idx, &bad), "scatter");
        // Three indexed dimensions: the updates are `[n, 4]`.
        let idx3 = b.arg(TensorType::new(&[5, 3], I32));
        let upd3 = b.arg(t(&[5, 4]));
        b.scatter_leading(&cache, &idx3, &upd3).unwrap();
        assert!(last_line(&b).contains(
            "update_window_dims = [1], inserted_window_dims = [0, 1, 2], \
             scatter_dims_to_operand_dims = [0, 1, 2]"
        ));
        shape_err(b.scatter_leading(&cache, &idx3, &upd), "scatter");
        let idx4 = b.arg(TensorType::new(&[5, 4], I32));
        shape_err(b.scatter_leading(&cache, &idx4, &upd3), "scatter");
    }

    #[test]
    fn dynamic_slice_needs_scalar_i32_starts() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg(t(&[4, 6]));
        let s = b.arg(TensorType::new(&[], I32));
        assert_eq!(
            b.dynamic_slice(&x, &[&s, &s], &[1, 6]).unwrap().dims(),
            &[1, 6]
        );
        shape_err(b.dynamic_slice(&x, &[&s], &[1, 6]), "dynamic_slice");
        shape_err(b.dynamic_slice(&x, &[&s, &s], &[1, 7]), "dynamic_slice");
    }

    #[test]
    fn iota_and_constants() {
        let mut b = FunctionBuilder::new("f");
        assert_eq!(b.iota(&[3, 4], 1, I32).unwrap().dims(), &[3, 4]);
        assert!(b.iota(&[3], 1, I32).is_err());
        let c = b.vector_f32(&[1.0, 2.5]);
        assert_eq!(c.dims(), &[2]);
        assert!(last_line(&b).contains("dense<[1.0e0, 2.5e0]>"));
    }

    #[test]
    fn functions_render_signature_and_return() {
        let mut b = FunctionBuilder::new("double");
        let x = b.arg(t(&[2]));
        let y = b.add(&x, &x).unwrap();
        let mut m = Module::new("m");
        m.push(b.finish(&[&y]));
        let text = m.to_text();
        assert!(text.starts_with("module @m {"));
        assert!(text.contains("func.func @double(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {"));
        assert!(text.contains("return %0 : tensor<2xf32>"));
    }
}
