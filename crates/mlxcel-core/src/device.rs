//! Process-wide MLX settings.

use crate::error::{Error, Result};
use crate::sys::{self, ffi};

/// Makes the CPU the default device for ops created afterwards on this thread and others
/// (MLX's `set_default_device`). The `mlx-cpu` build has no other device; call it anyway so
/// behaviour does not change when linked against a GPU build.
pub fn set_default_device_cpu() -> Result<()> {
    sys::with_lock(ffi::set_default_device_cpu).map_err(Error::mlx("set_default_device_cpu"))
}

/// Caps MLX's memory use at `bytes` (MLX's `set_memory_limit`); returns the previous limit.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    sys::with_lock(|| ffi::set_memory_limit(bytes)).map_err(Error::mlx("set_memory_limit"))
}

/// MLX's allocator: (bytes in live buffers, bytes freed but kept for reuse).
pub fn mlx_memory() -> (usize, usize) {
    sys::with_lock(|| (ffi::mlx_active_memory(), ffi::mlx_cache_memory()))
}

/// Returns memory that was freed but kept for reuse to the system: MLX's buffer cache (MLX's
/// `clear_cache`) and the C heap's free pages (glibc's `malloc_trim`). After loading a model
/// (the checkpoint read, and rewritten for int8 activations) this is most of the difference
/// between resident memory and the weights: on a Llama-3.2-1B-shaped Q4_K_M with int8
/// activations, 1,338 MiB resident before, 870 MiB after, for 820 MiB of weights.
pub fn release_unused_memory() {
    sys::with_lock(ffi::mlx_release_unused_memory)
}

/// The version string of the MLX library this process is linked against.
pub fn mlx_version() -> String {
    sys::with_lock(ffi::mlx_version)
}

/// Where the MLX this crate was built against came from, as recorded by `build.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxBuildInfo {
    /// `true` when built against the pinned, provisioned cache; `false` when `MLX_DIR` was set.
    pub from_pinned_cache: bool,
    /// The directory holding `libmlx.so`, which binaries carry as an rpath.
    pub libdir: &'static str,
}

/// How this build found MLX.
pub fn mlx_build_info() -> MlxBuildInfo {
    MlxBuildInfo {
        from_pinned_cache: env!("MLXCORE_BUILD_MLX_SOURCE") == "cache",
        libdir: env!("MLXCORE_BUILD_MLX_LIBDIR"),
    }
}
