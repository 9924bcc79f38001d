//! One file from a URL to a local path, as llama-server fetches one: a HEAD first (size, ETag,
//! whether ranges are served), a file already there kept when its ETag is unchanged, the body
//! written to `<path>.downloadInProgress` and renamed when complete, an interrupted download
//! resumed with a `Range` request, three attempts 2 s and 4 s apart. A file the Hub names by its
//! SHA-256 (a blob) is checked against it before it is used.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::error::DownloadError;
use super::transport::{Head, Sink, Transport};

/// How a file is fetched.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// Headers sent with every request (authorization).
    pub headers: Vec<(String, String)>,
    /// Keep an existing file without asking the server (a blob named by its hash).
    pub trust_existing: bool,
    /// The file's SHA-256 in hex, when known: checked after the download.
    pub sha256: Option<String>,
    /// Never ask the network: the file must already be there.
    pub offline: bool,
    /// Delay before the second attempt (doubled for the third).
    pub retry_delay: Duration,
}

impl FetchOptions {
    pub fn new(headers: Vec<(String, String)>, offline: bool) -> Self {
        Self {
            headers,
            offline,
            retry_delay: Duration::from_secs(2),
            ..Self::default()
        }
    }
}

const ATTEMPTS: usize = 3;

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// Written now.
    Downloaded,
    /// Already there and current (or offline, or the server could not be asked).
    Cached,
}

/// Fetches `url` to `path` (its directory made as needed).
pub fn fetch(
    transport: &dyn Transport,
    url: &str,
    path: &Path,
    options: &FetchOptions,
) -> Result<Fetched, DownloadError> {
    let exists = path.is_file();
    if options.offline {
        return if exists {
            Ok(Fetched::Cached)
        } else {
            Err(DownloadError::NotCached {
                what: url.to_owned(),
                path: path.to_owned(),
            })
        };
    }
    if exists && options.trust_existing {
        return Ok(Fetched::Cached);
    }
    let head = match transport.head(url, &options.headers) {
        Ok(head) if head.ok() => head,
        // As llama-server: a file already there is used when the server cannot be asked.
        Ok(_) | Err(_) if exists => {
            tracing::warn!(url, path = %path.display(), "could not check the file for updates; using the copy already here");
            return Ok(Fetched::Cached);
        }
        Ok(head) => {
            return Err(DownloadError::Status {
                url: url.to_owned(),
                status: head.status,
                detail: "HEAD".into(),
            });
        }
        Err(err) => return Err(err),
    };
    let etag = head.header("etag").map(str::to_owned);
    let etag_path = sidecar(path, ".etag");
    if exists && !options.trust_existing {
        match &etag {
            None => return Ok(Fetched::Cached),
            Some(etag) if fs::read_to_string(&etag_path).ok().as_deref() == Some(etag) => {
                return Ok(Fetched::Cached);
            }
            Some(_) => {
                tracing::info!(path = %path.display(), "the server's copy changed; downloading it again");
                fs::remove_file(path).map_err(|e| DownloadError::io(path, e))?;
            }
        }
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| DownloadError::io(dir, e))?;
    }
    let ranges = head
        .header("accept-ranges")
        .is_some_and(|v| !v.eq_ignore_ascii_case("none"));
    let total = head.content_length();
    let partial = sidecar(path, ".downloadInProgress");
    let mut delay = options.retry_delay;
    let mut last_error = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tracing::warn!(url, "retrying in {} s", delay.as_secs_f64());
            std::thread::sleep(delay);
            delay *= 2;
        }
        match pull(transport, url, &partial, ranges, total, options) {
            Ok(()) => {
                if let Some(expected) = &options.sha256 {
                    let actual = sha256_of(&partial)?;
                    if !actual.eq_ignore_ascii_case(expected) {
                        let _ = fs::remove_file(&partial);
                        return Err(DownloadError::Checksum {
                            url: url.to_owned(),
                            expected: expected.clone(),
                            actual,
                        });
                    }
                }
                fs::rename(&partial, path).map_err(|e| DownloadError::io(path, e))?;
                if let (Some(etag), false) = (&etag, options.trust_existing) {
                    fs::write(&etag_path, etag).map_err(|e| DownloadError::io(&etag_path, e))?;
                }
                return Ok(Fetched::Downloaded);
            }
            Err(err) => {
                tracing::warn!(url, attempt = attempt + 1, error = %err, "download failed");
                last_error = Some(err);
            }
        }
    }
    Err(last_error.expect("at least one attempt"))
}

