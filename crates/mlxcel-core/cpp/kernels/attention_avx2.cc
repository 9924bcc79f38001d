// Attention for the avx2 path (see attention.inc; no STL containers here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"

#define MLXCEL_TARGET __attribute__((target("avx2,fma,f16c")))

#include <immintrin.h>

namespace mlxcel::kernels {
#define ATTENTION_PART_NAME attention_part_avx2_loops
#include "mlxcel-core/cpp/kernels/attention.inc"

namespace {

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

// Floats 8c .. 8c + 7 of a key or value row, widened exactly from f16 or q8_0 where the cache
// holds those.
MLXCEL_TARGET inline __m256 load8(const float* row, int c) { return _mm256_loadu_ps(row + 8 * c); }
MLXCEL_TARGET inline __m256 load8(const uint16_t* row, int c) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * c)));
}
MLXCEL_TARGET inline __m256 load8(const uint8_t* row, int c) {
  const uint8_t* block = row + (c >> 2) * kQ8BlockBytes;
  uint16_t bits;
  __builtin_memcpy(&bits, block, sizeof(bits));
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * (c & 3)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                       _mm256_set1_ps(_cvtsh_ss(bits)));
}

// Scores of HG query heads (qs) against keys lo .. lo + keys - 1, into sc[h·W + j] (j from 0):
// KB keys at a time, each key vector loaded once for the HG heads (the heads of a group share
// their kv head), HG·KB ≤ 8 accumulators reduced together by one transpose-and-add. Every score
// is ((x0+x4)+(x2+x6))+((x1+x5)+(x3+x7)) over the lanes of its own accumulator (sum8 and hsum8
// reduce every vector by that one tree), so it does not depend on the blocking.
// Four vectors to the vector of their sums, lane i = Σ lanes of a[i] by the tree
// ((x0+x4)+(x2+x6))+((x1+x5)+(x3+x7)) — hsum8's and sum8's — in 128-bit operations only (a
// 256-bit lane permute costs eight µops on CPUs that split 256-bit operations).
MLXCEL_TARGET inline __m128 sum4(const __m256* a) {
  __m128 t[4];
  for (int i = 0; i < 4; ++i)
    t[i] = _mm_add_ps(_mm256_castps256_ps128(a[i]), _mm256_extractf128_ps(a[i], 1));
  __m128 c[2];
  for (int i = 0; i < 2; ++i) {
    const __m128d x = _mm_castps_pd(t[2 * i]), y = _mm_castps_pd(t[2 * i + 1]);
    c[i] = _mm_add_ps(_mm_castpd_ps(_mm_unpacklo_pd(x, y)), _mm_castpd_ps(_mm_unpackhi_pd(x, y)));
  }
  return _mm_add_ps(_mm_shuffle_ps(c[0], c[1], 0x88), _mm_shuffle_ps(c[0], c[1], 0xDD));
}

template <int DC, int HG, int NB, typename KT>
MLXCEL_TARGET inline void scores_block(const float* const* qs, const KT* k, int64_t k_row, int j,
                                       float* sc, int W, __m256 scale) {
  constexpr int A = HG * NB <= 4 ? 4 : 8;
  __m256 acc[A];
  for (int a = HG * NB; a < A; ++a) acc[a] = _mm256_setzero_ps();
  {
    __m256 kv[NB];
    for (int b = 0; b < NB; ++b) kv[b] = load8(k + static_cast<int64_t>(j + b) * k_row, 0);
    for (int h = 0; h < HG; ++h) {
      const __m256 q = _mm256_loadu_ps(qs[h]);
      for (int b = 0; b < NB; ++b) acc[h * NB + b] = _mm256_mul_ps(q, kv[b]);
    }
  }
  for (int c = 1; c < DC; ++c) {
    __m256 kv[NB];
    for (int b = 0; b < NB; ++b) kv[b] = load8(k + static_cast<int64_t>(j + b) * k_row, c);
    for (int h = 0; h < HG; ++h) {
      const __m256 q = _mm256_loadu_ps(qs[h] + 8 * c);
      for (int b = 0; b < NB; ++b) acc[h * NB + b] = _mm256_fmadd_ps(q, kv[b], acc[h * NB + b]);
    }
  }
  alignas(16) float lanes[A];
  for (int a = 0; a < A; a += 4)
    _mm_store_ps(lanes + a, _mm_mul_ps(sum4(acc + a), _mm256_castps256_ps128(scale)));
  for (int h = 0; h < HG; ++h)
    for (int b = 0; b < NB; ++b) sc[h * W + b] = lanes[h * NB + b];
}

