//! The MLX pin (`mlx.pin`): version, wheel and checksum of the MLX release we build against.
//!
//! This file is compiled twice: into the library (as `mlxcel_core::pin`) and into `build.rs`
//! (through `#[path]`), so both read the pin with the same parser. It must stay std-only.

/// The text of `mlx.pin`, embedded at compile time.
pub const PIN_TEXT: &str = include_str!("../mlx.pin");

/// The parsed MLX pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxPin {
    /// MLX release, e.g. `0.32.4`; also the version `mlx::core::version()` reports.
    pub version: String,
    /// PyPI package the C++ library comes from, e.g. `mlx-cpu`.
    pub package: String,
    /// Exact wheel file name pip must produce.
    pub wheel: String,
    /// pip `--platform` tag selecting that wheel.
    pub platform: String,
    /// Lower-case hex sha256 of the wheel.
    pub sha256: String,
}

impl MlxPin {
    /// The pin embedded in this build.
    pub fn embedded() -> MlxPin {
        // The pin file is part of the crate and is covered by tests; a malformed one
        // is a build-time bug, not a runtime condition.
        MlxPin::parse(PIN_TEXT).expect("mlx.pin is validated by build.rs and the test suite")
    }

    /// Parses `key = value` lines; `#` starts a comment line. Every key is required.
    pub fn parse(text: &str) -> Result<MlxPin, String> {
        let get = |key: &str| -> Result<String, String> {
            text.lines()
                .map(str::trim)
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| line.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
                .ok_or_else(|| format!("mlx.pin: key `{key}` is missing or empty"))
        };
        let pin = MlxPin {
            version: get("version")?,
            package: get("package")?,
            wheel: get("wheel")?,
            platform: get("platform")?,
            sha256: get("sha256")?,
        };
        if pin.sha256.len() != 64 || !pin.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "mlx.pin: sha256 `{}` is not 64 hex digits",
                pin.sha256
            ));
        }
        if !pin.wheel.contains(&format!("-{}-", pin.version)) {
            return Err(format!(
                "mlx.pin: wheel `{}` does not carry version {}",
                pin.wheel, pin.version
            ));
        }
        Ok(pin)
    }

    /// The pin as `scripts/provision-mlx --print-pin` prints it.
    pub fn to_key_value_lines(&self) -> String {
        format!(
            "version={}\npackage={}\nwheel={}\nplatform={}\nsha256={}\n",
            self.version, self.package, self.wheel, self.platform, self.sha256
        )
    }
}
