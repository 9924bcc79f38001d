//! `--path DIR`: files of a directory served at the root, as llama-server serves a web UI of the
//! user's own (`/` is the directory's `index.html`, over the built-in chat page). Only plain
//! files inside the directory are served: a path with `..`, `.`, an empty segment, a backslash
//! or a NUL is not looked up, and a file whose real path (links resolved) leaves the directory
//! is not served.

use std::path::{Path, PathBuf};

use hyper::{Response, StatusCode};

use crate::body::{Body, full};

/// The file of `dir` that `path` names, when it is a plain file inside `dir`.
fn resolve(dir: &Path, path: &str) -> Option<PathBuf> {
    let relative = match path.strip_prefix('/')? {
        "" => "index.html",
        rest => rest,
    };
    let mut file = dir.to_path_buf();
    for segment in relative.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." || segment.contains(['\\', '\0'])
        {
            return None;
        }
        file.push(segment);
    }
    let root = dir.canonicalize().ok()?;
    let real = file.canonicalize().ok()?;
    (real.starts_with(&root) && real.is_file()).then_some(real)
}

/// The content type of a file, by its extension.
fn content_type(path: &Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
    {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// The file `path` names in `dir`, or `None` when there is none to serve.
pub async fn serve(dir: &Path, path: &str) -> Option<Response<Body>> {
    let (dir, path) = (dir.to_path_buf(), path.to_owned());
    // Resolving and reading are file system calls: off the async threads.
    tokio::task::spawn_blocking(move || {
        let file = resolve(&dir, &path)?;
        let bytes = std::fs::read(&file).ok()?;
        Some(full(StatusCode::OK, content_type(&file), bytes))
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_files_inside_the_directory_resolve() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<p>hi</p>").unwrap();
        std::fs::create_dir(dir.path().join("js")).unwrap();
        std::fs::write(dir.path().join("js/app.js"), "1").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        assert!(resolve(dir.path(), "/").is_some());
        assert!(resolve(dir.path(), "/js/app.js").is_some());
        for bad in [
            "/../secret",
            "/js/../index.html",
            "/./index.html",
            "//index.html",
            "/js/",
            "/js",
            "/link",
            "/missing",
            "/js\\app.js",
            "index.html",
        ] {
            assert!(resolve(dir.path(), bad).is_none(), "{bad}");
        }
        assert_eq!(
            content_type(Path::new("a.js")),
            "text/javascript; charset=utf-8"
        );
    }
}
