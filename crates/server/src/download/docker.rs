//! `-dr [<repo>/]<model>[:tag]`: a model published on Docker Hub as an OCI artifact (Docker's
//! `ai/` models), as llama-server fetches one: an anonymous pull token, the manifest, and its GGUF
//! layer's blob, checked against its SHA-256 digest, into `<cache>/<repo>_<tag>.gguf`.

use std::path::PathBuf;

use super::env::{Env, url_cache_dir};
use super::error::DownloadError;
use super::file::{FetchOptions, fetch};
use super::transport::{Transport, get_json};

/// Docker Hub's token service and registry.
pub const AUTH: &str = "https://auth.docker.io/token";
pub const REGISTRY: &str = "https://registry-1.docker.io/v2/";

/// `gemma3` → (`ai/gemma3`, `latest`); `me/model:Q4_0` → (`me/model`, `Q4_0`).
pub fn parse(reference: &str) -> Result<(String, String), DownloadError> {
    let (repo, tag) = reference.split_once(':').unwrap_or((reference, "latest"));
    let repo = if repo.contains('/') {
        repo.to_owned()
    } else {
        format!("ai/{repo}")
    };
    let valid = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
            && !s.contains("..")
    };
    let two_names = repo.split('/').filter(|part| !part.is_empty()).count() == 2;
    if !valid(&repo)
        || !valid(tag)
        || tag.contains('/')
        || repo.matches('/').count() != 1
        || !two_names
    {
        return Err(DownloadError::BadReference {
            reference: reference.to_owned(),
            expected: "[<repo>/]<model>[:tag], e.g. gemma3 or ai/smollm2:135M-Q4_0",
        });
    }
    Ok((repo, tag.to_owned()))
}

/// Fetches the model (or finds it cached when offline) and returns its path.
pub fn resolve(
    transport: &dyn Transport,
    env: &Env,
    reference: &str,
    offline: bool,
    auth: &str,
    registry: &str,
) -> Result<PathBuf, DownloadError> {
    let (repo, tag) = parse(reference)?;
    let path = url_cache_dir(env)?.join(format!("{}_{tag}.gguf", repo.replace('/', "_")));
    if offline {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(DownloadError::NotCached {
                what: format!("{repo}:{tag}"),
                path,
            })
        };
    }
    let token_url = format!("{auth}?service=registry.docker.io&scope=repository:{repo}:pull");
    let token = get_json(transport, &token_url, &[])?
        .get("token")
        .and_then(|t| t.as_str())
        .map(str::to_owned)
        .ok_or_else(|| DownloadError::Protocol {
            url: token_url.clone(),
            detail: "no `token` in the answer".into(),
        })?;
    let bearer = vec![("authorization".to_owned(), format!("Bearer {token}"))];
    let manifest_url = format!("{registry}{repo}/manifests/{tag}");
    let mut headers = bearer.clone();
    headers.push((
        "accept".into(),
        "application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json".into(),
    ));
    let manifest = get_json(transport, &manifest_url, &headers)?;
    let digest = manifest
        .get("layers")
        .and_then(|l| l.as_array())
        .into_iter()
        .flatten()
        .find(|layer| {
            layer
                .get("mediaType")
                .and_then(|m| m.as_str())
                .is_some_and(|m| m.contains("gguf"))
        })
        .and_then(|layer| layer.get("digest"))
        .and_then(|d| d.as_str())
        .ok_or_else(|| DownloadError::Protocol {
            url: manifest_url.clone(),
            detail: "the manifest has no GGUF layer".into(),
        })?;
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| DownloadError::Protocol {
            url: manifest_url.clone(),
            detail: format!("the GGUF layer's digest `{digest}` is not sha256:<64 hex digits>"),
        })?
        .to_ascii_lowercase();
    let blob_url = format!("{registry}{repo}/blobs/sha256:{hex}");
    tracing::info!(model = %format!("{repo}:{tag}"), path = %path.display(), "fetching from Docker Hub");
    let options = FetchOptions {
        sha256: Some(hex),
        ..FetchOptions::new(bearer, false)
    };
    fetch(transport, &blob_url, &path, &options)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_default_to_ai_and_latest() {
        assert_eq!(
            parse("gemma3").unwrap(),
            ("ai/gemma3".into(), "latest".into())
        );
        assert_eq!(
            parse("ai/smollm2:135M-Q4_0").unwrap(),
            ("ai/smollm2".into(), "135M-Q4_0".into())
        );
        for bad in ["", "a/b/c", "x:", "x:a/b", "../x", "a b"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
