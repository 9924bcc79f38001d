//! Memory-mapped safetensors files, single or sharded, handing out borrowed tensor views.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::gguf::tensors::GgufBlocks;

/// A tensor's element type, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    U32,
    /// Anything else safetensors can hold; refused wherever a model tensor is expected.
    Other(safetensors::Dtype),
}

impl Dtype {
    pub(crate) fn from_safetensors(dtype: safetensors::Dtype) -> Self {
        match dtype {
            safetensors::Dtype::F32 => Self::F32,
            safetensors::Dtype::F16 => Self::F16,
            safetensors::Dtype::BF16 => Self::BF16,
            safetensors::Dtype::U32 => Self::U32,
            other => Self::Other(other),
        }
    }

    /// Whether this is a floating-point type a model tensor may use.
    pub fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 | Self::U32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Other(d) => d.bitsize() / 8,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("F32"),
            Self::F16 => f.write_str("F16"),
            Self::BF16 => f.write_str("BF16"),
            Self::U32 => f.write_str("U32"),
            Self::Other(d) => write!(f, "{d:?}"),
        }
    }
}

/// A tensor to be produced on demand: name, dtype, shape and byte length.
pub(crate) type PlannedBytes = (String, Dtype, Vec<usize>, usize);

/// A tensor's name, dtype, shape and size, without its bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub byte_len: usize,
    /// The file this tensor lives in (for errors).
    pub file: &'a Path,
}

/// One tensor, borrowed from the memory map: no bytes are copied.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    /// Row-major little-endian bytes, straight from the file.
    pub data: &'a [u8],
    /// The file this tensor lives in (for errors).
    pub file: &'a Path,
}

#[derive(Debug)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
    /// The region of [`Bytes::OnDemand`] the bytes are in (0 for a mapped file).
    region: usize,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    bytes: Bytes,
    entries: HashMap<String, Entry>,
}

/// Where a shard's bytes are.
#[derive(Debug)]
enum Bytes {
    /// A safetensors file, mapped.
    Mapped(Mmap),
    /// Tensors converted from another file when first read, one region each.
    OnDemand {
        store: crate::mmap::OnDemand,
        starts: Vec<usize>,
        /// The file the regions are converted from.
        source: std::sync::Arc<dyn ConvertedFrom>,
    },
}

/// The file a set of tensors is converted from when each is first read (a GGUF file), asked for
/// the blocks a region is converted from, so that a loader can read them as they are.
pub(crate) trait ConvertedFrom: std::fmt::Debug + Send + Sync {
    /// Rows `first_row .. first_row + rows` of region `region`'s blocks, if it is a quantized
    /// weight.
    fn blocks(&self, region: usize, first_row: usize, rows: usize) -> Option<GgufBlocks<'_>>;

    /// The rows of region `region`'s output (its first dimension).
    fn rows(&self, region: usize) -> usize;

    /// Lets go of this process's resident pages of the source behind region `region`.
    fn release(&self, region: usize);
}

/// The safetensors of a checkpoint directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`, or (MLX style) every `*.safetensors` in the directory.
#[derive(Debug)]
pub struct SafetensorsFiles {
    /// What names the set in errors: the index of a sharded checkpoint, else the (first) file.
    origin: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name → shard index, sorted for stable iteration.
    names: BTreeMap<String, usize>,
}

