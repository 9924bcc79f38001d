// Packed-weight matrix products for the OpenXLA backend's `kernel` weight format.
//
// iree-compile links this object into the modules it builds (an external function called from a
// dispatch declared in the emitted program; see `src/kernels.rs` and docs/xla.md), so it runs on
// IREE's worker threads inside the embedded-ELF executable: no libc, no globals, no allocation,
// no thread-local state. Only compiler intrinsics are used.
//
// Each entry computes, for the output columns of one workgroup, y[r][o] = sum_k x[r][k] * w[o][k]
// with w[o][k] = scale[o][g] * code[o][k] + bias[o][g] (g = k / group) in f32: the MLX backend's
// dequantization, summed in a different order. Codes are the checkpoint's packed words read as
// bytes (little-endian, the first element in the lowest bits). For 4-bit codes a byte holds an
// (even, odd) pair of values, so the caller passes x with each block of 32 values reordered as
// [16 evens, 16 odds] (a reshape and transpose in the graph): then the low nibbles of a block's
// 16 bytes meet its first 16 x values and the high nibbles the next 16.
//
// Requirements (checked by the emitter): 4-bit groups a multiple of 32, 8-bit a multiple of 16;
// AVX-512 F/BW/VL/VNNI, FMA and F16C (checked by the host before choosing the format).

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

// A rank-1 memref as MLIR lowers it for an external call: base and aligned pointers, offset,
// size, stride. Only the aligned pointer and the offset are used.
#define MEMREF(T, name)                                                                            \
  __attribute__((unused)) T *name##_base, T *name##_aligned, size_t name##_offset,                 \
      __attribute__((unused)) size_t name##_size, __attribute__((unused)) size_t name##_stride
#define AT(T, name) ((T *)(name##_aligned + name##_offset))

#define INLINE static inline __attribute__((always_inline))

// Scales and biases of this many groups are widened to f32 at a time, on the stack.
#define GROUP_BLOCK 128

INLINE float half_to_float(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

INLINE void widen_f16(const uint16_t *src, size_t n, float *dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
  for (; i < n; i++) dst[i] = half_to_float(src[i]);
}

INLINE void widen_f32(const float *src, size_t n, float *dst) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

// Rows r0 .. r0 + R of x against outputs o .. o + O, over every group. R <= 4, O <= 4, both
// compile-time constants once inlined.
#define DEFINE_TILE(BITS, STYPE, WIDEN)                                                            \
  INLINE void tile_##BITS##_##STYPE(const float *x, size_t qrow, const uint8_t *q,                 \
                                    const STYPE *s, const STYPE *b, float *y, size_t in,           \
                                    size_t out, size_t group, size_t o, size_t r0, const int R,    \
                                    const int O) {                                                 \
    (void)qrow;                                                                                    \
    __m512 acc[4][4], acc2[4][4];                                                                  \
    for (int j = 0; j < O; j++)                                                                    \
      for (int r = 0; r < R; r++) acc[j][r] = acc2[j][r] = _mm512_setzero_ps();                    \
    const size_t groups = in / group, row_bytes = in * BITS / 8, group_bytes = group * BITS / 8;   \
    const __m512i low = _mm512_set1_epi32(15);                                                     \
    float sc[4][GROUP_BLOCK], bi[4][GROUP_BLOCK];                                                  \
    for (size_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK) {                                          \
      const size_t gn = groups - g0 < GROUP_BLOCK ? groups - g0 : GROUP_BLOCK;                     \
      for (int j = 0; j < O; j++) {                                                                \
        WIDEN(s + (o + j) * groups + g0, gn, sc[j]);                                               \
        WIDEN(b + (o + j) * groups + g0, gn, bi[j]);                                               \
      }                                                                                            \
      for (size_t gi = 0; gi < gn; gi++) {                                                         \
        const size_t g = g0 + gi;                                                                  \
        __m512 vs[4], vb[4];                                                                       \
        for (int j = 0; j < O; j++) {                                                              \
          vs[j] = _mm512_set1_ps(sc[j][gi]);                                                       \
          vb[j] = _mm512_set1_ps(bi[j][gi]);                                                       \
        }                                                                                          \
        for (size_t c = 0; c < group_bytes; c += 16) {                                             \
          for (int j = 0; j < O; j++) {                                                            \
            const __m512i codes = _mm512_cvtepu8_epi32(                                            \
                _mm_loadu_si128((const __m128i *)(q + (o + j) * row_bytes + g * group_bytes + c))); \
            if (BITS == 4) {                                                                       \
              const float *xe = x + r0 * in + g * group + 2 * c, *xo = xe + 16;                    \
              const __m512 lo =                                                                    \
                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(codes, low)), vs[j], vb[j]); \
              const __m512 hi =                                                                    \
                  _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4)), vs[j], vb[j]);  \
              for (int r = 0; r < R; r++) {                                                        \
                acc[j][r] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xe + r * in), acc[j][r]);          \
                acc2[j][r] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xo + r * in), acc2[j][r]);        \
              }                                                                                    \
            } else {                                                                               \
              const float *xs = x + r0 * in + g * group + c;                                       \
              const __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes), vs[j], vb[j]);           \
              for (int r = 0; r < R; r++)                                                          \
                acc[j][r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(xs + r * in), acc[j][r]);           \
            }                                                                                      \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    for (int j = 0; j < O; j++)                                                                    \
      for (int r = 0; r < R; r++)                                                                  \
        y[(r0 + r) * out + o + j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[j][r], acc2[j][r]));    \
  }

