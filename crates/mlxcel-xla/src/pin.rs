//! The IREE toolchain pin, read from `iree.pin` (the file `scripts/provision-iree` reads too).

const PIN: &str = include_str!("../iree.pin");

/// The value of `key` in the pin file.
const fn find(key: &str) -> &'static str {
    // A const parser: the pin is compiled in, so a missing key fails the build's tests, not a user.
    let bytes = PIN.as_bytes();
    let k = key.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // At the start of a line: does it start with `key`, then spaces and `=`?
        let mut j = 0;
        while j < k.len() && i + j < bytes.len() && bytes[i + j] == k[j] {
            j += 1;
        }
        if j == k.len() {
            let mut p = i + j;
            while p < bytes.len() && bytes[p] == b' ' {
                p += 1;
            }
            if p < bytes.len() && bytes[p] == b'=' {
                p += 1;
                while p < bytes.len() && bytes[p] == b' ' {
                    p += 1;
                }
                let start = p;
                while p < bytes.len() && bytes[p] != b'\n' && bytes[p] != b' ' {
                    p += 1;
                }
                let (_, rest) = bytes.split_at(start);
                let (value, _) = rest.split_at(p - start);
                return match std::str::from_utf8(value) {
                    Ok(v) => v,
                    Err(_) => "",
                };
            }
        }
        while i < bytes.len() && bytes[i] != b'\n' {
            i += 1;
        }
        i += 1;
    }
    ""
}

/// The IREE release of both the compiler wheel and the runtime eerie-sys vendors.
pub const IREE_VERSION: &str = find("iree_version");
/// The eerie-sys release that vendors that runtime.
pub const EERIE_SYS_VERSION: &str = find("eerie_sys_version");
/// The PyPI CMake the runtime build uses.
pub const CMAKE_VERSION: &str = find("cmake_version");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_has_every_key() {
        for key in [
            "iree_version",
            "eerie_sys_version",
            "compiler_package",
            "compiler_wheel",
            "compiler_sha256",
            "cmake_version",
            "cmake_wheel",
            "cmake_sha256",
            "libclang_version",
            "libclang_wheel",
            "libclang_sha256",
        ] {
            assert!(!find(key).is_empty(), "iree.pin lacks {key}");
        }
        assert!(find("compiler_wheel").contains(IREE_VERSION));
        assert!(find("cmake_wheel").contains(CMAKE_VERSION));
        assert!(find("libclang_wheel").contains(find("libclang_version")));
    }

    #[test]
    fn cargo_toml_requires_the_pinned_eerie_sys() {
        let manifest = include_str!("../Cargo.toml");
        assert!(
            manifest.contains(&format!(
                "eerie-sys = {{ version = \"={EERIE_SYS_VERSION}\""
            )),
            "Cargo.toml's eerie-sys requirement differs from iree.pin's {EERIE_SYS_VERSION}"
        );
    }

    #[test]
    fn the_provisioning_script_reads_this_pin() {
        let script = include_str!("../../../scripts/provision-iree");
        assert!(script.contains("crates/mlxcel-xla/iree.pin"));
        assert!(script.contains("venvs/iree-$iree_version-cmake-$cmake_version"));
    }
}
