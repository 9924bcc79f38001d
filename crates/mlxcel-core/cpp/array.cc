// Construction, metadata, evaluation and read-back of arrays; device and memory knobs.
#include "mlxcel-core/cpp/bridge.h"
#include "mlxcel-core/src/sys.rs.h"

#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/device.h"
#include "mlx/memory.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "mlx/version.h"

namespace mx = mlx::core;

namespace mlxcel {

// Codes shared with `Dtype` in src/dtype.rs.
mx::Stream mlxcel_stream() {
  static const mx::Stream stream = mx::new_thread_unsafe_stream(mx::Device(mx::Device::cpu));
  return stream;
}

mx::Dtype dtype_from_code(uint8_t code) {
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::uint16;
    case 3: return mx::uint32;
    case 4: return mx::uint64;
    case 5: return mx::int8;
    case 6: return mx::int16;
    case 7: return mx::int32;
    case 8: return mx::int64;
    case 9: return mx::float16;
    case 10: return mx::float32;
    case 11: return mx::float64;
    case 12: return mx::bfloat16;
    default: throw std::invalid_argument("mlxcel: unknown dtype code " + std::to_string(code));
  }
}

uint8_t dtype_code(mx::Dtype dtype) {
  switch (dtype.val()) {
    case mx::Dtype::Val::bool_: return 0;
    case mx::Dtype::Val::uint8: return 1;
    case mx::Dtype::Val::uint16: return 2;
    case mx::Dtype::Val::uint32: return 3;
    case mx::Dtype::Val::uint64: return 4;
    case mx::Dtype::Val::int8: return 5;
    case mx::Dtype::Val::int16: return 6;
    case mx::Dtype::Val::int32: return 7;
    case mx::Dtype::Val::int64: return 8;
    case mx::Dtype::Val::float16: return 9;
    case mx::Dtype::Val::float32: return 10;
    case mx::Dtype::Val::float64: return 11;
    case mx::Dtype::Val::bfloat16: return 12;
    default: return 255;  // complex64: never produced by mlxcel's ops.
  }
}

mx::Shape to_shape(rust::Slice<const int32_t> dims) {
  return mx::Shape(dims.begin(), dims.end());
}

std::unique_ptr<MlxArray> wrap(mx::array a) {
  return std::make_unique<MlxArray>(MlxArray{std::move(a)});
}

std::unique_ptr<MlxArray> array_from_bytes(rust::Slice<const uint8_t> bytes,
                                           rust::Slice<const int32_t> shape, uint8_t dtype) {
  mx::Dtype dt = dtype_from_code(dtype);
  size_t elements = 1;
  for (int32_t d : shape) {
    if (d < 0) throw std::invalid_argument("mlxcel: negative dimension in array shape");
    elements *= static_cast<size_t>(d);
  }
  size_t nbytes = elements * mx::size_of(dt);
  if (bytes.size() != nbytes) {
    throw std::invalid_argument("mlxcel: " + std::to_string(bytes.size()) +
                                " bytes given for an array of " + std::to_string(elements) +
                                " elements of " + std::to_string(mx::size_of(dt)) +
                                " bytes each");
  }
  // One copy, into memory owned by MLX's allocator: the source may be a borrowed mmap.
  mx::array out(mx::allocator::malloc(nbytes), to_shape(shape), dt);
  if (nbytes > 0) std::memcpy(out.data<uint8_t>(), bytes.data(), nbytes);
  return wrap(std::move(out));
}

std::unique_ptr<MlxArray> array_alloc(rust::Slice<const int32_t> shape, uint8_t dtype) {
  mx::Dtype dt = dtype_from_code(dtype);
  size_t elements = 1;
  for (int32_t d : shape) {
    if (d < 0) throw std::invalid_argument("mlxcel: negative dimension in array shape");
    elements *= static_cast<size_t>(d);
  }
  return wrap(mx::array(mx::allocator::malloc(elements * mx::size_of(dt)), to_shape(shape), dt));
}

std::unique_ptr<MlxArray> array_over_mapping(size_t address, rust::Slice<const int32_t> shape,
                                             uint8_t dtype, rust::Box<MappingKeep> keep) {
  mx::Dtype dt = dtype_from_code(dtype);
  size_t elements = 1;
  for (int32_t d : shape) {
    if (d < 0) throw std::invalid_argument("mlxcel: negative dimension in array shape");
    elements *= static_cast<size_t>(d);
  }
  const size_t nbytes = elements * mx::size_of(dt);
  // MLX's CPU allocator hands out a buffer as the address of a size word with the bytes after
  // it (`Buffer::raw_ptr` is the buffer plus 8, `size` reads the word). The mapped file keeps
  // that word in front of every array, so the buffer is the word's address and MLX reads the
  // bytes where they are mapped: no copy. The buffer is not owned by the allocator, so it is
  // never freed there; the deleter drops the Rust side's hold on the mapping instead.
  auto* word = reinterpret_cast<size_t*>(address - sizeof(size_t));
  if (address % alignof(size_t) != 0 || *word != nbytes) {
    throw std::invalid_argument("mlxcel: mapped array at " + std::to_string(address) +
                                " does not carry its size (" + std::to_string(nbytes) + ")");
  }
  auto hold = std::make_shared<rust::Box<MappingKeep>>(std::move(keep));
  mx::allocator::Data data(mx::allocator::Buffer(word),
                           [hold](mx::allocator::Buffer) mutable { hold.reset(); });
  return wrap(mx::array(std::move(data), to_shape(shape), dt));
}

