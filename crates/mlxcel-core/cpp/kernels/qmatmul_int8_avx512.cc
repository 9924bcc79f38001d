// The int8-activation quantized matmul with AVX-512 VNNI (`vpdpbusd`: unsigned weight bytes times
// signed activation bytes, four per 32-bit lane, added into int32 lanes). One lane per output row
// of a 16-row tile, so the integer sums need no horizontal reduction; x is broadcast four values
// at a time. See qmatmul.h for the exact computation (shared with the scalar reference, bitwise).
// Compiled without -m flags and without STL, like qmatmul_avx512.cc.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace mlxcel::kernels {
namespace {

// acc + w·(x's four bytes in every lane), with x broadcast from memory inside the instruction
// (GCC emits a separate vpbroadcastd for _mm512_set1_epi32 of a load, a second vector uop per
// multiply-add instruction).
MLXCEL_TARGET inline __m512i dot4(__m512i acc, __m512i w, const int8_t* x) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

template <bool HALF>
MLXCEL_TARGET inline __m512 load16(const void* base, int64_t at) {
  if constexpr (HALF) {
    const auto* halves = static_cast<const uint16_t*>(base) + at;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves)));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(base) + at);
  }
}

// Rows [m, m + R) of x (m a multiple of kInt8RowBlock) against one tile of 16 output rows. `w`
// is the tile's bytes, `sb` indexes its scales and biases ([K/group, 16] from there), `gshift`
// is log2(group_size / 32) (unused for groups of 16, G16).
template <int R, int BITS, bool HALF, bool G16>
MLXCEL_TARGET void tile(const QProblem& p, const uint8_t* w, int64_t sb, int gshift,
                        const int8_t* xq, const float* dx, const float* sx, const float* sh,
                        int m, int n0) {
  const int blocks = p.K / kInt8Block;
  // This row block's codes, 32 bytes (four values of each of 8 rows) per four values of K.
  const int8_t* xblock = xq + int8_x_index(m, 0, p.K);
  const float* dxb = dx + int8_block_index(m, 0, p.K);
  const float* sxb = sx + int8_block_index(m, 0, p.K);
  const float* shb = sh + 2 * int8_block_index(m, 0, p.K);
  constexpr int kRow = kInt8RowBlock * 4;
  // Small R: two integer sums per row (even and odd chunks) shorten the dependency chains;
  // integer addition is exact, so the split does not change the result.
  constexpr int S = R <= 2 ? 2 : 1;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < blocks; ++j) {
    if constexpr (G16) {
      // Groups of 16: one integer sum per half of the block (values 0-15, 16-31), then each
      // half's scale and bias FMAs, first half first (qmatmul.h).
      __m512i half_sum[2][R];
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < R; ++r) half_sum[h][r] = _mm512_setzero_si512();
      const int8_t* xj = xblock + static_cast<int64_t>(j) * 8 * kRow;
      if constexpr (BITS == 4) {
        // Chunk c holds values 8c .. 8c + 7: chunks 0-1 are the first half.
        const uint8_t* wb = w + static_cast<int64_t>(j) * 4 * 64;
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(wb + c * 64);
          const __m512i lo = _mm512_and_si512(v, low);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            half_sum[c / 2][r] = dot4(half_sum[c / 2][r], lo, (xj + (2 * c) * kRow + 4 * r));
            half_sum[c / 2][r] = dot4(half_sum[c / 2][r], hi, (xj + (2 * c + 1) * kRow + 4 * r));
          }
        }
      } else {
        // Chunk c holds values 4c .. 4c + 3: chunks 0-3 are the first half.
        const uint8_t* wb = w + static_cast<int64_t>(j) * 8 * 64;
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const __m512i v = _mm512_loadu_si512(wb + c * 64);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r)
            half_sum[c / 4][r] = dot4(half_sum[c / 4][r], v, (xj + c * kRow + 4 * r));
        }
      }
      const float* dxj = dxb + j * kInt8RowBlock;
      const float* shj = shb + 2 * j * kInt8RowBlock;
      for (int h = 0; h < 2; ++h) {
        const int64_t at = (sb + 2 * j + h) * kInt8TileRows;
        const __m512 scale = load16<HALF>(p.scales, at);
        const __m512 bias = load16<HALF>(p.biases, at);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 dot = _mm512_cvtepi32_ps(half_sum[h][r]);
          acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(dxj[r])), acc[r]);
          acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(shj[2 * r + h]), acc[r]);
        }
      }
      continue;
    }
    __m512i sum[S][R];
    for (int h = 0; h < S; ++h)
      for (int r = 0; r < R; ++r) sum[h][r] = _mm512_setzero_si512();
    const int8_t* xj = xblock + static_cast<int64_t>(j) * 8 * kRow;
    if constexpr (BITS == 4) {
      const uint8_t* wb = w + static_cast<int64_t>(j) * 4 * 64;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(wb + c * 64);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          sum[0][r] = dot4(sum[0][r], lo, (xj + (2 * c) * kRow + 4 * r));
          sum[S - 1][r] = dot4(sum[S - 1][r], hi, (xj + (2 * c + 1) * kRow + 4 * r));
        }
      }
    } else {
      const uint8_t* wb = w + static_cast<int64_t>(j) * 8 * 64;
#pragma GCC unroll 8
      for (int c = 0; c < 8; c += 2) {
        const __m512i v0 = _mm512_loadu_si512(wb + c * 64);
        const __m512i v1 = _mm512_loadu_si512(wb + (c + 1) * 64);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          sum[0][r] = dot4(sum[0][r], v0, (xj + c * kRow + 4 * r));
          sum[S - 1][r] = dot4(sum[S - 1][r], v1, (xj + (c + 1) * kRow + 4 * r));
        }
      }
    }
    const int64_t at = (sb + (j >> gshift)) * kInt8TileRows;
    const __m512 scale = load16<HALF>(p.scales, at);
    const __m512 bias = load16<HALF>(p.biases, at);
    const float* dxj = dxb + j * kInt8RowBlock;
    const float* sxj = sxb + j * kInt8RowBlock;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i total = S == 2 ? _mm512_add_epi32(sum[0][r], sum[S - 1][r]) : sum[0][r];
      const __m512 dot = _mm512_cvtepi32_ps(total);
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(dxj[r])), acc[r]);
      acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(sxj[r]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(p.y + static_cast<int64_t>(m + r) * p.N + n0, acc[r]);
}

