// Quantized matmul: ISA dispatch, scratch buffers and the split into tasks.
#include "mlxcel-core/cpp/kernels/qmatmul.h"

#include <algorithm>
#include <vector>

#include "mlxcel-core/cpp/kernels/dispatch.h"
#include "mlxcel-core/cpp/kernels/pool.h"

namespace mlxcel::kernels {
namespace {

// Below this many multiply-adds a second thread costs more to wake than it saves.
constexpr int64_t kParallelMacs = 1 << 16;

// Per-thread scratch that only grows (a panel, or x prepared for the SIMD paths).
float* scratch(std::vector<float>& buffer, size_t floats) {
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

}  // namespace

Isa best_isa() {
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
      return Isa::Avx2;
    return Isa::Scalar;
  }();
  return best;
}

void qmatmul(const QProblem& p, Isa isa, int threads) {
  isa = std::min(isa, best_isa());
  const int64_t macs = static_cast<int64_t>(p.M) * p.N * p.K;
  if (macs < kParallelMacs) threads = 1;

  if (isa == Isa::Scalar) {
    const int rows = 16;
    parallel_for(threads, (p.N + rows - 1) / rows, [&](int t) {
      scalar_rows(p, 0, p.M, t * rows, std::min(p.N, (t + 1) * rows));
    });
    return;
  }

  static thread_local std::vector<float> xprep_buffer, sums_buffer;
  float* xprep = scratch(xprep_buffer, static_cast<size_t>(p.M) * p.K);
  float* sums = scratch(sums_buffer, static_cast<size_t>(p.M) * (p.K / p.group_size));
  prepare_x(p, xprep, sums);

  if (p.M <= (isa == Isa::Avx512 ? kGemvMaxRowsAvx512 : kGemvMaxRows)) {
    // Contiguous row ranges keep each thread's weight reads sequential; four ranges per thread
    // even out the load when another process takes a core for a while (eight made decode 8–12%
    // slower, two no faster: docs/kernels.md).
    const int rows = std::max(8, (p.N + 4 * threads - 1) / (4 * threads));
    const auto gemv = isa == Isa::Avx512 ? avx512_gemv : avx2_gemv;
    parallel_for(threads, (p.N + rows - 1) / rows, [&](int t) {
      gemv(p, xprep, sums, t * rows, std::min(p.N, (t + 1) * rows));
    });
    return;
  }

  // Tasks are (block of x rows, panel of W rows), panel-major within a block so that
  // consecutive tasks reuse the same x block from cache.
  const int panels = (p.N + kPanelRows - 1) / kPanelRows;
  const int blocks = (p.M + kBlockRows - 1) / kBlockRows;
  const auto gemm = isa == Isa::Avx512 ? avx512_gemm : avx2_gemm;
  parallel_for(threads, panels * blocks, [&](int t) {
    static thread_local std::vector<float> panel_buffer;
    float* panel = scratch(panel_buffer, static_cast<size_t>(kPanelRows) * p.K);
    const int block = t / panels, panel_index = t % panels;
    gemm(p, xprep, panel, block * kBlockRows, std::min(p.M, (block + 1) * kBlockRows),
         panel_index * kPanelRows, std::min(p.N, (panel_index + 1) * kPanelRows));
  });
}

}  // namespace mlxcel::kernels
