// The routed-expert MLP kernel (moe.h): route, group by expert, the experts' matmuls as one
// parallel region per projection, and the weighted sum.
#include "mlxcel-core/cpp/kernels/moe.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "mlxcel-core/cpp/kernels/pool.h"
#include "mlxcel-core/cpp/kernels/rowops.h"

namespace mlxcel::kernels {
namespace {

// Below this many multiply-adds a step's router runs on the calling thread.
constexpr int64_t kParallelRouter = 1 << 18;
// Rows per task of the row-wise steps (norm, activation, weighted sum) when a step is large.
constexpr int kRowChunk = 16;
// Tile ranges per thread in a projection's parallel region.
constexpr int kRangesPerThread = 4;

template <typename T>
T* grow(std::vector<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// The host router's dot product (llama/routing.rs `dot`): eight interleaved partial sums, each
// a product then an add (no fused multiply-add: this file and the AVX2 form below are compiled
// without FMA, so the compiler cannot contract them), combined as a fixed tree, then the tail
// in order.
#define MOE_DOT_BODY                                                              \
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                        \
  const int chunks = n / 8;                                                       \
  for (int c = 0; c < chunks; ++c)                                                \
    for (int i = 0; i < 8; ++i) acc[i] += x[8 * c + i] * w[8 * c + i];            \
  float total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) +                         \
                ((acc[2] + acc[6]) + (acc[3] + acc[7]));                          \
  for (int i = 8 * chunks; i < n; ++i) total += x[i] * w[i];                      \
  return total;

float dot_plain(const float* x, const float* w, int n) { MOE_DOT_BODY }
// The eight sums as the lanes of one 256-bit register (AVX2 without FMA: the same operations).
__attribute__((target("avx2"))) float dot_avx2(const float* x, const float* w, int n) {
  MOE_DOT_BODY
}
#undef MOE_DOT_BODY

// Tokens whose router logits one pass over a router row computes (dot_group).
constexpr int kRouterTokens = 4;

// dot_plain of each of kRouterTokens rows of x (`stride` floats apart) with w into out: each the
// same operations in the same order as dot_plain's, token by token.
void dot_group_plain(const float* x, int64_t stride, const float* w, int n, float* out) {
  for (int t = 0; t < kRouterTokens; ++t) out[t] = dot_plain(x + t * stride, w, n);
}

// dot_avx2 of kRouterTokens rows at once, each w value loaded once for them all: per token the
// eight partial sums as the lanes of one register (a product, then an add), the tree
// ((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7)), then the tail in order — dot_avx2's operations.
__attribute__((target("avx2"))) void dot_group_avx2(const float* x, int64_t stride,
                                                    const float* w, int n, float* out) {
  __m256 acc[kRouterTokens];
  for (int t = 0; t < kRouterTokens; ++t) acc[t] = _mm256_setzero_ps();
  const int chunks = n / 8;
  for (int c = 0; c < chunks; ++c) {
    const __m256 wc = _mm256_loadu_ps(w + 8 * c);
    for (int t = 0; t < kRouterTokens; ++t)
      acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_loadu_ps(x + t * stride + 8 * c), wc));
  }
  for (int t = 0; t < kRouterTokens; ++t) {
    alignas(32) float a[8];
    _mm256_store_ps(a, acc[t]);
    float total = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (int i = 8 * chunks; i < n; ++i) total += x[t * stride + i] * w[i];
    out[t] = total;
  }
}

// Rust's f32::max fold from -inf: a NaN is skipped.
float max_of(const float* v, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(v[i]) && (std::isnan(m) || v[i] > m)) m = v[i];
  return m;
}

// Softmax as the host computes it: the maximum subtracted, expf, summed in order, divided.
void softmax(const float* logits, int n, float* out) {
  const float m = max_of(logits, n);
  float total = -0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(logits[i] - m);
    total += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] = out[i] / total;
}

// f32::total_cmp's key: -0 below +0; the caller has mapped NaN to -inf.
int32_t total_key(float v) {
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return i ^ static_cast<int32_t>(static_cast<uint32_t>(i >> 31) >> 1);
}

