// MLX primitives for mlxcel's CPU kernels, and their bridge shims.
//
// MLX's CPU backend is asynchronous: eval_cpu runs when the graph is scheduled, before the inputs'
// producers have run. It may read shapes, strides and pointers (allocated by then), but the data
// only inside the task it hands to the stream's command encoder, which runs after the producers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "mlx/primitives.h"
#include "mlxcel-core/cpp/bridge.h"
#include "mlxcel-core/cpp/kernels/attention.h"
#include "mlxcel-core/cpp/kernels/dispatch.h"
#include "mlxcel-core/cpp/kernels/pool.h"
#include "mlxcel-core/cpp/kernels/rowops.h"

namespace mx = mlx::core;

namespace mlxcel {

std::unique_ptr<MlxArray> wrap(mx::array a);

namespace {

using kernels::Isa;

// Where each row of an [M, K] view of `a` starts, in elements from a.data<float>(), for inputs
// that are not row-contiguous (a slice, a transpose, a broadcast).
std::vector<int64_t> row_offsets(const mx::array& a, int64_t rows) {
  std::vector<int64_t> offsets(rows);
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int lead = static_cast<int>(shape.size()) - 1;
  std::vector<int64_t> index(lead, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < lead; ++d) off += index[d] * strides[d];
    offsets[r] = off;
    for (int d = lead - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return offsets;
}

// What the quantized matmul does to its result before writing it: nothing, add a residual
// (`y + r`, the transformer's skip connection), or SwiGLU over the two halves of each row
// (`silu(y[:, :F]) · y[:, F:]` for fused gate and up projections), or GeGLU likewise with GELU's
// tanh form (Gemma). Each saves MLX graph nodes, whose fixed cost (~20 µs each here) dominates a
// decode step.
enum class Epilogue : uint8_t { None = 0, Residual = 1, Swiglu = 2, Geglu = 3 };

bool gated(Epilogue e) { return e == Epilogue::Swiglu || e == Epilogue::Geglu; }

// Biases kept as their multiple of the scales (kernels::bias_multiple): one f32 in a [1] array,
// or [m, 1] for 4-bit E2M1 indices (kernels/qmatmul.h, "E2M1 codes").
bool derived_biases(const mx::array& biases) {
  return biases.dtype() == mx::float32 && biases.ndim() == 1 &&
         (biases.shape(0) == 1 || biases.shape(0) == 2);
}

// Whether an int8-layout weight's 4-bit codes are E2M1 indices (the [m, 1] placeholder).
bool e2m1_codes(const mx::array& biases, int bits) {
  return bits == 4 && derived_biases(biases) && biases.shape(0) == 2;
}

// A QProblem's weight half: the packed weight (N rows of K values), its scales and biases
// (f32, f16, or factored u8) and layout; x, y and M are the caller's.
kernels::QProblem weight_problem(const mx::array& w, const mx::array& scales,
                                 const mx::array& biases, int group_size, int bits, bool int8,
                                 bool f32x = false) {
  kernels::QProblem p{};
  p.N = w.shape(0);
  p.K = static_cast<int>(static_cast<int64_t>(w.shape(1)) * 32 / bits);
  p.group_size = group_size;
  p.bits = bits;
  p.int8 = int8;
  p.f32x = int8 && f32x;
  p.w = w.data<uint32_t>();
  p.half = scales.dtype() == mx::float16;
  p.factored = scales.dtype() == mx::uint8;
  p.scales = scales.data<uint8_t>();
  p.biases = biases.data<uint8_t>();
  p.bias_scale = int8 && derived_biases(biases) ? biases.data<float>()[0] : 0.0f;
  p.e2m1 = int8 && e2m1_codes(biases, bits);
  return p;
}

class QuantizedMatmulCpu : public mx::UnaryPrimitive {
 public:
  QuantizedMatmulCpu(mx::Stream stream, int group_size, int bits, bool int8, bool f32x, Isa isa,
                     int threads, Epilogue epilogue, bool norm, float eps)
      : mx::UnaryPrimitive(stream),
        group_size_(group_size),
        bits_(bits),
        int8_(int8),
        f32x_(f32x),
        isa_(isa),
        threads_(threads),
        epilogue_(epilogue),
        norm_(norm),
        eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    const auto& biases = inputs[3];
    for (const auto* a : {&w, &scales, &biases}) {
      if (!a->flags().row_contiguous)
        throw std::runtime_error("mlxcel quantized matmul: weights must be row-contiguous");
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    // The residual is read like x: in place when row-contiguous, else gathered in the task.
    const float* rdata = nullptr;
    std::vector<int64_t> r_offsets;
    int64_t r_stride = 1;
    if (epilogue_ == Epilogue::Residual) {
      const auto& r = inputs[4];
      rdata = r.data<float>();
      if (!r.flags().row_contiguous) {
        r_offsets = row_offsets(r, r.size() / r.shape(-1));
        r_stride = r.strides().back();
      }
      encoder_input(r);
    }

    // The RMSNorm weight, when x is to be normalized first, is the last input.
    const float* norm_w = nullptr;
    if (norm_) {
      const auto& nw = inputs.back();
      if (!nw.flags().row_contiguous)
        throw std::runtime_error("mlxcel quantized matmul: the norm weight must be contiguous");
      norm_w = nw.data<float>();
      encoder_input(nw);
    }

    kernels::QProblem p = weight_problem(w, scales, biases, group_size_, bits_, int8_, f32x_);
    p.M = static_cast<int>(x.size() / p.K);
    float* ydata = out.data<float>();
    p.y = ydata;

    const float* xdata = x.data<float>();
    std::vector<int64_t> offsets;
    int64_t col_stride = 1;
    if (!x.flags().row_contiguous) {
      offsets = row_offsets(x, p.M);
      col_stride = x.strides().back();
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(out);
    encoder.dispatch([p, xdata, offsets = std::move(offsets), col_stride, isa = isa_,
                      threads = threads_, epilogue = epilogue_, rdata, ydata,
                      r_offsets = std::move(r_offsets), r_stride, norm_w,
                      eps = eps_]() mutable {
      std::vector<float> gathered;
      if (offsets.empty()) {
        p.x = xdata;
      } else {
        gathered.resize(static_cast<size_t>(p.M) * p.K);
        for (int m = 0; m < p.M; ++m)
          for (int k = 0; k < p.K; ++k)
            gathered[static_cast<size_t>(m) * p.K + k] = xdata[offsets[m] + k * col_stride];
        p.x = gathered.data();
      }
      std::vector<float> normed;
      if (norm_w != nullptr) {
        normed.resize(static_cast<size_t>(p.M) * p.K);
        kernels::rms_norm_rows(p.x, p.M, p.K, norm_w, eps, normed.data());
        p.x = normed.data();
      }
      std::vector<float> full;
      if (gated(epilogue)) {
        full.resize(static_cast<size_t>(p.M) * p.N);
        p.y = full.data();
      }
      kernels::qmatmul(p, isa, threads);
      if (epilogue == Epilogue::Swiglu) {
        kernels::swiglu_rows(full.data(), p.M, p.N, ydata, isa);
      } else if (epilogue == Epilogue::Geglu) {
        kernels::geglu_rows(full.data(), p.M, p.N, ydata, isa);
      } else if (epilogue == Epilogue::Residual) {
        for (int m = 0; m < p.M; ++m) {
          float* o = ydata + static_cast<size_t>(m) * p.N;
          if (r_offsets.empty()) {
            const float* r = rdata + static_cast<size_t>(m) * p.N;
            for (int j = 0; j < p.N; ++j) o[j] += r[j];
          } else {
            for (int j = 0; j < p.N; ++j) o[j] += rdata[r_offsets[m] + j * r_stride];
          }
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel quantized matmul has no GPU implementation");
  }

  const char* name() const override { return "MlxcelQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmulCpu&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && int8_ == o.int8_ && f32x_ == o.f32x_ &&
           isa_ == o.isa_ && threads_ == o.threads_ && epilogue_ == o.epilogue_ &&
           norm_ == o.norm_ && eps_ == o.eps_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0) / (gated(epilogue_) ? 2 : 1);
    return {shape};
  }

 private:
  void encoder_input(const mx::array& a) { mx::cpu::get_command_encoder(stream()).set_input_array(a); }

  int group_size_;
  int bits_;
  bool int8_;
  bool f32x_;  // (int8 layout) x stays f32
  Isa isa_;
  int threads_;
  Epilogue epilogue_;
  bool norm_;
  float eps_;
};

// Attention for one sequence: inputs q [1, heads, n, D], then either k and v [1, kv_heads, L, D]
// (usually slices of the KV cache: strided, read in place) or, with `blocks` > 0, the KV cache's
// blocks themselves ([1, kv_heads, kKvBlock, D] each: `blocks` key blocks, then as many value
// blocks), read where they are with no concatenation; with each head's sink logit if any (kept in
// the primitive: a layer's few constants).
class AttentionCpu : public mx::UnaryPrimitive {
 public:
  AttentionCpu(mx::Stream stream, float scale, bool causal, int window, float softcap, int keys,
               bool tokens_major, std::vector<float> sinks, Isa isa, int threads, int blocks = 0)
      : mx::UnaryPrimitive(stream),
        scale_(scale),
        softcap_(softcap),
        sinks_(std::move(sinks)),
        causal_(causal),
        window_(window),
        keys_(keys),
        tokens_major_(tokens_major),
        isa_(isa),
        threads_(threads),
        blocks_(blocks) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& q = inputs[0];
    const auto& k = inputs[1];
    const auto& v = inputs[blocks_ > 0 ? 1 + blocks_ : 2];
    for (const auto& a : inputs) {
      if (a.strides().back() != 1 && a.shape(-1) != 1)
        throw std::runtime_error("mlxcel attention: the head dimension must be contiguous");
    }
    // Each block is read with its own strides: a block that a step's write covered whole is
    // that step's keys (values) themselves, a strided view, not a buffer of the block's shape.
    std::vector<const void*> k_blocks, v_blocks;
    std::vector<int64_t> block_strides;
    for (int b = 0; b < blocks_; ++b) {
      const auto& kb = inputs[1 + b];
      const auto& vb = inputs[1 + blocks_ + b];
      k_blocks.push_back(kb.data<uint8_t>());
      v_blocks.push_back(vb.data<uint8_t>());
      block_strides.insert(block_strides.end(),
                           {kb.strides()[1], kb.strides()[2], vb.strides()[1], vb.strides()[2]});
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    kernels::AttentionProblem p{};
    p.q = q.data<float>();
    p.k = k.data<uint8_t>();
    p.v = v.data<uint8_t>();
    // Keys and values: f32, f16, or uint8 rows of q8_0 blocks (whose strides are bytes).
    auto dtype_of = [&](const mx::array& a) {
      if (a.dtype() == mx::float32) return kernels::KvDtype::F32;
      if (a.dtype() == mx::float16) return kernels::KvDtype::F16;
      if (a.dtype() == mx::uint8 &&
          a.shape(-1) == q.shape(3) / kernels::kQ8Block * kernels::kQ8BlockBytes &&
          q.shape(3) % kernels::kQ8Block == 0)
        return kernels::KvDtype::Q8_0;
      throw std::runtime_error(
          "mlxcel attention: keys and values must be float32, float16 or uint8 q8_0 rows of "
          "head_dim / 32 · 34 bytes");
    };
    p.k_dtype = dtype_of(k);
    p.v_dtype = dtype_of(v);
    p.out = out.data<float>();
    p.heads = q.shape(1);
    p.kv_heads = k.shape(1);
    p.n = q.shape(2);
    p.L = keys_;
    p.D = q.shape(3);
    p.out_head = tokens_major_ ? p.D : static_cast<int64_t>(p.n) * p.D;
    p.out_row = tokens_major_ ? static_cast<int64_t>(p.heads) * p.D : p.D;
    p.q_head = q.strides()[1];
    p.q_row = q.strides()[2];
    p.k_head = k.strides()[1];
    p.k_row = k.strides()[2];
    p.v_head = v.strides()[1];
    p.v_row = v.strides()[2];
    p.scale = scale_;
    p.causal = causal_;
    p.window = window_;
    p.softcap = softcap_;
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    // The task owns its copies of the sinks and block tables: it may run after this call returns.
    encoder.dispatch([p, sinks = sinks_, k_blocks = std::move(k_blocks),
                      v_blocks = std::move(v_blocks), block_strides = std::move(block_strides),
                      isa = isa_, threads = threads_]() mutable {
      p.sinks = sinks.empty() ? nullptr : sinks.data();
      if (!k_blocks.empty()) {
        p.k_blocks = k_blocks.data();
        p.v_blocks = v_blocks.data();
        p.block_strides = block_strides.data();
      }
      kernels::attention(&p, 1, isa, threads);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel attention has no GPU implementation");
  }

  const char* name() const override { return "MlxcelAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AttentionCpu&>(other);
    return scale_ == o.scale_ && softcap_ == o.softcap_ && sinks_ == o.sinks_ &&
           causal_ == o.causal_ &&
           window_ == o.window_ &&
           keys_ == o.keys_ &&
           tokens_major_ == o.tokens_major_ && isa_ == o.isa_ && threads_ == o.threads_ &&
           blocks_ == o.blocks_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& q = inputs[0];
    if (tokens_major_) return {{q.shape(2), q.shape(1) * q.shape(3)}};
    return {q.shape()};
  }

 private:
  float scale_;
  float softcap_;
  std::vector<float> sinks_;  // [heads], or empty: none
  bool causal_;
  int window_;
  int keys_;
  bool tokens_major_;
  Isa isa_;
  int threads_;
  int blocks_;  // 0: k and v are whole arrays; else how many cache blocks each side has
};

// One sequence's heads out of the stacked q/k/v projection: rows [row0, row0 + n) and columns
// [col0, col0 + heads·D) of qkv [T, C] as [1, heads, n, D], rotated (RoPE, Hugging Face halves
// layout, position offset + i scaled by `scale`, inverse frequencies from the second input) when
// `rope`. Replaces a slice, reshape, transpose and rope: four graph nodes per projection.
class SplitHeadsCpu : public mx::UnaryPrimitive {
 public:
  SplitHeadsCpu(mx::Stream stream, int row0, int n, int col0, int heads, int dim, bool rope,
                int offset, float scale)
      : mx::UnaryPrimitive(stream),
        row0_(row0), n_(n), col0_(col0), heads_(heads), dim_(dim), rope_(rope),
        offset_(offset), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& qkv = inputs[0];
    const auto& inv_freq = inputs[1];
    if (!qkv.flags().row_contiguous || !inv_freq.flags().row_contiguous)
      throw std::runtime_error("mlxcel split_heads: inputs must be row-contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const float* src = qkv.data<float>();
    const float* freqs = inv_freq.data<float>();
    float* dst = out.data<float>();
    const int64_t cols = qkv.shape(1);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(qkv);
    encoder.set_input_array(inv_freq);
    encoder.set_output_array(out);
    encoder.dispatch([src, freqs, dst, cols, row0 = row0_, n = n_, col0 = col0_, heads = heads_,
                      dim = dim_, rope = rope_, offset = offset_, scale = scale_]() {
      const int half = dim / 2;
      std::vector<float> cos_t(half), sin_t(half);
      for (int i = 0; i < n; ++i) {
        const float* row = src + (row0 + i) * cols + col0;
        if (rope) {
          kernels::rope_tables(static_cast<float>(offset + i) * scale, freqs, half, cos_t.data(),
                               sin_t.data());
        }
        for (int h = 0; h < heads; ++h) {
          const float* x = row + h * dim;
          float* y = dst + (static_cast<int64_t>(h) * n + i) * dim;
          if (rope) {
            kernels::rope_head(x, y, cos_t.data(), sin_t.data(), half);
          } else {
            std::memcpy(y, x, sizeof(float) * dim);
          }
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel split_heads has no GPU implementation");
  }

  const char* name() const override { return "MlxcelSplitHeads"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const SplitHeadsCpu&>(other);
    return row0_ == o.row0_ && n_ == o.n_ && col0_ == o.col0_ && heads_ == o.heads_ &&
           dim_ == o.dim_ && rope_ == o.rope_ && offset_ == o.offset_ && scale_ == o.scale_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>&) override {
    return {{1, heads_, n_, dim_}};
  }

 private:
  int row0_, n_, col0_, heads_, dim_;
  bool rope_;
  int offset_;
  float scale_;
};

// Rows of an int8-layout weight, dequantized (the embedding lookup of a tied table that is
// kept in that layout only).
class Int8RowsCpu : public mx::UnaryPrimitive {
 public:
  Int8RowsCpu(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& ids = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    const auto& biases = inputs[3];
    for (const auto* a : {&ids, &w, &scales, &biases}) {
      if (!a->flags().row_contiguous)
        throw std::runtime_error("mlxcel int8 rows: inputs must be row-contiguous");
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const kernels::QProblem p = weight_problem(w, scales, biases, group_size_, bits_, true);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto* a : {&ids, &w, &scales, &biases}) encoder.set_input_array(*a);
    encoder.set_output_array(out);
    encoder.dispatch([p, ids = ids.data<uint32_t>(), count = static_cast<int>(ids.size()),
                      y = out.data<float>()]() {
      // An id past the table (the engine refuses such tokens before they get here) gives a
      // row of NaN rather than another row's values.
      for (int i = 0; i < count; ++i) {
        float* row = y + static_cast<int64_t>(i) * p.K;
        if (ids[i] >= static_cast<uint32_t>(p.N))
          std::fill(row, row + p.K, std::numeric_limits<float>::quiet_NaN());
        else
          kernels::int8_dequantize_rows(p, ids + i, 1, row);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel int8 rows has no GPU implementation");
  }

  const char* name() const override { return "MlxcelInt8Rows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const Int8RowsCpu&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.push_back(static_cast<int>(static_cast<int64_t>(inputs[1].shape(1)) * 32 / bits_));
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
};

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("mlxcel quantized matmul: " + why);
}

// Scales and biases of an [n, groups] quantized matrix: both f32 or both f16, that shape.
void check_scales(const mx::array& scales, const mx::array& biases, int n, int groups) {
  for (const auto* a : {&scales, &biases}) {
    if ((a->dtype() != mx::float32 && a->dtype() != mx::float16) ||
        a->dtype() != scales.dtype() || a->ndim() != 2 || a->shape(0) != n ||
        a->shape(1) != groups)
      refuse("scales and biases must both be float32 or both float16 [" + std::to_string(n) +
             ", " + std::to_string(groups) + "]");
  }
}

// Scales and biases in the int8 layout: plain (as check_scales) or both factored, u8
// [n/16, factored_tile_bytes(k, group)] (qmatmul.h).
void check_int8_scales(const mx::array& scales, const mx::array& biases, int n, int k,
                       int group) {
  if (derived_biases(biases)) {
    // Scales alone (f32, f16 or factored); the biases are their multiple (a power of two,
    // written by interleave_int8 only, so not read here: the array may not be evaluated yet).
    if (scales.dtype() == mx::uint8) {
      check_int8_scales(scales, scales, n, k, group);
      return;
    }
    check_scales(scales, scales, n, k / group);
    return;
  }
  if (scales.dtype() != mx::uint8 && biases.dtype() != mx::uint8) {
    check_scales(scales, biases, n, k / group);
    return;
  }
  const mx::Shape shape{n / kernels::kInt8TileRows,
                        static_cast<int>(kernels::factored_tile_bytes(k, group))};
  if (k % kernels::kSuperBlock != 0 || kernels::kSuperBlock % group != 0 ||
      scales.dtype() != mx::uint8 || biases.dtype() != mx::uint8 || scales.shape() != shape ||
      biases.shape() != shape)
    refuse("factored scales and biases must both be uint8 [" + std::to_string(shape[0]) + ", " +
           std::to_string(shape[1]) + "] (an input width that is a multiple of 256)");
}

}  // namespace

std::unique_ptr<MlxArray> native_quantized_matmul(const MlxArray& x, const MlxArray& w,
                                                  const MlxArray& scales, const MlxArray& biases,
                                                  int32_t group_size, int32_t bits,
                                                  uint8_t layout, uint8_t isa, int32_t threads, uint8_t epilogue,
                                                  const MlxArray& residual, bool norm,
                                                  const MlxArray& norm_weight, float eps) {
  if (epilogue > static_cast<uint8_t>(Epilogue::Geglu))
    refuse("unknown epilogue code " + std::to_string(epilogue));
  // 0: MLX's layout; 1: the int8 layout, x quantized to int8; 2: the int8 layout, x in f32.
  if (layout > 2) refuse("unknown layout code " + std::to_string(layout));
  const bool int8 = layout != 0, f32x = layout == 2;
  if (bits != 4 && bits != 8 && !(int8 && (bits == 5 || bits == 6)))
    refuse("bits must be 4 or 8 (5 or 6 in the int8 layout), got " + std::to_string(bits));
  if (group_size != 16 && group_size != 32 && group_size != 64 && group_size != 128)
    refuse("group_size must be 16, 32, 64 or 128, got " + std::to_string(group_size));
  if (isa > static_cast<uint8_t>(Isa::Avx512)) refuse("unknown ISA code " + std::to_string(isa));
  const auto& xa = x.inner;
  const auto& wa = w.inner;
  if (xa.dtype() != mx::float32) refuse("x must be float32");
  if (wa.dtype() != mx::uint32 || wa.ndim() != 2) refuse("weight must be a 2-D uint32 array");
  if (xa.ndim() < 1) refuse("x must have at least one dimension");
  const int k = xa.shape(-1);
  const int n = wa.shape(0);
  // Groups of 16 still need whole 32-value chunks (the unpacking and int8 blocks).
  if (k % group_size != 0 || k % 32 != 0 ||
      static_cast<int64_t>(wa.shape(1)) * 32 / bits != k)
    refuse("x's last dimension " + std::to_string(k) + " does not match the weight's " +
           std::to_string(static_cast<int64_t>(wa.shape(1)) * 32 / bits));
  if (int8 && n % kernels::kInt8TileRows != 0)
    refuse("int8 weights need a multiple of " + std::to_string(kernels::kInt8TileRows) +
           " output rows, got " + std::to_string(n));
  if (int8)
    check_int8_scales(scales.inner, biases.inner, n, k, group_size);
  else
    check_scales(scales.inner, biases.inner, n, k / group_size);
  const auto ep = static_cast<Epilogue>(epilogue);
  auto shape = xa.shape();
  shape.back() = n;
  std::vector<mx::array> inputs{xa, wa, scales.inner, biases.inner};
  if (gated(ep)) {
    if (n % 2 != 0) refuse("a gated epilogue needs an even number of output rows, got " + std::to_string(n));
    shape.back() = n / 2;
  } else if (ep == Epilogue::Residual) {
    if (residual.inner.dtype() != mx::float32 || residual.inner.shape() != shape)
      refuse("the residual must be float32 of the output's shape");
    inputs.push_back(residual.inner);
  }
  if (norm) {
    const auto& nw = norm_weight.inner;
    if (nw.dtype() != mx::float32 || nw.ndim() != 1 || nw.shape(0) != k)
      refuse("the RMSNorm weight must be float32 [" + std::to_string(k) + "]");
    inputs.push_back(nw);
  }
  auto prim = std::make_shared<QuantizedMatmulCpu>(mlxcel_stream(), group_size, bits, int8, f32x,
                                                   static_cast<Isa>(isa),
                                                   threads < 1 ? 1 : threads, ep, norm, eps);
  return wrap(mx::array(std::move(shape), mx::float32, std::move(prim), std::move(inputs)));
}

std::unique_ptr<MlxArray> native_attention(const MlxArray& q, const MlxArray& k,
                                           const MlxArray& v, float scale, bool causal,
                                           int32_t window, float softcap, int32_t keys,
                                           bool tokens_major, rust::Slice<const float> sinks,
                                           uint8_t isa, int32_t threads) {
  const auto& qa = q.inner;
  const auto& ka = k.inner;
  const auto& va = v.inner;
  for (const auto* a : {&qa, &ka, &va}) {
    const bool f32 = a->dtype() == mx::float32, other = a != &qa;
    const bool f16 = other && a->dtype() == mx::float16;
    // q8_0 rows: head_dim / 32 blocks of 34 bytes.
    const bool q8 = other && a->dtype() == mx::uint8 && qa.ndim() == 4 &&
                    qa.shape(3) % kernels::kQ8Block == 0 && a->ndim() == 4 &&
                    a->shape(3) == qa.shape(3) / kernels::kQ8Block * kernels::kQ8BlockBytes;
    if (!(f32 || f16 || q8) || a->ndim() != 4 || a->shape(0) != 1 ||
        ((f32 || f16) && a->shape(3) != qa.shape(3)))
      throw std::invalid_argument(
          "mlxcel attention: q must be float32, k and v float32 or float16 (or uint8 q8_0 rows "
          "of D / 32 · 34 bytes), all [1, heads, len, D]");
  }
  if (keys < 0) keys = ka.shape(2);
  if (ka.shape(1) != va.shape(1) || ka.shape(2) != va.shape(2) || qa.shape(1) % ka.shape(1) != 0 ||
      keys > ka.shape(2) || qa.shape(2) > keys)
    throw std::invalid_argument(
        "mlxcel attention: k and v must match, share q's head size, divide its heads, and hold "
        "at least its positions");
  if (isa > static_cast<uint8_t>(Isa::Avx512))
    throw std::invalid_argument("mlxcel attention: unknown ISA code " + std::to_string(isa));
  if (window < 0) throw std::invalid_argument("mlxcel attention: the window must be >= 0");
  if (!(softcap >= 0.0f)) throw std::invalid_argument("mlxcel attention: softcap must be >= 0");
  if (!sinks.empty() && sinks.size() != static_cast<size_t>(qa.shape(1)))
    throw std::invalid_argument("mlxcel attention: sinks must hold one logit per query head (" +
                                std::to_string(qa.shape(1)) + "), or none");
  auto prim = std::make_shared<AttentionCpu>(mlxcel_stream(), scale, causal, window, softcap, keys,
                                             tokens_major,
                                             std::vector<float>(sinks.begin(), sinks.end()),
                                             static_cast<Isa>(isa),
                                             threads < 1 ? 1 : threads);
  auto shape = tokens_major ? mx::Shape{qa.shape(2), qa.shape(1) * qa.shape(3)} : qa.shape();
  return wrap(mx::array(std::move(shape), mx::float32, std::move(prim), {qa, ka, va}));
}

std::unique_ptr<MlxArray> native_attention_blocks(const MlxArray& q, const ArrayList& k_blocks,
                                                  const ArrayList& v_blocks, float scale,
                                                  bool causal, int32_t window, float softcap,
                                                  int32_t keys, rust::Slice<const float> sinks,
                                                  uint8_t isa, int32_t threads) {
  const auto& qa = q.inner;
  if (qa.dtype() != mx::float32 || qa.ndim() != 4 || qa.shape(0) != 1)
    throw std::invalid_argument("mlxcel attention: q must be float32 [1, heads, n, D]");
  const int D = qa.shape(3);
  const size_t blocks = k_blocks.items.size();
  if (blocks == 0 || v_blocks.items.size() != blocks)
    throw std::invalid_argument(
        "mlxcel attention: the keys and the values need the same number of cache blocks, at "
        "least one");
  // Every block of a side has the first's type and shape [1, kv_heads, kKvBlock, row]: f32 or
  // f16 rows of D values, or uint8 rows of D / 32 q8_0 blocks.
  for (const auto* side : {&k_blocks.items, &v_blocks.items}) {
    const auto& first = side->front();
    const bool f32 = first.dtype() == mx::float32, f16 = first.dtype() == mx::float16;
    const bool q8 = first.dtype() == mx::uint8 && D % kernels::kQ8Block == 0 &&
                    first.ndim() == 4 &&
                    first.shape(3) == D / kernels::kQ8Block * kernels::kQ8BlockBytes;
    if (!(f32 || f16 || q8) || first.ndim() != 4 || first.shape(0) != 1 ||
        first.shape(2) != kernels::kKvBlock || ((f32 || f16) && first.shape(3) != D) ||
        first.shape(1) != k_blocks.items.front().shape(1))
      throw std::invalid_argument(
          "mlxcel attention: cache blocks must be float32 or float16 [1, kv_heads, " +
          std::to_string(kernels::kKvBlock) +
          ", D] (or uint8 q8_0 rows of D / 32 · 34 bytes), keys and values of the same heads");
    for (const auto& b : *side) {
      if (b.dtype() != first.dtype() || b.shape() != first.shape())
        throw std::invalid_argument("mlxcel attention: a side's cache blocks differ in type or shape");
    }
  }
  const int kv_heads = k_blocks.items.front().shape(1);
  if (qa.shape(1) % kv_heads != 0 || keys < qa.shape(2) ||
      static_cast<int64_t>(keys) > static_cast<int64_t>(blocks) * kernels::kKvBlock ||
      static_cast<int64_t>(keys) <= static_cast<int64_t>(blocks - 1) * kernels::kKvBlock)
    throw std::invalid_argument(
        "mlxcel attention: the kv heads must divide q's heads, and the blocks hold the keys "
        "(at least q's positions), the last one partly at least");
  if (isa > static_cast<uint8_t>(Isa::Avx512))
    throw std::invalid_argument("mlxcel attention: unknown ISA code " + std::to_string(isa));
  if (window < 0) throw std::invalid_argument("mlxcel attention: the window must be >= 0");
  if (!(softcap >= 0.0f)) throw std::invalid_argument("mlxcel attention: softcap must be >= 0");
  if (!sinks.empty() && sinks.size() != static_cast<size_t>(qa.shape(1)))
    throw std::invalid_argument("mlxcel attention: sinks must hold one logit per query head (" +
                                std::to_string(qa.shape(1)) + "), or none");
  std::vector<mx::array> inputs{qa};
  inputs.insert(inputs.end(), k_blocks.items.begin(), k_blocks.items.end());
  inputs.insert(inputs.end(), v_blocks.items.begin(), v_blocks.items.end());
  auto prim = std::make_shared<AttentionCpu>(
      mlxcel_stream(), scale, causal, window, softcap, keys, true,
      std::vector<float>(sinks.begin(), sinks.end()), static_cast<Isa>(isa),
      threads < 1 ? 1 : threads, static_cast<int>(blocks));
  return wrap(mx::array(mx::Shape{qa.shape(2), qa.shape(1) * D}, mx::float32, std::move(prim),
                        std::move(inputs)));
}

std::unique_ptr<MlxArray> split_heads(const MlxArray& qkv, const MlxArray& inv_freq, int32_t row0,
                                      int32_t n, int32_t col0, int32_t heads, int32_t dim,
                                      bool rope, int32_t offset, float scale) {
  const auto& a = qkv.inner;
  if (a.dtype() != mx::float32 || a.ndim() != 2)
    throw std::invalid_argument("mlxcel split_heads: qkv must be float32 [tokens, columns]");
  if (row0 < 0 || n < 1 || row0 + n > a.shape(0) || col0 < 0 || heads < 1 || dim < 2 ||
      dim % 2 != 0 || static_cast<int64_t>(col0) + static_cast<int64_t>(heads) * dim > a.shape(1))
    throw std::invalid_argument("mlxcel split_heads: rows or columns out of range");
  if (rope && (inv_freq.inner.dtype() != mx::float32 ||
               inv_freq.inner.size() != static_cast<size_t>(dim / 2)))
    throw std::invalid_argument("mlxcel split_heads: inv_freq must be float32 [dim / 2]");
  auto prim = std::make_shared<SplitHeadsCpu>(mlxcel_stream(), row0, n, col0, heads, dim, rope,
                                              offset, scale);
  return wrap(mx::array(mx::Shape{1, heads, n, dim}, mx::float32, std::move(prim),
                        {a, inv_freq.inner}));
}

std::unique_ptr<ArrayList> interleave_int8(const MlxArray& w, const MlxArray& scales,
                                           const MlxArray& biases, int32_t group_size,
                                           int32_t bits, bool compact, int32_t threads) {
  if (threads < 1) refuse("threads must be at least 1, got " + std::to_string(threads));
  if (bits != 4 && bits != 8) refuse("int8 weights need 4 or 8 bits, got " + std::to_string(bits));
  if (group_size != 16 && group_size != 32 && group_size != 64 && group_size != 128)
    refuse("group_size must be 16, 32, 64 or 128, got " + std::to_string(group_size));
  const auto& wa = w.inner;
  if (wa.dtype() != mx::uint32 || wa.ndim() != 2) refuse("weight must be a 2-D uint32 array");
  const int n = wa.shape(0);
  const int k = static_cast<int>(static_cast<int64_t>(wa.shape(1)) * 32 / bits);
  if (n % kernels::kInt8TileRows != 0)
    refuse("int8 weights need a multiple of " + std::to_string(kernels::kInt8TileRows) +
           " output rows, got " + std::to_string(n));
  if (k % group_size != 0 || k % 32 != 0)
    refuse("the input width is not a multiple of the group size and of 32");
  check_scales(scales.inner, biases.inner, n, k / group_size);
  // Materialized, row-contiguous copies of the inputs, read on this thread.
  std::vector<mx::array> in{mx::contiguous(wa, false, mlxcel_stream()),
                            mx::contiguous(scales.inner, false, mlxcel_stream()),
                            mx::contiguous(biases.inner, false, mlxcel_stream())};
  mx::eval(in);
  const bool half = in[1].dtype() == mx::float16;
  // The compact layouts (qmatmul.h), where every value allows them.
  const int out_bits =
      compact && bits == 8 ? kernels::compact_code_bits(in[0].data<uint32_t>(), n, k) : bits;
  auto out = std::make_unique<ArrayList>();
  out->items.emplace_back(mx::allocator::malloc(static_cast<size_t>(n) * k * out_bits / 8),
                          mx::Shape{n, k * out_bits / 32}, mx::uint32);
  // Biases that are one power of two times the scales (a symmetric format's code offset) are
  // kept as that multiple (kernels::bias_multiple), in the compact layout.
  const float multiple =
      compact ? kernels::bias_multiple(in[1].data<uint8_t>(), in[2].data<uint8_t>(), half,
                                       static_cast<int64_t>(n) * (k / group_size))
              : 0.0f;
  const bool derived = multiple != 0.0f;
  bool factored = false;
  if (compact && !half && k % kernels::kSuperBlock == 0) {
    const mx::Shape shape{n / kernels::kInt8TileRows,
                          static_cast<int>(kernels::factored_tile_bytes(k, group_size))};
    const size_t bytes = static_cast<size_t>(shape[0]) * shape[1];
    mx::array fs(mx::allocator::malloc(bytes), shape, mx::uint8);
    factored = kernels::factor_int8_scales(in[1].data<float>(), n, k, group_size,
                                           fs.data<uint8_t>(), threads);
    if (factored && derived) {
      out->items.push_back(std::move(fs));
    } else if (factored) {
      mx::array fb(mx::allocator::malloc(bytes), shape, mx::uint8);
      factored = kernels::factor_int8_scales(in[2].data<float>(), n, k, group_size,
                                             fb.data<uint8_t>(), threads);
      if (factored) {
        out->items.push_back(std::move(fs));
        out->items.push_back(std::move(fb));
      }
    }
  }
  if (!factored) {
    for (int i = 1; i < (derived ? 2 : 3); ++i)
      out->items.emplace_back(mx::allocator::malloc(in[i].nbytes()), in[i].shape(),
                              in[i].dtype());
  }
  if (derived) out->items.emplace_back(std::initializer_list<float>{multiple});
  kernels::interleave_int8(in[0].data<uint32_t>(), in[1].data<uint8_t>(), in[2].data<uint8_t>(),
                           half, n, k, group_size, bits, out_bits,
                           out->items[0].data<uint8_t>(),
                           factored ? nullptr : out->items[1].data<uint8_t>(),
                           factored || derived ? nullptr : out->items[2].data<uint8_t>(),
                           threads);
  return out;
}

std::unique_ptr<MlxArray> int8_rows(const MlxArray& ids, const MlxArray& w,
                                    const MlxArray& scales, const MlxArray& biases,
                                    int32_t group_size, int32_t bits) {
  const auto& wa = w.inner;
  if (!kernels::int8_bits_supported(bits))
    refuse("int8 rows: bits must be 4, 5, 6 or 8, got " + std::to_string(bits));
  if (group_size != 16 && group_size != 32 && group_size != 64 && group_size != 128)
    refuse("group_size must be 16, 32, 64 or 128, got " + std::to_string(group_size));
  if (wa.dtype() != mx::uint32 || wa.ndim() != 2) refuse("weight must be a 2-D uint32 array");
  if (ids.inner.dtype() != mx::uint32) refuse("int8 rows: ids must be uint32");
  const int n = wa.shape(0);
  const int k = static_cast<int>(static_cast<int64_t>(wa.shape(1)) * 32 / bits);
  if (n % kernels::kInt8TileRows != 0 || k % group_size != 0 || k % 32 != 0)
    refuse("int8 rows: not an int8-layout weight (rows a multiple of 16, whole groups)");
  check_int8_scales(scales.inner, biases.inner, n, k, group_size);
  auto shape = ids.inner.shape();
  shape.push_back(k);
  return wrap(mx::array(std::move(shape), mx::float32,
                        std::make_shared<Int8RowsCpu>(mlxcel_stream(), group_size, bits),
                        {mx::contiguous(ids.inner, false, mlxcel_stream()), wa, scales.inner,
                         biases.inner}));
}

void kernels_interleave_tile(rust::Slice<const uint32_t> codes, int32_t k, int32_t bits,
                             int32_t out_bits, rust::Slice<uint8_t> out) {
  if (!((bits == 4 && out_bits == 4) ||
        (bits == 8 && (out_bits == 5 || out_bits == 6 || out_bits == 8))))
    refuse("interleave tile: " + std::to_string(bits) + "-bit codes cannot take " +
           std::to_string(out_bits) + " bits");
  if (k <= 0 || k % kernels::kInt8Block != 0)
    refuse("interleave tile: the width must be a positive multiple of 32");
  const size_t rows = kernels::kInt8TileRows;
  if (codes.size() != rows * static_cast<size_t>(k) * bits / 32 ||
      out.size() != 2 * static_cast<size_t>(k) * out_bits)
    refuse("interleave tile: buffer sizes do not match the tile");
  // Codes only: the scales are the caller's (no scales in, none out).
  kernels::interleave_int8(codes.data(), nullptr, nullptr, false, kernels::kInt8TileRows, k,
                           kernels::kInt8Block, bits, out_bits, out.data(), nullptr, nullptr, 1);
}

bool kernels_factor_superblock(rust::Slice<const float> values, float& d,
                               rust::Slice<int8_t> c) {
  if (values.size() != c.size() || values.size() == 0 || values.size() > 16)
    refuse("factor superblock: 1 to 16 values, and as many integers");
  return kernels::factor_int8_superblock(values.data(), static_cast<int>(values.size()), &d,
                                         c.data());
}

bool kernels_has_vnni() { return kernels::has_vnni(); }

void kernels_float_to_half(rust::Slice<const float> values, rust::Slice<uint16_t> out) {
  // The caller sizes `out` as `values` (the Rust wrapper does).
  for (size_t i = 0; i < values.size() && i < out.size(); ++i) out[i] = kernels::float_to_half(values[i]);
}

uint8_t kernels_best_isa() { return static_cast<uint8_t>(kernels::best_isa()); }

int32_t kernels_available_cores() { return kernels::available_cores(); }

}  // namespace mlxcel
