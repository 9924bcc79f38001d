// build.rs of a crate whose binaries, tests or benches run the engine (bins/mlxcel, the server,
// the benches, and any program that embeds mlxcel-engine; docs/embedding.md).
//
// libmlx.so lives outside the target directory, and cargo does not pass a dependency's link
// arguments on. mlxcel-engine hands its directory to the build scripts of its direct dependents
// as DEP_MLXCEL_ENGINE_MLX_LIBDIR; an rpath to it lets this crate's binaries run without
// LD_LIBRARY_PATH.
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_MLXCEL_ENGINE_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLXCEL_ENGINE_MLX_LIBDIR") {
        println!("cargo::rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
