//! Models fetched at start, as llama-server fetches them: `-hf <user>/<model>[:quant]` (with
//! `-hff` naming the file and `-hft`/`HF_TOKEN` authenticating) from the Hugging Face Hub into
//! its cache, `-mu <url>` from any URL, `-dr <model>` from Docker Hub, and `--spec-draft-hf` for
//! the draft model; `--offline` uses what the caches hold without asking the network. The server
//! then loads the fetched file as if `-m` had named it.

mod docker;
mod env;
mod error;
mod file;
mod hf;
mod names;
mod transport;
mod via_outbound;

use std::path::PathBuf;

pub use env::Env;
use env::url_cache_dir;
pub use error::DownloadError;

use transport::Transport;

/// The download flags, as llama-server spells them (the multi-letter short spellings `-hf`,
/// `-hfr`, `-hff`, `-hft`, `-mu`, `-dr`, `-hfd`, `-hfrd` are rewritten to these).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DownloadArgs {
    /// Fetch the model from a Hugging Face repository, `<user>/<model>[:quant]` (`-hf`): the GGUF
    /// naming the quant (default Q4_K_M, else Q8_0, else the first), into the Hub's cache.
    #[arg(
        long = "hf-repo",
        env = "LLAMA_ARG_HF_REPO",
        value_name = "USER/MODEL[:QUANT]"
    )]
    pub hf_repo: Option<String>,

    /// The file of `--hf-repo` to load (`-hff`), instead of choosing by quant.
    #[arg(long = "hf-file", env = "LLAMA_ARG_HF_FILE", value_name = "FILE")]
    pub hf_file: Option<String>,

    /// Hugging Face access token (`-hft`; default: `HF_TOKEN`), sent with every download.
    #[arg(
        long = "hf-token",
        env = "HF_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub hf_token: Option<String>,

    /// Fetch the model from a URL (`-mu`) into the cache (or to `-m`'s path when given).
    #[arg(long = "model-url", env = "LLAMA_ARG_MODEL_URL", value_name = "URL")]
    pub model_url: Option<String>,

    /// Fetch the model from Docker Hub, `[<repo>/]<model>[:tag]` (`-dr`; repo `ai/` and tag
    /// `latest` by default).
    #[arg(
        long = "docker-repo",
        env = "LLAMA_ARG_DOCKER_REPO",
        value_name = "[REPO/]MODEL[:TAG]"
    )]
    pub docker_repo: Option<String>,

    /// Fetch the draft model from a Hugging Face repository (`-hfd`), as `--hf-repo`;
    /// `--spec-draft-model` then names its file.
    #[arg(
        long = "spec-draft-hf",
        visible_alias = "hf-repo-draft",
        env = "LLAMA_ARG_SPEC_DRAFT_HF_REPO",
        value_name = "USER/MODEL[:QUANT]"
    )]
    pub spec_draft_hf: Option<String>,

    /// Use only what the caches hold; never ask the network.
    #[arg(long = "offline", env = "LLAMA_ARG_OFFLINE")]
    pub offline: bool,
}

/// What the flags resolved to: the paths to load in place of `-m` and `--spec-draft-model`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    pub model: Option<String>,
    pub draft: Option<String>,
}

/// Where the Docker Hub requests go (the real services, or a test's server).
#[derive(Debug, Clone)]
pub struct DockerHub {
    pub auth: String,
    pub registry: String,
}

impl Default for DockerHub {
    fn default() -> Self {
        Self {
            auth: docker::AUTH.to_owned(),
            registry: docker::REGISTRY.to_owned(),
        }
    }
}

impl DownloadArgs {
    /// Whether any flag asks for a download.
    pub fn any(&self) -> bool {
        self.hf_repo.is_some()
            || self.model_url.is_some()
            || self.docker_repo.is_some()
            || self.spec_draft_hf.is_some()
    }

    /// The flags' combinations that cannot mean anything, refused before anything is fetched.
    pub fn validate(&self, model: Option<&str>) -> Result<(), DownloadError> {
        let sources = [
            ("-hf", self.hf_repo.is_some()),
            ("-mu", self.model_url.is_some()),
            ("-dr", self.docker_repo.is_some()),
        ];
        let given: Vec<&str> = sources.iter().filter(|s| s.1).map(|s| s.0).collect();
        if given.len() > 1 {
            return Err(DownloadError::Conflict(format!(
                "{} each name the model: give one",
                given.join(" and ")
            )));
        }
        if model.is_some() && (self.hf_repo.is_some() || self.docker_repo.is_some()) {
            return Err(DownloadError::Conflict(format!(
                "-m and {} each name the model: give one (-m is a local file; {} fetches one)",
                given[0], given[0]
            )));
        }
        if self.hf_file.is_some() && self.hf_repo.is_none() {
            return Err(DownloadError::Conflict(
                "-hff/--hf-file names a file of the -hf repository: give -hf too".into(),
            ));
        }
        if let Some(reference) = &self.hf_repo {
            names::split_repo_tag(reference).map_err(|e| e.of("-hf/--hf-repo"))?;
        }
        if let Some(reference) = &self.spec_draft_hf {
            names::split_repo_tag(reference).map_err(|e| e.of("-hfd/--spec-draft-hf"))?;
        }
        if let Some(reference) = &self.docker_repo {
            docker::parse(reference).map_err(|e| e.of("-dr/--docker-repo"))?;
        }
        if let Some(url) = &self.model_url {
            check_url(url).map_err(|e| e.of("-mu/--model-url"))?;
        }
        Ok(())
    }

