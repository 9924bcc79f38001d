//! Per-sequence key/value memory in blocks of positions, which sequences with a common prefix
//! share.

use std::sync::Arc;

pub use mlxcel_model::KvType;

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::recurrent_state::{LayerStateShape, RecurrentState};

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

/// Positions per block of a [`KvCache`]. It equals the key ranges mlxcel's attention kernel
/// splits a sequence into (its chunking-invariant grid), so each of the kernel's tasks reads one
/// block.
pub const KV_BLOCK: usize = 256;

/// Positions a cache grows by when it runs out of room (one block).
pub const KV_CHUNK: usize = KV_BLOCK;

/// [`KV_BLOCK`] positions of keys and values for every layer: `(keys, values)` per layer, each
/// `[1, kv_heads, KV_BLOCK, row]` (the layer's own heads and head size) and a materialized
/// buffer of its own.
#[derive(Debug)]
struct KvBlock {
    layers: Vec<(Array, Array)>,
}

/// One sequence's keys and values for every layer, in blocks of [`KV_BLOCK`] positions (computed
/// in f32, rounded to each side's [`KvType`] when written).
///
/// Blocks are shared: [`KvCache::copy_prefix_from`] gives a cache the other cache's full blocks
/// (not a copy) and a private copy of the partial one. A shared block is read-only; before a
/// step writes positions into a block that another cache also holds, that block is copied
/// (copy on write), so a sharer never sees another sequence's writes.
#[derive(Debug)]
pub struct KvCache {
    blocks: Vec<Arc<KvBlock>>,
    k_type: KvType,
    v_type: KvType,
    len: usize,
    max_positions: usize,
    /// Per layer: `(kv_heads, head_dim)` of its keys and values (the same for every layer but
    /// in Gemma 4, whose full layers have a larger head).
    shapes: Vec<(i32, i32)>,
    /// A hybrid model's linear-attention state (its layers hold no keys or values), `None` for
    /// a model of softmax attention only.
    recurrent: Option<RecurrentState>,
}

impl KvCache {
    /// An empty cache of `shapes.len()` layers, layer `i`'s keys and values of `shapes[i] =
    /// (kv_heads, head_dim)`.
    pub(crate) fn new(
        shapes: &[(usize, usize)],
        max_positions: usize,
        (k_type, v_type): (KvType, KvType),
    ) -> Self {
        // Blocks are created as positions need them, so an idle slot costs nothing.
        Self {
            blocks: Vec::new(),
            k_type,
            v_type,
            len: 0,
            max_positions,
            shapes: shapes
                .iter()
                .map(|&(heads, dim)| (heads as i32, dim as i32))
                .collect(),
            recurrent: None,
        }
    }

    /// The cache with a new sequence's recurrent state for a hybrid model's linear-attention
    /// layers (`shapes`, in layer order; none: no state), its snapshots (when kept) at block
    /// boundaries.
    pub(crate) fn with_recurrent(mut self, shapes: &[LayerStateShape]) -> Self {
        if !shapes.is_empty() {
            self.recurrent = Some(RecurrentState::new(shapes, KV_BLOCK));
        }
        self
    }

    /// The linear-attention layers' state, for a hybrid model's cache.
    pub fn recurrent(&self) -> Option<&RecurrentState> {
        self.recurrent.as_ref()
    }

    /// The state a step reads and writes, checked to be the state after exactly the positions
    /// the cache holds.
    pub(crate) fn recurrent_mut(&mut self) -> Result<Option<&mut RecurrentState>> {
        let len = self.len;
        match &mut self.recurrent {
            Some(state) if state.position() != len => Err(Error::RecurrentState {
                operation: "step",
                reason: format!(
                    "the cache holds {len} positions but its state is not the state after them \
                     (it was rewound or cut to a position it kept no copy of); start the \
                     sequence again"
                ),
            }),
            other => Ok(other.as_mut()),
        }
    }

    /// Bytes of the linear-attention state (0 for a model without linear layers): a fixed size
    /// per sequence, whatever its length.
    pub fn recurrent_bytes(&self) -> usize {
        self.recurrent.as_ref().map_or(0, RecurrentState::bytes)
    }

