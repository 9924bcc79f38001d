//! mlxcel's own CPU kernels, and the choice between them and MLX's stock ones.
//!
//! MLX's stock CPU quantized matmul is single-threaded and runs near 2 GFLOP/s, an order of
//! magnitude below what decode and prefill need (issue 9). mlxcel-core registers its own kernels
//! with MLX as custom primitives (`cpp/kernels/`): a GEMV path for small batches (up to eight
//! rows of `x` with AVX-512, four with AVX2) and a GEMM path above, multi-threaded, with runtime
//! instruction-set dispatch (AVX-512, AVX2+FMA, scalar; the scalar path is the test reference).
//! By default they compute in f32 like MLX; only the order of the additions differs. With
//! [`Activations::Int8`] the activations are quantized to int8 inside each matmul and multiplied
//! with AVX-512 VNNI or AVX2 integer instructions instead. Both read the weights in the
//! compact int8 layout on the AVX-512 path ([`F32Layout`]). See `docs/kernels.md`.

use crate::error::{Error, Result};
use crate::sys::{self, ffi};

/// Whose kernels run the hot ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelBackend {
    /// MLX's stock CPU kernels (for comparison, and for layouts mlxcel's kernels do not cover).
    Mlx,
    /// mlxcel's kernels where they apply, MLX's elsewhere.
    Native,
}

/// An instruction-set path of mlxcel's kernels, ordered from least to most capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable scalar code: the reference the SIMD paths are tested against.
    Scalar = 0,
    /// AVX2 with FMA and F16C.
    Avx2 = 1,
    /// AVX-512 F/BW/DQ/VL.
    Avx512 = 2,
}

impl Isa {
    /// The best path this CPU supports.
    pub fn best() -> Isa {
        match sys::with_lock(ffi::kernels_best_isa) {
            2 => Isa::Avx512,
            1 => Isa::Avx2,
            _ => Isa::Scalar,
        }
    }

    fn parse(value: &str) -> Option<Isa> {
        match value {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }
}

/// What the quantized matmuls multiply the weights with (one type, shared with the engine).
pub use mlxcel_model::Activations;

/// How weights are stored for the int8-activation kernels (`MLXCEL_INT8_LAYOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int8Layout {
    /// The checkpoint's codes and scales, interleaved.
    Wide,
    /// 8-bit codes that fit in 5 or 6 bits stored in that many, and f32 scales that factor
    /// exactly stored as a per-256-value f32 times an int8 per group (GGUF K-quants and Q5
    /// types at close to their file size; the same bits as [`Int8Layout::Wide`]). Every path
    /// reads it (scalar, AVX2, AVX-512 VNNI); weights that do not allow it stay wide.
    #[default]
    Compact,
}

/// How weights are stored for f32 activations (`MLXCEL_F32_LAYOUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum F32Layout {
    /// The int8 layout ([`Kernels::int8_layout`] says which form), multiplied by f32 x as it is
    /// (`cpp/kernels/qmatmul_f32x_avx512.cc`): a K-quant read at close to its file size. Taken
    /// where that kernel runs (mlxcel's kernels on the AVX-512 path); elsewhere MLX's layout.
    #[default]
    Int8,
    /// MLX's affine layout (u32-packed 4- or 8-bit codes, a scale and bias per group): Q4_K
    /// read as 6 bits a weight, Q6_K as 12.
    Mlx,
}

/// Which kernels run, on which path, with how many threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernels {
    /// Whose kernels run.
    pub backend: KernelBackend,
    /// The most capable path mlxcel's kernels may use (capped by the CPU).
    pub isa: Isa,
    /// The most threads one kernel call uses (MLX's scheduler thread included).
    pub threads: usize,
    /// Whether a step's llama decoder layers run as one MLX node over all of its sequences
    /// (native kernels, quantized layers, biased only on q/k/v) rather than the per-op graph.
    pub fused_layers: bool,
    /// f32 or int8 activations in the quantized matmuls (native kernels only), or a
    /// per-matrix choice between them ([`Kernels::matrix_activations`]).
    pub activations: Activations,
    /// The form of the int8 layout (for int8 activations, and for f32 activations over it).
    pub int8_layout: Int8Layout,
    /// How weights are stored for f32 activations.
    pub f32_layout: F32Layout,
    /// Under [`Activations::Mixed`], the matrices that multiply int8 activations (the rest
    /// multiply f32): [`Matrix::MIXED_INT8`] unless a caller chooses.
    pub int8_matrices: &'static [Matrix],
}

