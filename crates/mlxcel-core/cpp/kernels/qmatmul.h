// Affine-quantized matrix multiplication y = x · Wᵀ on the CPU (MLX's layout: W is [N, K] packed
// into u32 words, lowest bits first; one f32 scale and bias per group of `group_size` weights
// along K: 32, 64 or 128 as in MLX, or 16, which MLX lacks, for GGUF's Q6_K, Q3_K and Q2_K). Plain C++ with no MLX or STL types, so that the ISA-specific translation units below
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
  // The weights are in the interleaved layout of `interleave_int8` (N a multiple of
  // kInt8TileRows) and x is quantized to int8 per block of 32 inside the call (qmatmul_int8.cc).
  bool int8;
  // (int8 only) scales and biases are factored (`factor_int8_scales`): u8 buffers, not floats.
  bool factored;
  // (int8 only) nonzero: every bias is this power of two times its group's scale, bit for bit
  // (`bias_multiple`), and is computed so (one exact f32 multiply); `biases` is not read.
  float bias_scale;
  // (int8 layout only) x stays f32: the weights are read in the int8 layout, any of its forms,
  // and multiplied by x unquantized (below, "f32 activations over the int8 layout").
  bool f32x;
  // (int8 layout, 4-bit codes only) the nibbles are E2M1 (MXFP4) indices, not codes: the code
  // each stands for is kE2m1Codes[nibble] (below, "E2M1 codes").
  bool e2m1;
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

// ---- int8 activations (opt-in; qmatmul_int8.cc) ----
//
// Weights interleaved 16 output rows at a time so that one 32-bit lane holds four consecutive
// weights of one row: `vpdpbusd` then multiplies 16 rows by 4 values of x per instruction (64
// multiply-adds, where an f32 FMA does 16), into integer sums that need no horizontal reduction.
// x is quantized per row and block of 32 values: xq = round(x · 127 / max|x|).
//
// Per output (m, n), in this order (every path computes exactly this, so results are bitwise
// the same on every path, for every M and thread count, and a row's result never depends on
// the other rows of x):
//   acc = 0; for each block j of 32 along K, in the weight group g that holds it:
//     I = Σ q[n, k]·xq[m, k] over the block (exact, int32)
//     acc = fma(float(I), scale[n, g] · dx[m, j], acc)
//     acc = fma(bias[n, g], Σx[m, j], acc)
// With groups of 16 each block spans groups g = 2j and g + 1, and each half h (values 16h ..
// 16h + 15 of the block) takes its own sum and pair of FMAs, first half first:
//     I_h = Σ q[n, k]·xq[m, k] over half h
//     acc = fma(float(I_h), scale[n, 2j + h] · dx[m, j], acc)
//     acc = fma(bias[n, 2j + h], Σx[m, j, h], acc)
// where Σx[m, j, h] is the half's exact-order sum (below).
//
// Factored weights (QProblem::factored: the K-quants) take x quantized per superblock of 256
// values instead, as llama.cpp's Q8_K does for these types: one step dx[m, s] = max|x| / 127
// over the superblock, and the exact integer sums of its codes per group (B_g). Then every
// group's sub-scale applies to an exact integer, and the float arithmetic happens once per
// superblock, not once per group and row: per output (m, n) and superblock s, in this order,
//   S = Σ_g c[n, g] · I_g      I_g = Σ q[n, k]·xq[m, k] over group g      (exact, int32)
//   T = Σ_g cb[n, g] · B_g     B_g = Σ xq[m, k] over group g              (exact, int32)
//   acc = fma(float(S), d[n, s] · dx[m, s], acc)
//   acc = fma(float(T), e[n, s] · dx[m, s], acc)
// where the scales are d[n, s] · c[n, g] and the biases e[n, s] · cb[n, g] (factored, below),
// or, with biases derived from the scales (bias_scale), cb = c and e = bias_scale · d. The
// integers fit: |I_g| ≤ 16 · 255 · 127 per 16 values and |c| ≤ 128, so |S| < 2^31 for any
// code width. It reads fewer floats and does one integer multiply-add per group and row where
// the per-block form does two FMAs and a multiply (docs/kernels.md, "Superblock activations").
constexpr int kInt8TileRows = 16;
// How far ahead (bytes) the int8 kernels prefetch a tile's weights into L2
// (qmatmul_int8_avx512.cc says why).
constexpr int64_t kInt8PrefetchAhead = 8192;
constexpr int kInt8Block = 32;

