// In a workspace build the engine's backends are on (cargo unifies features with the binaries
// that ask for them), so the replay test links libmlx.so like every other test; the rpath that
// mlxcel-engine hands its direct dependents (DEP_MLXCEL_ENGINE_MLX_LIBDIR) lets it run without
// LD_LIBRARY_PATH. Built alone, without backends, there is nothing to point at.
fn main() {
    println!("cargo::rerun-if-env-changed=DEP_MLXCEL_ENGINE_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLXCEL_ENGINE_MLX_LIBDIR") {
        println!("cargo::rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
