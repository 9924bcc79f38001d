// The scalar reference for quantized matmul, and x preparation for the SIMD paths.
#include "mlxcel-core/cpp/kernels/qmatmul.h"

namespace mlxcel::kernels {

static inline uint32_t quant_at(const uint32_t* row, int k, int bits) {
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  return (row[k / per_word] >> ((k % per_word) * bits)) & mask;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline float scale_at(const QProblem& p, const void* a, int64_t i) {
  return p.half ? half_to_float(static_cast<const uint16_t*>(a)[i])
                : static_cast<const float*>(a)[i];
}

void scalar_rows(const QProblem& p, int m0, int m1, int n0, int n1) {
  const int groups = p.K / p.group_size;
  const int words = p.K * p.bits / 32;
  for (int m = m0; m < m1; ++m) {
    const float* x = p.x + static_cast<int64_t>(m) * p.K;
    for (int n = n0; n < n1; ++n) {
      const uint32_t* w = p.w + static_cast<int64_t>(n) * words;
      const int64_t row = static_cast<int64_t>(n) * groups;
      float acc = 0.0f;
      for (int k = 0; k < p.K; ++k) {
        const int g = k / p.group_size;
        const float weight = scale_at(p, p.scales, row + g) *
                                 static_cast<float>(quant_at(w, k, p.bits)) +
                             scale_at(p, p.biases, row + g);
        acc += weight * x[k];
      }
      p.y[static_cast<int64_t>(m) * p.N + n] = acc;
    }
  }
}

void prepare_x(const QProblem& p, float* xprep, float* sums) {
  const int groups = p.K / p.group_size;
  for (int m = 0; m < p.M; ++m) {
    const float* x = p.x + static_cast<int64_t>(m) * p.K;
    float* out = xprep + static_cast<int64_t>(m) * p.K;
    if (p.bits == 4) {
      for (int c = 0; c < p.K; c += 32) {
        for (int j = 0; j < 16; ++j) {
          out[c + j] = x[c + 2 * j];
          out[c + 16 + j] = x[c + 2 * j + 1];
        }
      }
    } else {
      for (int k = 0; k < p.K; ++k) out[k] = x[k];
    }
    for (int g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) s += x[k];
      sums[m * groups + g] = s;
    }
  }
}

}  // namespace mlxcel::kernels
