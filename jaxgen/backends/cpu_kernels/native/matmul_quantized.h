// Quantised-weight matmul out[M, N] = x[M, K] @ dequant(w)[K, N] for AVX2 + FMA + F16C, the
// weights dequantised in registers, never written back to memory. The packed layout and its
// decoding: quantized_panels.h; the one-row tiles (decode's hot loop): quantized_row_tiles.h.
// A tile of up to 4 rows x 16 columns keeps its 8 accumulators, the group's scales and minimums
// (4 vectors) and the two dequantised weight vectors of a k in 15 of the 16 vector registers.
// Where the compiler targets AVX-512 (-march=native), one-row int8 tiles, int4 tiles of up to 4
// rows (1-8 rows of int4: decode's row, a verify step's draft rows, small batches) and the
// float tiles over a dequantised slice use 512-bit vectors (a 16-column panel row is one
// vector).
// Without AVX2 + FMA + F16C a portable loop stands in (kQuantizedSimd is false; callers keep
// the XLA path).

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "float_slice_tiles.h"
#include "quantized_panels.h"
#include "quantized_row_tiles.h"

namespace jaxgen_cpu {

#if defined(JAXGEN_QUANTIZED_SIMD)
// c[R, 16] (+)= x[R, k0:k1] @ dequant(panel)[k0:k1, 16]; `values` points at the panel's k0 row
// (int8) or its 8-row block k0 / 8 (int4), `scales` / `mins` at the panel's first group row.
// Codes are dequantised (integer to float, one FMA or multiply for the group's scale and
// minimum) once per k and multiplied into every row's two accumulators. One int8 row instead
// sums x * code over the group and scales once, with separate accumulators for even and odd k
// (four FMA chains instead of two); one int4 row runs Int4RowTile.
template <int R, bool kInt4, typename S>
__attribute__((noinline)) void QuantizedTile(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                             const float* x, int64_t ldx, const uint8_t* values,
                                             const S* scales, const S* mins,
                                             float* c, int64_t ldc, bool accumulate) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  if constexpr (kInt4 && R == 1) {
    if (w.codebook) {
      BookRowGroups(w, k0, k1, x, values, scales, acc[0]);
    } else {
      ForEachInt4Row(w, k0, k1, values, scales, mins, [&](int64_t k, __m256 e0, __m256 e1) {
        acc[0][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k), e0, acc[0][0]);
        acc[0][1] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k), e1, acc[0][1]);
      });
    }
  } else if constexpr (kInt4) {
    ForEachInt4Row(w, k0, k1, values, scales, mins, [&](int64_t k, __m256 e0, __m256 e1) {
      for (int r = 0; r < R; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
        acc[r][0] = _mm256_fmadd_ps(a, e0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, e1, acc[r][1]);
      }
    });
  } else {
    for (int64_t k = k0; k < k1;) {
      const int64_t g = k / w.group;
      const int64_t end = std::min(k1, (g + 1) * w.group);
      const __m256 s0 = LoadScales8(scales + g * kQuantPanel);
      const __m256 s1 = LoadScales8(scales + g * kQuantPanel + 8);
      if constexpr (R == 1) {
        // One row: sum x * code over the group, then apply the scale once.
        __m256 e0 = _mm256_setzero_ps(), e1 = e0, o0 = e0, o1 = e0;
        for (; k < end; ++k) {
          const __m128i c0 =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + (k - k0) * kQuantPanel));
          const __m256 a = _mm256_broadcast_ss(x + k);
          if ((k - k0) & 1) {
            o0 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0)), o0);
            o1 = _mm256_fmadd_ps(
                a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8))), o1);
          } else {
            e0 = _mm256_fmadd_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0)), e0);
            e1 = _mm256_fmadd_ps(
                a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8))), e1);
          }
        }
        acc[0][0] = _mm256_fmadd_ps(_mm256_add_ps(e0, o0), s0, acc[0][0]);
        acc[0][1] = _mm256_fmadd_ps(_mm256_add_ps(e1, o1), s1, acc[0][1]);
      } else {
        for (; k < end; ++k) {
          const __m128i codes =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + (k - k0) * kQuantPanel));
          const __m256 e0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s0);
          const __m256 e1 = _mm256_mul_ps(
              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8))), s1);
          for (int r = 0; r < R; ++r) {
            const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(a, e0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, e1, acc[r][1]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = c + r * ldc;
    for (int j = 0; j < 2; ++j) {
      const __m256 prior = accumulate ? _mm256_loadu_ps(out + 8 * j) : _mm256_setzero_ps();
      _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(prior, acc[r][j]));
    }
  }
}

