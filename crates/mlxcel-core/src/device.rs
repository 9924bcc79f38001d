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

/// Blocks up to this size come from glibc's heap after [`keep_freed_heap_memory`] (glibc's
/// largest dynamic threshold; larger ones are mapped and unmapped per allocation, as before).
pub const HEAP_MMAP_THRESHOLD: usize = 32 << 20;

/// Freed memory at the top of glibc's heap kept for reuse after [`keep_freed_heap_memory`].
pub const HEAP_TRIM_THRESHOLD: usize = 128 << 20;

/// What [`keep_freed_heap_memory`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeapSettings {
    /// glibc's malloc now takes blocks up to `mmap_threshold` bytes from its heap and returns
    /// freed memory at the heap's top to the system only past `trim_threshold` bytes.
    Set {
        mmap_threshold: usize,
        trim_threshold: usize,
    },
    /// The environment already configures glibc's malloc (the variable named): left as it says.
    Environment(String),
    /// Not glibc, or `mallopt` refused the values: nothing changed.
    Unavailable,
}

/// Keeps freed C-heap memory for reuse instead of returning it to the system after each step.
///
/// MLX's CPU allocator takes every buffer from `malloc` and frees it when the array goes, and a
/// step's logits are fresh vectors the caller drops: each step allocates and frees megabytes
/// (a verification pass over 17 positions of a 49,152-token vocabulary: 3.3 MB of logits in
/// MLX's buffer and 3.3 MB in the rows handed back). glibc serves such blocks by `mmap` or
/// by growing its heap, and gives them back (`munmap`, or trimming the heap's top past twice
/// its adaptive threshold) when they are freed, so the next step faults every page in again:
/// ~800 faults per 3.3 MB buffer, 4-5 ms of such a pass on the default model. This sets glibc's
/// mmap threshold to [`HEAP_MMAP_THRESHOLD`] and its trim threshold to [`HEAP_TRIM_THRESHOLD`]
/// (`mallopt`), so those pages stay mapped; [`release_unused_memory`] (after a model loads)
/// still returns everything free. Process-wide; where `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_` or a `glibc.malloc` threshold in
/// `GLIBC_TUNABLES` is set, glibc's malloc is left as the environment says. The engine calls
/// it when it loads a backend.
pub fn keep_freed_heap_memory() -> HeapSettings {
    if let Some(variable) = malloc_environment(std::env::vars_os()) {
        return HeapSettings::Environment(variable);
    }
    if sys::with_lock(|| ffi::heap_keep_freed(HEAP_MMAP_THRESHOLD, HEAP_TRIM_THRESHOLD)) {
        HeapSettings::Set {
            mmap_threshold: HEAP_MMAP_THRESHOLD,
            trim_threshold: HEAP_TRIM_THRESHOLD,
        }
    } else {
        HeapSettings::Unavailable
    }
}

/// The first variable among `vars` that sets glibc malloc's thresholds, by name.
fn malloc_environment(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Option<String> {
    const NAMES: [&str; 3] = [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_TOP_PAD_",
    ];
    const TUNABLES: [&str; 3] = [
        "glibc.malloc.mmap_threshold",
        "glibc.malloc.trim_threshold",
        "glibc.malloc.top_pad",
    ];
    vars.into_iter().find_map(|(name, value)| {
        let name = name.to_str()?;
        let sets = NAMES.contains(&name)
            || (name == "GLIBC_TUNABLES"
                && TUNABLES.iter().any(|t| value.to_string_lossy().contains(t)));
        sets.then(|| name.to_string())
    })
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

#[cfg(test)]
mod tests {
    use super::malloc_environment;
    use std::ffi::OsString;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v)))
            .collect()
    }

    #[test]
    fn the_environments_malloc_thresholds_are_left_alone() {
        assert_eq!(
            malloc_environment(vars(&[("PATH", "/bin"), ("HOME", "/")])),
            None
        );
        for name in [
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_TOP_PAD_",
        ] {
            assert_eq!(
                malloc_environment(vars(&[("PATH", "/bin"), (name, "131072")])).as_deref(),
                Some(name)
            );
        }
        assert_eq!(
            malloc_environment(vars(&[(
                "GLIBC_TUNABLES",
                "glibc.rtld.optional_static_tls=512:glibc.malloc.trim_threshold=131072"
            )]))
            .as_deref(),
            Some("GLIBC_TUNABLES")
        );
        // Tunables for other things (and malloc's arena count) do not touch the thresholds.
        assert_eq!(
            malloc_environment(vars(&[
                ("GLIBC_TUNABLES", "glibc.malloc.arena_max=2"),
                ("MALLOC_ARENA_MAX", "2")
            ])),
            None
        );
    }
}