// The indices of the k largest values, largest first, ties to the lower index, a NaN below
// every number (routing.rs `top_k`).
void top_k(const float* values, int n, int k, uint32_t* picked, std::vector<uint32_t>& order) {
  order.resize(n);
  for (int i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  auto key = [values](uint32_t i) {
    const float v = values[i];
    return total_key(std::isnan(v) ? -INFINITY : v);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](uint32_t a, uint32_t b) {
    const int32_t ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a < b;
  });
  std::copy(order.begin(), order.begin() + k, picked);
}

// One token's experts and weights from its router logits (routing.rs `pick`).
void pick(const float* logits, int experts, int k, MoeRouting routing, uint32_t* picked,
          float* scores, std::vector<float>& work, std::vector<uint32_t>& order) {
  if (routing == MoeRouting::TopKSoftmax) {
    top_k(logits, experts, k, picked, order);
    work.resize(k);
    for (int i = 0; i < k; ++i) work[i] = logits[picked[i]];
    softmax(work.data(), k, scores);
    return;
  }
  work.resize(experts);
  softmax(logits, experts, work.data());
  top_k(work.data(), experts, k, picked, order);
  for (int i = 0; i < k; ++i) scores[i] = work[picked[i]];
  if (routing == MoeRouting::SoftmaxTopKRenormalized) {
    float total = -0.0f;
    for (int i = 0; i < k; ++i) total += scores[i];
    for (int i = 0; i < k; ++i) scores[i] = scores[i] / total;
  }
}

// body(first, end) over rows [0, T) in chunks on up to `threads` threads (one chunk inline).
template <typename F>
void for_rows(int T, int threads, const F& body) {
  const int chunks = (T + kRowChunk - 1) / kRowChunk;
  if (chunks <= 1 || threads <= 1) {
    body(0, T);
    return;
  }
  parallel_for(threads, chunks,
               [&](int c) { body(c * kRowChunk, std::min(T, (c + 1) * kRowChunk)); });
}

// x of the int8 problems of one grouped call, quantized: per problem its codes and, per block
// of 32 values (or per superblock for factored weights), its steps and sums. Only grows.
struct GroupedX {
  std::vector<int8_t> q;
  std::vector<float> dx, sx, sh;
  std::vector<int16_t> sums;
};

