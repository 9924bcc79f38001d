// LoRA deltas for the fused decoder layer (lora.h).
#include "mlxcel-core/cpp/kernels/lora.h"

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#include <immintrin.h>

#include <algorithm>

namespace mlxcel::kernels {

namespace {

// How many ranks and output columns one pass keeps in registers.
constexpr int kRankChunk = 16;
constexpr int kOutChunk = 32;

// Element i of a pair's matrix, widened to f32 (exactly) when the pair is f16.
inline float at(const void* m, bool half, int64_t i) {
  return half ? half_to_float(static_cast<const uint16_t*>(m)[i]) : static_cast<const float*>(m)[i];
}

// low[r] = Σ_i x[i] · a_t[i, r], then times `scale`; d[c] = Σ_r low[r] · b_t[r, c], the plain
// form (any ISA): each sum in order over i and over r.
void one_delta_plain(const LoraDelta& p, const float* x, float scale, float* low, float* d) {
  const int rank = p.rank;
  std::fill(low, low + rank, 0.0f);
  for (int i = 0; i < p.in; ++i) {
    const float xi = x[i];
    const int64_t row = static_cast<int64_t>(i) * rank;
    for (int r = 0; r < rank; ++r) low[r] += xi * at(p.a_t, p.half, row + r);
  }
  for (int r = 0; r < rank; ++r) low[r] *= scale;
  std::fill(d, d + p.out, 0.0f);
  for (int r = 0; r < rank; ++r) {
    const float lr = low[r];
    const int64_t row = static_cast<int64_t>(r) * p.out;
    for (int c = 0; c < p.out; ++c) d[c] += lr * at(p.b_t, p.half, row + c);
  }
}

#define LORA_AVX2 __attribute__((target("avx2,fma,f16c")))

// Eight values of a pair's matrix from element i on, as f32 (f16 widened exactly).
template <bool HALF>
LORA_AVX2 inline __m256 load8(const void* m, int64_t i) {
  if constexpr (HALF)
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(m) + i)));
  else
    return _mm256_loadu_ps(static_cast<const float*>(m) + i);
}

// The same two products with AVX2, the partial sums in registers: x · Aᵀ over sixteen ranks at
// a time, four rows of Aᵀ into four pairs of accumulators (the FMA chains interleaved, summed
// at the end), then low · Bᵀ over 32 columns at a time, every rank into the columns'
// accumulators. Only the order of the additions inside each product differs from the plain
// form (one rounding per FMA instead of a multiply and an add). An f16 pair is widened as it is
// read: half the bytes of an f32 one, the same values.
template <bool HALF>
LORA_AVX2 void one_delta_avx2(const LoraDelta& p, const float* x, float scale, float* low,
                              float* d) {
  const int rank = p.rank, in = p.in, out = p.out;
  int r0 = 0;
  for (; r0 + kRankChunk <= rank; r0 += kRankChunk) {
    __m256 acc[4][2];
    for (auto& u : acc) u[0] = u[1] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 4 <= in; i += 4)
      for (int u = 0; u < 4; ++u) {
        const int64_t a = static_cast<int64_t>(i + u) * rank + r0;
        const __m256 xi = _mm256_set1_ps(x[i + u]);
        acc[u][0] = _mm256_fmadd_ps(xi, load8<HALF>(p.a_t, a), acc[u][0]);
        acc[u][1] = _mm256_fmadd_ps(xi, load8<HALF>(p.a_t, a + 8), acc[u][1]);
      }
    for (; i < in; ++i) {
      const int64_t a = static_cast<int64_t>(i) * rank + r0;
      const __m256 xi = _mm256_set1_ps(x[i]);
      acc[0][0] = _mm256_fmadd_ps(xi, load8<HALF>(p.a_t, a), acc[0][0]);
      acc[0][1] = _mm256_fmadd_ps(xi, load8<HALF>(p.a_t, a + 8), acc[0][1]);
    }
    const __m256 s = _mm256_set1_ps(scale);
    for (int h = 0; h < 2; ++h) {
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[1][h]),
                                       _mm256_add_ps(acc[2][h], acc[3][h]));
      _mm256_storeu_ps(low + r0 + 8 * h, _mm256_mul_ps(sum, s));
    }
  }
  for (; r0 < rank; ++r0) {  // ranks past the last full chunk
    float sum = 0.0f;
    for (int i = 0; i < in; ++i) sum += x[i] * at(p.a_t, HALF, static_cast<int64_t>(i) * rank + r0);
    low[r0] = sum * scale;
  }
  int c0 = 0;
  for (; c0 + kOutChunk <= out; c0 += kOutChunk) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int r = 0; r < rank; ++r) {
      const int64_t b = static_cast<int64_t>(r) * out + c0;
      const __m256 lr = _mm256_set1_ps(low[r]);
      for (int v = 0; v < 4; ++v)
        acc[v] = _mm256_fmadd_ps(lr, load8<HALF>(p.b_t, b + 8 * v), acc[v]);
    }
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(d + c0 + 8 * v, acc[v]);
  }
  for (; c0 < out; ++c0) {  // columns past the last full chunk
    float sum = 0.0f;
    for (int r = 0; r < rank; ++r) sum += low[r] * at(p.b_t, HALF, static_cast<int64_t>(r) * out + c0);
    d[c0] = sum;
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
}

void one_delta(const LoraDelta& p, const float* x, float scale, float* low, float* d) {
  if (!has_avx2())
    one_delta_plain(p, x, scale, low, d);
  else if (p.half)
    one_delta_avx2<true>(p, x, scale, low, d);
  else
    one_delta_avx2<false>(p, x, scale, low, d);
}

}  // namespace

void lora_add_rows(const std::vector<LoraDelta>& deltas, const float* x, int64_t x_stride,
                   float* y, int64_t y_stride, int t0, int t1) {
  if (deltas.empty()) return;
  const int out = deltas.front().out;
  int rank = 0;
  for (const auto& p : deltas) rank = std::max(rank, p.rank);
  static thread_local std::vector<float> b_low, b_d, b_sum;
  if (b_low.size() < static_cast<size_t>(rank)) b_low.resize(rank);
  if (b_d.size() < static_cast<size_t>(out)) b_d.resize(out);
  if (b_sum.size() < static_cast<size_t>(out)) b_sum.resize(out);
  float *low = b_low.data(), *d = b_d.data(), *sum = b_sum.data();
  for (int t = t0; t < t1; ++t) {
    const float* xr = x + static_cast<int64_t>(t) * x_stride;
    bool any = false;
    for (const auto& p : deltas) {
      const float scale = p.row_scales[t] * p.factor;
      if (scale == 0.0f) continue;
      // The first adapter's delta is the sum; later ones are added to it.
      one_delta(p, xr, scale, low, any ? d : sum);
      if (any)
        for (int c = 0; c < out; ++c) sum[c] += d[c];
      any = true;
    }
    if (!any) continue;
    float* yr = y + static_cast<int64_t>(t) * y_stride;
    for (int c = 0; c < out; ++c) yr[c] += sum[c];
  }
}

}  // namespace mlxcel::kernels
