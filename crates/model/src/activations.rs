//! What a backend multiplies quantized weights with: one type for the MLX backend's kernels, the
//! engine's options and the command lines (it lives here because every one of them depends on
//! this crate and none of them on each other).

/// What the quantized matmuls multiply the weights with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// f32 activations and accumulation: the reference numbers (the default).
    #[default]
    F32,
    /// Activations quantized to int8 per row and block of 32 inside each matmul, multiplied with
    /// AVX-512 VNNI (or AVX2's `vpmaddubsw`) over weights interleaved at load: about 3.5× less
    /// matmul time for eight sequences, ~2× for one, at the cost of small changes to the logits
    /// (docs/kernels.md). A row's result never depends on the other rows: a sequence gets the same
    /// bits batched or alone.
    Int8,
}

impl Activations {
    /// The names `from_str` accepts.
    pub const NAMES: [&'static str; 2] = ["f32", "int8"];

    /// The name `from_str` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
        }
    }
}

impl std::str::FromStr for Activations {
    type Err = String;

    /// `f32` or `int8` (case and surrounding spaces ignored); the error lists the choices.
    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "int8" => Ok(Self::Int8),
            _ => Err(format!(
                "unknown activations {name:?}: expected {}",
                Self::NAMES.join(" or ")
            )),
        }
    }
}

/// The element type of a KV cache (llama.cpp's `--cache-type-k` / `--cache-type-v`, spelled as
/// llama.cpp spells them). Keys and values are computed in f32 and rounded when written; f16
/// halves the cache's memory and the bytes attention reads per decoded token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// f32: the computed keys and values as they are (the default).
    #[default]
    F32,
    /// IEEE half, rounded to nearest (ties to even) when written, widened exactly when read.
    F16,
}

impl KvType {
    /// The names `from_str` accepts.
    pub const NAMES: [&'static str; 2] = ["f32", "f16"];

    /// llama.cpp's cache types that mlxcel does not store (refused by name).
    pub const NOT_SUPPORTED: [&'static str; 7] =
        ["bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"];

    /// The name `from_str` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }

    /// Bytes one element takes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    /// `f32` or `f16` (case and surrounding spaces ignored); the error lists the choices and says
    /// when the name is one of llama.cpp's other cache types.
    fn from_str(name: &str) -> Result<Self, String> {
        let lower = name.trim().to_ascii_lowercase();
        match lower.as_str() {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other if Self::NOT_SUPPORTED.contains(&other) => Err(format!(
                "KV cache type {name:?} is a llama.cpp cache type mlxcel does not store: \
                 expected {}",
                Self::NAMES.join(" or ")
            )),
            _ => Err(format!(
                "unknown KV cache type {name:?}: expected {}",
                Self::NAMES.join(" or ")
            )),
        }
    }
}