    /// Keeps (or stops keeping) a snapshot of the linear-attention state at every block
    /// boundary a step crosses, so that a prefix of whole blocks can be given to another cache
    /// ([`KvCache::copy_prefix_from`]) or this one cut back to it. No-op without linear layers.
    pub fn set_keep_state_snapshots(&mut self, keep: bool) {
        if let Some(state) = &mut self.recurrent {
            state.set_keep_snapshots(keep);
        }
    }

    /// Makes the next step keep the linear-attention state after each of its positions (run
    /// token by token, as decode steps run), so that [`KvCache::truncate`] can go back to any
    /// of them until the step after: a speculative verification. No-op without linear layers.
    pub fn checkpoint_next_step(&mut self) {
        if let Some(state) = &mut self.recurrent {
            state.checkpoint_next_step();
        }
    }

    /// The most positions, at most `len` (and at most those held), that another cache can take
    /// from this one ([`KvCache::copy_prefix_from`]): `len` itself without linear layers; with
    /// them, the longest such prefix whose state this cache has (its own, a checkpoint, or a
    /// snapshot at a block boundary), 0 if none.
    pub fn resumable_prefix(&self, len: usize) -> usize {
        let len = len.min(self.len);
        match &self.recurrent {
            Some(state) => state.resumable(len),
            None => len,
        }
    }

    /// The linear-attention state after the first `len` positions as f32 values (empty for a
    /// model without linear layers): what a saved slot holds beside its keys and values
    /// ([`KvCache::import_state`] reads it back).
    pub fn export_state(&self, len: usize) -> Result<Vec<f32>> {
        let Some(state) = &self.recurrent else {
            return Ok(Vec::new());
        };
        state.export(len).ok_or_else(|| Error::RecurrentState {
            operation: "export",
            reason: format!(
                "the cache keeps no copy of its state after {len} positions (it keeps its \
                 state after {} and snapshots at multiples of {KV_BLOCK})",
                self.len
            ),
        })
    }

    /// Sets the linear-attention state to `data` ([`KvCache::export_state`]'s layout) as the
    /// state after the positions the cache holds (after [`KvCache::import`]). Refused when its
    /// length is not this model's state's, or for a model without linear layers unless `data`
    /// is empty.
    pub fn import_state(&mut self, data: &[f32]) -> Result<()> {
        let len = self.len;
        match &mut self.recurrent {
            None if data.is_empty() => Ok(()),
            None => Err(Error::RecurrentState {
                operation: "import",
                reason: format!(
                    "the data holds {} values of linear-attention state, and this model has no \
                     linear-attention layers (it was saved from another model)",
                    data.len()
                ),
            }),
            Some(state) => {
                let floats = state.floats();
                if state.import(data, len) {
                    Ok(())
                } else {
                    Err(Error::RecurrentState {
                        operation: "import",
                        reason: format!(
                            "the data holds {} values of linear-attention state, and this \
                             model's state is {floats} values (it was saved from another model \
                             or shape)",
                            data.len()
                        ),
                    })
                }
            }
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
    /// plan sets its own bound). Refused below the positions held; blocks already allocated
    /// past `max_positions` stay allocated ([`KvCache::reserved_blocks`] counts them).
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

    /// Blocks this cache holds (its own and shared ones).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks this cache holds that another cache holds too.
    pub fn shared_blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| Arc::strong_count(b) > 1)
            .count()
    }

