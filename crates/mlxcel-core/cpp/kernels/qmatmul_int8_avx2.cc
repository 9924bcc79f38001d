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

// How scales and biases are stored: f32 or f16 [N/16, groups, 16], or factored (qmatmul.h).
enum Scales { kF32, kF16, kFactored };

template <int SM>
MLXCEL_TARGET inline __m256 load8(const uint8_t* base, int64_t at) {
  if constexpr (SM == kF16) {
    const auto* halves = reinterpret_cast<const uint16_t*>(base) + at;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves)));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(base) + at);
  }
}

// Rows 8h .. 8h + 7 of tile t's scale (or bias) for group g: loaded, or d · float(c) when
// factored (the same f32 product the factoring checked).
// `tile` is the tile's first scale (f32/f16: its [groups, 16] rows) or first superblock
// (factored, `sb_bytes` each, 2^pshift groups per superblock).
template <int SM>
MLXCEL_TARGET inline __m256 factor8(const uint8_t* tile, int64_t sb_bytes, int pshift, int g,
                                    int h) {
  if constexpr (SM == kFactored) {
    const uint8_t* sb = tile + (g >> pshift) * sb_bytes;
    const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(sb) + 8 * h);
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        sb + 4 * kInt8TileRows + (g & ((1 << pshift) - 1)) * kInt8TileRows + 8 * h));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)));
  } else {
    return load8<SM>(tile, static_cast<int64_t>(g) * kInt8TileRows + h * 8);
  }
}

// A factored superblock's integers for group g, rows 8h .. 8h + 7, as int32.
MLXCEL_TARGET inline __m256i int32_factors(const uint8_t* sb, int g, int h) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
      sb + 4 * kInt8TileRows + g * kInt8TileRows + 8 * h)));
}

