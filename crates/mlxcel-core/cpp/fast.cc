// mlx::core::fast (rms_norm, rope, scaled_dot_product_attention) and affine quantization.
#include "mlxcel-core/cpp/bridge.h"

#include "mlx/fast.h"
#include "mlx/ops.h"

namespace mx = mlx::core;

namespace mlxcel {

// Defined in array.cc.
std::unique_ptr<MlxArray> wrap(mx::array a);

std::unique_ptr<MlxArray> rms_norm(const MlxArray& x, const MlxArray& weight, float eps) {
  return wrap(mx::fast::rms_norm(x.inner, weight.inner, eps, mlxcel_stream()));
}

std::unique_ptr<MlxArray> rope(const MlxArray& x, int32_t dims, bool traditional, float base,
                               float scale, int32_t offset) {
  return wrap(mx::fast::rope(x.inner, dims, traditional, base, scale, offset, std::nullopt,
                             mlxcel_stream()));
}

std::unique_ptr<MlxArray> rope_with_freqs(const MlxArray& x, int32_t dims, bool traditional,
                                          float scale, int32_t offset, const MlxArray& freqs) {
  return wrap(mx::fast::rope(x.inner, dims, traditional, std::nullopt, scale, offset,
                             freqs.inner, mlxcel_stream()));
}

namespace {

// The sinks as MLX takes them: a [heads] array in q's dtype, or none.
std::optional<mx::array> sinks_of(const MlxArray& q, rust::Slice<const float> sinks) {
  if (sinks.empty()) return std::nullopt;
  mx::array s(sinks.data(), mx::Shape{static_cast<int>(sinks.size())}, mx::float32);
  return mx::astype(s, q.inner.dtype(), mlxcel_stream());
}

}  // namespace

std::unique_ptr<MlxArray> sdpa(const MlxArray& q, const MlxArray& k, const MlxArray& v,
                               float scale, bool causal, rust::Slice<const float> sinks) {
  return wrap(mx::fast::scaled_dot_product_attention(q.inner, k.inner, v.inner, scale,
                                                     causal ? "causal" : "", std::nullopt,
                                                     sinks_of(q, sinks), false, mlxcel_stream()));
}

std::unique_ptr<MlxArray> sdpa_with_mask(const MlxArray& q, const MlxArray& k,
                                         const MlxArray& v, float scale, const MlxArray& mask,
                                         rust::Slice<const float> sinks) {
  return wrap(mx::fast::scaled_dot_product_attention(q.inner, k.inner, v.inner, scale, "array",
                                                     mask.inner, sinks_of(q, sinks), false,
                                                     mlxcel_stream()));
}

std::unique_ptr<MlxArray> quantized_matmul(const MlxArray& x, const MlxArray& w,
                                           const MlxArray& scales, const MlxArray& biases,
                                           bool transpose, int32_t group_size, int32_t bits) {
  return wrap(mx::quantized_matmul(x.inner, w.inner, scales.inner, biases.inner, transpose,
                                   group_size, bits, "affine", mlxcel_stream()));
}

std::unique_ptr<MlxArray> dequantize(const MlxArray& w, const MlxArray& scales,
                                     const MlxArray& biases, int32_t group_size, int32_t bits) {
  return wrap(mx::dequantize(w.inner, scales.inner, biases.inner, group_size, bits, "affine",
                             std::nullopt, std::nullopt, mlxcel_stream()));
}

std::unique_ptr<ArrayList> quantize(const MlxArray& w, int32_t group_size, int32_t bits) {
  auto out = std::make_unique<ArrayList>();
  out->items = mx::quantize(w.inner, group_size, bits, "affine", std::nullopt, mlxcel_stream());
  return out;
}

}  // namespace mlxcel
