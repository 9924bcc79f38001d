// The gated activations of rowops.cc sixteen lanes at a time (chosen there where the CPU has
// AVX-512): the same polynomials as fastmath.h's scalar forms, which libm's expf (a call per
// element) and the compiler's failure to vectorize those forms had left at ~5% of a 1B-shape
// prefill. Compiled without -m flags, like the other *_avx512.cc files.
#include <cstdint>

#include "mlxcel-core/cpp/kernels/fastmath_avx512.h"
#include "mlxcel-core/cpp/kernels/rowops.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512dq,fma")))

namespace mlxcel::kernels {
namespace {

using namespace fast512;

// out[j] = act(g[j]) · u[j] over one row, the last partial vector masked.
template <typename Act>
MLXCEL_TARGET inline void gated_row(const float* g, const float* u, int n, float* out, Act act) {
  int j = 0;
  for (; j + 16 <= n; j += 16)
    _mm512_storeu_ps(out + j, _mm512_mul_ps(act(_mm512_loadu_ps(g + j)), _mm512_loadu_ps(u + j)));
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1u);
    const __m512 v = act(_mm512_maskz_loadu_ps(m, g + j));
    _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + j)));
  }
}

}  // namespace

MLXCEL_TARGET void swiglu_rows_avx512(const float* y, int M, int N, float* out) {
  const int f = N / 2;
  for (int m = 0; m < M; ++m) {
    const float* row = y + static_cast<int64_t>(m) * N;
    gated_row(row, row + f, f, out + static_cast<int64_t>(m) * f,
              [](__m512 g) MLXCEL_TARGET { return _mm512_mul_ps(g, sigmoid16(g)); });
  }
}

MLXCEL_TARGET void geglu_rows_avx512(const float* y, int M, int N, float* out) {
  const int f = N / 2;
  const __m512 c = _mm512_set1_ps(0.7978845608028654f);  // √(2/π)
  for (int m = 0; m < M; ++m) {
    const float* row = y + static_cast<int64_t>(m) * N;
    gated_row(row, row + f, f, out + static_cast<int64_t>(m) * f, [c](__m512 g) MLXCEL_TARGET {
      const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
      const __m512 inner = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), cube, g));
      const __m512 half_g = _mm512_mul_ps(_mm512_set1_ps(0.5f), g);
      return _mm512_mul_ps(half_g, _mm512_add_ps(_mm512_set1_ps(1.0f), tanh16(inner)));
    });
  }
}

}  // namespace mlxcel::kernels
