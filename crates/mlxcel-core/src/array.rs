//! [`Array`]: construction, queries, evaluation, read-back and the general ops.

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::sys::{self, Handle, MlxArray, ffi};

/// A lazily evaluated MLX array.
///
/// Ops build a graph; nothing is computed until [`Array::eval`], [`eval`] or a read-back
/// (`to_vec_*`). Clones are cheap: they share the same graph node (MLX arrays are refcounted),
/// which is also how a KV cache or a weight is shared between steps.
///
/// `Array` is `Send + Sync`: every call into MLX, including dropping an `Array`, is serialised
/// by one process-wide lock (see `src/sys.rs` for why MLX needs it).
pub struct Array {
    handle: Handle,
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .finish()
    }
}

impl Clone for Array {
    fn clone(&self) -> Array {
        Array::from_handle(sys::with_lock(|| Handle::new(ffi::array_clone(self.raw()))))
    }
}

/// Runs one bridge call under the MLX lock and wraps its result.
pub(crate) fn call(
    op: &'static str,
    f: impl FnOnce() -> Result<cxx::UniquePtr<MlxArray>, cxx::Exception>,
) -> Result<Array> {
    sys::with_lock(|| f().map(Handle::new))
        .map(Array::from_handle)
        .map_err(Error::mlx(op))
}

/// Builds a C++ list of `arrays` and runs `f` on it, all under the MLX lock.
pub(crate) fn with_list<R>(arrays: &[&Array], f: impl FnOnce(&sys::ArrayList) -> R) -> R {
    sys::with_lock(|| {
        let mut list = ffi::array_list_new();
        for a in arrays {
            ffi::array_list_push(list.pin_mut(), a.raw());
        }
        // `list` is dropped here, still under the lock.
        f(&list)
    })
}

fn checked_len(op: &'static str, len: usize, shape: &[i32], per_element: usize) -> Result<()> {
    let elements = shape
        .iter()
        .try_fold(1usize, |acc, &d| usize::try_from(d).ok().map(|d| acc * d));
    match elements {
        Some(n) if n * per_element == len => Ok(()),
        _ => Err(Error::DataLength {
            op,
            len,
            shape: shape.to_vec(),
            expected: elements.unwrap_or(0) * per_element,
        }),
    }
}

impl Array {
    pub(crate) fn from_handle(handle: Handle) -> Array {
        Array { handle }
    }

    pub(crate) fn raw(&self) -> &MlxArray {
        self.handle.get()
    }

