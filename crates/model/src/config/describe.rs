//! [`ModelConfig::describe`]: the one line logs print for a checkpoint's family and features.

use super::ModelConfig;
use super::blocks::HiddenActivation;
use super::rope::RopeScaling;

impl ModelConfig {
    /// One line for logs: the family and the features detected, e.g.
    /// `qwen3: 28 layers, q/k norm, tied embeddings`.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} layers", self.num_hidden_layers)];
        if self.attention_qkv_bias {
            parts.push("q/k/v biases".into());
        }
        if self.attention_out_bias {
            parts.push("output bias".into());
        }
        if self.attention_sinks {
            parts.push("attention sinks".into());
        }
        if self.qk_norm {
            parts.push(if self.qk_norm_whole {
                "whole q/k norm".into()
            } else {
                "q/k norm".into()
            });
        }
        if self.num_key_value_heads < self.num_attention_heads {
            parts.push(format!(
                "grouped-query attention ({} kv heads)",
                self.num_key_value_heads
            ));
        }
        let nope = self.layers.iter().filter(|l| !l.rope).count();
        if nope > 0 {
            parts.push(format!("{nope} layers without RoPE"));
        }
        if let Some(window) = self.sliding_window() {
            let sliding = self.layers.iter().filter(|l| l.window.is_some()).count();
            parts.push(format!(
                "sliding window {window} on {sliding} of {} layers",
                self.num_hidden_layers
            ));
        }
        let linear: Vec<_> = self.layers.iter().filter_map(|l| l.linear).collect();
        if let Some(net) = linear.first() {
            parts.push(format!(
                "gated-DeltaNet linear attention on {} of {} layers ({}/{} key/value heads of \
                 {}/{}, conv {})",
                linear.len(),
                self.num_hidden_layers,
                net.key_heads,
                net.value_heads,
                net.key_head_dim,
                net.value_head_dim,
                net.conv_kernel
            ));
        }
        let conv: Vec<_> = self.layers.iter().filter_map(|l| l.conv).collect();
        if let Some(first) = conv.first() {
            parts.push(format!(
                "short convolutions on {} of {} layers ({} taps)",
                conv.len(),
                self.num_hidden_layers,
                first.kernel
            ));
        }
        if self.attention_output_gate {
            parts.push("gated attention output".into());
        }
        let routed: Vec<_> = self
            .feed_forward
            .iter()
            .filter_map(|f| f.routed())
            .collect();
        if let Some(moe) = routed.first() {
            let shared = if moe.shared_expert_intermediate_size.is_some() {
                " and a shared expert"
            } else if moe.parallel_dense.is_some() {
                " beside the dense MLP"
            } else {
                ""
            };
            parts.push(format!(
                "{} experts, top-{}{shared} on {} of {} layers",
                moe.num_experts,
                moe.top_k,
                routed.len(),
                self.num_hidden_layers
            ));
            if moe.biases {
                parts.push("router and expert biases".into());
            }
            if let HiddenActivation::ClampedSwiglu { limit, .. } = moe.activation {
                parts.push(format!("clamped SwiGLU experts (limit {limit})"));
            }
        }
        if let Some(RopeScaling::Llama3 { factor, .. }) = self.rope_scaling {
            parts.push(format!("llama3 rope scaling x{factor}"));
        }
        if self.value_norm {
            parts.push("v norm".into());
        }
        if self.layer_scalars {
            parts.push("layer scalars".into());
        }
        if let Some(global) = self.global_head_dim {
            parts.push(format!("full layers' head {global}"));
        }
        if self.kv_shared_layers > 0 {
            parts.push(format!(
                "last {} layers reuse earlier keys and values",
                self.kv_shared_layers
            ));
        }
        if let Some(per_layer) = self.per_layer_input {
            parts.push(format!("per-layer token inputs of {}", per_layer.hidden));
        }
        if self.sandwich_norms {
            parts.push("pre/post norms".into());
        }
        if self.hidden_activation == HiddenActivation::GeluTanh {
            parts.push("GELU-tanh MLP".into());
        }
        if let Some(cap) = self.attn_logit_softcapping {
            parts.push(format!("attention soft-cap {cap}"));
        }
        if let Some(cap) = self.final_logit_softcapping {
            parts.push(format!("final soft-cap {cap}"));
        }
        if let Some(theta) = self.rope_local_theta {
            parts.push(format!("local RoPE base {theta}"));
        }
        if let Some(RopeScaling::Linear { factor }) = self.rope_scaling {
            parts.push(format!("linear rope scaling x{factor}"));
        }
        if let Some(RopeScaling::Yarn(yarn)) = self.rope_scaling {
            parts.push(format!(
                "YaRN rope scaling x{} (attention factor {:.4})",
                yarn.factor, yarn.attention_factor
            ));
        }
        if self.rotary_dim < self.head_dim {
            parts.push(format!(
                "partial rotary ({} of {})",
                self.rotary_dim, self.head_dim
            ));
        }
        if self.rope_factors.is_some() {
            parts.push(format!(
                "LongRoPE (attention factor {:.4})",
                self.rope_attention_factor
            ));
        }
        let fused = self.architecture.fused_projections();
        if !fused.is_empty() {
            let labels: Vec<&str> = fused.iter().map(|f| f.label).collect();
            parts.push(format!("fused {}", labels.join(" and ")));
        }
        if self.multimodal {
            parts.push("the text model of a multimodal checkpoint".into());
        }
        if self.tie_word_embeddings {
            parts.push("tied embeddings".into());
        }
        if let Some(q) = &self.quantization {
            parts.push(format!("{}-bit", q.default.bits));
        }
        format!("{}: {}", self.architecture.model_type(), parts.join(", "))
    }
}