typedef uint16_t f16_bits;

DEFINE_TILE(4, f16_bits, widen_f16)
DEFINE_TILE(4, float, widen_f32)
DEFINE_TILE(8, f16_bits, widen_f16)
DEFINE_TILE(8, float, widen_f32)


// ---------------------------------------------------------------------------------------------
// int8 activations (the `kernel-int8` weight format; also needs AVX-512 VNNI).
//
// x is quantized per row and block of 32 consecutive values, as the MLX backend's int8 path and
// llama.cpp's Q8 activations do: dx = max|x| / 127, xq = round(x · 127 / max|x|) (to nearest,
// ties to even). Then per output (r, o) and block j of group g:
//   I = Σ code[o][k] · xq[r][k] over the block (exact, int32, by vpdpbusd)
//   y += float(I) · dx[r][j] · scale[o][g] + bias[o][g] · dx[r][j] · Σ xq[r][k over the block]
// summed in lanes and then across them (so not in the MLX backend's order).
//
// The weights are read 64 bytes (a "piece") at a time, in the checkpoint's layout: for 4-bit
// codes 128 values (4 blocks), for 8-bit 64 (2 blocks). Each 32-bit lane of a piece holds four
// codes of one block, so `quantize_x` writes each row's int8 values in the lanes' order, with
// each lane's block scale dx and a quarter (4-bit: four lanes a block) or an eighth (8-bit) of
// the block's sum beside them:
//   row = [piece 0 .. P-1 codes of x (4-bit: 64 low-nibble partners, then 64 high; 8-bit: 64
//          in order)] [P × 16 lane scales (f32)] [P × 16 lane sums (f32)]
// Values past `in` (a last, partial piece) are zero, as are their scales and sums.

INLINE size_t pieces(size_t in, int bits) { return bits == 4 ? (in + 127) / 128 : (in + 63) / 64; }
INLINE size_t piece_values(int bits) { return bits == 4 ? 128 : 64; }
INLINE size_t quantized_row_bytes(size_t in, int bits) {
  return pieces(in, bits) * (piece_values(bits) + 128);
}

// The block (0 .. 3 for 4-bit, 0 .. 1 for 8-bit) of a piece that lane L holds.
INLINE int lane_block(int L, int bits) { return bits == 4 ? L / 4 : L / 8; }

