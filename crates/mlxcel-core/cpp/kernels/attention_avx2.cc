// Attention for the avx2 path (see attention.inc; no STL here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"

#define MLXCEL_TARGET __attribute__((target("avx2,fma,f16c")))

#include <immintrin.h>

namespace mlxcel::kernels {
#define ATTENTION_PART_NAME attention_part_avx2_loops
#include "mlxcel-core/cpp/kernels/attention.inc"

namespace {

// Eight vectors to the vector of their sums (lane i = Σ lanes of a[i], in some fixed lane
// order): a transpose-and-add tree, ~1.75 operations per vector instead of a full horizontal
// reduction each.
MLXCEL_TARGET inline __m256 sum8(const __m256* a) {
  // Level 1: pairs (i, i+4), 128-bit halves.
  __m256 b[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 lo = _mm256_permute2f128_ps(a[i], a[i + 4], 0x20);  // a.lo, c.lo
    const __m256 hi = _mm256_permute2f128_ps(a[i], a[i + 4], 0x31);  // a.hi, c.hi
    b[i] = _mm256_add_ps(lo, hi);
  }
  // Level 2: pairs (i, i+2), 64-bit halves of each 128-bit lane.
  __m256 c[2];
  for (int i = 0; i < 2; ++i) {
    const __m256 lo =
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(b[i]), _mm256_castps_pd(b[i + 2])));
    const __m256 hi =
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(b[i]), _mm256_castps_pd(b[i + 2])));
    c[i] = _mm256_add_ps(lo, hi);
  }
  // Level 3: adjacent floats.
  const __m256 lo = _mm256_shuffle_ps(c[0], c[1], 0x88);
  const __m256 hi = _mm256_shuffle_ps(c[0], c[1], 0xDD);
  return _mm256_add_ps(lo, hi);
}

// The lane order sum8 produces, found once by feeding it one-hot vectors.
struct Sum8Order {
  int lane_of[8];  // lane_of[i]: where the sum of a[i] lands
};

MLXCEL_TARGET Sum8Order sum8_order() {
  Sum8Order order{};
  for (int i = 0; i < 8; ++i) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_set1_ps(j == i ? 1.0f : 0.0f);
    alignas(32) float out[8];
    _mm256_store_ps(out, sum8(a));
    for (int l = 0; l < 8; ++l)
      if (out[l] != 0.0f) order.lane_of[i] = l;
  }
  return order;
}

MLXCEL_TARGET inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

