// int4 weights x int8 activations for CPUs with AVX-512 VNNI (W4A8, llama.cpp's numbers for a
// Q4 GGUF on CPU): out[M, N] = x[M, K] @ dequant(w)[K, N] with x quantised per row and 32
// columns to signed 8-bit codes, the products of the codes summed in int32 by vpdpbusd (64
// multiply-adds per instruction, against 16 for a float FMA: a verify step's draft rows cost a
// quarter of their float products).
//
// Weights: the int4 panels of quantized_panels.h as they are. A block of 8 k rows is 16 uint32
// lanes, lane n holding column n's 8 codes u (row j in bits 4j..4j + 3); lane & 0x0F0F0F0F
// holds rows 0, 2, 4, 6 as four bytes and (lane >> 4) & 0x0F0F0F0F rows 1, 3, 5, 7, which is
// vpdpbusd's layout (4 bytes summed per 32-bit lane) with the unsigned codes as its unsigned
// operand. So x's codes are stored in that order per 8 k (QuantizeRowsInt4Order) and each row
// broadcasts 4 of them per instruction: two vpdpbusd per row and block, no shuffles.
//
// Activations: per row and 32 columns s = max|x| / 127 and q = round_half_even(x * 127 /
// max|x|) in [-127, 127] (quantize_activations in jaxgen.quantization), with the group's code
// sum. Per activation group g and column n (w[k, n] = d[g', n] * u + m[g', n], g' the weight's
// group of k; weight groups are multiples of 32):
//   out[m, n] = sum_g s[m, g] * (d[g', n] * sum_{k in g} q * u + m[g', n] * sum_{k in g} q).
// Sums fit int32 (32 * 127 * 15). Every row's sums run the same way whatever the rows beside
// it, so a row's result does not depend on how many rows the call has.
// Reference: fake_quantize_activations(x) @ dequantize() (QuantizedWeight.matmul).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "matmul_w8a8.h"

namespace jaxgen_cpu {

#if defined(JAXGEN_W8A8_VNNI)

// Rows [m0, m1) of x [M, K] (K a multiple of 32) as signed int8 codes [M, K], each 8 columns
// stored in the order 0, 2, 4, 6, 1, 3, 5, 7 (the int4 lanes' byte order), their scales
// [M, K / 32] and per group s * sum q [M, K / 32] (what a column's minimum is multiplied by).
inline void QuantizeRowsInt4Order(const float* x, int64_t depth, int64_t m0, int64_t m1,
                                  int8_t* codes, float* scales, float* minimum_factors) {
  const int64_t groups = depth / kActivationGroup;
  // Within each 8 bytes: even columns first, then odd ones.
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      __m512i qa, qb;
      const float scale = QuantizeGroup(x + m * depth + g * kActivationGroup, 127.0f, &qa, &qb);
      int8_t* out = codes + m * depth + g * kActivationGroup;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                       _mm_shuffle_epi8(_mm512_cvtepi32_epi8(qa), order));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16),
                       _mm_shuffle_epi8(_mm512_cvtepi32_epi8(qb), order));
      const int32_t code_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
      scales[m * groups + g] = scale;
      minimum_factors[m * groups + g] = scale * static_cast<float>(code_sum);
    }
  }
}

// out[r, panel's 16 columns] (row stride `columns`) for R rows over the whole depth, from their
// codes (QuantizeRowsInt4Order; row stride `depth`). Two int32 accumulators a row (rows 0, 2,
// 4, 6 of each block and rows 1, 3, 5, 7), one float accumulator: 3R of the 32 registers.
template <int R>
__attribute__((noinline)) void W4A8Tile(const uint8_t* panel, const uint16_t* panel_scales,
                                        const uint16_t* panel_mins, int64_t depth,
                                        int64_t weight_group, const int8_t* codes,
                                        const float* activation_scales,
                                        const float* minimum_factors, float* out,
                                        int64_t columns) {
  static_assert(R >= 1 && R <= 8, "W4A8Tile: 1 to 8 rows");
  const int64_t groups = depth / kActivationGroup;
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * kActivationGroup;
    __m512i even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_si512();
    for (int64_t k = k0; k < k0 + kActivationGroup; k += kInt4BlockRows) {
      const __m512i lanes = _mm512_loadu_si512(panel + k * (kQuantPanel / 2));
      const __m512i rows_even = _mm512_and_si512(lanes, low_nibbles);
      const __m512i rows_odd = _mm512_and_si512(_mm512_srli_epi32(lanes, 4), low_nibbles);
      for (int r = 0; r < R; ++r) {
        int32_t four[2];  // x's codes of rows 0, 2, 4, 6 and 1, 3, 5, 7 of the block
        std::memcpy(four, codes + r * depth + k, sizeof(four));
        even[r] = _mm512_dpbusd_epi32(even[r], rows_even, _mm512_set1_epi32(four[0]));
        odd[r] = _mm512_dpbusd_epi32(odd[r], rows_odd, _mm512_set1_epi32(four[1]));
      }
    }
    const int64_t weight_row = k0 / weight_group * kQuantPanel;
    const __m512 weight_scales = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel_scales + weight_row)));
    const __m512 weight_mins = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel_mins + weight_row)));
    for (int r = 0; r < R; ++r) {
      const __m512 products = _mm512_cvtepi32_ps(_mm512_add_epi32(even[r], odd[r]));
      const __m512 scale =
          _mm512_mul_ps(weight_scales, _mm512_set1_ps(activation_scales[r * groups + g]));
      acc[r] = _mm512_fmadd_ps(products, scale, acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(minimum_factors[r * groups + g]), weight_mins,
                               acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * columns, acc[r]);
}

// out rows [m0, m1), panels [p0, p1) of an int4 weight, from x's codes, scales and minimum
// factors (QuantizeRowsInt4Order over at least those rows): tiles of up to 8 rows.
inline void W4A8Block(const QuantizedPanels& w, const int8_t* codes,
                      const float* activation_scales, const float* minimum_factors, float* out,
                      int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const int64_t depth = w.depth, groups = depth / kActivationGroup;
  const int64_t scale_rows = depth / w.group;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = w.values + p * (depth / 2) * kQuantPanel;
    const uint16_t* panel_scales =
        static_cast<const uint16_t*>(w.scales) + p * scale_rows * kQuantPanel;
    const uint16_t* panel_mins =
        static_cast<const uint16_t*>(w.mins) + p * scale_rows * kQuantPanel;
    constexpr int64_t kTileRows = 8;
    for (int64_t m = m0; m < m1; m += kTileRows) {
      const int rows = static_cast<int>(std::min(kTileRows, m1 - m));
      const int8_t* c = codes + m * depth;
      const float* s = activation_scales + m * groups;
      const float* f = minimum_factors + m * groups;
      float* o = out + m * w.columns + p * kQuantPanel;
      switch (rows) {
#define JAXGEN_W4A8_CASE(n)                                                                  \
  case n:                                                                                    \
    W4A8Tile<n>(panel, panel_scales, panel_mins, depth, w.group, c, s, f, o, w.columns);     \
    break;
        JAXGEN_W4A8_CASE(1)
        JAXGEN_W4A8_CASE(2)
        JAXGEN_W4A8_CASE(3)
        JAXGEN_W4A8_CASE(4)
        JAXGEN_W4A8_CASE(5)
        JAXGEN_W4A8_CASE(6)
        JAXGEN_W4A8_CASE(7)
        JAXGEN_W4A8_CASE(8)
#undef JAXGEN_W4A8_CASE
      }
    }
  }
}

#endif

}  // namespace jaxgen_cpu
