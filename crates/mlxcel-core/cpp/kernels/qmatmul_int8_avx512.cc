// The int8-activation quantized matmul with AVX-512 VNNI (`vpdpbusd`: unsigned weight bytes times
// signed activation bytes, four per 32-bit lane, added into int32 lanes). One lane per output row
// of a 16-row tile, so the integer sums need no horizontal reduction; x is broadcast four values
// at a time. Every int8 layout: 4- and 8-bit codes, the compact 5- and 6-bit codes (widened to
// bytes in registers: the low nibble or'ed with the high bits moved into place), f32, f16 or
// factored scales, groups of 16 or more. See qmatmul.h for the exact computation (shared with the
// scalar reference, bitwise).
// Compiled without -m flags and without STL, like qmatmul_avx512.cc.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/int8_layout_avx512.h"
#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace mlxcel::kernels {
namespace {

using namespace layout512;

// acc + w·(x's four bytes in every lane), with x broadcast from memory inside the instruction
// (GCC emits a separate vpbroadcastd for _mm512_set1_epi32 of a load, a second vector uop per
// multiply-add instruction).
MLXCEL_TARGET inline __m512i dot4(__m512i acc, __m512i w, const int8_t* x) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// How far ahead of the block being multiplied its tile's weight bytes are prefetched, and into
// which level. One core keeps only as many weight lines in flight as its out-of-order window
// holds (a block's ~40 vector instructions per 256 bytes fill the schedulers first), and a
// prefetch into L1 (`prefetcht0`) holds one of L1's few miss buffers until its line arrives:
// ~10-13 GB/s per core here. Prefetching 4 KiB ahead into L1 raised one thread's decode of
// Qwen2.5-3B's shape from 5.8 to 6.8 tok/s; prefetching 8 KiB ahead into L2 (`prefetcht1`,
// which the L2's deeper miss queue serves while the L1 stays free for the loads) raised one
// thread's decode of Llama-3.2-1B's shape from 12.5-13.3 to 18.6-21.3 tok/s, and two threads'
// from 21-27 to 28-34 (docs/kernels.md). The addresses are computed on integers, and a prefetch
// past a buffer's end never faults.
constexpr int64_t kPrefetchAhead = kInt8PrefetchAhead;

// Values 4Q .. 4Q + 3 of a block for rows [m, m + R) of x: into the first or second integer
// sum (even or odd Q when S = 2).
template <int Q, int R, int S, int BITS>
MLXCEL_TARGET inline void step(__m512i (&sum)[S][R], const uint8_t* wb, const int8_t* xj) {
  constexpr int kRow = kInt8RowBlock * 4;
  constexpr int h = S == 2 ? Q % 2 : 0;
  const __m512i v = codes<BITS, Q>(wb);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sum[h][r] = dot4(sum[h][r], v, xj + Q * kRow + 4 * r);
}

// acc + (the pair of int16 in each lane of a)·(the pair at b, in every lane), widened to int32.
MLXCEL_TARGET inline __m512i dot2(__m512i acc, __m512i a, const int16_t* b) {
  __asm__("vpdpwssd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(a), "m"(*reinterpret_cast<const int32_t*>(b)));
  return acc;
}

// A factored superblock's integers for group g (of the 16 rows), as int32.
MLXCEL_TARGET inline __m512i int32_factors(const uint8_t* sb, int g) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(sb + 4 * kInt8TileRows + g * kInt8TileRows)));
}

// The integers of groups ga and gb as int16 pairs: ga's in the low half of each lane, gb's in
// the high half.
MLXCEL_TARGET inline __m512i int16_pairs(const uint8_t* sb, int ga, int gb) {
  return _mm512_or_si512(_mm512_and_si512(int32_factors(sb, ga), _mm512_set1_epi32(0xFFFF)),
                         _mm512_slli_epi32(int32_factors(sb, gb), 16));
}

