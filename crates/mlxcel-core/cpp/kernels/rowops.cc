#include "mlxcel-core/cpp/kernels/rowops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mlxcel-core/cpp/kernels/attention.h"
#include "mlxcel-core/cpp/kernels/fastmath.h"

namespace mlxcel::kernels {

void rms_norm_rows(const float* x, int M, int K, const float* w, float eps, float* out) {
  for (int m = 0; m < M; ++m) {
    const float* xr = x + static_cast<int64_t>(m) * K;
    float* o = out + static_cast<int64_t>(m) * K;
    float squares = 0.0f;
    for (int k = 0; k < K; ++k) squares += xr[k] * xr[k];
    const float scale = 1.0f / std::sqrt(squares / static_cast<float>(K) + eps);
    for (int k = 0; k < K; ++k) o[k] = xr[k] * scale * w[k];
  }
}

// Where the CPU lacks AVX-512: cloned per instruction set, the loops vectorized where the
// compiler manages it.
__attribute__((target_clones("avx2", "default")))
void swiglu_rows(const float* y, int M, int N, float* out, Isa isa) {
  if (isa >= Isa::Avx512 && best_isa() == Isa::Avx512) return swiglu_rows_avx512(y, M, N, out);
  const int f = N / 2;
  for (int m = 0; m < M; ++m) {
    const float* row = y + static_cast<int64_t>(m) * N;
    float* o = out + static_cast<int64_t>(m) * f;
#pragma omp simd
    for (int j = 0; j < f; ++j) {
      const float g = row[j];
      o[j] = g * sigmoid_fast(g) * row[f + j];
    }
  }
}

__attribute__((target_clones("avx2", "default")))
void geglu_rows(const float* y, int M, int N, float* out, Isa isa) {
  if (isa >= Isa::Avx512 && best_isa() == Isa::Avx512) return geglu_rows_avx512(y, M, N, out);
  const int f = N / 2;
  const float c = std::sqrt(2.0f / 3.14159265358979323846f);
  for (int m = 0; m < M; ++m) {
    const float* row = y + static_cast<int64_t>(m) * N;
    float* o = out + static_cast<int64_t>(m) * f;
#pragma omp simd
    for (int j = 0; j < f; ++j) {
      const float g = row[j];
      o[j] = 0.5f * g * (1.0f + tanh_fast(c * (g + 0.044715f * (g * g * g)))) * row[f + j];
    }
  }
}

void rope_tables(float position, const float* inv_freq, int half, float* cos_t, float* sin_t) {
  for (int j = 0; j < half; ++j) {
    const float theta = position * inv_freq[j];
    cos_t[j] = std::cos(theta);
    sin_t[j] = std::sin(theta);
  }
}

void rope_head(const float* x, float* y, const float* cos_t, const float* sin_t, int half) {
  for (int j = 0; j < half; ++j) {
    const float a = x[j], b = x[j + half];
    y[j] = a * cos_t[j] - b * sin_t[j];
    y[j + half] = b * cos_t[j] + a * sin_t[j];
  }
}

void attention_merge(const float* parts, int count, int64_t stride, int D, float sink,
                     float* out) {
  float max = sink;
  for (int s = 0; s < count; ++s) max = std::max(max, parts[s * stride]);
  // The sink's share of the denominator (it has no value); none without a sink.
  float sum = sink > -std::numeric_limits<float>::infinity() ? std::exp(sink - max) : 0.0f;
  for (int t = 0; t < D; ++t) out[t] = 0.0f;
  for (int s = 0; s < count; ++s) {
    const float* e = parts + s * stride;
    if (e[1] == 0.0f) continue;  // no key of this row in the range
    const float w = std::exp(e[0] - max);
    sum += w * e[1];
    for (int t = 0; t < D; ++t) out[t] += w * e[2 + t];
  }
  const float inv = 1.0f / sum;
  for (int t = 0; t < D; ++t) out[t] *= inv;
}

}  // namespace mlxcel::kernels
