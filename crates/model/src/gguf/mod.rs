//! GGUF: reading, llama.cpp-exact dequantization, and conversion to an MLX checkpoint.

mod convert;
pub mod dequant;
pub(crate) mod header;
mod linear_attention;
pub(crate) mod names;
pub mod overrides;
pub mod permute;
mod rank;
mod reader;
mod spm;
pub(crate) mod tensors;
mod tokenizer_json;
mod types;
mod vocab;
mod writer;

pub(crate) use convert::open_gguf_weights;
pub use convert::{
    ConvertSummary, GGUF_WEIGHTS_FILE, GgufWeights, convert_gguf, hf_name_in, prepare_gguf,
    prepare_gguf_with,
};
pub use names::hf_name;
pub use overrides::KvOverride;
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};
pub use tensors::GgufBlocks;
pub use types::GgmlType;
pub use writer::GgufWriter;
