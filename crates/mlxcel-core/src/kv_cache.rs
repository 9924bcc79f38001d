//! Per-sequence key/value memory that grows in chunks.

pub use mlxcel_model::KvType;

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// The MLX dtype a cache of `kind` holds (q8_0: its rows' bytes).
fn dtype_of(kind: KvType) -> Dtype {
    match kind {
        KvType::F32 => Dtype::F32,
        KvType::F16 => Dtype::F16,
        KvType::Q8_0 => Dtype::U8,
    }
}

/// Elements of the cache array's last dimension for rows of `head_dim` values.
fn row_len(kind: KvType, head_dim: i32) -> i32 {
    match kind {
        KvType::Q8_0 => kind.row_bytes(head_dim as usize) as i32,
        _ => head_dim,
    }
}

/// `x` (f32) as a cache of `kind` holds it. q8_0 caches are written by the fused decoder layer
/// only (MLX has no op for their blocks).
fn rounded(x: &Array, kind: KvType) -> Result<Array> {
    match kind {
        KvType::F32 => Ok(x.clone()),
        KvType::F16 => x.astype(dtype_of(kind)),
        KvType::Q8_0 => Err(Error::KvTypeUnsupported {
            kind: "q8_0",
            reason: "its caches are written by mlxcel's fused decoder layer, and this step runs \
                     the per-op graph"
                .into(),
        }),
    }
}

/// `values` as q8_0 blocks ([`KvType::Q8_0`]; the arithmetic of the kernels' writes, and of
/// llama.cpp's reference quantizer): per 32 values, `d = max |x| / 127` as a half, then
/// `round(x · (1 / d))` (halves away from zero) as signed bytes.
pub fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / KvType::Q8_0_BLOCK * KvType::Q8_0_BLOCK_BYTES);
    for block in values.chunks_exact(KvType::Q8_0_BLOCK) {
        let amax = block
            .iter()
            .fold(0f32, |m, x| if x.abs() > m { x.abs() } else { m });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
        for &x in block {
            let r = (x * id).round();
            let q = if r.is_nan() {
                0.0
            } else {
                r.clamp(-127.0, 127.0)
            };
            out.push(q as i8 as u8);
        }
    }
    out
}

/// q8_0 blocks back to f32 (`q · d`, exact).
pub fn dequantize_q8_0(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / KvType::Q8_0_BLOCK_BYTES * KvType::Q8_0_BLOCK);
    for block in bytes.chunks_exact(KvType::Q8_0_BLOCK_BYTES) {
        let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
        out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
    }
    out
}

/// Positions added whenever a cache runs out of room: growing one position at a time would copy
/// the whole cache every step.
pub const KV_CHUNK: usize = 256;

/// One sequence's keys and values for every layer, `[1, kv_heads, allocated, head_dim]` each,
/// keys and values each in their [`KvType`] (computed in f32, rounded when written).
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<(Array, Array)>,
    k_type: KvType,
    v_type: KvType,
    layer_count: usize,
    len: usize,
    allocated: usize,
    max_positions: usize,
    kv_heads: i32,
    head_dim: i32,
}

