// Dense float32 matmul out[M, N] = x[M, K] @ w[K, N] over weights packed once into panels,
// blocked for AVX2 + FMA.
//
// Packed layout: [N / 24, K, 24], panel p holding columns [24p, 24p + 24) row after row, so a
// panel streams contiguously (from a row-major w a panel's rows, N floats apart, would map onto
// few cache sets: for N = 1536 only 32 of the L2's). A 4 x 24 register tile runs over a 256-deep
// slice of a panel (24 KB, kept in L1 while every row tile of the block passes over it): 12
// accumulators, three weight vectors and one broadcast of x per k. Full 4-row tiles run in
// inline assembly (Tile4), ragged ones (1-3 rows) on intrinsics (Tile). Without AVX2 + FMA a
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

// Prefetching (both tiles): `next` (may be null) points into the panel slice the block reads
// after this one; the tile fetches `next_lines` 64-byte lines from it into L2 while it runs.
// MatmulBlock gives every row tile of a slice its share of the next slice, so weights streaming
// from memory neither stall the first tile of each slice nor arrive in one burst.

// One k of the 4 x 24 tile: three weight vectors (ymm12-14) at byte offset W of the panel row
// pointer, each of four x values (byte offset X of rows 0-3) broadcast into ymm15 and multiplied
// into that row's three accumulators (ymm0-11).
#define JAXGEN_TILE4_STEP(X, W)                                                    \
  "vmovups " #W "(%[panel]), %%ymm12\n\t"                                          \
  "vmovups " #W "+32(%[panel]), %%ymm13\n\t"                                       \
  "vmovups " #W "+64(%[panel]), %%ymm14\n\t"                                       \
  "vbroadcastss " #X "(%[row0]), %%ymm15\n\t"                                      \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm0\n\t"                                       \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm1\n\t"                                       \
  "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"                                       \
  "vbroadcastss " #X "(%[row0],%[stride]), %%ymm15\n\t"                            \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm3\n\t"                                       \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm4\n\t"                                       \
  "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"                                       \
  "vbroadcastss " #X "(%[row2]), %%ymm15\n\t"                                      \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t"                                       \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t"                                       \
  "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"                                       \
  "vbroadcastss " #X "(%[row2],%[stride]), %%ymm15\n\t"                            \
  "vfmadd231ps %%ymm12, %%ymm15, %%ymm9\n\t"                                       \
  "vfmadd231ps %%ymm13, %%ymm15, %%ymm10\n\t"                                      \
  "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"

#define JAXGEN_TILE4_FOUR_STEPS                                                    \
  JAXGEN_TILE4_STEP(0, 0)                                                          \
  JAXGEN_TILE4_STEP(4, 96)                                                         \
  JAXGEN_TILE4_STEP(8, 192)                                                        \
  JAXGEN_TILE4_STEP(12, 288)                                                       \
  "add $384, %[panel]\n\t"                                                         \
  "add $16, %[row0]\n\t"                                                           \
  "add $16, %[row2]\n\t"

// c[4, 24] (+)= x[4, kc] @ panel[kc, 24], the tile every full row tile runs. In assembly, four k
// per loop pass: unrolled intrinsics made GCC spill accumulators (the 12 accumulators, three
// weights and the broadcast take all 16 vector registers). Against the intrinsics loop below
// (one k per pass, a prefetch test per k), two threads each running their half of a matmul's
// columns went from 113-118 to 140-152 GFLOP/s at 512 x 576 x 1536 and from 108-139 to 132-139
// at 64 rows (benchmarks/matmul_tile.cc, docs/kernels.md). Prefetches six lines of `next` per
// four k until `next_lines` are covered.
__attribute__((noinline)) inline void Tile4(int64_t kc, const float* x, int64_t ldx,
                                            const float* panel, float* c, int64_t ldc,
                                            bool accumulate, const float* next,
                                            int64_t next_lines) {
  alignas(32) float sums[kTileRows * kPanelWidth];
  int64_t fetching = next == nullptr ? 0 : std::min(kc / 4, (next_lines + 5) / 6);
  int64_t quads = kc / 4 - fetching, rest = kc % 4;
  const float* row0 = x;
  const float* row2 = x + 2 * ldx;
  const int64_t stride = ldx * static_cast<int64_t>(sizeof(float));
  asm volatile(
      "vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
      "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
      "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"
      "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"
      "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"
      "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"
      "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"
      "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"
      "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"
      "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"
      "vxorps %%xmm10, %%xmm10, %%xmm10\n\t"
      "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"
      "test %[fetching], %[fetching]\n\t"
      "jz 2f\n\t"
      "1:\n\t"  // four k, prefetching six lines
      "prefetcht1 (%[next])\n\t"
      "prefetcht1 64(%[next])\n\t"
      "prefetcht1 128(%[next])\n\t"
      "prefetcht1 192(%[next])\n\t"
      "prefetcht1 256(%[next])\n\t"
      "prefetcht1 320(%[next])\n\t"
      JAXGEN_TILE4_FOUR_STEPS
      "add $384, %[next]\n\t"
      "dec %[fetching]\n\t"
      "jnz 1b\n\t"
      "2:\n\t"
      "test %[quads], %[quads]\n\t"
      "jz 3f\n\t"
      "6:\n\t"  // four k
      JAXGEN_TILE4_FOUR_STEPS
      "dec %[quads]\n\t"
      "jnz 6b\n\t"
      "3:\n\t"  // the last kc % 4, one k at a time
      "test %[rest], %[rest]\n\t"
      "jz 5f\n\t"
      "4:\n\t"
      JAXGEN_TILE4_STEP(0, 0)
      "add $96, %[panel]\n\t"
      "add $4, %[row0]\n\t"
      "add $4, %[row2]\n\t"
      "dec %[rest]\n\t"
      "jnz 4b\n\t"
      "5:\n\t"
      "vmovaps %%ymm0, (%[sums])\n\t"
      "vmovaps %%ymm1, 32(%[sums])\n\t"
      "vmovaps %%ymm2, 64(%[sums])\n\t"
      "vmovaps %%ymm3, 96(%[sums])\n\t"
      "vmovaps %%ymm4, 128(%[sums])\n\t"
      "vmovaps %%ymm5, 160(%[sums])\n\t"
      "vmovaps %%ymm6, 192(%[sums])\n\t"
      "vmovaps %%ymm7, 224(%[sums])\n\t"
      "vmovaps %%ymm8, 256(%[sums])\n\t"
      "vmovaps %%ymm9, 288(%[sums])\n\t"
      "vmovaps %%ymm10, 320(%[sums])\n\t"
      "vmovaps %%ymm11, 352(%[sums])\n\t"
      : [panel] "+r"(panel), [row0] "+r"(row0), [row2] "+r"(row2), [next] "+r"(next),
        [quads] "+r"(quads), [fetching] "+r"(fetching), [rest] "+r"(rest)
      : [stride] "r"(stride), [sums] "r"(sums)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
  for (int i = 0; i < kTileRows; ++i) {
    float* out = c + i * ldc;
    for (int j = 0; j < 3; ++j) {
      const __m256 sum = _mm256_load_ps(sums + i * kPanelWidth + 8 * j);
      const __m256 prior = accumulate ? _mm256_loadu_ps(out + 8 * j) : _mm256_setzero_ps();
      _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(prior, sum));
    }
  }
}

