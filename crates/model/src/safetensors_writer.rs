//! A streaming safetensors writer: the header is computed from planned shapes, then each tensor's
//! bytes are produced and written one at a time, so converting a model needs memory for one tensor,
//! not for the whole file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ModelError, Result};

/// A tensor to be written: its bytes come later, from the `fill` callback of [`write_streaming`].
#[derive(Debug, Clone)]
pub(crate) struct PlannedTensor {
    pub name: String,
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Writes `tensors` to `path`. `fill(i, out)` must write exactly `tensors[i].byte_len()` bytes.
///
/// Like the safetensors crate, tensors are laid out widest dtype first and the header is padded
/// to 8 bytes, so every tensor's data is aligned to its element size in a memory map.
pub(crate) fn write_streaming(
    path: &Path,
    metadata: &BTreeMap<String, String>,
    tensors: &[PlannedTensor],
    mut fill: impl FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&tensors[a], &tensors[b]);
        b.dtype
            .bitsize()
            .cmp(&a.dtype.bitsize())
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!(metadata));
    let mut offset = 0;
    for &i in &order {
        let t = &tensors[i];
        let end = offset + t.byte_len();
        let dtype = serde_json::to_value(t.dtype).map_err(|source| ModelError::Json {
            path: path.to_owned(),
            source,
        })?;
        header.insert(
            t.name.clone(),
            json!({"dtype": dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = Value::Object(header).to_string().into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');

    let io = |e| ModelError::io(path, e);
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?);
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header).map_err(io)?;
    for &i in &order {
        let mut counted = Counted {
            inner: &mut out,
            written: 0,
        };
        fill(i, &mut counted)?;
        let expected = tensors[i].byte_len();
        if counted.written != expected {
            return Err(ModelError::Safetensors {
                path: path.to_owned(),
                reason: format!(
                    "tensor `{}`: wrote {} bytes, planned {expected}",
                    tensors[i].name, counted.written
                ),
            });
        }
    }
    out.flush().map_err(io)
}

struct Counted<'a, W: Write> {
    inner: &'a mut W,
    written: usize,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
