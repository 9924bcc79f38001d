// The int8-activation path of the quantized matmul: the weight interleaving, the quantization of
// x, and the scalar reference (qmatmul.h states the exact computation every path performs).
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "mlxcel-core/cpp/kernels/pool.h"
#include "mlxcel-core/cpp/kernels/qmatmul.h"

namespace mlxcel::kernels {
namespace {

float scale_at(const void* a, bool half, int64_t i) {
  return half ? half_to_float(static_cast<const uint16_t*>(a)[i])
              : static_cast<const float*>(a)[i];
}

}  // namespace

int compact_code_bits(const uint32_t* w, int N, int K) {
  uint32_t any = 0;  // the OR of every code: its highest bit bounds them all
  const int64_t words = static_cast<int64_t>(N) * K / 4;
  for (int64_t i = 0; i < words; ++i) any |= w[i];
  any = (any | (any >> 8) | (any >> 16) | (any >> 24)) & 0xFFu;
  return any < 32 ? 5 : any < 64 ? 6 : 8;
}

namespace {

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// One superblock's `count` values as d · c[g] (f32 product) with c in [−128, 127]: the stored
// values bit for bit, or false.
bool factor_superblock(const float* v, int count, float* d_out, int8_t* c_out) {
  int top = 0;
  for (int g = 0; g < count; ++g) {
    if (!std::isfinite(v[g])) return false;
    if (std::fabs(v[g]) > std::fabs(v[top])) top = g;
  }
  auto fits = [&](float d) {
    if (!std::isfinite(d)) return false;
    for (int g = 0; g < count; ++g) {
      const float r = std::nearbyint(v[g] / d);
      if (!(r >= -128.0f && r <= 127.0f)) return false;
      // The kernels multiply by the integer converted back (a −0 quotient becomes +0).
      const auto c = static_cast<int8_t>(r);
      if (!same_bits(d * static_cast<float>(c), v[g])) return false;
      c_out[g] = c;
    }
    *d_out = d;
    return true;
  };
  if (v[top] == 0.0f) return fits(1.0f) || fits(-1.0f);  // all zeros: d's sign gives theirs
  // The largest value's multiplier: K-quants' sub-scales are 6-bit (largest 63) or 8-bit signed
  // (largest magnitude 128, or 127); then every other one.
  static const int kFirst[] = {63, -128, 127, -127, -63};
  auto try_multiplier = [&](int c) {
    if (c == 0) return false;
    const float d = v[top] / static_cast<float>(c);
    return fits(d) || fits(std::nextafter(d, INFINITY)) || fits(std::nextafter(d, -INFINITY));
  };
  for (int c : kFirst)
    if (try_multiplier(c)) return true;
  for (int c = 126; c >= -127; --c) {
    bool tried = false;
    for (int f : kFirst) tried = tried || f == c;
    if (!tried && try_multiplier(c)) return true;
  }
  return false;
}

}  // namespace

bool factor_int8_superblock(const float* v, int count, float* d, int8_t* c) {
  return factor_superblock(v, count, d, c);
}

bool factor_int8_scales(const float* values, int N, int K, int group_size, uint8_t* out,
                        int threads) {
  if (K % kSuperBlock != 0 || kSuperBlock % group_size != 0) return false;
  const int groups = K / group_size, per = kSuperBlock / group_size;
  const int64_t sb_bytes = factored_superblock_bytes(group_size);
  std::atomic<bool> all{true};
  parallel_for(threads, N / kInt8TileRows, [&](int t) {
    float d;
    int8_t c[kSuperBlock / 16];
    for (int j = 0; j < kInt8TileRows && all.load(std::memory_order_relaxed); ++j) {
      const int64_t n = static_cast<int64_t>(t) * kInt8TileRows + j;
      for (int s = 0; s < K / kSuperBlock; ++s) {
        if (!factor_superblock(values + n * groups + s * per, per, &d, c)) {
          all.store(false, std::memory_order_relaxed);
          return;
        }
        uint8_t* base = out + (static_cast<int64_t>(t) * (K / kSuperBlock) + s) * sb_bytes;
        std::memcpy(base + 4 * j, &d, 4);
        for (int g = 0; g < per; ++g)
          base[4 * kInt8TileRows + g * kInt8TileRows + j] = static_cast<uint8_t>(c[g]);
      }
    }
  });
  return all.load();
}

namespace {

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void store32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Four nibbles (bits 0-15) into the low nibbles of four bytes.
uint32_t spread_nibbles(uint32_t x) {
  x = (x | (x << 8)) & 0x00FF00FFu;
  return (x | (x << 4)) & 0x0F0F0F0Fu;
}

// Bytes 0-3 of v, and bytes 4-7, as 32-bit words.
uint32_t lo32(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t hi32(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

// One row's (j's) share of one tile: every 4-byte slot of the row written once, as words built
// from eight codes at a time (byte b of a 4-bit chunk word holds values k + b and k + 4 + b,
// both nibbles of one 32-bit input word; the compact layouts' words are built the same way from
// the 8-bit codes' low nibbles and high bits: qmatmul.h).
void interleave_row(const uint32_t* row, int K, int bits, int out_bits, int j, uint8_t* tile) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(row);
  if (bits == 4) {
    for (int c = 0; c < K / 8; ++c) {
      const uint32_t w = row[c];
      store32(tile + static_cast<int64_t>(c) * 64 + 4 * j,
              spread_nibbles(w & 0xFFFFu) | (spread_nibbles(w >> 16) << 4));
    }
  } else if (out_bits == 8) {
    for (int c = 0; c < K / 4; ++c)
      std::memcpy(tile + static_cast<int64_t>(c) * 64 + 4 * j, bytes + 4 * c, 4);
  } else {
    constexpr uint64_t kLow = 0x0F0F0F0F0F0F0F0Full;
    for (int blk = 0; blk < K / kInt8Block; ++blk) {
      const uint8_t* codes = bytes + static_cast<int64_t>(blk) * kInt8Block;
      uint8_t* block = tile + static_cast<int64_t>(blk) * 64 * out_bits;
      uint64_t v[4];
      for (int q = 0; q < 4; ++q) v[q] = load64(codes + 8 * q);
      for (int q = 0; q < 4; ++q) {
        const uint64_t low = v[q] & kLow;
        store32(block + q * 64 + 4 * j, lo32(low) | (hi32(low) << 4));
      }
      if (out_bits == 6) {
        // Chunk e: values 16e + 4i + b in bits 2i, 2i + 1 of byte b.
        for (int e = 0; e < 2; ++e) {
          const uint64_t h0 = (v[2 * e] >> 4) & 0x0303030303030303ull;
          const uint64_t h1 = (v[2 * e + 1] >> 4) & 0x0303030303030303ull;
          store32(block + 256 + e * 64 + 4 * j,
                  lo32(h0) | (hi32(h0) << 2) | (lo32(h1) << 4) | (hi32(h1) << 6));
        }
      } else {
        // One chunk: value 4i + b in bit i of byte b.
        uint32_t word = 0;
        for (int q = 0; q < 4; ++q) {
          const uint64_t h = (v[q] >> 4) & 0x0101010101010101ull;
          word |= (lo32(h) << (2 * q)) | (hi32(h) << (2 * q + 1));
        }
        store32(block + 256 + 4 * j, word);
      }
    }
  }
}

}  // namespace

void interleave_int8(const uint32_t* w, const void* scales, const void* biases, bool half, int N,
                     int K, int group_size, int bits, int out_bits, uint8_t* w_out,
                     void* scales_out, void* biases_out, int threads) {
  const int words = K * bits / 32;
  const int64_t tile_bytes = static_cast<int64_t>(2) * K * out_bits;
  const int groups = K / group_size;
  const size_t element = half ? 2 : 4;
  // Tile by tile (each tile's bytes are written by one thread, every byte once).
  parallel_for(threads, N / kInt8TileRows, [&](int t) {
    uint8_t* tile = w_out + t * tile_bytes;
    for (int j = 0; j < kInt8TileRows; ++j)
      interleave_row(w + static_cast<int64_t>(t * kInt8TileRows + j) * words, K, bits, out_bits,
                     j, tile);
    for (const auto& [from, to] :
         {std::pair{scales, scales_out}, std::pair{biases, biases_out}}) {
      if (to == nullptr) continue;
      const auto* src = static_cast<const uint8_t*>(from);
      auto* dst = static_cast<uint8_t*>(to);
      for (int j = 0; j < kInt8TileRows; ++j) {
        const int64_t n = static_cast<int64_t>(t) * kInt8TileRows + j;
        for (int g = 0; g < groups; ++g)
          std::memcpy(dst + ((static_cast<int64_t>(t) * groups + g) * kInt8TileRows + j) * element,
                      src + (n * groups + g) * element, element);
      }
    }
  });
}

namespace {

// v · inv rounded to nearest even, as nearbyint does in the default mode, without a libm call:
// |v·inv| <= 127 < 2^22, where adding and removing 1.5·2^23 rounds to an integer.
int8_t int8_code_of(float v, float inv) {
  const float r = (v * inv + 12582912.0f) - 12582912.0f;
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

}  // namespace

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
      float amax = 0.0f;
      for (int i = 0; i < kInt8Block; ++i) amax = std::fmax(amax, std::fabs(v[i]));
      float t[16];
      for (int i = 0; i < 16; ++i) t[i] = v[i] + v[i + 16];
      for (int width = 8; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
      // A non-finite block (the sum finds a NaN that fmax skips) gets a NaN step and zero
      // codes: the output turns NaN, as the f32 path's would.
      const bool finite = std::isfinite(amax) && !std::isnan(t[0]);
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t half_sums[2] = {0, 0};
      for (int i = 0; i < kInt8Block; ++i) {
        const int8_t code = int8_code_of(v[i], inv);
        xq[int8_x_index(m, j * kInt8Block + i, K)] = code;
        half_sums[i / 16] += code;
      }
      const float step = finite ? amax / 127.0f : NAN;
      dx[b] = step;
      // The sums the weights' biases multiply are the quantized x's (step · Σ codes, exact
      // integers times the step), not x's own: then a block's result is the dot product of the
      // stored weights with the quantized x, as llama.cpp's q8_1 sums make it. With x's own sum
      // the rounding errors of x were multiplied by the weights' codes measured from the bias
      // (0..255 for an 8-bit code), not from zero: int8 perplexity was 1.4-1.8% above f32.
      sh[2 * b] = step * static_cast<float>(half_sums[0]);
      sh[2 * b + 1] = step * static_cast<float>(half_sums[1]);
      sx[b] = step * static_cast<float>(half_sums[0] + half_sums[1]);
    }
  }
}

void quantize_x_int8_sb(const float* x, int M, int K, int8_t* xq, float* dx, int16_t* sums) {
  for (int m = 0; m < int8_rows(M); ++m) {
    for (int s = 0; s < K / kSuperBlock; ++s) {
      const int64_t b = int8_sb_index(m, s, K);
      int16_t* bs = sums + kInt8SbSums * b;
      for (int i = 0; i < kInt8SbSums; ++i) bs[i] = 0;
      if (m >= M) {
        for (int i = 0; i < kSuperBlock; ++i) xq[int8_x_index(m, s * kSuperBlock + i, K)] = 0;
        dx[b] = 0.0f;
        continue;
      }
      const float* v = x + static_cast<int64_t>(m) * K + s * kSuperBlock;
      float amax = 0.0f;
      bool nan = false;
      for (int i = 0; i < kSuperBlock; ++i) {
        amax = std::fmax(amax, std::fabs(v[i]));
        nan = nan || std::isnan(v[i]);
      }
      const bool finite = std::isfinite(amax) && !nan;
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int i = 0; i < kSuperBlock; ++i) {
        const int8_t code = int8_code_of(v[i], inv);
        xq[int8_x_index(m, s * kSuperBlock + i, K)] = code;
        bs[i / 16] = static_cast<int16_t>(bs[i / 16] + code);
        bs[16 + i / 32] = static_cast<int16_t>(bs[16 + i / 32] + code);
      }
      dx[b] = finite ? amax / 127.0f : NAN;
    }
  }
}

