// Attention for the avx512 path (see attention.inc; no STL here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"
#include "mlxcel-core/cpp/kernels/fastmath_avx512.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

#include <immintrin.h>

namespace mlxcel::kernels {
#define ATTENTION_PART_NAME attention_part_avx512_loops
#include "mlxcel-core/cpp/kernels/attention.inc"

namespace {

// Sixteen vectors to the vector of their sums (lane i = Σ lanes of a[i]): a transpose-and-add
// tree, ~2 operations per vector instead of a full horizontal reduction each.
MLXCEL_TARGET inline __m512 sum16(__m512* a) {
  // Level 1: pairs (i, i+8) → 8 vectors, lanes of the two 256-bit halves interleaved.
  __m512 b[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 lo = _mm512_shuffle_f32x4(a[i], a[i + 8], 0x44);  // a.lo256, c.lo256
    const __m512 hi = _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE);  // a.hi256, c.hi256
    b[i] = _mm512_add_ps(lo, hi);
  }
  // Level 2: pairs (i, i+4): 128-bit lanes.
  __m512 c[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 lo = _mm512_shuffle_f32x4(b[i], b[i + 4], 0x88);
    const __m512 hi = _mm512_shuffle_f32x4(b[i], b[i + 4], 0xDD);
    c[i] = _mm512_add_ps(lo, hi);
  }
  // Level 3: pairs (i, i+2): 64-bit halves of each 128-bit lane.
  __m512 e[2];
  for (int i = 0; i < 2; ++i) {
    const __m512 lo = _mm512_castpd_ps(
        _mm512_unpacklo_pd(_mm512_castps_pd(c[i]), _mm512_castps_pd(c[i + 2])));
    const __m512 hi = _mm512_castpd_ps(
        _mm512_unpackhi_pd(_mm512_castps_pd(c[i]), _mm512_castps_pd(c[i + 2])));
    e[i] = _mm512_add_ps(lo, hi);
  }
  // Level 4: adjacent floats.
  const __m512 lo = _mm512_shuffle_ps(e[0], e[1], 0x88);
  const __m512 hi = _mm512_shuffle_ps(e[0], e[1], 0xDD);
  return _mm512_add_ps(lo, hi);
}

// The lane order sum16 produces, found once by feeding it one-hot vectors.
struct Sum16Order {
  int lane_of[16];  // lane_of[i]: where the sum of a[i] lands
};

MLXCEL_TARGET Sum16Order sum16_order() {
  Sum16Order order{};
  for (int i = 0; i < 16; ++i) {
    __m512 a[16];
    for (int j = 0; j < 16; ++j) a[j] = _mm512_set1_ps(j == i ? 1.0f : 0.0f);
    alignas(64) float out[16];
    _mm512_store_ps(out, sum16(a));
    for (int l = 0; l < 16; ++l)
      if (out[l] != 0.0f) order.lane_of[i] = l;
  }
  return order;
}

// The permutation that puts sum16's sums back in the order of its inputs (lane i: Σ a[i]).
MLXCEL_TARGET __m512i sum16_key_order() {
  const Sum16Order order = sum16_order();
  alignas(64) int32_t lanes[16];
  for (int i = 0; i < 16; ++i) lanes[i] = order.lane_of[i];
  return _mm512_load_si512(lanes);
}

using fast512::exp16;  // e^x for x <= 0 (attention.inc's exp_nonpositive, 16 lanes)

// Floats 16c .. 16c + 15 of a key or value row, widened exactly from f16 or q8_0 where the
// cache holds those (the result is then the f32 kernel's on the widened values).
MLXCEL_TARGET inline __m512 load16(const float* row, int c) { return _mm512_loadu_ps(row + 16 * c); }
MLXCEL_TARGET inline __m512 load16(const uint16_t* row, int c) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * c)));
}
MLXCEL_TARGET inline __m512 load16(const uint8_t* row, int c) {
  const uint8_t* block = row + (c >> 1) * kQ8BlockBytes;
  uint16_t bits;
  __builtin_memcpy(&bits, block, sizeof(bits));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 + 16 * (c & 1)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                       _mm512_set1_ps(_cvtsh_ss(bits)));
}

// Query heads per kv head that part_fast takes.
constexpr int kFastGroupMax = 8;