impl KvCache {
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_positions: usize,
        (k_type, v_type): (KvType, KvType),
    ) -> Self {
        // Layer arrays are created by the first `reserve`, so an idle slot costs nothing.
        Self {
            layers: Vec::new(),
            k_type,
            v_type,
            layer_count: layers,
            len: 0,
            allocated: 0,
            max_positions,
            kv_heads: kv_heads as i32,
            head_dim: head_dim as i32,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions this cache may ever hold.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Sets the most positions this cache may hold (a kept cache given to a new sequence, whose
    /// plan sets its own bound). Refused below the positions held; positions already allocated
    /// past `max_positions` stay allocated ([`KvCache::reserved_positions`] counts them).
    pub fn set_max_positions(&mut self, max_positions: usize) -> Result<()> {
        if max_positions < self.len {
            return Err(Error::CacheFull {
                len: self.len,
                extra: 0,
                max_positions,
            });
        }
        self.max_positions = max_positions;
        Ok(())
    }

    /// Positions this cache's memory is counted for: the most it may hold, or what it has
    /// allocated if that is more.
    pub fn reserved_positions(&self) -> usize {
        self.max_positions.max(self.allocated)
    }

    /// The element types of keys and of values.
    pub fn types(&self) -> (KvType, KvType) {
        (self.k_type, self.v_type)
    }

    /// Bytes one position takes over all layers, keys and values.
    pub fn bytes_per_position(&self) -> usize {
        let d = self.head_dim as usize;
        self.layer_count
            * self.kv_heads as usize
            * (self.k_type.row_bytes(d) + self.v_type.row_bytes(d))
    }

    /// Bytes of key/value memory currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.allocated * self.bytes_per_position()
    }

    /// Makes room for `extra` more positions, growing in [`KV_CHUNK`]s up to `max_positions`.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_positions {
            return Err(Error::CacheFull {
                len: self.len,
                extra,
                max_positions: self.max_positions,
            });
        }
        if needed <= self.allocated {
            return Ok(());
        }
        let target = needed
            .div_ceil(KV_CHUNK)
            .saturating_mul(KV_CHUNK)
            .min(self.max_positions);
        let grow = (target - self.allocated) as i32;
        let zeros = |kind: KvType| {
            Array::zeros(
                &[1, self.kv_heads, grow, row_len(kind, self.head_dim)],
                dtype_of(kind),
            )
        };
        if self.layers.is_empty() {
            // One array per layer and per side: the fused decoder layer writes into them in
            // place, so no two may share a buffer.
            self.layers = (0..self.layer_count)
                .map(|_| Ok((zeros(self.k_type)?, zeros(self.v_type)?)))
                .collect::<Result<_>>()?;
        } else {
            let (k_zeros, v_zeros) = (zeros(self.k_type)?, zeros(self.v_type)?);
            for (k, v) in &mut self.layers {
                *k = Array::concatenate(&[k, &k_zeros], 2)?;
                *v = Array::concatenate(&[v, &v_zeros], 2)?;
            }
        }
        self.allocated = target;
        Ok(())
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`) of `layer` at the current end and returns
    /// the keys and values of every position so far, including the new ones.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        n: usize,
    ) -> Result<(Array, Array)> {
        let start = self.len as i32;
        let stop = (self.len + n) as i32;
        let (k, v) = (rounded(k, self.k_type)?, rounded(v, self.v_type)?);
        let (ck, cv) = &mut self.layers[layer];
        let lo = [0, 0, start, 0];
        let hi = [1, self.kv_heads, stop, self.head_dim];
        *ck = ck.slice_update(&k, &lo, &hi)?;
        *cv = cv.slice_update(&v, &lo, &hi)?;
        let upto = [1, self.kv_heads, stop, self.head_dim];
        Ok((
            ck.slice(&[0, 0, 0, 0], &upto)?,
            cv.slice(&[0, 0, 0, 0], &upto)?,
        ))
    }

    /// Like [`KvCache::append`], but returns the whole allocated arrays and the number of
    /// positions in use, for kernels that read a prefix in place (no slice op).
    pub(crate) fn append_whole(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        n: usize,
    ) -> Result<(Array, Array, usize)> {
        let start = self.len as i32;
        let stop = (self.len + n) as i32;
        let (k, v) = (rounded(k, self.k_type)?, rounded(v, self.v_type)?);
        let (ck, cv) = &mut self.layers[layer];
        let lo = [0, 0, start, 0];
        let hi = [1, self.kv_heads, stop, self.head_dim];
        *ck = ck.slice_update(&k, &lo, &hi)?;
        *cv = cv.slice_update(&v, &lo, &hi)?;
        Ok((ck.clone(), cv.clone(), self.len + n))
    }

    /// `layer`'s whole key and value arrays (`[1, kv_heads, allocated, head_dim]`), for the
    /// fused decoder layer, which writes the step's positions into them in place.
    pub(crate) fn layer(&self, layer: usize) -> (&Array, &Array) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Becomes a copy of `source`'s first `len` positions (a cached prefix another sequence
    /// computed: the same tokens give the same keys and values), forgetting its own.
    pub fn copy_prefix_from(&mut self, source: &KvCache, len: usize) -> Result<()> {
        if source.types() != self.types() {
            return Err(Error::KvTypeMismatch {
                from_k: source.k_type.as_str(),
                from_v: source.v_type.as_str(),
                to_k: self.k_type.as_str(),
                to_v: self.v_type.as_str(),
            });
        }
        if len > source.len {
            return Err(Error::CacheFull {
                len: source.len,
                extra: len - source.len,
                max_positions: source.len,
            });
        }
        self.len = 0;
        self.reserve(len)?;
        if len == 0 {
            return Ok(());
        }
        let hi = |kind| [1, self.kv_heads, len as i32, row_len(kind, self.head_dim)];
        let (k_hi, v_hi) = (hi(self.k_type), hi(self.v_type));
        for ((k, v), (sk, sv)) in self.layers.iter_mut().zip(&source.layers) {
            let lo = [0, 0, 0, 0];
            *k = k.slice_update(&sk.slice(&lo, &k_hi)?, &lo, &k_hi)?;
            *v = v.slice_update(&sv.slice(&lo, &v_hi)?, &lo, &v_hi)?;
        }
        // Materialized now: the fused layer writes into these buffers in place.
        crate::array::eval(&self.arrays().collect::<Vec<_>>())?;
        self.len = len;
        Ok(())
    }

    /// Elements each position holds over all layers: keys and values of every head (the f32
    /// values [`KvCache::export`] gives per position).
    pub fn floats_per_position(&self) -> usize {
        2 * self.layer_count * self.kv_heads as usize * self.head_dim as usize
    }

    /// The first `len` positions' keys and values on the host as f32 (whatever the cache's
    /// types), layer by layer, keys before values, each `[kv_heads, len, head_dim]`
    /// ([`KvCache::import`] reads this layout).
    pub fn export(&self, len: usize) -> Result<Vec<f32>> {
        if len > self.len {
            return Err(Error::CacheFull {
                len: self.len,
                extra: len - self.len,
                max_positions: self.len,
            });
        }
        let mut out = Vec::with_capacity(len * self.floats_per_position());
        if len == 0 {
            return Ok(out);
        }
        for (k, v) in &self.layers {
            for (side, kind) in [(k, self.k_type), (v, self.v_type)] {
                let hi = [1, self.kv_heads, len as i32, row_len(kind, self.head_dim)];
                let part = side.slice(&[0, 0, 0, 0], &hi)?;
                if kind == KvType::Q8_0 {
                    let bytes: Vec<u8> = part.to_vec_u32()?.into_iter().map(|b| b as u8).collect();
                    out.extend(dequantize_q8_0(&bytes));
                } else {
                    // f16 elements widen to f32 exactly.
                    out.extend(part.to_vec_f32()?);
                }
            }
        }
        Ok(out)
    }

    /// Becomes `len` positions read from `data` in [`KvCache::export`]'s layout, forgetting its
    /// own; `data` must hold exactly `len` positions. Values are rounded to the cache's types as
    /// a step's writes are.
    pub fn import(&mut self, data: &[f32], len: usize) -> Result<()> {
        let per_side = len * self.kv_heads as usize * self.head_dim as usize;
        if data.len() != 2 * self.layer_count * per_side {
            return Err(Error::DataLength {
                op: "KvCache::import",
                len: data.len(),
                shape: vec![
                    2 * self.layer_count as i32,
                    self.kv_heads,
                    len as i32,
                    self.head_dim,
                ],
                expected: len * self.floats_per_position(),
            });
        }
        self.len = 0;
        self.reserve(len)?;
        if len == 0 {
            return Ok(());
        }
        let lo = [0, 0, 0, 0];
        let mut sides = data.chunks_exact(per_side);
        let (k_type, v_type, kv_heads, head_dim) =
            (self.k_type, self.v_type, self.kv_heads, self.head_dim);
        for (k, v) in &mut self.layers {
            for (side, kind) in [(k, k_type), (v, v_type)] {
                let part = sides.next().expect("length checked above");
                let hi = [1, kv_heads, len as i32, row_len(kind, head_dim)];
                // Rounded as a write rounds: data read back from a cache of the same type is
                // unchanged (f16: exactly; q8_0: each block's maximum is 127 · d, so d and every
                // code come back).
                let part = match kind {
                    KvType::Q8_0 => Array::from_bytes(&quantize_q8_0(part), &hi, Dtype::U8)?,
                    _ => Array::from_f32(part, &hi)?.astype(dtype_of(kind))?,
                };
                *side = side.slice_update(&part, &lo, &hi)?;
            }
        }
        // Materialized now: the fused layer writes into these buffers in place.
        crate::array::eval(&self.arrays().collect::<Vec<_>>())?;
        self.len = len;
        Ok(())
    }

    /// Forgets every position from `len` on (speculative decoding's rejected proposals); their
    /// keys and values are overwritten by the next append.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Records that `n` positions were appended to every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Every layer's arrays, for evaluating them together with the step's outputs.
    pub(crate) fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers.iter().flat_map(|(k, v)| [k, v])
    }
}