impl Kernels {
    /// mlxcel's kernels on the best path, one thread per available core.
    pub fn native() -> Kernels {
        Kernels {
            backend: KernelBackend::Native,
            isa: Isa::best(),
            threads: available_cores(),
            fused_layers: true,
            activations: Activations::F32,
            int8_layout: Int8Layout::default(),
            f32_layout: F32Layout::default(),
            int8_matrices: Matrix::MIXED_INT8,
        }
    }

    /// Whether a model loads every quantized weight in the int8 layout (`int8_layout`'s form):
    /// always for int8 activations; for f32 activations, and for a per-matrix choice, where
    /// f32 activations read that layout ([`Kernels::int8_layout_for`]). Under
    /// [`Activations::Mixed`] without it, the matrices the policy multiplies with int8 are
    /// rewritten one by one as they load.
    pub fn int8_layout_weights(&self) -> bool {
        match self.activations {
            Activations::Int8 => self.int8_layout_for(Activations::Int8),
            Activations::F32 | Activations::Mixed => self.int8_layout_for(Activations::F32),
        }
    }

    /// Whether a matrix multiplying `activations` (f32 or int8) is kept in the int8 layout:
    /// for int8, on mlxcel's kernels; for f32, with [`F32Layout::Int8`] where its kernel runs
    /// (mlxcel's kernels on the AVX-512 path: elsewhere only the scalar reference reads it, so
    /// MLX's layout is kept).
    pub fn int8_layout_for(&self, activations: Activations) -> bool {
        self.backend == KernelBackend::Native
            && match activations {
                Activations::Int8 => true,
                Activations::F32 | Activations::Mixed => {
                    self.f32_layout == F32Layout::Int8 && self.isa.min(Isa::best()) == Isa::Avx512
                }
            }
    }

    /// The activations `matrix` multiplies: the kernels' own choice, or under
    /// [`Activations::Mixed`] int8 for the matrices of [`Kernels::int8_matrices`] and f32 for
    /// the rest.
    pub fn matrix_activations(&self, matrix: Matrix) -> Activations {
        match self.activations {
            Activations::Mixed if self.int8_matrices.contains(&matrix) => Activations::Int8,
            Activations::Mixed => Activations::F32,
            activations => activations,
        }
    }

