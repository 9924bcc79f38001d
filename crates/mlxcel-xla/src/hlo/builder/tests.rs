//! The builder's shape checks and rendering, op by op.

use super::*;
use crate::error::EmitError;
use crate::hlo::Module;
use crate::hlo::types::ElementType::{F32, I1, I32};
use crate::hlo::types::{Binary, Compare, DotDims, ElementType, Reduce, TensorType, Unary, Value};

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
