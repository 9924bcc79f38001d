// The gated delta rule's kernels for the avx512 path (see delta_rule.inc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/delta_rule.h"
#include "mlxcel-core/cpp/kernels/fastmath.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512dq,fma")))
#define DELTA_NAME(name) name##_avx512

namespace mlxcel::kernels {
#include "mlxcel-core/cpp/kernels/delta_rule.inc"
}  // namespace mlxcel::kernels