int32_t int8_code(const QProblem& p, int n, int k) {
  const auto* w = reinterpret_cast<const uint8_t*>(p.w);
  const int t = n / kInt8TileRows, j = n % kInt8TileRows;
  const uint8_t* tile = w + t * (static_cast<int64_t>(2) * p.K * p.bits);
  if (p.bits == 5 || p.bits == 6) {
    const uint8_t* block = tile + static_cast<int64_t>(k / kInt8Block) * 64 * p.bits;
    const int i = k % kInt8Block, within = i % 8;
    const int low = (block[(i / 8) * 64 + 4 * j + within % 4] >> (within < 4 ? 0 : 4)) & 0x0F;
    const int high = p.bits == 6
                         ? (block[256 + (i / 16) * 64 + 4 * j + i % 4] >> (2 * ((i % 16) / 4))) & 3
                         : (block[256 + 4 * j + i % 4] >> (i / 4)) & 1;
    return low + 16 * high;
  }
  const int per_chunk = p.bits == 4 ? 8 : 4, c = k / per_chunk, within = k % per_chunk;
  const uint8_t byte = tile[static_cast<int64_t>(c) * 64 + 4 * j + within % 4];
  if (p.bits == 8) return byte;
  const int nibble = within < 4 ? (byte & 0x0F) : (byte >> 4);
  return p.e2m1 ? kE2m1Codes[nibble] : nibble;
}

