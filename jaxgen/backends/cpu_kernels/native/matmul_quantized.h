// Quantised-weight matmul out[M, N] = x[M, K] @ dequant(w)[K, N] for AVX2 + FMA + F16C, the
// weights dequantised in registers, never written back to memory.
//
// Packed layout (pack_quantized in matmul_quantized.py), panels of 16 columns (two 8-float
// vectors) whose rows stream contiguously, as the float32 kernel's 24-column panels do:
//   int8: values [N / 16, K, 16] int8;          w[k, n] = scale[g, n] * value
//   int4: values [N / 16, K / 2, 16] uint8,     w[k, n] = scale[g, n] * u + min[g, n]
//         each block of 8 rows k0..k0 + 7 is 64 bytes: 16 little-endian uint32 lanes, lane n
//         holding u of row k0 + j in bits 4j..4j + 3 (a symmetric int4 weight packs
//         min = -8 * scale). A code comes out of its lane with one AND (or a shift for j = 7)
//         and one conversion, as u * 16^j: the one-row tile multiplies it by x[k] * 16^-j
//         (exact: a power of two), so decoding needs no shuffles;
//   scales, mins: [N / 16, K / group, 16] float16 (GGUF's own scale type), g = k / group.
// A tile of up to 4 rows x 16 columns keeps its 8 accumulators, the group's scales and minimums
// (4 vectors) and the two dequantised weight vectors of a k in 15 of the 16 vector registers.
// Where the compiler targets AVX-512 (-march=native), one-row tiles and the float tiles over a
// dequantised slice use 512-bit vectors (a 16-column panel row is one vector).
// Without AVX2 + FMA + F16C a portable loop stands in (kQuantizedSimd is false; callers keep
// the XLA path).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define JAXGEN_QUANTIZED_SIMD 1
#endif

namespace jaxgen_cpu {

constexpr int64_t kQuantPanel = 16;        // columns per panel: two 8-float vectors
constexpr int64_t kQuantBlockDepth = 256;  // k-block: x rows of it stay in L1 across panels
constexpr int64_t kInt4BlockRows = 8;      // rows of int4 codes in one uint32 lane

// A quantised weight as the kernel reads it.
struct QuantizedPanels {
  const uint8_t* values;   // int8 or packed uint4 codes, layout above
  const uint16_t* scales;  // float16 bits
  const uint16_t* mins;    // float16 bits; null for int8
  int64_t depth, columns, group;  // K, N (padded to 16), rows per scale group
  bool int4;
};

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400)) {
      m <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

#if defined(JAXGEN_QUANTIZED_SIMD)
constexpr bool kQuantizedSimd = true;

inline float HorizontalSum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline __m256 LoadHalf8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Row j (0..7) of an 8-row int4 block, from its uint32 lanes: u * 16^j (j < 7) or u (j = 7),
// exact in int32 and after conversion to float.
template <int J>
inline __m256i Int4LaneCode(__m256i lanes) {
  if constexpr (J == 7) {
    return _mm256_srli_epi32(lanes, 28);
  } else {
    return _mm256_and_si256(lanes, _mm256_set1_epi32(0xF << (4 * J)));
  }
}

// Row j's u itself (shifted down), for tiles that dequantise before multiplying.
template <int J>
inline __m256 Int4LaneValue(__m256i lanes) {
  if constexpr (J == 0) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(lanes, _mm256_set1_epi32(0xF)));
  } else if constexpr (J == 7) {
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(lanes, 28));
  } else {
    return _mm256_cvtepi32_ps(
        _mm256_and_si256(_mm256_srli_epi32(lanes, 4 * J), _mm256_set1_epi32(0xF)));
  }
}

// x[k] * 16^-(k % 8) for k % 8 < 7, x[k] for k % 8 = 7: the one-row int4 tile's multiplier of
// Int4LaneCode (a power-of-two scaling: exact unless x[k] is near float's underflow).
inline void ScaleRowForInt4(const float* x, int64_t depth, float* scaled) {
  static constexpr float kScale[kInt4BlockRows] = {1.0f,         1.0f / 16,       1.0f / 256,
                                                   1.0f / 4096,  1.0f / 65536,    1.0f / 1048576,
                                                   1.0f / 16777216, 1.0f};
  for (int64_t k = 0; k < depth; ++k) scaled[k] = x[k] * kScale[k % kInt4BlockRows];
}

