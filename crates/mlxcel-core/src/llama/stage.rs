//! A pipeline stage's part of the model: a contiguous range of decoder layers, plus the
//! embedding (the first stage), the final norm (the last stage) and the output projection (the
//! last stage when untied; the first, which holds the table anyway, when tied to the embedding).
//! Its step is `stage_step.rs`'s.

use mlxcel_model::ModelConfig;

use super::delta_net::state_shape;
use crate::error::{Error, Result};
use crate::kv_cache::KvType;

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
    /// The part of the layout cache's file name that says which weights this stage holds:
    /// empty for the whole model, else its layers and ends (`-layers-8-16-eh`: embedding,
    /// head), so a stage's file and the whole model's are apart (`crate::layout_cache`).
    pub(crate) fn cache_name(&self, config: &ModelConfig) -> String {
        if *self == Stage::whole(config) {
            return String::new();
        }
        let mut name = format!("-layers-{}-{}-", self.first, self.end);
        for (on, c) in [(self.embeds, 'e'), (self.norm, 'n'), (self.head, 'h')] {
            if on {
                name.push(c);
            }
        }
        name
    }

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

    /// What one sequence's cache costs on this stage, counted from the model's description (the
    /// stage need not be loaded here): `(bytes per position, bytes per sequence)`, the keys and
    /// values of its softmax-attention layers in `kv_types`, and the recurrent state (f32) of
    /// its linear-attention layers and short convolutions (a hybrid's; 0 otherwise): a
    /// convolution keeps its last `kernel - 1` products of `hidden` channels, and no keys or
    /// values. Rank 0 budgets every rank's caches by these.
    pub fn cache_bytes(&self, config: &ModelConfig, kv_types: (KvType, KvType)) -> (usize, usize) {
        let layers = &config.layers[self.first.min(self.end)..self.end.min(config.layers.len())];
        let attention = layers
            .iter()
            .filter(|l| l.linear.is_none() && l.conv.is_none())
            .count();
        let per_position = attention
            * config.num_key_value_heads
            * (kv_types.0.row_bytes(config.head_dim) + kv_types.1.row_bytes(config.head_dim));
        let linear: usize = layers
            .iter()
            .filter_map(|l| l.linear.as_ref())
            .map(|spec| {
                let shape = state_shape(spec);
                4 * (shape.conv + shape.matrix)
            })
            .sum();
        let conv: usize = layers
            .iter()
            .filter_map(|l| l.conv.as_ref())
            .map(|spec| 4 * spec.kernel.saturating_sub(1) * config.hidden_size)
            .sum();
        (per_position, linear + conv)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// LFM2: layers 0 and 2 convolutions of 3 taps over 64 channels, 1 and 3 attention with 2
    /// key/value heads of 16.
    fn lfm2() -> ModelConfig {
        let json = r#"{
            "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 64,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 384, "block_ff_dim": 128, "block_auto_adjust_ff_dim": false,
            "conv_L_cache": 3, "layer_types": ["conv", "full_attention", "conv", "full_attention"]
        }"#;
        ModelConfig::from_json(Path::new("config.json"), json).unwrap()
    }

    #[test]
    fn convolution_layers_count_their_state_not_keys_and_values() {
        let config = lfm2();
        let f32s = (KvType::F32, KvType::F32);
        // Two attention layers: 2 heads × (16 keys + 16 values) × 4 bytes each.
        let kv = 2 * 2 * 2 * KvType::F32.row_bytes(16);
        assert_eq!(kv, 2 * 2 * 2 * 16 * 4);
        // Two convolutions: (3 - 1) products of 64 f32 channels each.
        let state = 2 * 2 * 64 * 4;
        assert_eq!(
            Stage::whole(&config).cache_bytes(&config, f32s),
            (kv, state)
        );
        // Split after layer 1: each rank one convolution and one attention layer.
        for rank in 0..2 {
            let stage = Stage::of_pipeline(&config, &[2, 4], rank).unwrap();
            assert_eq!(stage.cache_bytes(&config, f32s), (kv / 2, state / 2));
        }
    }

    #[test]
    fn each_stage_keeps_its_layout_in_a_file_of_its_own() {
        let config = lfm2();
        assert_eq!(Stage::whole(&config).cache_name(&config), "");
        let names: Vec<String> = (0..2)
            .map(|rank| {
                Stage::of_pipeline(&config, &[2, 4], rank)
                    .unwrap()
                    .cache_name(&config)
            })
            .collect();
        // Tied embeddings (LFM2): the table, and so the head, on the first stage.
        assert_eq!(names, ["-layers-0-2-eh", "-layers-2-4-n"]);
    }
}