// int8 rows up to this many take 4-row tiles (Int8RowsTileWide with AVX-512, else
// Int8RowsTile), not a shared slice: 5-8 rows of 1 x 576 x 1024 int8 (one thread,
// cache-resident) in 150 / 182 us against 155 / 224 with Int8RowsTile.
constexpr int64_t kInt8TileRows = 8;
// int4 rows up to this many take Int4RowsTileWide's tiles (AVX-512), not a shared slice: rows
// 2 / 3 / 4 / 5 / 8 of 576 x 1536 int4 (two threads, streamed) in about 15 / 18 / 20 / 42 / 57 us
// against 29 / 31 / 37 / 65 / 73 (benchmarks/matmul_quantized_tile.cc).
constexpr int64_t kInt4TileRows = 8;
// The most rows one 512-bit row tile takes (more: tiles as even as the rows allow). Five rows
// of 576 x 1536 int4 (two threads, streamed) in 28.8 us against 37.9 in two tiles, of the 576
// x 49152 int8 LM head in 1.02 ms against 1.69; six in one tile (38.8 us) were no faster than
// 4 + 2 rows (34.9: two rows cost what one does).
constexpr int64_t kWideTileRows = 5;
#if defined(__AVX512F__)
// Rows up to this many stream the weights (ColumnBlockPanels' one stretch per thread): the
// register tiles above take them whole. 5 / 8 rows of the 576 x 49152 int8 LM head (two
// threads) in about 1.0 / 1.2 ms in stretches, against 1.7 / 2.2 ms in 8-panel blocks.
constexpr int64_t kQuantizedStreamRows = 8;
// Float rows up to this many are one row block of the engine's call (one tile, the weights
// read once), not 4-row blocks the threads share.
constexpr int64_t kWholeBlockRows = kWideTileRows;
#else
constexpr int64_t kQuantizedStreamRows = 4;
constexpr int64_t kWholeBlockRows = 0;
#endif

// c[rows, 16] (+)= x[rows, :kc] @ slice[kc, 16] for rows <= R (FloatTile16Wide with AVX-512,
// else FloatTile16).
template <int R>
inline void SliceTile(int64_t rows, int64_t kc, const float* x, int64_t ldx, const float* slice,
                      float* c, int64_t ldc, bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R) return SliceTile<R - 1>(rows, kc, x, ldx, slice, c, ldc, accumulate);
  }
#if defined(__AVX512F__)
  FloatTile16Wide<R>(kc, x, ldx, slice, c, ldc, accumulate);
#else
  FloatTile16<R>(kc, x, ldx, slice, c, ldc, accumulate);
#endif
}
#else

template <int R, bool kInt4, typename S>
void QuantizedTile(const QuantizedPanels& w, int64_t k0, int64_t k1, const float* x, int64_t ldx,
                   const uint8_t* values, const S* scales, const S* mins, float* c,
                   int64_t ldc, bool accumulate) {
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kQuantPanel; ++j) {
      float total = accumulate ? c[r * ldc + j] : 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t g = k / w.group;
        const float scale = ScaleToFloat(scales[g * kQuantPanel + j]);
        float weight;
        if (kInt4) {
          const int64_t row = k - k0;  // lane j of block row / 8, nibble row % 8
          const uint8_t byte = values[row / kInt4BlockRows * 4 * kQuantPanel + 4 * j +
                                      row % kInt4BlockRows / 2];
          const int u = (row & 1) ? byte >> 4 : byte & 0x0F;
          weight = w.codebook ? scale * static_cast<float>(w.codebook[u])
                              : scale * static_cast<float>(u) +
                                    ScaleToFloat(mins[g * kQuantPanel + j]);
        } else {
          weight = scale * static_cast<float>(static_cast<int8_t>(values[(k - k0) * kQuantPanel + j]));
        }
        total += x[r * ldx + k] * weight;
      }
      c[r * ldc + j] = total;
    }
  }
}
#endif