// Rows [m, m + R) of x (m a multiple of kInt8RowBlock) against one tile of 16 output rows. `w`
// is the tile's bytes, `stile`/`btile` its scales and biases (factor16), `gshift` is
// log2(group_size / 32) (unused for groups of 16, G16). Factored weights take x per superblock
// (qmatmul.h): each group's integer sum times its sub-scale into an integer per superblock, and
// the floats once per superblock.
template <int R, int BITS, int SM, bool G16>
MLXCEL_TARGET void tile(const QProblem& p, const uint8_t* w, const uint8_t* stile,
                        const uint8_t* btile, int64_t sb_bytes, int pshift, int gshift,
                        const Int8X& x, int m, int n0) {
  constexpr bool kSuper = SM == kFactored;
  constexpr int kCodeBits = int8_code_bits(BITS);  // (the stored width)
  const int blocks = p.K / kInt8Block;
  // This row block's codes, 32 bytes (four values of each of 8 rows) per four values of K.
  const int8_t* xblock = x.q + int8_x_index(m, 0, p.K);
  const float* dxb = x.dx + (kSuper ? int8_sb_index(m, 0, p.K) : int8_block_index(m, 0, p.K));
  const float* sxb = kSuper ? nullptr : x.sx + int8_block_index(m, 0, p.K);
  const float* shb = kSuper ? nullptr : x.sh + 2 * int8_block_index(m, 0, p.K);
  const int16_t* sumb = kSuper ? x.sums + kInt8SbSums * int8_sb_index(m, 0, p.K) : nullptr;
  constexpr int kRow = kInt8RowBlock * 4;
  // Integer sums per row: groups of 16 need one per half of the block (values 0-15, 16-31, one
  // half at a time, below); otherwise small R takes two (even and odd chunks) to shorten the
  // dependency chains (integer addition is exact, so the split does not change the result).
  constexpr int S = R <= 2 ? 2 : 1;
  // Biases as a multiple of the scales (QProblem::bias_scale): the same f32 bits, not read.
  const bool derived = p.bias_scale != 0.0f;
  const __m512 multiple = _mm512_set1_ps(p.bias_scale);
  __m512 acc[R];
  // (factored) Σ_g c·I_g of the current superblock, per row.
  __m512i isum[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    isum[r] = _mm512_setzero_si512();
  }
  for (int j = 0; j < blocks; ++j) {
    const int8_t* xj = xblock + static_cast<int64_t>(j) * 8 * kRow;
    const uint8_t* wb = w + static_cast<int64_t>(j) * 64 * kCodeBits;
#pragma GCC unroll 8
    for (int l = 0; l < kCodeBits; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wb) +
                                                 kPrefetchAhead + 64 * l),
                   _MM_HINT_T1);
    const float* dxj = kSuper ? nullptr : dxb + j * kInt8RowBlock;  // (per block only)
    // (factored) this block's superblock and its place in it
    const int sj = j / (kSuperBlock / kInt8Block), jj = j % (kSuperBlock / kInt8Block);
    const uint8_t* ssb = stile + sj * sb_bytes;
    if constexpr (G16) {
      // Each half's sums, then its scale and bias FMAs, first half first (qmatmul.h): the
      // second half's sums start after the first's are folded in, so one set of integer sums
      // is live at a time and the accumulators stay in registers.
      const float* shj = kSuper ? nullptr : shb + 2 * j * kInt8RowBlock;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m512i sum[1][R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) sum[0][r] = _mm512_setzero_si512();
        if (h == 0) {
          step<0, R, 1, BITS>(sum, wb, xj);
          step<1, R, 1, BITS>(sum, wb, xj);
          step<2, R, 1, BITS>(sum, wb, xj);
          step<3, R, 1, BITS>(sum, wb, xj);
        } else {
          step<4, R, 1, BITS>(sum, wb, xj);
          step<5, R, 1, BITS>(sum, wb, xj);
          step<6, R, 1, BITS>(sum, wb, xj);
          step<7, R, 1, BITS>(sum, wb, xj);
        }
        if constexpr (kSuper) {
          const __m512i c = int32_factors(ssb, 2 * jj + h);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r)
            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sum[0][r], c));
        } else {
          const __m512 scale = factor16<SM>(stile, sb_bytes, pshift, 2 * j + h);
          const __m512 bias = derived ? _mm512_mul_ps(scale, multiple)
                                      : factor16<SM>(btile, sb_bytes, pshift, 2 * j + h);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m512 dot = _mm512_cvtepi32_ps(sum[0][r]);
            acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(dxj[r])), acc[r]);
            acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(shj[2 * r + h]), acc[r]);
          }
        }
      }
    } else {
      __m512i sum[S][R];
#pragma GCC unroll 2
      for (int h = 0; h < S; ++h)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) sum[h][r] = _mm512_setzero_si512();
      step<0, R, S, BITS>(sum, wb, xj);
      step<1, R, S, BITS>(sum, wb, xj);
      step<2, R, S, BITS>(sum, wb, xj);
      step<3, R, S, BITS>(sum, wb, xj);
      step<4, R, S, BITS>(sum, wb, xj);
      step<5, R, S, BITS>(sum, wb, xj);
      step<6, R, S, BITS>(sum, wb, xj);
      step<7, R, S, BITS>(sum, wb, xj);
      if constexpr (kSuper) {
        const __m512i c = int32_factors(ssb, jj >> gshift);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i total = S == 2 ? _mm512_add_epi32(sum[0][r], sum[S - 1][r]) : sum[0][r];
          isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(total, c));
        }
      } else {
        const __m512 scale = factor16<SM>(stile, sb_bytes, pshift, j >> gshift);
        const __m512 bias = derived ? _mm512_mul_ps(scale, multiple)
                                    : factor16<SM>(btile, sb_bytes, pshift, j >> gshift);
        const float* sxj = sxb + j * kInt8RowBlock;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i total = S == 2 ? _mm512_add_epi32(sum[0][r], sum[S - 1][r]) : sum[0][r];
          const __m512 dot = _mm512_cvtepi32_ps(total);
          acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(dxj[r])), acc[r]);
          acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(sxj[r]), acc[r]);
        }
      }
    }
    if constexpr (kSuper) {
      if (jj == kSuperBlock / kInt8Block - 1) {
        // The superblock's end: T = Σ_g cb·B_g by int16 pairs (groups of 16: the 16 halves'
        // sums; otherwise the 8 blocks' sums, each block's group's integer), then the floats.
        const uint8_t* bsb = derived ? ssb : btile + sj * sb_bytes;
        const int16_t* sums = sumb + static_cast<int64_t>(sj) * kInt8RowBlock * kInt8SbSums;
        __m512i tsum[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) tsum[r] = _mm512_setzero_si512();
        constexpr int kPairs = G16 ? 8 : 4;
#pragma GCC unroll 8
        for (int q = 0; q < kPairs; ++q) {
          const __m512i cb = G16 ? int16_pairs(bsb, 2 * q, 2 * q + 1)
                                 : int16_pairs(bsb, (2 * q) >> gshift, (2 * q + 1) >> gshift);
          const int at = G16 ? 2 * q : 16 + 2 * q;
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) tsum[r] = dot2(tsum[r], cb, sums + r * kInt8SbSums + at);
        }
        const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(ssb));
        const __m512 e = derived ? _mm512_mul_ps(d, multiple)
                                 : _mm512_loadu_ps(reinterpret_cast<const float*>(bsb));
        const float* steps = dxb + static_cast<int64_t>(sj) * kInt8RowBlock;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 step = _mm512_set1_ps(steps[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(d, step), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tsum[r]), _mm512_mul_ps(e, step), acc[r]);
          isum[r] = _mm512_setzero_si512();
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(p.y + static_cast<int64_t>(m + r) * p.N + n0, acc[r]);
}