    /// An identity per block held (equal for the same block in two caches), for counting the
    /// distinct blocks of many caches.
    pub fn block_ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.blocks.iter().map(|b| Arc::as_ptr(b) as usize)
    }

    /// Blocks this cache's memory is counted for: the blocks it may come to hold at
    /// `max_positions` (or holds, if more), plus one when the block its next position falls in
    /// is shared (written, it is copied first).
    pub fn reserved_blocks(&self) -> usize {
        self.reserved_blocks_at(self.len, self.max_positions)
    }

    /// [`KvCache::reserved_blocks`] if this cache held `len` positions (at most those it
    /// holds) with a bound of `max_positions`.
    pub fn reserved_blocks_at(&self, len: usize, max_positions: usize) -> usize {
        let copy_on_write = self
            .blocks
            .get(len / KV_BLOCK)
            .is_some_and(|b| Arc::strong_count(b) > 1 && len < max_positions);
        max_positions.div_ceil(KV_BLOCK).max(self.blocks.len()) + usize::from(copy_on_write)
    }

    /// The element types of keys and of values.
    pub fn types(&self) -> (KvType, KvType) {
        (self.k_type, self.v_type)
    }

    /// Bytes one position takes over all layers, keys and values.
    pub fn bytes_per_position(&self) -> usize {
        self.shapes
            .iter()
            .map(|&(heads, dim)| {
                let d = dim as usize;
                heads as usize * (self.k_type.row_bytes(d) + self.v_type.row_bytes(d))
            })
            .sum()
    }

    /// Bytes of one block over all layers, keys and values.
    pub fn block_bytes(&self) -> usize {
        KV_BLOCK * self.bytes_per_position()
    }

    /// Bytes of key/value memory this cache's blocks hold (shared blocks included).
    pub fn allocated_bytes(&self) -> usize {
        self.blocks.len() * self.block_bytes()
    }

    /// Every layer's `(keys, values)` of a block of zeros, not yet evaluated.
    fn zero_layers(&self) -> Result<Vec<(Array, Array)>> {
        let zeros = |kind: KvType, (heads, dim): (i32, i32)| {
            Array::zeros(
                &[1, heads, KV_BLOCK as i32, row_len(kind, dim)],
                dtype_of(kind),
            )
        };
        self.shapes
            .iter()
            .map(|&shape| Ok((zeros(self.k_type, shape)?, zeros(self.v_type, shape)?)))
            .collect()
    }

    /// `layers` evaluated into a block (materialized: the fused layer writes into it in place).
    fn materialized(layers: Vec<(Array, Array)>) -> Result<KvBlock> {
        crate::array::eval(&layers.iter().flat_map(|(k, v)| [k, v]).collect::<Vec<_>>())?;
        Ok(KvBlock { layers })
    }

    /// A private copy of `block` (a buffer of its own for every array).
    fn copied(block: &KvBlock) -> Result<KvBlock> {
        let layers = block
            .layers
            .iter()
            .map(|(k, v)| Ok((k.deep_copy()?, v.deep_copy()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvBlock { layers })
    }

    /// Makes room for `extra` more positions (new blocks up to `max_positions`) and makes every
    /// block they fall in this cache's own (copying a shared one), so that a step may write
    /// them in place.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_positions {
            return Err(Error::CacheFull {
                len: self.len,
                extra,
                max_positions: self.max_positions,
            });
        }
        while self.blocks.len() * KV_BLOCK < needed {
            let block = Self::materialized(self.zero_layers()?)?;
            self.blocks.push(Arc::new(block));
        }
        if extra > 0 {
            for index in self.len / KV_BLOCK..needed.div_ceil(KV_BLOCK) {
                if Arc::strong_count(&self.blocks[index]) > 1 {
                    let private = Self::copied(&self.blocks[index])?;
                    self.blocks[index] = Arc::new(private);
                }
            }
        }
        Ok(())
    }

    /// The block at `index`, which [`KvCache::reserve`] made this cache's own.
    fn own_block(&mut self, index: usize) -> &mut KvBlock {
        Arc::get_mut(&mut self.blocks[index])
            .expect("reserve() makes every block a step writes private")
    }

    /// The first `len` positions of `layer`'s keys (`side` 0) or values (1) as one array,
    /// `[1, kv_heads, len, row]` (the blocks concatenated; one block is sliced, not copied).
    fn contiguous(&self, layer: usize, side: usize, len: usize) -> Result<Array> {
        let kind = if side == 0 { self.k_type } else { self.v_type };
        let (heads, dim) = self.shapes[layer];
        let hi = [1, heads, len as i32, row_len(kind, dim)];
        let count = len.div_ceil(KV_BLOCK);
        let parts: Vec<&Array> = self.blocks[..count]
            .iter()
            .map(|b| {
                let (k, v) = &b.layers[layer];
                if side == 0 { k } else { v }
            })
            .collect();
        let whole = if parts.len() == 1 {
            parts[0].clone()
        } else {
            Array::concatenate(&parts, 2)?
        };
        whole.slice(&[0, 0, 0, 0], &hi)
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`, already in the cache's types) of `layer`
    /// at positions `len..len + n`, block by block.
    fn write(&mut self, layer: usize, k: &Array, v: &Array, n: usize) -> Result<()> {
        let (start, stop) = (self.len, self.len + n);
        let (kv_heads, head_dim) = self.shapes[layer];
        let dims = (
            row_len(self.k_type, head_dim),
            row_len(self.v_type, head_dim),
        );
        let mut at = start;
        while at < stop {
            let index = at / KV_BLOCK;
            let end = stop.min((index + 1) * KV_BLOCK);
            let (from, to) = ((at - start) as i32, (end - start) as i32);
            let (lo, hi) = ((at % KV_BLOCK) as i32, (end - index * KV_BLOCK) as i32);
            let part = |a: &Array, row: i32| a.slice(&[0, 0, from, 0], &[1, kv_heads, to, row]);
            let (pk, pv) = (part(k, dims.0)?, part(v, dims.1)?);
            let block = self.own_block(index);
            let (ck, cv) = &mut block.layers[layer];
            *ck = ck.slice_update(&pk, &[0, 0, lo, 0], &[1, kv_heads, hi, dims.0])?;
            *cv = cv.slice_update(&pv, &[0, 0, lo, 0], &[1, kv_heads, hi, dims.1])?;
            at = end;
        }
        Ok(())
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`) of `layer` at the current end and returns
    /// the keys and values of every position so far, including the new ones (the per-op
    /// graph's path: the blocks are concatenated for MLX's attention).
    pub(crate) fn append(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        n: usize,
    ) -> Result<(Array, Array)> {
        let (k, v) = (rounded(k, self.k_type)?, rounded(v, self.v_type)?);
        self.write(layer, &k, &v, n)?;
        let stop = self.len + n;
        Ok((
            self.contiguous(layer, 0, stop)?,
            self.contiguous(layer, 1, stop)?,
        ))
    }

    /// `layer`'s keys and values of positions `0..upto` (this step's included, once written),
    /// without writing: what a layer that reuses another layer's keys and values attends over
    /// (Gemma 4's shared layers).
    pub(crate) fn fetch(&self, layer: usize, upto: usize) -> Result<(Array, Array)> {
        Ok((
            self.contiguous(layer, 0, upto)?,
            self.contiguous(layer, 1, upto)?,
        ))
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`) of `layer` at the current end and returns
    /// the key and value blocks holding every position so far, including the new ones (the
    /// per-op graph's path on mlxcel's attention kernel, which reads the blocks where they lie).
    pub(crate) fn append_blocks(
        &mut self,
        layer: usize,
        k: &Array,
        v: &Array,
        n: usize,
    ) -> Result<(Vec<&Array>, Vec<&Array>)> {
        let (k, v) = (rounded(k, self.k_type)?, rounded(v, self.v_type)?);
        self.write(layer, &k, &v, n)?;
        Ok(self.layer_blocks(layer, self.len + n))
    }

    /// `layer`'s key and value blocks holding positions `0..upto`, for the fused decoder
    /// layer, which writes the step's positions into them in place.
    pub(crate) fn layer_blocks(&self, layer: usize, upto: usize) -> (Vec<&Array>, Vec<&Array>) {
        self.blocks[..upto.div_ceil(KV_BLOCK)]
            .iter()
            .map(|b| {
                let (k, v) = &b.layers[layer];
                (k, v)
            })
            .unzip()
    }

    /// Becomes `source`'s first `len` positions (a cached prefix another sequence computed: the
    /// same tokens give the same keys and values), forgetting its own: the blocks `len` fills
    /// are shared with `source`, the partial last one is copied.
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
        if len > self.max_positions {
            return Err(Error::CacheFull {
                len: 0,
                extra: len,
                max_positions: self.max_positions,
            });
        }
        match (&mut self.recurrent, &source.recurrent) {
            (None, None) => {}
            (Some(state), Some(from)) => {
                if !state.copy_from(from, len) {
                    return Err(Error::RecurrentState {
                        operation: "copy a prefix",
                        reason: format!(
                            "the source keeps no copy of its state after {len} positions (it \
                             keeps its state after {} and snapshots at multiples of \
                             {KV_BLOCK}: KvCache::resumable_prefix says which prefixes it can \
                             give)",
                            source.len
                        ),
                    });
                }
            }
            _ => {
                return Err(Error::RecurrentState {
                    operation: "copy a prefix",
                    reason: "one cache has linear-attention state and the other none: they \
                             belong to different models"
                        .into(),
                });
            }
        }
        let full = len / KV_BLOCK;
        let mut blocks: Vec<Arc<KvBlock>> = source.blocks[..full].to_vec();
        if !len.is_multiple_of(KV_BLOCK) {
            blocks.push(Arc::new(Self::copied(&source.blocks[full])?));
        }
        self.blocks = blocks;
        self.len = len;
        Ok(())
    }

    /// Elements each position holds over all layers: keys and values of every head (the f32
    /// values [`KvCache::export`] gives per position).
    pub fn floats_per_position(&self) -> usize {
        self.shapes
            .iter()
            .map(|&(heads, dim)| 2 * heads as usize * dim as usize)
            .sum()
    }

    /// The first `len` positions' keys and values on the host as f32 (whatever the cache's
    /// types), layer by layer, keys before values, each `[kv_heads, len, head_dim]` (the layer's
    /// own) ([`KvCache::import`] reads this layout).
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
        for layer in 0..self.shapes.len() {
            for (side, kind) in [(0, self.k_type), (1, self.v_type)] {
                let part = self.contiguous(layer, side, len)?;
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
    ///
    /// A hybrid model's linear-attention state is not in `data`: until
    /// [`KvCache::import_state`] sets it, the cache refuses to step.
    pub fn import(&mut self, data: &[f32], len: usize) -> Result<()> {
        let expected = len * self.floats_per_position();
        if data.len() != expected {
            let (heads, dim) = self.shapes.first().copied().unwrap_or((0, 0));
            return Err(Error::DataLength {
                op: "KvCache::import",
                len: data.len(),
                shape: vec![2 * self.shapes.len() as i32, heads, len as i32, dim],
                expected,
            });
        }
        self.blocks.clear();
        self.len = 0;
        self.reserve(len)?;
        if len == 0 {
            return Ok(());
        }
        let mut rest = data;
        let (k_type, v_type) = (self.k_type, self.v_type);
        for layer in 0..self.shapes.len() {
            let (kv_heads, head_dim) = self.shapes[layer];
            let per_side = len * kv_heads as usize * head_dim as usize;
            let mut pair = Vec::with_capacity(2);
            for kind in [k_type, v_type] {
                let (part, tail) = rest.split_at(per_side);
                rest = tail;
                let shape = [1, kv_heads, len as i32, row_len(kind, head_dim)];
                // Rounded as a write rounds: data read back from a cache of the same type is
                // unchanged (f16: exactly; q8_0: each block's maximum is 127 · d, so d and every
                // code come back).
                pair.push(match kind {
                    KvType::Q8_0 => Array::from_bytes(&quantize_q8_0(part), &shape, Dtype::U8)?,
                    _ => Array::from_f32(part, &shape)?.astype(dtype_of(kind))?,
                });
            }
            self.write(layer, &pair[0], &pair[1], len)?;
        }
        // Copied into buffers of their own now (a write covering a whole block leaves it a view
        // of the data): the fused layer writes into them in place.
        for block in &mut self.blocks {
            let private = Self::copied(block)?;
            *block = Arc::new(private);
        }
        self.len = len;
        if let Some(state) = &mut self.recurrent {
            state.invalidate();
        }
        Ok(())
    }

    /// Forgets every position from `len` on (speculative decoding's rejected proposals); their
    /// keys and values are overwritten by the next append (into a copy, if the block is
    /// shared).
    ///
    /// A hybrid model's recurrent state goes back to its copy after `len` positions (a
    /// verification's checkpoint, a block boundary's snapshot, or zeros for 0); cut to a
    /// position it kept no copy of, the cache refuses its next step (by name) rather than
    /// continue from the wrong state.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len
            && let Some(state) = &mut self.recurrent
        {
            state.rewind(len);
        }
        self.len = self.len.min(len);
    }

    /// Records that `n` positions were appended to every layer (and consumed by the recurrent
    /// state, if any).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        if let Some(state) = &mut self.recurrent {
            state.advance(n);
        }
    }

    /// The arrays of the blocks a step writes (from the one holding position `len` on), for
    /// evaluating them together with the step's outputs.
    pub(crate) fn pending_arrays(&self) -> impl Iterator<Item = &Array> {
        self.blocks[(self.len / KV_BLOCK).min(self.blocks.len())..]
            .iter()
            .flat_map(|b| b.layers.iter().flat_map(|(k, v)| [k, v]))
    }
}
