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
    /// f32 or int8 activations in the quantized matmuls (native kernels only).
    pub activations: Activations,
    /// The form of the int8 layout (for int8 activations, and for f32 activations over it).
    pub int8_layout: Int8Layout,
    /// How weights are stored for f32 activations.
    pub f32_layout: F32Layout,
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
        }
    }

    /// Whether a model loads its quantized weights in the int8 layout (`int8_layout`'s form):
    /// always for int8 activations; for f32 activations with [`F32Layout::Int8`] where its
    /// kernel runs (mlxcel's kernels on the AVX-512 path: elsewhere only the scalar reference
    /// reads it, so MLX's layout is kept).
    pub fn int8_layout_weights(&self) -> bool {
        self.backend == KernelBackend::Native
            && match self.activations {
                Activations::Int8 => true,
                Activations::F32 => {
                    self.f32_layout == F32Layout::Int8 && self.isa.min(Isa::best()) == Isa::Avx512
                }
            }
    }

    /// From `MLXCEL_KERNELS` (`native` or `mlx`), `MLXCEL_KERNEL_ISA` (`avx512`, `avx2` or
    /// `scalar`), `MLXCEL_THREADS` (a positive integer), `MLXCEL_FUSED_LAYERS` (`on` or
    /// `off`), `MLXCEL_ACTIVATIONS` (`f32` or `int8`), `MLXCEL_INT8_LAYOUT` (`compact` or
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
                _ => return Err(invalid("MLXCEL_ACTIVATIONS", &value, "f32 or int8")),
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

    /// Refuses combinations that cannot run: int8 activations exist on mlxcel's kernels only.
    /// The error names `activations_setting`, whatever set the activations: the variable
    /// (`MLXCEL_ACTIVATIONS`) or the caller's own option or flag (`--activations`).
    pub fn check(&self, activations_setting: &'static str) -> Result<()> {
        if self.activations == Activations::Int8 && self.backend != KernelBackend::Native {
            return Err(Error::InvalidEnv {
                variable: activations_setting,
                value: "int8".to_owned(),
                expected: "f32 with MLXCEL_KERNELS=mlx (int8 activations run on mlxcel's kernels only)",
            });
        }
        Ok(())
    }
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