template <int DC, int HG, typename KT>
MLXCEL_TARGET inline void scores_group(const float* const* qs, const KT* k, int64_t k_row, int lo,
                                       int keys, float* sc, int W, __m256 scale) {
  constexpr int KB = HG == 1 ? 8 : HG == 2 ? 4 : 2;
  int j = 0;
  for (; j + KB <= keys; j += KB)
    scores_block<DC, HG, KB>(qs, k, k_row, lo + j, sc + j, W, scale);
  for (; j < keys; ++j) scores_block<DC, HG, 1>(qs, k, k_row, lo + j, sc + j, W, scale);
}

// Σ_j w[h·W + j]·v_j for HG heads into out[h] (D = 8·DC floats each): CC vectors of columns at
// a time for all HG heads (HG·CC ≤ 8 accumulators in registers), so each value vector is loaded
// once for the group. Per element: o = fma(w, v, o) in key order from 0, whatever the blocking.
template <int DC, int HG, typename VT>
MLXCEL_TARGET inline void values_group(const float* w, int W, const VT* v, int64_t v_row, int lo,
                                       int keys, float* const* out) {
  constexpr int CC = HG * 8 <= 8 && DC % 8 == 0 ? 8 : HG * 4 <= 8 && DC % 4 == 0 ? 4 : 2;
  static_assert(DC % CC == 0, "whole column blocks");
  for (int c0 = 0; c0 < DC; c0 += CC) {
    __m256 o[HG][CC];
    for (int h = 0; h < HG; ++h)
      for (int c = 0; c < CC; ++c) o[h][c] = _mm256_setzero_ps();
    for (int j = 0; j < keys; ++j) {
      const VT* vj = v + static_cast<int64_t>(lo + j) * v_row;
      __m256 vv[CC];
      for (int c = 0; c < CC; ++c) vv[c] = load8(vj, c0 + c);
      for (int h = 0; h < HG; ++h) {
        const __m256 wh = _mm256_broadcast_ss(w + h * W + j);
        for (int c = 0; c < CC; ++c) o[h][c] = _mm256_fmadd_ps(wh, vv[c], o[h][c]);
      }
    }
    for (int h = 0; h < HG; ++h)
      for (int c = 0; c < CC; ++c) _mm256_storeu_ps(out[h] + 8 * (c0 + c), o[h][c]);
  }
}

