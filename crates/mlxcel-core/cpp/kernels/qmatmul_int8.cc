// The int8-activation path of the quantized matmul: the weight interleaving, the quantization of
// x, and the scalar reference (qmatmul.h states the exact computation every path performs).
#include <cmath>
#include <cstring>
#include <utility>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

namespace mlxcel::kernels {
namespace {

uint32_t quant_at(const uint32_t* row, int k, int bits) {
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  return (row[k / per_word] >> ((k % per_word) * bits)) & mask;
}

float scale_at(const void* a, bool half, int64_t i) {
  return half ? half_to_float(static_cast<const uint16_t*>(a)[i])
              : static_cast<const float*>(a)[i];
}

}  // namespace

void interleave_int8(const uint32_t* w, const void* scales, const void* biases, bool half, int N,
                     int K, int group_size, int bits, uint8_t* w_out, void* scales_out,
                     void* biases_out) {
  const int words = K * bits / 32;
  const int64_t tile_bytes = static_cast<int64_t>(2) * K * bits;
  const int per_chunk = bits == 4 ? 8 : 4;  // values of K per 64-byte chunk
  for (int t = 0; t < N / kInt8TileRows; ++t) {
    uint8_t* tile = w_out + t * tile_bytes;
    for (int c = 0; c < K / per_chunk; ++c) {
      uint8_t* chunk = tile + static_cast<int64_t>(c) * 64;
      for (int j = 0; j < kInt8TileRows; ++j) {
        const uint32_t* row = w + static_cast<int64_t>(t * kInt8TileRows + j) * words;
        const int k = c * per_chunk;
        for (int b = 0; b < 4; ++b) {
          chunk[4 * j + b] =
              bits == 4 ? static_cast<uint8_t>(quant_at(row, k + b, 4) |
                                               (quant_at(row, k + 4 + b, 4) << 4))
                        : static_cast<uint8_t>(quant_at(row, k + b, 8));
        }
      }
    }
  }
  const int groups = K / group_size;
  const size_t element = half ? 2 : 4;
  for (const auto& [from, to] : {std::pair{scales, scales_out}, std::pair{biases, biases_out}}) {
    const auto* src = static_cast<const uint8_t*>(from);
    auto* dst = static_cast<uint8_t*>(to);
    for (int n = 0; n < N; ++n) {
      const int t = n / kInt8TileRows, j = n % kInt8TileRows;
      for (int g = 0; g < groups; ++g) {
        std::memcpy(dst + ((static_cast<int64_t>(t) * groups + g) * kInt8TileRows + j) * element,
                    src + (static_cast<int64_t>(n) * groups + g) * element, element);
      }
    }
  }
}

void quantize_x_int8(const float* x, int M, int K, int8_t* xq, float* dx, float* sx, float* sh) {
  const int blocks = K / kInt8Block;
  for (int m = 0; m < int8_rows(M); ++m) {
    for (int j = 0; j < blocks; ++j) {
      const int64_t b = int8_block_index(m, j, K);
      if (m >= M) {
        for (int i = 0; i < kInt8Block; ++i) xq[int8_x_index(m, j * kInt8Block + i, K)] = 0;
        dx[b] = sx[b] = sh[2 * b] = sh[2 * b + 1] = 0.0f;
        continue;
      }
      const float* v = x + static_cast<int64_t>(m) * K + j * kInt8Block;
      for (int h = 0; h < 2; ++h) {
        float u[8];
        for (int i = 0; i < 8; ++i) u[i] = v[16 * h + i] + v[16 * h + i + 8];
        for (int width = 4; width >= 1; width /= 2)
          for (int i = 0; i < width; ++i) u[i] = u[i] + u[i + width];
        sh[2 * b + h] = u[0];
      }
      float amax = 0.0f;
      for (int i = 0; i < kInt8Block; ++i) amax = std::fmax(amax, std::fabs(v[i]));
      float t[16];
      for (int i = 0; i < 16; ++i) t[i] = v[i] + v[i + 16];
      for (int width = 8; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
      const float sum = t[0];
      // A non-finite block gets a NaN step and zero codes: the output turns NaN, as the f32
      // path's would.
      const bool finite = std::isfinite(amax) && !std::isnan(sum);
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int i = 0; i < kInt8Block; ++i) {
        // Round to nearest even, as nearbyint does in the default mode, without a libm call:
        // |v·inv| <= 127 < 2^22, where adding and removing 1.5·2^23 rounds to an integer.
        const float r = (v[i] * inv + 12582912.0f) - 12582912.0f;
        xq[int8_x_index(m, j * kInt8Block + i, K)] =
            static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
      }
      dx[b] = finite ? amax / 127.0f : NAN;
      sx[b] = sum;
    }
  }
}

void int8_scalar(const QProblem& p, const int8_t* xq, const float* dx, const float* sx,
                 const float* sh, int m0, int m1, int t0, int t1) {
  const int groups = p.K / p.group_size, blocks = p.K / kInt8Block;
  // The interleaved layout read back as (row, k): the inverse of interleave_int8.
  const auto* w = reinterpret_cast<const uint8_t*>(p.w);
  const int per_chunk = p.bits == 4 ? 8 : 4;
  const int64_t tile_bytes = static_cast<int64_t>(2) * p.K * p.bits;
  auto q = [&](int n, int k) -> int32_t {
    const int t = n / kInt8TileRows, j = n % kInt8TileRows, c = k / per_chunk;
    const int within = k % per_chunk;
    const uint8_t byte = w[t * tile_bytes + static_cast<int64_t>(c) * 64 + 4 * j + within % 4];
    if (p.bits == 8) return byte;
    return within < 4 ? (byte & 0x0F) : (byte >> 4);
  };
  for (int m = m0; m < m1; ++m) {
    for (int n = t0 * kInt8TileRows; n < t1 * kInt8TileRows; ++n) {
      const int t = n / kInt8TileRows, j = n % kInt8TileRows;
      float acc = 0.0f;
      // Groups of 16: two parts per block, each with its own sum, group and Σx (qmatmul.h).
      const int parts = p.group_size == 16 ? 2 : 1;
      const int part_len = kInt8Block / parts;
      for (int b = 0; b < blocks; ++b) {
        const int64_t xb = int8_block_index(m, b, p.K);
        for (int h = 0; h < parts; ++h) {
          int32_t dot = 0;
          for (int i = h * part_len; i < (h + 1) * part_len; ++i) {
            const int k = b * kInt8Block + i;
            dot += q(n, k) * xq[int8_x_index(m, k, p.K)];
          }
          const int g = (b * kInt8Block + h * part_len) / p.group_size;
          const int64_t at = (static_cast<int64_t>(t) * groups + g) * kInt8TileRows + j;
          const float scale = scale_at(p.scales, p.half, at);
          const float bias = scale_at(p.biases, p.half, at);
          acc = std::fma(static_cast<float>(dot), scale * dx[xb], acc);
          acc = std::fma(bias, parts == 2 ? sh[2 * xb + h] : sx[xb], acc);
        }
      }
      p.y[static_cast<int64_t>(m) * p.N + n] = acc;
    }
  }
}

}  // namespace mlxcel::kernels