template <int BITS, int SM, bool G16>
struct Int8Kernel {
  // One tile against rows of x.
  struct Rows {
    const QProblem& p;
    const TileScales& at;
    const Int8X& x;
    int t;
    template <int R>
    MLXCEL_TARGET void rows(int m) const {
      tile<R, BITS, SM, G16>(p, at.codes(p, t), at.scales(p, t), at.biases(p, t), at.sb_bytes,
                             at.pshift, at.gshift, x, m, t * kInt8TileRows);
    }
  };

  MLXCEL_TARGET static void run(const QProblem& p, const Int8X& x, int m0, int m1, int t0,
                                int t1) {
    const TileScales at(p, SM, G16);
    for (int t = t0; t < t1; ++t) row_runs(Rows{p, at, x, t}, m0, m1);
  }
};

// 32 values times `scale` rounded to nearest even (the default rounding mode, as the scalar forms
// do): their codes as eight 32-bit groups of four, and the integer sums of each half. The codes
// are within ±127, so the 32-bit lanes hold them before saturation changes anything.
MLXCEL_TARGET inline __m256i codes32(const float* v, __m512 scale, int32_t* sum_lo,
                                     int32_t* sum_hi) {
  const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v), scale));
  const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 16), scale));
  *sum_lo = _mm512_reduce_add_epi32(lo);
  *sum_hi = _mm512_reduce_add_epi32(hi);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(lo)),
                                 _mm512_cvtsepi32_epi8(hi), 1);
}

