//! Prints the linked MLX version and a tiny computed result. Runs without LD_LIBRARY_PATH
//! because build.rs gives this package's examples, tests and benches an rpath to libmlx.so;
//! tests/integration/rpath.rs runs it (and a dependent crate built from
//! snippets/dependent-build.rs) with LD_LIBRARY_PATH removed.

fn main() -> Result<(), mlxcel_core::Error> {
    let a = mlxcel_core::Array::from_f32(&[1.0, 2.0], &[2])?;
    let sum = a.add(&a)?.to_vec_f32()?;
    println!("mlx {} {sum:?}", mlxcel_core::mlx_version());
    Ok(())
}
