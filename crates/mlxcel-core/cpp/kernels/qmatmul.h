// Affine-quantized matrix multiplication y = x · Wᵀ on the CPU (MLX's layout: W is [N, K] packed
// into u32 words, lowest bits first; one f32 scale and bias per group of `group_size` weights
// along K). Plain C++ with no MLX or STL types, so that the ISA-specific translation units below
// can be compiled for instruction sets the build machine's baseline lacks (see isa.h).
#pragma once

#include <cstdint>

namespace mlxcel::kernels {

// One y[M, N] = x[M, K] · W[N, K]ᵀ problem; every array is dense row-major.
struct QProblem {
  const float* x;
  const uint32_t* w;
  // [N, K/group_size] each: f32, or IEEE half (as GGUF and most MLX checkpoints store them,
  // a sixth fewer bytes per 4-bit weight to stream) when `half`.
  const void* scales;
  const void* biases;
  bool half;
  float* y;
  int M, N, K, group_size, bits;
};

// IEEE half to float, portable (the scalar path; the SIMD paths use F16C).
float half_to_float(uint16_t h);

// Largest M the GEMV path serves with AVX2 (decode and small batches: it unpacks each weight once
// for all rows of x, in registers); AVX-512's 32 registers serve up to kGemvMaxRowsAvx512. Larger
// M takes the GEMM path.
constexpr int kGemvMaxRows = 4;
constexpr int kGemvMaxRowsAvx512 = 8;
// Output rows dequantized together by one GEMM task.
constexpr int kPanelRows = 16;
// Rows of x one GEMM task multiplies (bounds the x block kept in L2).
constexpr int kBlockRows = 64;

// The scalar path: the test reference, and the fallback without AVX2. It dequantizes each weight
// (scale·q + bias) and accumulates Σ_k w·x in order, in f32.
void scalar_rows(const QProblem& p, int m0, int m1, int n0, int n1);

// x prepared for the SIMD paths: for 4 bits each 32-value chunk of a row is reordered to its even
// positions then its odd positions (the order of the low and high nibbles of 16 packed bytes);
// for 8 bits x is unchanged. `sums` holds Σx per group per row ([M, K/group_size]).
void prepare_x(const QProblem& p, float* xprep, float* sums);

// GEMV over output rows [n0, n1) for every row of x (M <= kGemvMaxRows, or kGemvMaxRowsAvx512):
// y = Σ_g scale_g·(q_g · x_g) + Σ_g bias_g·(Σ x_g).
void avx2_gemv(const QProblem& p, const float* xprep, const float* sums, int n0, int n1);
void avx512_gemv(const QProblem& p, const float* xprep, const float* sums, int n0, int n1);

// GEMM tile: dequantizes rows [n0, n1) (at most kPanelRows) into `panel` ([kPanelRows, K] f32, in
// xprep's order) and multiplies x rows [m0, m1) by them.
void avx2_gemm(const QProblem& p, const float* xprep, float* panel, int m0, int m1, int n0,
               int n1);
void avx512_gemm(const QProblem& p, const float* xprep, float* panel, int m0, int m1, int n0,
                 int n1);

}  // namespace mlxcel::kernels
