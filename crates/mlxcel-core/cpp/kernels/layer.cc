// The llama decoder layers of a model as a single MLX primitive, over every sequence of a step.
//
// Each MLX graph node costs a fixed ~10–20 µs on this machine, and the per-op graph of a layer
// grows with the batch (RoPE, cache writes and attention are per sequence): ~10 nodes per layer
// for one sequence, ~50 for eight. This primitive runs every layer, one after the other, in one
// dispatched task (each layer's output the next one's x, in scratch rows); per layer:
//
//   h = rms_norm(x); qkv = h·Wqkvᵀ (or h·Wqᵀ, h·Wkᵀ, h·Wvᵀ side by side when their layouts
//   differ) [+ the q/k/v biases]; [RMSNorm of q and k, per head or over the whole projections;] RoPE(q, k) per sequence at
//   its positions [unless the layer has none]; k, v written into that sequence's cache in place;
//   attention over the cache [within the layer's sliding window, soft-capped, with each head's
//   sink logit in its softmax]; x1 = x + (att·Woᵀ [+ o's bias])
//   [Gemma: x + rms_norm(att·Woᵀ)]; out = x1 + swiglu(rms_norm(x1)·Wguᵀ)·Wdownᵀ [Gemma: GeGLU,
//   and the MLP's output normed before the add] or, on a layer with routed experts,
//   out = x1 + the routed-expert MLP of rms_norm(x1) (kernels/moe.h, the routed-expert node's
//   own kernel)
//
// and, with LoRA adapters, each projection's low-rank deltas (kernels/lora.h) added where the
// per-op graph adds them: to q/k/v after their biases, to o after the residual (Gemma: before
// the norm), to gate and up before the GLU, to down before the residual (and its norm),
// with the same kernels (and so the same numbers) as the per-op graph.
//
// The KV caches are blocks of kKvBlock positions, each block an input array ([1, kv_heads,
// kKvBlock, row]); a sequence's blocks need not be adjacent, and blocks holding a shared
// prefix may be inputs of several sequences, which only read them. The blocks this primitive
// writes (those holding a sequence's new positions) it writes in place: MLX arrays are immutable
// in principle, so the caller must own each of them exclusively (a materialized, row-contiguous
// array that no other array or sequence shares and nothing else reads during the step).
// `KvCache` does.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlxcel-core/cpp/bridge.h"
#include "mlxcel-core/cpp/kernels/attention.h"
#include "mlxcel-core/cpp/kernels/dispatch.h"
#include "mlxcel-core/cpp/kernels/lora.h"
#include "mlxcel-core/cpp/kernels/lora_plan.h"
#include "mlxcel-core/cpp/kernels/moe.h"
#include "mlxcel-core/cpp/kernels/pool.h"
#include "mlxcel-core/cpp/kernels/qmatmul.h"
#include "mlxcel-core/cpp/kernels/rowops.h"

namespace mx = mlx::core;

