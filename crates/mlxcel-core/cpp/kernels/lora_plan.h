// The LoRA pairs of a fused decoder stack (layer.cc), checked: their matrices become inputs of
// the node, and each pair is handed to its layer (kernels/lora.h runs them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "mlx/array.h"

namespace mlxcel {

// A projection's input and output widths.
struct LoraShape {
  int in, out;
};

// One checked pair: its layer, the node's input index of Aᵀ (Bᵀ follows it), its target
// (kernels::LoraTarget), its adapter (the row of the step's scales), shape and alpha / rank.
struct LoraPlan {
  int layer, input, target, adapter, in, out, rank;
  float factor;
  bool half;  // the pair is float16 (else float32)
};

// `pairs`: (layer, target, adapter) per pair; `matrices`: per pair Aᵀ [in, rank] and Bᵀ
// [rank, out], both float32 or both float16, contiguous; `factors`: per pair alpha / rank; `scales` floats: each
// adapter's scale per row of x ([adapters, T]). `shape_of(layer, target)` gives the projection's
// widths or throws. Appends the matrices to `stack` (the node's inputs). Throws
// std::invalid_argument naming what is wrong.
std::vector<LoraPlan> plan_lora_pairs(const std::vector<mlx::core::array>& matrices,
                                      const int32_t* pairs, size_t pairs_len,
                                      const float* factors, size_t factors_len,
                                      size_t scales_len, int T,
                                      const std::function<LoraShape(int, int)>& shape_of,
                                      std::vector<mlx::core::array>& stack);

}  // namespace mlxcel
