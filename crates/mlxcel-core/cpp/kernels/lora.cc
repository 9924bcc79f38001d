// LoRA deltas for the fused decoder layer (lora.h).
#include "mlxcel-core/cpp/kernels/lora.h"

#include <algorithm>

namespace mlxcel::kernels {

namespace {

// low[r] = Σ_i x[i] · a_t[i, r], then times `scale`; d[c] = Σ_r low[r] · b_t[r, c]. Both loops
// run over contiguous rows of the transposed matrices (vectorized across r and across c), each
// sum in order.
__attribute__((target_clones("avx2", "default")))
void one_delta(const LoraDelta& p, const float* x, float scale, float* low, float* d) {
  const int rank = p.rank;
  std::fill(low, low + rank, 0.0f);
  for (int i = 0; i < p.in; ++i) {
    const float xi = x[i];
    const float* a = p.a_t + static_cast<int64_t>(i) * rank;
#pragma omp simd
    for (int r = 0; r < rank; ++r) low[r] += xi * a[r];
  }
  for (int r = 0; r < rank; ++r) low[r] *= scale;
  std::fill(d, d + p.out, 0.0f);
  for (int r = 0; r < rank; ++r) {
    const float lr = low[r];
    const float* b = p.b_t + static_cast<int64_t>(r) * p.out;
#pragma omp simd
    for (int c = 0; c < p.out; ++c) d[c] += lr * b[c];
  }
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