    /// Fetches what the flags name (nothing when none does) over `transport`.
    pub fn resolve_with(
        &self,
        transport: &dyn Transport,
        env: &Env,
        docker_hub: &DockerHub,
        model: Option<&str>,
        draft_model: Option<&str>,
    ) -> Result<Resolved, DownloadError> {
        self.validate(model)?;
        let mut headers = Vec::new();
        if let Some(token) = &self.hf_token {
            headers.push(("authorization".to_owned(), format!("Bearer {token}")));
        }
        let mut resolved = Resolved {
            model: model.map(str::to_owned),
            draft: draft_model.map(str::to_owned),
        };
        if let Some(reference) = &self.hf_repo {
            let (repo, tag) = names::split_repo_tag(reference)?;
            let plan = hf::plan(
                transport,
                env,
                &repo,
                &tag,
                self.hf_file.as_deref(),
                &headers,
                self.offline,
            )?;
            refuse_split(&plan)?;
            let path = hf::fetch_plan(transport, &plan, &headers, self.offline)?;
            resolved.model = Some(path.to_string_lossy().into_owned());
        }
        if let Some(url) = &self.model_url {
            // The token goes to the Hub only, never to another host a URL names.
            let headers = if url.starts_with(&hf::endpoint(env)) {
                headers.as_slice()
            } else {
                &[]
            };
            let path = fetch_url(transport, env, url, model, headers, self.offline)?;
            resolved.model = Some(path.to_string_lossy().into_owned());
        }
        if let Some(reference) = &self.docker_repo {
            let path = docker::resolve(
                transport,
                env,
                reference,
                self.offline,
                &docker_hub.auth,
                &docker_hub.registry,
            )?;
            resolved.model = Some(path.to_string_lossy().into_owned());
        }
        if let Some(reference) = &self.spec_draft_hf {
            let (repo, tag) = names::split_repo_tag(reference)?;
            // As llama-server: `--spec-draft-model` names the draft repository's file.
            let plan = hf::plan(
                transport,
                env,
                &repo,
                &tag,
                draft_model,
                &headers,
                self.offline,
            )?;
            refuse_split(&plan)?;
            let path = hf::fetch_plan(transport, &plan, &headers, self.offline)?;
            resolved.draft = Some(path.to_string_lossy().into_owned());
        }
        Ok(resolved)
    }

    /// [`DownloadArgs::resolve_with`] over the server's outbound HTTP client; blocks until every
    /// file is there. Call it outside any async runtime (it runs one of its own).
    pub fn resolve_in(
        &self,
        env: &Env,
        docker_hub: &DockerHub,
        model: Option<&str>,
        draft_model: Option<&str>,
    ) -> Result<Resolved, DownloadError> {
        let transport = via_outbound::OutboundTransport::new()?;
        self.resolve_with(&transport, env, docker_hub, model, draft_model)
    }
}

fn check_url(url: &str) -> Result<(), DownloadError> {
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && names::url_file_name(url).is_some();
    if ok {
        Ok(())
    } else {
        Err(DownloadError::BadReference {
            reference: url.to_owned(),
            expected: "an http:// or https:// URL ending in the file's name",
        })
    }
}

fn refuse_split(plan: &hf::Plan) -> Result<(), DownloadError> {
    match names::gguf_name(&plan.primary.path) {
        Some(name) if name.count > 1 => Err(DownloadError::Split {
            path: plan.primary.path.clone(),
            count: name.count,
        }),
        _ => Ok(()),
    }
}

/// `-mu`: the URL's file into the cache (named by the URL), or to `-m`'s path when given.
fn fetch_url(
    transport: &dyn Transport,
    env: &Env,
    url: &str,
    model: Option<&str>,
    headers: &[(String, String)],
    offline: bool,
) -> Result<PathBuf, DownloadError> {
    check_url(url)?;
    if let Some(name) = names::gguf_name(url).filter(|n| n.count > 1) {
        return Err(DownloadError::Split {
            path: url.to_owned(),
            count: name.count,
        });
    }
    let path = match model {
        Some(path) => PathBuf::from(path),
        None => url_cache_dir(env)?.join(names::url_file_name(url).expect("checked")),
    };
    tracing::info!(url, path = %path.display(), "fetching the model");
    file::fetch(
        transport,
        url,
        &path,
        &file::FetchOptions::new(headers.to_vec(), offline),
    )?;
    Ok(path)
}