void int8_factor_parts(const QProblem& p, const void* a, int n, int g, float* d, int32_t* c) {
  const int t = n / kInt8TileRows, j = n % kInt8TileRows;
  const int per_sb = kSuperBlock / p.group_size;
  const auto* base = static_cast<const uint8_t*>(a) +
                     (static_cast<int64_t>(t) * (p.K / kSuperBlock) + g / per_sb) *
                         factored_superblock_bytes(p.group_size);
  std::memcpy(d, base + 4 * j, 4);
  *c = static_cast<int8_t>(base[4 * kInt8TileRows + (g % per_sb) * kInt8TileRows + j]);
}

float int8_factor(const QProblem& p, const void* a, int n, int g) {
  if (p.factored) {
    float d;
    int32_t c;
    int8_factor_parts(p, a, n, g, &d, &c);
    return d * static_cast<float>(c);
  }
  const int t = n / kInt8TileRows, j = n % kInt8TileRows;
  return scale_at(a, p.half,
                  (static_cast<int64_t>(t) * (p.K / p.group_size) + g) * kInt8TileRows + j);
}

float int8_bias(const QProblem& p, int n, int g) {
  return p.bias_scale != 0.0f ? p.bias_scale * int8_factor(p, p.scales, n, g)
                              : int8_factor(p, p.biases, n, g);
}

