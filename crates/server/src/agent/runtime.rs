//! `--tools-runtime` and the `X-Tool-Runtime` header: where tools run. `docker:<image>` and
//! `podman:<image>` start one container (`<engine> run --rm -i --cidfile <file> <image> sh`,
//! kept alive by its open stdin, started again if it dies, stopped when the server exits);
//! `docker-container:<id>` and `podman-container:<id>` use a running container (`<engine> exec
//! [-i] <id> ...`); `ssh:<target>` runs on a remote POSIX host (`ssh -o BatchMode=yes -o
//! PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o StrictHostKeyChecking=yes
//! [-n] <target> '<quoted command>'`). A target or id that could be read as an option is refused.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::process::shell_quote_join;

/// The container engines (same verbs, same argument order).
const ENGINES: &[&str] = &["docker", "podman"];

/// How a tool's commands reach an isolate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// `<engine> exec [-i] <id> ...`.
    Container { engine: String, id: String },
    /// `ssh ... <target> '<command>'`.
    Ssh { target: String },
}

impl Transport {
    /// The host-side command line that runs `inner` (a complete POSIX argv) in the isolate.
    pub fn argv(&self, inner: &[String], needs_stdin: bool) -> Vec<String> {
        match self {
            Transport::Container { engine, id } => {
                let mut argv = vec![engine.clone(), "exec".into()];
                if needs_stdin {
                    argv.push("-i".into());
                }
                argv.push(id.clone());
                argv.extend_from_slice(inner);
                argv
            }
            Transport::Ssh { target } => {
                let mut argv: Vec<String> = [
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "PasswordAuthentication=no",
                    "-o",
                    "KbdInteractiveAuthentication=no",
                    "-o",
                    "StrictHostKeyChecking=yes",
                ]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
                if !needs_stdin {
                    argv.push("-n".into());
                }
                argv.push(target.clone());
                argv.push(shell_quote_join(inner));
                argv
            }
        }
    }
}

/// A parsed runtime spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// `<engine>:<image>`: a container this server starts and owns.
    Spawn { engine: String, image: String },
    /// Every other valid spec.
    Attach(Transport),
}

/// An ssh target: not empty, no leading `-`, only letters, digits, `.`, `-`, `_`, `@`.
fn valid_ssh_target(target: &str) -> bool {
    !target.is_empty()
        && !target.starts_with('-')
        && target
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b'@'))
}

/// A container id: starts with a letter or digit, then letters, digits, `.`, `-`, `_`.
fn valid_container_id(id: &str) -> bool {
    id.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_'))
}

/// Parses a runtime spec; errors are llama-server's messages.
pub fn parse(spec: &str) -> Result<Spec, String> {
    for engine in ENGINES {
        if let Some(id) = spec.strip_prefix(&format!("{engine}-container:")) {
            if !valid_container_id(id) {
                return Err(format!("invalid container id: {id}"));
            }
            return Ok(Spec::Attach(Transport::Container {
                engine: (*engine).into(),
                id: id.into(),
            }));
        }
        if let Some(image) = spec.strip_prefix(&format!("{engine}:")) {
            return Ok(Spec::Spawn {
                engine: (*engine).into(),
                image: image.into(),
            });
        }
    }
    if let Some(target) = spec.strip_prefix("ssh:") {
        if !valid_ssh_target(target) {
            return Err(format!("invalid ssh target: {target}"));
        }
        return Ok(Spec::Attach(Transport::Ssh {
            target: target.into(),
        }));
    }
    Err(format!("unknown tool runtime: {spec}"))
}

/// The isolate a tool call names (`X-Tool-Runtime`, or the server's runtime): an attachable
/// target only (starting containers belongs to [`OwnedContainer`]).
pub fn transport_for_call(spec: &str) -> Result<Transport, String> {
    match parse(spec)? {
        Spec::Attach(t) => Ok(t),
        Spec::Spawn { .. } => Err(format!(
            "tool runtime must name a running container: {spec}"
        )),
    }
}

/// The container `--tools-runtime <engine>:<image>` started.
#[derive(Debug)]
pub struct OwnedContainer {
    engine: String,
    image: String,
    state: Mutex<Option<(Child, String)>>,
}

