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
// With `sinks` (gpt-oss), head h's softmax has one more logit, sinks[h], in its denominator and
// none in its sum of values: softmax([scores, sinks[h]]) with the sink's column dropped (the sink
// is neither scaled nor capped). It joins when the partials of a row are merged, so every path
// and every key and value type takes it the same way.
// Strides are in elements; the last dimension is contiguous. Keys and values are f32, f16 (IEEE
// half) or q8_0 (below; its strides in bytes), widened exactly on load: the result is the f32
// problem's on the widened values.
enum class KvDtype : uint8_t { F32 = 0, F16 = 1, Q8_0 = 2 };

struct AttentionProblem {
  const float* q;
  const void* k;  // float, uint16_t (f16 bits) or uint8_t (q8_0 rows), as k_dtype says
  const void* v;  // as v_dtype says
  float* out;  // row i of head h at out + h·out_head + i·out_row
  int heads, kv_heads, n, L, D;
  int64_t q_head, q_row, k_head, k_row, v_head, v_row, out_head, out_row;
  float scale;
  bool causal;
  int window;  // 0: no sliding window
  float softcap;  // 0: none
  const float* sinks = nullptr;  // [heads] logits, or none
  KvDtype k_dtype = KvDtype::F32;
  KvDtype v_dtype = KvDtype::F32;
  // Keys and values in blocks of kKvBlock positions (a KV cache's blocks, anywhere in memory):
  // when set, key j of kv head h is at k_blocks[j / kKvBlock] + h·k_head + (j % kKvBlock)·k_row
  // (`k` unused; k_head is a head's stride within a block), and likewise for values.
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  // With block tables, optionally each block's own strides (4 per block: k_head, k_row, v_head,
  // v_row), for blocks laid out differently (a block a step wrote whole may be a view of that
  // step's keys); none: every block has the problem's.
  const int64_t* block_strides = nullptr;
};

// Positions per KV-cache block: the key ranges attention() splits a problem into are these
// blocks, so each task reads one block.
constexpr int kKvBlock = 256;

// The IEEE half nearest to f (ties to even; overflow to infinity, NaN stays NaN), as MLX's
// astype(float16) and F16C's conversion round.
inline uint16_t float_to_half(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u)  // infinity, NaN (kept quiet, top payload bits kept)
    return sign | 0x7C00u | (x > 0x7F800000u ? 0x0200u | ((x >> 13) & 0x03FFu) : 0u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up round to infinity
  if (x >= 0x38800000u) {  // a normal half: rebias the exponent, round the 13 dropped bits
    x += 0xC8000FFFu + ((x >> 13) & 1u);
    return sign | static_cast<uint16_t>(x >> 13);
  }
  // Below 2^-14: a subnormal half (or zero). Adding 0.5 (ulp 2^-24, the subnormal step) rounds
  // the magnitude to a multiple of 2^-24 in the float unit, ties to even.
  float magnitude;
  __builtin_memcpy(&magnitude, &x, sizeof(magnitude));
  magnitude += 0.5f;
  uint32_t bits;
  __builtin_memcpy(&bits, &magnitude, sizeof(bits));
  return sign | static_cast<uint16_t>(bits - 0x3F000000u);
}

// IEEE half bits to float, exactly (subnormals, infinities and NaNs included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal: m·2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    __builtin_memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}



// q8_0 rows (llama.cpp's block_q8_0 laid end to end): per 32 values, the scale d as IEEE half
// bits (2 bytes, little-endian) then 32 signed bytes q; value t of a block is q[t]·d. A row of D
// values (D a multiple of 32) is D / 32 · 34 bytes.
constexpr int kQ8Block = 32;
constexpr int kQ8BlockBytes = 34;

// The scale of the q8_0 block at `block`, widened.
inline float q8_scale(const uint8_t* block) {
  uint16_t bits;
  __builtin_memcpy(&bits, block, sizeof(bits));
  return half_to_float(bits);
}

// D floats (D a multiple of 32) as q8_0 blocks at `dst`, as llama.cpp's reference quantizer
// computes them: d = max |x| / 127, q = round(x / d) (x · (1 / d), halves away from zero), d
// stored as the nearest half. A non-finite x gives q = 0 (a cache holds finite values).
inline void quantize_q8_0_row(const float* x, int D, uint8_t* dst) {
  for (int b = 0; b < D / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    uint8_t* block = dst + b * kQ8BlockBytes;
    float amax = 0.0f;
    for (int t = 0; t < kQ8Block; ++t) {
      const float a = __builtin_fabsf(xb[t]);
      amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t bits = float_to_half(d);
    __builtin_memcpy(block, &bits, sizeof(bits));
    for (int t = 0; t < kQ8Block; ++t) {
      const float r = __builtin_roundf(xb[t] * id);
      const float c = r == r ? (r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r) : 0.0f;
      block[2 + t] = static_cast<uint8_t>(static_cast<int8_t>(c));
    }
  }
}

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
// major; a row with no key in range gets max -inf, sum 0. `scores` holds
// 8·G·(j1 - j0) + 16·D floats (scratch: the scores of up to 8 rows, then room to widen 16 f16
// or q8_0 rows).
// attention_merge() turns the partials of a row's key ranges into its output.
void attention_part_scalar(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                           float* part, float* scores);
void attention_part_avx2(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                         float* part, float* scores);
void attention_part_avx512(const AttentionProblem& p, int kvh, int r0, int r1, int j0, int j1,
                           float* part, float* scores);

// out[0, D) = Σ_s e^(max_s - M)·o_s / (Σ_s e^(max_s - M)·sum_s + e^(sink - M)) over `count`
// partials of one (head, row), `stride` floats apart (M the largest of the max_s and the sink;
// sink = -inf: none).
void attention_merge(const float* parts, int count, int64_t stride, int D, float sink, float* out);

enum class Isa : uint8_t;

// Every problem's attention (each writing its own `out`), on up to `threads` threads with the
// best path at or below `isa` (attention.cc).
void attention(const AttentionProblem* problems, int count, Isa isa, int threads);

}  // namespace mlxcel::kernels
