// The gated delta rule's kernels for the scalar path (see delta_rule.inc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/delta_rule.h"
#include "mlxcel-core/cpp/kernels/fastmath.h"

#define MLXCEL_TARGET
#define DELTA_NAME(name) name##_scalar

namespace mlxcel::kernels {
#include "mlxcel-core/cpp/kernels/delta_rule.inc"
}  // namespace mlxcel::kernels
