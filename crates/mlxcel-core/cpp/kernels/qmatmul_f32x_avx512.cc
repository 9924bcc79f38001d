// f32 activations over the int8 layout with AVX-512 (QProblem::f32x; qmatmul.h): the weights as
// compact as the int8 path reads them (a K-quant at close to its file size), x left in f32. One
// lane per output row of a 16-row tile, as in the int8 kernel, so nothing is summed across lanes:
// each code (a byte, or a 4-bit nibble) is widened to f32 in its lane and multiplied by x
// broadcast from memory.
// Compiled without -m flags and without STL, like the other AVX-512 kernels.
#include <immintrin.h>

#include "mlxcel-core/cpp/kernels/int8_layout_avx512.h"
#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
// The per-value steps, inlined into their loops (GCC left some as calls).
#define MLXCEL_INLINE MLXCEL_TARGET inline __attribute__((always_inline))

namespace mlxcel::kernels {
namespace {

using namespace layout512;

// Byte B of every 32-bit lane of v (a row's code of value 4Q + B, from `codes`) as f32.
template <int B>
MLXCEL_INLINE __m512 code_f32(__m512i v) {
  __m512i byte;
  if constexpr (B == 0) {
    byte = _mm512_and_si512(v, _mm512_set1_epi32(0xFF));
  } else if constexpr (B == 3) {
    byte = _mm512_srli_epi32(v, 24);
  } else {
    // In each 128-bit lane, dword d takes byte 4d + B, zeros above (index bit 7 set).
    constexpr int kZero = static_cast<int>(0x80808000u);
    const __m512i index = _mm512_set_epi32(
        kZero | (12 + B), kZero | (8 + B), kZero | (4 + B), kZero | B, kZero | (12 + B),
        kZero | (8 + B), kZero | (4 + B), kZero | B, kZero | (12 + B), kZero | (8 + B),
        kZero | (4 + B), kZero | B, kZero | (12 + B), kZero | (8 + B), kZero | (4 + B), kZero | B);
    byte = _mm512_shuffle_epi8(v, index);
  }
  return _mm512_cvtepi32_ps(byte);
}

// acc + w · x, x broadcast from memory inside the instruction.
MLXCEL_INLINE __m512 fma_x(__m512 w, const float* x, __m512 acc) {
  __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
  return acc;
}

// How far ahead of the block being multiplied the GEMV prefetches its tile's bytes into L2 (as
// the int8 kernel does, qmatmul_int8_avx512.cc), never past the tiles of its call: the default
// model's ranges are 20-30 KiB, and prefetching 8 KiB past them cost its decode ~10% (2 KiB
// unbounded was as fast as 8 KiB bounded there, and 8% slower on the 1B shape).
constexpr int64_t kPrefetchAhead = kInt8PrefetchAhead;

// Values 4Q .. 4Q + 3 of the block at `wb` times rows [0, R) of x (`xk` the block's first
// value of row 0, rows K apart), into SP chains per row (value v into chain v % SP).
// 4-bit codes: nibble i (bits 4i .. 4i + 3) of every 32-bit lane of the block's 64-byte chunk
// as f32, by a permute of the 16 values 0 .. 15 (vpermps reads only the low 4 bits of each
// index), the shift first for i > 0: value 4Q + b is nibble 2b + Q % 2 of chunk Q / 2.
template <int I>
MLXCEL_INLINE __m512 nibble_f32(__m512i v, __m512 values) {
  return _mm512_permutexvar_ps(I == 0 ? v : _mm512_srli_epi32(v, 4 * I), values);
}

template <int Q, int R, int SP, int BITS>
MLXCEL_INLINE void gemv_step(__m512 (&dot)[R][SP], const uint8_t* wb, const float* xk,
                                    int K) {
  __m512 f[4];
  if constexpr (int8_code_bits(BITS) == 4) {
    // The nibble's code: itself, or its E2M1 code (qmatmul.h), by the same permute.
    const __m512 values =
        BITS == 4 ? _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                  : _mm512_set_ps(4, 8, 10, 12, 13, 14, 15, 16, 28, 24, 22, 20, 19, 18, 17, 16);
    const __m512i v = _mm512_loadu_si512(wb + (Q / 2) * 64);
    f[0] = nibble_f32<0 + Q % 2>(v, values);
    f[1] = nibble_f32<2 + Q % 2>(v, values);
    f[2] = nibble_f32<4 + Q % 2>(v, values);
    f[3] = nibble_f32<6 + Q % 2>(v, values);
  } else {
    const __m512i v = codes<BITS, Q>(wb);
    f[0] = code_f32<0>(v);
    f[1] = code_f32<1>(v);
    f[2] = code_f32<2>(v);
    f[3] = code_f32<3>(v);
  }
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      dot[r][(4 * Q + b) % SP] =
          fma_x(f[b], xk + static_cast<int64_t>(r) * K + 4 * Q + b, dot[r][(4 * Q + b) % SP]);
}

// Rows [m, m + R) of x against one tile: per group g,
//   acc = fma(scale_g, Σ_{k in g} q·x, acc); acc = fma(bias_g, Σ_{k in g} x, acc)
// with the sums over the group in SP chains added at its end.
template <int R, int BITS, int SM, bool G16>
MLXCEL_TARGET void gemv_tile(const QProblem& p, const TileScales& at, int t, const float* sums,
                             int m, const uint8_t* limit) {
  constexpr int SP = R == 1 ? 4 : (R == 2 ? 2 : 1);
  constexpr int kCodeBits = int8_code_bits(BITS);  // (the stored width)
  const int K = p.K, G = K / p.group_size;
  const uint8_t* w = at.codes(p, t);
  const uint8_t* stile = at.scales(p, t);
  const uint8_t* btile = at.biases(p, t);
  const float* x = p.x + static_cast<int64_t>(m) * K;
  const bool derived = p.bias_scale != 0.0f;
  const __m512 multiple = _mm512_set1_ps(p.bias_scale);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 dot[R][SP];
  const auto clear = [&]() MLXCEL_TARGET {
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < SP; ++i) dot[r][i] = _mm512_setzero_ps();
  };
  const auto finish = [&](int g) MLXCEL_TARGET {
    const __m512 scale = factor16<SM>(stile, at.sb_bytes, at.pshift, g);
    const __m512 bias = derived ? _mm512_mul_ps(scale, multiple)
                                : factor16<SM>(btile, at.sb_bytes, at.pshift, g);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 total = dot[r][0];
      for (int i = 1; i < SP; ++i) total = _mm512_add_ps(total, dot[r][i]);
      acc[r] = _mm512_fmadd_ps(scale, total, acc[r]);
      acc[r] = fma_x(bias, sums + static_cast<int64_t>(m + r) * G + g, acc[r]);
    }
  };
  const auto prefetch = [&](const uint8_t* wb) MLXCEL_TARGET {
    if (wb + kPrefetchAhead >= limit) return;
#pragma GCC unroll 8
    for (int l = 0; l < kCodeBits; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(wb) +
                                                 kPrefetchAhead + 64 * l),
                   _MM_HINT_T1);
  };
  const int blocks = K / kInt8Block;
  if constexpr (G16) {
    for (int j = 0; j < blocks; ++j) {
      const uint8_t* wb = w + static_cast<int64_t>(j) * 64 * int8_code_bits(BITS);
      const float* xk = x + j * kInt8Block;
      prefetch(wb);
      clear();
      gemv_step<0, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<1, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<2, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<3, R, SP, BITS>(dot, wb, xk, K);
      finish(2 * j);
      clear();
      gemv_step<4, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<5, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<6, R, SP, BITS>(dot, wb, xk, K);
      gemv_step<7, R, SP, BITS>(dot, wb, xk, K);
      finish(2 * j + 1);
    }
  } else {
    const int per_group = 1 << at.gshift;
    for (int g = 0; g < G; ++g) {
      clear();
      for (int j = g * per_group; j < (g + 1) * per_group; ++j) {
        const uint8_t* wb = w + static_cast<int64_t>(j) * 64 * int8_code_bits(BITS);
        const float* xk = x + j * kInt8Block;
        prefetch(wb);
        gemv_step<0, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<1, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<2, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<3, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<4, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<5, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<6, R, SP, BITS>(dot, wb, xk, K);
        gemv_step<7, R, SP, BITS>(dot, wb, xk, K);
      }
      finish(g);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(p.y + static_cast<int64_t>(m + r) * p.N + t * kInt8TileRows, acc[r]);
}

template <int BITS, int SM, bool G16>
struct Gemv {
  // One tile against rows of x.
  struct Rows {
    const QProblem& p;
    const TileScales& at;
    const float* sums;
    const uint8_t* limit;
    int t;
    template <int R>
    MLXCEL_TARGET void rows(int m) const {
      gemv_tile<R, BITS, SM, G16>(p, at, t, sums, m, limit);
    }
  };

  MLXCEL_TARGET static void run(const QProblem& p, const float* sums, int m0, int m1, int t0,
                                int t1) {
    const TileScales at(p, SM, G16);
    // Prefetches stay within this call's tiles (a small model's ranges are a few KiB: reaching
    // past them fetched what another thread reads).
    const uint8_t* limit = at.codes(p, t1);
    for (int t = t0; t < t1; ++t) row_runs(Rows{p, at, sums, limit, t}, m0, m1);
  }
};

// Values 4Q .. 4Q + 3 of a block dequantized into the panel: fma(q, scale, bias) per lane.
template <int Q, int BITS>
MLXCEL_INLINE void dequant_step(const uint8_t* wb, __m512 scale, __m512 bias,
                                       float* out) {
  const __m512i v = codes<BITS, Q>(wb);
  _mm512_storeu_ps(out + (4 * Q + 0) * kInt8TileRows,
                   _mm512_fmadd_ps(code_f32<0>(v), scale, bias));
  _mm512_storeu_ps(out + (4 * Q + 1) * kInt8TileRows,
                   _mm512_fmadd_ps(code_f32<1>(v), scale, bias));
  _mm512_storeu_ps(out + (4 * Q + 2) * kInt8TileRows,
                   _mm512_fmadd_ps(code_f32<2>(v), scale, bias));
  _mm512_storeu_ps(out + (4 * Q + 3) * kInt8TileRows,
                   _mm512_fmadd_ps(code_f32<3>(v), scale, bias));
}

// Tile t dequantized into `panel`, value-major: panel[k · 16 + row] (one vector per value).
template <int BITS, int SM, bool G16>
MLXCEL_TARGET void dequant_tile(const QProblem& p, const TileScales& at, int t, float* panel) {
  const uint8_t* w = at.codes(p, t);
  const uint8_t* stile = at.scales(p, t);
  const uint8_t* btile = at.biases(p, t);
  const bool derived = p.bias_scale != 0.0f;
  const __m512 multiple = _mm512_set1_ps(p.bias_scale);
  const auto factors = [&](int g, __m512& scale, __m512& bias) MLXCEL_TARGET {
    scale = factor16<SM>(stile, at.sb_bytes, at.pshift, g);
    bias = derived ? _mm512_mul_ps(scale, multiple)
                   : factor16<SM>(btile, at.sb_bytes, at.pshift, g);
  };
  for (int j = 0; j < p.K / kInt8Block; ++j) {
    const uint8_t* wb = w + static_cast<int64_t>(j) * 64 * int8_code_bits(BITS);
    float* out = panel + static_cast<int64_t>(j) * kInt8Block * kInt8TileRows;
    __m512 scale, bias;
    factors(G16 ? 2 * j : j >> at.gshift, scale, bias);
    dequant_step<0, BITS>(wb, scale, bias, out);
    dequant_step<1, BITS>(wb, scale, bias, out);
    dequant_step<2, BITS>(wb, scale, bias, out);
    dequant_step<3, BITS>(wb, scale, bias, out);
    if constexpr (G16) factors(2 * j + 1, scale, bias);
    dequant_step<4, BITS>(wb, scale, bias, out);
    dequant_step<5, BITS>(wb, scale, bias, out);
    dequant_step<6, BITS>(wb, scale, bias, out);
    dequant_step<7, BITS>(wb, scale, bias, out);
  }
}

template <int BITS, int SM, bool G16>
struct Dequant {
  MLXCEL_TARGET static void run(const QProblem& p, int t, float* panel) {
    const TileScales at(p, SM, G16);
    dequant_tile<BITS, SM, G16>(p, at, t, panel);
  }
};

// y[m + r, n0 .. n0 + 16) = Σ_k x[m + r, k] · panel[k] for kF32xRows rows of x packed value-major
// (`xp[k · kF32xRows + r]`, f32x_pack_x): one accumulator per row of x, each FMA taking its x
// value broadcast from memory at a fixed offset from one pointer. Only the first `rows` results
// are stored (the packed rows past M are zeros).
MLXCEL_TARGET void panel_rows(const float* xp, int K, const float* panel, float* y, int N,
                              int rows) {
  constexpr int R = kF32xRows;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    const __m512 w = _mm512_loadu_ps(panel + static_cast<int64_t>(k) * kInt8TileRows);
    const float* xk = xp + static_cast<int64_t>(k) * R;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xk[r]), w, acc[r]);
  }
  for (int r = 0; r < rows; ++r) _mm512_storeu_ps(y + static_cast<int64_t>(r) * N, acc[r]);
}

}  // namespace

void f32x_avx512_gemv(const QProblem& p, const float* sums, int m0, int m1, int t0, int t1) {
  dispatch_layout<Gemv>(p, sums, m0, m1, t0, t1);
}

void f32x_avx512_gemm(const QProblem& p, const float* xp, float* panel, int m0, int m1, int t) {
  dispatch_layout<Dequant>(p, t, panel);
  float* y = p.y + t * kInt8TileRows;
  for (int m = m0; m < m1; m += kF32xRows)
    panel_rows(xp + static_cast<int64_t>(m) * p.K, p.K, panel, y + static_cast<int64_t>(m) * p.N,
               p.N, m1 - m < kF32xRows ? m1 - m : kF32xRows);
}

}  // namespace mlxcel::kernels
