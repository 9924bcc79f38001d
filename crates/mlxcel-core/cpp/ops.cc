// Shape, layout and arithmetic ops: thin wrappers over mlx/ops.h.
#include <cmath>

#include "mlxcel-core/cpp/bridge.h"

#include "mlx/ops.h"

namespace mx = mlx::core;

namespace mlxcel {

// Defined in array.cc.
mx::Dtype dtype_from_code(uint8_t code);
mx::Shape to_shape(rust::Slice<const int32_t> dims);
std::unique_ptr<MlxArray> wrap(mx::array a);

std::unique_ptr<MlxArray> reshape(const MlxArray& a, rust::Slice<const int32_t> shape) {
  return wrap(mx::reshape(a.inner, to_shape(shape), mlxcel_stream()));
}

std::unique_ptr<MlxArray> transpose(const MlxArray& a, rust::Slice<const int32_t> axes) {
  return wrap(
      mx::transpose(a.inner, std::vector<int>(axes.begin(), axes.end()), mlxcel_stream()));
}

std::unique_ptr<MlxArray> swapaxes(const MlxArray& a, int32_t axis1, int32_t axis2) {
  return wrap(mx::swapaxes(a.inner, axis1, axis2, mlxcel_stream()));
}

std::unique_ptr<MlxArray> zeros(rust::Slice<const int32_t> shape, uint8_t dtype) {
  return wrap(mx::zeros(to_shape(shape), dtype_from_code(dtype), mlxcel_stream()));
}

std::unique_ptr<MlxArray> astype(const MlxArray& a, uint8_t dtype) {
  return wrap(mx::astype(a.inner, dtype_from_code(dtype), mlxcel_stream()));
}

std::unique_ptr<MlxArray> take(const MlxArray& a, const MlxArray& indices, int32_t axis) {
  return wrap(mx::take(a.inner, indices.inner, axis, mlxcel_stream()));
}

std::unique_ptr<MlxArray> concatenate(const ArrayList& list, int32_t axis) {
  return wrap(mx::concatenate(list.items, axis, mlxcel_stream()));
}

std::unique_ptr<MlxArray> slice(const MlxArray& a, rust::Slice<const int32_t> start,
                                rust::Slice<const int32_t> stop,
                                rust::Slice<const int32_t> strides) {
  return wrap(
      mx::slice(a.inner, to_shape(start), to_shape(stop), to_shape(strides), mlxcel_stream()));
}

std::unique_ptr<MlxArray> slice_update(const MlxArray& src, const MlxArray& update,
                                       rust::Slice<const int32_t> start,
                                       rust::Slice<const int32_t> stop,
                                       rust::Slice<const int32_t> strides) {
  return wrap(mx::slice_update(src.inner, update.inner, to_shape(start), to_shape(stop),
                               to_shape(strides), mlxcel_stream()));
}

std::unique_ptr<MlxArray> add(const MlxArray& a, const MlxArray& b) {
  return wrap(mx::add(a.inner, b.inner, mlxcel_stream()));
}
std::unique_ptr<MlxArray> subtract(const MlxArray& a, const MlxArray& b) {
  return wrap(mx::subtract(a.inner, b.inner, mlxcel_stream()));
}
std::unique_ptr<MlxArray> multiply(const MlxArray& a, const MlxArray& b) {
  return wrap(mx::multiply(a.inner, b.inner, mlxcel_stream()));
}
std::unique_ptr<MlxArray> divide(const MlxArray& a, const MlxArray& b) {
  return wrap(mx::divide(a.inner, b.inner, mlxcel_stream()));
}
std::unique_ptr<MlxArray> matmul(const MlxArray& a, const MlxArray& b) {
  return wrap(mx::matmul(a.inner, b.inner, mlxcel_stream()));
}

std::unique_ptr<MlxArray> silu(const MlxArray& a) {
  return wrap(mx::multiply(a.inner, mx::sigmoid(a.inner, mlxcel_stream()), mlxcel_stream()));
}

std::unique_ptr<MlxArray> tanh(const MlxArray& a) {
  return wrap(mx::tanh(a.inner, mlxcel_stream()));
}

// mlx-lm's gelu_approx: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
std::unique_ptr<MlxArray> gelu_tanh(const MlxArray& a) {
  const auto s = mlxcel_stream();
  const auto& x = a.inner;
  const auto dt = x.dtype();
  const auto cube = mx::multiply(mx::multiply(x, x, s), x, s);
  const auto inner = mx::add(x, mx::multiply(mx::array(0.044715f, dt), cube, s), s);
  const auto t = mx::tanh(mx::multiply(mx::array(std::sqrt(2.0f / 3.14159265358979323846f), dt),
                                       inner, s),
                          s);
  return wrap(mx::multiply(mx::multiply(mx::array(0.5f, dt), x, s),
                           mx::add(mx::array(1.0f, dt), t, s), s));
}

// gpt-oss's experts, as mlx-lm's swiglu_oai: the gate clamped above at `limit`, the linear half
// to [-limit, limit], then (up + 1) · gate · sigmoid(alpha · gate).
std::unique_ptr<MlxArray> clamped_swiglu(const MlxArray& gate, const MlxArray& up, float alpha,
                                         float limit) {
  const auto s = mlxcel_stream();
  const auto dt = gate.inner.dtype();
  const auto g = mx::minimum(gate.inner, mx::array(limit, dt), s);
  const auto x = mx::clip(up.inner, mx::array(-limit, dt), mx::array(limit, dt), s);
  const auto glu = mx::multiply(g, mx::sigmoid(mx::multiply(mx::array(alpha, dt), g, s), s), s);
  return wrap(mx::multiply(mx::add(x, mx::array(1.0f, dt), s), glu, s));
}

std::unique_ptr<MlxArray> softmax(const MlxArray& a, int32_t axis, bool precise) {
  return wrap(mx::softmax(a.inner, std::vector<int>{axis}, precise, mlxcel_stream()));
}

std::unique_ptr<MlxArray> argmax(const MlxArray& a, int32_t axis, bool keepdims) {
  return wrap(mx::argmax(a.inner, axis, keepdims, mlxcel_stream()));
}

}  // namespace mlxcel
