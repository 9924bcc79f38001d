// The LoRA pairs of a fused decoder stack, checked (lora_plan.h).
#include "mlxcel-core/cpp/kernels/lora_plan.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "mlxcel-core/cpp/kernels/lora.h"

namespace mx = mlx::core;

namespace mlxcel {

namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("mlxcel decoder layer: LoRA: " + why);
}

}  // namespace

std::vector<LoraPlan> plan_lora_pairs(const std::vector<mx::array>& matrices,
                                      const int32_t* pairs, size_t pairs_len,
                                      const float* factors, size_t factors_len,
                                      size_t scales_len, int T,
                                      const std::function<LoraShape(int, int)>& shape_of,
                                      std::vector<mx::array>& stack) {
  const size_t count = pairs_len / 3;
  if (pairs_len % 3 != 0 || factors_len != count || matrices.size() != 2 * count)
    refuse("pairs must be (layer, target, adapter) triples, with one factor and two matrices "
           "(Aᵀ, Bᵀ) each");
  if (T < 1 || scales_len % static_cast<size_t>(T) != 0)
    refuse("the scales must be [adapters, " + std::to_string(T) + "] (one per row of x)");
  const size_t adapters = scales_len / static_cast<size_t>(T);
  std::vector<LoraPlan> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const int layer = pairs[3 * i], target = pairs[3 * i + 1], adapter = pairs[3 * i + 2];
    const std::string what = "pair " + std::to_string(i);
    if (target < 0 || target >= kernels::kLoraTargets)
      refuse(what + ": target must be 0 to 6 (q, k, v, o, gate, up, down)");
    if (adapter < 0 || static_cast<size_t>(adapter) >= adapters)
      refuse(what + ": adapter " + std::to_string(adapter) + " has no row of scales");
    if (!std::isfinite(factors[i])) refuse(what + ": its factor is not finite");
    const LoraShape shape = shape_of(layer, target);
    const mx::array& a = matrices[2 * i];
    const mx::array& b = matrices[2 * i + 1];
    const int rank = a.ndim() == 2 ? a.shape(1) : 0;
    const bool half = a.dtype() == mx::float16;
    const mx::Dtype dtype = half ? mx::float16 : mx::float32;
    if (a.dtype() != dtype || a.ndim() != 2 || a.shape(0) != shape.in || rank < 1 ||
        !a.flags().row_contiguous)
      refuse(what + ": Aᵀ must be a contiguous float32 or float16 [" + std::to_string(shape.in) +
             ", rank]");
    if (b.dtype() != dtype || b.ndim() != 2 || b.shape(0) != rank ||
        b.shape(1) != shape.out || !b.flags().row_contiguous)
      refuse(what + ": Bᵀ must be a contiguous [" + std::to_string(rank) + ", " +
             std::to_string(shape.out) + "] of Aᵀ's type");
    out.push_back(LoraPlan{layer, static_cast<int>(stack.size()), target, adapter, shape.in,
                           shape.out, rank, factors[i], half});
    stack.push_back(a);
    stack.push_back(b);
  }
  return out;
}

}  // namespace mlxcel
