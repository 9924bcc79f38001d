//! The FFI layer: the cxx bridge to `cpp/`, the process-wide MLX lock, and every `unsafe`
//! block of the crate (including the one call of `mlxcel_model`'s unsafe API, releasing a
//! checkpoint's bytes once they are copied: [`copy_tensor_then_release`]).
//!
//! Nothing here is public outside the crate. [`crate::Array`] holds a [`Handle`] and calls the
//! functions below through [`with_lock`].
//!
//! # Why a lock
//!
//! An MLX array is a refcounted handle (`std::shared_ptr`) to a node of a lazily evaluated
//! graph. Copies share the node, and evaluating an array *mutates* every unevaluated node
//! beneath it (status, data, detached inputs), so two handles that merely share an ancestor
//! (every activation shares the weights) can race if evaluated from two threads. MLX's own
//! graph code takes no locks, and its default streams are per thread. We therefore serialise
//! every call into MLX, including the destructor of a handle, behind one process-wide mutex.
//! Under that lock no two threads ever touch MLX state at once, which is what makes
//! `Array: Send + Sync` sound. The lock is uncontended in the expected use (one backend
//! thread), costs tens of nanoseconds against microseconds of MLX graph overhead per op, and
//! is held for the whole of an `eval` (MLX's CPU stream is one queue anyway). MLX's worker
//! threads never call back into Rust, so the lock cannot deadlock.

use std::sync::{Mutex, MutexGuard};

use mlxcel_model::{Checkpoint, TensorView};

pub(crate) use ffi::{ArrayList, MlxArray};

