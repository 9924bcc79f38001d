// Quantized matmul: ISA dispatch, scratch buffers and the split into tasks.
#include "mlxcel-core/cpp/kernels/qmatmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
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

// Tile ranges per thread in an int8 matmul's parallel region (the comment in qmatmul_int8).
constexpr int kRangesPerThread = 2;

// x quantized for the int8 path in the forms a call's problems take: per block of 32 (`block`),
// and per superblock for factored weights (`super`; both when problems sharing x differ, each
// problem's result depending on its own form only). The buffers belong to one thread and only
// grow.
struct QuantizedX {
  std::vector<int8_t> bq, sq;
  std::vector<float> dx, sx, sh, sd;
  std::vector<int16_t> sums;
  Int8X block{}, super{};

  // Room for x's rows (up to the next multiple of kInt8RowBlock) in the forms asked for.
  void size(int M, int K, bool per_block, bool per_superblock) {
    const size_t rows = int8_rows(M), codes = rows * K;
    const size_t blocks = per_block ? rows * (K / kInt8Block) : 0;
    const size_t supers = per_superblock ? rows * (K / kSuperBlock) : 0;
    if (per_block && bq.size() < codes) bq.resize(codes);
    if (per_superblock && sq.size() < codes) sq.resize(codes);
    if (dx.size() < blocks) dx.resize(blocks);
    if (sx.size() < blocks) sx.resize(blocks);
    if (sh.size() < 2 * blocks) sh.resize(2 * blocks);
    if (sd.size() < supers) sd.resize(supers);
    if (sums.size() < supers * kInt8SbSums) sums.resize(supers * kInt8SbSums);
    block = {bq.data(), dx.data(), sx.data(), sh.data(), nullptr};
    super = {sq.data(), sd.data(), nullptr, nullptr, sums.data()};
  }

  // Row block b of x (rows [8b, 8b + 8) ∩ [0, M)) into the forms asked for. Each row block's
  // codes, steps and sums are contiguous and depend on its rows only.
  void quantize(const float* x, int M, int K, int b, bool per_block, bool per_superblock,
                bool vnni, bool avx2) {
    const int m = b * kInt8RowBlock, in_block = std::min(kInt8RowBlock, M - m);
    const int64_t codes = static_cast<int64_t>(b) * kInt8RowBlock * K;
    const int64_t blocks = static_cast<int64_t>(b) * kInt8RowBlock * (K / kInt8Block);
    const int64_t steps = static_cast<int64_t>(b) * kInt8RowBlock * (K / kSuperBlock);
    x += static_cast<int64_t>(m) * K;
    if (per_block)
      (vnni   ? quantize_x_int8_avx512
       : avx2 ? quantize_x_int8_avx2
              : quantize_x_int8)(x, in_block, K, bq.data() + codes, dx.data() + blocks,
                                 sx.data() + blocks, sh.data() + 2 * blocks);
    if (per_superblock)
      (vnni   ? quantize_x_int8_sb_avx512
       : avx2 ? quantize_x_int8_sb_avx2
              : quantize_x_int8_sb)(
          x, in_block, K, sq.data() + codes, sd.data() + steps,
          sums.data() + steps * kInt8SbSums);
  }
};

// The int8 path (qmatmul.h): x quantized once per call, then tasks over (block of x rows, range
// of 16-row weight tiles). With several problems over the same x (a layer's q, k and v in
// different layouts: qmatmul_shared_x), x is quantized once for all of them and their tasks run in
// one parallel region.
//
// x of one row block (decode, short verification passes) is quantized by every thread of the
// region into its own buffers, as it takes its first task: the few microseconds of arithmetic
// cost less than the caller writing the codes and sums into lines the other threads' caches hold
// from the call before (every store a cross-core invalidation), which took ~16% of a decode step
// of the default model when the caller quantized for all (docs/kernels.md, step 21). Larger x is
// quantized by row blocks spread over the threads, once.
void qmatmul_int8(const QProblem* ps, int count, Isa isa, int threads) {
  const QProblem& p = ps[0];
  bool per_block = false, per_superblock = false;
  for (int i = 0; i < count; ++i) (ps[i].factored ? per_superblock : per_block) = true;
  const bool vnni = isa == Isa::Avx512 && has_vnni();
  const bool avx2 = isa >= Isa::Avx2;
  const int row_blocks = int8_rows(p.M) / kInt8RowBlock;
  const bool each_thread = row_blocks == 1 && threads > 1;
  static thread_local QuantizedX mine;
  // Which call a thread's buffers hold (each_thread): a new number per call.
  static std::atomic<uint64_t> calls{0};
  static thread_local uint64_t held = 0;
  const uint64_t call = each_thread ? calls.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  // The caller's buffers, which every thread fills and reads (in the tasks, `mine` is the
  // thread's own).
  QuantizedX& shared = mine;
  if (!each_thread) {
    shared.size(p.M, p.K, per_block, per_superblock);
    parallel_for(threads, row_blocks, [&](int b) {
      shared.quantize(p.x, p.M, p.K, b, per_block, per_superblock, vnni, avx2);
    });
  }
  const auto kernel = vnni ? int8_avx512 : isa >= Isa::Avx2 ? int8_avx2 : int8_scalar;
  const int blocks_m = (p.M + kBlockRows - 1) / kBlockRows;
  // Two tile ranges per thread: a late thread's share can still move to the other, while each
  // claim (a compare-and-swap on the pool's shared counter) stays rare. Four, as the f32 GEMV
  // takes, decoded the default model 4% slower here (docs/kernels.md, step 19). Each problem's
  // ranges as if it ran alone, one after the other in the task list.
  struct Part {
    int per_task, ranges, first_task;
  };
  Part parts[kMaxSharedX];
  int tasks = 0;
  for (int i = 0; i < count; ++i) {
    const int tiles = ps[i].N / kInt8TileRows;
    const int per_task =
        std::max(1, (tiles * blocks_m + kRangesPerThread * threads - 1) /
                        (kRangesPerThread * threads) / std::max(1, blocks_m));
    const int ranges = (tiles + per_task - 1) / per_task;
    parts[i] = {per_task, ranges, tasks};
    tasks += ranges * blocks_m;
  }
  parallel_for(threads, tasks, [&](int task) {
    int i = count - 1;
    while (task < parts[i].first_task) --i;
    const QProblem& q = ps[i];
    const int local = task - parts[i].first_task;
    const int block = local / parts[i].ranges, range = local % parts[i].ranges;
    const int tiles = q.N / kInt8TileRows;
    const QuantizedX* x = &shared;
    if (each_thread) {
      if (held != call) {
        mine.size(p.M, p.K, per_block, per_superblock);
        mine.quantize(p.x, p.M, p.K, 0, per_block, per_superblock, vnni, avx2);
        held = call;
      }
      x = &mine;
    }
    kernel(q, q.factored ? x->super : x->block, block * kBlockRows,
           std::min(q.M, (block + 1) * kBlockRows), range * parts[i].per_task,
           std::min(tiles, (range + 1) * parts[i].per_task));
  });
}

