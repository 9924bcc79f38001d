//! The `iree-compile` driver and the on-disk cache of compiled modules.
//!
//! A module is cached under a key that hashes everything that determines its bytes: the program
//! text, the compiler flags, the compiler's version and the target CPU. Writes are atomic (a
//! temporary file in the cache directory, then a rename), so a reader never sees half a module
//! and two processes compiling the same module at once both succeed: the last rename wins and
//! both files are identical.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::pin::IREE_VERSION;

/// Overrides the `iree-compile` executable (default: the one `scripts/provision-iree` installs).
pub const IREE_COMPILE_ENV: &str = "MLXCEL_IREE_COMPILE";

/// The flags every module is compiled with, besides the target CPU.
///
/// The distribution size is the number of output columns one workgroup of a matmul (and most
/// other dispatches) covers along its innermost parallel dimension; IREE's default, 64, makes a
/// two-row matmul against `[in, out]` weights read 128-byte pieces of every weight row, and 256
/// measured ~10% faster per decode step and ~14% per prefill chunk on the default model
/// (docs/xla.md).
const BASE_FLAGS: &[&str] = &[
    "--iree-input-type=stablehlo",
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-distribution-size=256",
];

/// Where provisioning puts the compiler under a cache root (mirrors `scripts/provision-iree`).
pub fn provisioned_compiler(cache_root: &Path) -> PathBuf {
    cache_root
        .join("venvs")
        .join(format!(
            "iree-{IREE_VERSION}-cmake-{}",
            crate::pin::CMAKE_VERSION
        ))
        .join("bin")
        .join("iree-compile")
}

/// Compiles StableHLO programs with one `iree-compile`, caching the results.
#[derive(Debug, Clone)]
pub struct Compiler {
    executable: PathBuf,
    cache_dir: PathBuf,
    target_cpu: String,
    /// The compiler's `--version` text, part of every cache key.
    version: String,
}

/// A compiled module on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledModule {
    pub path: PathBuf,
    /// Whether this call ran the compiler (false: the cache had it).
    pub compiled: bool,
}

fn io(context: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io {
        context,
        path,
        source,
    }
}

/// A file name unique to this host, process and call, for atomic writes by rename; a killed
/// process's are swept by the next compile (`mlxcel_model::sweep_partials`).
fn temp_name(stem: &str) -> String {
    mlxcel_model::partial_name(&format!(".{stem}"))
}

/// Writes `bytes` to `path` atomically (same-directory temporary file, then rename).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let stem = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(temp_name(&stem));
    std::fs::write(&tmp, bytes).map_err(io("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("renaming into place", path)(e)
    })
}