    /// Copies `bytes`, laid out row-major as `dtype`, into a new array of `shape`.
    ///
    /// This is the path for tensors read from a file (e.g. a safetensors mmap): the bytes
    /// are copied exactly once, into memory owned by MLX, so the source may be dropped
    /// afterwards. `bytes` need not be aligned.
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        checked_len(
            "Array::from_bytes",
            bytes.len(),
            shape,
            dtype.size_in_bytes(),
        )?;
        call("from_bytes", || {
            ffi::array_from_bytes(bytes, shape, dtype.code())
        })
    }

    /// A new array of `shape` and `dtype` whose bytes `fill` writes (every one of them), from as
    /// many threads as it likes, before anything else can read them: a load that builds a
    /// layout in place, without a second copy. Returns the array and what `fill` returned.
    pub(crate) fn filled<R>(
        shape: &[i32],
        dtype: Dtype,
        fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> R,
    ) -> Result<(Array, R)> {
        let nbytes = Array::byte_len(shape, dtype)?;
        let (handle, result) = sys::alloc_and_fill(shape, dtype.code(), nbytes, fill)
            .map_err(Error::mlx("Array::filled"))?;
        Ok((Array::from_handle(handle), result))
    }

    /// The bytes of an array of `shape` and `dtype`; an error for a negative or overflowing
    /// shape.
    pub(crate) fn byte_len(shape: &[i32], dtype: Dtype) -> Result<usize> {
        shape
            .iter()
            .try_fold(1usize, |n, &d| {
                usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
            })
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()))
            .ok_or_else(|| Error::Mlx {
                op: "Array::byte_len",
                message: format!("shape {shape:?} is negative or too large"),
            })
    }

    /// The array of `shape` and `dtype` whose bytes are `mapping`'s at `offset`, without a copy
    /// (the layout cache, `crate::layout_cache`).
    pub(crate) fn over_mapping(
        mapping: &std::sync::Arc<sys::Mapping>,
        offset: usize,
        shape: &[i32],
        dtype: Dtype,
    ) -> Result<Array> {
        let nbytes = Array::byte_len(shape, dtype)?;
        sys::array_over(mapping, offset, shape, dtype.code(), nbytes)
            .map(Array::from_handle)
            .map_err(|message| Error::Mlx {
                op: "Array::over_mapping",
                message,
            })
    }

    /// Where this (computed) array's bytes start in `mapping`, if they lie in it.
    pub(crate) fn offset_in(&self, mapping: &sys::Mapping) -> Option<usize> {
        let address = sys::with_lock(|| ffi::array_data_address(self.raw()));
        mapping.offset_of(address, self.size() * self.dtype().size_in_bytes())
    }

    fn from_plain<T: sys::Plain>(
        op: &'static str,
        data: &[T],
        shape: &[i32],
        dtype: Dtype,
    ) -> Result<Array> {
        checked_len(op, data.len(), shape, 1)?;
        call(op, || {
            ffi::array_from_bytes(sys::as_bytes(data), shape, dtype.code())
        })
    }

    /// An f32 array of `shape` from row-major `data`.
    pub fn from_f32(data: &[f32], shape: &[i32]) -> Result<Array> {
        Array::from_plain("Array::from_f32", data, shape, Dtype::F32)
    }

    /// A u32 array of `shape` from row-major `data` (token ids, packed quantized weights).
    pub fn from_u32(data: &[u32], shape: &[i32]) -> Result<Array> {
        Array::from_plain("Array::from_u32", data, shape, Dtype::U32)
    }

    /// An i32 array of `shape` from row-major `data`.
    pub fn from_i32(data: &[i32], shape: &[i32]) -> Result<Array> {
        Array::from_plain("Array::from_i32", data, shape, Dtype::I32)
    }

    /// An f16 array from IEEE binary16 bit patterns.
    pub fn from_f16_bits(bits: &[u16], shape: &[i32]) -> Result<Array> {
        Array::from_plain("Array::from_f16_bits", bits, shape, Dtype::F16)
    }

    /// A bf16 array from bfloat16 bit patterns (the upper 16 bits of an f32).
    pub fn from_bf16_bits(bits: &[u16], shape: &[i32]) -> Result<Array> {
        Array::from_plain("Array::from_bf16_bits", bits, shape, Dtype::BF16)
    }

    /// A 0-dimensional f32 array, e.g. a scale to multiply by.
    pub fn scalar_f32(value: f32) -> Array {
        Array::from_f32(&[value], &[]).expect("one element always matches the empty shape")
    }

    /// An array of `shape` filled with zeros, allocated by MLX (no host buffer), e.g. a KV
    /// cache's backing store.
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        call("zeros", || ffi::zeros(shape, dtype.code()))
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> Vec<i32> {
        sys::with_lock(|| ffi::array_shape(self.raw()))
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        self.shape().iter().map(|&d| d as usize).product()
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        let code = sys::with_lock(|| ffi::array_dtype(self.raw()));
        // No op exposed by this crate produces complex64, the one MLX dtype not modelled.
        Dtype::from_code(code).expect("mlxcel-core arrays never have an unmodelled dtype")
    }

    /// A computed copy of this array in a row-contiguous buffer of its own (MLX's copy ops may
    /// share their input's buffer; this never does).
    pub fn deep_copy(&self) -> Result<Array> {
        call("deep_copy", || ffi::array_deep_copy(self.raw()))
    }

    /// Computes this array (and everything it depends on) now.
    pub fn eval(&self) -> Result<()> {
        sys::with_lock(|| ffi::array_eval(self.raw())).map_err(Error::mlx("eval"))
    }

    /// The number of elements (the product of the shape).
    fn element_count(&self) -> usize {
        self.shape().iter().map(|&d| d.max(0) as usize).product()
    }

    /// Evaluates and copies the elements out as f32 (converting from any dtype), row-major.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.element_count()];
        sys::with_lock(|| ffi::array_read_f32(self.raw(), &mut out))
            .map_err(Error::mlx("to_vec_f32"))?;
        Ok(out)
    }

    /// Evaluates and copies the elements out as f32, `row_len` of them into each vector in
    /// row-major order (the rows of a step's logits, each its caller's to keep), with no copy of
    /// the whole array in between. `row_len` must divide the element count.
    pub fn to_rows_f32(&self, row_len: usize) -> Result<Vec<Vec<f32>>> {
        let count = self.element_count();
        if row_len == 0 || !count.is_multiple_of(row_len) {
            return Err(Error::Mlx {
                op: "to_rows_f32",
                message: format!("{count} elements are not rows of {row_len}"),
            });
        }
        // Converted and evaluated once (if it is not f32 and row-contiguous already).
        let readable = call("to_rows_f32", || ffi::array_readable_f32(self.raw()))?;
        (0..count / row_len)
            .map(|row| {
                let mut out = vec![0.0; row_len];
                sys::with_lock(|| ffi::array_read_f32_at(readable.raw(), row * row_len, &mut out))
                    .map_err(Error::mlx("to_rows_f32"))?;
                Ok(out)
            })
            .collect()
    }

    /// Evaluates and copies the elements out as u32 (e.g. `argmax` results), row-major.
    pub fn to_vec_u32(&self) -> Result<Vec<u32>> {
        let mut out = vec![0; self.element_count()];
        sys::with_lock(|| ffi::array_read_u32(self.raw(), &mut out))
            .map_err(Error::mlx("to_vec_u32"))?;
        Ok(out)
    }

    /// Evaluates and copies the elements out as i32, row-major.
    pub fn to_vec_i32(&self) -> Result<Vec<i32>> {
        let mut out = vec![0; self.element_count()];
        sys::with_lock(|| ffi::array_read_i32(self.raw(), &mut out))
            .map_err(Error::mlx("to_vec_i32"))?;
        Ok(out)
    }

    /// The same elements with a new shape (one dimension may be `-1`).
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        call("reshape", || ffi::reshape(self.raw(), shape))
    }

    /// Permutes the axes: output axis `i` is input axis `axes[i]`.
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        call("transpose", || ffi::transpose(self.raw(), axes))
    }

    /// Swaps two axes (negative axes count from the end).
    pub fn swapaxes(&self, axis1: i32, axis2: i32) -> Result<Array> {
        call("swapaxes", || ffi::swapaxes(self.raw(), axis1, axis2))
    }

    /// Converts the elements to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        call("astype", || ffi::astype(self.raw(), dtype.code()))
    }

    /// Gathers the entries at integer `indices` along `axis`; the indexed axis is replaced by
    /// the shape of `indices` (embedding lookup: `table.take(&token_ids, 0)`).
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        call("take", || ffi::take(self.raw(), indices.raw(), axis))
    }

    /// The sub-array `start[i]..stop[i]` on every axis (stride 1).
    pub fn slice(&self, start: &[i32], stop: &[i32]) -> Result<Array> {
        self.slice_strided(start, stop, &vec![1; start.len()])
    }

    /// The sub-array `start[i]..stop[i]` with step `strides[i]` on every axis.
    pub fn slice_strided(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        call("slice", || ffi::slice(self.raw(), start, stop, strides))
    }

    /// A copy of `self` with `start[i]..stop[i]` replaced by `update` (the KV-cache write).
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array> {
        let strides = vec![1; start.len()];
        call("slice_update", || {
            ffi::slice_update(self.raw(), update.raw(), start, stop, &strides)
        })
    }

    /// Element-wise `self + other`, broadcasting.
    pub fn add(&self, other: &Array) -> Result<Array> {
        call("add", || ffi::add(self.raw(), other.raw()))
    }

    /// Element-wise `self - other`, broadcasting.
    pub fn subtract(&self, other: &Array) -> Result<Array> {
        call("subtract", || ffi::subtract(self.raw(), other.raw()))
    }

    /// Element-wise `self * other`, broadcasting.
    pub fn multiply(&self, other: &Array) -> Result<Array> {
        call("multiply", || ffi::multiply(self.raw(), other.raw()))
    }

    /// Element-wise `self / other`, broadcasting.
    pub fn divide(&self, other: &Array) -> Result<Array> {
        call("divide", || ffi::divide(self.raw(), other.raw()))
    }

    /// Matrix product over the last two axes, batching (and broadcasting) the others.
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        call("matmul", || ffi::matmul(self.raw(), other.raw()))
    }

    /// `x * sigmoid(x)`, element-wise.
    pub fn silu(&self) -> Result<Array> {
        call("silu", || ffi::silu(self.raw()))
    }

    /// `tanh(x)`, element-wise.
    pub fn tanh(&self) -> Result<Array> {
        call("tanh", || ffi::tanh(self.raw()))
    }

    /// GELU's tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, element-wise
    /// (mlx-lm's `gelu_approx`).
    pub fn gelu_tanh(&self) -> Result<Array> {
        call("gelu_tanh", || ffi::gelu_tanh(self.raw()))
    }

    /// gpt-oss's expert activation of gate `self` and linear half `up`:
    /// `(clamp(up, −limit, limit) + 1) · g · sigmoid(alpha · g)` with `g = min(self, limit)`,
    /// element-wise (mlx-lm's `swiglu_oai`).
    pub fn clamped_swiglu(&self, up: &Array, alpha: f32, limit: f32) -> Result<Array> {
        call("clamped_swiglu", || {
            ffi::clamped_swiglu(self.raw(), up.raw(), alpha, limit)
        })
    }

    /// Softmax along `axis`. `precise` accumulates in f32 for lower-precision inputs.
    pub fn softmax(&self, axis: i32, precise: bool) -> Result<Array> {
        call("softmax", || ffi::softmax(self.raw(), axis, precise))
    }

    /// Index of the maximum along `axis` (u32).
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        call("argmax", || ffi::argmax(self.raw(), axis, keepdims))
    }

    /// Joins `arrays` along `axis`; the other dimensions must agree.
    pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
        with_list(arrays, |list| ffi::concatenate(list, axis).map(Handle::new))
            .map(Array::from_handle)
            .map_err(Error::mlx("concatenate"))
    }
}

/// Evaluates several arrays together, sharing their common subgraphs.
pub fn eval(arrays: &[&Array]) -> Result<()> {
    with_list(arrays, ffi::array_list_eval).map_err(Error::mlx("eval"))
}
