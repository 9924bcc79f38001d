// Attention over KV caches: the split into tasks and the merge of their partial results.
#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <vector>

#include "mlxcel-core/cpp/kernels/attention.h"
#include "mlxcel-core/cpp/kernels/dispatch.h"
#include "mlxcel-core/cpp/kernels/pool.h"

namespace mlxcel::kernels {
namespace {

float* grow(std::vector<float>& buffer, size_t floats) {
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// Bytes of one element of a row of `dtype` (q8_0 rows are counted in bytes).
int64_t element_bytes(KvDtype dtype) {
  return dtype == KvDtype::F32 ? 4 : dtype == KvDtype::F16 ? 2 : 1;
}

// The base address from which key (or value) j0 of the range [j0, j0 + kKvBlock) is found at
// `block`: the kernels index rows by absolute position, base + j·row, so the base is the block
// moved back by j0 rows. Computed on integers: the address itself lies outside the block and is
// never read.
const void* block_base(const void* block, int j0, int64_t row, KvDtype dtype) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(block) -
                                       static_cast<uintptr_t>(j0 * row * element_bytes(dtype)));
}

}  // namespace

void attention(const AttentionProblem* problems, int count, Isa isa, int threads) {
  // Tasks are (problem, kv head, block of query rows, key range). A task reads each key and
  // value row once for all the query heads sharing its kv head (grouped-query attention); long
  // contexts are split into key ranges so that decoding one sequence still keeps every thread
  // busy. The ranges' partial results are merged per (head, row).
  //
  // The ranges are a fixed grid of absolute key positions, kRangeKeys each, whatever the batch,
  // the chunking of a prompt or the thread count: a row's partials, and so its output, depend
  // only on its own keys. With the int8 path's row-invariant matmuls this makes a sequence's
  // logits bitwise the same alone or batched (docs/kernels.md). They are also the KV cache's
  // blocks: a task of a problem with block tables reads one block of keys and one of values.
  constexpr int kBlock = 8, kRangeKeys = kKvBlock;
  struct Task {
    int problem, kvh, r0, r1, j0, j1;
    int64_t part;
    int merge;  // the index of the merge its partials belong to
  };
  struct Merge {
    int problem, kvh, r0, r1, splits;
    int64_t part, stride;
  };
  isa = std::min(isa, best_isa());
  std::vector<Task> tasks;
  std::vector<Merge> merges;
  int64_t part_floats = 0, work = 0;
  int max_scores = 1;
  for (int pi = 0; pi < count; ++pi) {
    const auto& p = problems[pi];
    const int G = p.heads / p.kv_heads;
    const int64_t ps = attention_part_stride(p.D);
    work += static_cast<int64_t>(p.heads) * p.n * p.L * p.D;
    const int keys = kRangeKeys;
    const int splits = std::max(1, (p.L + keys - 1) / keys);
    max_scores = std::max(max_scores, kBlock * G * keys + 16 * p.D);
    for (int kvh = 0; kvh < p.kv_heads; ++kvh) {
      for (int r0 = 0; r0 < p.n; r0 += kBlock) {
        const int r1 = std::min(p.n, r0 + kBlock);
        const int64_t entry = static_cast<int64_t>(G) * (r1 - r0) * ps;
        merges.push_back({pi, kvh, r0, r1, splits, part_floats, entry});
        for (int sp = 0; sp < splits; ++sp) {
          tasks.push_back({pi, kvh, r0, r1, sp * keys, std::min(p.L, (sp + 1) * keys),
                           part_floats, static_cast<int>(merges.size()) - 1});
          part_floats += entry;
        }
      }
    }
  }
  static thread_local std::vector<float> part_buffer;
  float* part = grow(part_buffer, static_cast<size_t>(part_floats));
  const auto attend = isa == Isa::Avx512 ? attention_part_avx512
                      : isa == Isa::Avx2 ? attention_part_avx2
                                         : attention_part_scalar;
  if (work < (1 << 16)) threads = 1;
  // A merge runs in the task that finishes the last of its ranges (the counter's acquire-release
  // makes the other ranges' partials visible to it), not in a parallel region of its own: in
  // decode that region was one more start and join per layer for a few microseconds of work.
  const auto merge = [&](const Merge& m) {
    const auto& p = problems[m.problem];
    const int G = p.heads / p.kv_heads;
    const int64_t ps = attention_part_stride(p.D);
    const int rows = m.r1 - m.r0;
    for (int g = 0; g < G; ++g) {
      const int h = m.kvh * G + g;
      const float sink = p.sinks != nullptr ? p.sinks[h] : -std::numeric_limits<float>::infinity();
      for (int i = 0; i < rows; ++i) {
        attention_merge(part + m.part + (static_cast<int64_t>(g) * rows + i) * ps, m.splits,
                        m.stride, p.D, sink, p.out + h * p.out_head + (m.r0 + i) * p.out_row);
      }
    }
  };
  std::unique_ptr<std::atomic<int>[]> finished(new std::atomic<int>[merges.size()]);
  for (size_t m = 0; m < merges.size(); ++m) finished[m].store(0, std::memory_order_relaxed);
  parallel_for(threads, static_cast<int>(tasks.size()), [&](int t) {
    static thread_local std::vector<float> scores;
    const auto& task = tasks[t];
    const AttentionProblem* p = &problems[task.problem];
    AttentionProblem in_block;
    if (p->k_blocks != nullptr) {
      in_block = *p;
      const int b = task.j0 / kRangeKeys;
      if (p->block_strides != nullptr) {
        const int64_t* strides = p->block_strides + 4 * b;
        in_block.k_head = strides[0];
        in_block.k_row = strides[1];
        in_block.v_head = strides[2];
        in_block.v_row = strides[3];
      }
      in_block.k = block_base(p->k_blocks[b], task.j0, in_block.k_row, p->k_dtype);
      in_block.v = block_base(p->v_blocks[b], task.j0, in_block.v_row, p->v_dtype);
      p = &in_block;
    }
    attend(*p, task.kvh, task.r0, task.r1, task.j0, task.j1, part + task.part,
           grow(scores, static_cast<size_t>(max_scores)));
    const Merge& m = merges[task.merge];
    if (finished[task.merge].fetch_add(1, std::memory_order_acq_rel) + 1 == m.splits) merge(m);
  });
}

}  // namespace mlxcel::kernels