namespace mlxcel {

std::unique_ptr<MlxArray> wrap(mx::array a);

namespace {

using kernels::Isa;

// Input positions of the layer's tensors; the caches follow, key then value per sequence.
enum Input : int {
  kX = 0,
  kInputNorm,
  kQkvW, kQkvS, kQkvB,
  kOW, kOS, kOB,
  kPostNorm,
  kInvFreq,
  // Then, on a dense layer, gate/up's and down's (w, scales, biases) (a layer with routed
  // experts has them in its RoutedExpertsPlan);
  kGuW, kGuS, kGuB,
  kDownW, kDownS, kDownB,
  // then, with a q/k norm, its two weights ([head_dim] each, or [heads·head_dim] and
  // [kv_heads·head_dim] over the whole projections); with sandwich norms, the
  // post-attention and post-MLP norms ([hidden] each); with q/k/v biases, the three stacked
  // ([(heads + 2 kv_heads) head_dim]); with q, k and v split (kQkv* then hold q), k's and v's
  // weight, scales and biases; with an o bias, it ([hidden]); then the caches' blocks, per
  // sequence its key blocks then its value blocks.
};

// A quantized matrix's layout.
struct Quant {
  int group_size, bits;
  bool int8;  // interleaved weights (the int8 layout)
  bool f32x;  // (int8 layout) x stays f32 rather than quantized to int8
};

struct Dims {
  int hidden, heads, kv_heads, head_dim, intermediate;
  bool qk_norm, rope, sandwich, gelu, qkv_bias;
  bool qk_norm_whole;  // the q/k norms span the whole projections (OLMoE), not each head
  bool split_qkv;  // q, k and v as three matrices (their layouts differ)
  bool o_bias;     // o adds a bias after its product (gpt-oss)
  int rotary;  // leading features of each head RoPE rotates (head_dim unless partial)
  float rope_mscale;  // factor on the rotated features (LongRoPE's attention factor)
  int window;  // 0: none
  float softcap;  // 0: none
  int moe;  // 0: a dense MLP; routed experts with x in f32 (1) or quantized to int8 (2)
  int q_norm, post_norms, bias, split, o_bias_at;  // input indices of the optional weights
  int first_cache;  // input index of the first cache
  float eps, scale, rope_scale;
  Quant qkv, o, gate_up, down;  // qkv: the stacked matrix, or q's when split
  Quant k, v;                    // when split
};

// One sequence of the step: its rows of x, the cache position of the first, its caches' blocks
// (block b holds positions [b·kKvBlock, (b + 1)·kKvBlock)).
struct Seq {
  int n, position;
  std::vector<void*> k;  // float, f16 bits (uint16_t) or q8_0 rows (uint8_t), as k_dtype says
  std::vector<void*> v;
  kernels::KvDtype k_dtype, v_dtype;
  // Elements of a position's row (head_dim; q8_0: its bytes) and of a head within a block.
  int64_t k_row, k_head, v_row, v_head;
};

// The cache element type of an MLX array (f32, f16, or uint8 holding q8_0 rows), or a refusal
// naming it.
kernels::KvDtype kv_dtype(const mx::array& a) {
  if (a.dtype() == mx::float32) return kernels::KvDtype::F32;
  if (a.dtype() == mx::float16) return kernels::KvDtype::F16;
  if (a.dtype() == mx::uint8) return kernels::KvDtype::Q8_0;
  throw std::runtime_error(
      "mlxcel decoder layer: a KV cache must be float32, float16 or uint8 (q8_0)");
}

// Writes D floats of a key or value row at element `at` of a cache of the given dtype.
void store_kv(void* cache, kernels::KvDtype dtype, int64_t at, const float* row, int D) {
  if (dtype == kernels::KvDtype::F32) {
    std::memcpy(static_cast<float*>(cache) + at, row, sizeof(float) * D);
  } else if (dtype == kernels::KvDtype::F16) {
    uint16_t* dst = static_cast<uint16_t*>(cache) + at;
    for (int t = 0; t < D; ++t) dst[t] = kernels::float_to_half(row[t]);
  } else {
    kernels::quantize_q8_0_row(row, D, static_cast<uint8_t*>(cache) + at);
  }
}

struct Weights {
  const uint32_t* w;
  const void* scales;  // f32, or IEEE half when `half`, or factored (kernels/qmatmul.h)
  const void* biases;
  bool half, factored;
  float bias_scale;  // nonzero: the biases are this multiple of the scales (kernels/qmatmul.h)
  bool e2m1;         // 4-bit codes that are E2M1 indices (kernels/qmatmul.h)
};

// Biases kept as their multiple of the scales (int8 only; kernels/qmatmul.h): one f32 in a [1]
// array, or [m, 1] for 4-bit E2M1 indices.
bool derived_biases(const mx::array& biases) {
  return biases.dtype() == mx::float32 && biases.ndim() == 1 &&
         (biases.shape(0) == 1 || biases.shape(0) == 2);
}

float* grow(std::vector<float>& buffer, size_t floats) {
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

kernels::QProblem problem(const float* x, const Weights& w, Quant q, int M, int N, int K,
                          float* y) {
  kernels::QProblem p{};
  p.x = x;
  p.w = w.w;
  p.scales = w.scales;
  p.biases = w.biases;
  p.half = w.half;
  p.factored = w.factored;
  p.bias_scale = w.bias_scale;
  p.e2m1 = w.e2m1 && q.bits == 4;
  p.y = y;
  p.M = M;
  p.N = N;
  p.K = K;
  p.group_size = q.group_size;
  p.bits = q.bits;
  p.int8 = q.int8;
  p.f32x = q.f32x;
  return p;
}

void matmul(const float* x, const Weights& w, Quant q, int M, int N, int K, float* y, Isa isa,
            int threads) {
  kernels::qmatmul(problem(x, w, q, M, N, K, y), isa, threads);
}

void add_into(float* y, const float* r, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += r[i];
}

// body(first, end) over rows [0, T) in chunks of kRowChunk on up to `threads` threads. A row's
// arithmetic does not depend on which thread runs it or on its chunk, so the numbers are those
// of one thread. The norms, GLU, residual adds, RoPE and cache writes ran on the calling thread
// alone while the other cores waited: 14% of a 512-token prefill's samples on 2 threads
// (docs/kernels.md). One chunk (a decode step) runs inline.
constexpr int kRowChunk = 16;
void for_rows(int T, int threads, const std::function<void(int first, int end)>& body) {
  const int chunks = (T + kRowChunk - 1) / kRowChunk;
  if (chunks <= 1 || threads <= 1) {
    body(0, T);
    return;
  }
  kernels::parallel_for(threads, chunks, [&](int c) {
    body(c * kRowChunk, std::min(T, (c + 1) * kRowChunk));
  });
}

// One layer of the stack: its dimensions, its sequences' (n, position, blocks), and where its
// inputs start. The stack's inputs are x, then per layer its tensors after x (layer-local index
// i >= 1 at first + i - 1) and its cache blocks.
struct Layer {
  Dims dims;
  std::vector<int32_t> seqs;
  int first;
  std::vector<float> sinks;  // [heads] sink logits, or empty: none
  std::shared_ptr<const RoutedExpertsPlan> experts;  // the routed experts, when d.moe
  // LoRA pairs on this layer: the stack's input index of Aᵀ (Bᵀ follows it), the target
  // (kernels::LoraTarget), the adapter (its row of the step's scales), shape and alpha / rank.
  struct LoraPair {
    int input, target, adapter, in, out, rank;
    float factor;
    bool half;
  };
  std::vector<LoraPair> lora;
};

// What run() takes for one layer, read from the stack's inputs.
struct LayerArgs {
  Dims d;
  std::vector<Seq> seqs;
  std::vector<float> sinks;  // a copy: the task may outlive the call that plans it
  // Held (as the routed-expert node holds it) so that the plan outlives the task.
  std::shared_ptr<const RoutedExpertsPlan> experts;
  kernels::LoraTargets lora;  // pointing into the inputs and into the step's scales
  const float *in_norm, *post_norm, *inv_freq, *q_norm, *k_norm, *post_attn, *post_ff, *bqkv, *bo;
  Weights wqkv, wk, wv, wo, wgu, wdown;
};

// The rows of a step the last layer's MLP runs on (`rows`, ascending, `count` of them), or all
// (`rows` null): the rows whose logits are read. The other rows' last MLP changes nothing any
// later step reads (their keys and values were written by the attention before it), so a
// prefill's last layer runs its MLP on the last row of each sequence only.
struct Keep {
  const int32_t* rows;
  int count;
};

// The kept rows of `x` ([T, width]) moved to its first keep.count rows, in place: the rows
// ascend, so row i comes from a row at or after i and is read before anything overwrites it.
void compact_rows(float* x, int width, const Keep& keep) {
  for (int i = 0; i < keep.count; ++i) {
    if (keep.rows[i] == i) continue;
    std::memcpy(x + static_cast<int64_t>(i) * width,
                x + static_cast<int64_t>(keep.rows[i]) * width, sizeof(float) * width);
  }
}

class DecoderStackCpu : public mx::UnaryPrimitive {
 public:
  DecoderStackCpu(mx::Stream stream, std::vector<Layer> layers,
                  std::shared_ptr<const std::vector<float>> lora_scales, std::vector<int32_t> keep,
                  Isa isa, int threads)
      : mx::UnaryPrimitive(stream),
        layers_(std::move(layers)),
        lora_scales_(std::move(lora_scales)),
        keep_(std::move(keep)),
        isa_(isa),
        threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    if (!inputs[kX].flags().row_contiguous)
      throw std::runtime_error("mlxcel decoder layer: x must be row-contiguous");
    std::vector<LayerArgs> args;
    args.reserve(layers_.size());
    const int rows = static_cast<int>(inputs[kX].shape(0));
    for (const Layer& layer : layers_)
      args.push_back(layer_args(layer, inputs, lora_scales_->data(), rows));
    out.set_data(mx::allocator::malloc(out.nbytes()));

    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    encoder.dispatch([args = std::move(args), scales = lora_scales_, keep = keep_,
                      x = inputs[kX].data<float>(), y = out.data<float>(),
                      T = static_cast<int>(inputs[kX].shape(0)),
                      isa = std::min(isa_, kernels::best_isa()), threads = threads_]() {
      // Each layer's output is the next one's x; the last writes the node's output.
      static thread_local std::vector<float> ping, pong;
      const float* cur = x;
      for (size_t l = 0; l < args.size(); ++l) {
        const LayerArgs& a = args[l];
        const bool last = l + 1 == args.size();
        float* dst =
            last ? y : grow(l % 2 == 0 ? ping : pong, static_cast<size_t>(T) * a.d.hidden);
        const Keep rows{last && !keep.empty() ? keep.data() : nullptr,
                        static_cast<int>(keep.size())};
        run(a.d, a.seqs, a.sinks,
            a.experts ? &routed_experts_kernel_plan(*a.experts) : nullptr, cur, a.in_norm, a.post_norm, a.inv_freq, a.q_norm, a.k_norm,
            a.post_attn, a.post_ff, a.bqkv, a.bo, a.wqkv, a.wk, a.wv, a.wo, a.wgu, a.wdown, a.lora,
            rows, dst, T, isa, threads);
        cur = dst;
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel decoder layer has no GPU implementation");
  }

  const char* name() const override { return "MlxcelDecoderLayers"; }

  bool is_equivalent(const mx::Primitive&) const override {
    // It writes its caches: never merge two of them.
    return false;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[kX].shape();
    if (!keep_.empty()) shape[0] = static_cast<int>(keep_.size());
    return {shape};
  }

 private:
  // One layer's cache blocks, norms and weights, from the stack's inputs.
  static LayerArgs layer_args(const Layer& layer, const std::vector<mx::array>& inputs,
                              const float* lora_scales, int rows) {
    const Dims& d = layer.dims;
    auto in = [&](int i) -> const mx::array& { return inputs[layer.first + i - 1]; };
    for (int i = 1; i < d.first_cache; ++i) {
      if (!in(i).flags().row_contiguous)
        throw std::runtime_error("mlxcel decoder layer: input " + std::to_string(i) +
                                 " must be row-contiguous");
    }
    const int count = static_cast<int>(layer.seqs.size() / 3);
    std::vector<Seq> seqs(count);
    int input = d.first_cache;
    for (int s = 0; s < count; ++s) {
      const int blocks = layer.seqs[3 * s + 2];
      const auto& k = in(input);
      const auto& v = in(input + blocks);
      std::vector<void*> k_blocks, v_blocks;
      for (int b = 0; b < 2 * blocks; ++b) {
        const auto& c = in(input + b);
        // Written in place: it must be a buffer of its own, not a broadcast or a view.
        if (!c.flags().row_contiguous || c.data_size() != c.size() || c.offset() != 0)
          throw std::runtime_error(
              "mlxcel decoder layer: a KV cache block must be a materialized contiguous array");
        if (c.dtype() != (b < blocks ? k : v).dtype() || c.shape() != (b < blocks ? k : v).shape())
          throw std::runtime_error(
              "mlxcel decoder layer: a sequence's key (or value) blocks differ in type or shape");
        (b < blocks ? k_blocks : v_blocks)
            .push_back(const_cast<void*>(static_cast<const void*>(c.data<uint8_t>())));
      }
      input += 2 * blocks;
      const kernels::KvDtype k_dtype = kv_dtype(k), v_dtype = kv_dtype(v);
      // A row of head_dim values: q8_0 rows are their bytes.
      auto row_of = [&](const mx::array& c, kernels::KvDtype dtype) {
        const int64_t want = dtype == kernels::KvDtype::Q8_0
                                 ? d.head_dim / kernels::kQ8Block * kernels::kQ8BlockBytes
                                 : d.head_dim;
        if (c.ndim() != 4 || c.shape(3) != want ||
            (dtype == kernels::KvDtype::Q8_0 && d.head_dim % kernels::kQ8Block != 0))
          throw std::runtime_error("mlxcel decoder layer: a KV cache's rows do not hold head_dim " +
                                   std::to_string(d.head_dim) + " values");
        return want;
      };
      const int64_t k_row = row_of(k, k_dtype), v_row = row_of(v, v_dtype);
      seqs[s] = Seq{layer.seqs[3 * s],
                    layer.seqs[3 * s + 1],
                    std::move(k_blocks),
                    std::move(v_blocks),
                    k_dtype,
                    v_dtype,
                    k_row,
                    k_row * k.shape(2),
                    v_row,
                    v_row * v.shape(2)};
    }
    auto weights = [&](int w) {
      const auto& b = in(w + 2);
      const bool derived = derived_biases(b);
      return Weights{in(w).data<uint32_t>(), in(w + 1).data<uint8_t>(), b.data<uint8_t>(),
                     in(w + 1).dtype() == mx::float16, in(w + 1).dtype() == mx::uint8,
                     derived ? b.data<float>()[0] : 0.0f, derived && b.shape(0) == 2};
    };
    auto floats = [&](bool present, int i) { return present ? in(i).data<float>() : nullptr; };
    const bool dense = d.moe == 0;
    kernels::LoraTargets lora;
    for (const auto& p : layer.lora)
      lora[p.target].push_back(kernels::LoraDelta{
          inputs[p.input].data<void>(), inputs[p.input + 1].data<void>(), p.in, p.out, p.rank,
          p.factor, lora_scales + static_cast<int64_t>(p.adapter) * rows, p.half});
    return LayerArgs{d,
                     std::move(seqs),
                     layer.sinks,
                     layer.experts,
                     std::move(lora),
                     in(kInputNorm).data<float>(),
                     in(kPostNorm).data<float>(),
                     in(kInvFreq).data<float>(),
                     floats(d.qk_norm, d.q_norm),
                     floats(d.qk_norm, d.q_norm + 1),
                     floats(d.sandwich, d.post_norms),
                     floats(d.sandwich, d.post_norms + 1),
                     floats(d.qkv_bias, d.bias),
                     floats(d.o_bias, d.o_bias_at),
                     weights(kQkvW),
                     d.split_qkv ? weights(d.split) : Weights{},
                     d.split_qkv ? weights(d.split + 3) : Weights{},
                     weights(kOW),
                     dense ? weights(kGuW) : Weights{},
                     dense ? weights(kDownW) : Weights{}};
  }

  static void run(const Dims& d, const std::vector<Seq>& seqs, const std::vector<float>& sinks,
                  const kernels::MoePlan* moe, const float* x,
                  const float* in_norm, const float* post_norm, const float* inv_freq,
                  const float* q_norm, const float* k_norm, const float* post_attn,
                  const float* post_ff, const float* bqkv, const float* bo,
                  const Weights& wqkv,
                  const Weights& wk, const Weights& wv, const Weights& wo,
                  const Weights& wgu,
                  const Weights& wdown, const kernels::LoraTargets& lora, const Keep& keep,
                  float* y, int T, Isa isa, int threads) {
    const int D = d.head_dim, H = d.heads, KV = d.kv_heads, hidden = d.hidden;
    const int C = (H + 2 * KV) * D;
    const int F = d.moe != 0 ? 0 : d.intermediate;
    static thread_local std::vector<float> b_h, b_qkv, b_att, b_x1, b_gu, b_split;
    float* h = grow(b_h, static_cast<size_t>(T) * std::max(hidden, F));
    float* qkv = grow(b_qkv, static_cast<size_t>(T) * C);
    float* att = grow(b_att, static_cast<size_t>(T) * H * D);
    float* x1 = grow(b_x1, static_cast<size_t>(T) * hidden);
    float* gu = grow(b_gu, static_cast<size_t>(T) * 2 * F);
    float* g = h;  // h is free again once gate/up have read it

    for_rows(T, threads, [&](int t0, int t1) {
      kernels::rms_norm_rows(x + static_cast<int64_t>(t0) * hidden, t1 - t0, hidden, in_norm,
                             d.eps, h + static_cast<int64_t>(t0) * hidden);
    });
    if (d.split_qkv) {
      // Three matmuls, each into its own rows, then interleaved as the stacked one writes them
      // (the same kernels on the same rows: the same numbers as three separate projections).
      const int QN = H * D, KN = KV * D;
      float* q_out = grow(b_split, static_cast<size_t>(T) * (QN + 2 * KN));
      float* k_out = q_out + static_cast<int64_t>(T) * QN;
      float* v_out = k_out + static_cast<int64_t>(T) * KN;
      // One call: with int8 activations h is quantized once for the three and their tiles
      // share one parallel region.
      const kernels::QProblem three[3] = {problem(h, wqkv, d.qkv, T, QN, hidden, q_out),
                                          problem(h, wk, d.k, T, KN, hidden, k_out),
                                          problem(h, wv, d.v, T, KN, hidden, v_out)};
      kernels::qmatmul_shared_x(three, 3, isa, threads);
      for (int t = 0; t < T; ++t) {
        float* r = qkv + static_cast<int64_t>(t) * C;
        std::memcpy(r, q_out + static_cast<int64_t>(t) * QN, sizeof(float) * QN);
        std::memcpy(r + QN, k_out + static_cast<int64_t>(t) * KN, sizeof(float) * KN);
        std::memcpy(r + QN + KN, v_out + static_cast<int64_t>(t) * KN, sizeof(float) * KN);
      }
    } else {
      matmul(h, wqkv, d.qkv, T, C, hidden, qkv, isa, threads);
    }
    // Per row: the biases, added as the per-op graph adds them (one rounding per element); the
    // q/k norms (in place); RoPE on q (in place) and k; k and v into the caches at their
    // positions (each row writes its own position).
    std::vector<int> row_seq(T), row_pos(T);
    {
      int row = 0;
      for (size_t i = 0; i < seqs.size(); ++i)
        for (int j = 0; j < seqs[i].n; ++j, ++row) {
          row_seq[row] = static_cast<int>(i);
          row_pos[row] = seqs[i].position + j;
        }
    }
    const int half = d.rotary / 2;
    for_rows(T, threads, [&](int t0, int t1) {
      if (bqkv != nullptr)
        for (int t = t0; t < t1; ++t) {
          float* r = qkv + static_cast<int64_t>(t) * C;
          for (int c = 0; c < C; ++c) r[c] += bqkv[c];
        }
      // The q, k and v deltas of the normed rows, after the biases.
      const int64_t column[3] = {0, static_cast<int64_t>(H) * D, static_cast<int64_t>(H + KV) * D};
      for (int p = 0; p < 3; ++p)
        kernels::lora_add_rows(lora[kernels::kLoraQ + p], h, hidden, qkv + column[p], C, t0, t1);
      std::vector<float> cos_t(half), sin_t(half);
      for (int t = t0; t < t1; ++t) {
        float* r = qkv + static_cast<int64_t>(t) * C;
        if (d.qk_norm_whole) {
          // OLMoE: q's and k's whole rows normed before the heads are split.
          kernels::rms_norm_rows(r, 1, H * D, q_norm, d.eps, r);
          kernels::rms_norm_rows(r + H * D, 1, KV * D, k_norm, d.eps, r + H * D);
        } else if (d.qk_norm) {
          kernels::rms_norm_rows(r, H, D, q_norm, d.eps, r);
          kernels::rms_norm_rows(r + H * D, KV, D, k_norm, d.eps, r + H * D);
        }
        const Seq& s = seqs[row_seq[t]];
        const int pos = row_pos[t];
        if (d.rope) {
          kernels::rope_tables(static_cast<float>(pos) * d.rope_scale, inv_freq, half,
                               cos_t.data(), sin_t.data());
          if (d.rope_mscale != 1.0f) {
            for (int j = 0; j < half; ++j) {
              cos_t[j] *= d.rope_mscale;
              sin_t[j] *= d.rope_mscale;
            }
          }
          for (int hd = 0; hd < H; ++hd)
            kernels::rope_head(r + hd * D, r + hd * D, cos_t.data(), sin_t.data(), half);
        }
        void* k_block = s.k[pos / kernels::kKvBlock];
        void* v_block = s.v[pos / kernels::kKvBlock];
        const int at = pos % kernels::kKvBlock;
        for (int kvh = 0; kvh < KV; ++kvh) {
          // RoPE on k in place (features past `rotary` stay as they are), then both rows into
          // the caches, rounded to f16 or quantized to q8_0 where a cache holds those.
          float* kr = r + (H + kvh) * D;
          if (d.rope) kernels::rope_head(kr, kr, cos_t.data(), sin_t.data(), half);
          store_kv(k_block, s.k_dtype, kvh * s.k_head + at * s.k_row, kr, D);
          store_kv(v_block, s.v_dtype, kvh * s.v_head + at * s.v_row, r + (H + KV + kvh) * D, D);
        }
      }
    });

    // Attention of every sequence over its cache, heads side by side in `att`.
    std::vector<kernels::AttentionProblem> problems;
    problems.reserve(seqs.size());
    int row = 0;
    for (const auto& s : seqs) {
      kernels::AttentionProblem p{};
      p.q = qkv + static_cast<int64_t>(row) * C;
      p.k_blocks = s.k.data();
      p.v_blocks = s.v.data();
      p.k_dtype = s.k_dtype;
      p.v_dtype = s.v_dtype;
      p.out = att + static_cast<int64_t>(row) * H * D;
      p.heads = H;
      p.kv_heads = KV;
      p.n = s.n;
      p.L = s.position + s.n;
      p.D = D;
      p.q_head = D;
      p.q_row = C;
      p.k_head = s.k_head;
      p.k_row = s.k_row;
      p.v_head = s.v_head;
      p.v_row = s.v_row;
      p.out_head = D;
      p.out_row = static_cast<int64_t>(H) * D;
      p.scale = d.scale;
      p.causal = s.n > 1;
      p.window = d.window;
      p.softcap = d.softcap;
      p.sinks = sinks.empty() ? nullptr : sinks.data();
      problems.push_back(p);
      row += s.n;
    }
    kernels::attention(problems.data(), static_cast<int>(problems.size()), isa, threads);

    matmul(att, wo, d.o, T, hidden, H * D, x1, isa, threads);
    if (bo != nullptr) {
      // o's bias, added to the product before the residual, as the per-op graph adds it.
      for_rows(T, threads, [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) {
          float* r = x1 + static_cast<int64_t>(t) * hidden;
          for (int c = 0; c < hidden; ++c) r[c] += bo[c];
        }
      });
    }
    if (moe != nullptr) {
      // The routed-expert MLP norms x1 and adds it back itself (no sandwich norms here).
      for_rows(T, threads, [&](int t0, int t1) {
        const int64_t at = static_cast<int64_t>(t0) * hidden;
        add_into(x1 + at, x + at, static_cast<int64_t>(t1 - t0) * hidden);
        kernels::lora_add_rows(lora[kernels::kLoraO], att, H * D, x1, hidden, t0, t1);
      });
      if (keep.rows != nullptr) {
        compact_rows(x1, hidden, keep);
        T = keep.count;
      }
      kernels::routed_experts(*moe, x1, post_norm, d.eps, true, d.moe == 2, y, T, isa, threads);
      return;
    }
    for_rows(T, threads, [&](int t0, int t1) {
      const int64_t at = static_cast<int64_t>(t0) * hidden;
      // o's delta: on its product before the post-attention norm (Gemma), else after the
      // residual add.
      const auto& o_lora = lora[kernels::kLoraO];
      if (post_attn != nullptr) {
        kernels::lora_add_rows(o_lora, att, H * D, x1, hidden, t0, t1);
        kernels::rms_norm_rows(x1 + at, t1 - t0, hidden, post_attn, d.eps, x1 + at);
      }
      add_into(x1 + at, x + at, static_cast<int64_t>(t1 - t0) * hidden);
      if (post_attn == nullptr) kernels::lora_add_rows(o_lora, att, H * D, x1, hidden, t0, t1);
      kernels::rms_norm_rows(x1 + at, t1 - t0, hidden, post_norm, d.eps, h + at);
    });
    if (keep.rows != nullptr) {
      // The MLP over the kept rows only.
      compact_rows(x1, hidden, keep);
      compact_rows(h, hidden, keep);
      T = keep.count;
    }
    matmul(h, wgu, d.gate_up, T, 2 * F, hidden, gu, isa, threads);
    if (!lora[kernels::kLoraGate].empty() || !lora[kernels::kLoraUp].empty()) {
      // gate's and up's deltas of the normed rows, in a pass of their own: the GLU writes its
      // rows (F wide) over h's (hidden wide), so no chunk may run it before every chunk has
      // read h.
      for_rows(T, threads, [&](int t0, int t1) {
        kernels::lora_add_rows(lora[kernels::kLoraGate], h, hidden, gu, 2 * F, t0, t1);
        kernels::lora_add_rows(lora[kernels::kLoraUp], h, hidden, gu + F, 2 * F, t0, t1);
      });
    }
    for_rows(T, threads, [&](int t0, int t1) {
      (d.gelu ? kernels::geglu_rows : kernels::swiglu_rows)(
          gu + static_cast<int64_t>(t0) * 2 * F, t1 - t0, 2 * F,
          g + static_cast<int64_t>(t0) * F, isa);
    });
    matmul(g, wdown, d.down, T, hidden, F, y, isa, threads);
    for_rows(T, threads, [&](int t0, int t1) {
      const int64_t at = static_cast<int64_t>(t0) * hidden;
      kernels::lora_add_rows(lora[kernels::kLoraDown], g, F, y, hidden, t0, t1);
      if (post_ff != nullptr)
        kernels::rms_norm_rows(y + at, t1 - t0, hidden, post_ff, d.eps, y + at);
      add_into(y + at, x1 + at, static_cast<int64_t>(t1 - t0) * hidden);
    });
  }

  std::vector<Layer> layers_;
  std::shared_ptr<const std::vector<float>> lora_scales_;  // [adapters, T]
  std::vector<int32_t> keep_;  // the rows the node returns (Keep), or empty: all
  Isa isa_;
  int threads_;
};

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("mlxcel decoder layer: " + why);
}

void check_float(const mx::array& a, const mx::Shape& shape, const char* what) {
  if (a.dtype() != mx::float32 || a.shape() != shape) {
    std::string dims;
    for (auto s : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(s);
    refuse(std::string(what) + " must be float32 [" + dims + "]");
  }
}

Quant check_quantized(const std::vector<mx::array>& in, int first, int n, int k, int32_t group,
                      int32_t bits, int32_t int8, const char* what) {
  if (int8 < 0 || int8 > 2)
    refuse(std::string(what) + ": layout code must be 0 (MLX), 1 (int8) or 2 (int8 layout, f32 x)");
  if (bits != 4 && bits != 8 && !(int8 != 0 && (bits == 5 || bits == 6)))
    refuse(std::string(what) + ": bits must be 4 or 8 (5 or 6 in the int8 layout)");
  if (group != 16 && group != 32 && group != 64 && group != 128)
    refuse(std::string(what) + ": group size must be 16, 32, 64 or 128");
  if (k % group != 0 || k % 32 != 0)
    refuse(std::string(what) + ": input width is not a multiple of the group and of 32");
  const auto& w = in[first];
  if (w.dtype() != mx::uint32 || w.ndim() != 2 || w.shape(0) != n ||
      static_cast<int64_t>(w.shape(1)) * 32 / bits != k)
    refuse(std::string(what) + ": weight must be uint32 [" + std::to_string(n) + ", " +
           std::to_string(k * bits / 32) + "]");
  const mx::Shape groups{n, k / group};
  const auto& scales = in[first + 1];
  // Biases kept as their multiple of the scales (int8 only; kernels/qmatmul.h): the scales
  // are checked against themselves.
  const bool derived = int8 != 0 && derived_biases(in[first + 2]);
  const auto& biases = derived ? scales : in[first + 2];
  if (int8 != 0 && (scales.dtype() == mx::uint8 || biases.dtype() == mx::uint8)) {
    // Factored (kernels/qmatmul.h).
    const mx::Shape factored{n / kernels::kInt8TileRows,
                             static_cast<int>(kernels::factored_tile_bytes(k, group))};
    if (k % kernels::kSuperBlock != 0 || scales.dtype() != mx::uint8 ||
        biases.dtype() != mx::uint8 || scales.shape() != factored || biases.shape() != factored)
      refuse(std::string(what) + ": factored scales and biases must both be uint8 [" +
             std::to_string(factored[0]) + ", " + std::to_string(factored[1]) + "]");
  } else if ((scales.dtype() != mx::float32 && scales.dtype() != mx::float16) ||
             biases.dtype() != scales.dtype() || scales.shape() != groups ||
             biases.shape() != groups) {
    refuse(std::string(what) + ": scales and biases must both be float32 or both float16 [" +
           std::to_string(n) + ", " + std::to_string(k / group) + "]");
  }
  if (int8 != 0 && n % kernels::kInt8TileRows != 0)
    refuse(std::string(what) + ": int8 weights need a multiple of " +
           std::to_string(kernels::kInt8TileRows) + " output rows");
  return Quant{group, bits, int8 != 0, int8 == 2};
}

constexpr size_t kDims = 16;  // per layer: see bridge.h

// The tensors of one layer with these dims, x included.
int tensor_count(const int32_t* dims) {
  return kInvFreq + 1 + (dims[14] != 0 ? 0 : 6) + (dims[5] != 0 ? 2 : 0) + (dims[8] != 0 ? 2 : 0) + (dims[11] != 0 ? 1 : 0) +
         (dims[12] != 0 ? 6 : 0) + (dims[15] != 0 ? 1 : 0);
}

// One layer checked: `inputs` holds x and the layer's tensors, `caches` its cache blocks. Appends
// the tensors after x and the blocks to `stack` (the node's inputs) and says where they start.
Layer plan_layer(std::vector<mx::array> inputs, const std::vector<mx::array>& cache_items,
                 const int32_t* dims, rust::Slice<const int32_t> quant,
                 rust::Slice<const int32_t> seqs, float eps, float scale, float rope_scale,
                 float rope_mscale, float softcap, std::vector<float> sinks,
                 std::shared_ptr<const RoutedExpertsPlan> experts,
                 std::vector<mx::array>& stack) {
  const bool split_qkv = dims[12] != 0;
  const bool dense = dims[14] == 0;
  // (group, bits, layout) of qkv (or q) and o, then gate/up and down on a dense layer, then k
  // and v when split.
  const size_t split_quant = dense ? 12u : 6u;
  if (quant.size() != split_quant + (split_qkv ? 6u : 0u))
    refuse(std::string("quant must be (group, bits, layout) for ") +
           (split_qkv ? "q, o, " : "qkv, o, ") + (dense ? "gate/up, down, " : "") +
           (split_qkv ? "k, v" : "in that order"));
  if (dims[14] < 0 || dims[14] > 2)
    refuse("the MLP code must be 0 (dense) or 1 or 2 (routed experts, x in f32 or int8)");
  if (!dense && !experts) refuse("a layer with routed experts needs its experts' plan");
  if (!dense && dims[8] != 0) refuse("a layer with routed experts cannot have sandwich norms");
  Dims d{};
  d.moe = dims[14];
  d.hidden = dims[0];
  d.heads = dims[1];
  d.kv_heads = dims[2];
  d.head_dim = dims[3];
  d.intermediate = dims[4];
  d.qk_norm = dims[5] != 0;
  d.qk_norm_whole = dims[5] == 2;
  if (dims[5] < 0 || dims[5] > 2)
    refuse("the q/k norm code must be 0 (none), 1 (per head) or 2 (over the whole projections)");
  d.rope = dims[6] != 0;
  d.window = dims[7];
  d.sandwich = dims[8] != 0;
  d.gelu = dims[9] != 0;
  d.rotary = dims[10];
  d.qkv_bias = dims[11] != 0;
  d.split_qkv = split_qkv;
  d.o_bias = dims[15] != 0;
  d.rope_mscale = rope_mscale;
  if (d.rotary < 2 || d.rotary % 2 != 0 || d.rotary > dims[3])
    refuse("the rotary width must be even, at least 2 and at most head_dim");
  d.softcap = softcap;
  if (d.window < 0) refuse("the window must be >= 0");
  if (!(softcap >= 0.0f)) refuse("the soft-cap must be >= 0");
  d.q_norm = dense ? kDownB + 1 : kInvFreq + 1;
  d.post_norms = d.q_norm + (d.qk_norm ? 2 : 0);
  d.bias = d.post_norms + (d.sandwich ? 2 : 0);
  d.split = d.bias + (d.qkv_bias ? 1 : 0);
  d.o_bias_at = d.split + (d.split_qkv ? 6 : 0);
  d.first_cache = d.o_bias_at + (d.o_bias ? 1 : 0);
  if (static_cast<int>(inputs.size()) != d.first_cache)
    refuse("expected " + std::to_string(d.first_cache) + " tensors, got " +
           std::to_string(inputs.size()));
  d.eps = eps;
  d.scale = scale;
  d.rope_scale = rope_scale;
  const int D = d.head_dim, H = d.heads, KV = d.kv_heads;
  if (d.hidden < 1 || H < 1 || KV < 1 || H % KV != 0 || D < 2 || D % 2 != 0 ||
      (dense && d.intermediate < 1))
    refuse("bad dimensions");
  if (!dense && routed_experts_kernel_plan(*experts).hidden != d.hidden)
    refuse("the routed experts' hidden size differs from the layer's");
  const mx::array x = inputs[kX];  // a handle, not a reference: `inputs` grows below
  if (x.dtype() != mx::float32 || x.ndim() != 2 || x.shape(1) != d.hidden)
    refuse("x must be float32 [tokens, " + std::to_string(d.hidden) + "]");
  check_float(inputs[kInputNorm], {d.hidden}, "the input norm");
  check_float(inputs[kPostNorm], {d.hidden}, "the post-attention norm");
  check_float(inputs[kInvFreq], {d.rotary / 2}, "inv_freq");
  if (d.qk_norm) {
    check_float(inputs[d.q_norm], {d.qk_norm_whole ? H * D : D}, "the q norm");
    check_float(inputs[d.q_norm + 1], {d.qk_norm_whole ? KV * D : D}, "the k norm");
  }
  if (d.sandwich) {
    check_float(inputs[d.post_norms], {d.hidden}, "the post-attention norm");
    check_float(inputs[d.post_norms + 1], {d.hidden}, "the post-MLP norm");
  }
  if (d.qkv_bias) check_float(inputs[d.bias], {(H + 2 * KV) * D}, "the q/k/v biases");
  if (d.o_bias) check_float(inputs[d.o_bias_at], {d.hidden}, "the o bias");
  if (d.split_qkv) {
    d.qkv = check_quantized(inputs, kQkvW, H * D, d.hidden, quant[0], quant[1], quant[2], "q");
    const size_t q = split_quant;
    d.k = check_quantized(inputs, d.split, KV * D, d.hidden, quant[q], quant[q + 1], quant[q + 2],
                          "k");
    d.v = check_quantized(inputs, d.split + 3, KV * D, d.hidden, quant[q + 3], quant[q + 4],
                          quant[q + 5], "v");
  } else {
    d.qkv = check_quantized(inputs, kQkvW, (H + 2 * KV) * D, d.hidden, quant[0], quant[1],
                            quant[2], "qkv");
  }
  d.o = check_quantized(inputs, kOW, d.hidden, H * D, quant[3], quant[4], quant[5], "o");
  if (dense) {
    d.gate_up = check_quantized(inputs, kGuW, 2 * d.intermediate, d.hidden, quant[6], quant[7],
                                quant[8], "gate/up");
    d.down = check_quantized(inputs, kDownW, d.hidden, d.intermediate, quant[9], quant[10],
                             quant[11], "down");
  }

  if (seqs.size() % 3 != 0 || seqs.empty()) refuse("seqs must be (n, position, blocks) triples");
  const size_t count = seqs.size() / 3;
  size_t expected = 0;
  for (size_t s = 0; s < count; ++s) expected += 2 * static_cast<size_t>(std::max(0, seqs[3 * s + 2]));
  if (cache_items.size() != expected)
    refuse("expected " + std::to_string(expected) +
           " cache blocks (each sequence's key blocks then its value blocks), got " +
           std::to_string(cache_items.size()));
  int64_t total = 0;
  size_t next = 0;
  for (size_t s = 0; s < count; ++s) {
    const int n = seqs[3 * s], position = seqs[3 * s + 1], blocks = seqs[3 * s + 2];
    if (n < 1 || position < 0 || blocks < 1)
      refuse("each sequence needs n >= 1, position >= 0 and at least one cache block");
    total += n;
    for (int c = 0; c < 2 * blocks; ++c) {
      const auto& cache = cache_items[next++];
      // f32 or f16 rows of D values, or uint8 rows of D / 32 q8_0 blocks.
      const bool q8 = cache.dtype() == mx::uint8 && D % kernels::kQ8Block == 0;
      const int64_t row = q8 ? D / kernels::kQ8Block * kernels::kQ8BlockBytes : D;
      if ((cache.dtype() != mx::float32 && cache.dtype() != mx::float16 && !q8) ||
          cache.ndim() != 4 || cache.shape(0) != 1 || cache.shape(1) != KV ||
          cache.shape(2) != kernels::kKvBlock || cache.shape(3) != row)
        refuse("cache blocks must be float32 or float16 [1, " + std::to_string(KV) + ", " +
               std::to_string(kernels::kKvBlock) + ", " + std::to_string(D) +
               "] (or uint8 q8_0 rows of " +
               std::to_string(D / kernels::kQ8Block * kernels::kQ8BlockBytes) + " bytes)");
      inputs.push_back(cache);
    }
    if (static_cast<int64_t>(position) + n > static_cast<int64_t>(blocks) * kernels::kKvBlock)
      refuse("sequence " + std::to_string(s) + " writes positions up to " +
             std::to_string(position + n) + " but its " + std::to_string(blocks) +
             " cache blocks hold " + std::to_string(blocks * kernels::kKvBlock));
  }
  if (total != x.shape(0))
    refuse("the sequences hold " + std::to_string(total) + " tokens but x has " +
           std::to_string(x.shape(0)) + " rows");
  const int first = static_cast<int>(stack.size());
  stack.insert(stack.end(), inputs.begin() + 1, inputs.end());
  return Layer{d, std::vector<int32_t>(seqs.begin(), seqs.end()), first, std::move(sinks),
               std::move(experts), {}};
}

// The LoRA pairs checked against their layers (lora_plan.h), each added to its layer.
void plan_lora(const ArrayList& matrices, rust::Slice<const int32_t> pairs,
               rust::Slice<const float> factors, rust::Slice<const float> scales, int T,
               std::vector<Layer>& plan, std::vector<mx::array>& stack) {
  auto shape_of = [&](int layer, int target) -> LoraShape {
    if (layer < 0 || static_cast<size_t>(layer) >= plan.size())
      refuse("LoRA: layer " + std::to_string(layer) + " is not in the stack");
    const Dims& d = plan[layer].dims;
    if (target >= kernels::kLoraGate && d.moe != 0)
      refuse("LoRA: an MLP target on layer " + std::to_string(layer) +
             ", whose MLP is routed experts");
    const int q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
    const int ins[] = {d.hidden, d.hidden, d.hidden, q, d.hidden, d.hidden, d.intermediate};
    const int outs[] = {q, kv, kv, d.hidden, d.intermediate, d.intermediate, d.hidden};
    return LoraShape{ins[target], outs[target]};
  };
  for (const LoraPlan& p : plan_lora_pairs(matrices.items, pairs.data(), pairs.size(),
                                           factors.data(), factors.size(), scales.size(), T,
                                           shape_of, stack))
    plan[p.layer].lora.push_back(
        Layer::LoraPair{p.input, p.target, p.adapter, p.in, p.out, p.rank, p.factor, p.half});
}

}  // namespace

std::unique_ptr<MlxArray> native_decoder_stack(const ArrayList& tensors, const ArrayList& caches,
                                               rust::Slice<const int32_t> dims,
                                               rust::Slice<const int32_t> quant,
                                               rust::Slice<const int32_t> seqs,
                                               rust::Slice<const float> softcaps,
                                               rust::Slice<const float> sinks,
                                               const ExpertsList& experts,
                                               const ArrayList& lora,
                                               rust::Slice<const int32_t> lora_pairs,
                                               rust::Slice<const float> lora_factors,
                                               rust::Slice<const float> lora_scales, float eps,
                                               float scale, float rope_scale, float rope_mscale,
                                               rust::Slice<const int32_t> keep, uint8_t isa,
                                               int32_t threads) {
  if (dims.empty() || dims.size() % kDims != 0)
    refuse(
        "dims must be, per layer, hidden, heads, kv_heads, head_dim, intermediate, qk_norm, "
        "rope, window, sandwich, gelu, rotary, qkv_bias, split_qkv, sinks, mlp, o_bias");
  const size_t layers = dims.size() / kDims;
  if (softcaps.size() != layers) refuse("softcaps must hold one value per layer");
  if (seqs.size() % layers != 0) refuse("seqs must hold the same number of values per layer");
  const size_t per_layer_seqs = seqs.size() / layers;
  if (isa > static_cast<uint8_t>(Isa::Avx512)) refuse("unknown ISA code " + std::to_string(isa));
  if (tensors.items.empty()) refuse("tensors must start with x");
  const mx::array& x = tensors.items[0];
  std::vector<mx::array> stack{x};
  std::vector<Layer> plan;
  size_t next_tensor = 1, next_cache = 0, next_quant = 0, next_sink = 0, next_experts = 0;
  for (size_t l = 0; l < layers; ++l) {
    const int32_t* ld = dims.data() + l * kDims;
    const size_t count = static_cast<size_t>(tensor_count(ld)) - 1;
    const size_t quant_count = (ld[12] != 0 ? 18 : 12) - (ld[14] != 0 ? 6 : 0);
    const int32_t* ls = seqs.data() + l * per_layer_seqs;
    size_t blocks = 0;
    if (per_layer_seqs % 3 == 0)
      for (size_t s = 0; s < per_layer_seqs / 3; ++s)
        blocks += 2 * static_cast<size_t>(std::max(0, ls[3 * s + 2]));
    if (next_tensor + count > tensors.items.size() || next_cache + blocks > caches.items.size() ||
        next_quant + quant_count > quant.size())
      refuse("layer " + std::to_string(l) + ": fewer tensors, cache blocks or quant values than "
             "its dims and seqs need");
    std::vector<mx::array> layer_inputs{x};
    layer_inputs.insert(layer_inputs.end(), tensors.items.begin() + next_tensor,
                        tensors.items.begin() + next_tensor + count);
    const std::vector<mx::array> layer_caches(caches.items.begin() + next_cache,
                                              caches.items.begin() + next_cache + blocks);
    // A layer with sinks takes its heads' logits from `sinks`, in layer order.
    std::vector<float> layer_sinks;
    if (ld[13] != 0) {
      const size_t heads = static_cast<size_t>(std::max(0, ld[1]));
      if (next_sink + heads > sinks.size())
        refuse("layer " + std::to_string(l) + ": fewer sink logits than its heads");
      layer_sinks.assign(sinks.begin() + next_sink, sinks.begin() + next_sink + heads);
      next_sink += heads;
    }
    // A layer with routed experts takes its plan from `experts`, in layer order.
    std::shared_ptr<const RoutedExpertsPlan> layer_experts;
    if (ld[14] != 0) {
      if (next_experts >= experts.items.size())
        refuse("layer " + std::to_string(l) + ": fewer routed-expert plans than routed layers");
      layer_experts = experts.items[next_experts++];
    }
    try {
      plan.push_back(plan_layer(std::move(layer_inputs), layer_caches, ld,
                                rust::Slice<const int32_t>(quant.data() + next_quant, quant_count),
                                rust::Slice<const int32_t>(ls, per_layer_seqs), eps, scale,
                                rope_scale, rope_mscale, softcaps[l], std::move(layer_sinks),
                                std::move(layer_experts), stack));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("layer " + std::to_string(l) + ": " + e.what());
    }
    next_tensor += count;
    next_cache += blocks;
    next_quant += quant_count;
  }
  if (next_tensor != tensors.items.size() || next_cache != caches.items.size() ||
      next_quant != quant.size() || next_sink != sinks.size() ||
      next_experts != experts.items.size())
    refuse("more tensors, cache blocks, quant values, sink logits or routed-expert plans than "
           "the layers' dims and seqs name");
  plan_lora(lora, lora_pairs, lora_factors, lora_scales, static_cast<int>(x.shape(0)), plan,
            stack);
  // The rows the last layer's MLP runs on and the node returns (empty: all of them), ascending.
  const int rows = static_cast<int>(x.shape(0));
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || keep[i] >= rows || (i > 0 && keep[i] <= keep[i - 1]))
      refuse("the rows to keep must ascend within the step's " + std::to_string(rows) + " rows");
  }
  if (!keep.empty() && !lora_pairs.empty())
    refuse("rows to keep with LoRA pairs: the deltas are per row of the whole step");
  auto prim = std::make_shared<DecoderStackCpu>(
      mlxcel_stream(), std::move(plan),
      std::make_shared<const std::vector<float>>(lora_scales.begin(), lora_scales.end()),
      std::vector<int32_t>(keep.begin(), keep.end()), static_cast<Isa>(isa),
      threads < 1 ? 1 : threads);
  auto shape = x.shape();
  if (!keep.empty()) shape[0] = static_cast<int>(keep.size());
  return wrap(mx::array(std::move(shape), mx::float32, std::move(prim), std::move(stack)));
}

}  // namespace mlxcel