// Rows [m, m + R) of x (m a multiple of kInt8RowBlock) against half `h` (rows 8h..8h+7) of tile
// t. With groups of 16 (G16) each block is two parts of 16 values, each with its own integer
// sum and FMAs (qmatmul.h); otherwise one part of 32. BITS 5 and 6 are the compact layouts: the
// low nibbles as for 4 bits, the high bits after them. Factored weights take x per superblock
// (qmatmul.h): each part's integer sum times its sub-scale into an integer per superblock, and
// the floats once per superblock.
template <int R, int BITS, int SM, bool G16>
MLXCEL_TARGET void half_tile(const QProblem& p, const uint8_t* w, int64_t t, int gshift, int h,
                             const Int8X& x, int m, int n0) {
  constexpr bool kSuper = SM == kFactored;
  const int blocks = p.K / kInt8Block;
  const int8_t* xblock = x.q + int8_x_index(m, 0, p.K);
  const float* dxb = x.dx + (kSuper ? int8_sb_index(m, 0, p.K) : int8_block_index(m, 0, p.K));
  const float* sxb = kSuper ? nullptr : x.sx + int8_block_index(m, 0, p.K);
  const float* shb = kSuper ? nullptr : x.sh + 2 * int8_block_index(m, 0, p.K);
  const int16_t* sumb = kSuper ? x.sums + kInt8SbSums * int8_sb_index(m, 0, p.K) : nullptr;
  constexpr int kRow = kInt8RowBlock * 4;
  constexpr int kParts = G16 ? 2 : 1;  // parts of the block with their own group
  constexpr int kCodeBits = int8_code_bits(BITS);  // (the stored width)
  constexpr int kBlockBytes = 64 * kCodeBits;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i two = _mm256_set1_epi8(0x03);
  const __m256i one = _mm256_set1_epi8(0x01);
  const __m256i ones = _mm256_set1_epi16(1);
  // Where tile t's scales and biases start.
  const int64_t sb_bytes = SM == kFactored ? factored_superblock_bytes(p.group_size) : 0;
  const int pshift = SM == kFactored ? __builtin_ctz(static_cast<unsigned>(kSuperBlock / p.group_size)) : 0;
  const int64_t tile_at = SM == kFactored ? t * (p.K / kSuperBlock) * sb_bytes
                                          : t * (p.K / p.group_size) * kInt8TileRows *
                                                (SM == kF16 ? 2 : 4);
  const uint8_t* stile = static_cast<const uint8_t*>(p.scales) + tile_at;
  // Biases derived from the scales (QProblem::bias_scale) are not read: p.biases is then a
  // placeholder.
  const bool derived = p.bias_scale != 0.0f;
  const __m256 multiple = _mm256_set1_ps(p.bias_scale);
  const uint8_t* btile = derived ? stile : static_cast<const uint8_t*>(p.biases) + tile_at;
  __m256 acc[R];
  __m256i isum[R];  // (factored) Σ_g c·I_g of the current superblock
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    isum[r] = _mm256_setzero_si256();
  }
  for (int j = 0; j < blocks; ++j) {
    const int sj = j / (kSuperBlock / kInt8Block), jj = j % (kSuperBlock / kInt8Block);
    const int8_t* xj = xblock + static_cast<int64_t>(j) * 8 * kRow;
    const float* dxj = kSuper ? nullptr : dxb + j * kInt8RowBlock;  // (per block only)
    const uint8_t* wb = w + static_cast<int64_t>(j) * kBlockBytes + h * 32;
    // The first half's pass brings the tile's lines into L2 ahead of use (as the AVX-512
    // kernel does: qmatmul_int8_avx512.cc); the second half reads them from there.
    if (h == 0) {
#pragma GCC unroll 8
      for (int l = 0; l < kCodeBits; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wb) +
                                                   kInt8PrefetchAhead + 64 * l),
                     _MM_HINT_T1);
    }
    for (int part = 0; part < kParts; ++part) {
      // 16-bit pair sums: for 4 bits, of every value; otherwise of the low nibbles and of the
      // high parts (value = 16·high + low).
      __m256i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
      if constexpr (BITS == kE2m1Bits) {
        // E2M1 indices (qmatmul.h): each nibble's code looked up (codes 4 .. 28), then split as
        // the 5-bit form's are (code = 16·high + low), so the pair sums stay in 16 bits and the
        // totals are the same integers.
        const __m256i table = _mm256_broadcastsi128_si256(
            _mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4));
        for (int c = part * 4 / kParts; c < (part + 1) * 4 / kParts; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + c * 64));
          const __m256i ca = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low));
          const __m256i cb =
              _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
          const __m256i alo = _mm256_and_si256(ca, low), blo = _mm256_and_si256(cb, low);
          const __m256i ahi = _mm256_and_si256(_mm256_srli_epi16(ca, 4), one);
          const __m256i bhi = _mm256_and_si256(_mm256_srli_epi16(cb, 4), one);
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = xj + (2 * c) * kRow + 4 * r;
            lo_sum[r] = _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(alo, bcast4(xr)));
            lo_sum[r] =
                _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(blo, bcast4(xr + kRow)));
            hi_sum[r] = _mm256_add_epi16(hi_sum[r], _mm256_maddubs_epi16(ahi, bcast4(xr)));
            hi_sum[r] =
                _mm256_add_epi16(hi_sum[r], _mm256_maddubs_epi16(bhi, bcast4(xr + kRow)));
          }
        }
      } else if constexpr (BITS == 8) {
        for (int c = part * 8 / kParts; c < (part + 1) * 8 / kParts; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + c * 64));
          const __m256i lo = _mm256_and_si256(v, low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int r = 0; r < R; ++r) {
            const __m256i xr = bcast4(xj + c * kRow + 4 * r);
            lo_sum[r] = _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(lo, xr));
            hi_sum[r] = _mm256_add_epi16(hi_sum[r], _mm256_maddubs_epi16(hi, xr));
          }
        }
      } else {
        // The low nibbles: chunk c's low halves are values 8c .. 8c + 3, high halves 8c + 4 ..
        for (int c = part * 4 / kParts; c < (part + 1) * 4 / kParts; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + c * 64));
          const __m256i lo = _mm256_and_si256(v, low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = xj + (2 * c) * kRow + 4 * r;
            lo_sum[r] = _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(lo, bcast4(xr)));
            lo_sum[r] =
                _mm256_add_epi16(lo_sum[r], _mm256_maddubs_epi16(hi, bcast4(xr + kRow)));
          }
        }
        if constexpr (BITS == 6) {
          // Chunk e: values 16e + 4i .. 16e + 4i + 3 in bits 2i, 2i + 1.
          for (int e = part * 2 / kParts; e < (part + 1) * 2 / kParts; ++e) {
            const __m256i v =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + e * 64));
            for (int i = 0; i < 4; ++i) {
              const __m256i hv = _mm256_and_si256(_mm256_srli_epi16(v, 2 * i), two);
              for (int r = 0; r < R; ++r)
                hi_sum[r] = _mm256_add_epi16(
                    hi_sum[r],
                    _mm256_maddubs_epi16(hv, bcast4(xj + (4 * e + i) * kRow + 4 * r)));
            }
          }
        } else if constexpr (BITS == 5) {
          // Values 4i .. 4i + 3 in bit i.
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256));
          for (int i = part * 8 / kParts; i < (part + 1) * 8 / kParts; ++i) {
            const __m256i hv = _mm256_and_si256(_mm256_srli_epi16(v, i), one);
            for (int r = 0; r < R; ++r)
              hi_sum[r] = _mm256_add_epi16(
                  hi_sum[r], _mm256_maddubs_epi16(hv, bcast4(xj + i * kRow + 4 * r)));
          }
        }
      }
      if constexpr (kSuper) {
        const __m256i c =
            int32_factors(stile + sj * sb_bytes, G16 ? 2 * jj + part : (jj >> gshift), h);
        for (int r = 0; r < R; ++r) {
          __m256i total = _mm256_madd_epi16(lo_sum[r], ones);
          if constexpr (BITS != 4)
            total = _mm256_add_epi32(total,
                                     _mm256_slli_epi32(_mm256_madd_epi16(hi_sum[r], ones), 4));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(total, c));
        }
        continue;
      }
      const int g = G16 ? 2 * j + part : (j >> gshift);
      const __m256 scale = factor8<SM>(stile, sb_bytes, pshift, g, h);
      const __m256 bias = derived ? _mm256_mul_ps(scale, multiple)
                                  : factor8<SM>(btile, sb_bytes, pshift, g, h);
      for (int r = 0; r < R; ++r) {
        __m256i total = _mm256_madd_epi16(lo_sum[r], ones);
        if constexpr (BITS != 4)
          total =
              _mm256_add_epi32(total, _mm256_slli_epi32(_mm256_madd_epi16(hi_sum[r], ones), 4));
        const __m256 dot = _mm256_cvtepi32_ps(total);
        const float xsum = G16 ? shb[2 * (j * kInt8RowBlock + r) + part]
                               : sxb[j * kInt8RowBlock + r];
        acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(dxj[r])), acc[r]);
        acc[r] = _mm256_fmadd_ps(bias, _mm256_set1_ps(xsum), acc[r]);
      }
    }
    if constexpr (kSuper) {
      if (jj == kSuperBlock / kInt8Block - 1) {
        // The superblock's end: T = Σ_g cb·B_g (groups of 16: the 16 halves' sums; otherwise
        // the 8 blocks' sums, each block's group's integer), then the floats.
        const uint8_t* ssb = stile + sj * sb_bytes;
        const uint8_t* bsb = derived ? ssb : btile + sj * sb_bytes;
        const int16_t* sums = sumb + static_cast<int64_t>(sj) * kInt8RowBlock * kInt8SbSums;
        __m256i tsum[R];
        for (int r = 0; r < R; ++r) tsum[r] = _mm256_setzero_si256();
        for (int g = 0; g < (G16 ? 16 : 8); ++g) {
          const __m256i cb = int32_factors(bsb, G16 ? g : (g >> gshift), h);
          const int at = G16 ? g : 16 + g;
          for (int r = 0; r < R; ++r)
            tsum[r] = _mm256_add_epi32(
                tsum[r], _mm256_mullo_epi32(cb, _mm256_set1_epi32(sums[r * kInt8SbSums + at])));
        }
        const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(ssb) + 8 * h);
        const __m256 e = derived
                             ? _mm256_mul_ps(d, multiple)
                             : _mm256_loadu_ps(reinterpret_cast<const float*>(bsb) + 8 * h);
        const float* steps = dxb + static_cast<int64_t>(sj) * kInt8RowBlock;
        for (int r = 0; r < R; ++r) {
          const __m256 step = _mm256_set1_ps(steps[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, step), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tsum[r]), _mm256_mul_ps(e, step), acc[r]);
          isum[r] = _mm256_setzero_si256();
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    _mm256_storeu_ps(p.y + static_cast<int64_t>(m + r) * p.N + n0 + h * 8, acc[r]);
}

