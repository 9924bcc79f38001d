//! llama.cpp's control vectors (`--control-vector`, `--control-vector-scaled`,
//! `--control-vector-layer-range`): GGUF files of `direction.N` F32 tensors, each `hidden_size`
//! long. `direction.N` is added to the output of decoder layer `N` (0-based, after the layer's
//! feed-forward residual; nothing is ever added to layer 0's output, nor to the embeddings).
//! Several files are summed, each multiplied by its scale, in command-line order; the layer range
//! (inclusive, 0-based layer indices) defaults to 1 when its start is 0 or less and to the
//! model's layer count when its end is, as llama.cpp's `common_init_from_params` does.
//!
//! Where llama.cpp skips input silently, we refuse by name: a `direction.N` past the model's
//! last layer, a range that selects no layer with a direction, a range without a vector. Like
//! llama.cpp we refuse a tensor that is not `direction.N`, `direction.0`, a type other than F32,
//! a shape other than one dimension, a length other than the model's hidden size, and a file
//! without tensors.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};
use crate::gguf::{GgmlType, GgufFile, GgufTensorInfo};

#[cfg(test)]
mod tests;

/// The control vectors a model runs with, as the flags give them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlVectorSpec {
    /// Each file and its scale, in command-line order (`--control-vector` is scale 1).
    pub files: Vec<(PathBuf, f32)>,
    /// `--control-vector-layer-range START END`, as given (inclusive; 0 or less takes the
    /// default).
    pub layer_range: Option<(i32, i32)>,
}

impl ControlVectorSpec {
    /// Whether no vector is asked for (a range alone is refused by [`ControlVector::load`]).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.layer_range.is_none()
    }
}

/// The summed, scaled directions, per decoder layer of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlVector {
    /// The model's hidden size: every direction's length.
    pub hidden: usize,
    /// For each decoder layer (0-based, the model's `num_hidden_layers` of them), the vector
    /// added to its output, or `None` where nothing is added (layer 0, layers outside the range,
    /// layers no file has a direction for).
    pub layers: Vec<Option<Vec<f32>>>,
}

const FLAG_RANGE: &str = "--control-vector-layer-range";

fn refusal(path: &Path, reason: String) -> ModelError {
    ModelError::ControlVector {
        path: path.to_path_buf(),
        reason,
    }
}

impl ControlVector {
    /// Reads and sums `spec`'s files for a model of `layers` decoder layers of width `hidden`,
    /// then keeps the layers of its range. `None` when `spec` names no file.
    pub fn load(spec: &ControlVectorSpec, hidden: usize, layers: usize) -> Result<Option<Self>> {
        if spec.files.is_empty() {
            return match spec.layer_range {
                Some(_) => Err(ModelError::Override {
                    flag: FLAG_RANGE.into(),
                    reason: "no control vector to apply: give --control-vector or \
                             --control-vector-scaled too"
                        .into(),
                }),
                None => Ok(None),
            };
        }
        let mut sum = Self {
            hidden,
            layers: vec![None; layers],
        };
        for (path, scale) in &spec.files {
            sum.add_file(path, *scale)?;
        }
        sum.keep_range(spec.layer_range)?;
        Ok(Some(sum))
    }

    /// Adds `scale` times each direction of the file at `path`.
    pub fn add_file(&mut self, path: &Path, scale: f32) -> Result<()> {
        let gguf = GgufFile::open(path)?;
        if gguf.tensors.is_empty() {
            return Err(refusal(
                path,
                "the file holds no tensors (a control vector holds `direction.N` tensors)".into(),
            ));
        }
        for info in &gguf.tensors {
            let layer = self.layer_of(path, &info.name)?;
            let values = self.direction(path, &gguf, info)?;
            let slot = self.layers[layer].get_or_insert_with(|| vec![0.0; self.hidden]);
            for (dst, src) in slot.iter_mut().zip(&values) {
                *dst += src * scale;
            }
        }
        Ok(())
    }