float bias_multiple(const void* scales, const void* biases, bool half, int64_t count) {
  float m = 0.0f;
  for (int64_t i = 0; i < count && m == 0.0f; ++i) {
    const float s = scale_at(scales, half, i), b = scale_at(biases, half, i);
    if (s != 0.0f && std::isfinite(s) && std::isfinite(b)) m = b / s;
  }
  int exponent;
  // A power of two (positive or negative): multiplying by it is exact.
  if (m == 0.0f || !std::isfinite(m) || std::fabs(std::frexp(m, &exponent)) != 0.5f) return 0.0f;
  for (int64_t i = 0; i < count; ++i)
    if (!same_bits(m * scale_at(scales, half, i), scale_at(biases, half, i))) return 0.0f;
  return m;
}

void int8_dequantize_rows(const QProblem& p, const uint32_t* ids, int count, float* out) {
  for (int i = 0; i < count; ++i) {
    float* row = out + static_cast<int64_t>(i) * p.K;
    const int n = static_cast<int>(ids[i]);
    for (int g = 0; g < p.K / p.group_size; ++g) {
      const float scale = int8_factor(p, p.scales, n, g);
      const float bias = int8_bias(p, n, g);
      for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) {
        // Two roundings, as MLX's dequantize (this file is compiled for the baseline ISA,
        // which has no FMA to contract them into).
        const float product = scale * static_cast<float>(int8_code(p, n, k));
        row[k] = product + bias;
      }
    }
  }
}

