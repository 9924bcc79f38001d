// AVX-512 (F, BW, DQ, VL) quantized matmul. Compiled without -m flags: every function carries a
// target attribute and runs only when the CPU reports the features (dispatch in qmatmul.cc).
// No STL here: an inline library function instantiated with AVX-512 enabled could be picked by
// the linker for callers on CPUs without it.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace mlxcel::kernels {
namespace {
struct V {
  using reg = __m512;
  static constexpr int W = 16, MR = 4, NR = 4;
  // Most rows of x one GEMV pass serves (its accumulators fit the register file).
  static constexpr int GEMV_ROWS = kGemvMaxRowsAvx512;
  MLXCEL_TARGET static reg zero() { return _mm512_setzero_ps(); }
  MLXCEL_TARGET static reg load(const float* p) { return _mm512_loadu_ps(p); }
  MLXCEL_TARGET static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  MLXCEL_TARGET static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  MLXCEL_TARGET static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  MLXCEL_TARGET static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  MLXCEL_TARGET static reg widen(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  MLXCEL_TARGET static reg set1(float v) { return _mm512_set1_ps(v); }
  MLXCEL_TARGET static float reduce(reg v) { return _mm512_reduce_add_ps(v); }
  MLXCEL_TARGET static void q4_chunk(const uint8_t* p, reg out[2]) {
    // One zero-extension of the 16 bytes (the shuffle unit is the scarce one), then the low and
    // high nibbles of each 32-bit lane: the even then the odd positions.
    const __m512i v =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x0F)));
    out[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  // Groups of 16: the per-register scales (or biases) of a chunk holding groups a then b. A
  // 4-bit register's lane j holds positions 2j and 2j + 1 (group a for j < 8); an 8-bit
  // register holds 16 consecutive positions.
  MLXCEL_TARGET static void pair4(float a, float b, reg out[2]) {
    out[0] = out[1] = _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
  }
  MLXCEL_TARGET static void pair8(float a, float b, reg out[2]) {
    out[0] = _mm512_set1_ps(a);
    out[1] = _mm512_set1_ps(b);
  }
  MLXCEL_TARGET static void q8_chunk(const uint8_t* p, reg out[2]) {
    out[0] = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    out[1] = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  }
};
}  // namespace

#define GEMV_NAME avx512_gemv
#define GEMM_NAME avx512_gemm
#include "mlxcel-core/cpp/kernels/qmatmul_simd.inc"

}  // namespace mlxcel::kernels