template <int BITS, bool HALF, bool G16>
MLXCEL_TARGET void run(const QProblem& p, const int8_t* xq, const float* dx, const float* sx,
                       const float* sh, int m0, int m1, int t0, int t1) {
  const int64_t tile_bytes = static_cast<int64_t>(2) * p.K * BITS;
  const int groups = p.K / p.group_size;
  const int gshift =
      G16 ? 0 : __builtin_ctz(static_cast<unsigned>(p.group_size / kInt8Block));
  const auto* wbase = reinterpret_cast<const uint8_t*>(p.w);
  for (int t = t0; t < t1; ++t) {
    const uint8_t* w = wbase + t * tile_bytes;
    const int64_t sb = static_cast<int64_t>(t) * groups;
    const int n0 = t * kInt8TileRows;
    int m = m0;
    for (; m + 8 <= m1; m += 8)
      tile<8, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0);
    switch (m1 - m) {
      case 7: tile<7, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 6: tile<6, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 5: tile<5, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 4: tile<4, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 3: tile<3, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 2: tile<2, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      case 1: tile<1, BITS, HALF, G16>(p, w, sb, gshift, xq, dx, sx, sh, m, n0); break;
      default: break;
    }
  }
}

// quantize_x_int8 (qmatmul_int8.cc) sixteen values at a time; the same bits.
MLXCEL_TARGET void quantize_rows(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                                 float* sh) {
  const int blocks = K / kInt8Block;
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int m = 0; m < int8_rows(M); ++m) {
    for (int j = 0; j < blocks; ++j) {
      const int64_t b = int8_block_index(m, j, K);
      int8_t* out = xq + int8_x_index(m, j * kInt8Block, K);
      constexpr int kStride = kInt8RowBlock * 4;  // bytes between a row's groups of four
      if (m >= M) {
        for (int g = 0; g < kInt8Block / 4; ++g) __builtin_memset(out + g * kStride, 0, 4);
        dx[b] = sx[b] = sh[2 * b] = sh[2 * b + 1] = 0.0f;
        continue;
      }
      const float* v = x + static_cast<int64_t>(m) * K + j * kInt8Block;
      const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
      const float amax =
          _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, sign), _mm512_and_ps(hi, sign)));
      const __m512 t16 = _mm512_add_ps(lo, hi);
      const __m256 t8 =
          _mm256_add_ps(_mm512_castps512_ps256(t16), _mm512_extractf32x8_ps(t16, 1));
      const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
      const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
      // Only to find a NaN (which the max skips), as the scalar form does.
      const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
      const bool finite = __builtin_isfinite(amax) && !__builtin_isnan(sum);
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 scale = _mm512_set1_ps(inv);
      // Round to nearest even (the default rounding mode), as nearbyint does.
      const __m512i ilo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, scale));
      const __m512i ihi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, scale));
      const __m128i qlo = _mm512_cvtsepi32_epi8(ilo);
      const __m128i qhi = _mm512_cvtsepi32_epi8(ihi);
      alignas(16) int8_t codes[kInt8Block];
      _mm_store_si128(reinterpret_cast<__m128i*>(codes), qlo);
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + 16), qhi);
      for (int g = 0; g < kInt8Block / 4; ++g)
        __builtin_memcpy(out + g * kStride, codes + 4 * g, 4);
      // The quantized x's sums (step · Σ codes), as the scalar form (which says why). The codes
      // are within ±127, so the 32-bit lanes hold them before saturation changes anything.
      const int32_t sum_lo = _mm512_reduce_add_epi32(ilo), sum_hi = _mm512_reduce_add_epi32(ihi);
      const float step = finite ? amax / 127.0f : __builtin_nanf("");
      dx[b] = step;
      sh[2 * b] = step * static_cast<float>(sum_lo);
      sh[2 * b + 1] = step * static_cast<float>(sum_hi);
      sx[b] = step * static_cast<float>(sum_lo + sum_hi);
    }
  }
}

}  // namespace

