//! GGUF: reading, llama.cpp-exact dequantization, and conversion to an MLX checkpoint.

mod convert;
pub mod dequant;
pub mod permute;
mod reader;
mod spm;
mod tensors;
mod tokenizer_json;
mod types;
mod vocab;
mod writer;

pub use convert::{
    ConvertSummary, GGUF_WEIGHTS_FILE, GgufWeights, convert_gguf, hf_name, hf_name_in, prepare_gguf,
};
pub(crate) use convert::{GgufSource, open_gguf_weights};
pub use reader::{GgufFile, GgufTensorInfo, GgufValue};
pub use tensors::GgufBlocks;
pub use types::GgmlType;
pub use writer::GgufWriter;