// out[m0:m1, n0:n1] = x[m0:m1, :] @ dequant(w)[:, n0:n1]; n0, n1 multiples of the panel width.
// One 4-row tile dequantises in registers (1-8 int4 rows with AVX-512: Int4RowsTileWide, one
// tile up to 5 rows, else tiles as even as the rows allow; else one int4 row: Int4RowTile;
// int4 rows scaled once into `scratch`; 1-8 int8 rows with AVX-512: Int8RowsTileWide, the
// same tiles, else 2-8: Int8RowsTile's 4-row tiles); a block of more rows dequantises each 256 x 16 slice once into an L1-resident buffer
// and runs float tiles over it (SIMD builds). kTwoLevel (S float): a panel's scales and minimums
// are formed from its super-block numbers and codes for the groups each pass reads
// (ExpandPanelScales), then the same tiles run on them.
template <bool kInt4, typename S, bool kTwoLevel = false>
void QuantizedMatmulBlock(const QuantizedPanels& w, const float* x, float* out, int64_t m0,
                          int64_t m1, int64_t n0, int64_t n1, std::vector<float>& scratch) {
  static_assert(!kTwoLevel || std::is_same_v<S, float>, "two-level scales expand to float32");
  thread_local std::vector<float> expanded;  // kTwoLevel: a panel's scales and minimums
  const int64_t K = w.depth, N = w.columns;
  const int64_t groups = K / w.group;
  const int64_t row_bytes = kInt4 ? kQuantPanel / 2 : kQuantPanel;  // bytes of codes per k
  // int8 rows of 2 to kInt8TileRows: 4-row tiles (no shared slice).
  [[maybe_unused]] const bool int8_rows =
      kQuantizedSimd && !kInt4 && m1 - m0 > 1 && m1 - m0 <= kInt8TileRows;
#if defined(__AVX512F__)
  // int4 rows of 1 to kInt4TileRows: Int4RowsTileWide over tiles of up to kWideTileRows rows.
  const bool int4_rows = kQuantizedSimd && kInt4 && m1 - m0 <= kInt4TileRows && !w.codebook;
#else
  const bool int4_rows = false;
#endif
  const bool shared_slice = kQuantizedSimd && m1 - m0 > 4 && !int8_rows && !int4_rows;
  // (A codebook weight's 1-4 rows take QuantizedTile, which looks its codes up.)
  const bool int4_row = kQuantizedSimd && kInt4 && m1 - m0 == 1 && !int4_rows && !w.codebook;
  [[maybe_unused]] const bool one_row = kQuantizedSimd && m1 - m0 == 1;
#if defined(JAXGEN_QUANTIZED_SIMD)
  if (int4_row) {
    scratch.resize(K);
    ScaleRowForInt4(x + m0 * K, K, scratch.data());
  }
#if defined(__AVX512F__)
  // Per row: K scaled floats, then the row's group sums.
  const int64_t scratch_ld = K + groups;
  if (int4_rows) {
    scratch.resize((m1 - m0) * scratch_ld);
    for (int64_t m = m0; m < m1; ++m) {
      float* row = scratch.data() + (m - m0) * scratch_ld;
      ScaleRowForInt4(x + m * K, K, row);
      Int4GroupSums(x + m * K, K, w.group, row + K);
    }
  }
#endif
#endif
  alignas(64) float slice[kQuantBlockDepth * kQuantPanel];  // 64: FloatTile16Wide's loads
  // Tiles of at most 4 rows take a panel's whole depth at once (x's rows stay in L1 anyway), so
  // an item streams its panels' codes front to back; shared slices go 256 rows at a time.
  const int64_t block_depth = shared_slice ? kQuantBlockDepth : K;
  for (int64_t k0 = 0; k0 < K; k0 += block_depth) {
    const int64_t k1 = std::min(K, k0 + block_depth);
    const bool accumulate = k0 > 0;
    for (int64_t first = n0; first < n1; first += kQuantPanel) {
      const int64_t panel = first / kQuantPanel;
      const uint8_t* values = w.values + panel * K * row_bytes + k0 * row_bytes;
      PanelScales<S> panel_scales;
      if constexpr (kTwoLevel) {
        panel_scales = ExpandPanelScales(w, panel, k0 / w.group, (k1 + w.group - 1) / w.group,
                                         expanded);
      } else {
        panel_scales = StoredPanelScales<S>(w, panel);
      }
      const S* scales = panel_scales.scales;
      const S* mins = kInt4 ? panel_scales.mins : nullptr;
#if defined(JAXGEN_QUANTIZED_SIMD)
      if (shared_slice) {
        DequantizeSlice<kInt4>(w, k0, k1, values, scales, mins, slice);
        for (int64_t m = m0; m < m1; m += kSliceTileRows) {
          SliceTile<kSliceTileRows>(m1 - m, k1 - k0, x + m * K + k0, K, slice,
                                    out + m * N + first, N, accumulate);
        }
        continue;
      }
#if defined(__AVX512F__)
      if (int4_rows) {
        // One tile up to 5 rows, else tiles as even as the rows allow (7 rows: 4 + 3).
        const int64_t tiles = m1 - m0 <= kWideTileRows ? 1 : (m1 - m0 + 3) / 4;
        for (int64_t t = 0, m = m0; t < tiles; ++t) {
          const int64_t height = (m1 - m + (tiles - t) - 1) / (tiles - t);
          const float* scaled = scratch.data() + (m - m0) * scratch_ld;
          const float* sums = scaled + K;
          float* c = out + m * N + first;
          switch (height) {
            case 5: Int4RowsTileWide<5>(w, k0, k1, scaled, sums, scratch_ld, values, scales, mins, c, N, accumulate); break;
            case 4: Int4RowsTileWide<4>(w, k0, k1, scaled, sums, scratch_ld, values, scales, mins, c, N, accumulate); break;
            case 3: Int4RowsTileWide<3>(w, k0, k1, scaled, sums, scratch_ld, values, scales, mins, c, N, accumulate); break;
            case 2: Int4RowsTileWide<2>(w, k0, k1, scaled, sums, scratch_ld, values, scales, mins, c, N, accumulate); break;
            default: Int4RowsTileWide<1>(w, k0, k1, scaled, sums, scratch_ld, values, scales, mins, c, N, accumulate); break;
          }
          m += height;
        }
        continue;
      }
      if constexpr (!kInt4) {
        if (one_row || int8_rows) {  // 1-8 int8 rows: one tile up to 5, else as even as can be
          const int64_t tiles = m1 - m0 <= kWideTileRows ? 1 : (m1 - m0 + 3) / 4;
          for (int64_t t = 0, m = m0; t < tiles; ++t) {
            const int64_t height = (m1 - m + (tiles - t) - 1) / (tiles - t);
            const float* xs = x + m * K;
            float* c = out + m * N + first;
            switch (height) {
              case 5: Int8RowsTileWide<5>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
              case 4: Int8RowsTileWide<4>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
              case 3: Int8RowsTileWide<3>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
              case 2: Int8RowsTileWide<2>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
              default: Int8RowsTileWide<1>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
            }
            m += height;
          }
          continue;
        }
      }
#endif
      if (int4_row) {
        Int4RowTile(w, k0, k1, x + m0 * K, scratch.data(), values, scales, mins,
                    out + m0 * N + first, accumulate);
        continue;
      }
      if (int8_rows) {
        for (int64_t m = m0; m < m1; m += 4) {
          const float* xs = x + m * K;
          float* c = out + m * N + first;
          switch (std::min<int64_t>(4, m1 - m)) {
            case 4: Int8RowsTile<4>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
            case 3: Int8RowsTile<3>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
            case 2: Int8RowsTile<2>(w, k0, k1, xs, K, values, scales, c, N, accumulate); break;
            default: QuantizedTile<1, false>(w, k0, k1, xs, K, values, scales, mins, c, N, accumulate); break;
          }
        }
        continue;
      }
#endif
      for (int64_t m = m0; m < m1; m += 4) {
        const float* xs = x + m * K;
        float* c = out + m * N + first;
        switch (std::min<int64_t>(4, m1 - m)) {
          case 4: QuantizedTile<4, kInt4>(w, k0, k1, xs, K, values, scales, mins, c, N, accumulate); break;
          case 3: QuantizedTile<3, kInt4>(w, k0, k1, xs, K, values, scales, mins, c, N, accumulate); break;
          case 2: QuantizedTile<2, kInt4>(w, k0, k1, xs, K, values, scales, mins, c, N, accumulate); break;
          default: QuantizedTile<1, kInt4>(w, k0, k1, xs, K, values, scales, mins, c, N, accumulate); break;
        }
      }
    }
  }
}