// c[16] (+)= x[k0:k1] @ dequant(panel)[k0:k1, 16] for one row of int4 codes (decode's hot loop):
// per group, sum scaled[k] * Int4LaneCode over eight independent accumulator pairs (one AND, one
// conversion and one FMA per 8 weights), then apply the group's scale, and its minimum times the
// group's sum of x, once. `scaled` is the row through ScaleRowForInt4; k0, k1 multiples of 8.
__attribute__((noinline)) inline void Int4RowTile(const QuantizedPanels& w, int64_t k0,
                                                  int64_t k1, const float* x,
                                                  const float* scaled, const uint8_t* values,
                                                  const uint16_t* scales, const uint16_t* mins,
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
    acc0 = _mm256_fmadd_ps(e0, LoadHalf8(scales + g * kQuantPanel), acc0);
    acc1 = _mm256_fmadd_ps(e1, LoadHalf8(scales + g * kQuantPanel + 8), acc1);
    acc0 = _mm256_fmadd_ps(sum_x, LoadHalf8(mins + g * kQuantPanel), acc0);
    acc1 = _mm256_fmadd_ps(sum_x, LoadHalf8(mins + g * kQuantPanel + 8), acc1);
  }
  const __m256 prior0 = accumulate ? _mm256_loadu_ps(c) : _mm256_setzero_ps();
  const __m256 prior1 = accumulate ? _mm256_loadu_ps(c + 8) : _mm256_setzero_ps();
  _mm256_storeu_ps(c, _mm256_add_ps(prior0, acc0));
  _mm256_storeu_ps(c + 8, _mm256_add_ps(prior1, acc1));
}

#if defined(__AVX512F__)
inline __m512 LoadHalf16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One row with 512-bit vectors, c[16] (+)= x[k0:k1] @ dequant(panel)[k0:k1, 16], per group:
// - int4 (Int4RowTile's scheme): one 64-byte load holds a block's 16 lanes, so each of its 8
//   rows is one AND (or shift), one conversion and one FMA with scaled[k] (the row through
//   ScaleRowForInt4) for all 16 columns; then the scale, and the minimum times the group's sum
//   of x, once.
// - int8 with float x (a kept GGUF's Q8_0 weights, its LM head among them; int8 quantised at
//   load takes integer x on VNNI, matmul_w8a8.h): per k one sign-extending load of the 16
//   codes, one conversion and one FMA with x[k]; then the scale once.
// Four accumulator chains; x broadcast from memory into each FMA.
template <bool kInt4>
__attribute__((noinline)) void RowTileWide(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                           const float* x, const float* scaled,
                                           const uint8_t* values, const uint16_t* scales,
                                           const uint16_t* mins, float* c, bool accumulate) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if constexpr (kInt4) {
      __m256 xs = _mm256_setzero_ps();
      for (int64_t j = k; j < end; j += 8) xs = _mm256_add_ps(xs, _mm256_loadu_ps(x + j));
      for (; k < end; k += kInt4BlockRows) {
        const __m512i v = _mm512_loadu_si512(values + (k - k0) * (kQuantPanel / 2));
        const float* xk = scaled + k;
#define JAXGEN_INT4_ROW_WIDE(J, A, CODE) \
  A = _mm512_fmadd_ps(_mm512_set1_ps(xk[J]), _mm512_cvtepi32_ps(CODE), A);
        JAXGEN_INT4_ROW_WIDE(0, a0, _mm512_and_si512(v, _mm512_set1_epi32(0xF)))
        JAXGEN_INT4_ROW_WIDE(1, a1, _mm512_and_si512(v, _mm512_set1_epi32(0xF0)))
        JAXGEN_INT4_ROW_WIDE(2, a2, _mm512_and_si512(v, _mm512_set1_epi32(0xF00)))
        JAXGEN_INT4_ROW_WIDE(3, a3, _mm512_and_si512(v, _mm512_set1_epi32(0xF000)))
        JAXGEN_INT4_ROW_WIDE(4, a0, _mm512_and_si512(v, _mm512_set1_epi32(0xF0000)))
        JAXGEN_INT4_ROW_WIDE(5, a1, _mm512_and_si512(v, _mm512_set1_epi32(0xF00000)))
        JAXGEN_INT4_ROW_WIDE(6, a2, _mm512_and_si512(v, _mm512_set1_epi32(0xF000000)))
        JAXGEN_INT4_ROW_WIDE(7, a3, _mm512_srli_epi32(v, 28))
#undef JAXGEN_INT4_ROW_WIDE
      }
      acc = _mm512_fmadd_ps(_mm512_set1_ps(HorizontalSum8(xs)),
                            LoadHalf16(mins + g * kQuantPanel), acc);
    } else {
      const uint8_t* codes = values + (k - k0) * kQuantPanel;
#define JAXGEN_INT8_ROW_WIDE(J, A)                                                         \
  A = _mm512_fmadd_ps(_mm512_set1_ps(x[k + J]),                                           \
                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(            \
                          reinterpret_cast<const __m128i*>(codes + J * kQuantPanel)))), \
                      A);
      for (; k + 4 <= end; k += 4, codes += 4 * kQuantPanel) {
        JAXGEN_INT8_ROW_WIDE(0, a0)
        JAXGEN_INT8_ROW_WIDE(1, a1)
        JAXGEN_INT8_ROW_WIDE(2, a2)
        JAXGEN_INT8_ROW_WIDE(3, a3)
      }
      for (; k < end; ++k, codes += kQuantPanel) JAXGEN_INT8_ROW_WIDE(0, a0)