#[cxx::bridge(namespace = "mlxcel")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("mlxcel-core/cpp/bridge.h");

        type MlxArray;
        type ArrayList;
        type RoutedExperts;
        type ExpertsList;

        fn array_from_bytes(bytes: &[u8], shape: &[i32], dtype: u8) -> Result<UniquePtr<MlxArray>>;
        fn array_alloc(shape: &[i32], dtype: u8) -> Result<UniquePtr<MlxArray>>;
        fn array_over_mapping(
            address: usize,
            shape: &[i32],
            dtype: u8,
            keep: Box<MappingKeep>,
        ) -> Result<UniquePtr<MlxArray>>;
        fn array_data_address(a: &MlxArray) -> usize;
        fn array_clone(a: &MlxArray) -> UniquePtr<MlxArray>;
        fn array_deep_copy(a: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn array_shape(a: &MlxArray) -> Vec<i32>;
        fn array_dtype(a: &MlxArray) -> u8;
        fn array_eval(a: &MlxArray) -> Result<()>;
        fn array_list_eval(list: &ArrayList) -> Result<()>;
        fn array_read_f32(a: &MlxArray, out: &mut [f32]) -> Result<()>;
        fn array_readable_f32(a: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn array_read_f32_at(a: &MlxArray, offset: usize, out: &mut [f32]) -> Result<()>;
        fn array_read_u32(a: &MlxArray, out: &mut [u32]) -> Result<()>;
        fn array_read_i32(a: &MlxArray, out: &mut [i32]) -> Result<()>;

        fn array_list_new() -> UniquePtr<ArrayList>;
        fn array_list_push(list: Pin<&mut ArrayList>, a: &MlxArray);
        fn array_list_len(list: &ArrayList) -> usize;
        fn array_list_get(list: &ArrayList, index: usize) -> Result<UniquePtr<MlxArray>>;

        fn set_default_device_cpu() -> Result<()>;
        fn set_memory_limit(bytes: usize) -> Result<usize>;
        fn mlx_active_memory() -> usize;
        fn mlx_cache_memory() -> usize;
        fn mlx_release_unused_memory();
        fn heap_keep_freed(mmap_threshold: usize, trim_threshold: usize) -> bool;
        fn mlx_version() -> String;

        fn zeros(shape: &[i32], dtype: u8) -> Result<UniquePtr<MlxArray>>;
        fn reshape(a: &MlxArray, shape: &[i32]) -> Result<UniquePtr<MlxArray>>;
        fn transpose(a: &MlxArray, axes: &[i32]) -> Result<UniquePtr<MlxArray>>;
        fn swapaxes(a: &MlxArray, axis1: i32, axis2: i32) -> Result<UniquePtr<MlxArray>>;
        fn astype(a: &MlxArray, dtype: u8) -> Result<UniquePtr<MlxArray>>;
        fn take(a: &MlxArray, indices: &MlxArray, axis: i32) -> Result<UniquePtr<MlxArray>>;
        fn concatenate(list: &ArrayList, axis: i32) -> Result<UniquePtr<MlxArray>>;
        fn slice(
            a: &MlxArray,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<MlxArray>>;
        fn slice_update(
            src: &MlxArray,
            update: &MlxArray,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<MlxArray>>;

        fn add(a: &MlxArray, b: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn subtract(a: &MlxArray, b: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn multiply(a: &MlxArray, b: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn divide(a: &MlxArray, b: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn matmul(a: &MlxArray, b: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn silu(a: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn tanh(a: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn gelu_tanh(a: &MlxArray) -> Result<UniquePtr<MlxArray>>;
        fn clamped_swiglu(
            gate: &MlxArray,
            up: &MlxArray,
            alpha: f32,
            limit: f32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn softmax(a: &MlxArray, axis: i32, precise: bool) -> Result<UniquePtr<MlxArray>>;
        fn argmax(a: &MlxArray, axis: i32, keepdims: bool) -> Result<UniquePtr<MlxArray>>;

        fn rms_norm(x: &MlxArray, weight: &MlxArray, eps: f32) -> Result<UniquePtr<MlxArray>>;
        fn rope(
            x: &MlxArray,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn rope_with_freqs(
            x: &MlxArray,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            freqs: &MlxArray,
        ) -> Result<UniquePtr<MlxArray>>;
        fn sdpa(
            q: &MlxArray,
            k: &MlxArray,
            v: &MlxArray,
            scale: f32,
            causal: bool,
            sinks: &[f32],
        ) -> Result<UniquePtr<MlxArray>>;
        fn sdpa_with_mask(
            q: &MlxArray,
            k: &MlxArray,
            v: &MlxArray,
            scale: f32,
            mask: &MlxArray,
            sinks: &[f32],
        ) -> Result<UniquePtr<MlxArray>>;

        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &MlxArray,
            w: &MlxArray,
            scales: &MlxArray,
            biases: &MlxArray,
            transpose: bool,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn dequantize(
            w: &MlxArray,
            scales: &MlxArray,
            biases: &MlxArray,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn quantize(w: &MlxArray, group_size: i32, bits: i32) -> Result<UniquePtr<ArrayList>>;

        fn dist_init_ring(hostfile: &str, rank: i32) -> Result<Vec<i32>>;
        fn dist_send(a: &MlxArray, dst: i32) -> Result<UniquePtr<MlxArray>>;
        fn dist_recv(shape: &[i32], dtype: u8, src: i32) -> Result<UniquePtr<MlxArray>>;
        fn dist_wait_readable(timeout_ms: i32) -> Result<i32>;
        fn dist_set_link_timeout(timeout_ms: i32) -> Result<i32>;

        #[allow(clippy::too_many_arguments)]
        fn native_quantized_matmul(
            x: &MlxArray,
            w: &MlxArray,
            scales: &MlxArray,
            biases: &MlxArray,
            group_size: i32,
            bits: i32,
            layout: u8,
            isa: u8,
            threads: i32,
            epilogue: u8,
            residual: &MlxArray,
            norm: bool,
            norm_weight: &MlxArray,
            eps: f32,
        ) -> Result<UniquePtr<MlxArray>>;
        #[allow(clippy::too_many_arguments)]
        fn native_attention(
            q: &MlxArray,
            k: &MlxArray,
            v: &MlxArray,
            scale: f32,
            causal: bool,
            window: i32,
            softcap: f32,
            keys: i32,
            tokens_major: bool,
            sinks: &[f32],
            isa: u8,
            threads: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        #[allow(clippy::too_many_arguments)]
        fn native_attention_blocks(
            q: &MlxArray,
            k_blocks: &ArrayList,
            v_blocks: &ArrayList,
            scale: f32,
            causal: bool,
            window: i32,
            softcap: f32,
            keys: i32,
            sinks: &[f32],
            isa: u8,
            threads: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        #[allow(clippy::too_many_arguments)]
        fn split_heads(
            qkv: &MlxArray,
            inv_freq: &MlxArray,
            row0: i32,
            n: i32,
            col0: i32,
            heads: i32,
            dim: i32,
            rope: bool,
            offset: i32,
            scale: f32,
        ) -> Result<UniquePtr<MlxArray>>;
        #[allow(clippy::too_many_arguments)]
        fn native_decoder_stack(
            tensors: &ArrayList,
            caches: &ArrayList,
            dims: &[i32],
            quant: &[i32],
            seqs: &[i32],
            softcaps: &[f32],
            sinks: &[f32],
            experts: &ExpertsList,
            lora: &ArrayList,
            lora_pairs: &[i32],
            lora_factors: &[f32],
            lora_scales: &[f32],
            eps: f32,
            scale: f32,
            rope_scale: f32,
            rope_mscale: f32,
            keep: &[i32],
            isa: u8,
            threads: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn experts_list_new() -> UniquePtr<ExpertsList>;
        fn experts_list_push(list: Pin<&mut ExpertsList>, experts: &RoutedExperts);
        #[allow(clippy::too_many_arguments)]
        fn routed_experts_new(
            matrices: &ArrayList,
            quant: &[i32],
            biases: &ArrayList,
            router: &[f32],
            router_bias: &[f32],
            hidden: i32,
            experts: i32,
            top_k: i32,
            routing: u8,
            activation: u8,
            alpha: f32,
            limit: f32,
            shared: bool,
            split: bool,
        ) -> Result<UniquePtr<RoutedExperts>>;
        #[allow(clippy::too_many_arguments)]
        fn native_routed_experts(
            x: &MlxArray,
            norm: &MlxArray,
            experts: &RoutedExperts,
            eps: f32,
            residual: bool,
            int8x: bool,
            isa: u8,
            threads: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn int8_rows(
            ids: &MlxArray,
            w: &MlxArray,
            scales: &MlxArray,
            biases: &MlxArray,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<MlxArray>>;
        fn interleave_int8(
            w: &MlxArray,
            scales: &MlxArray,
            biases: &MlxArray,
            group_size: i32,
            bits: i32,
            compact: bool,
            threads: i32,
        ) -> Result<UniquePtr<ArrayList>>;
        fn kernels_interleave_tile(
            codes: &[u32],
            k: i32,
            bits: i32,
            out_bits: i32,
            out: &mut [u8],
        ) -> Result<()>;
        fn kernels_factor_superblock(values: &[f32], d: &mut f32, c: &mut [i8]) -> Result<bool>;
        fn kernels_has_vnni() -> bool;
        fn kernels_float_to_half(values: &[f32], out: &mut [u16]);
        fn kernels_best_isa() -> u8;
        #[allow(clippy::too_many_arguments)]
        fn kernels_delta_rule(
            q: &[f32],
            k: &[f32],
            v: &[f32],
            log_decay: &[f32],
            beta: &[f32],
            state: &mut [f32],
            y: &mut [f32],
            key_heads: i32,
            value_heads: i32,
            key_dim: i32,
            value_dim: i32,
            tiled: bool,
            position: i64,
            chunked: bool,
            isa: u8,
            threads: i32,
        ) -> Result<()>;
        #[allow(clippy::too_many_arguments)]
        fn kernels_causal_conv_silu(
            x: &[f32],
            tail: &[f32],
            weight: &[f32],
            channels: i32,
            taps: i32,
            out: &mut [f32],
            isa: u8,
            threads: i32,
        ) -> Result<()>;
        fn kernels_available_cores() -> i32;
    }

    extern "Rust" {
        type MappingKeep;
    }
}

static MLX_LOCK: Mutex<()> = Mutex::new(());

/// Runs `f` holding the process-wide MLX lock (see the module docs).
pub(crate) fn with_lock<R>(f: impl FnOnce() -> R) -> R {
    let _guard = lock();
    f()
}

fn lock() -> MutexGuard<'static, ()> {
    // Poisoning only means a panic happened while the lock was held; the bridge converts
    // every C++ exception into a Result, so MLX's state is not left half-updated by it.
    MLX_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An owned, non-null MLX array handle whose destructor runs under the MLX lock.
pub(crate) struct Handle(cxx::UniquePtr<MlxArray>);

impl Handle {
    /// Wraps a pointer returned by the bridge. cxx returns null only for a moved-from
    /// `unique_ptr`, which the shims never produce.
    pub(crate) fn new(ptr: cxx::UniquePtr<MlxArray>) -> Handle {
        assert!(!ptr.is_null(), "mlxcel-core shim returned a null array");
        Handle(ptr)
    }

    pub(crate) fn get(&self) -> &MlxArray {
        self.0
            .as_ref()
            .expect("a Handle is never null (checked in Handle::new)")
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let ptr = std::mem::replace(&mut self.0, cxx::UniquePtr::null());
        with_lock(move || drop(ptr));
    }
}

// SAFETY: a Handle owns one reference to an MLX graph node. Every access to MLX state through
// it (ops, eval, read-back, and the final release in Drop) happens inside `with_lock`, so no
// two threads touch MLX at once; the refcount itself is an atomic std::shared_ptr count. MLX
// keeps no thread-affine state in an array (the per-thread default stream is only recorded
// in the node and is usable from any thread while calls are serialised).
unsafe impl Send for Handle {}
// SAFETY: `&Handle` only allows calls that take the MLX lock (see the Send impl above).
unsafe impl Sync for Handle {}

/// A layer's routed experts prepared for the fused routed-expert node
/// ([`ffi::routed_experts_new`]), released under the MLX lock (it holds the experts' arrays).
pub(crate) struct ExpertsHandle(cxx::UniquePtr<ffi::RoutedExperts>);

impl ExpertsHandle {
    /// Wraps a pointer returned by the bridge (never null: the shim returns a new object or an
    /// error).
    pub(crate) fn new(ptr: cxx::UniquePtr<ffi::RoutedExperts>) -> ExpertsHandle {
        assert!(
            !ptr.is_null(),
            "mlxcel-core shim returned null routed experts"
        );
        ExpertsHandle(ptr)
    }

    pub(crate) fn get(&self) -> &ffi::RoutedExperts {
        self.0
            .as_ref()
            .expect("an ExpertsHandle is never null (checked in ExpertsHandle::new)")
    }
}

impl Drop for ExpertsHandle {
    fn drop(&mut self) {
        let ptr = std::mem::replace(&mut self.0, cxx::UniquePtr::null());
        with_lock(move || drop(ptr));
    }
}

// SAFETY: the plan behind the handle is immutable after `routed_experts_new` returns; it holds
// MLX array references whose release (in Drop) and every use (`native_routed_experts`, which
// copies the plan's shared pointer into a node) happen inside `with_lock`, as for `Handle`.
unsafe impl Send for ExpertsHandle {}
// SAFETY: `&ExpertsHandle` only allows calls that take the MLX lock (see the Send impl above).
unsafe impl Sync for ExpertsHandle {}

/// Reinterprets a slice of plain numbers as its bytes, for [`ffi::array_from_bytes`].
pub(crate) fn as_bytes<T: Plain>(data: &[T]) -> &[u8] {
    // SAFETY: `Plain` is implemented only for primitive numeric types, which have no padding
    // and no invalid bit patterns as bytes; u8 has alignment 1; the length covers exactly the
    // same memory; the returned slice borrows `data` so it cannot outlive it.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// [`as_bytes`] for writing: every byte pattern is a valid value of a [`Plain`] type.
pub(crate) fn as_bytes_mut<T: Plain>(data: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(data);
    // SAFETY: as in `as_bytes`; in addition any bytes written through the view leave valid
    // values of `T` (primitive numbers have no invalid bit patterns), and the view borrows
    // `data` mutably, so nothing else reads or writes it meanwhile.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), len) }
}

/// A new array of `shape` and `dtype` (`nbytes` bytes in all) whose bytes `fill` writes before
/// anything else can see them; returns it with what `fill` returned. Bytes `fill` leaves
/// unwritten hold whatever the allocator gave (the callers write every one).
pub(crate) fn alloc_and_fill<R>(
    shape: &[i32],
    dtype: u8,
    nbytes: usize,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> R,
) -> Result<(Handle, R), cxx::Exception> {
    let (handle, address) = with_lock(|| {
        let array = ffi::array_alloc(shape, dtype)?;
        let address = ffi::array_data_address(&array);
        Ok::<_, cxx::Exception>((Handle::new(array), address))
    })?;
    let bytes: &mut [std::mem::MaybeUninit<u8>] = if nbytes == 0 {
        &mut []
    } else {
        // SAFETY: `array_alloc` allocated `nbytes` bytes (the caller's elements × element size)
        // at `address` for this array alone; it is not evaluated, shared or read by MLX until
        // this function returns its handle, so `fill` is the only one touching the bytes, and
        // `MaybeUninit` claims nothing about their initial contents.
        unsafe { std::slice::from_raw_parts_mut(address as *mut std::mem::MaybeUninit<u8>, nbytes) }
    };
    let result = fill(bytes);
    Ok((handle, result))
}

/// Primitive numeric types whose memory may be viewed as bytes.
pub(crate) trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u32 {}
impl Plain for i32 {}
impl Plain for u16 {}
impl Plain for u8 {}

/// Copies the checkpoint's tensor `name` with `copy`, then, once the copy succeeded, lets go of
/// the checkpoint's bytes of it (the mapped file's pages, or the tensor converted from a GGUF
/// file), so that a load's peak is the copies rather than the copies and the checkpoint. `None`
/// when the checkpoint has no such tensor; a failed copy releases nothing.
pub(crate) fn copy_tensor_then_release<T: 'static, E: 'static>(
    checkpoint: &Checkpoint,
    name: &str,
    copy: impl FnOnce(TensorView<'_>) -> Result<T, E>,
) -> Option<Result<T, E>> {
    let view = checkpoint.tensor(name)?;
    let copied = copy(view);
    if copied.is_ok() {
        // SAFETY: `release_tensor` needs that no view of `name` is read afterwards. The view was
        // moved into `copy`, whose result cannot borrow it (`T` and `E` are `'static`), and this
        // crate reads a checkpoint's tensor bytes through this function alone (the MLX loader,
        // `llama/load.rs`), so no other view of `name` is alive.
        unsafe { checkpoint.release_tensor(name) };
    }
    Some(copied)
}

/// A file mapped into memory, with arrays made over its bytes ([`array_over`]): the int8 layout
/// cache of `crate::layout_cache`. Read privately (copy-on-write: nothing writes a weight, and
/// if something did, the file would not change) or shared while it is being written
/// ([`Arena`]). Unmapped when the last array over it and the last `Arc` are gone.
pub(crate) struct Mapping {
    map: Map,
    base: *mut u8,
}

/// The mapping itself, kept for its length and to unmap it when dropped.
enum Map {
    ReadOnly(#[allow(dead_code)] memmap2::Mmap),
    Shared(memmap2::MmapMut),
}

// SAFETY: `base` points into `map`, owned by the struct and never moved or unmapped while it
// lives. Bytes are written only through `Arena::filled`, into regions it hands out once each
// (a bump allocator under a lock), before any array or reader can see them; reads go through
// `&self` to bytes that are no longer written.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all of `file` read-only (private: no commit charge, and the process's view cannot
    /// change the file).
    pub(crate) fn read_only(file: &std::fs::File) -> std::io::Result<std::sync::Arc<Mapping>> {
        // SAFETY: the cache file is written once, under another name, and renamed into place
        // complete (`crate::layout_cache`); nothing rewrites or truncates it afterwards, the
        // same assumption every mmap-based loader makes of its weights. Nothing writes through
        // `base` of a read-only mapping: only `Arena::filled` writes, into an arena's own
        // shared mapping, and the arrays over this one are weights, which MLX never donates to
        // an op's output while the model holds them.
        let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(file)? };
        let base = map.as_ptr().cast_mut();
        Ok(std::sync::Arc::new(Mapping {
            map: Map::ReadOnly(map),
            base,
        }))
    }

    /// The mapped bytes `[offset, offset + len)`, `None` past the end.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let all: &[u8] = match &self.map {
            Map::ReadOnly(m) => m,
            Map::Shared(m) => m,
        };
        all.get(offset..offset.checked_add(len)?)
    }

    pub(crate) fn len(&self) -> usize {
        match &self.map {
            Map::ReadOnly(m) => m.len(),
            Map::Shared(m) => m.len(),
        }
    }

    /// The offset of `nbytes` at `address` when they lie inside the mapping.
    pub(crate) fn offset_of(&self, address: usize, nbytes: usize) -> Option<usize> {
        let offset = address.checked_sub(self.base as usize)?;
        (offset.checked_add(nbytes)? <= self.len()).then_some(offset)
    }
}

/// What an array over a [`Mapping`] holds on to (the bridge's deleter drops it).
pub(crate) struct MappingKeep(#[allow(dead_code)] std::sync::Arc<Mapping>);

/// The array of `shape` and `dtype` whose bytes are the mapping's at `offset`, without a copy.
/// The 8 bytes before `offset` must hold the array's byte count (what MLX's CPU allocator keeps
/// in front of its buffers; the bridge checks it), and `offset` be 8-aligned.
pub(crate) fn array_over(
    mapping: &std::sync::Arc<Mapping>,
    offset: usize,
    shape: &[i32],
    dtype: u8,
    nbytes: usize,
) -> Result<Handle, String> {
    if offset < 8 || !offset.is_multiple_of(8) || mapping.bytes(offset - 8, nbytes + 8).is_none() {
        return Err(format!(
            "an array of {nbytes} bytes at {offset} is outside the {} mapped bytes",
            mapping.len()
        ));
    }
    let address = mapping.base as usize + offset;
    let keep = Box::new(MappingKeep(mapping.clone()));
    with_lock(|| ffi::array_over_mapping(address, shape, dtype, keep))
        .map(Handle::new)
        .map_err(|e| e.what().to_owned())
}

/// Regions of a file being written, mapped shared, handed out one at a time (a bump allocator):
/// each array is written in place into the file's pages, so the layout a load builds is the
/// file the next load maps. Every region is reserved on disk (`fallocate`) before it is
/// written, so a full disk ends the writing with an error instead of a fault at a page.
pub(crate) struct Arena {
    mapping: std::sync::Arc<Mapping>,
    file: std::fs::File,
    /// The next free offset, and the end no region may pass.
    next: Mutex<usize>,
    limit: usize,
}

/// Alignment of every region's bytes (a cache line, and the kernels' widest load).
pub(crate) const ARENA_ALIGN: usize = 64;

impl Arena {
    /// `file` (new and empty) sized to `limit` bytes (sparse: nothing is stored until written)
    /// and mapped shared; regions start at `start`.
    pub(crate) fn new(file: std::fs::File, start: usize, limit: usize) -> std::io::Result<Arena> {
        file.set_len(limit as u64)?;
        // SAFETY: the file is this process's own, new (a name with its pid), and only this
        // arena writes it until it is renamed; its length is `limit` for as long as the map
        // lives (it is shortened only in `finish`, past every region handed out).
        let mut map = unsafe { memmap2::MmapOptions::new().len(limit).map_mut(&file)? };
        let base = map.as_mut_ptr();
        Ok(Arena {
            mapping: std::sync::Arc::new(Mapping {
                map: Map::Shared(map),
                base,
            }),
            file,
            next: Mutex::new(start),
            limit,
        })
    }

    pub(crate) fn mapping(&self) -> &std::sync::Arc<Mapping> {
        &self.mapping
    }

    pub(crate) fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// The end of the last region handed out.
    pub(crate) fn used(&self) -> usize {
        *self.next.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A region of `nbytes` (after its 8-byte size word, the bytes `ARENA_ALIGN`-aligned),
    /// reserved on disk; `fill` writes every byte of it. Returns the region's offset and what
    /// `fill` returned, or `None` when the arena is full or the disk refuses the space.
    pub(crate) fn filled<R>(
        &self,
        nbytes: usize,
        fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> R,
    ) -> Option<(usize, R)> {
        let offset = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let offset = (*next + 8).next_multiple_of(ARENA_ALIGN);
            let end = offset.checked_add(nbytes)?;
            if end > self.limit || !reserve(&self.file, *next, end - *next) {
                return None;
            }
            *next = end;
            offset
        };
        // SAFETY: `[offset - 8, offset + nbytes)` lies inside the map (`end <= limit`), was
        // handed out to this call alone (the lock above moved `next` past it), and no array or
        // reader refers to it yet; the disk blocks behind it are reserved, so writing its pages
        // cannot fault. The size word is 8-aligned (offset is a multiple of 64).
        let (word, bytes) = unsafe {
            let word = self.mapping.base.add(offset - 8).cast::<u64>();
            let bytes = std::slice::from_raw_parts_mut(
                self.mapping
                    .base
                    .add(offset)
                    .cast::<std::mem::MaybeUninit<u8>>(),
                nbytes,
            );
            (word, bytes)
        };
        // SAFETY: as above: the word is inside this call's region.
        unsafe { word.write(nbytes as u64) };
        Some((offset, fill(bytes)))
    }
}

/// Reserves `[offset, offset + len)` of `file` on disk (`fallocate`, keeping the size).
fn reserve(file: &std::fs::File, offset: usize, len: usize) -> bool {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return false;
    };
    // SAFETY: a plain system call on an open descriptor this function borrows; it reads no
    // memory of ours.
    unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) == 0 }
}

/// Bytes free to an unprivileged user on the file system holding `path`.
pub(crate) fn free_disk_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `stat` is written by the
    // call when it returns 0, and read only then.
    let stat = unsafe {
        if libc::statvfs(c.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}
