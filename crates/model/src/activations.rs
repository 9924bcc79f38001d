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
    /// A per-matrix policy: int8 activations for the matrices where they cost no answers and
    /// save the most time, f32 for the rest (which matrices: `mlxcel_core::Kernels`'s
    /// `matrix_activations`; docs/cli.md, `--activations`). Matrices the policy does not name
    /// multiply f32, bit for bit as under [`Activations::F32`].
    Mixed,
}

impl Activations {
    /// The names `from_str` accepts.
    pub const NAMES: [&'static str; 3] = ["f32", "int8", "mixed"];

    /// The name `from_str` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
            Self::Mixed => "mixed",
        }
    }
}

impl std::str::FromStr for Activations {
    type Err = String;

    /// `f32`, `int8` or `mixed` (case and surrounding spaces ignored); the error lists the choices.
    fn from_str(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "int8" => Ok(Self::Int8),
            "mixed" => Ok(Self::Mixed),
            _ => Err(format!(
                "unknown activations {name:?}: expected {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// The element type of a KV cache (llama.cpp's `--cache-type-k` / `--cache-type-v`, spelled as
/// llama.cpp spells them). Keys and values are computed in f32 and rounded when written; f16
/// halves the cache's memory and the bytes attention reads per decoded token, q8_0 takes 34 bytes
/// per 32 values (0.27 of f32's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// f32: the computed keys and values as they are (the default).
    #[default]
    F32,
    /// IEEE half, rounded to nearest (ties to even) when written, widened exactly when read.
    F16,
    /// llama.cpp's `q8_0`: per 32 values of a row, a scale `d = max |x| / 127` stored as a half
    /// and 32 signed bytes `round(x / d)`; read back as `q · d`. Rows of a multiple of 32 values.
    Q8_0,
}

impl KvType {
    /// The names `from_str` accepts.
    pub const NAMES: [&'static str; 3] = ["f32", "f16", "q8_0"];

    /// llama.cpp's cache types that mlxcel does not store (refused by name).
    pub const NOT_SUPPORTED: [&'static str; 6] = ["bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"];

    /// Values per q8_0 block, and the block's bytes (a half scale, then a byte per value).
    pub const Q8_0_BLOCK: usize = 32;
    pub const Q8_0_BLOCK_BYTES: usize = 34;

    /// The name `from_str` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }

    /// Bytes a row of `values` keys or values takes (`values` a multiple of 32 for q8_0).
    pub fn row_bytes(self, values: usize) -> usize {
        match self {
            Self::F32 => 4 * values,
            Self::F16 => 2 * values,
            Self::Q8_0 => values / Self::Q8_0_BLOCK * Self::Q8_0_BLOCK_BYTES,
        }
    }

    /// Whether rows of `values` can be stored (q8_0 needs whole blocks of 32).
    pub fn holds_rows_of(self, values: usize) -> bool {
        self != Self::Q8_0 || values.is_multiple_of(Self::Q8_0_BLOCK)
    }
}

impl std::str::FromStr for KvType {
    type Err = String;

    /// `f32`, `f16` or `q8_0` (case and surrounding spaces ignored); the error lists the choices and says
    /// when the name is one of llama.cpp's other cache types.
    fn from_str(name: &str) -> Result<Self, String> {
        let lower = name.trim().to_ascii_lowercase();
        match lower.as_str() {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "q8_0" => Ok(Self::Q8_0),
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
