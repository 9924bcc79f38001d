//! The pipeline flags `generate`, `run` and `serve` share (docs/distributed.md): which rank of a
//! pipeline of processes this one is, and where the others are. Rank 0 goes on to run the
//! command; every other rank becomes a stage worker and exits when rank 0 is done.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use mlxcel_engine::{EngineOptions, PipelineOptions};

#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Pipeline (several processes, docs/distributed.md)")]
pub struct PipelineArgs {
    /// Run as one rank of a pipeline started by MLX's launcher (`mlx.launch --hostfile FILE -n
    /// N -- mlxcel ... --pipeline`): the hostfile and the rank come from MLX_HOSTFILE and
    /// MLX_RANK.
    #[arg(long, conflicts_with_all = ["pipeline_hosts", "rank"])]
    pub pipeline: bool,

    /// Run as one rank of a pipeline whose hosts FILE lists: MLX's ring hostfile, a JSON list
    /// with one entry per rank, each a list of "ip:port" (e.g. [["10.0.0.1:5000"],
    /// ["10.0.0.2:5000"]]). Needs --rank.
    #[arg(long, value_name = "FILE", requires = "rank")]
    pub pipeline_hosts: Option<PathBuf>,

    /// This process's rank in --pipeline-hosts: 0 runs the command (and the HTTP server), the
    /// others hold later layers and exit when rank 0 is done.
    #[arg(long, value_name = "R", requires = "pipeline_hosts")]
    pub rank: Option<usize>,

    /// Decoder layers per rank, rank 0's first, comma-separated (e.g. 10,20); read on rank 0.
    /// Default: a split in which the ranks hold about as many bytes of weights each.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub pipeline_layers: Option<Vec<usize>>,

    /// Seconds to wait at start for every rank to connect before failing with the addresses
    /// that did not answer.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub pipeline_timeout: u64,

    /// Micro-batches a step of several sequences is split into, so that the ranks work at once
    /// (each on its own part); read on rank 0. Default: one per rank; 1 runs each step whole.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub pipeline_micro_batches: Option<u64>,

    /// Seconds a ring connection may stay unanswered before the pipeline is declared down (a
    /// silent partition: a host gone or a link cut); idle links are probed every second. Set
    /// on every rank.
    #[arg(long, value_name = "SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub pipeline_link_timeout: u64,

    /// Once the pipeline is down (a rank lost), rank 0's server exits with status 1, for a
    /// supervisor that restarts every rank; by default it keeps answering 503 with the reason.
    #[arg(long)]
    pub pipeline_exit_on_failure: bool,
}

impl PipelineArgs {
    /// The pipeline these flags describe; `None` without one. `launcher` is MLX_HOSTFILE and
    /// MLX_RANK as the environment sets them.
    pub fn options(
        &self,
        launcher: (Option<String>, Option<String>),
    ) -> Result<Option<PipelineOptions>> {
        let (hostfile, rank) = match (&self.pipeline_hosts, self.rank, self.pipeline) {
            (Some(file), Some(rank), false) => (file.clone(), rank),
            (None, None, true) => match launcher {
                (Some(file), Some(rank)) if !file.is_empty() => {
                    let rank = rank.trim().parse().map_err(|_| {
                        anyhow::anyhow!("--pipeline: MLX_RANK={rank:?} is not a rank number")
                    })?;
                    (PathBuf::from(file), rank)
                }
                _ => bail!(
                    "--pipeline takes the hostfile and rank from MLX_HOSTFILE and MLX_RANK, which \
                     MLX's launcher sets (mlx.launch --hostfile FILE -n N -- mlxcel ... --pipeline); \
                     without it, give --pipeline-hosts FILE --rank R"
                ),
            },
            _ => {
                if self.pipeline_layers.is_some() {
                    bail!(
                        "--pipeline-layers needs a pipeline: --pipeline, or --pipeline-hosts and --rank"
                    );
                }
                if self.pipeline_exit_on_failure {
                    bail!(
                        "--pipeline-exit-on-failure needs a pipeline: --pipeline, or \
                         --pipeline-hosts and --rank"
                    );
                }
                if self.pipeline_micro_batches.is_some() {
                    bail!(
                        "--pipeline-micro-batches needs a pipeline: --pipeline, or --pipeline-hosts \
                         and --rank"
                    );
                }
                return Ok(None);
            }
        };
        Ok(Some(PipelineOptions {
            hostfile,
            rank,
            layers: self.pipeline_layers.clone(),
            connect_timeout: Duration::from_secs(self.pipeline_timeout.max(1)),
            micro_batches: self.pipeline_micro_batches.map(|n| n as usize),
            link_timeout: Duration::from_secs(self.pipeline_link_timeout),
            exit_on_failure: self.pipeline_exit_on_failure,
        }))
    }