MLXCEL_TARGET inline float hmax8(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// e^x for x <= 0, 8 lanes (the polynomial of attention.inc's exp_nonpositive).
MLXCEL_TARGET inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                   _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// The grouped partial attention with D = 8·DC: scores eight keys at a time (one
// transpose-and-add per block instead of a reduction per key), exponentials eight at a time, and
// the weighted sum of values in registers, up to 64 floats of one head at a time (sixteen ymm
// registers do not hold a whole group as AVX-512's thirty-two do; value rows are read again per
// head, from cache). Every row's arithmetic depends on its own position only, never on the block
// of rows or the batch it came in.
template <int DC>
MLXCEL_TARGET void part_fast(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                             float* part, float* scores) {
  static const Sum8Order order = sum8_order();
  constexpr int D = 8 * DC;
  constexpr int TILE = DC % 8 == 0 ? 8 : DC % 6 == 0 ? 6 : DC % 4 == 0 ? 4 : 1;
  static_assert(DC % TILE == 0, "whole tiles of values");
  const int G = p.heads / p.kv_heads;
  const int W = j1 - j0;
  const int64_t stride = D + 2;
  const float* k = p.k + kvh * p.k_head;
  const float* v = p.v + kvh * p.v_head;
  const __m256 scale = _mm256_set1_ps(p.scale);
  for (int i = r0; i < r1; ++i) {
    const int len = p.causal ? p.L - p.n + i + 1 : p.L;
    const int hi = len < j1 ? len : j1;
    const int first = attention_first_key(p, i);
    const int lo = first > j0 ? first : j0;
    for (int g = 0; g < G; ++g) {
      float* e = part + (static_cast<int64_t>(g) * (r1 - r0) + (i - r0)) * stride;
      e[0] = -__builtin_huge_valf();
      e[1] = 0.0f;
      for (int t = 0; t < D; ++t) e[2 + t] = 0.0f;
    }
    if (hi <= lo) continue;
    const int keys = hi - lo;
    for (int g = 0; g < G; ++g) {
      float* entry = part + (static_cast<int64_t>(g) * (r1 - r0) + (i - r0)) * stride;
      const float* q = p.q + (kvh * G + g) * p.q_head + i * p.q_row;
      float* sc = scores + g * W;
      // Scores, eight keys per block; the last keys one at a time.
      int j = 0;
      for (; j + 8 <= keys; j += 8) {
        __m256 acc[8];
        for (int jj = 0; jj < 8; ++jj) {
          const float* kj = k + static_cast<int64_t>(lo + j + jj) * p.k_row;
          acc[jj] = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kj));
          for (int c = 1; c < DC; ++c)
            acc[jj] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(kj + 8 * c),
                                      acc[jj]);
        }
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, _mm256_mul_ps(sum8(acc), scale));
        for (int jj = 0; jj < 8; ++jj) sc[j + jj] = lanes[order.lane_of[jj]];
      }
      for (; j < keys; ++j) {
        const float* kj = k + static_cast<int64_t>(lo + j) * p.k_row;
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kj));
        for (int c = 1; c < DC; ++c)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(kj + 8 * c), acc);
        sc[j] = hsum8(acc) * p.scale;
      }
      if (p.softcap > 0.0f) {
        const float cap = p.softcap;
#pragma omp simd
        for (int t = 0; t < keys; ++t) sc[t] = cap * tanh_fast(sc[t] / cap);
      }
      // Max, exponentials and their sum.
      __m256 mv = _mm256_set1_ps(-3.0e38f);
      int t = 0;
      for (; t + 8 <= keys; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + t));
      float max = hmax8(mv);
      for (; t < keys; ++t) max = sc[t] > max ? sc[t] : max;
      const __m256 mx = _mm256_set1_ps(max);
      __m256 sv = _mm256_setzero_ps();
      t = 0;
      for (; t + 8 <= keys; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t), mx));
        _mm256_storeu_ps(sc + t, e);
        sv = _mm256_add_ps(sv, e);
      }
      float sum = hsum8(sv);
      for (; t < keys; ++t) {
        const float e = exp_nonpositive(sc[t] - max);
        sc[t] = e;
        sum += e;
      }
      entry[0] = max;
      entry[1] = sum;
      // Σ w·v, TILE vectors of the head at a time, accumulated in registers.
      for (int c0 = 0; c0 < DC; c0 += TILE) {
        __m256 o[TILE];
        for (int c = 0; c < TILE; ++c) o[c] = _mm256_setzero_ps();
        for (int jv = 0; jv < keys; ++jv) {
          const float* vj = v + static_cast<int64_t>(lo + jv) * p.v_row + 8 * c0;
          const __m256 w = _mm256_set1_ps(sc[jv]);
          for (int c = 0; c < TILE; ++c)
            o[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * c), o[c]);
        }
        for (int c = 0; c < TILE; ++c) _mm256_storeu_ps(entry + 2 + 8 * (c0 + c), o[c]);
      }
    }
  }
}

}  // namespace

MLXCEL_TARGET void attention_part_avx2(const AttentionProblem& p, int kvh, int r0, int r1, int j0,
                                       int j1, float* part, float* scores) {
  switch (p.D) {
    case 64:
      return part_fast<8>(p, kvh, r0, r1, j0, j1, part, scores);
    case 96:
      return part_fast<12>(p, kvh, r0, r1, j0, j1, part, scores);
    case 128:
      return part_fast<16>(p, kvh, r0, r1, j0, j1, part, scores);
    case 256:
      return part_fast<32>(p, kvh, r0, r1, j0, j1, part, scores);
    default:
      return attention_part_avx2_loops(p, kvh, r0, r1, j0, j1, part, scores);
  }
}
}  // namespace mlxcel::kernels
