// The one-row tiles of the quantised matmul (decode's hot loop): c[16] (+)= x[k0:k1] @
// dequant(panel)[k0:k1, 16] with the weights dequantised in registers; 512-bit where the
// compiler targets AVX-512; and int8's tiles of 2-4 rows in the same scheme (a verify step's
// draft rows); a codebook int4 panel's one row (BookRowGroups). Layout and decoding:
// quantized_panels.h.

#pragma once

#include <algorithm>
#include <type_traits>

#include "quantized_panels.h"

namespace jaxgen_cpu {

#if defined(JAXGEN_QUANTIZED_SIMD)
// c[16] (+)= x[k0:k1] @ dequant(panel)[k0:k1, 16] for one row of int4 codes (decode's hot loop):
// per group, sum scaled[k] * Int4LaneCode over eight independent accumulator pairs (one AND, one
// conversion and one FMA per 8 weights), then apply the group's scale, and its minimum times the
// group's sum of x, once. `scaled` is the row through ScaleRowForInt4; k0, k1 multiples of 8.
template <typename S>
__attribute__((noinline)) inline void Int4RowTile(const QuantizedPanels& w, int64_t k0,
                                                  int64_t k1, const float* x,
                                                  const float* scaled, const uint8_t* values,
                                                  const S* scales, const S* mins,
                                                  float* c, bool accumulate) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    __m256 xs = _mm256_setzero_ps();
    for (int64_t j = k; j < end; j += 8) xs = _mm256_add_ps(xs, _mm256_loadu_ps(x + j));
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
           a30 = a00, a31 = a00;
    for (; k < end; k += kInt4BlockRows) {
      const uint8_t* block = values + (k - k0) * (kQuantPanel / 2);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32));
      const float* xk = scaled + k;
#define JAXGEN_INT4_ROW(J, A0, A1)                                                   \
  {                                                                                  \
    const __m256 b = _mm256_broadcast_ss(xk + J);                                    \
    A0 = _mm256_fmadd_ps(b, _mm256_cvtepi32_ps(Int4LaneCode<J>(v0)), A0);           \
    A1 = _mm256_fmadd_ps(b, _mm256_cvtepi32_ps(Int4LaneCode<J>(v1)), A1);           \
  }
      JAXGEN_INT4_ROW(0, a00, a01)
      JAXGEN_INT4_ROW(1, a10, a11)
      JAXGEN_INT4_ROW(2, a20, a21)
      JAXGEN_INT4_ROW(3, a30, a31)
      JAXGEN_INT4_ROW(4, a00, a01)
      JAXGEN_INT4_ROW(5, a10, a11)
      JAXGEN_INT4_ROW(6, a20, a21)
      JAXGEN_INT4_ROW(7, a30, a31)
#undef JAXGEN_INT4_ROW
    }
    const __m256 e0 = _mm256_add_ps(_mm256_add_ps(a00, a10), _mm256_add_ps(a20, a30));
    const __m256 e1 = _mm256_add_ps(_mm256_add_ps(a01, a11), _mm256_add_ps(a21, a31));
    const __m256 sum_x = _mm256_set1_ps(HorizontalSum8(xs));
    acc0 = _mm256_fmadd_ps(e0, LoadScales8(scales + g * kQuantPanel), acc0);
    acc1 = _mm256_fmadd_ps(e1, LoadScales8(scales + g * kQuantPanel + 8), acc1);
    acc0 = _mm256_fmadd_ps(sum_x, LoadScales8(mins + g * kQuantPanel), acc0);
    acc1 = _mm256_fmadd_ps(sum_x, LoadScales8(mins + g * kQuantPanel + 8), acc1);
  }
  const __m256 prior0 = accumulate ? _mm256_loadu_ps(c) : _mm256_setzero_ps();
  const __m256 prior1 = accumulate ? _mm256_loadu_ps(c + 8) : _mm256_setzero_ps();
  _mm256_storeu_ps(c, _mm256_add_ps(prior0, acc0));
  _mm256_storeu_ps(c + 8, _mm256_add_ps(prior1, acc1));
}

