// Scaled dot-product attention over one sequence's KV cache, on the CPU. Plain C++ with no STL,
// compiled once per instruction set (attention_*.cc) from attention.inc.
#pragma once

#include <cstdint>

namespace mlxcel::kernels {

// softmax(q·kᵀ·scale [+ causal mask]) · v for q [heads, n, D] against k, v [kv_heads, L, D]
// (grouped-query: head h reads kv head h / (heads / kv_heads)). The queries are the last n of the
// L positions, so with `causal` query i sees keys 0 ..= L - n + i. Strides are in elements; the
// last dimension is contiguous.
struct AttentionProblem {
  const float* q;
  const float* k;
  const float* v;
  float* out;  // row i of head h at out + h·out_head + i·out_row
  int heads, kv_heads, n, L, D;
  int64_t q_head, q_row, k_head, k_row, v_head, v_row, out_head, out_row;
  float scale;
  bool causal;
};

// Query rows [r0, r1) of head h; `scores` holds at least L floats.
void attention_rows_scalar(const AttentionProblem& p, int h, int r0, int r1, float* scores);
void attention_rows_avx2(const AttentionProblem& p, int h, int r0, int r1, float* scores);
void attention_rows_avx512(const AttentionProblem& p, int h, int r0, int r1, float* scores);

}  // namespace mlxcel::kernels