    /// The decoder layer tensor `name` (`direction.N`) adds to.
    fn layer_of(&self, path: &Path, name: &str) -> Result<usize> {
        let count = self.layers.len();
        let digits = name
            .strip_prefix("direction.")
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
        let Some(digits) = digits else {
            return Err(refusal(
                path,
                format!("tensor `{name}` is not a direction (expected `direction.N`, N a layer)"),
            ));
        };
        let last = count.saturating_sub(1);
        match digits.parse::<usize>() {
            Ok(0) => Err(refusal(
                path,
                format!(
                    "tensor `{name}`: layer 0 takes no direction (direction.N is added to \
                     layer N's output, N from 1 to {last})"
                ),
            )),
            Ok(n) if n < count => Ok(n),
            _ => Err(refusal(
                path,
                format!(
                    "tensor `{name}`: the model has {count} layers, so N runs from 1 to {last} \
                     (a vector made for another model?)"
                ),
            )),
        }
    }

    /// Tensor `info`'s values, checked: F32, one dimension, the model's hidden size.
    fn direction(&self, path: &Path, gguf: &GgufFile, info: &GgufTensorInfo) -> Result<Vec<f32>> {
        let name = &info.name;
        if info.ggml_type != GgmlType::F32 {
            return Err(refusal(
                path,
                format!(
                    "tensor `{name}` is {}; control vectors must be F32",
                    info.ggml_type.name()
                ),
            ));
        }
        // ggml counts dimensions up to the last one above 1, as llama.cpp does here.
        let dims = info.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
        if dims != 1 {
            return Err(refusal(
                path,
                format!(
                    "tensor `{name}` has shape {:?}; a direction is one-dimensional",
                    info.shape()
                ),
            ));
        }
        let elements = info.elements();
        if elements != self.hidden as u64 {
            return Err(refusal(
                path,
                format!(
                    "tensor `{name}` has {elements} values, the model's hidden size is {} (a \
                     vector made for another model?)",
                    self.hidden
                ),
            ));
        }
        let bytes = gguf.tensor_data(info)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Keeps the layers of `range` (inclusive; a start of 0 or less is 1, an end of 0 or less
    /// the layer count, an end past the last layer the last layer).
    pub fn keep_range(&mut self, range: Option<(i32, i32)>) -> Result<()> {
        let count = self.layers.len();
        let (start, end) = range.unwrap_or((-1, -1));
        let first = if start <= 0 { 1 } else { start as usize };
        let last = if end <= 0 {
            count
        } else {
            (end as usize).min(count)
        };
        let kept = (first..=last.min(count.saturating_sub(1)))
            .filter(|&l| self.layers[l].is_some())
            .count();
        if kept == 0 {
            let what = match range {
                Some((s, e)) => format!("{FLAG_RANGE} {s} {e} (layers {first} to {last})"),
                None => "the control vectors".to_string(),
            };
            return Err(ModelError::Override {
                flag: FLAG_RANGE.into(),
                reason: format!(
                    "{what} select no layer with a direction; the model has {count} layers and \
                     the files have directions for layers {:?}",
                    self.layers_with_directions()
                ),
            });
        }
        for (layer, slot) in self.layers.iter_mut().enumerate() {
            if layer < first || layer > last {
                *slot = None;
            }
        }
        Ok(())
    }

    /// SHA-256 (hex) of the summed vectors, per layer as applied: what keys and values computed
    /// under them depend on (a server's slot files carry it in the model's fingerprint).
    pub fn digest(&self) -> String {
        let mut digest = Sha256::new();
        digest.update(b"mlxcel control vector v1\n");
        digest.update((self.hidden as u64).to_le_bytes());
        digest.update((self.layers.len() as u64).to_le_bytes());
        for (layer, values) in self.layers.iter().enumerate() {
            if let Some(values) = values {
                digest.update((layer as u64).to_le_bytes());
                for v in values {
                    digest.update(v.to_le_bytes());
                }
            }
        }
        digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The layers something is added to.
    pub fn layers_with_directions(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l].is_some())
            .collect()
    }
}
