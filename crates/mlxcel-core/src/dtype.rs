//! Element types of MLX arrays.

/// The element type of an [`crate::Array`].
///
/// The discriminants are the codes the C++ shim uses (`dtype_from_code` in `cpp/array.cc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// Boolean, one byte.
    Bool = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Unsigned 16-bit integer.
    U16 = 2,
    /// Unsigned 32-bit integer (token ids, packed quantized weights).
    U32 = 3,
    /// Unsigned 64-bit integer.
    U64 = 4,
    /// Signed 8-bit integer.
    I8 = 5,
    /// Signed 16-bit integer.
    I16 = 6,
    /// Signed 32-bit integer.
    I32 = 7,
    /// Signed 64-bit integer.
    I64 = 8,
    /// IEEE half precision.
    F16 = 9,
    /// IEEE single precision: the activation type on CPU.
    F32 = 10,
    /// IEEE double precision (not supported by every MLX backend).
    F64 = 11,
    /// bfloat16 (the upper half of an f32).
    BF16 = 12,
}

impl Dtype {
    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Dtype> {
        const ALL: [Dtype; 13] = [
            Dtype::Bool,
            Dtype::U8,
            Dtype::U16,
            Dtype::U32,
            Dtype::U64,
            Dtype::I8,
            Dtype::I16,
            Dtype::I32,
            Dtype::I64,
            Dtype::F16,
            Dtype::F32,
            Dtype::F64,
            Dtype::BF16,
        ];
        ALL.into_iter().find(|d| d.code() == code)
    }
}