INLINE void quantize_row(const float *x, size_t in, int bits, int8_t *out) {
  const size_t P = pieces(in, bits), PV = piece_values(bits);
  int8_t *codes = out;
  float *scales = (float *)(out + P * PV), *sums = scales + P * 16;
  const int lanes_per_block = bits == 4 ? 4 : 8;
  for (size_t p = 0; p < P; p++) {
    float dx[4] = {0, 0, 0, 0}, sx[4] = {0, 0, 0, 0};
    int8_t q[128];
    for (int i = 0; i < 128; i++) q[i] = 0;
    for (size_t b = 0; b < PV / 32; b++) {
      const size_t at = p * PV + 32 * b;
      if (at >= in) break;
      const __m512 v0 = _mm512_loadu_ps(x + at), v1 = _mm512_loadu_ps(x + at + 16);
      const float amax = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      dx[b] = d;
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
      // The sum the biases multiply is the quantized values' (an exact integer) times dx, so
      // that a weight's bias and codes meet the same x: then a large bias (8-bit codes around
      // 128, as a symmetric format converts to) does not amplify the quantization error.
      sx[b] = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)) * d;
      int8_t qb[32];
      _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtsepi32_epi8(q1));
      if (bits == 4) {
        // Lane 4b + l holds, for the low nibbles, values 2(4l + i) of the block; the high
        // nibbles' partners are the odd values, 64 bytes later.
        for (int i = 0; i < 16; i++) {
          q[16 * b + i] = qb[2 * i];
          q[64 + 16 * b + i] = qb[2 * i + 1];
        }
      } else {
        for (int i = 0; i < 32; i++) q[32 * b + i] = qb[i];
      }
    }
    for (size_t i = 0; i < PV; i++) codes[p * PV + i] = q[i];
    for (int L = 0; L < 16; L++) {
      const int b = lane_block(L, bits);
      scales[p * 16 + L] = dx[b];
      sums[p * 16 + L] = sx[b] / (float)lanes_per_block;
    }
  }
}

#define DEFINE_QUANTIZE(BITS)                                                                      \
  void mlxcel_quantize_x##BITS(MEMREF(const uint8_t, x), MEMREF(uint8_t, o), size_t n,             \
                               size_t in, size_t row) {                                            \
    (void)n;                                                                                       \
    quantize_row(AT(const float, x) + row * in, in, BITS,                                          \
                 (int8_t *)AT(uint8_t, o) + row * quantized_row_bytes(in, BITS));                  \
  }

DEFINE_QUANTIZE(4)
DEFINE_QUANTIZE(8)

// Up to four scales (or biases) of groups g0 .. g0 + count - 1, each repeated into the lanes of
// its blocks: lane L takes the one at `index` L.
INLINE __m512 lane_scales_f16(const uint16_t *s, size_t count, __m256i index) {
  const __m128i h = _mm_maskz_loadu_epi16((__mmask8)((1u << count) - 1), s);
  return _mm512_cvtph_ps(_mm256_permutexvar_epi16(index, _mm256_castsi128_si256(h)));
}
INLINE __m512 lane_scales_f32(const float *s, size_t count, __m256i index) {
  const __m128 v = _mm_maskz_loadu_ps((__mmask8)((1u << count) - 1), s);
  return _mm512_permutexvar_ps(_mm512_cvtepu16_epi32(index), _mm512_castps128_ps512(v));
}

