//! Constants, element-wise arithmetic, comparisons, selection and element type conversions.

use super::{FunctionBuilder, f32_literal, in_range};
use crate::error::EmitError;
use crate::hlo::types::{Binary, Compare, ElementType, TensorType, Unary, Value};

impl FunctionBuilder {
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
}
