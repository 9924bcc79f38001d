//! Process-wide knobs: device, memory limit, version.

use mlxcel_core::{Array, pin::MlxPin};

#[test]
fn cpu_device_memory_limit_and_version() {
    mlxcel_core::set_default_device_cpu().unwrap();
    // Raise the limit (never lower it under the other tests), then restore it.
    let previous = mlxcel_core::set_memory_limit(usize::MAX / 2).unwrap();
    assert_eq!(
        mlxcel_core::set_memory_limit(previous).unwrap(),
        usize::MAX / 2
    );
    let a = Array::from_f32(&[2.0], &[1]).unwrap();
    assert_eq!(a.multiply(&a).unwrap().to_vec_f32().unwrap(), [4.0]);
    let version = mlxcel_core::mlx_version();
    assert!(
        version.starts_with(|c: char| c.is_ascii_digit()),
        "{version}"
    );
    if mlxcel_core::mlx_build_info().from_pinned_cache {
        assert_eq!(version, MlxPin::embedded().version);
    }
}

/// Freed buffers that MLX keeps for reuse go back to the system on request (called after a
/// model loads).
#[test]
fn release_unused_memory_empties_mlx_buffer_cache() {
    // Buffers of a few pages are the ones MLX's allocator keeps.
    let sizes = [1024, 4096, 16_384, 65_536];
    for &n in &sizes {
        let a = Array::zeros(&[n], mlxcel_core::Dtype::F32).unwrap();
        let b = a.add(&Array::scalar_f32(1.0)).unwrap();
        assert_eq!(b.to_vec_f32().unwrap()[0], 1.0);
    }
    let (_, cached) = mlxcel_core::mlx_memory();
    assert!(cached > 0, "freed buffers stay cached");
    // Tests in parallel may free buffers into the cache between the two calls: a few tries.
    let emptied = (0..5).any(|_| {
        mlxcel_core::release_unused_memory();
        mlxcel_core::mlx_memory().1 < cached.min(4096)
    });
    assert!(
        emptied,
        "the cache stayed at {:?} (before {cached})",
        mlxcel_core::mlx_memory()
    );
}
