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
