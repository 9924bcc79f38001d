// Scaled dot-product attention over one sequence's KV cache, on the CPU. Plain C++ with no STL,
// compiled once per instruction set (attention_*.cc) from attention.inc.
#pragma once

#include <cstdint>

#include "mlxcel-core/cpp/kernels/fastmath.h"

namespace mlxcel::kernels {

// softmax(q·kᵀ·scale [+ causal mask]) · v for q [heads, n, D] against k, v [kv_heads, L, D]
// (grouped-query: head h reads kv head h / (heads / kv_heads)). The queries are the last n of the
// L positions, so with `causal` query i sees keys 0 ..= L - n + i; with a sliding `window` (> 0)
// only the keys L - n + i - window + 1 ..= L - n + i of those (itself and the window - 1 before
// it). With a `softcap` (> 0) each scaled score s becomes softcap·tanh(s / softcap) (Gemma 2).
// Strides are in elements; the last dimension is contiguous.
struct AttentionProblem {
  const float* q;
  const float* k;
  const float* v;
  float* out;  // row i of head h at out + h·out_head + i·out_row
  int heads, kv_heads, n, L, D;
  int64_t q_head, q_row, k_head, k_row, v_head, v_row, out_head, out_row;
  float scale;
  bool causal;
  int window;  // 0: no sliding window
  float softcap;  // 0: none
};

// A scaled score after the problem's soft-capping (tanh_fast: absolute error ~1e-7 on tanh).
inline float attention_cap(const AttentionProblem& p, float score) {
  return p.softcap > 0.0f ? p.softcap * tanh_fast(score / p.softcap) : score;
}

// The first key query row i of `p` may see (0 without a window).
inline int attention_first_key(const AttentionProblem& p, int i) {
  const int first = p.L - p.n + i - p.window + 1;
  return p.window > 0 && first > 0 ? first : 0;
}

// Floats per (head, query row) in a partial-attention buffer: the row's max score, its sum of
// exponentials, then D floats of Σ e^(score - max)·v.
inline int attention_part_stride(int D) { return D + 2; }

// Partial attention of the G = heads / kv_heads query heads that share kv head `kvh`, query rows
// [r0, r1), over keys [j0, j1) (and the causal bound): each key and value row is read once for
// the whole group. Writes G·(r1 - r0) entries of attention_part_stride(D) floats to `part`, head
// major; a row with no key in range gets max -inf, sum 0. `scores` holds G·(j1 - j0) floats.
// attention_merge() turns the partials of a row's key ranges into its output.
void attention_part_scalar(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                           float* part, float* scores);
void attention_part_avx2(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                         float* part, float* scores);
void attention_part_avx512(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                           float* part, float* scores);

// out[0, D) = Σ_s e^(max_s - M)·o_s / Σ_s e^(max_s - M)·sum_s over `count` partials of one
// (head, row), `stride` floats apart (M the largest max_s).
void attention_merge(const float* parts, int count, int64_t stride, int D, float* out);

enum class Isa : uint8_t;

// Every problem's attention (each writing its own `out`), on up to `threads` threads with the
// best path at or below `isa` (attention.cc).
void attention(const AttentionProblem* problems, int count, Isa isa, int threads);

}  // namespace mlxcel::kernels