#undef JAXGEN_INT8_ROW_WIDE
    }
    acc = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                          LoadHalf16(scales + g * kQuantPanel), acc);
  }
  const __m512 prior = accumulate ? _mm512_loadu_ps(c) : _mm512_setzero_ps();
  _mm512_storeu_ps(c, _mm512_add_ps(prior, acc));
}
#endif

// Calls f(J, e0, e1) for the 8 rows of an int4 block, each dequantised (u * scale + min) in
// two 8-float vectors.
template <typename F>
inline void ForInt4BlockRows(__m256i v0, __m256i v1, __m256 s0, __m256 s1, __m256 m0, __m256 m1,
                             F&& f) {
#define JAXGEN_INT4_DEQUANT(J) \
  f(J, _mm256_fmadd_ps(Int4LaneValue<J>(v0), s0, m0), _mm256_fmadd_ps(Int4LaneValue<J>(v1), s1, m1));
  JAXGEN_INT4_DEQUANT(0)
  JAXGEN_INT4_DEQUANT(1)
  JAXGEN_INT4_DEQUANT(2)
  JAXGEN_INT4_DEQUANT(3)
  JAXGEN_INT4_DEQUANT(4)
  JAXGEN_INT4_DEQUANT(5)
  JAXGEN_INT4_DEQUANT(6)
  JAXGEN_INT4_DEQUANT(7)
#undef JAXGEN_INT4_DEQUANT
}

// Calls f(k, e0, e1) for every row k in [k0, k1) of an int4 panel (k0, k1 multiples of 8),
// dequantised (u * scale + min) in two 8-float vectors; `values` points at block k0 / 8.
template <typename F>
inline void ForEachInt4Row(const QuantizedPanels& w, int64_t k0, int64_t k1,
                           const uint8_t* values, const uint16_t* scales, const uint16_t* mins,
                           F&& f) {
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    const __m256 s0 = LoadHalf8(scales + g * kQuantPanel);
    const __m256 s1 = LoadHalf8(scales + g * kQuantPanel + 8);
    const __m256 m0 = LoadHalf8(mins + g * kQuantPanel);
    const __m256 m1 = LoadHalf8(mins + g * kQuantPanel + 8);
    for (; k < end; k += kInt4BlockRows) {
      const uint8_t* block = values + (k - k0) * (kQuantPanel / 2);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32));
      ForInt4BlockRows(v0, v1, s0, s1, m0, m1,
                       [&](int j, __m256 e0, __m256 e1) { f(k + j, e0, e1); });
    }
  }
}