template <int BITS, int SM, bool G16>
MLXCEL_TARGET void run(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1) {
  // Rows of x per pass. The 16 registers hold R accumulators and R (4 bits) or 2R sums; 4-bit
  // codes with per-block scales take a whole block of eight rows (the compiler keeps some
  // accumulators in L1, touched once per block of 32 values, while the nibbles are unpacked
  // once for eight rows instead of four: 18% faster alone, Q4_0's shape of 4096 × 4096 at
  // M = 128, docs/kernels.md); factored 4-bit codes keep four (their R superblock sums too).
  constexpr int RM = BITS == 4 && SM != kFactored && !G16 ? 8 : BITS == 4 ? 4 : 2;
  const int64_t tile_bytes = static_cast<int64_t>(2) * p.K * int8_code_bits(BITS);
  const int gshift =
      G16 ? 0 : __builtin_ctz(static_cast<unsigned>(p.group_size / kInt8Block));
  const auto* wbase = reinterpret_cast<const uint8_t*>(p.w);
  for (int t = t0; t < t1; ++t) {
    const uint8_t* w = wbase + t * tile_bytes;
    const int n0 = t * kInt8TileRows;
    for (int h = 0; h < 2; ++h) {
      for (int m = m0; m < m1; m += RM) {
        // m0 is a multiple of kInt8RowBlock and RM divides it: a pass never straddles a block.
        switch (m1 - m < RM ? m1 - m : RM) {
          case 8:
            half_tile<(RM >= 8 ? 8 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 7:
            half_tile<(RM >= 7 ? 7 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 6:
            half_tile<(RM >= 6 ? 6 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 5:
            half_tile<(RM >= 5 ? 5 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 4:
            half_tile<(RM >= 4 ? 4 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 3:
            half_tile<(RM >= 3 ? 3 : 1), BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          case 2:
            half_tile<2, BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
          default:
            half_tile<1, BITS, SM, G16>(p, w, t, gshift, h, x, m, n0);
            break;
        }
      }
    }
  }
}

template <int BITS, int SM>
MLXCEL_TARGET void run_groups(const QProblem& p, const Int8X& x, int m0, int m1, int t0,
                              int t1) {
  if (p.group_size == 16)
    run<BITS, SM, true>(p, x, m0, m1, t0, t1);
  else
    run<BITS, SM, false>(p, x, m0, m1, t0, t1);
}

template <int BITS>
MLXCEL_TARGET void run_scales(const QProblem& p, const Int8X& x, int m0, int m1, int t0,
                              int t1) {
  if (p.factored)
    run_groups<BITS, kFactored>(p, x, m0, m1, t0, t1);
  else if (p.half)
    run_groups<BITS, kF16>(p, x, m0, m1, t0, t1);
  else
    run_groups<BITS, kF32>(p, x, m0, m1, t0, t1);
}

// The sum of the eight int32 lanes of a.
MLXCEL_TARGET inline int32_t hsum(__m256i a) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}

// 32 values times `scale` rounded to nearest even (the default rounding mode, as the scalar forms
// do): their codes as eight 32-bit groups of four, and the integer sums of each half. The codes
// are within ±127, so packing them with saturation changes nothing.
MLXCEL_TARGET inline __m256i codes32(const float* v, __m256 scale, int32_t* sum_lo,
                                     int32_t* sum_hi) {
  const __m256i c0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), scale));
  const __m256i c1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), scale));
  const __m256i c2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 16), scale));
  const __m256i c3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 24), scale));
  *sum_lo = hsum(_mm256_add_epi32(c0, c1));
  *sum_hi = hsum(_mm256_add_epi32(c2, c3));
  // Packed to bytes (each 128-bit lane in turn), then the groups of four put back in order.
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One block of 32 values of one row quantized (quantize_x_int8's arithmetic, eight values at a
// time; the same bits, as quantize_x_int8_avx512's): the 32 codes as eight 32-bit groups of
// four, and the block's step and sums at b. The pairwise sum is the tree qmatmul.h states:
// x[i] + x[i + 16] is v0 + v2 (i < 8) and v1 + v3 (i = 8..15), then halves folded in order.
MLXCEL_TARGET inline __m256i quantize_block(const float* v, int64_t b, float* dx, float* sx,
                                            float* sh) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
  const __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
  const __m256 top = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, sign), _mm256_and_ps(v1, sign)),
                                   _mm256_max_ps(_mm256_and_ps(v2, sign), _mm256_and_ps(v3, sign)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  // (Exact whatever the order when no value is a NaN; with one, the sum below is a NaN.)
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  const __m256 t8 = _mm256_add_ps(_mm256_add_ps(v0, v2), _mm256_add_ps(v1, v3));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  // Only to find a NaN (which the max skips), as the scalar form does.
  const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  const bool finite = __builtin_isfinite(amax) && !__builtin_isnan(sum);
  int32_t sum_lo, sum_hi;
  const __m256i codes =
      codes32(v, _mm256_set1_ps(finite && amax > 0.0f ? 127.0f / amax : 0.0f), &sum_lo, &sum_hi);
  const float step = finite ? amax / 127.0f : __builtin_nanf("");
  dx[b] = step;
  sh[2 * b] = step * static_cast<float>(sum_lo);
  sh[2 * b + 1] = step * static_cast<float>(sum_hi);
  sx[b] = step * static_cast<float>(sum_lo + sum_hi);
  return codes;
}