void f32x_scalar(const QProblem& p, int m0, int m1, int t0, int t1) {
  float* row = static_cast<float*>(__builtin_alloca(sizeof(float) * p.K));
  for (int n = t0 * kInt8TileRows; n < t1 * kInt8TileRows; ++n) {
    const uint32_t id = static_cast<uint32_t>(n);
    int8_dequantize_rows(p, &id, 1, row);
    for (int m = m0; m < m1; ++m) {
      const float* x = p.x + static_cast<int64_t>(m) * p.K;
      float acc = 0.0f;
      for (int k = 0; k < p.K; ++k) acc += row[k] * x[k];
      p.y[static_cast<int64_t>(m) * p.N + n] = acc;
    }
  }
}

void f32x_pack_x(const float* x, int M, int K, float* xp) {
  const int groups = (M + kF32xRows - 1) / kF32xRows;
  for (int c = 0; c < groups; ++c)
    for (int k = 0; k < K; ++k)
      for (int r = 0; r < kF32xRows; ++r) {
        const int m = c * kF32xRows + r;
        xp[(static_cast<int64_t>(c) * K + k) * kF32xRows + r] =
            m < M ? x[static_cast<int64_t>(m) * K + k] : 0.0f;
      }
}

namespace {

// The superblock form for factored weights (qmatmul.h), value by value: the group sums from the
// codes themselves (the SIMD paths read the quantizer's stored sums).
void int8_scalar_sb(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1) {
  const int per_sb = kSuperBlock / p.group_size;
  const bool derived = p.bias_scale != 0.0f;
  for (int m = m0; m < m1; ++m) {
    for (int n = t0 * kInt8TileRows; n < t1 * kInt8TileRows; ++n) {
      float acc = 0.0f;
      for (int s = 0; s < p.K / kSuperBlock; ++s) {
        int32_t S = 0, T = 0;
        float d = 0.0f, e = 0.0f;
        for (int g = s * per_sb; g < (s + 1) * per_sb; ++g) {
          int32_t dot = 0, codes = 0;
          for (int k = g * p.group_size; k < (g + 1) * p.group_size; ++k) {
            const int32_t q = x.q[int8_x_index(m, k, p.K)];
            dot += int8_code(p, n, k) * q;
            codes += q;
          }
          int32_t c, cb;
          int8_factor_parts(p, p.scales, n, g, &d, &c);
          if (derived) {
            cb = c;
            e = p.bias_scale * d;
          } else {
            int8_factor_parts(p, p.biases, n, g, &e, &cb);
          }
          S += c * dot;
          T += cb * codes;
        }
        const float step = x.dx[int8_sb_index(m, s, p.K)];
        acc = std::fma(static_cast<float>(S), d * step, acc);
        acc = std::fma(static_cast<float>(T), e * step, acc);
      }
      p.y[static_cast<int64_t>(m) * p.N + n] = acc;
    }
  }
}

}  // namespace

void int8_scalar(const QProblem& p, const Int8X& x, int m0, int m1, int t0, int t1) {
  if (p.factored) return int8_scalar_sb(p, x, m0, m1, t0, t1);
  const int8_t* xq = x.q;
  const float *dx = x.dx, *sx = x.sx, *sh = x.sh;
  const int blocks = p.K / kInt8Block;
  for (int m = m0; m < m1; ++m) {
    for (int n = t0 * kInt8TileRows; n < t1 * kInt8TileRows; ++n) {
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
            dot += int8_code(p, n, k) * xq[int8_x_index(m, k, p.K)];
          }
          const int g = (b * kInt8Block + h * part_len) / p.group_size;
          const float scale = int8_factor(p, p.scales, n, g);
          const float bias = int8_bias(p, n, g);
          acc = std::fma(static_cast<float>(dot), scale * dx[xb], acc);
          acc = std::fma(bias, parts == 2 ? sh[2 * xb + h] : sx[xb], acc);
        }
      }
      p.y[static_cast<int64_t>(m) * p.N + n] = acc;
    }
  }
}

}  // namespace mlxcel::kernels
