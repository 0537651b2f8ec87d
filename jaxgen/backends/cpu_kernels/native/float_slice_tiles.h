// Float tiles over a dequantised slice of a quantised weight: c[R, 16] (+)= x[R, :kc] @
// slice[kc, 16], with 256-bit vectors (FloatTile16) and, where the compiler targets AVX-512,
// 512-bit ones (FloatTile16Wide). Used by matmul_quantized.h for row counts past its register
// tiles.

#pragma once

#include <cstdint>

#include "quantized_panels.h"

namespace jaxgen_cpu {

#if defined(JAXGEN_QUANTIZED_SIMD)
// c[R, 16] (+)= x[R, :kc] @ slice[kc, 16] over a dequantised float slice, R <= 6: 12
// accumulators, two weight vectors and a broadcast. Named accumulators: GCC kept an array of
// them in memory (a store-to-load chain per k).
template <int R>
__attribute__((noinline)) void FloatTile16(int64_t kc, const float* x, int64_t ldx,
                                           const float* slice, float* c, int64_t ldc,
                                           bool accumulate) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
         a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const float* x4 = x + 4 * ldx;
  const float* x5 = x + 5 * ldx;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_load_ps(slice + k * kQuantPanel);
    const __m256 w1 = _mm256_load_ps(slice + k * kQuantPanel + 8);
    __m256 a = _mm256_broadcast_ss(x0 + k);
    a00 = _mm256_fmadd_ps(a, w0, a00);
    a01 = _mm256_fmadd_ps(a, w1, a01);
    if constexpr (R > 1) {
      a = _mm256_broadcast_ss(x1 + k);
      a10 = _mm256_fmadd_ps(a, w0, a10);
      a11 = _mm256_fmadd_ps(a, w1, a11);
    }
    if constexpr (R > 2) {
      a = _mm256_broadcast_ss(x2 + k);
      a20 = _mm256_fmadd_ps(a, w0, a20);
      a21 = _mm256_fmadd_ps(a, w1, a21);
    }
    if constexpr (R > 3) {
      a = _mm256_broadcast_ss(x3 + k);
      a30 = _mm256_fmadd_ps(a, w0, a30);
      a31 = _mm256_fmadd_ps(a, w1, a31);
    }
    if constexpr (R > 4) {
      a = _mm256_broadcast_ss(x4 + k);
      a40 = _mm256_fmadd_ps(a, w0, a40);
      a41 = _mm256_fmadd_ps(a, w1, a41);
    }
    if constexpr (R > 5) {
      a = _mm256_broadcast_ss(x5 + k);
      a50 = _mm256_fmadd_ps(a, w0, a50);
      a51 = _mm256_fmadd_ps(a, w1, a51);
    }
  }
  const __m256 sums[6][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41},
                             {a50, a51}};
  for (int r = 0; r < R; ++r) {
    float* out = c + r * ldc;
    for (int j = 0; j < 2; ++j) {
      const __m256 prior = accumulate ? _mm256_loadu_ps(out + 8 * j) : _mm256_setzero_ps();
      _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(prior, sums[r][j]));
    }
  }
}
#if defined(__AVX512F__)
// c[R, 16] (+)= x[R, :kc] @ slice[kc, 16] with 512-bit vectors, R <= 8: one accumulator per row,
// one weight vector per k, x[r, k] broadcast from memory by each FMA. 7% faster than
// FloatTile16 at 64 x 576 x 1536 on two threads (benchmarks/matmul_quantized_tile.cc); 12- and
// 16-row tiles ran slower than 8 (the row pointers no longer fit the registers).
template <int R>
__attribute__((noinline)) void FloatTile16Wide(int64_t kc, const float* x, int64_t ldx,
                                               const float* slice, float* c, int64_t ldc,
                                               bool accumulate) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const float* x0 = x;
  const float* x4 = x + 4 * ldx;
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 w = _mm512_load_ps(slice + k * kQuantPanel);
    a0 = _mm512_fmadd_ps(_mm512_set1_ps(x0[k]), w, a0);
    if constexpr (R > 1) a1 = _mm512_fmadd_ps(_mm512_set1_ps(x0[ldx + k]), w, a1);
    if constexpr (R > 2) a2 = _mm512_fmadd_ps(_mm512_set1_ps(x0[2 * ldx + k]), w, a2);
    if constexpr (R > 3) a3 = _mm512_fmadd_ps(_mm512_set1_ps(x0[3 * ldx + k]), w, a3);
    if constexpr (R > 4) a4 = _mm512_fmadd_ps(_mm512_set1_ps(x4[k]), w, a4);
    if constexpr (R > 5) a5 = _mm512_fmadd_ps(_mm512_set1_ps(x4[ldx + k]), w, a5);
    if constexpr (R > 6) a6 = _mm512_fmadd_ps(_mm512_set1_ps(x4[2 * ldx + k]), w, a6);
    if constexpr (R > 7) a7 = _mm512_fmadd_ps(_mm512_set1_ps(x4[3 * ldx + k]), w, a7);
  }
  const __m512 sums[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int r = 0; r < R; ++r) {
    float* out = c + r * ldc;
    const __m512 prior = accumulate ? _mm512_loadu_ps(out) : _mm512_setzero_ps();
    _mm512_storeu_ps(out, _mm512_add_ps(prior, sums[r]));
  }
}
constexpr int64_t kSliceTileRows = 8;  // rows of a float tile over a dequantised slice
#else
constexpr int64_t kSliceTileRows = 6;
#endif
#endif  // JAXGEN_QUANTIZED_SIMD

}  // namespace jaxgen_cpu
