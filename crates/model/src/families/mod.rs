//! Model families: one file each, every one implementing [`family::Family`], and [`FAMILIES`], the
//! one list that names them. Adding a llama-shaped family is its file and a line here.
//!
//! Everything else (config validation, checkpoint checks, GGUF conversion, the backends) asks a
//! family through an [`Architecture`], never by its name.

mod delta_net;
mod family;
mod gemma2;
mod gemma3;
mod gemma4;
mod gemma4_gguf;
mod gpt_oss;
mod lfm2;
mod llama;
mod mistral;
mod mixtral;
mod moe;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;
mod smollm3;

use family::Family;
pub use family::{FusedProjection, Rows};

/// Every family mlxcel runs, in the order their names are listed to users. For a GGUF
/// `general.architecture` that several families are written as, the first one reads it.
static FAMILIES: &[&dyn Family] = &[
    &llama::Llama,
    &mistral::Mistral,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &qwen3_moe::Qwen3Moe,
    &qwen2_moe::Qwen2Moe,
    &mixtral::Mixtral,
    &olmoe::Olmoe,
    &gpt_oss::GptOss,
    &smollm3::SmolLm3,
    &gemma2::Gemma2,
    &gemma3::Gemma3,
    &gemma4::Gemma4,
    &phi3::Phi3,
    &qwen3_next::Qwen3Next,
    &qwen3_5::Qwen35,
    &qwen3_5::Qwen35Moe,
    &lfm2::Lfm2,
    &lfm2::Lfm2Moe,
];

/// The model family of a checkpoint: a handle on its entry of [`FAMILIES`]. Backends read
/// [`crate::ModelConfig`]'s features, never the family; logs print its names.
#[derive(Clone, Copy)]
pub struct Architecture(&'static dyn Family);

impl Architecture {
    /// The family whose `architectures[0]` or `model_type` is `name` (e.g. `LlamaForCausalLM` or
    /// `llama`).
    pub fn named(name: &str) -> Option<Self> {
        FAMILIES
            .iter()
            .find(|f| f.hf_name() == name || f.model_type() == name)
            .map(|&f| Self(f))
    }

    /// The family a GGUF file of `general.architecture` `name` is read as.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        FAMILIES
            .iter()
            .find(|f| f.gguf_name() == name)
            .map(|&f| Self(f))
    }

    /// The family a GGUF file of `general.architecture` `name` is read as, given whether it has
    /// experts (`{name}.expert_count` above zero): the first family of that name with (or
    /// without) experts, else the first of that name (which then refuses or misses the experts by
    /// name).
    pub fn from_gguf_name_with_experts(name: &str, experts: bool) -> Option<Self> {
        FAMILIES
            .iter()
            .find(|f| f.gguf_name() == name && f.has_experts() == experts)
            .map(|&f| Self(f))
            .or_else(|| Self::from_gguf_name(name))
    }

    /// The family whose multimodal checkpoint (`architectures[0]` or `model_type`) is `name`.
    pub(crate) fn multimodal_named(name: &str) -> Option<Self> {
        FAMILIES
            .iter()
            .find(|f| {
                f.multimodal_wrapper()
                    .is_some_and(|(hf, model_type)| hf == name || model_type == name)
            })
            .map(|&f| Self(f))
    }

    /// Every family, in [`FAMILIES`]' order.
    pub fn all() -> impl Iterator<Item = Self> {
        FAMILIES.iter().map(|&f| Self(f))
    }

    /// The `architectures[0]` names config.json may give, for errors: `LlamaForCausalLM, …`.
    pub fn supported_names() -> String {
        Self::all()
            .map(Self::hf_name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The `model_type`s of the mixture-of-experts families, for errors: `qwen3_moe, …`.
    pub fn moe_names() -> String {
        Self::all()
            .filter(|a| a.0.has_experts())
            .map(Self::model_type)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The GGUF `general.architecture` names mlxcel reads, for errors: `llama, qwen2, …`.
    pub fn supported_gguf_names() -> String {
        let mut names: Vec<&str> = Vec::new();
        for family in FAMILIES.iter().filter(|f| f.gguf_refusal().is_none()) {
            if !names.contains(&family.gguf_name()) {
                names.push(family.gguf_name());
            }
        }
        names.join(", ")
    }

    /// The `architectures[0]` string Hugging Face writes for this architecture.
    pub fn hf_name(self) -> &'static str {
        self.0.hf_name()
    }

    /// The `model_type` Hugging Face writes for this architecture.
    pub fn model_type(self) -> &'static str {
        self.0.model_type()
    }

    /// llama.cpp's `general.architecture` for this architecture (Mistral's is `llama`).
    pub fn gguf_name(self) -> &'static str {
        self.0.gguf_name()
    }

    /// Whether llama.cpp's converter permutes the rows of this architecture's q and k.
    pub fn gguf_permuted_qk(self) -> bool {
        self.0.gguf_permuted_qk()
    }

    /// Projections this architecture's checkpoints store fused (Phi-3's `qkv_proj`,
    /// `gate_up_proj`), loaded as their parts.
    pub fn fused_projections(self) -> &'static [FusedProjection] {
        self.0.fused_projections()
    }

    /// Why a GGUF file of this architecture is refused, when mlxcel cannot import it yet.
    pub fn gguf_refusal(self) -> Option<&'static str> {
        self.0.gguf_refusal()
    }

    /// The family itself, for the code that reads and converts its files.
    pub(crate) fn family(self) -> &'static dyn Family {
        self.0
    }
}

impl PartialEq for Architecture {
    fn eq(&self, other: &Self) -> bool {
        self.hf_name() == other.hf_name()
    }
}

impl Eq for Architecture {}

impl std::fmt::Debug for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.hf_name())
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}
