// Reading the int8 layout (qmatmul.h) with AVX-512: a tile's scales and biases as 16-lane f32
// vectors, and its codes as bytes, four values of one row per 32-bit lane. Shared by the
// int8-activation kernel (qmatmul_int8_avx512.cc) and the f32-activation kernel over the same
// layout (qmatmul_f32x_avx512.cc); header-only, each function carrying the target attribute so
// the including files compile without -m flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "mlxcel-core/cpp/kernels/qmatmul.h"

#define LAYOUT512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace mlxcel::kernels::layout512 {

// How scales and biases are stored: f32 or f16 [N/16, groups, 16], or factored (qmatmul.h).
enum Scales { kF32, kF16, kFactored };

// Tile t's scale (or bias) of group g for its 16 rows: loaded (f16 widened), or d · float(c)
// when factored (the f32 product the factoring checked). `tile` is the tile's first scale
// (f32/f16: its [groups, 16] rows) or first superblock (factored: `sb_bytes` each, 2^pshift
// groups per superblock).
template <int SM>
LAYOUT512_TARGET inline __attribute__((always_inline)) __m512 factor16(const uint8_t* tile, int64_t sb_bytes, int pshift, int g) {
  if constexpr (SM == kFactored) {
    const uint8_t* sb = tile + (g >> pshift) * sb_bytes;
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(sb));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        sb + 4 * kInt8TileRows + (g & ((1 << pshift) - 1)) * kInt8TileRows));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c)));
  } else if constexpr (SM == kF16) {
    const auto* halves = reinterpret_cast<const uint16_t*>(tile) + g * kInt8TileRows;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves)));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(tile) + g * kInt8TileRows);
  }
}

// The 16 rows' codes of values 4Q .. 4Q + 3 of the block at `wb` (64 · BITS bytes), one byte per
// value, four values per 32-bit lane as `vpdpbusd` takes them. 4 bits: chunk Q / 2's low (even
// Q) or high (odd Q) nibbles. 5 and 6 bits: those nibbles, with the high bits (bit Q of the one
// high chunk; bits 2i, 2i + 1 of high chunk Q / 4, i = Q % 4) put in bits 4 (and 5) with zeros
// above: the high chunk masked to two fields per byte (bits 0 and 4 of (h >> Q % 4); bits 0-1
// and 4-5 of h or h >> 2), the lower field moved up by a 16-bit shift (what crosses into the
// next byte lands in its low nibble, which the nibbles replace). Values Q and Q + 4 (5 bits), or
// the pairs of a chunk (6 bits), share one masked form. 8 bits: chunk Q.
//
// E2M1 indices (kE2m1Bits, kE2m1VbmiBits: the 4-bit layout, qmatmul.h): the nibbles as for 4
// bits, looked up in kE2m1Codes. vpshufb reads bits 0-3 of each index (and zeroes where bit 7 is
// set), so the nibble is masked first; vpermb reads bits 0-5 of a 64-byte table, which holds the
// 16 codes four times, so bits 4 and 5 (the other nibble) do not matter and nothing is masked.
// vpermb goes through asm: the kernels' target attributes leave VBMI out (a VNNI CPU may lack
// it; dispatch_layout takes this form only where has_vbmi()).
LAYOUT512_TARGET inline __attribute__((always_inline)) __m512i e2m1_table() {
  const __m128i t = _mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4);
  return _mm512_broadcast_i32x4(t);
}

template <int BITS, int Q>
LAYOUT512_TARGET inline __attribute__((always_inline)) __m512i codes(const uint8_t* wb) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  if constexpr (BITS == kE2m1Bits || BITS == kE2m1VbmiBits) {
    const __m512i v = _mm512_loadu_si512(wb + (Q / 2) * 64);
    const __m512i index = Q % 2 == 0 ? v : _mm512_srli_epi16(v, 4);
    if constexpr (BITS == kE2m1VbmiBits) {
      __m512i out;
      __asm__("vpermb %2, %1, %0" : "=v"(out) : "v"(index), "v"(e2m1_table()));
      return out;
    } else {
      return _mm512_shuffle_epi8(e2m1_table(), _mm512_and_si512(index, low));
    }
  } else if constexpr (BITS == 8) {
    return _mm512_loadu_si512(wb + Q * 64);
  } else {
    const __m512i v = _mm512_loadu_si512(wb + (Q / 2) * 64);
    const __m512i nibbles = Q % 2 == 0 ? v : _mm512_srli_epi16(v, 4);
    if constexpr (BITS == 4) {
      return _mm512_and_si512(nibbles, low);
    } else {
      const __m512i h = _mm512_loadu_si512(wb + 256 + (BITS == 5 ? 0 : (Q / 4) * 64));
      constexpr int kShift = BITS == 5 ? Q % 4 : 2 * ((Q % 4) % 2);
      constexpr bool kLower = BITS == 5 ? Q < 4 : Q % 4 < 2;
      const __m512i fields =
          _mm512_and_si512(kShift == 0 ? h : _mm512_srli_epi16(h, kShift),
                           _mm512_set1_epi8(BITS == 5 ? 0x11 : 0x33));
      const __m512i high = kLower ? _mm512_slli_epi16(fields, 4) : fields;
      // low ? nibbles : high, bit by bit
      return _mm512_ternarylogic_epi32(nibbles, low, high, 0xE2);
    }
  }
}