/// `<path><suffix>` (`model.gguf.etag`).
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// One GET into `partial`, resuming from its length when the server serves ranges.
fn pull(
    transport: &dyn Transport,
    url: &str,
    partial: &Path,
    ranges: bool,
    total: Option<u64>,
    options: &FetchOptions,
) -> Result<(), DownloadError> {
    let mut have = match fs::metadata(partial) {
        Ok(meta) if ranges => meta.len(),
        Ok(_) => {
            fs::remove_file(partial).map_err(|e| DownloadError::io(partial, e))?;
            0
        }
        Err(_) => 0,
    };
    if total.is_some_and(|t| have > t) {
        fs::remove_file(partial).map_err(|e| DownloadError::io(partial, e))?;
        have = 0;
    }
    let mut headers = options.headers.clone();
    if have > 0 {
        tracing::info!(url, bytes = have, "resuming an interrupted download");
        headers.push(("range".into(), format!("bytes={have}-")));
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(partial)
        .map_err(|e| DownloadError::io(partial, e))?;
    let mut sink = FileSink {
        file,
        resumed: have,
        written: have,
        total,
        refused: None,
        url,
        reported: Instant::now(),
        started: Instant::now(),
    };
    let head = transport.get(url, &headers, &mut sink)?;
    if let Some(status) = sink.refused {
        return Err(DownloadError::Status {
            url: url.to_owned(),
            status,
            detail: if have > 0 {
                "the server did not resume the download (expected 206 Partial Content)".into()
            } else {
                "GET".into()
            },
        });
    }
    sink.file
        .flush()
        .map_err(|e| DownloadError::io(partial, e))?;
    let expected = total.or_else(|| head.content_length().map(|n| n + have));
    if let Some(expected) = expected
        && sink.written != expected
    {
        return Err(DownloadError::Protocol {
            url: url.to_owned(),
            detail: format!(
                "the connection ended after {} of {expected} bytes",
                sink.written
            ),
        });
    }
    Ok(())
}

struct FileSink<'a> {
    file: File,
    resumed: u64,
    written: u64,
    total: Option<u64>,
    /// The status of an answer that was not the one asked for.
    refused: Option<u16>,
    url: &'a str,
    reported: Instant,
    started: Instant,
}

impl Sink for FileSink<'_> {
    fn start(&mut self, head: &Head) -> bool {
        let wanted = if self.resumed > 0 { 206 } else { 200 };
        if head.status != wanted {
            self.refused = Some(head.status);
            return false;
        }
        true
    }

    fn chunk(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        if self.reported.elapsed() >= Duration::from_secs(5) {
            self.reported = Instant::now();
            let rate = (self.written - self.resumed) as f64
                / self.started.elapsed().as_secs_f64().max(1e-3)
                / 1e6;
            match self.total {
                Some(total) if total > 0 => tracing::info!(
                    url = self.url,
                    "downloaded {:.1}% ({} of {} MB, {rate:.1} MB/s)",
                    100.0 * self.written as f64 / total as f64,
                    self.written / 1_000_000,
                    total / 1_000_000
                ),
                _ => tracing::info!(
                    url = self.url,
                    "downloaded {} MB ({rate:.1} MB/s)",
                    self.written / 1_000_000
                ),
            }
        }
        Ok(())
    }
}

/// The SHA-256 of a file, hex.
pub fn sha256_of(path: &Path) -> Result<String, DownloadError> {
    let mut file = File::open(path).map_err(|e| DownloadError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| DownloadError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
