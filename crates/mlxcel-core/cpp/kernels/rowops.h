// Row-wise f32 helpers shared by the matmul epilogues and the fused decoder layer, so that both
// paths compute exactly the same numbers.
#pragma once

#include <cstdint>

#include "mlxcel-core/cpp/kernels/dispatch.h"

namespace mlxcel::kernels {

// RMSNorm as MLX computes it: out = x · rsqrt(mean(x²) + eps) · w, per row of x [M, K].
void rms_norm_rows(const float* x, int M, int K, const float* w, float eps, float* out);

// out[M, N/2] = silu(g) · u, g and u being the two halves of each row of y [M, N]
// (MLX's silu: g · sigmoid(g), sigmoid = 1 / (1 + e^-g), by fastmath.h's sigmoid_fast; sixteen
// lanes at a time when `isa` and the CPU allow AVX-512: the two forms agree to rounding).
void swiglu_rows(const float* y, int M, int N, float* out, Isa isa);
void swiglu_rows_avx512(const float* y, int M, int N, float* out);

// out[M, N/2] = gelu_tanh(g) · u over the two halves of each row of y [M, N] (MLX's and
// mlx-lm's gelu_approx: 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))), by tanh_fast; sixteen lanes
// at a time when `isa` and the CPU allow AVX-512).
void geglu_rows(const float* y, int M, int N, float* out, Isa isa);
void geglu_rows_avx512(const float* y, int M, int N, float* out);

// RoPE tables for one position (Hugging Face halves layout): θ_j = position · inv_freq[j].
void rope_tables(float position, const float* inv_freq, int half, float* cos_t, float* sin_t);

// Rotates one head of `2·half` features from x into y (x == y allowed).
void rope_head(const float* x, float* y, const float* cos_t, const float* sin_t, int half);

}  // namespace mlxcel::kernels
