// A routed-expert MLP (a mixture of experts) as one kernel: RMSNorm, the router and its top k,
// every routed expert's gate/up and down projections over the tokens routed to it, and the
// weighted sum (and a shared expert, gated), in one dispatched task. Plain C++ with no MLX types,
// as qmatmul.h; the MLX primitive around it is moe_node.cc.
//
// The numbers are those of the per-op graph (llama/experts.rs with llama/routing.rs), operation
// for operation: the router's logits are the host's eight-way interleaved f32 dot products, the
// picks and weights the host's softmax, top k (ties to the lower expert, -0 below +0, NaN
// below every number) and renormalisation, each expert runs the same quantized matmul kernels
// over the same rows in the same order (tokens grouped by expert, experts ascending), and each
// token's outputs are scaled and summed in its route order. With int8 activations every row's
// matmul is a function of that row alone, so the two paths give the same bits; with f32 the
// matmul kernels are the same calls with the same M, so they do too.
#pragma once

#include <cstdint>
#include <vector>

#include "mlxcel-core/cpp/kernels/dispatch.h"

namespace mlxcel::kernels {

// How a token's router logits become its experts and weights (mlxcel_model::Routing).
enum class MoeRouting : uint8_t {
  // Softmax over every expert, then the top k (Qwen3-MoE without norm_topk_prob, Qwen2-MoE).
  SoftmaxTopK = 0,
  // The same, the k weights then divided by their sum (Qwen3-MoE, OLMoE's variants).
  SoftmaxTopKRenormalized = 1,
  // The top k logits, then a softmax over them (Mixtral).
  TopKSoftmax = 2,
};

// The gated activation of an expert's gate and up halves.
enum class MoeActivation : uint8_t {
  Silu = 0,      // silu(gate) · up
  GeluTanh = 1,  // gelu_tanh(gate) · up
  // gpt-oss: g · sigmoid(alpha · g) · (u + 1), g = min(gate, limit), u = clamp(up, ±limit).
  ClampedSwiglu = 2,
};

// One expert's matrices as QProblems whose x, y and M the kernel fills in: gate and up stacked
// ([2·intermediate, hidden], the activation applied to the first half, times the second) or,
// when `split`, gate_up holds the gate ([intermediate, hidden]) and `up` the up projection;
// and down ([hidden, intermediate]). With biases (gpt-oss; split only), each projection adds
// its own after its product: [intermediate], [intermediate] and [hidden] f32.
struct MoeExpert {
  QProblem gate_up, down;
  bool split = false;
  QProblem up{};
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

struct MoePlan {
  int hidden = 0, experts = 0, top_k = 0;
  MoeRouting routing = MoeRouting::SoftmaxTopK;
  MoeActivation activation = MoeActivation::Silu;
  float alpha = 0.0f, limit = 0.0f;  // the clamped SwiGLU's
  // [experts, hidden] router rows, then with a shared expert its gate's row.
  std::vector<float> router;
  // [experts] biases added to the routed experts' logits (gpt-oss), or empty: none.
  std::vector<float> router_bias;
  // The routed experts, then the shared expert if any (stacked and unbiased).
  std::vector<MoeExpert> weights;
  bool shared = false;
};

// out[T, hidden] = [x +] Σ_slots score · expert(h) [+ sigmoid(h · shared_gate) · shared(h)],
// h = rms_norm(x, norm, eps), on up to `threads` threads with the best path at or below `isa`.
// `int8x`: weights in the int8 layout multiply x quantized to int8 (else f32 x over that layout).
void routed_experts(const MoePlan& plan, const float* x, const float* norm, float eps,
                    bool residual, bool int8x, float* out, int T, Isa isa, int threads);

}  // namespace mlxcel::kernels