// Every problem of `ps` (each its own x, M, weights and y) as qmatmul computes it. The int8
// ones (x quantized to int8) share one quantization pass and one parallel region of (problem,
// block of x rows, range of 16-row tiles) tasks: a decode step's eight experts are one wake-up
// of the threads instead of eight, and each expert's weights stream once for all its rows.
// Every row's result depends on that row alone (qmatmul.h), so the bits are qmatmul's. The
// others (f32 x) run one qmatmul each.
void grouped_qmatmul(const std::vector<QProblem>& ps, Isa isa, int threads) {
  isa = std::min(isa, best_isa());
  std::vector<const QProblem*> int8;
  for (const QProblem& p : ps) {
    if (p.M == 0) continue;
    if (p.int8 && !p.f32x)
      int8.push_back(&p);
    else
      qmatmul(p, isa, threads);
  }
  if (int8.empty()) return;
  const bool vnni = isa == Isa::Avx512 && has_vnni();
  const auto kernel = vnni ? int8_avx512 : isa >= Isa::Avx2 ? int8_avx2 : int8_scalar;

  struct Part {
    size_t codes, blocks, supers;  // offsets into GroupedX's buffers
    int first_block;               // the problem's first row block in the quantization tasks
    int first_task, per_task, ranges, blocks_m;
  };
  const int count = static_cast<int>(int8.size());
  std::vector<Part> parts(count);
  size_t codes = 0, blocks = 0, supers = 0;
  int row_blocks = 0;
  int64_t tiles_total = 0, macs = 0;
  for (int i = 0; i < count; ++i) {
    const QProblem& p = *int8[i];
    const size_t rows = int8_rows(p.M);
    parts[i].codes = codes;
    parts[i].blocks = blocks;
    parts[i].supers = supers;
    parts[i].first_block = row_blocks;
    codes += rows * p.K;
    if (p.factored)
      supers += rows * (p.K / kSuperBlock);
    else
      blocks += rows * (p.K / kInt8Block);
    row_blocks += static_cast<int>(rows / kInt8RowBlock);
    parts[i].blocks_m = (p.M + kBlockRows - 1) / kBlockRows;
    tiles_total += static_cast<int64_t>(p.N / kInt8TileRows) * parts[i].blocks_m;
    macs += static_cast<int64_t>(p.M) * p.N * p.K;
  }
  if (macs < (1 << 16)) threads = 1;
  static thread_local GroupedX buf;
  int8_t* q = grow(buf.q, codes);
  float* dx = grow(buf.dx, std::max<size_t>(blocks, supers));
  float* sx = grow(buf.sx, blocks);
  float* sh = grow(buf.sh, 2 * blocks);
  int16_t* sums = grow(buf.sums, supers * kInt8SbSums);

  // Quantization, a task per (problem, block of eight rows).
  auto quantize = [&](int task) {
    int i = count - 1;
    while (task < parts[i].first_block) --i;
    const QProblem& p = *int8[i];
    const Part& part = parts[i];
    const int b = task - part.first_block, m = b * kInt8RowBlock;
    const int in_block = std::min(kInt8RowBlock, p.M - m);
    const int64_t row0 = static_cast<int64_t>(m) * p.K;
    if (p.factored) {
      const int64_t step0 = static_cast<int64_t>(m) * (p.K / kSuperBlock);
      (vnni                ? quantize_x_int8_sb_avx512
       : isa >= Isa::Avx2 ? quantize_x_int8_sb_avx2
                           : quantize_x_int8_sb)(
          p.x + row0, in_block, p.K, q + part.codes + row0, dx + part.supers + step0,
          sums + (part.supers + step0) * kInt8SbSums);
    } else {
      const int64_t block0 = static_cast<int64_t>(m) * (p.K / kInt8Block);
      (vnni                ? quantize_x_int8_avx512
       : isa >= Isa::Avx2 ? quantize_x_int8_avx2
                           : quantize_x_int8)(
          p.x + row0, in_block, p.K, q + part.codes + row0, dx + part.blocks + block0,
          sx + part.blocks + block0, sh + 2 * (part.blocks + block0));
    }
  };
  if (row_blocks <= kInt8RowBlock || threads <= 1) {
    for (int t = 0; t < row_blocks; ++t) quantize(t);
  } else {
    parallel_for(threads, row_blocks, quantize);
  }

  // Tile ranges of about the same size across the problems, a few per thread.
  const int64_t target = std::max<int64_t>(1, kRangesPerThread * static_cast<int64_t>(threads));
  const int per_task_all = static_cast<int>(std::max<int64_t>(1, (tiles_total + target - 1) / target));
  int tasks = 0;
  for (int i = 0; i < count; ++i) {
    const int tiles = int8[i]->N / kInt8TileRows;
    parts[i].per_task = std::min(tiles, per_task_all);
    parts[i].ranges = (tiles + parts[i].per_task - 1) / parts[i].per_task;
    parts[i].first_task = tasks;
    tasks += parts[i].ranges * parts[i].blocks_m;
  }
  parallel_for(threads, tasks, [&](int task) {
    int i = count - 1;
    while (task < parts[i].first_task) --i;
    const QProblem& p = *int8[i];
    const Part& part = parts[i];
    const int local = task - part.first_task;
    const int block = local / part.ranges, range = local % part.ranges;
    const int tiles = p.N / kInt8TileRows;
    Int8X x{};
    x.q = q + part.codes;
    if (p.factored) {
      x.dx = dx + part.supers;
      x.sums = sums + part.supers * kInt8SbSums;
    } else {
      x.dx = dx + part.blocks;
      x.sx = sx + part.blocks;
      x.sh = sh + 2 * part.blocks;
    }
    kernel(p, x, block * kBlockRows, std::min(p.M, (block + 1) * kBlockRows),
           range * part.per_task, std::min(tiles, (range + 1) * part.per_task));
  });
}