impl Compiler {
    /// The compiler at `executable`, caching modules under `cache_dir`, targeting `target_cpu`
    /// (`host` for this machine's CPU). Runs `iree-compile --version` once.
    pub fn new(executable: PathBuf, cache_dir: PathBuf, target_cpu: &str) -> Result<Self> {
        if !executable.is_file() {
            return Err(Error::CompilerMissing { path: executable });
        }
        let out = Command::new(&executable)
            .arg("--version")
            .output()
            .map_err(io("running", &executable))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || version.is_empty() {
            return Err(Error::CompileFailed {
                status: out.status.to_string(),
                program: executable,
                message: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(Self {
            executable,
            cache_dir,
            target_cpu: target_cpu.to_owned(),
            version,
        })
    }

    /// The provisioned compiler (or `MLXCEL_IREE_COMPILE`'s), caching under
    /// `<cache_root>/xla/modules`, targeting the host CPU.
    pub fn from_env(cache_root: &Path) -> Result<Self> {
        let executable = std::env::var_os(IREE_COMPILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| provisioned_compiler(cache_root));
        Self::new(executable, cache_root.join("xla").join("modules"), "host")
    }

    /// The compiler's version text.
    pub fn version(&self) -> &str {
        &self.version
    }

    fn flags(&self) -> Vec<String> {
        let mut flags: Vec<String> = BASE_FLAGS.iter().map(|f| f.to_string()).collect();
        flags.push(format!("--iree-llvmcpu-target-cpu={}", self.target_cpu));
        flags
    }

    /// The cache key of `program`: a hash over the text, flags, compiler version and target.
    pub fn cache_key(&self, program: &str) -> String {
        let mut h = Sha256::new();
        for part in [
            "mlxcel-xla module v1",
            program,
            &self.flags().join(" "),
            &self.version,
            &self.target_cpu,
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    }

    /// Whether `program`'s module is already in the cache (so [`Self::compile`] will not run the
    /// compiler).
    pub fn is_cached(&self, program: &str) -> bool {
        self.cache_dir
            .join(format!("{}.vmfb", self.cache_key(program)))
            .is_file()
    }

    /// The compiled module for `program`, from the cache or compiled now.
    pub fn compile(&self, program: &str) -> Result<CompiledModule> {
        let key = self.cache_key(program);
        let path = self.cache_dir.join(format!("{key}.vmfb"));
        if path.is_file() {
            return Ok(CompiledModule {
                path,
                compiled: false,
            });
        }
        std::fs::create_dir_all(&self.cache_dir).map_err(io("creating", &self.cache_dir))?;
        mlxcel_model::sweep_partials(&self.cache_dir);
        // The program text is kept beside the module: a failure names it, and a success leaves
        // the source of every cached module inspectable.
        let source = self.cache_dir.join(format!("{key}.mlir"));
        write_atomic(&source, program.as_bytes())?;
        let tmp = self.cache_dir.join(temp_name(&format!("{key}.vmfb")));
        // A program of the `kernel` weight format names mlxcel's kernels object, which is put
        // beside the modules for `iree-compile` to link in. It is named by its content, so the
        // program text (and the cache key) already covers it; the search path does not go into
        // the key.
        if program.contains(crate::kernels::EXECUTABLE) {
            crate::kernels::write_object(&self.cache_dir)
                .map_err(io("writing the kernels object into", &self.cache_dir))?;
        }
        let out = Command::new(&self.executable)
            .args(self.flags())
            .arg(format!(
                "--iree-hal-executable-object-search-path={}",
                self.cache_dir.display()
            ))
            .arg(&source)
            .arg("-o")
            .arg(&tmp)
            .output()
            .map_err(io("running", &self.executable))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            let mut message = String::from_utf8_lossy(&out.stderr).into_owned();
            message.push_str(&String::from_utf8_lossy(&out.stdout));
            return Err(Error::CompileFailed {
                status: out
                    .status
                    .code()
                    .map_or_else(|| out.status.to_string(), |c| c.to_string()),
                program: source,
                message: message.trim_end().to_owned(),
            });
        }
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("renaming into place", &path)(e)
        })?;
        Ok(CompiledModule {
            path,
            compiled: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `iree-compile`: prints a version, copies its input to `-o`, and fails on programs
    /// containing `BAD`.
    fn fake_compiler(dir: &Path) -> PathBuf {
        let path = dir.join("fake-iree-compile");
        let script = r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "IREE fake 0"; exit 0; fi
out=""; src=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    --*) shift ;;
    *) src="$1"; shift ;;
  esac
done
if grep -q BAD "$src"; then echo "$src:1:1: error: 'stablehlo.bad' op is unknown" >&2; exit 1; fi
if [ -n "$FAKE_COMPILER_STALL" ]; then head -c 7 "$src" > "$out"; sleep 600; fi
sleep 0.2
cp "$src" "$out"
"#;
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A child another test thread forked while the script was open for writing holds a copy
        // of that descriptor until it execs, and running the script meanwhile fails with "Text
        // file busy" (ETXTBSY). Wait until it runs; no later fork can hold the closed file.
        for _ in 0..200 {
            match Command::new(&path).arg("--version").output() {
                Err(e) if e.raw_os_error() == Some(26) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => break,
            }
        }
        path
    }

    /// Set in the child process of the kill test: the cache directory it compiles into.
    const KILL_TEST_CHILD: &str = "COMPILER_KILL_TEST_CACHE";

    /// `kill -9` of a process while its compiler writes the module leaves no module in the cache
    /// (so no later run loads half of one); the next compile of the same program runs the
    /// compiler again, succeeds, and removes what the killed one left.
    #[test]
    fn a_compile_killed_midway_leaves_no_module_and_the_next_one_recovers() {
        use std::os::unix::process::CommandExt;
        const PROGRAM: &str = "module { killed midway }";
        if let Some(dir) = std::env::var_os(KILL_TEST_CHILD) {
            // The child: compile with a compiler that stalls after writing part of its output.
            let dir = PathBuf::from(dir);
            let c = Compiler::new(dir.join("fake-iree-compile"), dir.join("cache"), "host");
            let _ = c.unwrap().compile(PROGRAM);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let exe = fake_compiler(dir.path());
        let cache = dir.path().join("cache");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "compiler::tests::a_compile_killed_midway_leaves_no_module_and_the_next_one_recovers",
            ])
            .env(KILL_TEST_CHILD, dir.path())
            .env("FAKE_COMPILER_STALL", "1")
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let partial = |cache: &Path| {
            std::fs::read_dir(cache)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".vmfb.partial-"))
                .any(|e| e.metadata().is_ok_and(|m| m.len() > 0))
        };
        let start = std::time::Instant::now();
        while !partial(&cache) {
            assert!(child.try_wait().unwrap().is_none(), "the child ended early");
            assert!(
                start.elapsed().as_secs() < 120,
                "no partial module appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let killed = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", child.id())])
            .status()
            .unwrap();
        assert!(killed.success());
        child.wait().unwrap();
        let c = Compiler::new(exe, cache.clone(), "host").unwrap();
        assert!(
            !c.is_cached(PROGRAM),
            "a killed compile left a module in place"
        );
        let module = c.compile(PROGRAM).unwrap();
        assert!(module.compiled);
        assert_eq!(std::fs::read_to_string(&module.path).unwrap(), PROGRAM);
        let left: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".partial-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn compiles_once_then_hits_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let c = Compiler::new(fake_compiler(dir.path()), dir.path().join("cache"), "host").unwrap();
        let first = c.compile("module {}").unwrap();
        assert!(first.compiled);
        let second = c.compile("module {}").unwrap();
        assert!(!second.compiled);
        assert_eq!(first.path, second.path);
        assert_eq!(std::fs::read_to_string(&first.path).unwrap(), "module {}");
    }

    #[test]
    fn the_key_covers_program_target_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let exe = fake_compiler(dir.path());
        let a = Compiler::new(exe.clone(), dir.path().into(), "host").unwrap();
        let b = Compiler::new(exe, dir.path().into(), "skylake").unwrap();
        assert_ne!(a.cache_key("x"), a.cache_key("y"));
        assert_ne!(a.cache_key("x"), b.cache_key("x"));
        let mut c = a.clone();
        c.version.push('1');
        assert_ne!(a.cache_key("x"), c.cache_key("x"));
    }

    #[test]
    fn concurrent_compiles_of_one_module_both_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let c = Compiler::new(fake_compiler(dir.path()), dir.path().join("cache"), "host").unwrap();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.compile("module { same }"))
            })
            .collect();
        let paths: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap().path)
            .collect();
        assert!(paths.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(
            std::fs::read_to_string(&paths[0]).unwrap(),
            "module { same }"
        );
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn a_compile_failure_shows_the_message_and_the_saved_program() {
        let dir = tempfile::tempdir().unwrap();
        let c = Compiler::new(fake_compiler(dir.path()), dir.path().join("cache"), "host").unwrap();
        let err = c.compile("module { BAD }").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("'stablehlo.bad' op is unknown"), "{text}");
        let Error::CompileFailed { program, .. } = &err else {
            panic!("expected CompileFailed, got {err:?}");
        };
        assert!(text.contains(&program.display().to_string()));
        assert_eq!(std::fs::read_to_string(program).unwrap(), "module { BAD }");
    }

    #[test]
    fn a_missing_compiler_says_how_to_provision_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = Compiler::new(dir.path().join("nope"), dir.path().into(), "host").unwrap_err();
        assert!(err.to_string().contains("scripts/provision-iree"));
    }
}