// Σ w·v over keys [lo, lo + keys) for GN heads of a group and the DC vectors of each value row
// from vector c0 on, the sums in registers: each value vector is loaded (and widened) once for
// the GN heads, whose weights for the key are broadcast first. GN·DC sums + GN weights + one
// value vector: GN ≤ 4 at DC = 4 (21 registers), ≤ 3 at DC = 8 (28); D = 256 is taken as two
// column halves of DC = 8. Every output element is one FMA chain in key order, whoever computes
// it and whichever columns it is taken with.
template <int GN, int DC, typename VT>
MLXCEL_TARGET inline void weighted_values(const VT* v, int64_t v_row, int lo, int keys,
                                          const float* ws, int W, float* const* entry,
                                          int c0 = 0) {
  __m512 o[GN][DC];
  for (int g = 0; g < GN; ++g)
    for (int c = 0; c < DC; ++c) o[g][c] = _mm512_setzero_ps();
  for (int j = 0; j < keys; ++j) {
    const VT* vj = v + static_cast<int64_t>(lo + j) * v_row;
    __m512 w[GN];
    for (int g = 0; g < GN; ++g) w[g] = _mm512_set1_ps(ws[g * W + j]);
    for (int c = 0; c < DC; ++c) {
      const __m512 vv = load16(vj, c0 + c);
      for (int g = 0; g < GN; ++g) o[g][c] = _mm512_fmadd_ps(w[g], vv, o[g][c]);
    }
  }
  for (int g = 0; g < GN; ++g)
    for (int c = 0; c < DC; ++c) _mm512_storeu_ps(entry[g] + 2 + 16 * (c0 + c), o[g][c]);
}

// Sixteen keys' dot products with one query row, acc[jj] for key jj (row kj + jj·kstride):
// each a chain of D/16 multiply-adds in vector order, then sum16. Up to D = 128 the query stays
// in registers beside the sixteen sums; at D = 256 (DC = 16) the query and the sums would fill
// all 32, so the loop runs vector by vector over all sixteen keys, the query's vector loaded once
// each: the same chains in the same order, so the same bits.
template <int DC>
MLXCEL_TARGET inline void dot16(const float* q, const float* kbase, int64_t kstride,
                                __m512 (&acc)[16]) {
  if constexpr (DC <= 8) {
    __m512 qv[DC];
    for (int c = 0; c < DC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
    for (int jj = 0; jj < 16; ++jj) {
      const float* kj = kbase + jj * kstride;
      acc[jj] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
      for (int c = 1; c < DC; ++c)
        acc[jj] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), acc[jj]);
    }
  } else {
    const __m512 q0 = _mm512_loadu_ps(q);
    for (int jj = 0; jj < 16; ++jj)
      acc[jj] = _mm512_mul_ps(q0, _mm512_loadu_ps(kbase + jj * kstride));
    for (int c = 1; c < DC; ++c) {
      const __m512 qc = _mm512_loadu_ps(q + 16 * c);
      for (int jj = 0; jj < 16; ++jj)
        acc[jj] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(kbase + jj * kstride + 16 * c), acc[jj]);
    }
  }
}

// Up to this many query rows share one pass over a task's keys (the rows a task has in
// attention.cc); more are taken in groups of this many.
constexpr int kFastRows = 8;

