// The int8-activation quantized matmul for AVX2 CPUs without AVX-512 VNNI. `vpmaddubsw`
// multiplies unsigned weight bytes by signed activation bytes into 16-bit pair sums; weights are
// taken a nibble at a time (values ≤ 15, so eight pair sums fit in 16 bits without saturating)
// and `vpmaddwd` by ones widens them to one 32-bit sum per output row. The integer sums are exact,
// so the result is bitwise the scalar reference's (qmatmul.h), like the VNNI path's. A 16-row
// tile is served as two halves of 8 rows (one 256-bit register each).
// Compiled without -m flags and without STL, like qmatmul_avx512.cc.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET __attribute__((target("avx2,fma,f16c")))

namespace mlxcel::kernels {
namespace {

MLXCEL_TARGET inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <bool HALF>
MLXCEL_TARGET inline __m256 load8(const void* base, int64_t at) {
  if constexpr (HALF) {
    const auto* halves = static_cast<const uint16_t*>(base) + at;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves)));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(base) + at);
  }
}

// Rows [m, m + R) of x (m a multiple of kInt8RowBlock) against half `h` (rows 8h..8h+7) of one
// 16-row tile. With groups of 16 (G16) each block is two parts of 16 values, each with its own
// integer sum and FMAs (qmatmul.h); otherwise one part of 32.
template <int R, int BITS, bool HALF, bool G16>
MLXCEL_TARGET void half_tile(const QProblem& p, const uint8_t* w, int64_t sb, int gshift, int h,
                             const int8_t* xq, const float* dx, const float* sx, const float* sh,
                             int m, int n0) {
  const int blocks = p.K / kInt8Block;
  const int8_t* xblock = xq + int8_x_index(m, 0, p.K);
  const float* dxb = dx + int8_block_index(m, 0, p.K);
  const float* sxb = sx + int8_block_index(m, 0, p.K);
  const float* shb = sh + 2 * int8_block_index(m, 0, p.K);
  constexpr int kRow = kInt8RowBlock * 4;
  constexpr int kChunks = BITS == 4 ? 4 : 8;  // 64-byte chunks per block of 32 values
  constexpr int kParts = G16 ? 2 : 1;         // parts of the block with their own group
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int j = 0; j < blocks; ++j) {
    const int8_t* xj = xblock + static_cast<int64_t>(j) * 8 * kRow;
    const float* dxj = dxb + j * kInt8RowBlock;
    for (int part = 0; part < kParts; ++part) {
      // 16-bit pair sums: for 4 bits, of every value; for 8 bits, of the low nibbles and of the
      // high nibbles (value = 16·high + low).
      __m256i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
      const uint8_t* wb = w + static_cast<int64_t>(j) * kChunks * 64 + h * 32;
      for (int c = part * kChunks / kParts; c < (part + 1) * kChunks / kParts; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + c * 64));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          if constexpr (BITS == 4) {
            // lo holds values k..k+3 of chunk c (8 values), hi values k+4..k+7.
            const int8_t* xr = xj + (2 * c) * kRow + 4 * r;
            lo_sum[r] = _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(lo, bcast4(xr)));
            lo_sum[r] =
                _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(hi, bcast4(xr + kRow)));
          } else {
            const __m256i xr = bcast4(xj + c * kRow + 4 * r);
            lo_sum[r] = _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(lo, xr));
            hi_sum[r] = _mm256_add_epi16(hi_sum[r], _mm256_maddubs_epi16(hi, xr));
          }
        }
      }
      const int64_t group = G16 ? sb + 2 * j + part : sb + (j >> gshift);
      const int64_t at = group * kInt8TileRows + h * 8;
      const __m256 scale = load8<HALF>(p.scales, at);
      const __m256 bias = load8<HALF>(p.biases, at);
      for (int r = 0; r < R; ++r) {
        __m256i total = _mm256_madd_epi16(lo_sum[r], ones);
        if constexpr (BITS == 8)
          total =
              _mm256_add_epi32(total, _mm256_slli_epi32(_mm256_madd_epi16(hi_sum[r], ones), 4));
        const __m256 dot = _mm256_cvtepi32_ps(total);
        const float xsum = G16 ? shb[2 * (j * kInt8RowBlock + r) + part]
                               : sxb[j * kInt8RowBlock + r];
        acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(dxj[r])), acc[r]);
        acc[r] = _mm256_fmadd_ps(bias, _mm256_set1_ps(xsum), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    _mm256_storeu_ps(p.y + static_cast<int64_t>(m + r) * p.N + n0 + h * 8, acc[r]);
}

template <int BITS, bool HALF, bool G16>
MLXCEL_TARGET void run(const QProblem& p, const int8_t* xq, const float* dx, const float* sx,
                       const float* sh, int m0, int m1, int t0, int t1) {
  // Rows of x per pass: the 16 registers hold R accumulators and R (4 bits) or 2R (8 bits) sums.
  constexpr int RM = BITS == 4 ? 4 : 2;
  const int64_t tile_bytes = static_cast<int64_t>(2) * p.K * BITS;
  const int groups = p.K / p.group_size;
  const int gshift =
      G16 ? 0 : __builtin_ctz(static_cast<unsigned>(p.group_size / kInt8Block));
  const auto* wbase = reinterpret_cast<const uint8_t*>(p.w);
  for (int t = t0; t < t1; ++t) {
    const uint8_t* w = wbase + t * tile_bytes;
    const int64_t sb = static_cast<int64_t>(t) * groups;
    const int n0 = t * kInt8TileRows;
    for (int h = 0; h < 2; ++h) {
      for (int m = m0; m < m1; m += RM) {
        // m0 is a multiple of kInt8RowBlock and RM divides it: a pass never straddles a block.
        switch (m1 - m < RM ? m1 - m : RM) {
          case 4:
            half_tile<(RM >= 4 ? 4 : 1), BITS, HALF, G16>(p, w, sb, gshift, h, xq, dx, sx, sh,
                                                          m, n0);
            break;
          case 3:
            half_tile<(RM >= 3 ? 3 : 1), BITS, HALF, G16>(p, w, sb, gshift, h, xq, dx, sx, sh,
                                                          m, n0);
            break;
          case 2:
            half_tile<2, BITS, HALF, G16>(p, w, sb, gshift, h, xq, dx, sx, sh, m, n0);
            break;
          default:
            half_tile<1, BITS, HALF, G16>(p, w, sb, gshift, h, xq, dx, sx, sh, m, n0);
            break;
        }
      }
    }
  }
}

}  // namespace

void int8_avx2(const QProblem& p, const int8_t* xq, const float* dx, const float* sx,
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
