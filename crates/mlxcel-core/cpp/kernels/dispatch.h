// Which instruction set a kernel may use, and the entry points that choose by it.
#pragma once

#include <cstdint>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

namespace mlxcel::kernels {

// Ordered: a request for a path the CPU lacks falls back to the best one below it.
enum class Isa : uint8_t { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// The best path this CPU supports (cached after the first call).
Isa best_isa();

// y = x · Wᵀ on up to `threads` threads with the best path at or below `isa`.
void qmatmul(const QProblem& p, Isa isa, int threads);

}  // namespace mlxcel::kernels
