// Attention for the scalar path (see attention.inc; no STL here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"

#define MLXCEL_TARGET 

namespace mlxcel::kernels {
#define ATTENTION_PART_NAME attention_part_scalar
#include "mlxcel-core/cpp/kernels/attention.inc"
}  // namespace mlxcel::kernels