// The grouped partial attention with D = 8·DC: per query row, the group's heads four at a time
// (scores, then max, exponentials and their sum per head, then the weighted values), each key
// and value vector loaded once for up to four heads: the key range stays in L2 while the group
// reads it, and L1 traffic is what bounds this loop on CPUs that split 256-bit operations. Every
// row's arithmetic depends on its own position only, never on the block of rows or the batch it
// came in, nor on the grouping of heads.
template <int DC, typename KT, typename VT>
MLXCEL_TARGET void part_fast(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                             float* part, float* scores) {
  constexpr int D = 8 * DC;
  const int G = p.heads / p.kv_heads;
  const int W = j1 - j0;
  const int64_t stride = D + 2;
  const KT* k = static_cast<const KT*>(p.k) + kvh * p.k_head;
  const VT* v = static_cast<const VT*>(p.v) + kvh * p.v_head;
  const __m256 scale = _mm256_set1_ps(p.scale);
  for (int i = r0; i < r1; ++i) {
    const int len = p.causal ? p.L - p.n + i + 1 : p.L;
    const int hi = len < j1 ? len : j1;
    const int first = attention_first_key(p, i);
    const int lo = first > j0 ? first : j0;
    auto entry_of = [&](int g) {
      return part + (static_cast<int64_t>(g) * (r1 - r0) + (i - r0)) * stride;
    };
    for (int g = 0; g < G; ++g) {
      float* e = entry_of(g);
      e[0] = -__builtin_huge_valf();
      e[1] = 0.0f;
      for (int t = 0; t < D; ++t) e[2 + t] = 0.0f;
    }
    if (hi <= lo) continue;
    const int keys = hi - lo;
    for (int g0 = 0; g0 < G; g0 += 4) {
      const int hg = G - g0 < 4 ? G - g0 : 4;
      const float* qs[4];
      float* outs[4];
      for (int h = 0; h < hg; ++h) {
        qs[h] = p.q + (kvh * G + g0 + h) * p.q_head + i * p.q_row;
        outs[h] = entry_of(g0 + h) + 2;
      }
      float* sc0 = scores + g0 * W;
      switch (hg) {
        case 4: scores_group<DC, 4>(qs, k, p.k_row, lo, keys, sc0, W, scale); break;
        case 3: scores_group<DC, 3>(qs, k, p.k_row, lo, keys, sc0, W, scale); break;
        case 2: scores_group<DC, 2>(qs, k, p.k_row, lo, keys, sc0, W, scale); break;
        default: scores_group<DC, 1>(qs, k, p.k_row, lo, keys, sc0, W, scale); break;
      }
      for (int g = g0; g < g0 + hg; ++g) {
        float* sc = scores + g * W;
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
        float* entry = entry_of(g);
        entry[0] = max;
        entry[1] = sum;
      }
      switch (hg) {
        case 4: values_group<DC, 4>(sc0, W, v, p.v_row, lo, keys, outs); break;
        case 3: values_group<DC, 3>(sc0, W, v, p.v_row, lo, keys, outs); break;
        case 2: values_group<DC, 2>(sc0, W, v, p.v_row, lo, keys, outs); break;
        default: values_group<DC, 1>(sc0, W, v, p.v_row, lo, keys, outs); break;
      }
    }
  }
}

template <typename KT, typename VT>
MLXCEL_TARGET void part_typed(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                              float* part, float* scores) {
  switch (p.D) {
    case 64:
      return part_fast<8, KT, VT>(p, kvh, r0, r1, j0, j1, part, scores);
    case 96:
      return part_fast<12, KT, VT>(p, kvh, r0, r1, j0, j1, part, scores);
    case 128:
      return part_fast<16, KT, VT>(p, kvh, r0, r1, j0, j1, part, scores);
    case 256:
      return part_fast<32, KT, VT>(p, kvh, r0, r1, j0, j1, part, scores);
    default:
      return attention_part_avx2_loops(p, kvh, r0, r1, j0, j1, part, scores);
  }
}

// part_typed for the problem's value type (float; uint16_t: f16 bits; uint8_t: q8_0 rows).
template <typename KT>
MLXCEL_TARGET void part_typed_k(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                                float* part, float* scores) {
  if (p.v_dtype == KvDtype::F16)
    return part_typed<KT, uint16_t>(p, kvh, r0, r1, j0, j1, part, scores);
  if (p.v_dtype == KvDtype::Q8_0)
    return part_typed<KT, uint8_t>(p, kvh, r0, r1, j0, j1, part, scores);
  part_typed<KT, float>(p, kvh, r0, r1, j0, j1, part, scores);
}

}  // namespace

MLXCEL_TARGET void attention_part_avx2(const AttentionProblem& p, int kvh, int r0, int r1, int j0,
                                       int j1, float* part, float* scores) {
  if (p.k_dtype == KvDtype::F16) return part_typed_k<uint16_t>(p, kvh, r0, r1, j0, j1, part, scores);
  if (p.k_dtype == KvDtype::Q8_0) return part_typed_k<uint8_t>(p, kvh, r0, r1, j0, j1, part, scores);
  part_typed_k<float>(p, kvh, r0, r1, j0, j1, part, scores);
}
}  // namespace mlxcel::kernels
