//! The emitter's types: element and tensor types, SSA values that carry their type, and the op
//! kinds (`Binary`, `Unary`, `Compare`, `Reduce`, `DotDims`) the builder takes.

use std::fmt;

/// Element types the emitter uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    F32,
    F16,
    BF16,
    I32,
    I1,
    /// Unsigned 32-bit; MLIR spells it `ui32`.
    U32,
    /// Unsigned 8-bit (8-bit quantized weights, one per byte); MLIR spells it `ui8`.
    U8,
    /// Unsigned 4-bit (4-bit quantized weights, two per byte, the first in the low nibble: the
    /// byte order of MLX's packed words); MLIR spells it `ui4`.
    U4,
    /// Signless 8-bit, MLIR's `i8`: how packed 8-bit codes are handed to a kernel dispatch (a
    /// bitcast of the `ui8` argument, which StableHLO's conversion would otherwise rewrite).
    I8,
    /// Signless 4-bit, MLIR's `i4` (as [`Self::I8`], for 4-bit codes).
    I4,
}

impl ElementType {
    pub(super) fn mlir(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::I32 => "i32",
            Self::I1 => "i1",
            Self::U32 => "ui32",
            Self::U8 => "ui8",
            Self::U4 => "ui4",
            Self::I8 => "i8",
            Self::I4 => "i4",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }

    pub(super) fn is_integer(self) -> bool {
        matches!(
            self,
            Self::I32 | Self::U32 | Self::U8 | Self::U4 | Self::I8 | Self::I4
        )
    }

    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            Self::F32 | Self::I32 | Self::U32 => 32,
            Self::F16 | Self::BF16 => 16,
            Self::U8 | Self::I8 => 8,
            Self::U4 | Self::I4 => 4,
            Self::I1 => 1,
        }
    }

    /// The unsigned integer type of `bits` bits (4, 8 or 32), if there is one.
    pub fn unsigned(bits: u32) -> Option<Self> {
        match bits {
            4 => Some(Self::U4),
            8 => Some(Self::U8),
            32 => Some(Self::U32),
            _ => None,
        }
    }
}

/// A ranked tensor type with static dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dims: Vec<i64>,
    pub element: ElementType,
}

impl TensorType {
    pub fn new(dims: &[i64], element: ElementType) -> Self {
        Self {
            dims: dims.to_vec(),
            element,
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of elements.
    pub fn elements(&self) -> i64 {
        self.dims.iter().product()
    }

    pub(super) fn with_element(&self, element: ElementType) -> Self {
        Self {
            dims: self.dims.clone(),
            element,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.element.mlir())
    }
}

/// An SSA value of a function under construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub(super) name: String,
    pub(super) ty: TensorType,
}

impl Value {
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    pub fn dims(&self) -> &[i64] {
        &self.ty.dims
    }

    pub fn element(&self) -> ElementType {
        self.ty.element
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Elementwise binary ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Subtract,
    Multiply,
    Divide,
    Maximum,
    And,
    ShiftRightLogical,
}

impl Binary {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Subtract => "subtract",
            Self::Multiply => "multiply",
            Self::Divide => "divide",
            Self::Maximum => "maximum",
            Self::And => "and",
            Self::ShiftRightLogical => "shift_right_logical",
        }
    }
}

/// Elementwise unary ops over floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Exp,
    Rsqrt,
    Negate,
    Logistic,
    Cosine,
    Sine,
    Tanh,
}

impl Unary {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Exp => "exponential",
            Self::Rsqrt => "rsqrt",
            Self::Tanh => "tanh",
            Self::Negate => "negate",
            Self::Logistic => "logistic",
            Self::Cosine => "cosine",
            Self::Sine => "sine",
        }
    }
}

/// Comparison directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Compare {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Eq => "EQ",
            Self::Lt => "LT",
            Self::Le => "LE",
            Self::Gt => "GT",
            Self::Ge => "GE",
        }
    }
}

/// Reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Max,
}

/// Dimension numbers of a `dot_general`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DotDims {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contract: Vec<i64>,
    pub rhs_contract: Vec<i64>,
}
