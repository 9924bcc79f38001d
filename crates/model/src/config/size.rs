//! How many parameters a model has, counted from its config: what `mlxcel show` prints and what
//! the applications' default activations look at (small models run exact f32 activations).

use super::ModelConfig;
use super::blocks::FeedForward;

impl ModelConfig {
    /// Every weight the model holds (embeddings, the output head unless tied, every layer's
    /// projections, norms and experts); biases are left out. A mixture of experts counts all of
    /// its experts ([`ModelConfig::active_parameter_count`] counts what a token reads).
    pub fn parameter_count(&self) -> u64 {
        self.count(false)
    }

    /// The weights one token's forward pass reads: [`ModelConfig::parameter_count`] with each
    /// mixture of experts counted as its routed `top_k` experts (and shared expert), not all of
    /// them. The same as `parameter_count` for dense models.
    pub fn active_parameter_count(&self) -> u64 {
        self.count(true)
    }

    fn count(&self, active_only: bool) -> u64 {
        let n = |x: usize| x as u64;
        let hidden = n(self.hidden_size);
        let embeddings = n(self.vocab_size) * hidden;
        let head = if self.tie_word_embeddings {
            0
        } else {
            embeddings
        };
        // Per-layer token inputs: their table and projection, and each layer's gate.
        let (per_layer_model, per_layer_each) = match self.per_layer_input {
            Some(p) => {
                let width = n(self.num_hidden_layers) * n(p.hidden);
                (
                    width * (n(p.vocab) + hidden) + n(p.hidden),
                    2 * hidden * n(p.hidden) + hidden,
                )
            }
            None => (0, 0),
        };
        let layers: u64 = (0..self.num_hidden_layers)
            .map(|i| {
                // A layer reusing another's keys and values has no k, v or k norm.
                let own_kv = u64::from(self.kv_source(i).is_none());
                let (q_dim, kv_dim) = (n(self.layer_q_dim(i)), n(self.layer_kv_dim(i)));
                let kv_projections = if self.layer_keys_as_values(i) { 1 } else { 2 };
                let attention = hidden * (2 * q_dim + kv_projections * own_kv * kv_dim);
                let qk_norms = match (self.qk_norm, self.qk_norm_whole) {
                    (false, _) => 0,
                    (true, false) => (1 + own_kv) * n(self.layer_head_dim(i)),
                    (true, true) => q_dim + own_kv * kv_dim,
                };
                let norms =
                    hidden * if self.sandwich_norms { 4 } else { 2 } + qk_norms + per_layer_each;
                let ffn = match self.layer_spec(i).ffn {
                    FeedForward::Dense {
                        intermediate_size, ..
                    } => 3 * hidden * n(intermediate_size),
                    FeedForward::RoutedExperts(moe) => {
                        let experts = if active_only {
                            moe.top_k
                        } else {
                            moe.num_experts
                        };
                        let shared = moe
                            .shared_expert_intermediate_size
                            .map_or(0, |s| 3 * hidden * n(s) + hidden);
                        // Gemma 4's dense MLP beside the experts, its three norms and the
                        // router's two scales.
                        let parallel = moe
                            .parallel_dense
                            .map_or(0, |d| 3 * hidden * n(d) + 4 * hidden + n(moe.num_experts));
                        n(moe.num_experts) * hidden
                            + n(experts) * 3 * hidden * n(moe.expert_intermediate_size)
                            + shared
                            + parallel
                    }
                };
                attention + norms + ffn
            })
            .sum();
        embeddings + head + layers + hidden + per_layer_model
    }
}
