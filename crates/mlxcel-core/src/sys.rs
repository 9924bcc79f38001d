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
    advise_huge_pages(address, nbytes);
    let result = fill(bytes);
    Ok((handle, result))
}

/// Asks for transparent huge pages under the whole huge pages of `[address, address + nbytes)`,
/// before they are first written: a large weight built on the heap is then read through a
/// fraction of the TLB entries (decode of gpt-oss's shape 4–6% faster here, docs/model.md).
/// Advice only: a system without them, or a range already touched, keeps what it has.
fn advise_huge_pages(address: usize, nbytes: usize) {
    let start = address.next_multiple_of(HUGE_PAGE);
    let end = (address + nbytes) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside an allocation of our own; `MADV_HUGEPAGE` changes how
        // its pages are provided, never their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
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
/// ([`Arena`]). Mapped at a huge-page boundary, so that [`Mapping::move_into_memory`] can put
/// its bytes, at the same addresses, into anonymous memory on huge pages. Unmapped when the
/// last array over it and the last `Arc` are gone.
pub(crate) struct Mapping {
    base: *mut u8,
    /// The bytes of the file the mapping covers (an arena's: its limit).
    len: usize,
    /// What `Drop` unmaps: `len` rounded up to pages.
    span: usize,
    /// Shared and writable (an [`Arena`]'s), or private and read-only.
    shared: bool,
    /// The mapped file, which [`Mapping::move_into_memory`] reads (`pread` copies from the page
    /// cache without faulting the mapping's pages in); closed once all of it has moved.
    file: Mutex<Option<std::fs::File>>,
}

// SAFETY: `base..base + span` is mapped for as long as the struct lives and never moved or
// unmapped before its `Drop`; `move_into_memory` replaces pages of it with pages holding the
// same bytes, at the same addresses. Bytes are written only through `Arena::filled`, into
// regions it hands out once each (a bump allocator under a lock), before any array or reader
// can see them; reads go through `&self` to bytes that are no longer written.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

/// Transparent huge pages' size on x86-64 and most arm64 kernels: the alignment that lets
/// the kernel map a moved region by whole huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// The system's page size.
fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Maps `[offset, offset + len)` of the file `fd` at `at` (`MAP_FIXED`): shared and writable,
/// or private and read-only.
///
/// # Safety
/// `at..at + len` must be address space of the caller's own, whose current pages nothing
/// relies on, and `offset` a multiple of pages.
unsafe fn map_file_at(
    at: *mut u8,
    len: usize,
    fd: std::os::fd::RawFd,
    offset: usize,
    shared: bool,
) -> std::io::Result<()> {
    let (prot, flags) = if shared {
        (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
    } else {
        (libc::PROT_READ, libc::MAP_PRIVATE)
    };
    let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    // SAFETY: as the caller promises.
    let mapped = unsafe { libc::mmap(at.cast(), len, prot, flags | libc::MAP_FIXED, fd, offset) };
    if mapped == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Address space of `span` bytes (a multiple of pages) starting at a [`HUGE_PAGE`] boundary,
/// reserved without access or commit charge: what `map_at` and `anonymous` place their pages
/// into.
fn reserve_aligned(span: usize) -> std::io::Result<*mut u8> {
    let padded = span
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| std::io::Error::other("mapping too large"))?;
    // SAFETY: a new private mapping at an address the kernel picks; nothing of ours is there.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            padded,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let raw = raw.cast::<u8>();
    let lead = (raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize;
    // SAFETY: both ranges lie inside the reservation just made and outside the aligned span
    // kept; unmapping them touches nothing else.
    unsafe {
        if lead > 0 {
            libc::munmap(raw.cast(), lead);
        }
        let tail = padded - lead - span;
        if tail > 0 {
            libc::munmap(raw.add(lead + span).cast(), tail);
        }
        Ok(raw.add(lead))
    }
}

impl Mapping {
    /// Maps `len` bytes of `file` at a huge-page boundary: private and read-only, or shared and
    /// writable.
    fn map(file: &std::fs::File, len: usize, shared: bool) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Ok(Mapping {
                base: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
                span: 0,
                shared,
                file: Mutex::new(None),
            });
        }
        let span = len.next_multiple_of(page_size());
        let base = reserve_aligned(span)?;
        // SAFETY: `base..base + span` is this function's own reservation, which nothing else
        // refers to.
        if let Err(error) = unsafe { map_file_at(base, span, file.as_raw_fd(), 0, shared) } {
            // SAFETY: the reservation above.
            unsafe { libc::munmap(base.cast(), span) };
            return Err(error);
        }
        Ok(Mapping {
            base,
            len,
            span,
            shared,
            file: Mutex::new(file.try_clone().ok()),
        })
    }

    /// Maps all of `file` read-only (private: no commit charge, and the process's view cannot
    /// change the file).
    pub(crate) fn read_only(file: &std::fs::File) -> std::io::Result<std::sync::Arc<Mapping>> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("file larger than the address space"))?;
        // SAFETY (of what the mapping then hands out): the cache file is written once, under
        // another name, and renamed into place complete (`crate::layout_cache`); nothing
        // rewrites or truncates it afterwards, the same assumption every mmap-based loader
        // makes of its weights. Nothing writes through `base` of a read-only mapping: only
        // `Arena::filled` writes, into an arena's own shared mapping, and the arrays over this
        // one are weights, which MLX never donates to an op's output while the model holds
        // them.
        Ok(std::sync::Arc::new(Mapping::map(file, len, false)?))
    }

    /// The mapped bytes `[offset, offset + len)`, `None` past the end.
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `[offset, end)` lies inside the `len` mapped bytes, which live as long as
        // `self`; no one writes them any more (see the `Send` impl).
        Some(unsafe { std::slice::from_raw_parts(self.base.add(offset), len) })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The offset of `nbytes` at `address` when they lie inside the mapping.
    pub(crate) fn offset_of(&self, address: usize, nbytes: usize) -> Option<usize> {
        let offset = address.checked_sub(self.base as usize)?;
        (offset.checked_add(nbytes)? <= self.len()).then_some(offset)
    }

    /// Puts the mapping's first `end` bytes into private anonymous memory (on transparent huge
    /// pages where the system grants them) at the same addresses, on a thread of its own, a
    /// chunk at a time: each chunk is copied into new memory, made read-only, and moved over
    /// the file's pages (`mremap`), so every array over the mapping keeps its address and
    /// reads the same bytes before, during and after. Decode reads such memory faster than a
    /// file's mapped page-cache pages on the systems measured (docs/model.md). Stops where the
    /// model is dropped first, or where the system refuses (the rest then stays mapped).
    /// The thread waits `delay` first. `done` is called on the thread with the bytes moved and
    /// the error that stopped it.
    pub(crate) fn move_into_memory(
        mapping: &std::sync::Arc<Mapping>,
        end: usize,
        delay: std::time::Duration,
        done: impl FnOnce(usize, Option<std::io::Error>) + Send + 'static,
    ) {
        let weak = std::sync::Arc::downgrade(mapping);
        let end = end
            .min(mapping.len)
            .next_multiple_of(page_size())
            .min(mapping.span);
        let moving = Moving::start();
        let spawned = std::thread::Builder::new()
            .name("mlxcel-layout-move".into())
            .spawn(move || {
                let _moving = moving;
                std::thread::sleep(delay);
                let mut moved = 0;
                while moved < end {
                    // The model may be gone: then so is the mapping, and there is nothing left
                    // to move.
                    let Some(mapping) = weak.upgrade() else {
                        return done(moved, None);
                    };
                    let n = MOVE_CHUNK.min(end - moved);
                    if let Err(e) = mapping.move_chunk(moved, n) {
                        return done(moved, Some(e));
                    }
                    moved += n;
                    if moved == end {
                        // Nothing reads the file any more (an arena's tail past `end` is
                        // still mapped, but holds no array): deleting it frees its disk.
                        mapping
                            .file
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .take();
                    }
                }
                done(moved, None)
            });
        if let Err(e) = spawned {
            eprintln!("mlxcel: the int8 layout stays mapped (no thread to move it: {e})");
        }
    }

    /// Moves `[offset, offset + n)` (page-aligned, inside `span`) into anonymous memory: see
    /// [`Mapping::move_into_memory`].
    fn move_chunk(&self, offset: usize, n: usize) -> std::io::Result<()> {
        let fresh = reserve_aligned(n)?;
        // SAFETY: `fresh..fresh + n` is the reservation just made, which nothing else refers
        // to; `MAP_FIXED` replaces only it.
        let at = unsafe {
            libc::mmap(
                fresh.cast(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        let unmap_fresh = || {
            // SAFETY: the new memory, which nothing but this function refers to.
            unsafe { libc::munmap(fresh.cast(), n) };
        };
        if at == libc::MAP_FAILED {
            let error = std::io::Error::last_os_error();
            unmap_fresh();
            return Err(error);
        }
        // SAFETY: `fresh..fresh + n` is new memory of our own, which nothing else refers to.
        let chunk = unsafe {
            libc::madvise(fresh.cast(), n, libc::MADV_HUGEPAGE);
            std::slice::from_raw_parts_mut(fresh, n)
        };
        // The file's bytes of the chunk, as long as it is now (an arena's file was shortened
        // to its index's end, which may end inside the last page); past its end, within the
        // last page, the new memory's zeros are what the mapping reads there too.
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(file) = file.as_ref() else {
            unmap_fresh();
            return Err(std::io::Error::other("the file is not open"));
        };
        let read = file.metadata().and_then(|m| {
            use std::os::unix::fs::FileExt;
            let in_file = usize::try_from(m.len())
                .unwrap_or(usize::MAX)
                .saturating_sub(offset)
                .min(n);
            file.read_exact_at(&mut chunk[..in_file], offset as u64)
        });
        if let Err(error) = read {
            unmap_fresh();
            return Err(error);
        }
        // SAFETY: `mprotect` narrows our own new memory to reading. `mremap` with
        // `MREMAP_FIXED` then replaces the pages at `base + offset` (`offset + n <= span`: the
        // mapping's own) in one step under the address-space lock: a concurrent reader either
        // still reads the file's page or, faulting, waits for the move and reads the moved
        // one, which holds the same bytes (the file is not written while mapped, see the
        // `Send` impl, and an arena's writes are in the page cache `pread` reads).
        unsafe {
            if libc::mprotect(fresh.cast(), n, libc::PROT_READ) != 0 {
                let error = std::io::Error::last_os_error();
                unmap_fresh();
                return Err(error);
            }
            let to = libc::mremap(
                fresh.cast(),
                n,
                n,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.base.add(offset).cast::<libc::c_void>(),
            );
            if to == libc::MAP_FAILED {
                let error = std::io::Error::last_os_error();
                unmap_fresh();
                // The kernel may have unmapped the destination before the move failed: map the
                // file's pages back in place, or stop the process rather than leave a hole
                // under the arrays.
                use std::os::fd::AsRawFd;
                let at = self.base.add(offset);
                if let Err(again) = map_file_at(at, n, file.as_raw_fd(), offset, self.shared) {
                    eprintln!(
                        "mlxcel: moving the int8 layout into memory failed ({error}) and its \
                         file could not be mapped back ({again}); stopping"
                    );
                    std::process::abort();
                }
                return Err(error);
            }
        }
        Ok(())
    }
}

/// The moves of [`Mapping::move_into_memory`] still running in this process.
static MOVES: (Mutex<usize>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// One running move, counted in [`MOVES`] while it lives.
struct Moving;

impl Moving {
    fn start() -> Moving {
        *MOVES.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Moving
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        let mut n = MOVES.0.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        MOVES.1.notify_all();
    }
}

/// Waits, `timeout` at most, until no int8 layout of this process is still being moved into
/// memory after its load (`MLXCEL_LAYOUT_MEMORY`, docs/environment.md); whether none is.
/// What a benchmark calls before it measures, so that it times the memory decode will read.
pub fn wait_for_layout_moves(timeout: std::time::Duration) -> bool {
    let n = MOVES.0.lock().unwrap_or_else(|p| p.into_inner());
    let (n, _) = MOVES
        .1
        .wait_timeout_while(n, timeout, |n| *n > 0)
        .unwrap_or_else(|p| p.into_inner());
    *n == 0
}

/// How much [`Mapping::move_into_memory`] copies and moves at a time: the extra memory it
/// holds while moving, and how long it holds the address space's lock.
const MOVE_CHUNK: usize = if cfg!(test) { 2 << 20 } else { 64 << 20 };

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.span > 0 {
            // SAFETY: `base..base + span` is this mapping's own (file pages or pages moved in
            // their place); the last array over it and the last `Arc` are gone.
            unsafe { libc::munmap(self.base.cast(), self.span) };
        }
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
        // SAFETY (of the writes `filled` makes through it): the file is this process's own,
        // new (a name with its pid), and only this arena writes it until it is renamed; its
        // length is `limit` for as long as regions are handed out (it is shortened only in
        // `finish`, past every region handed out).
        let mapping = Mapping::map(&file, limit, true)?;
        Ok(Arena {
            mapping: std::sync::Arc::new(mapping),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The `/proc/self/maps` line of the mapping that holds `address`.
    fn maps_line(address: usize) -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find(|l| {
                let range = l.split(' ').next().unwrap();
                let (a, b) = range.split_once('-').unwrap();
                let (a, b) = (
                    usize::from_str_radix(a, 16).unwrap(),
                    usize::from_str_radix(b, 16).unwrap(),
                );
                (a..b).contains(&address)
            })
            .map(str::to_owned)
    }

    /// A file of `len` bytes that are not all alike, its mapping, and the bytes.
    fn mapped(len: usize) -> (tempfile::NamedTempFile, std::sync::Arc<Mapping>, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 131 + i / 4096) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes).unwrap();
        file.flush().unwrap();
        let mapping = Mapping::read_only(file.as_file()).unwrap();
        (file, mapping, bytes)
    }

    /// The layout's bytes move into anonymous memory at the same addresses, chunk by chunk,
    /// while another thread keeps reading them: every read sees the file's bytes, the file is
    /// no longer mapped afterwards, and the moved memory is read-only, like the mapping was.
    #[test]
    fn a_mapping_moves_into_memory_under_its_readers() {
        // Three chunks and a partial page at the end.
        let len = 2 * MOVE_CHUNK + MOVE_CHUNK / 2 + 123;
        let (file, mapping, bytes) = mapped(len);
        let base = mapping.bytes(0, 1).unwrap().as_ptr() as usize;
        assert!(base.is_multiple_of(HUGE_PAGE), "mapped at a huge page");
        let path = file.path().to_str().unwrap().to_owned();
        assert!(maps_line(base).unwrap().contains(&path));

        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reader = {
            let (mapping, stop, reads) = (mapping.clone(), stop.clone(), reads.clone());
            let expected = bytes.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = reads.load(Ordering::Relaxed);
                    assert!(mapping.bytes(0, len).unwrap() == &expected[..], "read {n}");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // The reader reads before the move starts and after it ends.
        while reads.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        Mapping::move_into_memory(&mapping, len, Duration::ZERO, move |moved, error| {
            tx.send((moved, error.map(|e| e.to_string()))).unwrap();
        });
        let (moved, error) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert!(wait_for_layout_moves(Duration::from_secs(10)));
        let after = reads.load(Ordering::Relaxed);
        while reads.load(Ordering::Relaxed) < after + 2 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(error, None);
        assert_eq!(moved, len.next_multiple_of(page_size()));

        assert_eq!(mapping.bytes(0, 1).unwrap().as_ptr() as usize, base);
        assert!(mapping.bytes(0, len).unwrap() == &bytes[..]);
        for chunk in 0..3 {
            let line = maps_line(base + chunk * MOVE_CHUNK).unwrap();
            assert!(!line.contains(&path), "chunk {chunk} still mapped: {line}");
            assert!(line.contains(" r--p "), "chunk {chunk} read-only: {line}");
        }
        drop(mapping);
        assert!(maps_line(base).is_none_or(|l| !l.contains(" r--p 00000000 00:00 0 ")));
    }

    /// A model dropped before its layout moves ends the move: nothing is moved, and the
    /// mapping is gone.
    #[test]
    fn a_move_ends_with_its_mapping() {
        let (file, mapping, _) = mapped(3 * MOVE_CHUNK);
        let base = mapping.bytes(0, 1).unwrap().as_ptr() as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        Mapping::move_into_memory(&mapping, mapping.len(), Duration::from_secs(2), {
            move |moved, error| tx.send((moved, error.is_some())).unwrap()
        });
        drop(mapping);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(60)).unwrap(),
            (0, false)
        );
        let path = file.path().to_str().unwrap();
        assert!(maps_line(base).is_none_or(|l| !l.contains(path)));
    }

    /// An arena (the first load's file, written through a shared mapping) moves too, after its
    /// file was cut to the index's end inside the last page: the bytes written, the zeros past
    /// the end, and no error.
    #[test]
    fn an_arena_moves_into_memory_after_its_file_is_cut() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let arena = Arena::new(file.reopen().unwrap(), 64, 8 * MOVE_CHUNK).unwrap();
        let mut expected = Vec::new();
        for (i, nbytes) in [MOVE_CHUNK + 1000, 777, MOVE_CHUNK / 2 + 5]
            .into_iter()
            .enumerate()
        {
            let (offset, ()) = arena
                .filled(nbytes, |b| {
                    for (j, byte) in b.iter_mut().enumerate() {
                        byte.write((j * 7 + i) as u8);
                    }
                })
                .unwrap();
            expected.push((offset, nbytes, i));
        }
        let used = arena.used();
        // As `Writer::finish` leaves it: an index and trailer of a few bytes after the arrays.
        let end = used.next_multiple_of(64) + 40;
        assert!(!end.is_multiple_of(page_size()));
        arena.file().set_len(end as u64).unwrap();
        let mapping = arena.mapping().clone();
        let base = mapping.bytes(0, 1).unwrap().as_ptr() as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        Mapping::move_into_memory(&mapping, used, Duration::ZERO, move |moved, error| {
            tx.send((moved, error.map(|e| e.to_string()))).unwrap();
        });
        let (moved, error) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(error, None);
        assert_eq!(moved, used.next_multiple_of(page_size()));
        for (offset, nbytes, i) in expected {
            let bytes = mapping.bytes(offset, nbytes).unwrap();
            assert!(
                bytes
                    .iter()
                    .enumerate()
                    .all(|(j, &b)| b == (j * 7 + i) as u8)
            );
        }
        let path = file.path().to_str().unwrap();
        for at in [base, base + used - 1] {
            let line = maps_line(at).unwrap();
            assert!(!line.contains(path) && line.contains(" r--p "), "{line}");
        }
    }
}
