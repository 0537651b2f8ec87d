// int8 weights x integer activations for CPUs with AVX-512 VNNI and VBMI: out[M, N] =
// x[M, K] @ dequant(w)[K, N] with x quantised per row and 32 columns to 8-bit codes (W8A8) or
// 16-bit ones (two byte planes; finer than float16), the products summed in int32 by vpdpbusd
// (64 multiply-adds per instruction on a 512-bit register; two per 4 k for 16-bit codes).
//
// Weights: the int8 panels of matmul_quantized.h as they are ([N / 16, K, 16] int8, float16
// scales [N / 16, K / group, 16], group a multiple of 32). Four k rows of a panel are 64
// contiguous bytes; one vpermb turns them into vpdpbusd's layout (the 4 k of a column in one
// 32-bit lane), so no second copy of the weights exists.
//
// Activations: QuantizeRows writes, per row and 32 columns, s = max|x| / L and
// q = round_half_even(x * (L / max|x|)) in [-L, L] (L = 127, or 32767 for 16 bits), stored as
// u = q + L + 1 (vpdpbusd multiplies unsigned by signed bytes; 16-bit u as its high and low
// bytes, summed separately and combined as 256 * high + low). The tile takes the offset back out
// per group and column with the column's code sum (one more vpdpbusd per 4 k, against ones):
//   out[m, n] = sum_g s_x[m, g] * s_w[g, n] * (sum_{k in g} u * w - (L + 1) * sum_{k in g} w).
// Sums fit int32: 16-bit, 32 k: 256 * 32 * 255 * 127 + 32 * 255 * 127 + 32768 * 32 * 127 < 2^31.
// Reference: the same codes in float64 (jaxgen.quantization.w8a8_matmul_reference).

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "matmul_quantized.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__F16C__)
#include <immintrin.h>
#define JAXGEN_W8A8_VNNI 1
#endif

namespace jaxgen_cpu {

constexpr int64_t kActivationGroup = 32;  // columns of x per activation scale

#if defined(JAXGEN_W8A8_VNNI)
constexpr bool kW8A8Vnni = true;

// One 32-column group of x (at `in`) as signed codes q = round_half_even(x * (levels / max|x|))
// in [-levels, levels] (16 in each of *low and *high); returns its scale max|x| / levels. The
// rounding of quantize_activations (jaxgen.quantization): the default mode rounds to nearest
// even, as jnp.round; an all-zero group has codes 0.
inline float QuantizeGroup(const float* in, float levels, __m512i* low, __m512i* high) {
  const __m512 a = _mm512_loadu_ps(in), b = _mm512_loadu_ps(in + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 inverse = _mm512_set1_ps(amax == 0.0f ? 0.0f : levels / amax);
  *low = _mm512_cvtps_epi32(_mm512_mul_ps(a, inverse));
  *high = _mm512_cvtps_epi32(_mm512_mul_ps(b, inverse));
  return amax / levels;
}

// Rows [m0, m1) of x [M, K] (K a multiple of 32) as kBits-bit codes per row and 32 columns:
// q = round_half_even(x * (L / max|x|)) with L = 2^(kBits - 1) - 1, scale max|x| / L, stored
// unsigned as u = q + L + 1 (vpdpbusd takes unsigned x): kBits 8, one byte plane [M, K]; kBits
// 16, two, the high bytes of u then the low ones ([M, 2, K]). Scales [M, K / 32] float.
template <int kBits>
inline void QuantizeRows(const float* x, int64_t depth, int64_t m0, int64_t m1, uint8_t* codes,
                         float* scales) {
  constexpr int kPlanes = kBits / 8;
  constexpr float kLevels = kBits == 8 ? 127.0f : 32767.0f;
  const int64_t groups = depth / kActivationGroup;
  const __m512i bias = _mm512_set1_epi32(kBits == 8 ? 128 : 32768);
  const __m512i low_byte = _mm512_set1_epi32(0xFF);
  for (int64_t m = m0; m < m1; ++m) {
    uint8_t* row = codes + m * depth * kPlanes;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i qa, qb;
      scales[m * groups + g] =
          QuantizeGroup(x + m * depth + g * kActivationGroup, kLevels, &qa, &qb);
      const __m512i ua = _mm512_add_epi32(qa, bias), ub = _mm512_add_epi32(qb, bias);
      uint8_t* out = row + g * kActivationGroup;
      if constexpr (kBits == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(ua));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(ub));
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                         _mm512_cvtepi32_epi8(_mm512_srli_epi32(ua, 8)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                         _mm512_cvtepi32_epi8(_mm512_srli_epi32(ub, 8)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + depth),
                         _mm512_cvtepi32_epi8(_mm512_and_si512(ua, low_byte)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + depth + 16),
                         _mm512_cvtepi32_epi8(_mm512_and_si512(ub, low_byte)));
      }
    }
  }
}