// The grouped partial attention with D = 16·DC, G ≤ kFastGroupMax. Scores: the keys in blocks
// of sixteen, each block widened to f32 once (f16, q8_0) into `scores`' last 16·D floats and
// scored from there by every query row and head of the task (one transpose-and-add per block
// and query instead of a reduction per key; a key where a row's range cuts a block is scored
// on its own, by the same tree). Then, per row, the softmax and the weighted sum of values in
// registers (weighted_values). KT and VT: float, uint16_t (f16) or uint8_t (q8_0 rows).
template <int DC, typename KT, typename VT>
MLXCEL_TARGET void part_fast(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                             float* part, float* scores) {
  static const __m512i in_key_order = sum16_key_order();
  constexpr int D = 16 * DC;
  const int G = p.heads / p.kv_heads;
  const int W = j1 - j0;
  const int64_t stride = D + 2;
  const KT* k = static_cast<const KT*>(p.k) + kvh * p.k_head;
  const VT* v = static_cast<const VT*>(p.v) + kvh * p.v_head;
  const __m512 scale = _mm512_set1_ps(p.scale);
  float* const wide = scores + static_cast<int64_t>(kFastRows) * G * W;  // 16 keys, widened
  for (int rg = r0; rg < r1; rg += kFastRows) {
    const int re = r1 - rg < kFastRows ? r1 : rg + kFastRows;
    int lo_of[kFastRows], hi_of[kFastRows];
    int lo_all = j1, hi_all = j0;
    for (int i = rg; i < re; ++i) {
      const int len = p.causal ? p.L - p.n + i + 1 : p.L;
      const int hi = len < j1 ? len : j1;
      const int first = attention_first_key(p, i);
      const int lo = first > j0 ? first : j0;
      lo_of[i - rg] = lo;
      hi_of[i - rg] = hi;
      if (hi > lo) {
        lo_all = lo < lo_all ? lo : lo_all;
        hi_all = hi > hi_all ? hi : hi_all;
      }
      for (int g = 0; g < G; ++g) {
        float* e = part + (static_cast<int64_t>(g) * (r1 - r0) + (i - r0)) * stride;
        e[0] = -__builtin_huge_valf();
        e[1] = 0.0f;
        for (int t = 0; t < D; ++t) e[2 + t] = 0.0f;
      }
    }
    // Row i's scores of head g: scores + ((i - rg)·G + g)·W, key j at index j - lo_of[i - rg].
    for (int kb = lo_all; kb < hi_all; kb += 16) {
      const int kn = hi_all - kb < 16 ? hi_all - kb : 16;
      const float* kbase;
      int64_t kstride;
      if constexpr (sizeof(KT) == sizeof(float)) {  // f32 keys are read in place
        kbase = reinterpret_cast<const float*>(k) + static_cast<int64_t>(kb) * p.k_row;
        kstride = p.k_row;
      } else {
        for (int jj = 0; jj < kn; ++jj) {
          const KT* kj = k + static_cast<int64_t>(kb + jj) * p.k_row;
          for (int c = 0; c < DC; ++c) _mm512_storeu_ps(wide + jj * D + 16 * c, load16(kj, c));
        }
        kbase = wide;
        kstride = D;
      }
      for (int i = rg; i < re; ++i) {
        const int lo = lo_of[i - rg], hi = hi_of[i - rg];
        const int a = kb > lo ? kb : lo, b = kb + kn < hi ? kb + kn : hi;
        if (a >= b) continue;
        for (int g = 0; g < G; ++g) {
          const float* q = p.q + (kvh * G + g) * p.q_head + i * p.q_row;
          float* sc = scores + (static_cast<int64_t>(i - rg) * G + g) * W - lo;
          if (a == kb && b - a == 16) {
            __m512 acc[16];
            dot16<DC>(q, kbase, kstride, acc);
            _mm512_storeu_ps(sc + kb, _mm512_permutexvar_ps(in_key_order,
                                                            _mm512_mul_ps(sum16(acc), scale)));
          } else {
            for (int j = a; j < b; ++j) {
              const float* kj = kbase + (j - kb) * kstride;
              __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kj));
              for (int c = 1; c < DC; ++c)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(kj + 16 * c),
                                      acc);
              sc[j] = _mm512_reduce_add_ps(acc) * p.scale;
            }
          }
        }
      }
    }
    for (int i = rg; i < re; ++i) {
      const int lo = lo_of[i - rg], hi = hi_of[i - rg];
      if (hi <= lo) continue;
      const int keys = hi - lo;
      float* entry[kFastGroupMax];
      for (int g = 0; g < G; ++g)
        entry[g] = part + (static_cast<int64_t>(g) * (r1 - r0) + (i - r0)) * stride;
      float* const row_scores = scores + static_cast<int64_t>(i - rg) * G * W;
      for (int g = 0; g < G; ++g) {
        float* sc = row_scores + g * W;
        if (p.softcap > 0.0f) {
          const float cap = p.softcap;
#pragma omp simd
          for (int t = 0; t < keys; ++t) sc[t] = cap * tanh_fast(sc[t] / cap);
        }
        // Max, exponentials and their sum.
        __m512 mv = _mm512_set1_ps(-3.0e38f);
        int t = 0;
        for (; t + 16 <= keys; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + t));
        float max = _mm512_reduce_max_ps(mv);
        for (; t < keys; ++t) max = sc[t] > max ? sc[t] : max;
        const __m512 mx = _mm512_set1_ps(max);
        __m512 sv = _mm512_setzero_ps();
        t = 0;
        for (; t + 16 <= keys; t += 16) {
          const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + t), mx));
          _mm512_storeu_ps(sc + t, e);
          sv = _mm512_add_ps(sv, e);
        }
        float sum = _mm512_reduce_add_ps(sv);
        if (t < keys) {
          const __mmask16 m = static_cast<__mmask16>((1u << (keys - t)) - 1u);
          const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + t), mx));
          _mm512_mask_storeu_ps(sc + t, m, e);
          sum += _mm512_reduce_add_ps(_mm512_maskz_mov_ps(m, e));
        }
        entry[g][0] = max;
        entry[g][1] = sum;
      }
      // Σ w·v for every head of the group, kPass heads a pass (the heads' counts as template
      // arguments: with a run-time count GCC kept the sums in memory, a store per head, key and
      // vector), over column runs of at most eight vectors (D = 256: two halves). A second pass
      // reads the block's values again, from cache.
      constexpr int kCols = DC <= 8 ? DC : 8;
      constexpr int kPass = kCols <= 4 ? 4 : 3;
      for (int c0 = 0; c0 < DC; c0 += kCols) {
        for (int g0 = 0; g0 < G; g0 += kPass) {
          const int gn = G - g0 < kPass ? G - g0 : kPass;
          const float* ws = row_scores + static_cast<int64_t>(g0) * W;
          float* const* e = entry + g0;
          if (gn == 1) weighted_values<1, kCols>(v, p.v_row, lo, keys, ws, W, e, c0);
          else if (gn == 2) weighted_values<2, kCols>(v, p.v_row, lo, keys, ws, W, e, c0);
          else if (gn == 3) weighted_values<3, kCols>(v, p.v_row, lo, keys, ws, W, e, c0);
          else weighted_values<kPass, kCols>(v, p.v_row, lo, keys, ws, W, e, c0);
        }
      }
    }
  }
}