// Where tile t's scales and biases start, and how factored ones are laid out: what a kernel over
// the layout needs besides the codes.
struct TileScales {
  int64_t sb_bytes;         // bytes per factored superblock (0 unless factored)
  int pshift;               // log2(groups per superblock) when factored
  int gshift;               // log2(group_size / 32) (groups of 32 or more)
  int64_t per_tile;         // bytes of one tile's scales (and of its stored biases)
  int64_t code_tile_bytes;  // bytes of one tile's codes

  TileScales(const QProblem& p, int sm, bool g16)
      : sb_bytes(sm == kFactored ? factored_superblock_bytes(p.group_size) : 0),
        pshift(sm == kFactored ? __builtin_ctz(static_cast<unsigned>(kSuperBlock / p.group_size))
                               : 0),
        gshift(g16 ? 0 : __builtin_ctz(static_cast<unsigned>(p.group_size / kInt8Block))),
        per_tile(sm == kFactored ? (p.K / kSuperBlock) * sb_bytes
                                 : static_cast<int64_t>(p.K / p.group_size) * kInt8TileRows *
                                       (sm == kF16 ? 2 : 4)),
        code_tile_bytes(static_cast<int64_t>(2) * p.K * p.bits) {}

  const uint8_t* codes(const QProblem& p, int t) const {
    return reinterpret_cast<const uint8_t*>(p.w) + t * code_tile_bytes;
  }
  const uint8_t* scales(const QProblem& p, int t) const {
    return static_cast<const uint8_t*>(p.scales) + t * per_tile;
  }
  // (Not read when the biases are derived from the scales: p.biases is then a placeholder.)
  const uint8_t* biases(const QProblem& p, int t) const {
    return p.bias_scale != 0.0f ? scales(p, t)
                                : static_cast<const uint8_t*>(p.biases) + t * per_tile;
  }
};

// Calls body.template rows<R>(m) over rows [m0, m1) of x: runs of eight, then one run of the
// rest (each kernel instantiates its tile for one to eight rows).
template <typename Body>
inline void row_runs(const Body& body, int m0, int m1) {
  int m = m0;
  for (; m + 8 <= m1; m += 8) body.template rows<8>(m);
  switch (m1 - m) {
    case 7: body.template rows<7>(m); break;
    case 6: body.template rows<6>(m); break;
    case 5: body.template rows<5>(m); break;
    case 4: body.template rows<4>(m); break;
    case 3: body.template rows<3>(m); break;
    case 2: body.template rows<2>(m); break;
    case 1: body.template rows<1>(m); break;
    default: break;
  }
}

// Calls Kernel<BITS, SM, G16>::run(p, args...) for p's code width, scale storage and group size
// (16, or 32 and more).
template <template <int, int, bool> class Kernel, int BITS, int SM, typename... Args>
inline void dispatch_groups(const QProblem& p, Args... args) {
  if (p.group_size == 16)
    Kernel<BITS, SM, true>::run(p, args...);
  else
    Kernel<BITS, SM, false>::run(p, args...);
}

template <template <int, int, bool> class Kernel, int BITS, typename... Args>
inline void dispatch_scales(const QProblem& p, Args... args) {
  if (p.factored)
    dispatch_groups<Kernel, BITS, kFactored>(p, args...);
  else if (p.half)
    dispatch_groups<Kernel, BITS, kF16>(p, args...);
  else
    dispatch_groups<Kernel, BITS, kF32>(p, args...);
}

template <template <int, int, bool> class Kernel, typename... Args>
inline void dispatch_layout(const QProblem& p, Args... args) {
  switch (p.bits) {
    case 4:
      if (p.e2m1)
        return has_vbmi() ? dispatch_scales<Kernel, kE2m1VbmiBits>(p, args...)
                          : dispatch_scales<Kernel, kE2m1Bits>(p, args...);
      return dispatch_scales<Kernel, 4>(p, args...);
    case 5: return dispatch_scales<Kernel, 5>(p, args...);
    case 6: return dispatch_scales<Kernel, 6>(p, args...);
    default: return dispatch_scales<Kernel, 8>(p, args...);
  }
}

}  // namespace mlxcel::kernels::layout512
