// Dense float32 matmul out[M, N] = x[M, K] @ w[K, N] over weights packed once into panels,
// blocked for AVX2 + FMA.
//
// Packed layout: [N / 24, K, 24], panel p holding columns [24p, 24p + 24) row after row, so a
// panel streams contiguously (from a row-major w a panel's rows, N floats apart, would map onto
// few cache sets: for N = 1536 only 32 of the L2's). A 4 x 24 register tile runs over a 256-deep
// slice of a panel (24 KB, kept in L1 while every row tile of the block passes over it): 12
// accumulators, three weight vectors and one broadcast of x per k. Without AVX2 + FMA a
// portable loop stands in (kHasSimd is false; callers keep XLA's dot).

#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace jaxgen_cpu {

constexpr int64_t kPanelWidth = 24;  // columns per panel: three 8-float vectors
constexpr int64_t kTileRows = 4;     // rows of x per register tile
constexpr int64_t kBlockDepth = 256; // k-block: one panel of it (24 KB) stays in L1

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kHasSimd = true;

// c[rows, 24] (+)= x[rows, kc] @ panel[kc, 24]. The accumulators are named variables, not an
// array: GCC kept an array's rows in memory. Never inlined: the tile needs all 16 vector
// registers, and inlined into a caller (a standalone build of MatmulBlock) GCC spilled an
// accumulator to the stack, a store-to-load chain through every k: 37-42 instead of 65-93
// GFLOP/s on one core here.
// `next` (may be null): the panel slice the block reads after this one, fetched into L2 while
// this tile runs, so weights streaming from memory do not stall the first tile of each slice.
template <int kRows>
__attribute__((noinline)) void Tile(int64_t kc, const float* x, int64_t ldx, const float* panel,
                                    float* c, int64_t ldc, bool accumulate, const float* next) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
  __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const float* x3 = x + 3 * ldx;
  const int64_t prefetch_lines = next == nullptr ? 0 : kc * kPanelWidth / 16;  // 64-byte lines
  for (int64_t k = 0; k < kc; ++k) {
    const float* row = panel + k * kPanelWidth;
    // Lines 3k/2 and 3k/2 + 1 of the next slice (1.5 lines per k covers all of it).
    const int64_t line = k + k / 2;
    if (line < prefetch_lines) {
      _mm_prefetch(reinterpret_cast<const char*>(next + 16 * line), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + 16 * (line + 1)), _MM_HINT_T1);
    }
    __m256 b0 = _mm256_loadu_ps(row);
    __m256 b1 = _mm256_loadu_ps(row + 8);
    __m256 b2 = _mm256_loadu_ps(row + 16);
    // Keeps the weights in registers: folded into each FMA they would be loaded once per row
    // (16 loads per k instead of 7), and Zen 3 issues only two 256-bit loads per cycle.
    asm("" : "+x"(b0), "+x"(b1), "+x"(b2));
    __m256 a = _mm256_broadcast_ss(x0 + k);
    a00 = _mm256_fmadd_ps(a, b0, a00);
    a01 = _mm256_fmadd_ps(a, b1, a01);
    a02 = _mm256_fmadd_ps(a, b2, a02);
    if constexpr (kRows > 1) {
      a = _mm256_broadcast_ss(x1 + k);
      a10 = _mm256_fmadd_ps(a, b0, a10);
      a11 = _mm256_fmadd_ps(a, b1, a11);
      a12 = _mm256_fmadd_ps(a, b2, a12);
    }
    if constexpr (kRows > 2) {
      a = _mm256_broadcast_ss(x2 + k);
      a20 = _mm256_fmadd_ps(a, b0, a20);
      a21 = _mm256_fmadd_ps(a, b1, a21);
      a22 = _mm256_fmadd_ps(a, b2, a22);
    }
    if constexpr (kRows > 3) {
      a = _mm256_broadcast_ss(x3 + k);
      a30 = _mm256_fmadd_ps(a, b0, a30);
      a31 = _mm256_fmadd_ps(a, b1, a31);
      a32 = _mm256_fmadd_ps(a, b2, a32);
    }
  }
  const __m256 sums[kTileRows][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22},
                                     {a30, a31, a32}};
  for (int i = 0; i < kRows; ++i) {
    float* out = c + i * ldc;
    for (int j = 0; j < 3; ++j) {
      const __m256 prior = accumulate ? _mm256_loadu_ps(out + 8 * j) : _mm256_setzero_ps();
      _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(prior, sums[i][j]));
    }
  }
}
#else
constexpr bool kHasSimd = false;

template <int kRows>
inline void Tile(int64_t kc, const float* x, int64_t ldx, const float* panel, float* c,
                 int64_t ldc, bool accumulate, const float*) {
  for (int i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kPanelWidth; ++j) {
      float total = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < kc; ++k) total += x[i * ldx + k] * panel[k * kPanelWidth + j];
      c[i * ldc + j] = total;
    }
  }
}
#endif

// out[m0:m1, n0:n1] = x[m0:m1, :] @ w[:, n0:n1] for packed panels; n0 and n1 are multiples of
// the panel width.
inline void MatmulBlock(const float* x, const float* packed, float* out, int64_t K, int64_t N,
                        int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t k0 = 0; k0 < K; k0 += kBlockDepth) {
    const int64_t kc = std::min(kBlockDepth, K - k0);
    const bool accumulate = k0 > 0;
    for (int64_t first = n0; first < n1; first += kPanelWidth) {
      const float* panel = packed + ((first / kPanelWidth) * K + k0) * kPanelWidth;
      // The slice read next: the block's next panel, else its first panel one k-block deeper.
      const float* next = nullptr;
      if (first + kPanelWidth < n1) {
        next = panel + K * kPanelWidth;
      } else if (k0 + kBlockDepth < K) {
        next = packed + ((n0 / kPanelWidth) * K + k0 + kBlockDepth) * kPanelWidth;
      }
      for (int64_t m = m0; m < m1; m += kTileRows) {
        const float* xs = x + m * K + k0;
        float* c = out + m * N + first;
        const float* ahead = m == m0 ? next : nullptr;
        switch (std::min(kTileRows, m1 - m)) {
          case 4: Tile<4>(kc, xs, K, panel, c, N, accumulate, ahead); break;
          case 3: Tile<3>(kc, xs, K, panel, c, N, accumulate, ahead); break;
          case 2: Tile<2>(kc, xs, K, panel, c, N, accumulate, ahead); break;
          default: Tile<1>(kc, xs, K, panel, c, N, accumulate, ahead); break;
        }
      }
    }
  }
}

}  // namespace jaxgen_cpu