#define DEFINE_TILE_I8(BITS, STYPE, SCALES)                                                        \
  INLINE void tile_i8_##BITS##_##STYPE(const int8_t *xq, size_t qrow, const uint8_t *q,            \
                                       const STYPE *s, const STYPE *b, float *y, size_t in,        \
                                       size_t out, size_t group, size_t o, size_t r0,              \
                                       const int R, const int O) {                                 \
    const size_t P = pieces(in, BITS), PV = piece_values(BITS), groups = in / group;               \
    /* Groups are 32, 64 or 128 values: a shift, not a division, per piece. */                    \
    const unsigned group_shift = group == 32 ? 5 : group == 64 ? 6 : 7;                          \
    const size_t row_bytes = in * BITS / 8;                                                        \
    const size_t per_piece = PV >= group ? PV / group : 1;                                         \
    uint16_t lane_group[16];                                                                       \
    for (int L = 0; L < 16; L++)                                                                   \
      lane_group[L] = PV >= group ? (uint16_t)(32 * lane_block(L, BITS) / group) : 0;              \
    const __m256i index = _mm256_loadu_si256((const __m256i *)lane_group);                         \
    const __m512i low = _mm512_set1_epi8(15);                                                      \
    __m512 acc[4][4];                                                                              \
    for (int j = 0; j < O; j++)                                                                    \
      for (int r = 0; r < R; r++) acc[j][r] = _mm512_setzero_ps();                                 \
    for (size_t p = 0; p < P; p++) {                                                               \
      const size_t g0 = (p * PV) >> group_shift;                                                   \
      const size_t count = groups - g0 < per_piece ? groups - g0 : per_piece;                      \
      const size_t left = row_bytes - p * 64;                                                      \
      const __mmask64 mask = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);            \
      for (int j = 0; j < O; j++) {                                                                \
        const __m512i v = _mm512_maskz_loadu_epi8(mask, q + (o + j) * row_bytes + p * 64);         \
        const __m512 sv = SCALES(s + (o + j) * groups + g0, count, index);                         \
        const __m512 bv = SCALES(b + (o + j) * groups + g0, count, index);                         \
        for (int r = 0; r < R; r++) {                                                              \
          const int8_t *xr = xq + (r0 + r) * qrow;                                                 \
          __m512i sum;                                                                             \
          if (BITS == 4) {                                                                         \
            const __m512i lo = _mm512_and_si512(v, low);                                           \
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                     \
            sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,                                  \
                                      _mm512_loadu_si512(xr + p * 128));                           \
            sum = _mm512_dpbusd_epi32(sum, hi, _mm512_loadu_si512(xr + p * 128 + 64));             \
          } else {                                                                                 \
            sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, _mm512_loadu_si512(xr + p * 64)); \
          }                                                                                        \
          const float *dx = (const float *)(xr + P * PV) + p * 16;                                 \
          const float *sx = (const float *)(xr + P * PV) + P * 16 + p * 16;                        \
          const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_loadu_ps(dx));            \
          acc[j][r] = _mm512_fmadd_ps(t, sv, acc[j][r]);                                           \
          acc[j][r] = _mm512_fmadd_ps(bv, _mm512_loadu_ps(sx), acc[j][r]);                         \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    for (int j = 0; j < O; j++)                                                                    \
      for (int r = 0; r < R; r++) y[(r0 + r) * out + o + j] = _mm512_reduce_add_ps(acc[j][r]);     \
  }

DEFINE_TILE_I8(4, f16_bits, lane_scales_f16)
DEFINE_TILE_I8(4, float, lane_scales_f32)
DEFINE_TILE_I8(8, f16_bits, lane_scales_f16)
DEFINE_TILE_I8(8, float, lane_scales_f32)


// ---------------------------------------------------------------------------------------------
// Entries. x: f32 [n, in] (f32 activations) or `quantize_x` rows (int8); q: codes
// [out, in * BITS / 8]; s, b: [out, in / group]; y: f32 [n, out]. The workgroup `wg` computes
// columns [wg * per, min((wg + 1) * per, out)) for every row. The `_x2` and `_x3` entries take
// two or three weights of the same input, format and group (q, k and v; gate and up), each
// with its own y, the workgroups spread over all their columns: one dispatch instead of several.

// Columns [o0, o1) of the weight at `TILE` over every row; y's rows are `ystride` apart.
#define DEFINE_RANGE(TILE, XTYPE, STYPE)                                                           \
  static void range_##TILE(const XTYPE *X, size_t qrow, const uint8_t *Q, const STYPE *S,          \
                           const STYPE *B, float *Y, size_t n, size_t in, size_t ystride,          \
                           size_t group, size_t o0, size_t o1) {                                   \
    size_t o = o0;                                                                                 \
    if (n <= 2)                                                                                    \
      for (; o + 4 <= o1; o += 4) {                                                                \
        if (n == 2) TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, 0, 2, 4);                     \
        else TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, 0, 1, 4);                            \
      }                                                                                            \
    for (; o + 2 <= o1; o += 2) {                                                                  \
      size_t r = 0;                                                                                \
      for (; r + 4 <= n; r += 4) TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, r, 4, 2);        \
      switch (n - r) {                                                                             \
        case 1: TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, r, 1, 2); break;                  \
        case 2: TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, r, 2, 2); break;                  \
        case 3: TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, r, 3, 2); break;                  \
        default: break;                                                                            \
      }                                                                                            \
    }                                                                                              \
    for (; o < o1; o++)                                                                            \
      for (size_t r = 0; r < n; r++) TILE(X, qrow, Q, S, B, Y, in, ystride, group, o, r, 1, 1);    \
  }

