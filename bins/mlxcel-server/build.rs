// build.rs of a crate that depends on mlxcel-core (e.g. mlxcel-engine, bins/mlxcel).
//
// mlxcel-core links libmlx.so from outside the target directory. Its `links = "mlx"`
// metadata reaches this build script as DEP_MLX_LIBDIR; embedding that directory as an
// rpath lets this crate's binaries, tests, examples and benches run without
// LD_LIBRARY_PATH. (cargo::rustc-link-arg from mlxcel-core itself does not reach them.)
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(libdir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo::rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
