//! MLX affine quantization: the `quantization` metadata of config.json, and the packed layout.
//!
//! A quantized module stores `weight` (uint32, `[out, in * bits / 32]`), `scales` and `biases`
//! (`[out, in / group_size]`, float). Element `i` of a row dequantizes to
//! `scales[i / group_size] * q[i] + biases[i / group_size]`, where `q[i]` sits in the low-first bit
//! field `bits * (i % (32 / bits))` of word `i / (32 / bits)`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};

/// `quantization.mode` of a checkpoint that has affine groups of 16 elements (GGUF Q6_K, Q3_K
/// and Q2_K converted without loss): MLX's affine format (`scale · q + bias`, the same tensors)
/// with `group_size` 16 also allowed. Only mlxcel reads it: MLX's group sizes start at 32, so
/// mlx-lm cannot load such a checkpoint, and the mode says so to any reader that checks it.
pub const GROUP16_AFFINE_MODE: &str = "mlxcel-affine";

/// Bits and group size of one quantized module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub bits: u32,
    pub group_size: usize,
}

impl QuantSpec {
    /// Width in uint32 words of a packed row of `in_features` elements.
    pub fn packed_width(self, in_features: usize) -> usize {
        in_features * self.bits as usize / 32
    }

    fn validate(self, path: &Path, field: &str, group16: bool) -> Result<Self> {
        if ![2, 3, 4, 5, 6, 8].contains(&self.bits) {
            return Err(ModelError::invalid(
                path,
                field,
                format!("bits {} is not one of 2, 3, 4, 5, 6, 8", self.bits),
            ));
        }
        if self.group_size == 16 && !group16 {
            return Err(ModelError::invalid(
                path,
                field,
                format!(
                    "group_size 16 needs `quantization.mode: \"{GROUP16_AFFINE_MODE}\"` \
                     (MLX's group sizes are 32, 64, 128)"
                ),
            ));
        }
        if ![16, 32, 64, 128].contains(&self.group_size) {
            return Err(ModelError::invalid(
                path,
                field,
                format!(
                    "group_size {} is not one of 16, 32, 64, 128",
                    self.group_size
                ),
            ));
        }
        Ok(self)
    }
}

/// The checkpoint's quantization: a default spec plus per-module overrides (`None` = left dense).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantization {
    pub default: QuantSpec,
    pub overrides: BTreeMap<String, Option<QuantSpec>>,
    /// `mode` is [`GROUP16_AFFINE_MODE`]: group size 16 is allowed (written when any spec has it).
    pub mlxcel_affine: bool,
}

impl Quantization {
    /// The spec of the module at `path` (e.g. `model.layers.0.mlp.down_proj`), if it is quantized
    /// according to the metadata. Whether it really is also depends on its `scales` tensor.
    pub fn for_module(&self, module: &str) -> Option<QuantSpec> {
        match self.overrides.get(module) {
            Some(spec) => *spec,
            None => Some(self.default),
        }
    }

    pub(crate) fn from_json(path: &Path, value: &Value) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| ModelError::invalid(path, "quantization", "expected an object"))?;
        let mlxcel_affine = match object.get("mode").and_then(Value::as_str) {
            None | Some("affine") => false,
            Some(GROUP16_AFFINE_MODE) => true,
            Some(mode) => {
                return Err(ModelError::invalid(
                    path,
                    "quantization.mode",
                    format!("`{mode}` is not supported (supported: affine, {GROUP16_AFFINE_MODE})"),
                ));
            }
        };
        let default = spec(path, "quantization", object, mlxcel_affine)?;
        let mut overrides = BTreeMap::new();
        for (key, value) in object {
            if matches!(key.as_str(), "bits" | "group_size" | "mode") {
                continue;
            }
            let field = format!("quantization.{key}");
            let entry = match value {
                Value::Bool(false) => None,
                Value::Object(o) => Some(spec(path, &field, o, mlxcel_affine)?),
                _ => {
                    return Err(ModelError::invalid(
                        path,
                        field,
                        "expected an object with bits and group_size, or false",
                    ));
                }
            };
            overrides.insert(key.clone(), entry);
        }
        Ok(Self {
            default,
            overrides,
            mlxcel_affine,
        })
    }

    /// The JSON config.json carries for this quantization (MLX's format).
    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("group_size".into(), json!(self.default.group_size));
        object.insert("bits".into(), json!(self.default.bits));
        if self.mlxcel_affine {
            object.insert("mode".into(), json!(GROUP16_AFFINE_MODE));
        }
        for (module, spec) in &self.overrides {
            let value = match spec {
                Some(s) => json!({"group_size": s.group_size, "bits": s.bits}),
                None => Value::Bool(false),
            };
            object.insert(module.clone(), value);
        }
        Value::Object(object)
    }
}

fn spec(path: &Path, field: &str, object: &Map<String, Value>, group16: bool) -> Result<QuantSpec> {
    let number = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| ModelError::MissingField {
                path: path.to_owned(),
                field: format!("{field}.{key}"),
            })
    };
    QuantSpec {
        bits: number("bits")? as u32,
        group_size: number("group_size")? as usize,
    }
    .validate(path, field, group16)
}

/// Packs unsigned `bits`-wide values (8 or 4 bits; each `< 2^bits`) into MLX's uint32 words.
/// `values.len()` must be a multiple of `32 / bits`.
pub fn pack(values: &[u8], bits: u32) -> Vec<u32> {
    let per_word = 32 / bits as usize;
    values
        .chunks_exact(per_word)
        .map(|chunk| {
            chunk.iter().enumerate().fold(0u32, |word, (i, &q)| {
                word | (u32::from(q) << (bits as usize * i))
            })
        })
        .collect()
}

/// Reads element `i` of a packed row (the inverse of [`pack`]).
pub fn unpack(words: &[u32], bits: u32, i: usize) -> u32 {
    let per_word = 32 / bits as usize;
    let mask = (1u32 << bits) - 1;
    (words[i / per_word] >> (bits as usize * (i % per_word))) & mask
}

/// Dequantizes an MLX affine-quantized matrix (`weight` packed `[rows, cols * bits / 32]`, scales
/// and biases `[rows, cols / group_size]` as F32/F16/BF16 little-endian bytes) to f32, computing
/// `scale * q + bias` in f32. Returns `None` when the byte lengths do not fit the shape.
pub fn dequantize_affine(
    spec: QuantSpec,
    rows: usize,
    cols: usize,
    weight: &[u8],
    scales: (crate::Dtype, &[u8]),
    biases: (crate::Dtype, &[u8]),
) -> Option<Vec<f32>> {
    let words: Vec<u32> = weight
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let scales = floats(scales)?;
    let biases = floats(biases)?;
    let (width, groups) = (spec.packed_width(cols), cols / spec.group_size);
    if words.len() != rows * width || scales.len() != rows * groups || biases.len() != rows * groups
    {
        return None;
    }
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &words[r * width..(r + 1) * width];
        for c in 0..cols {
            let g = r * groups + c / spec.group_size;
            out.push(scales[g] * unpack(row, spec.bits, c) as f32 + biases[g]);
        }
    }
    Some(out)
}

/// Little-endian floats of a supported dtype, widened to f32.
fn floats((dtype, bytes): (crate::Dtype, &[u8])) -> Option<Vec<f32>> {
    use half::{bf16, f16};
    Some(match dtype {
        crate::Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        crate::Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        crate::Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}
