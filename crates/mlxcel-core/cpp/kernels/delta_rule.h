// The gated delta rule of gated-DeltaNet layers (Qwen3-Next, Qwen3.5) and their short causal
// convolution on the host, f32 throughout (src/delta_rule.rs states the rule and the chunked
// form's algebra). The per-head kernels are written once in plain loops (delta_rule.inc) and
// compiled for the scalar, AVX2 and AVX-512 paths; delta_rule.cc shares the heads out over the
// kernel pool and picks the path.
#pragma once

#include <cstdint>

#include "mlxcel-core/cpp/kernels/dispatch.h"

namespace mlxcel::kernels {

// Tokens per chunk of the chunked form (the reference implementations' 64).
constexpr int kDeltaChunk = 64;

// One value head's view of a run of `n` tokens: token t's query and key rows (dk floats) start
// at q + t·key_stride and k + t·key_stride, its value row (dv floats) at v + t·value_stride, its
// ln g and β at log_decay[t·head_stride] and beta[t·head_stride]; the head's output row for
// token t is y + t·y_stride (dv floats), and its state s is [dv, dk], row-major.
struct DeltaHead {
  int dk, dv;
  const float* q;
  const float* k;
  int64_t key_stride;
  const float* v;
  int64_t value_stride;
  const float* log_decay;
  const float* beta;
  int64_t head_stride;
  float* y;
  int64_t y_stride;
  float* s;
};

// Floats of scratch delta_chunked_* needs for one head of key and value widths dk, dv.
int64_t delta_chunk_scratch(int dk, int dv);

// The rule token by token over tokens [0, n) of `h` (decode's form).
void delta_recurrent_scalar(const DeltaHead& h, int n);
void delta_recurrent_avx2(const DeltaHead& h, int n);
void delta_recurrent_avx512(const DeltaHead& h, int n);

// The same outputs in chunks of kDeltaChunk on the grid of absolute positions (`position` is
// token 0's), with `scratch` of delta_chunk_scratch floats (prefill's form).
void delta_chunked_scalar(const DeltaHead& h, int n, int64_t position, float* scratch);
void delta_chunked_avx2(const DeltaHead& h, int n, int64_t position, float* scratch);
void delta_chunked_avx512(const DeltaHead& h, int n, int64_t position, float* scratch);

// Rows [t0, t1) of the causal depthwise convolution then SiLU: out[t, c] = silu(Σ_j
// w[c, j]·row(t + j)[c]) with row(r) the r-th row of tail ‖ x (tail: `taps - 1` rows), over
// `channels` channels; w is [taps, channels] (the checkpoint's [channels, taps] transposed, so
// that the loop over channels reads both rows in order).
void delta_conv_scalar(const float* x, const float* tail, const float* w, int channels, int taps,
                       int t0, int t1, float* out);
void delta_conv_avx2(const float* x, const float* tail, const float* w, int channels, int taps,
                     int t0, int t1, float* out);
void delta_conv_avx512(const float* x, const float* tail, const float* w, int channels, int taps,
                       int t0, int t1, float* out);

}  // namespace mlxcel::kernels
