// LoRA deltas inside the fused decoder layer (layer.cc): per row t of a step,
//
//   y[t] += Σ_j (s_j(t) · (x[t] · Aⱼᵀ)) · Bⱼᵀ
//
// over the adapters j with a pair on the projection, s_j(t) the row's sequence's scale for
// adapter j times the pair's alpha / rank. The sum is formed first and then added to y, the
// low-rank product scaled before its second matmul: the per-op graph's order of operations
// (crate::llama::lora), so that only the order of the sums inside the two small products
// differs from it. A row whose scale for an adapter is 0 skips that adapter (it adds nothing).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace mlxcel::kernels {

// One adapter's pair on one projection.
struct LoraDelta {
  const void* a_t;  // [in, rank]: Aᵀ, f32 or (half) f16
  const void* b_t;  // [rank, out]: Bᵀ, of a_t's type
  int in, out, rank;
  float factor;              // alpha / rank (or 1)
  const float* row_scales;   // [T]: each row's user scale for this adapter
  bool half;                 // the pair is f16 (widened exactly as it is read)
};

// y[t, :out] += the deltas' sum for rows [t0, t1) of x (rows `x_stride` apart) into y (rows
// `y_stride` apart). Every delta of the list has the same `in` and `out`.
void lora_add_rows(const std::vector<LoraDelta>& deltas, const float* x, int64_t x_stride,
                   float* y, int64_t y_stride, int t0, int t1);

// The projections a pair may sit on, in the codes the bridge takes (bridge.h).
enum LoraTarget : int { kLoraQ = 0, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown };
constexpr int kLoraTargets = 7;

// One layer's deltas, by target.
using LoraTargets = std::array<std::vector<LoraDelta>, kLoraTargets>;

}  // namespace mlxcel::kernels
