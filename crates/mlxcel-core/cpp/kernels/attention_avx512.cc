// Attention for the avx512 path (see attention.inc; no STL here, as in qmatmul_avx512.cc).
#include <cstdint>

#include "mlxcel-core/cpp/kernels/attention.h"

#define MLXCEL_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace mlxcel::kernels {
#define ATTENTION_NAME attention_rows_avx512
#include "mlxcel-core/cpp/kernels/attention.inc"
}  // namespace mlxcel::kernels
