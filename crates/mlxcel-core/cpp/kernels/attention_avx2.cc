// Attention for the avx2 path (see attention.inc; no STL here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"

#define MLXCEL_TARGET __attribute__((target("avx2,fma,f16c")))

namespace mlxcel::kernels {
#define ATTENTION_PART_NAME attention_part_avx2
#include "mlxcel-core/cpp/kernels/attention.inc"
}  // namespace mlxcel::kernels