    /// Puts the pipeline into `options` and joins it. `true` when this process is a stage
    /// worker, which has then served until rank 0 finished: the caller exits; `false` for rank 0
    /// (which runs the command) or without a pipeline.
    pub fn join(&self, model: Option<&str>, options: &mut EngineOptions) -> Result<bool> {
        let launcher = (
            std::env::var("MLX_HOSTFILE").ok(),
            std::env::var("MLX_RANK").ok(),
        );
        let Some(pipeline) = self.options(launcher)? else {
            return Ok(false);
        };
        if options.draft_model.is_some() {
            bail!("--spec-draft-model is not supported in a pipeline yet (docs/distributed.md)");
        }
        let rank = mlxcel_engine::join_pipeline(&pipeline)?;
        options.pipeline = Some(pipeline);
        if rank == 0 {
            return Ok(false);
        }
        mlxcel_engine::run_pipeline_stage(model, options)?;
        eprintln!("mlxcel: pipeline rank {rank}: rank 0 finished; exiting");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pipeline: bool, hosts: Option<&str>, rank: Option<usize>) -> PipelineArgs {
        PipelineArgs {
            pipeline,
            pipeline_hosts: hosts.map(PathBuf::from),
            rank,
            pipeline_layers: None,
            pipeline_timeout: 60,
            pipeline_micro_batches: None,
            pipeline_link_timeout: 5,
            pipeline_exit_on_failure: false,
        }
    }

    #[test]
    fn flags_or_the_launchers_environment_name_the_rank() {
        let none = (None, None);
        assert_eq!(args(false, None, None).options(none.clone()).unwrap(), None);
        let native = args(false, Some("h.json"), Some(1))
            .options(none.clone())
            .unwrap()
            .unwrap();
        assert_eq!((native.hostfile, native.rank), (PathBuf::from("h.json"), 1));
        let launched = args(true, None, None)
            .options((Some("l.json".into()), Some("2".into())))
            .unwrap()
            .unwrap();
        assert_eq!(
            (launched.hostfile, launched.rank),
            (PathBuf::from("l.json"), 2)
        );
        let err = args(true, None, None)
            .options(none.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains("MLX_HOSTFILE"), "{err}");
        let err = args(true, None, None)
            .options((Some("l.json".into()), Some("x".into())))
            .unwrap_err()
            .to_string();
        assert!(err.contains("MLX_RANK=\"x\""), "{err}");
        let mut layers = args(false, None, None);
        layers.pipeline_layers = Some(vec![10, 20]);
        let err = layers.options(none.clone()).unwrap_err().to_string();
        assert!(err.contains("--pipeline-layers needs a pipeline"), "{err}");
        let mut micro = args(false, None, None);
        micro.pipeline_micro_batches = Some(2);
        let err = micro.options(none.clone()).unwrap_err().to_string();
        assert!(
            err.contains("--pipeline-micro-batches needs a pipeline"),
            "{err}"
        );
        micro.pipeline_hosts = Some(PathBuf::from("h.json"));
        micro.rank = Some(0);
        let piped = micro.options(none.clone()).unwrap().unwrap();
        assert_eq!(piped.micro_batches, Some(2));
        assert!(!piped.exit_on_failure);
        assert_eq!(piped.link_timeout, Duration::from_secs(5));

        let mut exit = args(false, None, None);
        exit.pipeline_exit_on_failure = true;
        let err = exit.options(none.clone()).unwrap_err().to_string();
        assert!(
            err.contains("--pipeline-exit-on-failure needs a pipeline"),
            "{err}"
        );
        exit.pipeline_hosts = Some(PathBuf::from("h.json"));
        exit.rank = Some(1);
        exit.pipeline_link_timeout = 9;
        let piped = exit.options(none).unwrap().unwrap();
        assert!(piped.exit_on_failure);
        assert_eq!(piped.link_timeout, Duration::from_secs(9));
    }
}