size_t array_data_address(const MlxArray& a) {
  return reinterpret_cast<size_t>(a.inner.data<uint8_t>());
}

std::unique_ptr<MlxArray> array_clone(const MlxArray& a) { return wrap(a.inner); }

std::unique_ptr<MlxArray> array_deep_copy(const MlxArray& a) {
  // MLX's own ops may hand back their input's buffer (copy() shares it; a slice_update covering
  // the whole array returns the update), so the bytes are copied here, into a row-contiguous
  // buffer of its own.
  mx::array in = mx::contiguous(a.inner, false, mlxcel_stream());
  in.eval();
  mx::array out(mx::allocator::malloc(in.nbytes()), in.shape(), in.dtype());
  if (in.nbytes() > 0) std::memcpy(out.data<uint8_t>(), in.data<uint8_t>(), in.nbytes());
  return wrap(std::move(out));
}

rust::Vec<int32_t> array_shape(const MlxArray& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.inner.shape()) out.push_back(static_cast<int32_t>(d));
  return out;
}

uint8_t array_dtype(const MlxArray& a) { return dtype_code(a.inner.dtype()); }

void array_eval(const MlxArray& a) { mx::eval({a.inner}); }

void array_list_eval(const ArrayList& list) { mx::eval(list.items); }

// `a` as an evaluated, row-contiguous array of `dtype`. An array already evaluated in that type
// and row-contiguous (a step's logits after the step's eval) is `a` itself: no conversion nodes,
// and no second trip through the stream's thread (~0.1 ms a decode step on the default model).
mx::array readable(const MlxArray& a, mx::Dtype dtype) {
  const bool ready = a.inner.is_available() && a.inner.dtype() == dtype &&
                     a.inner.flags().row_contiguous && a.inner.data_size() == a.inner.size();
  if (ready) return a.inner;
  mx::array c =
      mx::contiguous(mx::astype(a.inner, dtype, mlxcel_stream()), false, mlxcel_stream());
  mx::eval({c});
  return c;
}

// Evaluates `a` converted to `dtype`, row-contiguous, and copies it into `out` (allocated by the
// caller from the shape: one copy, where pushing into a rust::Vec costs four FFI calls a value).
template <typename T>
void read_into(const MlxArray& a, mx::Dtype dtype, rust::Slice<T> out) {
  mx::array c = readable(a, dtype);
  if (c.size() != out.size()) {
    throw std::invalid_argument("reading " + std::to_string(c.size()) + " elements into room for " +
                                std::to_string(out.size()));
  }
  if (c.size() > 0) std::memcpy(out.data(), c.data<T>(), c.size() * sizeof(T));
}

void array_read_f32(const MlxArray& a, rust::Slice<float> out) { read_into(a, mx::float32, out); }

// `a` ready to be read as f32 (readable above), evaluated now if it was not: what
// array_read_f32_at reads row by row without converting it again for each row.
std::unique_ptr<MlxArray> array_readable_f32(const MlxArray& a) {
  return wrap(readable(a, mx::float32));
}

// Copies `out.size()` elements of `a` (row-major) from element `offset` on: one row of a step's
// logits straight into its own vector, with no whole-array copy in between.
void array_read_f32_at(const MlxArray& a, size_t offset, rust::Slice<float> out) {
  mx::array c = readable(a, mx::float32);
  if (offset > c.size() || out.size() > c.size() - offset) {
    throw std::invalid_argument("reading " + std::to_string(out.size()) + " elements from " +
                                std::to_string(offset) + " of " + std::to_string(c.size()));
  }
  if (out.size() > 0) std::memcpy(out.data(), c.data<float>() + offset, out.size() * sizeof(float));
}
void array_read_u32(const MlxArray& a, rust::Slice<uint32_t> out) {
  read_into(a, mx::uint32, out);
}
void array_read_i32(const MlxArray& a, rust::Slice<int32_t> out) { read_into(a, mx::int32, out); }

std::unique_ptr<ArrayList> array_list_new() { return std::make_unique<ArrayList>(); }
void array_list_push(ArrayList& list, const MlxArray& a) { list.items.push_back(a.inner); }
size_t array_list_len(const ArrayList& list) { return list.items.size(); }
std::unique_ptr<MlxArray> array_list_get(const ArrayList& list, size_t index) {
  return wrap(list.items.at(index));
}

void set_default_device_cpu() {
  mx::set_default_device(mx::Device(mx::Device::cpu));
  if (mlxcel_stream().device != mx::Device(mx::Device::cpu)) {
    throw std::runtime_error("mlxcel: the mlxcel stream is not on the CPU");
  }
}

size_t set_memory_limit(size_t bytes) { return mx::set_memory_limit(bytes); }
size_t mlx_active_memory() { return mx::get_active_memory(); }
size_t mlx_cache_memory() { return mx::get_cache_memory(); }
void mlx_release_unused_memory() {
  mx::clear_cache();
#if defined(__GLIBC__)
  malloc_trim(0);  // glibc keeps freed blocks below its mmap threshold in the heap
#endif
}

bool heap_keep_freed(size_t mmap_threshold, size_t trim_threshold) {
#if defined(__GLIBC__)
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1;
#else
  (void)mmap_threshold;
  (void)trim_threshold;
  return false;
#endif
}

rust::String mlx_version() { return rust::String(mx::version()); }

}  // namespace mlxcel
