//! Compiles `kernels/qmm.c`, the packed-weight matrix products that the `kernel` weight format
//! links into IREE modules, on x86-64 only. Two products: the object file itself (embedded in
//! the crate with `include_bytes!` and handed to `iree-compile`), and the same code as a static
//! library linked into the crate so that its unit tests can call the kernels directly.

fn main() {
    println!("cargo:rerun-if-changed=kernels/qmm.c");
    println!("cargo::rustc-check-cfg=cfg(mlxcel_qmm)");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut build = cc::Build::new();
    build.file("kernels/qmm.c").opt_level(3).debug(false);
    // IREE's embedded-ELF executables are freestanding shared objects: position-independent, no
    // libc, no stack protector or unwind tables.
    for flag in [
        "-std=c11",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512vnni",
        "-mfma",
        "-mf16c",
        "-ffreestanding",
        "-fPIC",
        "-fvisibility=hidden",
        "-fno-stack-protector",
        "-fno-plt",
        "-fno-asynchronous-unwind-tables",
        "-fno-exceptions",
    ] {
        build.flag(flag);
    }
    // A C compiler without these flags (or none) leaves the crate without the kernels: the
    // OpenXLA backend then uses f16 weights, as on CPUs the kernels cannot run on.
    let objects = match build.try_compile_intermediates() {
        Ok(objects) => objects,
        Err(e) => {
            println!(
                "cargo:warning=mlxcel-xla: kernels/qmm.c not built ({e}); the kernel weight formats are unavailable"
            );
            return;
        }
    };
    let [object] = &objects[..] else {
        panic!("kernels/qmm.c compiled to {} objects", objects.len());
    };
    std::fs::copy(object, out.join("mlxcel-qmm.o")).expect("copying the kernel object");
    build.compile("mlxcel_qmm");
    println!("cargo:rustc-cfg=mlxcel_qmm");
}
