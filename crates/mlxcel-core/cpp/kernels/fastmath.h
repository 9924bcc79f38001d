// Branch-free elementary functions in plain C++ that compilers vectorize (inside `omp simd`
// loops, or in the ISA-specific translation units that include them).
#pragma once

#include <cstdint>

namespace mlxcel::kernels {

// e^x for x <= 0 (Cephes' expf polynomial, relative error ~1e-7).
inline float exp_nonpositive_fast(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// tanh(x) = sign(x)·(1 − e^(−2|x|)) / (1 + e^(−2|x|)): absolute error ~1e-7 (relative error
// grows only where tanh is tiny, which GELU's 1 + tanh and soft-capping's cap·tanh absorb).
inline float tanh_fast(float x) {
  const float t = exp_nonpositive_fast(-2.0f * __builtin_fabsf(x));
  return __builtin_copysignf((1.0f - t) / (1.0f + t), x);
}

// 1 / (1 + e^(−x)) from one exp_nonpositive_fast of −|x|: t / (1 + t) below zero, where
// e^(−x) would overflow past x ≈ −88 (relative error ~2e-7).
inline float sigmoid_fast(float x) {
  const float t = exp_nonpositive_fast(-__builtin_fabsf(x));
  return (x >= 0.0f ? 1.0f : t) / (1.0f + t);
}

}  // namespace mlxcel::kernels
