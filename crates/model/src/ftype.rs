//! The checkpoint's weight format as llama-server's `/props` names it (`model_ftype`): a GGUF
//! file's type under llama.cpp's names (`Q4_1`, `Q4_K - Medium`, `all F32` ...; from
//! `general.file_type`, else guessed from its most common tensor type and marked `(guessed)`, as
//! llama.cpp does), an MLX-quantized checkpoint's bits and group size, a dense one's dtype.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::gguf::overrides::{KvOverride, apply};
use crate::gguf::{GgmlType, GgufFile, GgufWeights};
use crate::safetensors_files::Dtype;

/// llama.cpp's name of a file type (`llama_ftype`), as its loader prints it.
pub fn llama_ftype_name(ftype: u64) -> &'static str {
    match ftype {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => "unknown, may not work",
    }
}

/// The file type llama.cpp guesses from a tensor type (the most common one), 0 (`all F32`) for
/// the types it has no file type for.
fn guessed_ftype(ty: GgmlType) -> u64 {
    match ty {
        GgmlType::F16 => 1,
        GgmlType::BF16 => 32,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q8_0 => 7,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 12,
        GgmlType::Q4_K => 15,
        GgmlType::Q5_K => 17,
        GgmlType::Q6_K => 18,
        _ => 0,
    }
}

/// A GGUF file's type: `general.file_type` (under the checkpoint's `--override-kv` overrides,
/// as llama.cpp reads it), else the guess from its most common tensor type (the first to reach
/// the largest count, in file order).
fn gguf_ftype(path: &Path, overrides: &[String]) -> Result<String> {
    let mut gguf = GgufFile::open(path)?;
    let overrides = overrides
        .iter()
        .map(|s| KvOverride::parse(s))
        .collect::<Result<Vec<_>>>()?;
    apply(&mut gguf, &overrides)?;
    if let Some(ftype) = gguf.get("general.file_type").and_then(|v| v.as_u64()) {
        return Ok(llama_ftype_name(ftype).to_owned());
    }
    let mut counts = std::collections::BTreeMap::new();
    let (mut best, mut best_count) = (GgmlType::F32, 0);
    for tensor in &gguf.tensors {
        let count = counts.entry(tensor.ggml_type.0).or_insert(0usize);
        *count += 1;
        if *count > best_count {
            (best, best_count) = (tensor.ggml_type, *count);
        }
    }
    Ok(format!(
        "(guessed) {}",
        llama_ftype_name(guessed_ftype(best))
    ))
}

impl Checkpoint {
    /// The weight format for `/props`' `model_ftype` (module docs): `Q4_1` for the default
    /// model, `MLX 4-bit, group 64` for an mlx-lm 4-bit checkpoint, `BF16` for a dense one.
    pub fn ftype_name(&self) -> Result<String> {
        if let Some(weights) = GgufWeights::read(self.dir())? {
            return gguf_ftype(&weights.gguf, &weights.kv_overrides);
        }
        if let Some(q) = &self.config().quantization {
            let spec = q.default;
            let mixed = q.overrides.values().any(|o| *o != Some(spec));
            return Ok(format!(
                "MLX {}-bit, group {}{}",
                spec.bits,
                spec.group_size,
                if mixed { " (some modules differ)" } else { "" }
            ));
        }
        let dtype = self
            .tensor_info("model.embed_tokens.weight")
            .or_else(|| self.tensor_infos().next())
            .map(|info| info.dtype);
        Ok(match dtype {
            Some(Dtype::F16) => "F16",
            Some(Dtype::BF16) => "BF16",
            Some(Dtype::F32) => "all F32",
            _ => "unknown, may not work",
        }
        .to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(llama_ftype_name(3), "Q4_1");
        assert_eq!(llama_ftype_name(15), "Q4_K - Medium");
        assert_eq!(llama_ftype_name(0), "all F32");
        assert_eq!(llama_ftype_name(4), "unknown, may not work");
        assert_eq!(llama_ftype_name(guessed_ftype(GgmlType::Q6_K)), "Q6_K");
        assert_eq!(llama_ftype_name(guessed_ftype(GgmlType::MXFP4)), "all F32");
    }
}