// f32 activations over the int8 layout (qmatmul.h): GEMV tasks over ranges of tiles, or GEMM
// tasks over (block of x rows, tile), each dequantizing its tile into a panel.
void qmatmul_f32x(const QProblem& p, Isa isa, int threads) {
  const int tiles = p.N / kInt8TileRows;
  if (isa < Isa::Avx512) {
    parallel_for(threads, tiles, [&](int t) { f32x_scalar(p, 0, p.M, t, t + 1); });
    return;
  }
  if (p.M <= kGemvMaxRowsAvx512) {
    static thread_local std::vector<float> sums_buffer;
    const int G = p.K / p.group_size;
    float* sums = scratch(sums_buffer, static_cast<size_t>(p.M) * G);
    for (int m = 0; m < p.M; ++m) {
      const float* x = p.x + static_cast<int64_t>(m) * p.K;
      for (int g = 0; g < G; ++g) {
        float s = 0.0f;
        for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) s += x[k];
        sums[m * G + g] = s;
      }
    }
    // Four tile ranges per thread, as the other GEMVs.
    const int per_task = std::max(1, (tiles + 4 * threads - 1) / (4 * threads));
    parallel_for(threads, (tiles + per_task - 1) / per_task, [&](int r) {
      f32x_avx512_gemv(p, sums, 0, p.M, r * per_task, std::min(tiles, (r + 1) * per_task));
    });
    return;
  }
  static thread_local std::vector<float> xpack_buffer;
  const int groups = (p.M + kF32xRows - 1) / kF32xRows;
  float* xp = scratch(xpack_buffer, static_cast<size_t>(groups) * kF32xRows * p.K);
  parallel_for(threads, groups, [&](int c) {
    const int m = c * kF32xRows;
    f32x_pack_x(p.x + static_cast<int64_t>(m) * p.K, std::min(kF32xRows, p.M - m), p.K,
                xp + static_cast<int64_t>(m) * p.K);
  });
  static_assert(kBlockRows % kF32xRows == 0);
  const int blocks = (p.M + kBlockRows - 1) / kBlockRows;
  parallel_for(threads, tiles * blocks, [&](int task) {
    static thread_local std::vector<float> panel_buffer;
    float* panel = scratch(panel_buffer, static_cast<size_t>(kInt8TileRows) * p.K);
    const int block = task / tiles, t = task % tiles;
    f32x_avx512_gemm(p, xp, panel, block * kBlockRows, std::min(p.M, (block + 1) * kBlockRows),
                     t);
  });
}

}  // namespace

bool has_vnni() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return vnni;
}

bool has_vbmi() {
  // MLXCEL_NO_VBMI=1 takes the lookup without VBMI (as a VNNI CPU without it does): how the
  // tests reach that path on a CPU that has VBMI.
  static const bool vbmi = [] {
    __builtin_cpu_init();
    const char* off = std::getenv("MLXCEL_NO_VBMI");
    if (off != nullptr && off[0] == '1') return false;
    return __builtin_cpu_supports("avx512vbmi") != 0;
  }();
  return vbmi;
}

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

void qmatmul_shared_x(const QProblem* ps, int count, Isa isa, int threads) {
  bool shared = count >= 1 && count <= kMaxSharedX;
  int64_t macs = 0;
  for (int i = 0; i < count && shared; ++i) {
    shared = ps[i].int8 && !ps[i].f32x && ps[i].x == ps[0].x && ps[i].M == ps[0].M &&
             ps[i].K == ps[0].K;
    macs += static_cast<int64_t>(ps[i].M) * ps[i].N * ps[i].K;
  }
  if (!shared) {
    for (int i = 0; i < count; ++i) qmatmul(ps[i], isa, threads);
    return;
  }
  isa = std::min(isa, best_isa());
  qmatmul_int8(ps, count, isa, macs < kParallelMacs ? 1 : threads);
}

void qmatmul(const QProblem& p, Isa isa, int threads) {
  isa = std::min(isa, best_isa());
  const int64_t macs = static_cast<int64_t>(p.M) * p.N * p.K;
  if (macs < kParallelMacs) threads = 1;
  if (p.int8) {
    p.f32x ? qmatmul_f32x(p, isa, threads) : qmatmul_int8(&p, 1, isa, threads);
    return;
  }

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