// Rewrites W (MLX layout, N a multiple of kInt8TileRows) into the interleaved layout: `w_out`
// gets tile t's bytes at t · 2·K·out_bits (same size as W when out_bits = bits); within a tile, for 4 bits,
// 64 bytes per 8 values of K where byte 4j + b holds row j's values k + b (low nibble) and
// k + 4 + b (high nibble); for 8 bits, 64 bytes per 4 values where byte 4j + b holds value k + b.
// Scales and biases become [N/16, K/group_size, 16] (element size `half` ? 2 : 4 bytes).
// `out_bits` (5 or 6 for 8-bit W whose codes fit, else `bits`) chooses the compact code layout
// below; `scales_out`/`biases_out` may be null (the caller wrote them factored). Runs on up to
// `threads` threads, a tile per task.
void interleave_int8(const uint32_t* w, const void* scales, const void* biases, bool half, int N,
                     int K, int group_size, int bits, int out_bits, uint8_t* w_out,
                     void* scales_out, void* biases_out, int threads);

// ---- compact int8 layouts (issue 16: K-quants read at close to their file size) ----
//
// Two lossless rewrites `interleave_int8` applies when asked (`compact`) and when they hold for
// every value of the matrix; the arithmetic per output stays the one above, bit for bit.
//
// 5- and 6-bit codes. 8-bit weights whose codes all fit in 5 or 6 bits (GGUF Q5_0/Q5_1/Q5_K
// and Q6_K convert to 8-bit codes below 32 or 64) are stored with `bits` 5 or 6: per tile and
// block of 32 values (64·bits bytes), the codes' low nibbles in the 4-bit layout (256 bytes),
// then their high bits: for 6 bits two 64-byte chunks, chunk e holding values 16e .. 16e + 15
// with byte 4j + b carrying row j's values 16e + 4i + b in bits 2i, 2i + 1 (i = 0..3); for 5
// bits one chunk, byte 4j + b carrying value 4i + b in bit i (i = 0..7). code = low + 16·high.
//
// Factored scales. f32 scales (and, separately, biases) whose every superblock of 256 values
// along K is d · c_g for one f32 d per row and integers c_g in [−128, 127] (a K-quant's scale
// is its f16 super-block scale times a 6- or 8-bit sub-scale) are stored as u8 buffers of
// factored_tile_bytes per tile: per superblock, the 16 rows' d (f32), then per group of the
// superblock the 16 rows' c (int8). The kernels compute scale = d · float(c) in f32, which is
// the stored scale bit for bit (checked for every group when factoring).
constexpr int kSuperBlock = 256;
inline bool int8_bits_supported(int bits) { return bits == 4 || bits == 5 || bits == 6 || bits == 8; }
inline int64_t factored_superblock_bytes(int group_size) {
  return 4 * kInt8TileRows + kInt8TileRows * (kSuperBlock / group_size);
}
inline int64_t factored_tile_bytes(int K, int group_size) {
  return static_cast<int64_t>(K / kSuperBlock) * factored_superblock_bytes(group_size);
}
// The smallest code width (5, 6 or 8) that holds every 8-bit code of W (MLX layout, [N, K]).
int compact_code_bits(const uint32_t* w, int N, int K);
// Factors f32 `values` ([N, K/group_size], MLX layout) into `out` (factored_tile_bytes per
// tile). False, with `out` partly written, when some superblock has no such factoring. Runs on
// up to `threads` threads, a tile per task.
bool factor_int8_scales(const float* values, int N, int K, int group_size, uint8_t* out,
                        int threads);
