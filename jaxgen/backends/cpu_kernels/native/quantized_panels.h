// The packed quantised weight the CPU matmul reads (matmul_quantized.h), and reading it back:
// float16 scales, int4 lanes decoded in registers, a panel's rows dequantised in order.
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
//   scales, mins: [N / 16, K / group, 16] float16 (GGUF's own scale type) or float32,
//         g = k / group; or two-level (a GGUF K-quant's, IQ4_XS's): scales / mins
//         [N / 16, K / group / S, 16] float16 super-block numbers and scale_codes / min_codes
//         [N / 16, K / group, 16] int8, the group's scale float(super[g / S]) * code[g] (exact
//         in float32), formed per panel and tile (ExpandPanelScales), S = groups_per_super;
//   codebook (int4, no minimums: GGUF's IQ4_NL / IQ4_XS): w[k, n] = scale[g, n] * book[u],
//         the 16 numbers looked up in registers (a byte shuffle per 4 rows of 8 columns).
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
  const void* scales;  // float16 bits, or float32 (float_scales)
  const void* mins;    // like scales; null for an int8 weight without minimums
  int64_t depth, columns, group;  // K, N (padded to 16), rows per scale group
  bool int4;
  bool float_scales;  // float32 scales and mins (a K-quant's d * sub-scale), else float16
  const int8_t* scale_codes = nullptr;  // two-level: a code per group (scales per super-block)
  const int8_t* min_codes = nullptr;    // two-level minimums' codes (mins per super-block)
  int64_t groups_per_super = 1;         // groups per super-block number (two-level)
  const int8_t* codebook = nullptr;     // int4: the 16 numbers its codes index, or null
};

// A panel's scales and minimums as the tiles read them: [K / group, 16] rows of S (float16
// bits or float32) indexed by the absolute group; mins null for an int8 weight without them.
template <typename S>
struct PanelScales {
  const S* scales;
  const S* mins;
};

// Panel `panel`'s stored scales (and minimums): the packed arrays themselves.
template <typename S>
inline PanelScales<S> StoredPanelScales(const QuantizedPanels& w, int64_t panel) {
  const int64_t at = panel * (w.depth / w.group) * kQuantPanel;
  return {static_cast<const S*>(w.scales) + at,
          w.mins ? static_cast<const S*>(w.mins) + at : nullptr};
}

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

// A scale or minimum as float: float16 bits converted, float32 as it is (the tiles take either
// through these overloads, templated on the scale type S).
inline float ScaleToFloat(uint16_t h) { return HalfToFloat(h); }
inline float ScaleToFloat(float f) { return f; }

// dst[g, 16] = float(supers[g / per_super, 16]) * codes[g, 16] for g in [g0, g1).
inline void SuperTimesCodes(const uint16_t* supers, const int8_t* codes, int64_t per_super,
                            int64_t g0, int64_t g1, float* dst) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* super = supers + g / per_super * kQuantPanel;
    const int8_t* code = codes + g * kQuantPanel;
    float* row = dst + g * kQuantPanel;
#if defined(JAXGEN_QUANTIZED_SIMD)
    for (int j = 0; j < kQuantPanel; j += 8) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(super + j)));
      const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + j))));
      _mm256_storeu_ps(row + j, _mm256_mul_ps(d, c));
    }
#else
    for (int j = 0; j < kQuantPanel; ++j) row[j] = HalfToFloat(super[j]) * static_cast<float>(code[j]);
#endif
  }
}

// Groups [g0, g1) of panel `panel` of a two-level weight as float32 scales and minimums in
// `buffer` (resized to 2 * K / group * 16 floats), indexed as StoredPanelScales' are; a
// symmetric int4 weight's minimums are -8 * scale (exact), an int8 one without codes has none.
inline PanelScales<float> ExpandPanelScales(const QuantizedPanels& w, int64_t panel, int64_t g0,
                                            int64_t g1, std::vector<float>& buffer) {
  const int64_t groups = w.depth / w.group, supers = groups / w.groups_per_super;
  buffer.resize(2 * groups * kQuantPanel);
  float* scales = buffer.data();
  float* mins = scales + groups * kQuantPanel;
  const int64_t super_at = panel * supers * kQuantPanel, code_at = panel * groups * kQuantPanel;
  SuperTimesCodes(static_cast<const uint16_t*>(w.scales) + super_at, w.scale_codes + code_at,
                  w.groups_per_super, g0, g1, scales);
  if (w.min_codes) {
    SuperTimesCodes(static_cast<const uint16_t*>(w.mins) + super_at, w.min_codes + code_at,
                    w.groups_per_super, g0, g1, mins);
  } else if (w.int4 && !w.codebook) {
    for (int64_t i = g0 * kQuantPanel; i < g1 * kQuantPanel; ++i) mins[i] = -8.0f * scales[i];
  }
  return {scales, (w.min_codes || (w.int4 && !w.codebook)) ? mins : nullptr};
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

// Eight scales (or minimums) as floats, from float16 bits or float32.
inline __m256 LoadScales8(const uint16_t* p) { return LoadHalf8(p); }
inline __m256 LoadScales8(const float* p) { return _mm256_loadu_ps(p); }

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

// The 16 int8 numbers of a codebook in both 128-bit halves (for _mm256_shuffle_epi8).
inline __m256i LoadBook(const int8_t* book) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(book)));
}