/// The command line that starts the owned container.
pub fn spawn_argv(engine: &str, image: &str, cidfile: &str) -> Vec<String> {
    [
        engine,
        "run",
        "--rm",
        "-i",
        "--cidfile",
        cidfile,
        image,
        "sh",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

impl OwnedContainer {
    /// Starts `engine run ... image sh` and waits (10 s at most) for its id.
    pub fn start(engine: &str, image: &str) -> Result<Self, String> {
        if image.is_empty() {
            return Err(format!(
                "--tools-runtime {engine}:<image> requires an image name"
            ));
        }
        let owned = Self {
            engine: engine.into(),
            image: image.into(),
            state: Mutex::new(None),
        };
        let spawned = owned.spawn()?;
        *owned.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(spawned);
        Ok(owned)
    }

    fn spawn(&self) -> Result<(Child, String), String> {
        let cidfile = std::env::temp_dir().join(format!(
            "mlxcel-tools-runtime-cid-{}-{}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let _ = std::fs::remove_file(&cidfile);
        let argv = spawn_argv(&self.engine, &self.image, &cidfile.to_string_lossy());
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "failed to spawn {} container for tools runtime (image: {}): {e}",
                    self.engine, self.image
                )
            })?;
        if let Some(stderr) = child.stderr.take() {
            let engine = self.engine.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    tracing::debug!("{engine} tools runtime: {line}");
                }
            });
        }
        let mut cid = String::new();
        for _ in 0..100 {
            if let Ok(text) = std::fs::read_to_string(&cidfile) {
                cid = text.lines().next().unwrap_or_default().trim().to_owned();
            }
            if !cid.is_empty() || matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&cidfile);
        if cid.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "timed out waiting for {} container to start (image: {})",
                self.engine, self.image
            ));
        }
        Ok((child, cid))
    }

    /// The running container's spec (`<engine>-container:<id>`), started again if it died.
    pub fn spec(&self) -> Result<String, String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let alive = match state.as_mut() {
            Some((child, _)) => matches!(child.try_wait(), Ok(None)),
            None => false,
        };
        if !alive {
            if let Some((_, id)) = state.as_ref() {
                tracing::warn!(
                    "{} tools runtime container \"{id}\" died, respawning",
                    self.engine
                );
            }
            *state = Some(self.spawn()?);
        }
        let id = &state.as_ref().map(|(_, id)| id.clone()).unwrap_or_default();
        Ok(format!("{}-container:{id}", self.engine))
    }

    /// Closes the container's stdin (its shell exits, `--rm` removes it) and waits for it.
    pub fn stop(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((mut child, id)) = state.take() {
            drop(child.stdin.take());
            let _ = child.wait();
            tracing::info!("{} tools runtime container {id} stopped", self.engine);
        }
    }
}

impl Drop for OwnedContainer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn specs_parse_and_unsafe_targets_are_refused() {
        assert_eq!(
            parse("docker:busybox"),
            Ok(Spec::Spawn {
                engine: "docker".into(),
                image: "busybox".into()
            })
        );
        assert_eq!(
            parse("podman-container:abc_1.x"),
            Ok(Spec::Attach(Transport::Container {
                engine: "podman".into(),
                id: "abc_1.x".into()
            }))
        );
        assert_eq!(
            parse("ssh:me@host-1.lan"),
            Ok(Spec::Attach(Transport::Ssh {
                target: "me@host-1.lan".into()
            }))
        );
        assert_eq!(
            parse("ssh:-oProxyCommand=touch /tmp/pwned"),
            Err("invalid ssh target: -oProxyCommand=touch /tmp/pwned".into())
        );
        assert_eq!(
            parse("docker-container:--privileged"),
            Err("invalid container id: --privileged".into())
        );
        assert_eq!(parse("fake:x"), Err("unknown tool runtime: fake:x".into()));
        assert_eq!(
            transport_for_call("docker:busybox"),
            Err("tool runtime must name a running container: docker:busybox".into())
        );
    }

    #[test]
    fn command_lines_are_built_as_llama_server_builds_them() {
        let c = Transport::Container {
            engine: "docker".into(),
            id: "c1".into(),
        };
        assert_eq!(
            c.argv(&sv(&["cat", "--", "/f"]), false),
            sv(&["docker", "exec", "c1", "cat", "--", "/f"])
        );
        assert_eq!(
            c.argv(&sv(&["sh"]), true),
            sv(&["docker", "exec", "-i", "c1", "sh"])
        );
        let s = Transport::Ssh {
            target: "u@h".into(),
        };
        assert_eq!(
            s.argv(&sv(&["sh", "-c", "echo 'hi'"]), false),
            sv(&[
                "ssh",
                "-o",
                "BatchMode=yes",
                "-o",
                "PasswordAuthentication=no",
                "-o",
                "KbdInteractiveAuthentication=no",
                "-o",
                "StrictHostKeyChecking=yes",
                "-n",
                "u@h",
                "'sh' '-c' 'echo '\\''hi'\\'''",
            ])
        );
        assert!(!s.argv(&sv(&["cat"]), true).contains(&"-n".to_owned()));
        assert_eq!(
            spawn_argv("podman", "alpine", "/tmp/cid"),
            sv(&[
                "podman",
                "run",
                "--rm",
                "-i",
                "--cidfile",
                "/tmp/cid",
                "alpine",
                "sh"
            ])
        );
    }
}
