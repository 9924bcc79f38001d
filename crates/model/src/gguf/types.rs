//! GGML tensor types and the block layouts of the ones we read.

use std::fmt;

/// A GGML tensor type id, as stored in a GGUF tensor-info record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: Self = Self(0);
    pub const F16: Self = Self(1);
    pub const Q4_0: Self = Self(2);
    pub const Q4_1: Self = Self(3);
    pub const Q5_0: Self = Self(6);
    pub const Q5_1: Self = Self(7);
    pub const Q8_0: Self = Self(8);
    pub const Q2_K: Self = Self(10);
    pub const Q3_K: Self = Self(11);
    pub const Q4_K: Self = Self(12);
    pub const Q5_K: Self = Self(13);
    pub const Q6_K: Self = Self(14);
    pub const BF16: Self = Self(30);
    /// OCP microscaling FP4 (gpt-oss's experts): 32 E2M1 values sharing one E8M0 scale byte.
    pub const MXFP4: Self = Self(39);

    /// Elements per block and bytes per block, for every type mlxcel reads, dequantizes exactly
    /// (`dequant::dequantize_reference`) and imports (K-quants have 256-element super-blocks;
    /// an MXFP4 block is its scale byte, then the 32 four-bit codes in 16 bytes).
    pub fn layout(self) -> Option<(usize, usize)> {
        match self {
            Self::F32 => Some((1, 4)),
            Self::F16 | Self::BF16 => Some((1, 2)),
            Self::Q4_0 => Some((32, 18)),
            Self::Q4_1 => Some((32, 20)),
            Self::Q5_0 => Some((32, 22)),
            Self::Q5_1 => Some((32, 24)),
            Self::Q8_0 => Some((32, 34)),
            Self::Q2_K => Some((256, 84)),
            Self::Q3_K => Some((256, 110)),
            Self::Q4_K => Some((256, 144)),
            Self::Q5_K => Some((256, 176)),
            Self::Q6_K => Some((256, 210)),
            Self::MXFP4 => Some((32, 17)),
            _ => None,
        }
    }

    /// Whether mlxcel can read, dequantize and import tensors of this type.
    pub fn is_supported(self) -> bool {
        self.layout().is_some()
    }

    /// Bytes of a tensor of `elements` elements, for readable types.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let (block, bytes) = self.layout()?;
        if !elements.is_multiple_of(block as u64) {
            return None;
        }
        (elements / block as u64).checked_mul(bytes as u64)
    }

    /// ggml's name for the type (`Q4_K`, `IQ2_XS`, ...).
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 40] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("unknown")
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (type id {})", self.name(), self.0)
    }
}
