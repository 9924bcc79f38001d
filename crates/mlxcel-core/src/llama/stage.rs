//! A pipeline stage's part of the model: a contiguous range of decoder layers, plus the
//! embedding (the first stage), the final norm (the last stage) and the output projection (the
//! last stage when untied; the first, which holds the table anyway, when tied to the embedding).
//! Its step is `stage_step.rs`'s.

use mlxcel_model::ModelConfig;

use crate::error::{Error, Result};

/// Which part of a model one process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// The first decoder layer this stage runs.
    pub first: usize,
    /// One past the last decoder layer this stage runs.
    pub end: usize,
    /// Looks the step's tokens up in the embedding table (the first stage).
    pub embeds: bool,
    /// Holds the final norm (the last stage).
    pub norm: bool,
    /// Holds the output projection: `lm_head` when untied (then on the last stage), the
    /// embedding table when tied (then on the first).
    pub head: bool,
}

impl Stage {
    /// The whole model in one process.
    pub fn whole(config: &ModelConfig) -> Stage {
        Stage {
            first: 0,
            end: config.num_hidden_layers,
            embeds: true,
            norm: true,
            head: true,
        }
    }

    /// Stage `rank` of `ends.len()` whose layers end where `ends` says (`ends[r]` is one past
    /// stage `r`'s last layer, ascending, the last one the model's layer count): the first stage
    /// embeds, the last one norms, and the projection sits on the last stage, or on the first
    /// when it is the (tied) embedding table.
    pub fn of_pipeline(config: &ModelConfig, ends: &[usize], rank: usize) -> Result<Stage> {
        let bad = |message: String| Error::Mlx {
            op: "pipeline stage",
            message,
        };
        let layers = config.num_hidden_layers;
        let ascending = ends.windows(2).all(|w| w[0] < w[1]);
        if ends.is_empty() || !ascending || ends.last() != Some(&layers) || ends[0] == 0 {
            return Err(bad(format!(
                "stage ends {ends:?} do not split {layers} layers into non-empty ranges"
            )));
        }
        if rank >= ends.len() {
            return Err(bad(format!(
                "rank {rank} is outside a pipeline of {}",
                ends.len()
            )));
        }
        let last = rank + 1 == ends.len();
        Ok(Stage {
            first: if rank == 0 { 0 } else { ends[rank - 1] },
            end: ends[rank],
            embeds: rank == 0,
            norm: last,
            head: if config.tie_word_embeddings {
                rank == 0
            } else {
                last
            },
        })
    }

    /// Whether this stage's layers fit the model.
    pub(super) fn check(&self, config: &ModelConfig) -> Result<()> {
        if self.first >= self.end || self.end > config.num_hidden_layers {
            return Err(Error::Mlx {
                op: "pipeline stage",
                message: format!(
                    "layers {}..{} are not a non-empty range of the model's {}",
                    self.first, self.end, config.num_hidden_layers
                ),
            });
        }
        Ok(())
    }
}
