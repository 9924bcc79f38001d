//! A small GGUF v3 writer, enough to build test fixtures and tiny models.

use std::io::{self, Write};

use crate::gguf::reader::GgufValue;
use crate::gguf::types::GgmlType;

/// Collects metadata and tensors, then writes a GGUF v3 file with 32-byte alignment.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

const ALIGNMENT: usize = 32;

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata key.
    pub fn metadata(&mut self, key: &str, value: GgufValue) -> &mut Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor; `dims` in ggml order (row length first), `data` already encoded.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ty, data));
        self
    }

    /// Serializes the file.
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::new();
        buf.extend_from_slice(b"GGUF");
        buf.extend_from_slice(&3u32.to_le_bytes());
        buf.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        buf.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut buf, key);
            buf.extend_from_slice(&kind(value).to_le_bytes());
            put_value(&mut buf, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_string(&mut buf, name);
            buf.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&ty.0.to_le_bytes());
            buf.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        buf.resize(buf.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
        let data_start = buf.len();
        for ((_, _, _, data), at) in self.tensors.iter().zip(offsets) {
            buf.resize(data_start + at, 0);
            buf.extend_from_slice(data);
        }
        out.write_all(&buf)
    }
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn kind(value: &GgufValue) -> u32 {
    match value {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_value(buf: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => buf.push(*v),
        GgufValue::I8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => buf.push(u8::from(*v)),
        GgufValue::String(s) => put_string(buf, s),
        GgufValue::Array(items) => {
            // An empty array is written as an array of u8.
            let item_kind = items.first().map_or(0, kind);
            buf.extend_from_slice(&item_kind.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(buf, item);
            }
        }
        GgufValue::U64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => buf.extend_from_slice(&v.to_le_bytes()),
    }
}
