//! A StableHLO text emitter that tracks shapes.
//!
//! A [`FunctionBuilder`] hands out [`Value`]s that carry their [`TensorType`]. Every op checks its
//! operands' shapes and element types and computes its result type, so an ill-shaped program is
//! refused here, with the op and the shapes named, instead of by `iree-compile` minutes later.
//! The text is StableHLO's MLIR assembly; [`Module::to_text`] renders it.

mod builder;
mod module;
mod types;

pub use builder::FunctionBuilder;
pub use module::{Function, Module};
pub use types::{Binary, Compare, DotDims, ElementType, Reduce, TensorType, Unary, Value};