#[derive(Debug, Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl SafetensorsFiles {
    /// Maps the checkpoint's safetensors files found in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut files: Vec<PathBuf> = if index_path.is_file() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
            let index: Index = serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: index_path.clone(),
                source,
            })?;
            // A shard is a file of the checkpoint directory: a hostile index must not point the
            // loader at `/etc/passwd` or `../elsewhere` (Hugging Face's indexes name plain files).
            if let Some((tensor, file)) = index.weight_map.iter().find(|(_, f)| {
                let mut parts = Path::new(f.as_str()).components();
                !matches!(
                    (parts.next(), parts.next()),
                    (Some(std::path::Component::Normal(_)), None)
                )
            }) {
                return Err(ModelError::Safetensors {
                    path: index_path.clone(),
                    reason: format!(
                        "`weight_map` puts `{tensor}` in `{file}`, which is not a file name in \
                         the checkpoint directory"
                    ),
                });
            }
            let mut files: Vec<PathBuf> = index.weight_map.values().map(|f| dir.join(f)).collect();
            files.sort();
            files.dedup();
            let mut this = Self::open_files(&files)?;
            this.origin = index_path;
            // Every tensor the index names must be in the shard it names.
            for (tensor, file) in &index.weight_map {
                let in_shard = this
                    .names
                    .get(tensor)
                    .is_some_and(|&i| this.shards[i].path == dir.join(file));
                if !in_shard {
                    return Err(ModelError::MissingTensor {
                        path: dir.join(file),
                        tensor: tensor.clone(),
                    });
                }
            }
            this.names
                .retain(|name, _| index.weight_map.contains_key(name));
            return Ok(this);
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let entries = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect()
        };
        files.sort();
        if files.is_empty() {
            return Err(ModelError::io(
                dir.join("model.safetensors"),
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no safetensors files in the checkpoint",
                ),
            ));
        }
        Self::open_files(&files)
    }

    /// Maps the given files; a tensor name may appear in only one of them.
    pub fn open_files(files: &[PathBuf]) -> Result<Self> {
        let mut shards = Vec::with_capacity(files.len());
        let mut names = BTreeMap::new();
        for (i, path) in files.iter().enumerate() {
            let shard = open_shard(path)?;
            for name in shard.entries.keys() {
                if names.insert(name.clone(), i).is_some() {
                    return Err(ModelError::Safetensors {
                        path: path.clone(),
                        reason: format!("tensor `{name}` also appears in another shard"),
                    });
                }
            }
            shards.push(shard);
        }
        Ok(Self {
            origin: files.first().cloned().unwrap_or_default(),
            shards,
            names,
        })
    }

    /// Replaces the tensor `fused` by consecutive row ranges of it named `parts` (name, rows),
    /// without copying: each part views its rows of the memory map. Used for checkpoints that
    /// store several projections stacked (Phi-3's `qkv_proj`, `gate_up_proj`). Does nothing when
    /// `fused` is absent; an error when the rows do not add up.
    pub fn split_rows(&mut self, fused: &str, parts: &[(String, usize)]) -> Result<()> {
        let Some(&index) = self.names.get(fused) else {
            return Ok(());
        };
        let shard = &mut self.shards[index];
        let entry = &shard.entries[fused];
        let rows = entry.shape.first().copied().unwrap_or(0);
        let total: usize = parts.iter().map(|(_, r)| r).sum();
        if total != rows || rows == 0 {
            return Err(ModelError::Safetensors {
                path: shard.path.clone(),
                reason: format!(
                    "tensor `{fused}` has {rows} rows; its parts ({}) need {total}",
                    parts
                        .iter()
                        .map(|(n, r)| format!("{n}: {r}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let row_bytes = (entry.end - entry.start) / rows;
        let (dtype, start, region) = (entry.dtype, entry.start, entry.region);
        let tail = entry.shape[1..].to_vec();
        let mut offset = start;
        for (name, part_rows) in parts {
            let mut shape = vec![*part_rows];
            shape.extend_from_slice(&tail);
            let end = offset + part_rows * row_bytes;
            shard.entries.insert(
                name.clone(),
                Entry {
                    dtype,
                    shape,
                    start: offset,
                    end,
                    region,
                },
            );
            self.names.insert(name.clone(), index);
            offset = end;
        }
        self.names.remove(fused);
        Ok(())
    }

    /// Replaces the tensor `stacked` (`[n, ...]`) by its `n` slices along the first axis, named
    /// `parts` in order, each of shape `[...]`, without copying: each part views its bytes of the
    /// memory map. Used for checkpoints that store a layer's experts stacked (mlx-lm's
    /// `switch_mlp`). Does nothing when `stacked` is absent; an error when it does not hold
    /// `parts.len()` slices.
    pub fn unstack(&mut self, stacked: &str, parts: &[String]) -> Result<()> {
        let Some(&index) = self.names.get(stacked) else {
            return Ok(());
        };
        let shard = &mut self.shards[index];
        let entry = &shard.entries[stacked];
        let n = entry.shape.first().copied().unwrap_or(0);
        if n != parts.len() || entry.shape.len() < 2 {
            return Err(ModelError::Safetensors {
                path: shard.path.clone(),
                reason: format!(
                    "tensor `{stacked}` of shape {:?} should stack {} experts along its first axis",
                    entry.shape,
                    parts.len()
                ),
            });
        }
        if let Some(name) = parts.iter().find(|p| self.names.contains_key(p.as_str())) {
            return Err(ModelError::Safetensors {
                path: shard.path.clone(),
                reason: format!("tensor `{name}` is both stored and a slice of `{stacked}`"),
            });
        }
        let slice_bytes = (entry.end - entry.start) / n;
        let (dtype, start, region) = (entry.dtype, entry.start, entry.region);
        let shape = entry.shape[1..].to_vec();
        for (j, name) in parts.iter().enumerate() {
            let from = start + j * slice_bytes;
            shard.entries.insert(
                name.clone(),
                Entry {
                    dtype,
                    shape: shape.clone(),
                    start: from,
                    end: from + slice_bytes,
                    region,
                },
            );
            self.names.insert(name.clone(), index);
        }
        self.names.remove(stacked);
        Ok(())
    }

    /// Renames every tensor by `rename` (its new name), dropping those it maps to `None`;
    /// returns the names dropped. No bytes move.
    pub fn rename(&mut self, rename: impl Fn(&str) -> Option<String>) -> Result<Vec<String>> {
        let mut dropped = Vec::new();
        let mut names = BTreeMap::new();
        for (name, index) in std::mem::take(&mut self.names) {
            let Some(new) = rename(&name) else {
                dropped.push(name);
                continue;
            };
            if new != name {
                let shard = &mut self.shards[index];
                let entry = shard
                    .entries
                    .remove(&name)
                    .expect("listed names have entries");
                shard.entries.insert(new.clone(), entry);
            }
            if names.insert(new.clone(), index).is_some() {
                return Err(ModelError::Safetensors {
                    path: self.origin.clone(),
                    reason: format!("two tensors are both named `{new}` once renamed"),
                });
            }
        }
        self.names = names;
        Ok(dropped)
    }

    /// The tensor called `name`, if present.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let (name, &shard) = self.names.get_key_value(name)?;
        let shard = &self.shards[shard];
        let entry = &shard.entries[name];
        let data = match &shard.bytes {
            Bytes::Mapped(mmap) => &mmap[entry.start..entry.end],
            Bytes::OnDemand { store, starts, .. } => {
                let base = starts[entry.region];
                &store.get(entry.region)[entry.start - base..entry.end - base]
            }
        };
        Some(TensorView {
            name,
            dtype: entry.dtype,
            shape: &entry.shape,
            data,
            file: &shard.path,
        })
    }

    /// The tensor called `name`'s name, dtype, shape and byte length, without reading (or
    /// converting) its bytes.
    pub fn info(&self, name: &str) -> Option<TensorInfo<'_>> {
        let (name, &shard) = self.names.get_key_value(name)?;
        let shard = &self.shards[shard];
        let entry = &shard.entries[name];
        Some(TensorInfo {
            name,
            dtype: entry.dtype,
            shape: &entry.shape,
            byte_len: entry.end - entry.start,
            file: &shard.path,
        })
    }

    /// Every tensor's [`SafetensorsFiles::info`], sorted by name.
    pub fn infos(&self) -> impl Iterator<Item = TensorInfo<'_>> {
        self.names.keys().filter_map(|name| self.info(name))
    }

    /// Lets go of the resident pages of `name`'s bytes (no-op for an unknown name): for a
    /// loader that has copied them out. A later [`SafetensorsFiles::get`] reads them again (from
    /// the file, or converted again).
    ///
    /// # Safety
    /// No [`TensorView::data`] of `name` obtained before may be read afterwards: converted bytes
    /// are dropped, and read as zeros until converted again. (For a checkpoint whose region holds
    /// several tensors, Phi-3's fused projections, this holds for the tensors sharing it too.)
    pub unsafe fn release(&self, name: &str) {
        if let Some(&shard) = self.names.get(name) {
            let shard = &self.shards[shard];
            if let Some(entry) = shard.entries.get(name) {
                match &shard.bytes {
                    Bytes::Mapped(mmap) => crate::mmap::release(mmap, entry.start, entry.end),
                    // SAFETY: forwarded to the caller.
                    Bytes::OnDemand { store, .. } => unsafe { store.release(entry.region) },
                }
            }
        }
    }

    /// The GGUF blocks the quantized weight `name` is converted from, when it is read from a
    /// GGUF file (else `None`): reading them converts nothing.
    pub fn gguf_blocks(&self, name: &str) -> Option<GgufBlocks<'_>> {
        let (source, region, entry, starts) = self.on_demand_entry(name)?;
        let rows = *entry.shape.first()?;
        let whole = source.rows(region);
        let row_bytes = (entry.end - entry.start) / rows.max(1);
        let first_row = (entry.start - starts[region]).checked_div(row_bytes)?;
        if first_row + rows > whole {
            return None;
        }
        source.blocks(region, first_row, rows)
    }

    /// Lets go of this process's resident pages of the GGUF file behind `name` (no-op for a
    /// tensor not read from a GGUF file): for a loader done with [`SafetensorsFiles::gguf_blocks`].
    /// Safe: the file's map is read-only, and a later read maps the same bytes in again.
    pub fn release_gguf_blocks(&self, name: &str) {
        if let Some((source, region, ..)) = self.on_demand_entry(name) {
            source.release(region);
        }
    }

    /// Whether some tensor is produced on demand (read from a GGUF file's blocks).
    pub fn any_on_demand(&self) -> bool {
        self.shards
            .iter()
            .any(|shard| matches!(shard.bytes, Bytes::OnDemand { .. }))
    }

    fn on_demand_entry(&self, name: &str) -> Option<(&dyn ConvertedFrom, usize, &Entry, &[usize])> {
        let shard = &self.shards[*self.names.get(name)?];
        let entry = shard.entries.get(name)?;
        match &shard.bytes {
            Bytes::OnDemand { source, starts, .. } => {
                Some((source.as_ref(), entry.region, entry, starts.as_slice()))
            }
            Bytes::Mapped(_) => None,
        }
    }

    /// Tensors whose bytes are produced when first read, by `fill(i, bytes)` for tensor `i` of
    /// `tensors` (name, dtype, shape, byte length), into anonymous memory: a checkpoint read
    /// straight from a GGUF file. `origin` names the set in errors.
    pub(crate) fn converted_on_demand(
        origin: &Path,
        tensors: Vec<PlannedBytes>,
        fill: crate::mmap::Fill,
        source: std::sync::Arc<dyn ConvertedFrom>,
    ) -> Result<Self> {
        let lengths: Vec<usize> = tensors.iter().map(|t| t.3).collect();
        let (store, starts) =
            crate::mmap::OnDemand::new(&lengths, fill).map_err(|e| ModelError::io(origin, e))?;
        let mut entries = HashMap::new();
        let mut names = BTreeMap::new();
        for (region, (name, dtype, shape, len)) in tensors.into_iter().enumerate() {
            let start = starts[region];
            names.insert(name.clone(), 0);
            entries.insert(
                name,
                Entry {
                    dtype,
                    shape,
                    start,
                    end: start + len,
                    region,
                },
            );
        }
        Ok(Self {
            origin: origin.to_owned(),
            shards: vec![Shard {
                path: origin.to_owned(),
                bytes: Bytes::OnDemand {
                    store,
                    starts,
                    source,
                },
                entries,
            }],
            names,
        })
    }

    /// Every tensor, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.names.keys().filter_map(|name| self.get(name))
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The index file of a sharded checkpoint, else the first safetensors file.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The files mapped, in order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mmap = crate::mmap::map(&file).map_err(|e| ModelError::io(path, e))?;
    let (header_len, metadata) =
        safetensors::SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let base = 8 + header_len;
    let mut entries = HashMap::new();
    for (name, info) in metadata.tensors() {
        let (start, end) = info.data_offsets;
        entries.insert(
            name,
            Entry {
                dtype: Dtype::from_safetensors(info.dtype),
                shape: info.shape.clone(),
                start: base + start,
                end: base + end,
                region: 0,
            },
        );
    }
    if let Some(entry) = entries.values().find(|e| e.end > mmap.len()) {
        return Err(ModelError::Safetensors {
            path: path.to_owned(),
            reason: format!(
                "tensor data ends at byte {} past the end of the file ({} bytes)",
                entry.end,
                mmap.len()
            ),
        });
    }
    Ok(Shard {
        path: path.to_owned(),
        bytes: Bytes::Mapped(mmap),
        entries,
    })
}
