//! Llama (`LlamaForCausalLM`): Llama 2/3, SmolLM/SmolLM2, and the shape every other family
//! varies ([`Family`]'s defaults are its answers).

use super::family::Family;

pub(super) struct Llama;

impl Family for Llama {
    fn hf_name(&self) -> &'static str {
        "LlamaForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "llama"
    }

    fn gguf_name(&self) -> &'static str {
        "llama"
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }
}