// vpermb index: output byte 4c + j takes input byte 16j + c (k row j, column c).
inline __m512i QuadIndex() {
  alignas(64) uint8_t index[64];
  for (int c = 0; c < 16; ++c) {
    for (int j = 0; j < 4; ++j) index[4 * c + j] = static_cast<uint8_t>(16 * j + c);
  }
  return _mm512_load_si512(index);
}

// out[m0 + r, panel's 16 columns] (row stride `columns`) for R rows over the whole depth, from
// kBits-bit codes (QuantizeRows).
template <int R, int kBits>
inline void W8A8Tile(const int8_t* panel, const uint16_t* panel_scales, int64_t depth,
                     int64_t weight_group, const uint8_t* codes, const float* activation_scales,
                     float* out, int64_t columns, __m512i quad_index) {
  constexpr int kPlanes = kBits / 8;
  const int64_t groups = depth / kActivationGroup;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * kActivationGroup;
    __m512i sums[R][kPlanes];
    for (int r = 0; r < R; ++r) {
      for (int plane = 0; plane < kPlanes; ++plane) sums[r][plane] = _mm512_setzero_si512();
    }
    __m512i code_sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + kActivationGroup; k += 4) {
      const __m512i w = _mm512_permutexvar_epi8(quad_index, _mm512_loadu_si512(panel + k * 16));
      code_sum = _mm512_dpbusd_epi32(code_sum, ones, w);
      for (int r = 0; r < R; ++r) {
        for (int plane = 0; plane < kPlanes; ++plane) {
          int32_t four;
          std::memcpy(&four, codes + (r * kPlanes + plane) * depth + k, sizeof(four));
          sums[r][plane] = _mm512_dpbusd_epi32(sums[r][plane], _mm512_set1_epi32(four), w);
        }
      }
    }
    // The unsigned codes' offset (128 or 32768) times the column's code sum.
    const __m512i bias = _mm512_slli_epi32(code_sum, kBits == 8 ? 7 : 15);
    const __m512 weight_scale = _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(panel_scales + k0 / weight_group * 16)));
    for (int r = 0; r < R; ++r) {
      __m512i total = sums[r][0];
      if constexpr (kBits == 16) total = _mm512_add_epi32(_mm512_slli_epi32(total, 8), sums[r][1]);
      const __m512 scale =
          _mm512_mul_ps(weight_scale, _mm512_set1_ps(activation_scales[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(total, bias)), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * columns, acc[r]);
}

// out rows [m0, m1), panels [p0, p1) of an int8 weight, from x's kBits-bit codes and scales
// (QuantizeRows<kBits> over at least those rows).
template <int kBits>
inline void W8A8Block(const QuantizedPanels& w, const uint8_t* codes,
                      const float* activation_scales, float* out, int64_t m0, int64_t m1,
                      int64_t p0, int64_t p1) {
  const int64_t depth = w.depth, groups = depth / kActivationGroup;
  const int64_t scale_rows = depth / w.group;
  const __m512i quad_index = QuadIndex();
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* panel = reinterpret_cast<const int8_t*>(w.values) + p * depth * kQuantPanel;
    const uint16_t* panel_scales =
        static_cast<const uint16_t*>(w.scales) + p * scale_rows * kQuantPanel;
    constexpr int64_t kTileRows = kBits == 8 ? 8 : 6;  // 16 or 18 accumulators of 32 registers
    for (int64_t m = m0; m < m1; m += kTileRows) {
      const int rows = static_cast<int>(std::min(kTileRows, m1 - m));
      const uint8_t* c = codes + m * depth * (kBits / 8);
      const float* s = activation_scales + m * groups;
      float* o = out + m * w.columns + p * kQuantPanel;
      switch (rows) {
#define JAXGEN_W8A8_CASE(n)                                                                   \
  case n:                                                                                     \
    W8A8Tile<n, kBits>(panel, panel_scales, depth, w.group, c, s, o, w.columns, quad_index); \
    break;
        JAXGEN_W8A8_CASE(1)
        JAXGEN_W8A8_CASE(2)
        JAXGEN_W8A8_CASE(3)
        JAXGEN_W8A8_CASE(4)
        JAXGEN_W8A8_CASE(5)
        JAXGEN_W8A8_CASE(6)
        JAXGEN_W8A8_CASE(7)
        JAXGEN_W8A8_CASE(8)
#undef JAXGEN_W8A8_CASE
      }
    }
  }
}

#else
constexpr bool kW8A8Vnni = false;
#endif

}  // namespace jaxgen_cpu
