// mlxcel-core links libmlx.so from outside the target directory. Its `links = "mlx"` metadata
// reaches this build script as DEP_MLX_LIBDIR (only with the `mlx` feature); embedding that
// directory as an rpath lets this crate's tests, examples and benches run without
// LD_LIBRARY_PATH. (cargo::rustc-link-arg from mlxcel-core itself does not reach them.)
//
// A program that embeds the engine cannot see DEP_MLX_LIBDIR (it goes to direct dependents of
// mlxcel-core only), so this crate's own `links = "mlxcel-engine"` passes the directory on as
// DEP_MLXCEL_ENGINE_MLX_LIBDIR; docs/embedding.md shows the two-line build script that uses it.
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo::rustc-link-arg=-Wl,-rpath,{libdir}");
        println!("cargo::metadata=mlx_libdir={libdir}");
    }
}