// gpt-oss's clamped SwiGLU of `n` gate and up values, as the per-op graph's ops compute it
// (ops.cc clamped_swiglu: the gate clamped above, the up half to [-limit, limit], then
// (up + 1) · (gate · sigmoid(alpha · gate))), each step rounded to f32.
void clamped_swiglu(const float* gate, const float* up, int n, float alpha, float limit,
                    float* out) {
  for (int i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    const float z = alpha * g;
    const float sig = 1.0f / (1.0f + std::exp(-z));
    const float glu = g * sig;
    out[i] = (u + 1.0f) * glu;
  }
}

// Adds `bias` ([n]) to each of `rows` rows of `y` (row stride n).
void add_bias_rows(float* y, int rows, int n, const float* bias) {
  for (int r = 0; r < rows; ++r) {
    float* row = y + static_cast<int64_t>(r) * n;
    for (int j = 0; j < n; ++j) row[j] += bias[j];
  }
}

// Scratch of the calling thread (MLX's stream thread), reused from step to step.
struct Scratch {
  std::vector<float> h, logits, scores, gathered, gate_up, act, down, shared_gu, shared_act,
      shared_y, shared_gate, work;
  std::vector<uint32_t> picked, order, count, offset, row_of;
};

}  // namespace

void routed_experts(const MoePlan& plan, const float* x, const float* norm, float eps,
                    bool residual, bool int8x, float* out, int T, Isa isa, int threads) {
  isa = std::min(isa, best_isa());
  const int H = plan.hidden, E = plan.experts, k = plan.top_k;
  const int R = E + (plan.shared ? 1 : 0);
  static thread_local Scratch s;

  float* h = grow(s.h, static_cast<size_t>(T) * H);
  for_rows(T, threads, [&](int first, int end) {
    rms_norm_rows(x + static_cast<int64_t>(first) * H, end - first, H, norm, eps,
                  h + static_cast<int64_t>(first) * H);
  });

  // The router's logits, a task per (16 router rows, group of kRouterTokens tokens), the groups
  // of one run of rows one after another: the run's rows stay in cache while the tokens pass
  // (a task per token streamed the whole router, 2 MB for 256 experts of width 2,048, once per
  // token), and a group reads each row once. Each logit is the same dot product either way.
  float* logits = grow(s.logits, static_cast<size_t>(T) * R);
  const auto dot = isa >= Isa::Avx2 ? dot_avx2 : dot_plain;
  const auto dot_group = isa >= Isa::Avx2 ? dot_group_avx2 : dot_group_plain;
  const int row_tasks = (R + 15) / 16;
  const int groups = (T + kRouterTokens - 1) / kRouterTokens;
  auto route_task = [&](int task) {
    const int t0 = task % groups * kRouterTokens, r0 = task / groups * 16;
    const int tokens = std::min(kRouterTokens, T - t0);
    for (int r = r0; r < std::min(R, r0 + 16); ++r) {
      const float* w = plan.router.data() + static_cast<int64_t>(r) * H;
      float logit[kRouterTokens];
      if (tokens == kRouterTokens) {
        dot_group(h + static_cast<int64_t>(t0) * H, H, w, H, logit);
      } else {
        for (int t = 0; t < tokens; ++t) logit[t] = dot(h + static_cast<int64_t>(t0 + t) * H, w, H);
      }
      for (int t = 0; t < tokens; ++t) {
        // The host adds the router's bias after the dot product (routing.rs `logits`).
        if (!plan.router_bias.empty() && r < E) logit[t] += plan.router_bias[r];
        logits[static_cast<int64_t>(t0 + t) * R + r] = logit[t];
      }
    }
  };
  if (static_cast<int64_t>(T) * R * H < kParallelRouter || threads <= 1) {
    for (int task = 0; task < groups * row_tasks; ++task) route_task(task);
  } else {
    parallel_for(threads, groups * row_tasks, route_task);
  }

  uint32_t* picked = grow(s.picked, static_cast<size_t>(T) * k);
  float* scores = grow(s.scores, static_cast<size_t>(T) * k);
  float* shared_gate = grow(s.shared_gate, T);
  for (int t = 0; t < T; ++t) {
    const float* l = logits + static_cast<int64_t>(t) * R;
    pick(l, E, k, plan.routing, picked + t * k, scores + t * k, s.work, s.order);
    if (plan.shared) shared_gate[t] = 1.0f / (1.0f + std::exp(-l[E]));
  }

  // Tokens grouped by expert, experts ascending, each expert's tokens ascending: expert e's
  // rows are [offset[e], offset[e] + count[e]) of the routed rows, and route (t, slot) is row
  // row_of[t·k + slot].
  uint32_t* cnt = grow(s.count, E);
  uint32_t* off = grow(s.offset, E);
  uint32_t* row_of = grow(s.row_of, static_cast<size_t>(T) * k);
  std::fill(cnt, cnt + E, 0u);
  for (int i = 0; i < T * k; ++i) ++cnt[picked[i]];
  uint32_t next = 0;
  for (int e = 0; e < E; ++e) {
    off[e] = next;
    next += cnt[e];
  }
  std::fill(cnt, cnt + E, 0u);
  const int routed = T * k;
  // One token: every expert reads h itself.
  float* gathered = T == 1 ? nullptr : grow(s.gathered, static_cast<size_t>(routed) * H);
  for (int i = 0; i < routed; ++i) {
    const uint32_t e = picked[i];
    row_of[i] = off[e] + cnt[e]++;
    if (gathered != nullptr)
      std::memcpy(gathered + static_cast<int64_t>(row_of[i]) * H, h + static_cast<int64_t>(i / k) * H,
                  sizeof(float) * H);
  }

  // gate/up, every routed expert (and the shared expert over every token) in one call.
  std::vector<QProblem> ps;
  ps.reserve(E + 1);
  auto with = [int8x](QProblem p, const float* xp, int M, float* y) {
    p.x = xp;
    p.M = M;
    p.y = y;
    p.f32x = p.int8 && !int8x;
    return p;
  };
  const MoeExpert* shared = plan.shared ? &plan.weights[E] : nullptr;
  // Every routed expert has the same intermediate size (moe_node.cc checks).
  const bool split = plan.weights[0].split;
  const int I = split ? plan.weights[0].gate_up.N : plan.weights[0].gate_up.N / 2;
  // Stacked: each routed row's [gate | up]; split: every row's gate, then every row's up.
  float* gu = grow(s.gate_up, static_cast<size_t>(routed) * 2 * I);
  float* up_rows = gu + static_cast<int64_t>(routed) * I;
  float* act = grow(s.act, static_cast<size_t>(routed) * I);
  float* dn = grow(s.down, static_cast<size_t>(routed) * H);
  const int SI = shared != nullptr ? shared->gate_up.N / 2 : 0;
  float* sgu = shared != nullptr ? grow(s.shared_gu, static_cast<size_t>(T) * 2 * SI) : nullptr;
  float* sact = shared != nullptr ? grow(s.shared_act, static_cast<size_t>(T) * SI) : nullptr;
  float* sy = shared != nullptr ? grow(s.shared_y, static_cast<size_t>(T) * H) : nullptr;
  for (int e = 0; e < E; ++e) {
    if (cnt[e] == 0) continue;
    const MoeExpert& w = plan.weights[e];
    const float* xe = gathered != nullptr ? gathered + static_cast<int64_t>(off[e]) * H : h;
    ps.push_back(with(w.gate_up, xe, cnt[e], gu + static_cast<int64_t>(off[e]) * w.gate_up.N));
    if (split) ps.push_back(with(w.up, xe, cnt[e], up_rows + static_cast<int64_t>(off[e]) * I));
  }
  if (shared != nullptr) ps.push_back(with(shared->gate_up, h, T, sgu));
  grouped_qmatmul(ps, isa, threads);

  // Each projection's bias added after its product, as the per-op graph's add nodes.
  auto expert_rows = [&](const std::function<void(const MoeExpert&, int first, int rows)>& body) {
    for (int e = 0; e < E; ++e)
      if (cnt[e] != 0) body(plan.weights[e], static_cast<int>(off[e]), static_cast<int>(cnt[e]));
  };
  if (split) {
    expert_rows([&](const MoeExpert& w, int first, int rows) {
      if (w.gate_bias != nullptr)
        add_bias_rows(gu + static_cast<int64_t>(first) * I, rows, I, w.gate_bias);
      if (w.up_bias != nullptr)
        add_bias_rows(up_rows + static_cast<int64_t>(first) * I, rows, I, w.up_bias);
    });
  }

  // The activation row by row (the routed rows lie end to end, each expert's N the same).
  const auto glu = plan.activation == MoeActivation::GeluTanh ? geglu_rows : swiglu_rows;
  for_rows(routed, threads, [&](int first, int end) {
    if (split && plan.activation == MoeActivation::ClampedSwiglu) {
      const int64_t at = static_cast<int64_t>(first) * I;
      clamped_swiglu(gu + at, up_rows + at, (end - first) * I, plan.alpha, plan.limit, act + at);
    } else if (split) {
      // SiLU or GELU over separate halves: each row's [gate | up] put side by side first.
      std::vector<float> pair(2 * static_cast<size_t>(I));
      for (int r = first; r < end; ++r) {
        std::memcpy(pair.data(), gu + static_cast<int64_t>(r) * I, sizeof(float) * I);
        std::memcpy(pair.data() + I, up_rows + static_cast<int64_t>(r) * I, sizeof(float) * I);
        glu(pair.data(), 1, 2 * I, act + static_cast<int64_t>(r) * I, isa);
      }
    } else if (plan.activation == MoeActivation::ClampedSwiglu) {
      for (int r = first; r < end; ++r) {
        const float* row = gu + static_cast<int64_t>(r) * 2 * I;
        clamped_swiglu(row, row + I, I, plan.alpha, plan.limit, act + static_cast<int64_t>(r) * I);
      }
    } else {
      glu(gu + static_cast<int64_t>(first) * 2 * I, end - first, 2 * I,
          act + static_cast<int64_t>(first) * I, isa);
    }
  });
  if (shared != nullptr) glu(sgu, T, 2 * SI, sact, isa);

  ps.clear();
  for (int e = 0; e < E; ++e) {
    if (cnt[e] == 0) continue;
    ps.push_back(with(plan.weights[e].down, act + static_cast<int64_t>(off[e]) * I, cnt[e],
                      dn + static_cast<int64_t>(off[e]) * H));
  }
  if (shared != nullptr) ps.push_back(with(shared->down, sact, T, sy));
  grouped_qmatmul(ps, isa, threads);
  expert_rows([&](const MoeExpert& w, int first, int rows) {
    if (w.down_bias != nullptr)
      add_bias_rows(dn + static_cast<int64_t>(first) * H, rows, H, w.down_bias);
  });

  // Each token's outputs, scaled and summed in its route order, then the gated shared expert,
  // then the residual: each a product rounded, then an add rounded, as the per-op graph's
  // multiply and add nodes.
  for_rows(T, threads, [&](int first, int end) {
    for (int t = first; t < end; ++t) {
      float* o = out + static_cast<int64_t>(t) * H;
      const float* y0 = dn + static_cast<int64_t>(row_of[t * k]) * H;
      const float s0 = scores[t * k];
      for (int j = 0; j < H; ++j) o[j] = y0[j] * s0;
      for (int slot = 1; slot < k; ++slot) {
        const float* y = dn + static_cast<int64_t>(row_of[t * k + slot]) * H;
        const float sc = scores[t * k + slot];
        for (int j = 0; j < H; ++j) {
          const float part = y[j] * sc;
          o[j] = o[j] + part;
        }
      }
      if (shared != nullptr) {
        const float* y = sy + static_cast<int64_t>(t) * H;
        const float g = shared_gate[t];
        for (int j = 0; j < H; ++j) {
          const float part = y[j] * g;
          o[j] = o[j] + part;
        }
      }
      if (residual) {
        const float* r = x + static_cast<int64_t>(t) * H;
        for (int j = 0; j < H; ++j) o[j] = r[j] + o[j];
      }
    }
  });
}

}  // namespace mlxcel::kernels