// Eight rows' codes of one block of 32 (eight 32-bit groups of four each) into the layout, which
// wants group g of all eight rows side by side: the 8 × 8 matrix of 32-bit groups transposed in
// registers and stored as 256 contiguous bytes.
MLXCEL_TARGET inline void store_groups(const __m256 (&c)[kInt8RowBlock], int8_t* to) {
  const __m256 a0 = _mm256_unpacklo_ps(c[0], c[1]), a1 = _mm256_unpackhi_ps(c[0], c[1]);
  const __m256 a2 = _mm256_unpacklo_ps(c[2], c[3]), a3 = _mm256_unpackhi_ps(c[2], c[3]);
  const __m256 a4 = _mm256_unpacklo_ps(c[4], c[5]), a5 = _mm256_unpackhi_ps(c[4], c[5]);
  const __m256 a6 = _mm256_unpacklo_ps(c[6], c[7]), a7 = _mm256_unpackhi_ps(c[6], c[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  float* dst = reinterpret_cast<float*>(to);
  _mm256_storeu_ps(dst + 0, _mm256_permute2f128_ps(b0, b4, 0x20));
  _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(b1, b5, 0x20));
  _mm256_storeu_ps(dst + 16, _mm256_permute2f128_ps(b2, b6, 0x20));
  _mm256_storeu_ps(dst + 24, _mm256_permute2f128_ps(b3, b7, 0x20));
  _mm256_storeu_ps(dst + 32, _mm256_permute2f128_ps(b0, b4, 0x31));
  _mm256_storeu_ps(dst + 40, _mm256_permute2f128_ps(b1, b5, 0x31));
  _mm256_storeu_ps(dst + 48, _mm256_permute2f128_ps(b2, b6, 0x31));
  _mm256_storeu_ps(dst + 56, _mm256_permute2f128_ps(b3, b7, 0x31));
}

MLXCEL_TARGET void quantize_rows(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                                 float* sh) {
  const int blocks = K / kInt8Block;
  for (int m0 = 0; m0 < M; m0 += kInt8RowBlock) {
    const int rows = M - m0 < kInt8RowBlock ? M - m0 : kInt8RowBlock;
    for (int j = 0; j < blocks; ++j) {
      __m256 c[kInt8RowBlock];
      for (int r = 0; r < kInt8RowBlock; ++r) {
        const int64_t b = int8_block_index(m0 + r, j, K);
        if (r < rows) {
          c[r] = _mm256_castsi256_ps(quantize_block(
              x + static_cast<int64_t>(m0 + r) * K + j * kInt8Block, b, dx, sx, sh));
        } else {
          c[r] = _mm256_setzero_ps();
          dx[b] = sx[b] = sh[2 * b] = sh[2 * b + 1] = 0.0f;
        }
      }
      store_groups(c, xq + int8_x_index(m0, j * kInt8Block, K));
    }
  }
}

// quantize_x_int8_sb (qmatmul_int8.cc) a block of eight rows at a time: each row's superblock
// step first, then its eight blocks of 32 codes as quantize_rows stores them, with the codes'
// sums per 16 and per 32.
MLXCEL_TARGET void quantize_rows_sb(const float* x, int M, int K, int8_t* xq, float* dx,
                                    int16_t* sums) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int m0 = 0; m0 < M; m0 += kInt8RowBlock) {
    const int rows = M - m0 < kInt8RowBlock ? M - m0 : kInt8RowBlock;
    for (int s = 0; s < K / kSuperBlock; ++s) {
      float inv[kInt8RowBlock];
      for (int r = 0; r < kInt8RowBlock; ++r) {
        const int64_t b = int8_sb_index(m0 + r, s, K);
        inv[r] = 0.0f;
        dx[b] = 0.0f;
        if (r >= rows) continue;
        const float* v = x + static_cast<int64_t>(m0 + r) * K + s * kSuperBlock;
        __m256 top = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int i = 0; i < kSuperBlock; i += 8) {
          const __m256 u = _mm256_loadu_ps(v + i);
          top = _mm256_max_ps(top, _mm256_and_ps(u, sign));
          nan = _mm256_or_ps(nan, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
        const bool finite = __builtin_isfinite(amax) && _mm256_movemask_ps(nan) == 0;
        inv[r] = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
        dx[b] = finite ? amax / 127.0f : __builtin_nanf("");
      }
      for (int jj = 0; jj < kSuperBlock / kInt8Block; ++jj) {
        const int k = s * kSuperBlock + jj * kInt8Block;
        __m256 c[kInt8RowBlock];
        for (int r = 0; r < kInt8RowBlock; ++r) {
          int16_t* bs = sums + kInt8SbSums * int8_sb_index(m0 + r, s, K);
          if (r >= rows) {
            c[r] = _mm256_setzero_ps();
            bs[2 * jj] = bs[2 * jj + 1] = bs[16 + jj] = 0;
            continue;
          }
          int32_t sum_lo, sum_hi;
          c[r] = _mm256_castsi256_ps(codes32(x + static_cast<int64_t>(m0 + r) * K + k,
                                             _mm256_set1_ps(inv[r]), &sum_lo, &sum_hi));
          bs[2 * jj] = static_cast<int16_t>(sum_lo);
          bs[2 * jj + 1] = static_cast<int16_t>(sum_hi);
          bs[16 + jj] = static_cast<int16_t>(sum_lo + sum_hi);
        }
        store_groups(c, xq + int8_x_index(m0, k, K));
      }
    }
  }
}

}  // namespace

void int8_avx2(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1) {
  switch (p.bits) {
    case 4:
      if (p.e2m1)
        run_scales<kE2m1Bits>(p, x, m0, m1, t0, t1);
      else
        run_scales<4>(p, x, m0, m1, t0, t1);
      break;
    case 5:
      run_scales<5>(p, x, m0, m1, t0, t1);
      break;
    case 6:
      run_scales<6>(p, x, m0, m1, t0, t1);
      break;
    default:
      run_scales<8>(p, x, m0, m1, t0, t1);
      break;
  }
}

void quantize_x_int8_avx2(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                          float* sh) {
  quantize_rows(x, M, K, xq, dx, sx, sh);
}

void quantize_x_int8_sb_avx2(const float* x, int M, int K, int8_t* xq, float* dx,
                             int16_t* sums) {
  quantize_rows_sb(x, M, K, xq, dx, sums);
}

}  // namespace mlxcel::kernels