// An int4 block's lanes looked up byte by byte: byte i of each lane of `even` is book[u] of row
// 2i, of `odd` row 2i + 1 (a lane's byte i holds rows 2i and 2i + 1 in its two nibbles).
struct BookBytes {
  __m256i even, odd;
  BookBytes(__m256i lanes, __m256i book) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    even = _mm256_shuffle_epi8(book, _mm256_and_si256(lanes, nibble));
    odd = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(lanes, 4), nibble));
  }
};

// Row j's book[u] as floats: its byte of each lane, sign-extended.
template <int J>
inline __m256 BookRowValue(const BookBytes& bytes) {
  const __m256i row = (J & 1) ? bytes.odd : bytes.even;
  return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(row, 24 - 8 * (J / 2)), 24));
}

// ForInt4BlockRows for a codebook weight: book[u] * scale.
template <typename F>
inline void ForInt4BookBlockRows(__m256i v0, __m256i v1, __m256 s0, __m256 s1, __m256i book,
                                 F&& f) {
  const BookBytes b0(v0, book), b1(v1, book);
#define JAXGEN_INT4_BOOK(J) \
  f(J, _mm256_mul_ps(BookRowValue<J>(b0), s0), _mm256_mul_ps(BookRowValue<J>(b1), s1));
  JAXGEN_INT4_BOOK(0)
  JAXGEN_INT4_BOOK(1)
  JAXGEN_INT4_BOOK(2)
  JAXGEN_INT4_BOOK(3)
  JAXGEN_INT4_BOOK(4)
  JAXGEN_INT4_BOOK(5)
  JAXGEN_INT4_BOOK(6)
  JAXGEN_INT4_BOOK(7)
#undef JAXGEN_INT4_BOOK
}

// Calls f(k, e0, e1) for every row k in [k0, k1) of an int4 panel (k0, k1 multiples of 8),
// dequantised (u * scale + min, or book[u] * scale) in two 8-float vectors; `values` points at
// block k0 / 8.
template <typename S, typename F>
inline void ForEachInt4Row(const QuantizedPanels& w, int64_t k0, int64_t k1,
                           const uint8_t* values, const S* scales, const S* mins,
                           F&& f) {
  if (w.codebook) {
    const __m256i book = LoadBook(w.codebook);
    for (int64_t k = k0; k < k1;) {
      const int64_t g = k / w.group;
      const int64_t end = std::min(k1, (g + 1) * w.group);
      const __m256 s0 = LoadScales8(scales + g * kQuantPanel);
      const __m256 s1 = LoadScales8(scales + g * kQuantPanel + 8);
      for (; k < end; k += kInt4BlockRows) {
        const uint8_t* block = values + (k - k0) * (kQuantPanel / 2);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32));
        ForInt4BookBlockRows(v0, v1, s0, s1, book,
                             [&](int j, __m256 e0, __m256 e1) { f(k + j, e0, e1); });
      }
    }
    return;
  }
  for (int64_t k = k0; k < k1;) {
    const int64_t g = k / w.group;
    const int64_t end = std::min(k1, (g + 1) * w.group);
    const __m256 s0 = LoadScales8(scales + g * kQuantPanel);
    const __m256 s1 = LoadScales8(scales + g * kQuantPanel + 8);
    const __m256 m0 = LoadScales8(mins + g * kQuantPanel);
    const __m256 m1 = LoadScales8(mins + g * kQuantPanel + 8);
    for (; k < end; k += kInt4BlockRows) {
      const uint8_t* block = values + (k - k0) * (kQuantPanel / 2);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32));
      ForInt4BlockRows(v0, v1, s0, s1, m0, m1,
                       [&](int j, __m256 e0, __m256 e1) { f(k + j, e0, e1); });
    }
  }
}

// dst[k - k0, 16] = dequant(panel)[k0:k1, 16]: the slice a multi-tile row block shares, so the
// codes are converted once per block instead of once per 4-row tile.
template <bool kInt4, typename S>
void DequantizeSlice(const QuantizedPanels& w, int64_t k0, int64_t k1, const uint8_t* values,
                     const S* scales, const S* mins, float* dst) {
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
    const __m256 s0 = LoadScales8(scales + g * kQuantPanel);
    const __m256 s1 = LoadScales8(scales + g * kQuantPanel + 8);
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
#else
constexpr bool kQuantizedSimd = false;
#endif

}  // namespace jaxgen_cpu
