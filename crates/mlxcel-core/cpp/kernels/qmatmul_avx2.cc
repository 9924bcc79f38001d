// AVX2 + FMA quantized matmul; see qmatmul_avx512.cc for why there are no -m flags and no STL.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET __attribute__((target("avx2,fma,f16c")))

namespace mlxcel::kernels {
namespace {
struct V {
  using reg = __m256;
  static constexpr int W = 8, MR = 2, NR = 4;
  // Most rows of x one GEMV pass serves (its accumulators fit the register file).
  static constexpr int GEMV_ROWS = kGemvMaxRows;
  MLXCEL_TARGET static reg zero() { return _mm256_setzero_ps(); }
  MLXCEL_TARGET static reg load(const float* p) { return _mm256_loadu_ps(p); }
  MLXCEL_TARGET static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  MLXCEL_TARGET static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  MLXCEL_TARGET static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  MLXCEL_TARGET static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  MLXCEL_TARGET static reg widen(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  MLXCEL_TARGET static reg set1(float v) { return _mm256_set1_ps(v); }
  MLXCEL_TARGET static float reduce(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  MLXCEL_TARGET static reg bytes8(__m128i v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  }
  MLXCEL_TARGET static void q4_chunk(const uint8_t* p, reg out[4]) {
    // Two zero-extensions of 8 bytes each, then the nibbles split inside the 32-bit lanes (as
    // on AVX-512: the shuffle unit is the scarce one): even positions, then odd ones.
    const __m256i mask = _mm256_set1_epi32(0x0F);
    const __m256i a =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i b =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    out[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
    out[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
    out[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    out[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }
  // Groups of 16: the per-register scales (or biases) of a chunk holding groups a then b
  // (q4_chunk's registers are a, b, a, b; q8_chunk's a, a, b, b).
  MLXCEL_TARGET static void pair4(float a, float b, reg out[4]) {
    out[0] = out[2] = _mm256_set1_ps(a);
    out[1] = out[3] = _mm256_set1_ps(b);
  }
  MLXCEL_TARGET static void pair8(float a, float b, reg out[4]) {
    out[0] = out[1] = _mm256_set1_ps(a);
    out[2] = out[3] = _mm256_set1_ps(b);
  }
  MLXCEL_TARGET static void q8_chunk(const uint8_t* p, reg out[4]) {
    for (int i = 0; i < 4; ++i)
      out[i] = bytes8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * i)));
  }
};
}  // namespace

#define GEMV_NAME avx2_gemv
#define GEMM_NAME avx2_gemm
#include "mlxcel-core/cpp/kernels/qmatmul_simd.inc"

}  // namespace mlxcel::kernels
