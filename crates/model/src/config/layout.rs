//! Attention layers that differ from one another in their shapes (Gemma 4): a larger head on the
//! full-attention layers, layers that reuse an earlier layer's keys and values, and per-layer
//! token inputs. What each layer's keys and values look like, and which layers hold them, is
//! answered here for every model, so that caches and budgets count them the same way.

use std::ops::Range;

use super::ModelConfig;
use crate::activations::KvType;

impl ModelConfig {
    /// Layer `layer`'s head size: `global_head_dim` on a full-attention layer when the model has
    /// one (Gemma 4), else `head_dim`.
    pub fn layer_head_dim(&self, layer: usize) -> usize {
        match (self.global_head_dim, self.layers[layer].window) {
            (Some(global), None) => global,
            _ => self.head_dim,
        }
    }

    /// Rows of layer `layer`'s q projection (`num_attention_heads · its head size`).
    pub fn layer_q_dim(&self, layer: usize) -> usize {
        self.num_attention_heads * self.layer_head_dim(layer)
    }

    /// Whether layer `layer`'s values are its keys' projection (a full layer of a model with
    /// `keys_as_values`): it has no `v_proj`.
    pub fn layer_keys_as_values(&self, layer: usize) -> bool {
        self.keys_as_values && self.layers[layer].window.is_none()
    }

    /// Layer `layer`'s key/value heads: `global_key_value_heads` on a layer whose keys are its
    /// values, when the model gives them, else `num_key_value_heads`.
    pub fn layer_kv_heads(&self, layer: usize) -> usize {
        match self.global_key_value_heads {
            Some(heads) if self.layer_keys_as_values(layer) => heads,
            _ => self.num_key_value_heads,
        }
    }

    /// Rows of each of layer `layer`'s k and v projections.
    pub fn layer_kv_dim(&self, layer: usize) -> usize {
        self.layer_kv_heads(layer) * self.layer_head_dim(layer)
    }

    /// The features RoPE rotates on the sliding layers that rotate with the local base:
    /// `head_dim` when the full layers have a head of their own (whose width `rotary_dim` is),
    /// else `rotary_dim`.
    pub fn local_rotary_dim(&self) -> usize {
        match self.global_head_dim {
            Some(_) => self.head_dim,
            None => self.rotary_dim,
        }
    }

    /// The earlier layer whose keys and values layer `layer` attends over, when it computes
    /// none of its own (the last `kv_shared_layers` layers of Gemma 4): the last layer before
    /// them of the same kind (sliding or full). `None` for a layer with keys and values of its
    /// own (every layer of other models).
    pub fn kv_source(&self, layer: usize) -> Option<usize> {
        let first_shared = self.num_hidden_layers - self.kv_shared_layers;
        if self.kv_shared_layers == 0 || layer < first_shared {
            return None;
        }
        let slides = self.layers[layer].window.is_some();
        (0..first_shared)
            .rev()
            .find(|&j| self.layers[j].window.is_some() == slides && self.holds_kv(j))
    }

    /// Whether layer `layer` writes keys and values into a sequence's cache: a softmax-attention
    /// layer that does not reuse another's.
    pub fn holds_kv(&self, layer: usize) -> bool {
        let l = &self.layers[layer];
        l.linear.is_none()
            && l.conv.is_none()
            && layer < self.num_hidden_layers - self.kv_shared_layers
    }

    /// Per cache layer of the model's `layers` (in order): `(kv_heads, head_dim)` of the layers
    /// that hold keys and values ([`ModelConfig::holds_kv`]).
    pub fn kv_shapes(&self, layers: Range<usize>) -> Vec<(usize, usize)> {
        layers
            .filter(|&i| self.holds_kv(i))
            .map(|i| (self.layer_kv_heads(i), self.layer_head_dim(i)))
            .collect()
    }

    /// Bytes of keys and values one position takes over the cache layers among `layers`, keys
    /// of `types.0` and values of `types.1`.
    pub fn kv_bytes_per_position(&self, layers: Range<usize>, types: (KvType, KvType)) -> usize {
        self.kv_shapes(layers)
            .into_iter()
            .map(|(heads, dim)| heads * (types.0.row_bytes(dim) + types.1.row_bytes(dim)))
            .sum()
    }

    /// Whether its attention layers differ in shape or in what they hold (a larger head on the
    /// full layers, shared keys and values, per-layer token inputs): backends build such
    /// layers apart.
    pub fn has_varied_layers(&self) -> bool {
        self.global_head_dim.is_some()
            || self.kv_shared_layers > 0
            || self.per_layer_input.is_some()
            || self.keys_as_values
    }
}