// c[R, 16] (+)= x[R, k0:k1] @ dequant(panel)[k0:k1, 16]; `values` points at the panel's k0 row
// (int8) or its 8-row block k0 / 8 (int4), `scales` / `mins` at the panel's first group row.
// Codes are dequantised (integer to float, one FMA or multiply for the group's scale and
// minimum) once per k and multiplied into every row's two accumulators. One int8 row instead
// sums x * code over the group and scales once, with separate accumulators for even and odd k
// (four FMA chains instead of two); one int4 row runs Int4RowTile.
template <int R, bool kInt4>
__attribute__((noinline)) void QuantizedTile(const QuantizedPanels& w, int64_t k0, int64_t k1,
                                             const float* x, int64_t ldx, const uint8_t* values,
                                             const uint16_t* scales, const uint16_t* mins,
                                             float* c, int64_t ldc, bool accumulate) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  if constexpr (kInt4) {
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
      const __m256 s0 = LoadHalf8(scales + g * kQuantPanel);
      const __m256 s1 = LoadHalf8(scales + g * kQuantPanel + 8);
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

// dst[k - k0, 16] = dequant(panel)[k0:k1, 16]: the slice a multi-tile row block shares, so the
// codes are converted once per block instead of once per 4-row tile.
template <bool kInt4>
void DequantizeSlice(const QuantizedPanels& w, int64_t k0, int64_t k1, const uint8_t* values,
                     const uint16_t* scales, const uint16_t* mins, float* dst) {
  if constexpr (kInt4) {
    ForEachInt4Row(w, k0, k1, values, scales, mins, [&](int64_t k, __m256 e0, __m256 e1) {
      _mm256_store_ps(dst + (k - k0) * kQuantPanel, e0);
      _mm256_store_ps(dst + (k - k0) * kQuantPanel + 8, e1);
    });
    return;
  }
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    const __m256 s0 = LoadHalf8(scales + g * kQuantPanel);
    const __m256 s1 = LoadHalf8(scales + g * kQuantPanel + 8);
    for (; k < end; ++k) {
      const __m128i codes =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + (k - k0) * kQuantPanel));
      float* row = dst + (k - k0) * kQuantPanel;
      _mm256_store_ps(row, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s0));
      _mm256_store_ps(row + 8, _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8))), s1));
    }
  }
}

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
constexpr bool kQuantizedSimd = false;

template <int R, bool kInt4>
void QuantizedTile(const QuantizedPanels& w, int64_t k0, int64_t k1, const float* x, int64_t ldx,
                   const uint8_t* values, const uint16_t* scales, const uint16_t* mins, float* c,
                   int64_t ldc, bool accumulate) {
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kQuantPanel; ++j) {
      float total = accumulate ? c[r * ldc + j] : 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t g = k / w.group;
        const float scale = HalfToFloat(scales[g * kQuantPanel + j]);
        float weight;
        if (kInt4) {
          const int64_t row = k - k0;  // lane j of block row / 8, nibble row % 8
          const uint8_t byte = values[row / kInt4BlockRows * 4 * kQuantPanel + 4 * j +
                                      row % kInt4BlockRows / 2];
          const int u = (row & 1) ? byte >> 4 : byte & 0x0F;
          weight = scale * static_cast<float>(u) + HalfToFloat(mins[g * kQuantPanel + j]);
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
// One 4-row tile dequantises in registers (one row: RowTileWide with AVX-512, else for int4
// Int4RowTile; int4 rows scaled once into `scratch`); a block of more rows dequantises each
// 256 x 16 slice once into an L1-resident buffer and runs float tiles over it (SIMD builds).
template <bool kInt4>
void QuantizedMatmulBlock(const QuantizedPanels& w, const float* x, float* out, int64_t m0,
                          int64_t m1, int64_t n0, int64_t n1, std::vector<float>& scratch) {
  const int64_t K = w.depth, N = w.columns;
  const int64_t groups = K / w.group;
  const int64_t row_bytes = kInt4 ? kQuantPanel / 2 : kQuantPanel;  // bytes of codes per k
  const bool shared_slice = kQuantizedSimd && m1 - m0 > 4;
  const bool int4_row = kQuantizedSimd && kInt4 && m1 - m0 == 1;
  [[maybe_unused]] const bool one_row = kQuantizedSimd && m1 - m0 == 1;
#if defined(JAXGEN_QUANTIZED_SIMD)
  if (int4_row) {
    scratch.resize(K);
    ScaleRowForInt4(x + m0 * K, K, scratch.data());
  }
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
      const uint16_t* scales = w.scales + panel * groups * kQuantPanel;
      const uint16_t* mins = kInt4 ? w.mins + panel * groups * kQuantPanel : nullptr;
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
      if (one_row) {
        RowTileWide<kInt4>(w, k0, k1, x + m0 * K, scratch.data(), values, scales, mins,
                           out + m0 * N + first, accumulate);
        continue;
      }
#endif
      if (int4_row) {
        Int4RowTile(w, k0, k1, x + m0 * K, scratch.data(), values, scales, mins,
                    out + m0 * N + first, accumulate);
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

}  // namespace jaxgen_cpu