// The part of the workgroup's columns [o0, o1) that falls in a weight's columns [base, base +
// out_k), run by `range` into that weight's own y (rows out_k apart).
#define SEGMENT(TILE, STYPE, k, base, out_k)                                                       \
  do {                                                                                             \
    const size_t lo = o0 > (base) ? o0 : (base);                                                   \
    const size_t hi = o1 < (base) + (out_k) ? o1 : (base) + (out_k);                               \
    if (lo < hi)                                                                                   \
      range_##TILE(X, qrow, AT(const uint8_t, q##k), AT(const STYPE, s##k), AT(const STYPE, b##k), \
                   AT(float, y##k), n, in, out_k, group, lo - (base), hi - (base));                \
  } while (0)

#define WEIGHT(k)                                                                                  \
  MEMREF(const uint8_t, q##k), MEMREF(const uint8_t, s##k), MEMREF(const uint8_t, b##k)

// QROW: bytes per row of x as the tile reads it (0 for f32 x, which the tiles index by `in`).
// The `_x2` and `_x3` entries write each weight's product into its own y (y0, y1, y2).
#define DEFINE_ENTRIES(TILE, XTYPE, STYPE, QROW, NAME)                                             \
  DEFINE_RANGE(TILE, XTYPE, STYPE)                                                                 \
  void NAME(MEMREF(const uint8_t, x), WEIGHT(0), MEMREF(uint8_t, y0), size_t n, size_t in,         \
            size_t out0, size_t group, size_t per, size_t wg) {                                    \
    const XTYPE *X = AT(const XTYPE, x);                                                           \
    const size_t qrow = QROW, total = out0;                                                        \
    const size_t o0 = wg * per, o1 = o0 + per < total ? o0 + per : total;                          \
    SEGMENT(TILE, STYPE, 0, 0, out0);                                                              \
  }                                                                                                \
  void NAME##_x2(MEMREF(const uint8_t, x), WEIGHT(0), WEIGHT(1), MEMREF(uint8_t, y0),              \
                 MEMREF(uint8_t, y1), size_t n, size_t in, size_t out0, size_t out1, size_t group, \
                 size_t per, size_t wg) {                                                          \
    const XTYPE *X = AT(const XTYPE, x);                                                           \
    const size_t qrow = QROW, total = out0 + out1;                                                 \
    const size_t o0 = wg * per, o1 = o0 + per < total ? o0 + per : total;                          \
    SEGMENT(TILE, STYPE, 0, 0, out0);                                                              \
    SEGMENT(TILE, STYPE, 1, out0, out1);                                                           \
  }                                                                                                \
  void NAME##_x3(MEMREF(const uint8_t, x), WEIGHT(0), WEIGHT(1), WEIGHT(2), MEMREF(uint8_t, y0),   \
                 MEMREF(uint8_t, y1), MEMREF(uint8_t, y2), size_t n, size_t in, size_t out0,       \
                 size_t out1, size_t out2, size_t group, size_t per, size_t wg) {                  \
    const XTYPE *X = AT(const XTYPE, x);                                                           \
    const size_t qrow = QROW, total = out0 + out1 + out2;                                          \
    const size_t o0 = wg * per, o1 = o0 + per < total ? o0 + per : total;                          \
    SEGMENT(TILE, STYPE, 0, 0, out0);                                                              \
    SEGMENT(TILE, STYPE, 1, out0, out1);                                                           \
    SEGMENT(TILE, STYPE, 2, out0 + out1, out2);                                                    \
  }

DEFINE_ENTRIES(tile_4_f16_bits, float, f16_bits, 0, mlxcel_qmm4_f16)
DEFINE_ENTRIES(tile_4_float, float, float, 0, mlxcel_qmm4_f32)
DEFINE_ENTRIES(tile_8_f16_bits, float, f16_bits, 0, mlxcel_qmm8_f16)
DEFINE_ENTRIES(tile_8_float, float, float, 0, mlxcel_qmm8_f32)
DEFINE_ENTRIES(tile_i8_4_f16_bits, int8_t, f16_bits, quantized_row_bytes(in, 4), mlxcel_qmm4i_f16)
DEFINE_ENTRIES(tile_i8_4_float, int8_t, float, quantized_row_bytes(in, 4), mlxcel_qmm4i_f32)
DEFINE_ENTRIES(tile_i8_8_f16_bits, int8_t, f16_bits, quantized_row_bytes(in, 8), mlxcel_qmm8i_f16)
DEFINE_ENTRIES(tile_i8_8_float, int8_t, float, quantized_row_bytes(in, 8), mlxcel_qmm8i_f32)
