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

// The most problems qmatmul_shared_x takes at once.
constexpr int kMaxSharedX = 4;

// qmatmul of each of `count` (at most kMaxSharedX) problems that share x (the same x, M and K:
// a layer's q, k and v when their layouts differ). Each output is the number qmatmul gives; on
// the int8 path x is quantized once for all of them and their tiles are shared out in one
// parallel region instead of one region (and one quantization) per problem.
void qmatmul_shared_x(const QProblem* ps, int count, Isa isa, int threads);

}  // namespace mlxcel::kernels
