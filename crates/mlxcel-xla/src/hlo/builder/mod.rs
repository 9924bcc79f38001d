//! [`FunctionBuilder`]: one `func.func`, every op's operand shapes checked and its result type
//! computed as it is emitted.
//!
//! The ops are grouped by kind, each in its own file: `elementwise.rs` (constants, arithmetic,
//! comparisons, conversions), `layout.rs` (reshape, transpose, broadcast, slice, concatenate),
//! `contraction.rs` (dot products and reductions), `indexing.rs` (gathers, scatters, dynamic
//! slices) and `dispatch.rs` (calls of mlxcel's kernels). This file holds the builder itself: its
//! arguments, its fresh SSA names, and the finished function.

use crate::error::EmitError;
use crate::hlo::module::Function;
use crate::hlo::types::{TensorType, Value};

mod contraction;
mod dispatch;
mod elementwise;
mod indexing;
mod layout;
#[cfg(test)]
mod tests;

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