// c[R, 16] (+)= x[R, k0:k1] @ dequant(panel)[k0:k1, 16] for 2 to 4 rows of int8 codes with
// float x (a kept GGUF's Q8_0 weights: the default model's LM head, which a verify step runs on
// its draft rows): the one-row tile's scheme, the codes of a k converted to float once and
// every row adding one FMA per 8 columns, the group's scale applied once per group into c.
// QuantizedTile instead scaled every code (one multiply per 8 columns and k) before the rows'
// FMAs: 1-4 rows of 576 x 1024 (one thread, cache-resident, benchmarks/matmul_quantized_tile.cc)
// 60 / 70 / 79 / 93 us here against 65 / 98 / 117 / 150. Rows of <= 2 keep two accumulator
// chains (even and odd k), more rows one (16 registers); c is summed into once per group.
template <int R, typename S>
__attribute__((noinline)) void Int8RowsTile(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                            const float* x, int64_t ldx, const uint8_t* values,
                                            const S* scales, float* c, int64_t ldc,
                                            bool accumulate) {
  static_assert(R >= 2 && R <= 4, "Int8RowsTile: 2 to 4 rows");
  constexpr int kChains = R <= 2 ? 2 : 1;
  if (!accumulate) {  // c is summed into once per group (registers hold the group's sums)
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(c + r * ldc, _mm256_setzero_ps());
      _mm256_storeu_ps(c + r * ldc + 8, _mm256_setzero_ps());
    }
  }
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    __m256 acc[kChains][R][2];
    for (int i = 0; i < kChains; ++i) {
      for (int r = 0; r < R; ++r) acc[i][r][0] = acc[i][r][1] = _mm256_setzero_ps();
    }
    auto row = [&](int64_t k, auto chain) {  // chain: a compile-time index (registers)
      constexpr int kChain = decltype(chain)::value;
      const __m128i codes =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + (k - k0) * kQuantPanel));
      const __m256 e0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
      const __m256 e1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8)));
      for (int r = 0; r < R; ++r) {
        const __m256 b = _mm256_broadcast_ss(x + r * ldx + k);
        acc[kChain][r][0] = _mm256_fmadd_ps(b, e0, acc[kChain][r][0]);
        acc[kChain][r][1] = _mm256_fmadd_ps(b, e1, acc[kChain][r][1]);
      }
    };
    for (; k + 2 <= end; k += 2) {
      row(k, std::integral_constant<int, 0>());
      row(k + 1, std::integral_constant<int, kChains - 1>());
    }
    if (k < end) row(k++, std::integral_constant<int, 0>());
    const __m256 s0 = LoadScales8(scales + g * kQuantPanel);
    const __m256 s1 = LoadScales8(scales + g * kQuantPanel + 8);
    for (int r = 0; r < R; ++r) {
      __m256 e0 = acc[0][r][0], e1 = acc[0][r][1];
      if constexpr (kChains == 2) {
        e0 = _mm256_add_ps(e0, acc[1][r][0]);
        e1 = _mm256_add_ps(e1, acc[1][r][1]);
      }
      float* out = c + r * ldc;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(e0, s0, _mm256_loadu_ps(out)));
      _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(e1, s1, _mm256_loadu_ps(out + 8)));
    }
  }
}

// acc[2] += x[k0:k1] @ dequant(panel)[k0:k1, 16] for one row of a codebook int4 panel: per
// group, x * book[u] summed in four FMA chains per half (k % 4), then the group's scale applied
// once (as one int8 row's tile does); the one-row int4 tiles' 16^j trick needs linear codes.
template <typename S>
inline void BookRowGroups(const QuantizedPanels& w, int64_t k0, int64_t k1, const float* x,
                          const uint8_t* values, const S* scales, __m256 (&acc)[2]) {
  const __m256i book = LoadBook(w.codebook);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    __m256 sum[4][2];
    for (auto& chain : sum) chain[0] = chain[1] = _mm256_setzero_ps();
    for (; k < end; k += kInt4BlockRows) {
      const uint8_t* block = values + (k - k0) * (kQuantPanel / 2);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32));
      ForInt4BookBlockRows(v0, v1, one, one, book, [&](int j, __m256 e0, __m256 e1) {
        const __m256 a = _mm256_broadcast_ss(x + k + j);
        sum[j & 3][0] = _mm256_fmadd_ps(a, e0, sum[j & 3][0]);
        sum[j & 3][1] = _mm256_fmadd_ps(a, e1, sum[j & 3][1]);
      });
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 total =
          _mm256_add_ps(_mm256_add_ps(sum[0][h], sum[1][h]), _mm256_add_ps(sum[2][h], sum[3][h]));
      acc[h] = _mm256_fmadd_ps(total, LoadScales8(scales + g * kQuantPanel + 8 * h), acc[h]);
    }
  }
}