// The factoring factor_int8_scales finds for one superblock's `count` (at most 16) values, or
// false. Superblock activations multiply c and d separately, so two factorings of the same
// values can round differently: a layout written from other parts (a GGUF's own d and
// sub-scales) takes this one to give the same bits.
bool factor_int8_superblock(const float* v, int count, float* d, int8_t* c);
//
// Biases a multiple of the scales. A symmetric format's bias is its code offset times the
// scale: GGUF Q4_0 −8·d, Q5_0 −16·d, Q8_0 −128·d, Q6_K −32·d·sc, Q3_K −4·d·sc (MLX's affine
// form of a signed code). When every one of the `count` biases is m · scale bit for bit (f32,
// or f16 widened to f32) for one power of two m, `bias_multiple` returns m (else 0) and the
// int8 layout keeps m instead of the biases (QProblem::bias_scale): Q4_0 then reads 18 bytes per
// 32 weights, as its GGUF block, not 20; Q6_K 212 per 256, not 232.
float bias_multiple(const void* scales, const void* biases, bool half, int64_t count);
//
// E2M1 codes (QProblem::e2m1). MXFP4's values are 2^e · E2M1, E2M1 ∈ {±0, ±0.5, ±1, ±1.5, ±2,
// ±3, ±4, ±6}: as the compact 5-bit form stores them, the code is the doubled value plus 16
// (4 .. 28) with the scale halved and the bias −16 times the scale. The E2M1 form stores each
// value's 4-bit E2M1 index instead (the 4-bit layout, a fifth fewer bytes than 5 bits) and the
// kernels look the code up in registers (vpshufb, or vpermb with AVX-512 VBMI): the same codes,
// so the same integer sums and the same bits as the 5-bit form. The derived-bias placeholder
// marks it: [m, 1] (two f32) where plain derived biases are [m].
constexpr uint8_t kE2m1Codes[16] = {16, 17, 18, 19, 20, 22, 24, 28,
                                    16, 15, 14, 13, 12, 10, 8, 4};
// Kernels' template code widths for the E2M1 form (4-bit storage, the lookup by vpshufb or by
// vpermb); int8_code_bits gives the stored width of any template width.
constexpr int kE2m1Bits = 4 | 16;
constexpr int kE2m1VbmiBits = 4 | 32;
constexpr int int8_code_bits(int bits) { return bits & 15; }

// x quantized for the int8 path. Rows are kept in blocks of kInt8RowBlock, each block's values
// four at a time row after row, so that a kernel serving up to eight rows finds every row's next
// four values at fixed offsets from one pointer: code (m, k) lives at int8_x_index(m, k, K), and
// the block's step dx = max|x| / 127 and exact sum Σx at int8_block_index(m, k / 32, K). Rows
// past M up to the next multiple of kInt8RowBlock are zero.
constexpr int kInt8RowBlock = 8;
inline int64_t int8_x_index(int m, int k, int K) {
  return ((static_cast<int64_t>(m / kInt8RowBlock) * (K / 4) + k / 4) * kInt8RowBlock +
          m % kInt8RowBlock) * 4 + k % 4;
}
inline int64_t int8_block_index(int m, int j, int K) {
  return (static_cast<int64_t>(m / kInt8RowBlock) * (K / kInt8Block) + j) * kInt8RowBlock +
         m % kInt8RowBlock;
}
// Sizes: xq holds int8_rows(M) · K codes, dx and sx int8_rows(M) · K / 32 floats, sh twice as
// many (the halves' sums: Σx[m, j, h] at 2 · int8_block_index(m, j, K) + h).
inline int int8_rows(int M) { return (M + kInt8RowBlock - 1) / kInt8RowBlock * kInt8RowBlock; }
// x quantized per superblock (factored weights, above): the codes in the same layout
// (int8_x_index), the step of row m's superblock s at int8_sb_index(m, s, K), and its code
// sums as kInt8SbSums int16 from kInt8SbSums · int8_sb_index(m, s, K): the 16 sums of 16
// values, then the 8 sums of 32 (|sum| ≤ 32 · 127).
constexpr int kInt8SbSums = 24;
inline int64_t int8_sb_index(int m, int s, int K) {
  return (static_cast<int64_t>(m / kInt8RowBlock) * (K / kSuperBlock) + s) * kInt8RowBlock +
         m % kInt8RowBlock;
}
// x as the int8 kernels read it: per block of 32 (q, dx, sx, sh: quantize_x_int8) or, for
// factored weights, per superblock (q, dx, sums: quantize_x_int8_sb).
struct Int8X {
  const int8_t* q;
  const float* dx;
  const float* sx;
  const float* sh;
  const int16_t* sums;
};
// Σx of a block is the pairwise tree s16[i] = x[i] + x[i + 16], s8[i] = s16[i] + s16[i + 8],
// then 4, 2, 1 likewise (one SIMD reduction; both forms give the same bits). Σx of half h is
// s8[i] = x[16h + i] + x[16h + i + 8], then 4, 2, 1 likewise.
void quantize_x_int8(const float* x, int M, int K, int8_t* xq, float* dx, float* sx, float* sh);
void quantize_x_int8_avx512(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                            float* sh);
void quantize_x_int8_avx2(const float* x, int M, int K, int8_t* xq, float* dx, float* sx,
                          float* sh);
