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
