// int8 weights x int8 activations (W8A8) for CPUs with AVX-512 VNNI and VBMI: out[M, N] =
// x[M, K] @ dequant(w)[K, N] with x quantised per row and 32 columns, the products summed in
// int32 by vpdpbusd (64 multiply-adds per instruction on a 512-bit register).
//
// Weights: the int8 panels of matmul_quantized.h as they are ([N / 16, K, 16] int8, float16
// scales [N / 16, K / group, 16], group a multiple of 32). Four k rows of a panel are 64
// contiguous bytes; one vpermb turns them into vpdpbusd's layout (the 4 k of a column in one
// 32-bit lane), so no second copy of the weights exists.
//
// Activations: QuantizeRows writes, per row and 32 columns, s = max|x| / 127 and
// q = round_half_even(x * (127 / max|x|)) in [-127, 127], stored as q + 128 (vpdpbusd multiplies
// unsigned by signed bytes). The tile takes the 128 back out per group and column with the
// column's code sum (one more vpdpbusd per 4 k, against a register of ones):
//   out[m, n] = sum_g s_x[m, g] * s_w[g, n] * (sum_{k in g} (q + 128) * w - 128 * sum_{k in g} w).
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
constexpr int64_t kW8A8TileRows = 8;     // rows of x per tile: 16 of the 32 vector registers

#if defined(JAXGEN_W8A8_VNNI)
constexpr bool kW8A8Vnni = true;

// Rows [m0, m1) of x [M, K] (K a multiple of 32) into codes [M, K] uint8 (q + 128) and
// scales [M, K / 32] float.
inline void QuantizeRows(const float* x, int64_t depth, int64_t m0, int64_t m1, uint8_t* codes,
                         float* scales) {
  const int64_t groups = depth / kActivationGroup;
  const __m512i bias = _mm512_set1_epi32(128);
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* in = x + m * depth + g * kActivationGroup;
      const __m512 a = _mm512_loadu_ps(in), b = _mm512_loadu_ps(in + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      uint8_t* out = codes + m * depth + g * kActivationGroup;
      scales[m * groups + g] = amax / 127.0f;
      if (amax == 0.0f) {
        std::memset(out, 128, kActivationGroup);
        continue;
      }
      const __m512 inverse = _mm512_set1_ps(127.0f / amax);
      // Round to nearest even (the default mode), as jnp.round.
      const __m512i qa = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, inverse)), bias);
      const __m512i qb = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, inverse)), bias);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(qb));
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

// out[m0 + r, panel's 16 columns] (row stride `columns`) for R rows over the whole depth.
template <int R>
inline void W8A8Tile(const int8_t* panel, const uint16_t* panel_scales, int64_t depth,
                     int64_t weight_group, const uint8_t* codes, const float* activation_scales,
                     float* out, int64_t columns, __m512i quad_index) {
  const int64_t groups = depth / kActivationGroup;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * kActivationGroup;
    __m512i sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
    __m512i code_sum = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + kActivationGroup; k += 4) {
      const __m512i w = _mm512_permutexvar_epi8(quad_index, _mm512_loadu_si512(panel + k * 16));
      code_sum = _mm512_dpbusd_epi32(code_sum, ones, w);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, codes + r * depth + k, sizeof(four));
        sums[r] = _mm512_dpbusd_epi32(sums[r], _mm512_set1_epi32(four), w);
      }
    }
    const __m512i bias = _mm512_slli_epi32(code_sum, 7);  // 128 x the column's code sum
    const __m512 weight_scale = _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(panel_scales + k0 / weight_group * 16)));
    for (int r = 0; r < R; ++r) {
      const __m512 scale =
          _mm512_mul_ps(weight_scale, _mm512_set1_ps(activation_scales[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r], bias)), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * columns, acc[r]);
}

// out rows [m0, m1), panels [p0, p1) of an int8 weight, from x's codes and scales
// (QuantizeRows over at least those rows).
inline void W8A8Block(const QuantizedPanels& w, const uint8_t* codes,
                      const float* activation_scales, float* out, int64_t m0, int64_t m1,
                      int64_t p0, int64_t p1) {
  const int64_t depth = w.depth, groups = depth / kActivationGroup;
  const int64_t scale_rows = depth / w.group;
  const __m512i quad_index = QuadIndex();
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* panel = reinterpret_cast<const int8_t*>(w.values) + p * depth * kQuantPanel;
    const uint16_t* panel_scales = w.scales + p * scale_rows * kQuantPanel;
    for (int64_t m = m0; m < m1; m += kW8A8TileRows) {
      const int rows = static_cast<int>(std::min(kW8A8TileRows, m1 - m));
      const uint8_t* c = codes + m * depth;
      const float* s = activation_scales + m * groups;
      float* o = out + m * w.columns + p * kQuantPanel;
      switch (rows) {
#define JAXGEN_W8A8_CASE(n)                                                                   \
  case n:                                                                                     \
    W8A8Tile<n>(panel, panel_scales, depth, w.group, c, s, o, w.columns, quad_index); \
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