// out[m0:m1, n0:n1] += sum over groups g of xsum[m, g] * mins[g, n0:n1], xsum[m, g] the sum of
// x[m] over group g: an int8 weight's minimums (GGUF's Q5_1 and Q5_K: codes 0..31 and a
// minimum per group), added after QuantizedMatmulBlock's products of the codes. The int4 tiles
// fold their minimums into each group instead; an int8 weight adds G * 16 FMAs per row and panel
// to its K * 16 (1/32 more), so its tiles stay those of the weights without minimums.
// kTwoLevel (S float): the minimums formed from super-block numbers and codes per panel.
template <typename S, bool kTwoLevel = false>
void AddGroupMins(const QuantizedPanels& w, const float* x, float* out, int64_t m0, int64_t m1,
                  int64_t n0, int64_t n1) {
  static_assert(!kTwoLevel || std::is_same_v<S, float>, "two-level minimums expand to float32");
  const int64_t K = w.depth, N = w.columns, groups = K / w.group;
  thread_local std::vector<float> sums, expanded;
  sums.resize(groups);
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * K;
    for (int64_t g = 0; g < groups; ++g) {
      float total = 0.0f;
      for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k) total += row[k];
      sums[g] = total;
    }
    for (int64_t first = n0; first < n1; first += kQuantPanel) {
      const int64_t panel = first / kQuantPanel;
      const S* mins;
      if constexpr (kTwoLevel) {
        mins = ExpandPanelScales(w, panel, 0, groups, expanded).mins;
      } else {
        mins = StoredPanelScales<S>(w, panel).mins;
      }
      float* c = out + m * N + first;
#if defined(JAXGEN_QUANTIZED_SIMD)
      __m256 c0 = _mm256_loadu_ps(c), c1 = _mm256_loadu_ps(c + 8);
      for (int64_t g = 0; g < groups; ++g) {
        const __m256 total = _mm256_set1_ps(sums[g]);
        c0 = _mm256_fmadd_ps(total, LoadScales8(mins + g * kQuantPanel), c0);
        c1 = _mm256_fmadd_ps(total, LoadScales8(mins + g * kQuantPanel + 8), c1);
      }
      _mm256_storeu_ps(c, c0);
      _mm256_storeu_ps(c + 8, c1);
#else
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < kQuantPanel; ++j) {
          c[j] += sums[g] * ScaleToFloat(mins[g * kQuantPanel + j]);
        }
      }
#endif
    }
  }
}

}  // namespace jaxgen_cpu