// part_fast for the problem's value type, then key type (float; uint16_t: f16 bits; uint8_t:
// q8_0 rows).
template <int DC, typename KT>
MLXCEL_TARGET void part_fast_k(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                               float* part, float* scores) {
  if (p.v_dtype == KvDtype::F16)
    return part_fast<DC, KT, uint16_t>(p, kvh, r0, r1, j0, j1, part, scores);
  if (p.v_dtype == KvDtype::Q8_0)
    return part_fast<DC, KT, uint8_t>(p, kvh, r0, r1, j0, j1, part, scores);
  part_fast<DC, KT, float>(p, kvh, r0, r1, j0, j1, part, scores);
}

template <int DC>
MLXCEL_TARGET void part_fast_typed(const AttentionProblem& p, int kvh, int r0, int r1, int j0,
                                   int j1, float* part, float* scores) {
  if (p.k_dtype == KvDtype::F16)
    return part_fast_k<DC, uint16_t>(p, kvh, r0, r1, j0, j1, part, scores);
  if (p.k_dtype == KvDtype::Q8_0)
    return part_fast_k<DC, uint8_t>(p, kvh, r0, r1, j0, j1, part, scores);
  part_fast_k<DC, float>(p, kvh, r0, r1, j0, j1, part, scores);
}

}  // namespace

MLXCEL_TARGET void attention_part_avx512(const AttentionProblem& p, int kvh, int r0, int r1,
                                         int j0, int j1, float* part, float* scores) {
  const int G = p.heads / p.kv_heads;
  if (G <= kFastGroupMax) {
    if (p.D == 64) return part_fast_typed<4>(p, kvh, r0, r1, j0, j1, part, scores);
    if (p.D == 128) return part_fast_typed<8>(p, kvh, r0, r1, j0, j1, part, scores);
    if (p.D == 256) return part_fast_typed<16>(p, kvh, r0, r1, j0, j1, part, scores);
  }
  attention_part_avx512_loops(p, kvh, r0, r1, j0, j1, part, scores);
}
}  // namespace mlxcel::kernels
