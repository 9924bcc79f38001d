// fastmath.h's functions sixteen lanes at a time, for translation units whose functions carry
// AVX-512 target attributes (included inside their namespace's code, not compiled on its own).
#pragma once

#include <immintrin.h>

#include <cstdint>

#define FAST512_INLINE \
  __attribute__((target("avx512f,avx512dq,fma"), always_inline)) inline

namespace mlxcel::kernels::fast512 {

// e^x for x <= 0: exp_nonpositive_fast's polynomial, lane by lane.
FAST512_INLINE __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

// |x| and sign(x)·v, by the sign bit.
FAST512_INLINE __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF)));
}
FAST512_INLINE __m512 copysign16(__m512 v, __m512 x) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(abs16(v)), sign));
}

// sigmoid_fast: t / (1 + t) below zero, 1 / (1 + t) elsewhere, t = e^(−|x|).
FAST512_INLINE __m512 sigmoid16(__m512 x) {
  const __m512 t = exp16(_mm512_sub_ps(_mm512_setzero_ps(), abs16(x)));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 num = _mm512_mask_blend_ps(negative, _mm512_set1_ps(1.0f), t);
  return _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

// tanh_fast: sign(x)·(1 − t) / (1 + t), t = e^(−2|x|).
FAST512_INLINE __m512 tanh16(__m512 x) {
  const __m512 t = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), abs16(x)));
  const __m512 one = _mm512_set1_ps(1.0f);
  return copysign16(_mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t)), x);
}

}  // namespace mlxcel::kernels::fast512