#undef JAXGEN_TILE4_FOUR_STEPS
#undef JAXGEN_TILE4_STEP

// c[rows, 24] (+)= x[rows, kc] @ panel[kc, 24] for ragged tiles (1-3 rows; Tile4 runs full
// ones). The accumulators are named variables, not an array: GCC kept an array's rows in memory.
// Never inlined: the tile needs all 16 vector registers, and inlined into a caller (a standalone
// build of MatmulBlock) GCC spilled an accumulator to the stack, a store-to-load chain through
// every k: 37-42 instead of 65-93 GFLOP/s on one core here.
template <int kRows>
__attribute__((noinline)) void Tile(int64_t kc, const float* x, int64_t ldx, const float* panel,
                                    float* c, int64_t ldc, bool accumulate, const float* next,
                                    int64_t next_lines) {
  static_assert(kRows < kTileRows, "full tiles run Tile4");
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
  __m256 a20 = a00, a21 = a00, a22 = a00;
  const float* x0 = x;
  const float* x1 = x + ldx;
  const float* x2 = x + 2 * ldx;
  const int64_t prefetch_lines = next == nullptr ? 0 : next_lines;
  for (int64_t k = 0; k < kc; ++k) {
    const float* row = panel + k * kPanelWidth;
    // Two lines per k, lines 3k/2 and 3k/2 + 1, until `next_lines` are covered.
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
  }
  const __m256 sums[kTileRows - 1][3] = {{a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}};
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
                 int64_t ldc, bool accumulate, const float*, int64_t);

inline void Tile4(int64_t kc, const float* x, int64_t ldx, const float* panel, float* c,
                  int64_t ldc, bool accumulate, const float* next, int64_t next_lines) {
  Tile<kTileRows>(kc, x, ldx, panel, c, ldc, accumulate, next, next_lines);
}

template <int kRows>
inline void Tile(int64_t kc, const float* x, int64_t ldx, const float* panel, float* c,
                 int64_t ldc, bool accumulate, const float*, int64_t) {
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
      // Every row tile prefetches its share of the next slice's lines (1.5 per k).
      const int64_t tiles = (m1 - m0 + kTileRows - 1) / kTileRows;
      const int64_t slice_lines = kc * kPanelWidth / 16;
      for (int64_t m = m0, t = 0; m < m1; m += kTileRows, ++t) {
        const float* xs = x + m * K + k0;
        float* c = out + m * N + first;
        const int64_t line = slice_lines * t / tiles;
        const int64_t lines = slice_lines * (t + 1) / tiles - line;
        const float* ahead = next == nullptr ? nullptr : next + 16 * line;
        switch (std::min(kTileRows, m1 - m)) {
          case 4: Tile4(kc, xs, K, panel, c, N, accumulate, ahead, lines); break;
          case 3: Tile<3>(kc, xs, K, panel, c, N, accumulate, ahead, lines); break;
          case 2: Tile<2>(kc, xs, K, panel, c, N, accumulate, ahead, lines); break;
          default: Tile<1>(kc, xs, K, panel, c, N, accumulate, ahead, lines); break;
        }
      }
    }
  }
}

}  // namespace jaxgen_cpu