void quantize_x_int8_avx512(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                            float* sh) {
  quantize_rows(x, M, K, xq, dx, sx, sh);
}

void int8_avx512(const QProblem& p, const int8_t* xq, const float* dx, const float* sx,
                 const float* sh, int m0, int m1, int t0, int t1) {
  const bool g16 = p.group_size == 16;
  if (p.bits == 4) {
    if (g16)
      p.half ? run<4, true, true>(p, xq, dx, sx, sh, m0, m1, t0, t1)
             : run<4, false, true>(p, xq, dx, sx, sh, m0, m1, t0, t1);
    else
      p.half ? run<4, true, false>(p, xq, dx, sx, sh, m0, m1, t0, t1)
             : run<4, false, false>(p, xq, dx, sx, sh, m0, m1, t0, t1);
  } else {
    if (g16)
      p.half ? run<8, true, true>(p, xq, dx, sx, sh, m0, m1, t0, t1)
             : run<8, false, true>(p, xq, dx, sx, sh, m0, m1, t0, t1);
    else
      p.half ? run<8, true, false>(p, xq, dx, sx, sh, m0, m1, t0, t1)
             : run<8, false, false>(p, xq, dx, sx, sh, m0, m1, t0, t1);
  }
}

}  // namespace mlxcel::kernels