#if defined(__AVX512F__)
inline __m512 LoadHalf16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 LoadScales16(const uint16_t* p) { return LoadHalf16(p); }
inline __m512 LoadScales16(const float* p) { return _mm512_loadu_ps(p); }

// (a0 + a1) + (a2 + a3): a row's four accumulator chains, summed as the one-row tiles sum them.
inline __m512 SumChains(const __m512 (&a)[4]) {
  return _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
}

// The frame of the 512-bit row tiles below: per group of the panel's k0:k1, R rows' four
// accumulator chains zeroed and `group(g, k, end, chains, acc)` run (it walks k to end and adds
// the group into acc); then c[R, 16] (+)= acc.
template <int R, typename Group>
__attribute__((always_inline)) inline void RowTilesByGroup(const QuantizedPanels& w, int64_t k0, int64_t k1, float* c,
                            int64_t ldc, bool accumulate, Group&& group) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    __m512 a[R][4];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm512_setzero_ps();
    group(g, k, end, a, acc);
    k = end;
  }
  for (int r = 0; r < R; ++r) {
    float* out = c + r * ldc;
    const __m512 prior = accumulate ? _mm512_loadu_ps(out) : _mm512_setzero_ps();
    _mm512_storeu_ps(out, _mm512_add_ps(prior, acc[r]));
  }
}

// c[R, 16] (+)= x[R, k0:k1] @ dequant(panel)[k0:k1, 16] for 1 to 5 rows of int8 codes with
// float x and 512-bit vectors (a kept GGUF's Q8_0 weights, its LM head among them: decode's row,
// a verify step's draft rows; int8 quantised at load takes integer x on VNNI, matmul_w8a8.h):
// per k one sign-extending load and one conversion of the 16 codes, shared by the R rows, and
// one FMA per row with x[r, k] broadcast from memory; four accumulator chains a row (k mod 4),
// the group's scale applied once. Every row's sums run in the same order whatever R.
template <int R, typename S>
__attribute__((noinline)) void Int8RowsTileWide(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                                const float* x, int64_t ldx,
                                                const uint8_t* values, const S* scales,
                                                float* c, int64_t ldc, bool accumulate) {
  static_assert(R >= 1 && R <= 5, "Int8RowsTileWide: 1 to 5 rows");
  RowTilesByGroup<R>(w, k0, k1, c, ldc, accumulate, [&](int64_t g, int64_t k, int64_t end,
                                                        __m512 (&a)[R][4], __m512 (&acc)[R])
                                                        __attribute__((always_inline)) {
    const uint8_t* codes = values + (k - k0) * kQuantPanel;
#define JAXGEN_INT8_ROWS_WIDE(J, CHAIN)                                                   \
  {                                                                                       \
    const __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                          \
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + J * kQuantPanel))));     \
    for (int r = 0; r < R; ++r) {                                                         \
      a[r][CHAIN] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + k + J]), code, a[r][CHAIN]); \
    }                                                                                     \
  }
    for (; k + 4 <= end; k += 4, codes += 4 * kQuantPanel) {
      JAXGEN_INT8_ROWS_WIDE(0, 0)
      JAXGEN_INT8_ROWS_WIDE(1, 1)
      JAXGEN_INT8_ROWS_WIDE(2, 2)
      JAXGEN_INT8_ROWS_WIDE(3, 3)
    }
    for (; k < end; ++k, codes += kQuantPanel) JAXGEN_INT8_ROWS_WIDE(0, 0)
#undef JAXGEN_INT8_ROWS_WIDE
    const __m512 group_scales = LoadScales16(scales + g * kQuantPanel);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(SumChains(a[r]), group_scales, acc[r]);
  });
}

