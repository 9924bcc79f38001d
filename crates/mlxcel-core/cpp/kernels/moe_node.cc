// The routed-expert MLP kernel (moe.h) as an MLX primitive: a layer's experts are checked once at
// load into a plan (routed_experts_new), and each step's MoE block is one node over x and the
// norm weight (native_routed_experts). The node reads no router output on the host and adds
// ~40 ops' worth of graph nodes fewer per layer than the per-op graph (llama/experts.rs).
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"
#include "mlxcel-core/cpp/bridge.h"
#include "mlxcel-core/cpp/kernels/moe.h"

namespace mx = mlx::core;

namespace mlxcel {

std::unique_ptr<MlxArray> wrap(mx::array a);

struct RoutedExpertsPlan {
  kernels::MoePlan kernel;
  // The matrices the plan's pointers read, kept alive (and unchanged: weights are never
  // written after load).
  std::vector<mx::array> arrays;
};

namespace {

using kernels::Isa;

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("mlxcel routed experts: " + why);
}

// One matrix ([n, k] values) checked and described as a QProblem's weight half, as the
// quantized-matmul primitive reads it.
kernels::QProblem matrix(const std::vector<mx::array>& in, size_t first, int n, int k,
                         int32_t group, int32_t bits, int32_t int8, const std::string& what) {
  if (int8 < 0 || int8 > 1) refuse(what + ": the int8 layout flag must be 0 or 1");
  if (bits != 4 && bits != 8 && !(int8 != 0 && (bits == 5 || bits == 6)))
    refuse(what + ": bits must be 4 or 8 (5 or 6 in the int8 layout)");
  if (group != 16 && group != 32 && group != 64 && group != 128)
    refuse(what + ": group size must be 16, 32, 64 or 128");
  if (k % group != 0 || k % 32 != 0)
    refuse(what + ": input width is not a multiple of the group and of 32");
  const auto& w = in[first];
  const auto& scales = in[first + 1];
  const auto& biases = in[first + 2];
  if (w.dtype() != mx::uint32 || w.ndim() != 2 || w.shape(0) != n ||
      static_cast<int64_t>(w.shape(1)) * 32 / bits != k)
    refuse(what + ": weight must be uint32 [" + std::to_string(n) + ", " +
           std::to_string(k * bits / 32) + "]");
  for (const auto* a : {&w, &scales, &biases})
    if (!a->flags().row_contiguous) refuse(what + ": every array must be row-contiguous");
  // (the derived-bias placeholder: [m], or [m, 1] for 4-bit E2M1 indices; kernels/qmatmul.h)
  const bool derived = int8 != 0 && biases.dtype() == mx::float32 && biases.ndim() == 1 &&
                       (biases.shape(0) == 1 || biases.shape(0) == 2);
  const bool factored = int8 != 0 && scales.dtype() == mx::uint8;
  if (factored) {
    const mx::Shape shape{n / kernels::kInt8TileRows,
                          static_cast<int>(kernels::factored_tile_bytes(k, group))};
    if (k % kernels::kSuperBlock != 0 || scales.shape() != shape ||
        (!derived && (biases.dtype() != mx::uint8 || biases.shape() != shape)))
      refuse(what + ": factored scales and biases must be uint8 [" + std::to_string(shape[0]) +
             ", " + std::to_string(shape[1]) + "]");
  } else {
    const mx::Shape groups{n, k / group};
    if ((scales.dtype() != mx::float32 && scales.dtype() != mx::float16) ||
        scales.shape() != groups ||
        (!derived && (biases.dtype() != scales.dtype() || biases.shape() != groups)))
      refuse(what + ": scales and biases must both be float32 or both float16 [" +
             std::to_string(n) + ", " + std::to_string(k / group) + "]");
  }
  if (int8 != 0 && n % kernels::kInt8TileRows != 0)
    refuse(what + ": int8 weights need a multiple of " +
           std::to_string(kernels::kInt8TileRows) + " output rows");
  kernels::QProblem p{};
  p.N = n;
  p.K = k;
  p.group_size = group;
  p.bits = bits;
  p.int8 = int8 != 0;
  p.w = w.data<uint32_t>();
  p.half = scales.dtype() == mx::float16;
  p.factored = factored;
  p.scales = scales.data<uint8_t>();
  p.biases = biases.data<uint8_t>();
  p.bias_scale = derived ? biases.data<float>()[0] : 0.0f;
  p.e2m1 = derived && biases.shape(0) == 2 && bits == 4;
  return p;
}

class RoutedExpertsCpu : public mx::UnaryPrimitive {
 public:
  RoutedExpertsCpu(mx::Stream stream, std::shared_ptr<const RoutedExpertsPlan> plan, float eps,
                   bool residual, bool int8x, Isa isa, int threads)
      : mx::UnaryPrimitive(stream),
        plan_(std::move(plan)),
        eps_(eps),
        residual_(residual),
        int8x_(int8x),
        isa_(isa),
        threads_(threads) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& norm = inputs[1];
    if (!x.flags().row_contiguous || !norm.flags().row_contiguous)
      throw std::runtime_error("mlxcel routed experts: x and the norm must be row-contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(norm);
    encoder.set_output_array(out);
    encoder.dispatch([plan = plan_, x = x.data<float>(), norm = norm.data<float>(),
                      y = out.data<float>(), T = static_cast<int>(x.shape(0)), eps = eps_,
                      residual = residual_, int8x = int8x_, isa = isa_, threads = threads_]() {
      kernels::routed_experts(plan->kernel, x, norm, eps, residual, int8x, y, T, isa, threads);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxcel routed experts have no GPU implementation");
  }

  const char* name() const override { return "MlxcelRoutedExperts"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RoutedExpertsCpu&>(other);
    return plan_ == o.plan_ && eps_ == o.eps_ && residual_ == o.residual_ &&
           int8x_ == o.int8x_ && isa_ == o.isa_ && threads_ == o.threads_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  std::shared_ptr<const RoutedExpertsPlan> plan_;
  float eps_;
  bool residual_, int8x_;
  Isa isa_;
  int threads_;
};

}  // namespace

std::unique_ptr<RoutedExperts> routed_experts_new(const ArrayList& matrices,
                                                  rust::Slice<const int32_t> quant,
                                                  const ArrayList& biases,
                                                  rust::Slice<const float> router,
                                                  rust::Slice<const float> router_bias,
                                                  int32_t hidden, int32_t experts, int32_t top_k,
                                                  uint8_t routing, uint8_t activation,
                                                  float alpha, float limit, bool shared,
                                                  bool split) {
  if (hidden < 32 || experts < 1 || top_k < 1 || top_k > experts)
    refuse("need hidden >= 32 and 1 <= top_k <= experts");
  if (routing > static_cast<uint8_t>(kernels::MoeRouting::TopKSoftmax))
    refuse("unknown routing code " + std::to_string(routing));
  if (activation > static_cast<uint8_t>(kernels::MoeActivation::ClampedSwiglu))
    refuse("unknown activation code " + std::to_string(activation));
  const auto act = static_cast<kernels::MoeActivation>(activation);
  if (act == kernels::MoeActivation::ClampedSwiglu && (shared || !(limit > 0.0f)))
    refuse("the clamped SwiGLU needs a limit > 0 and no shared expert");
  const size_t count = static_cast<size_t>(experts) + (shared ? 1 : 0);
  // Per routed expert: gate/up then down (3 arrays each), or gate, up, down when split; the
  // shared expert stacked.
  const size_t per = split ? 9 : 6;
  const size_t expected = per * experts + (shared ? 6 : 0);
  if (matrices.items.size() != expected || quant.size() != expected)
    refuse("expected " + std::to_string(per) + " arrays and quant values per routed expert (" +
           (split ? "gate, up, down" : "gate/up, down") +
           ") and 6 for a shared expert (gate/up, down)");
  const bool biased = !biases.items.empty();
  if (biased && (!split || biases.items.size() != 3 * static_cast<size_t>(experts)))
    refuse("biases must be, per routed expert, its gate's, up's and down's (split experts only)");
  // The router's rows: the experts', then the shared gate's.
  const size_t rows = count;
  if (router.size() != rows * static_cast<size_t>(hidden))
    refuse("the router must hold " + std::to_string(rows) + " rows of " +
           std::to_string(hidden));
  if (!router_bias.empty() && router_bias.size() != static_cast<size_t>(experts))
    refuse("the router's bias must hold one value per routed expert");
  auto plan = std::make_shared<RoutedExpertsPlan>();
  plan->arrays = matrices.items;
  plan->arrays.insert(plan->arrays.end(), biases.items.begin(), biases.items.end());
  mx::eval(plan->arrays);
  auto& k = plan->kernel;
  k.hidden = hidden;
  k.experts = experts;
  k.top_k = top_k;
  k.routing = static_cast<kernels::MoeRouting>(routing);
  k.activation = act;
  k.alpha = alpha;
  k.limit = limit;
  k.shared = shared;
  k.router.assign(router.begin(), router.end());
  k.router_bias.assign(router_bias.begin(), router_bias.end());
  auto bias = [&](size_t index, int n, const std::string& what) {
    const auto& b = plan->arrays[expected + index];
    if (b.dtype() != mx::float32 || b.ndim() != 1 || b.shape(0) != n || !b.flags().row_contiguous)
      refuse(what + " must be float32 [" + std::to_string(n) + "]");
    return b.data<float>();
  };
  int inter = 0;
  for (size_t e = 0; e < count; ++e) {
    const bool routed = e < static_cast<size_t>(experts);
    const std::string what = routed ? "expert " + std::to_string(e) : std::string("the shared expert");
    const bool split_e = split && routed;
    const size_t first = routed ? per * e : per * experts;
    const int32_t* q = quant.data() + first;
    const auto& gu = plan->arrays[first];
    kernels::MoeExpert m;
    m.split = split_e;
    int n;
    if (split_e) {
      if (gu.ndim() != 2) refuse(what + ": gate must be 2-D");
      n = gu.shape(0);
      m.gate_up = matrix(plan->arrays, first, n, hidden, q[0], q[1], q[2], what + " gate");
      m.up = matrix(plan->arrays, first + 3, n, hidden, q[3], q[4], q[5], what + " up");
      m.down = matrix(plan->arrays, first + 6, hidden, n, q[6], q[7], q[8], what + " down");
      if (biased) {
        m.gate_bias = bias(3 * e, n, what + " gate bias");
        m.up_bias = bias(3 * e + 1, n, what + " up bias");
        m.down_bias = bias(3 * e + 2, hidden, what + " down bias");
      }
    } else {
      if (gu.ndim() != 2 || gu.shape(0) % 2 != 0) refuse(what + ": gate/up must have 2·n rows");
      n = gu.shape(0) / 2;
      m.gate_up = matrix(plan->arrays, first, 2 * n, hidden, q[0], q[1], q[2], what + " gate/up");
      m.down = matrix(plan->arrays, first + 3, hidden, n, q[3], q[4], q[5], what + " down");
    }
    if (e == 0) inter = n;
    if (routed && n != inter)
      refuse(what + ": every routed expert must have the same intermediate size");
    k.weights.push_back(m);
  }
  auto out = std::make_unique<RoutedExperts>();
  out->plan = std::move(plan);
  return out;
}

std::unique_ptr<ExpertsList> experts_list_new() { return std::make_unique<ExpertsList>(); }

void experts_list_push(ExpertsList& list, const RoutedExperts& experts) {
  list.items.push_back(experts.plan);
}

const kernels::MoePlan& routed_experts_kernel_plan(const RoutedExpertsPlan& plan) {
  return plan.kernel;
}

std::unique_ptr<MlxArray> native_routed_experts(const MlxArray& x, const MlxArray& norm,
                                                const RoutedExperts& experts, float eps,
                                                bool residual, bool int8x, uint8_t isa,
                                                int32_t threads) {
  if (isa > static_cast<uint8_t>(Isa::Avx512)) refuse("unknown ISA code " + std::to_string(isa));
  const auto& xa = x.inner;
  const int hidden = experts.plan->kernel.hidden;
  if (xa.dtype() != mx::float32 || xa.ndim() != 2 || xa.shape(1) != hidden)
    refuse("x must be float32 [tokens, " + std::to_string(hidden) + "]");
  const auto& na = norm.inner;
  if (na.dtype() != mx::float32 || na.ndim() != 1 || na.shape(0) != hidden)
    refuse("the norm must be float32 [" + std::to_string(hidden) + "]");
  auto prim = std::make_shared<RoutedExpertsCpu>(mlxcel_stream(), experts.plan, eps, residual,
                                                 int8x, static_cast<Isa>(isa),
                                                 threads < 1 ? 1 : threads);
  auto shape = xa.shape();
  return wrap(mx::array(std::move(shape), mx::float32, std::move(prim), {xa, na}));
}

}  // namespace mlxcel