    /// From `MLXCEL_KERNELS` (`native` or `mlx`), `MLXCEL_KERNEL_ISA` (`avx512`, `avx2` or
    /// `scalar`), `MLXCEL_THREADS` (a positive integer), `MLXCEL_FUSED_LAYERS` (`on` or
    /// `off`), `MLXCEL_ACTIVATIONS` (`f32`, `int8` or `mixed`), `MLXCEL_INT8_LAYOUT` (`compact` or
    /// `wide`) and `MLXCEL_F32_LAYOUT` (`int8` or `mlx`); unset means [`Kernels::native`].
    pub fn from_env() -> Result<Kernels> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`Kernels::from_env`] over any variable lookup (for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Kernels> {
        let mut kernels = Kernels::native();
        let invalid =
            |variable: &'static str, value: &str, expected: &'static str| Error::InvalidEnv {
                variable,
                value: value.to_owned(),
                expected,
            };
        if let Some(value) = lookup("MLXCEL_KERNELS") {
            kernels.backend = match value.as_str() {
                "native" => KernelBackend::Native,
                "mlx" => KernelBackend::Mlx,
                _ => return Err(invalid("MLXCEL_KERNELS", &value, "native or mlx")),
            };
        }
        if let Some(value) = lookup("MLXCEL_KERNEL_ISA") {
            let isa = Isa::parse(&value)
                .ok_or_else(|| invalid("MLXCEL_KERNEL_ISA", &value, "avx512, avx2 or scalar"))?;
            kernels.isa = isa.min(kernels.isa);
        }
        if let Some(value) = lookup("MLXCEL_THREADS") {
            kernels.threads = value
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=1024).contains(&n))
                .ok_or_else(|| invalid("MLXCEL_THREADS", &value, "an integer in 1..=1024"))?;
        }
        if let Some(value) = lookup("MLXCEL_FUSED_LAYERS") {
            kernels.fused_layers = match value.as_str() {
                "on" => true,
                "off" => false,
                _ => return Err(invalid("MLXCEL_FUSED_LAYERS", &value, "on or off")),
            };
        }
        if let Some(value) = lookup("MLXCEL_ACTIVATIONS") {
            kernels.activations = match value.as_str() {
                "f32" => Activations::F32,
                "int8" => Activations::Int8,
                "mixed" => Activations::Mixed,
                _ => return Err(invalid("MLXCEL_ACTIVATIONS", &value, "f32, int8 or mixed")),
            };
        }
        if let Some(value) = lookup("MLXCEL_INT8_LAYOUT") {
            kernels.int8_layout = match value.as_str() {
                "compact" => Int8Layout::Compact,
                "wide" => Int8Layout::Wide,
                _ => return Err(invalid("MLXCEL_INT8_LAYOUT", &value, "compact or wide")),
            };
        }
        if let Some(value) = lookup("MLXCEL_F32_LAYOUT") {
            kernels.f32_layout = match value.as_str() {
                "int8" => F32Layout::Int8,
                "mlx" => F32Layout::Mlx,
                _ => return Err(invalid("MLXCEL_F32_LAYOUT", &value, "int8 or mlx")),
            };
        }
        kernels.check("MLXCEL_ACTIVATIONS")?;
        Ok(kernels)
    }

    /// Refuses combinations that cannot run: int8 activations (all, or some matrices' under
    /// `mixed`) exist on mlxcel's kernels only. The error names `activations_setting`,
    /// whatever set the activations: the variable (`MLXCEL_ACTIVATIONS`) or the caller's own
    /// option or flag (`--activations`).
    pub fn check(&self, activations_setting: &'static str) -> Result<()> {
        if self.activations != Activations::F32 && self.backend != KernelBackend::Native {
            return Err(Error::InvalidEnv {
                variable: activations_setting,
                value: self.activations.as_str().to_owned(),
                expected: "f32 with MLXCEL_KERNELS=mlx (int8 activations run on mlxcel's kernels only)",
            });
        }
        Ok(())
    }
}

/// A quantized matrix's part in the model, which a per-matrix activation policy
/// ([`Activations::Mixed`]) decides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// An attention layer's q, k and v projections (stacked or apart, and a gated query's
    /// gate), and its output projection.
    Attention,
    /// A dense MLP's gate and up projections.
    GateUp,
    /// A dense MLP's down projection, which multiplies the SwiGLU outputs.
    Down,
    /// The output projection over the vocabulary (`lm_head`, or the tied embedding table).
    Head,
    /// Anything else: routed experts, linear-attention and short-convolution projections.
    Other,
}

impl Matrix {
    /// The matrices `mixed` multiplies with int8 activations (the rest f32) unless a caller
    /// sets [`Kernels::int8_matrices`]: the dense MLPs' gate and up projections and the output
    /// head, about two thirds of the bytes a token of the default model reads; the attention
    /// projections and the down projections (whose input, the SwiGLU outputs, carries the
    /// outliers int8 rounding loses) stay f32. Chosen by the 62 questions of
    /// scripts/questions/factual.tsv on the default model (SmolLM2-135M, Q4_1): this set
    /// answers 45 (f32: 41, int8: 38; int8 in both the attention and the down projections is
    /// what costs answers) and the quick start's question right, which the int8 head alone, or
    /// int8 for all but the down projections, does not (docs/benchmarks.md, "A right first
    /// answer").
    pub const MIXED_INT8: &'static [Matrix] = &[Matrix::GateUp, Matrix::Head];
}

/// Whether this CPU has AVX-512 VNNI (the int8-activation kernels' fastest path).
pub fn has_vnni() -> bool {
    sys::with_lock(ffi::kernels_has_vnni)
}

/// The IEEE half bits the fused decoder layer writes into an f16 KV cache for each of
/// `values` (round to nearest, ties to even; what MLX's `astype(float16)` gives).
pub fn f16_cache_bits(values: &[f32]) -> Vec<u16> {
    let mut out = vec![0; values.len()];
    ffi::kernels_float_to_half(values, &mut out);
    out
}

/// The cores this process may run on (its CPU affinity), at least 1.
pub fn available_cores() -> usize {
    sys::with_lock(ffi::kernels_available_cores).max(1) as usize
}
