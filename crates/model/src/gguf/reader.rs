//! A GGUF v2/v3 reader over a memory map: metadata of every type, tensor infos, tensor bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{ModelError, Result};
use crate::gguf::types::GgmlType;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor lives and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (the row length); reversed from PyTorch.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The number of elements (saturating: absurd dimensions from a corrupt file give `u64::MAX`,
    /// which no block size divides, so such a tensor is refused rather than overflowing).
    pub fn elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// The shape in row-major (PyTorch) order.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    data_start: u64,
    /// The metadata keys [`GgufFile::get`] was asked for (present or not): what `--override-kv`
    /// reports as unread is the rest.
    read_keys: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

impl GgufFile {
    /// Maps and parses the GGUF header at `path`; tensor bytes stay in the map.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mmap = crate::mmap::map(&file).map_err(|e| ModelError::io(path, e))?;
        let mut cursor = Cursor {
            data: &mmap,
            pos: 0,
            path,
        };
        if cursor.bytes(4)? != MAGIC {
            return Err(cursor.error(0, "not a GGUF file (bad magic)"));
        }
        let version = cursor.u32()?;
        if !(2..=3).contains(&version) {
            return Err(cursor.error(
                4,
                format!("GGUF version {version} is not supported (supported: 2, 3)"),
            ));
        }
        let tensor_count = cursor.count()?;
        let kv_count = cursor.count()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = cursor.string()?;
            let kind = cursor.u32()?;
            let value = cursor.value(kind, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(tensor_count.min(1 << 16));
        for _ in 0..tensor_count {
            let at = cursor.pos as u64;
            let name = cursor.string()?;
            let n_dims = cursor.u32()?;
            if n_dims > 4 {
                return Err(cursor.error(
                    at,
                    format!("tensor `{name}` has {n_dims} dimensions (at most 4)"),
                ));
            }
            let dims = (0..n_dims)
                .map(|_| cursor.u64())
                .collect::<Result<Vec<_>>>()?;
            let ggml_type = GgmlType(cursor.u32()?);
            let offset = cursor.u64()?;
            tensors.push(GgufTensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| {
                ModelError::GgufMetadata {
                    path: path.to_owned(),
                    key: "general.alignment".into(),
                    reason: format!("{v:?} is not a power of two"),
                }
            })?,
        };
        let data_start = (cursor.pos as u64).div_ceil(alignment) * alignment;
        let this = Self {
            path: path.to_owned(),
            mmap,
            version,
            metadata,
            tensors,
            data_start,
            read_keys: Default::default(),
        };
        for info in &this.tensors {
            if info.ggml_type.is_supported() {
                this.byte_range(info)?;
            }
        }
        Ok(this)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata value at `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        if let Ok(mut read) = self.read_keys.lock()
            && !read.contains(key)
        {
            read.insert(key.to_owned());
        }
        self.metadata.get(key)
    }

    /// The metadata keys read through [`GgufFile::get`] so far.
    pub(crate) fn read_keys(&self) -> std::collections::BTreeSet<String> {
        self.read_keys
            .lock()
            .map(|read| read.clone())
            .unwrap_or_default()
    }

    /// The tensor called `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor; refuses types mlxcel cannot read, naming type and tensor.
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        let (start, end) = self.byte_range(info)?;
        Ok(&self.mmap[start..end])
    }

    /// Lets go of this process's resident pages of a tensor's bytes, once they are converted (the
    /// page cache keeps the file; a later read maps them in again).
    pub(crate) fn release(&self, info: &GgufTensorInfo) {
        if let Ok((start, end)) = self.byte_range(info) {
            crate::mmap::release(&self.mmap, start, end);
        }
    }

    /// Where a tensor's bytes are in the map, checked against the file's length.
    fn byte_range(&self, info: &GgufTensorInfo) -> Result<(usize, usize)> {
        if !info.ggml_type.is_supported() {
            return Err(ModelError::UnsupportedGgmlType {
                path: self.path.clone(),
                tensor: info.name.clone(),
                ggml_type: info.ggml_type.to_string(),
            });
        }
        let start = self.data_start.checked_add(info.offset);
        let len = info.ggml_type.bytes_for(info.elements());
        let end = start.zip(len).and_then(|(s, l)| s.checked_add(l));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.mmap.len() as u64 => {
                Ok((start as usize, end as usize))
            }
            _ => Err(self.error(
                start.unwrap_or(u64::MAX),
                format!(
                    "tensor `{}` ({}, dims {:?}, offset {}) does not lie within the file",
                    info.name, info.ggml_type, info.dims, info.offset
                ),
            )),
        }
    }

    fn error(&self, offset: u64, reason: impl Into<String>) -> ModelError {
        ModelError::Gguf {
            path: self.path.clone(),
            offset,
            reason: reason.into(),
        }
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn error(&self, offset: u64, reason: impl Into<String>) -> ModelError {
        ModelError::Gguf {
            path: self.path.to_owned(),
            offset,
            reason: reason.into(),
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(self.error(
                self.pos as u64,
                format!("truncated: {n} more bytes expected"),
            ));
        };
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items, each at least one byte, so it can never exceed the bytes left.
    fn count(&mut self) -> Result<usize> {
        let at = self.pos as u64;
        let n = self.u64()?;
        if n > (self.data.len() - self.pos) as u64 {
            return Err(self.error(at, format!("count {n} exceeds the file size")));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let at = self.pos as u64;
        let n = self.count()?;
        let bytes = self.bytes(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.error(at, "string is not UTF-8"))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<GgufValue> {
        Ok(match kind {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(
                        self.error(self.pos as u64 - 1, format!("bool byte {b} is not 0 or 1"))
                    );
                }
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                let at = self.pos as u64;
                if depth > 8 {
                    return Err(self.error(at, "arrays nested too deeply"));
                }
                let item_kind = self.u32()?;
                let n = self.count()?;
                // A corrupt count must not reserve gigabytes up front.
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(item_kind, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => {
                return Err(self.error(
                    self.pos as u64 - 4,
                    format!("unknown metadata type {other}"),
                ));
            }
        })
    }
}