// The group sums of x that the int4 tiles scale the minimums by, sums[g] over x[g * group:
// (g + 1) * group] (8 lanes, then across), once per call rather than once per panel.
inline void Int4GroupSums(const float* x, int64_t depth, int64_t group, float* sums) {
  for (int64_t g = 0; g * group < depth; ++g) {
    __m256 xs = _mm256_setzero_ps();
    for (int64_t j = g * group; j < std::min(depth, (g + 1) * group); j += 8) {
      xs = _mm256_add_ps(xs, _mm256_loadu_ps(x + j));
    }
    sums[g] = HorizontalSum8(xs);
  }
}

// c[R, 16] (+)= x[R, k0:k1] @ dequant(panel)[k0:k1, 16] for 1 to 5 rows of int4 codes (decode's
// row, a verify step's draft rows) with 512-bit vectors, Int4RowTile's scheme: one 64-byte load
// holds a block's 16 lanes, and each of its 8 block rows is one AND (or shift) and one
// conversion, done once for all R rows, then one FMA per row with scaled[r, k] (the row through
// ScaleRowForInt4) for all 16 columns; per group the scale, and the minimum times the group's sum
// of x (Int4GroupSums, taken once per call), once. Four accumulator chains a row; every row's
// sums run in the same order whatever R, so a row's result does not depend on the rows beside
// it. `scaled` holds the rows and `sums` their group sums, `ld` floats apart.
template <int R, typename S>
__attribute__((noinline)) void Int4RowsTileWide(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                                const float* scaled, const float* sums,
                                                int64_t ld, const uint8_t* values,
                                                const S* scales, const S* mins,
                                                float* c, int64_t ldc, bool accumulate) {
  static_assert(R >= 1 && R <= 5, "Int4RowsTileWide: 1 to 5 rows");
  RowTilesByGroup<R>(w, k0, k1, c, ldc, accumulate, [&](int64_t g, int64_t k, int64_t end,
                                                        __m512 (&a)[R][4], __m512 (&acc)[R])
                                                        __attribute__((always_inline)) {
    for (; k < end; k += kInt4BlockRows) {
      const __m512i v = _mm512_loadu_si512(values + (k - k0) * (kQuantPanel / 2));
#define JAXGEN_INT4_ROWS_WIDE(J, CODE)                                                    \
  {                                                                                       \
    const __m512 code = _mm512_cvtepi32_ps(CODE);                                         \
    for (int r = 0; r < R; ++r) {                                                         \
      a[r][J % 4] = _mm512_fmadd_ps(_mm512_set1_ps(scaled[r * ld + k + J]), code, a[r][J % 4]); \
    }                                                                                     \
  }
      JAXGEN_INT4_ROWS_WIDE(0, _mm512_and_si512(v, _mm512_set1_epi32(0xF)))
      JAXGEN_INT4_ROWS_WIDE(1, _mm512_and_si512(v, _mm512_set1_epi32(0xF0)))
      JAXGEN_INT4_ROWS_WIDE(2, _mm512_and_si512(v, _mm512_set1_epi32(0xF00)))
      JAXGEN_INT4_ROWS_WIDE(3, _mm512_and_si512(v, _mm512_set1_epi32(0xF000)))
      JAXGEN_INT4_ROWS_WIDE(4, _mm512_and_si512(v, _mm512_set1_epi32(0xF0000)))
      JAXGEN_INT4_ROWS_WIDE(5, _mm512_and_si512(v, _mm512_set1_epi32(0xF00000)))
      JAXGEN_INT4_ROWS_WIDE(6, _mm512_and_si512(v, _mm512_set1_epi32(0xF000000)))
      JAXGEN_INT4_ROWS_WIDE(7, _mm512_srli_epi32(v, 28))
#undef JAXGEN_INT4_ROWS_WIDE
    }
    const __m512 group_mins = LoadScales16(mins + g * kQuantPanel);
    const __m512 group_scales = LoadScales16(scales + g * kQuantPanel);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sums[r * ld + g]), group_mins, acc[r]);
      acc[r] = _mm512_fmadd_ps(SumChains(a[r]), group_scales, acc[r]);
    }
  });
}
#endif
#endif

}  // namespace jaxgen_cpu