// Per superblock (K a multiple of kSuperBlock): codes round(x / dx) to nearest even with
// dx = max|x| / 127 over the superblock; a superblock holding a NaN or an infinity gets a NaN
// step and zero codes (the output turns NaN, as the f32 path's would). Both forms give the same
// bytes.
void quantize_x_int8_sb(const float* x, int M, int K, int8_t* xq, float* dx, int16_t* sums);
void quantize_x_int8_sb_avx512(const float* x, int M, int K, int8_t* xq, float* dx,
                               int16_t* sums);
void quantize_x_int8_sb_avx2(const float* x, int M, int K, int8_t* xq, float* dx,
                             int16_t* sums);

// Output tiles [t0, t1) of kInt8TileRows rows for x rows [m0, m1); x in the form p's weights
// take (per superblock when p.factored).
void int8_scalar(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1);
void int8_avx2(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1);
void int8_avx512(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1);

// The int8 layout read back (the scalar reference's accessors): row n's code at k, and its
// scale or bias (`a` is p.scales or p.biases) for group g, as f32.
int32_t int8_code(const QProblem& p, int n, int k);
float int8_factor(const QProblem& p, const void* a, int n, int g);
// A factored scale's or bias's parts: d of the superblock holding group g, and c.
void int8_factor_parts(const QProblem& p, const void* a, int n, int g, float* d, int32_t* c);
// Row n's bias for group g: int8_factor of the biases, or bias_scale times the scale.
float int8_bias(const QProblem& p, int n, int g);
// Rows `ids` (each < p.N) of an int8-layout weight dequantized into out[count, p.K]:
// fl(fl(scale · q) + bias) per value, as MLX's dequantize of the original computes it (the
// embedding lookup of a tied table kept only in this layout).
void int8_dequantize_rows(const QProblem& p, const uint32_t* ids, int count, float* out);

// ---- f32 activations over the int8 layout (QProblem::f32x) ----
//
// The f32 path reading a K-quant at close to its file size (the wide layouts above store Q4_K in
// 6 bits a weight and Q6_K in 12). Per output (m, n) and group g of the weight:
//   y = Σ_g scale[n, g] · (Σ_{k in g} q[n, k]·x[m, k]) + bias[n, g] · (Σ_{k in g} x[m, k])
// for at most kGemvMaxRowsAvx512 rows of x (the sums within a group in a few chains), and for
// more rows Σ_k w[n, k]·x[m, k] in order over w = fma(q, scale, bias) (a tile dequantized into
// a panel). As the f32 kernels above, they hold to the scalar path's result within rounding, not
// bit for bit; the scalar path is Σ_k w·x in order over int8_dequantize_rows' values.
void f32x_scalar(const QProblem& p, int m0, int m1, int t0, int t1);
// sums: Σx per row of x and group, [M, K/group_size].
void f32x_avx512_gemv(const QProblem& p, const float* sums, int m0, int m1, int t0, int t1);
// x for the GEMM: rows in groups of kF32xRows, each group value-major (row m's value k at
// (m / kF32xRows · K + k) · kF32xRows + m % kF32xRows), rows past M zero.
constexpr int kF32xRows = 16;
void f32x_pack_x(const float* x, int M, int K, float* xp);
// Tile t for x rows [m0, m1) (m0 a multiple of kF32xRows) of the packed x; `panel` holds
// kInt8TileRows · K floats.
void f32x_avx512_gemm(const QProblem& p, const float* xp, float* panel, int m0, int m1, int t);

// Whether the CPU has AVX-512 VNNI (the int8 path's fastest form; AVX2 has its own).
bool has_vnni();
// Whether the CPU has AVX-512 VBMI (vpermb: the E2M1 lookup without masking the index), and
// MLXCEL_NO_VBMI is not 1 (the tests' way to the lookup without it).
bool has_vbmi();

}  // namespace mlxcel::kernels