// One block of 32 values of one row quantized (quantize_x_int8's arithmetic, sixteen values at
// a time; the same bits): the 32 codes as eight 32-bit groups of four, and the block's step and
// sums at b.
MLXCEL_TARGET inline __m256i quantize_block(const float* v, int64_t b, float* dx, float* sx,
                                            float* sh) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
  const float amax =
      _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, sign), _mm512_and_ps(hi, sign)));
  const __m512 t16 = _mm512_add_ps(lo, hi);
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(t16), _mm512_extractf32x8_ps(t16, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  // Only to find a NaN (which the max skips), as the scalar form does.
  const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  const bool finite = __builtin_isfinite(amax) && !__builtin_isnan(sum);
  const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
  // The quantized x's sums (step · Σ codes), as the scalar form (which says why).
  int32_t sum_lo, sum_hi;
  const __m256i codes = codes32(v, _mm512_set1_ps(inv), &sum_lo, &sum_hi);
  const float step = finite ? amax / 127.0f : __builtin_nanf("");
  dx[b] = step;
  sh[2 * b] = step * static_cast<float>(sum_lo);
  sh[2 * b + 1] = step * static_cast<float>(sum_hi);
  sx[b] = step * static_cast<float>(sum_lo + sum_hi);
  return codes;
}

// Eight rows' codes of one block of 32 (eight 32-bit groups of four each) into the layout, which
// wants group g of all eight rows side by side: the 8 × 8 matrix of 32-bit groups transposed in
// registers and stored as 256 contiguous bytes, not as 64 scattered 4-byte stores.
MLXCEL_TARGET inline void store_groups(const __m256 (&c)[kInt8RowBlock], int8_t* to) {
  // 8 × 8 transpose of 32-bit elements: row r's group g to output vector g, lane r.
  const __m256 a0 = _mm256_unpacklo_ps(c[0], c[1]), a1 = _mm256_unpackhi_ps(c[0], c[1]);
  const __m256 a2 = _mm256_unpacklo_ps(c[2], c[3]), a3 = _mm256_unpackhi_ps(c[2], c[3]);
  const __m256 a4 = _mm256_unpacklo_ps(c[4], c[5]), a5 = _mm256_unpackhi_ps(c[4], c[5]);
  const __m256 a6 = _mm256_unpacklo_ps(c[6], c[7]), a7 = _mm256_unpackhi_ps(c[6], c[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  const __m256 out[8] = {
      _mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
      _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
      _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
      _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
  float* dst = reinterpret_cast<float*>(to);
  for (int g = 0; g < 8; ++g) _mm256_storeu_ps(dst + 8 * g, out[g]);
}

// quantize_x_int8 (qmatmul_int8.cc) a block of eight rows at a time (store_groups).
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
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
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
        __m512 top = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int i = 0; i < kSuperBlock; i += 16) {
          const __m512 u = _mm512_loadu_ps(v + i);
          top = _mm512_max_ps(top, _mm512_and_ps(u, sign));
          nan |= _mm512_cmp_ps_mask(u, u, _CMP_UNORD_Q);
        }
        const float amax = _mm512_reduce_max_ps(top);
        const bool finite = __builtin_isfinite(amax) && nan == 0;
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
                                             _mm512_set1_ps(inv[r]), &sum_lo, &sum_hi));
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

void quantize_x_int8_avx512(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                            float* sh) {
  quantize_rows(x, M, K, xq, dx, sx, sh);
}

void quantize_x_int8_sb_avx512(const float* x, int M, int K, int8_t* xq, float* dx,
                               int16_t* sums) {
  quantize_rows_sb(x, M, K, xq, dx, sums);
}

void int8_avx512(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1) {
  dispatch_layout<Int8Kernel>(p, x, m0, m1, t0, t1);
}

}  // namespace mlxcel::kernels
