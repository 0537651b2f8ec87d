// Would W8A8 (int8 weights x int8 activations) make batched decoding faster than float32 on this
// CPU? One thread, one run, three kinds of figures:
//   1. the float32 FMA rate in registers (12 independent chains; fma_peak.cc's loop);
//   2. the AVX2 int8 dot product's rate in registers, 4 k x 8 columns per step, as
//      vpsignb + vpmaddubsw + vpmaddwd + vpaddd (8-bit activations: |x| unsigned times w with
//      x's sign, at most 2 x 127 x 127, no int16 saturation), and as vpmaddubsw + vpmaddwd +
//      vpaddd (7-bit activations offset to unsigned, a column-sum correction per group);
//   3. whole blocks of ROWS x DEPTH x COLUMNS: the engine's float32 kernel (matmul_f32.h), its
//      int8-weight kernel (matmul_quantized.h: slices dequantised once, float tiles over them)
//      and the W8A8 block below (x quantised per row and 32 columns, int8 panels transposed to
//      4-k quads once per 256-row slice, integer sums per 32 k, one float multiply-add per group),
//      checked against a double-precision loop over the same codes.
// Where the compiler targets AVX-512 VNNI with VL (-march=native on a CPU whose flags list
// avx512_vnni and avx512vl), it also measures vpdpbusd on 256-bit registers: 32 multiply-adds of
// unsigned x by signed w in one instruction (7-bit x offset to unsigned, as above), and the
// engine's VNNI W8A8 block (native/matmul_w8a8.h: QuantizeRows + W8A8Block over the int8 panels
// as packed, 512-bit registers), checked against a double-precision loop over its own codes.
// The prototype W8A8 block below uses the AVX2 sequence on every CPU.
//
//   g++ -O3 -march=native -std=c++17 -Ijaxgen/backends/cpu_kernels/native
//       benchmarks/matmul_w8a8_tile.cc -o /tmp/matmul_w8a8_tile   (one line)
//   /tmp/matmul_w8a8_tile [ROWS=64] [DEPTH=576] [COLUMNS=1536]

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "matmul_f32.h"
#include "matmul_quantized.h"
#include "matmul_w8a8.h"

#if !defined(JAXGEN_QUANTIZED_SIMD)
#error "needs AVX2 + FMA + F16C (-march=native on such a CPU)"
#endif

namespace jaxgen_cpu {


// codes[m, :K], scales[m, :K / 32] = x[m, :K] quantised per group of 32 (see the top).
inline void QuantizeActivationRow(const float* x, int64_t depth, int8_t* codes, float* scales) {
  for (int64_t g = 0; g < depth / kActivationGroup; ++g) {
    const float* v = x + g * kActivationGroup;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(v));
    for (int j = 8; j < kActivationGroup; j += 8) {
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + j)));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float scale = amax / 127.0f;
    const float inverse = amax > 0.0f ? 1.0f / scale : 0.0f;
    scales[g] = scale;
    int8_t* out = codes + g * kActivationGroup;
    const __m256 iv = _mm256_set1_ps(inverse);
    // Round to nearest even (MXCSR's default), pack to int8; the packs interleave 128-bit
    // lanes, which the final permute undoes (4-byte runs 0, 4, 1, 5, 2, 6, 3, 7).
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), iv));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), iv));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 16), iv));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 24), iv));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out),
        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

// quads[q, 16, 4] = values[4q .. 4q + 3, 16] transposed, for rows [0, rows) of a panel slice
// (rows a multiple of 4): column n's 4 codes become one int32 lane.
inline void TransposeToQuads(const uint8_t* values, int64_t rows, int8_t* quads) {
  for (int64_t k = 0; k < rows; k += 4) {
    const uint8_t* row = values + k * kQuantPanel;
    const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row));
    const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kQuantPanel));
    const __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * kQuantPanel));
    const __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 3 * kQuantPanel));
    const __m128i low01 = _mm_unpacklo_epi8(a0, a1), high01 = _mm_unpackhi_epi8(a0, a1);
    const __m128i low23 = _mm_unpacklo_epi8(a2, a3), high23 = _mm_unpackhi_epi8(a2, a3);
    __m128i* out = reinterpret_cast<__m128i*>(quads + k * kQuantPanel);
    _mm_store_si128(out, _mm_unpacklo_epi16(low01, low23));       // columns 0..3
    _mm_store_si128(out + 1, _mm_unpackhi_epi16(low01, low23));   // 4..7
    _mm_store_si128(out + 2, _mm_unpacklo_epi16(high01, high23)); // 8..11
    _mm_store_si128(out + 3, _mm_unpackhi_epi16(high01, high23)); // 12..15
  }
}

// c[R, 16] (+)= dequant(quant(x))[R, k0:k1] @ dequant(panel)[k0:k1, 16] over a quad slice;
// k0, k1 multiples of 32. Per 32 k, int32 sums in 2R registers, then added into c scaled by
// x_scale * w_scale (c holds the float sums between groups).
template <int R>
__attribute__((noinline)) void Int8ActivationTile(const QuantizedPanels& w, int64_t k0,
                                                  int64_t k1, const int8_t* quads,
                                                  const int8_t* xq, const float* xs,
                                                  int64_t ldx, const uint16_t* scales, float* c,
                                                  int64_t ldc, bool accumulate) {
  const int64_t ldxs = ldx / kActivationGroup;
  if (!accumulate) {
    for (int r = 0; r < R; ++r) std::memset(c + r * ldc, 0, kQuantPanel * sizeof(float));
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g0 = k0; g0 < k1; g0 += kActivationGroup) {
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t k = g0; k < g0 + kActivationGroup; k += 4) {
      const int8_t* quad = quads + (k - k0) * kQuantPanel;
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(quad));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(quad + 32));
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, xq + r * ldx + k, sizeof(four));
        const __m256i b = _mm256_set1_epi32(four);
        const __m256i magnitude = _mm256_abs_epi8(b);
        acc[r][0] = _mm256_add_epi32(
            acc[r][0],
            _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, b)), ones));
        acc[r][1] = _mm256_add_epi32(
            acc[r][1],
            _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, b)), ones));
      }
    }
    const int64_t g = g0 / w.group;
    const __m256 ws0 = LoadHalf8(scales + g * kQuantPanel);
    const __m256 ws1 = LoadHalf8(scales + g * kQuantPanel + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 x_scale = _mm256_set1_ps(xs[r * ldxs + g0 / kActivationGroup]);
      float* out = c + r * ldc;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]),
                                            _mm256_mul_ps(x_scale, ws0), _mm256_loadu_ps(out)));
      _mm256_storeu_ps(out + 8,
                       _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_mul_ps(x_scale, ws1),
                                       _mm256_loadu_ps(out + 8)));
    }
  }
}

// out[m0:m1, n0:n1] = W8A8 product (top) of rows m0..m1 of the quantised x (`xq` [M, K] codes,
// `xs` [M, K / 32] scales) and int8 weight w; n0, n1 multiples of the panel width, K and the
// weight's group multiples of 32.
inline void Int8ActivationMatmulBlock(const QuantizedPanels& w, const int8_t* xq,
                                      const float* xs, float* out, int64_t m0, int64_t m1,
                                      int64_t n0, int64_t n1) {
  const int64_t K = w.depth, N = w.columns, groups = K / w.group;
  const int64_t ldxs = K / kActivationGroup;
  alignas(32) int8_t quads[kQuantBlockDepth * kQuantPanel];
  for (int64_t k0 = 0; k0 < K; k0 += kQuantBlockDepth) {
    const int64_t k1 = std::min(K, k0 + kQuantBlockDepth);
    for (int64_t first = n0; first < n1; first += kQuantPanel) {
      const int64_t panel = first / kQuantPanel;
      TransposeToQuads(w.values + panel * K * kQuantPanel + k0 * kQuantPanel, k1 - k0, quads);
      const uint16_t* scales = w.scales + panel * groups * kQuantPanel;
      for (int64_t m = m0; m < m1; m += 4) {
        const int8_t* x_codes = xq + m * K;
        const float* x_scales = xs + m * ldxs;
        float* c = out + m * N + first;
        switch (std::min<int64_t>(4, m1 - m)) {
          case 4: Int8ActivationTile<4>(w, k0, k1, quads, x_codes, x_scales, K, scales, c, N, k0 > 0); break;
          case 3: Int8ActivationTile<3>(w, k0, k1, quads, x_codes, x_scales, K, scales, c, N, k0 > 0); break;
          case 2: Int8ActivationTile<2>(w, k0, k1, quads, x_codes, x_scales, K, scales, c, N, k0 > 0); break;
          default: Int8ActivationTile<1>(w, k0, k1, quads, x_codes, x_scales, K, scales, c, N, k0 > 0); break;
        }
      }
    }
  }
}

}  // namespace jaxgen_cpu

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Multiply-adds per second of 12 independent float32 FMA chains (8 lanes each).
double FloatPeak(long iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(i * 0.001f);
  const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
  const auto start = Clock::now();
  for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  const double seconds = Seconds(start);
  float sum = 0.0f;
  for (int i = 0; i < 12; ++i) sum += acc[i][0];
  if (sum == 1234.5f) std::puts("");  // keeps the loop
  return iterations * 12.0 * 8 / seconds;
}

// How a tile's int8 products are formed: 8-bit x with the sign trick, 7-bit x offset to
// unsigned (vpmaddubsw + vpmaddwd + vpaddd), or vpdpbusd (AVX-512 VNNI on 256-bit registers).
enum class IntegerProduct { kSignTrick, kOffset, kVnni };

// Multiply-adds per second of a 4-row x 16-column int8 tile in registers, 4 k per step; 0 for
// kVnni where the build does not target it.
template <IntegerProduct kProduct>
double IntegerPeak(long iterations) {
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
  if constexpr (kProduct == IntegerProduct::kVnni) return 0.0;
#endif
  alignas(32) static int8_t x[4 * 256], w[64 * 64];
  for (int i = 0; i < 4 * 256; ++i) x[i] = static_cast<int8_t>(i * 37 % 127);
  for (int i = 0; i < 64 * 64; ++i) w[i] = static_cast<int8_t>(i * 53 % 255 - 127);
  __m256i acc[4][2];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  const auto start = Clock::now();
  for (long k = 0; k < iterations; ++k) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + (k & 63) * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + (k & 63) * 64 + 32));
    for (int r = 0; r < 4; ++r) {
      int32_t four;
      std::memcpy(&four, x + r * 256 + (k & 63) * 4, sizeof(four));
      const __m256i b = _mm256_set1_epi32(four);
      if constexpr (kProduct == IntegerProduct::kSignTrick) {
        const __m256i magnitude = _mm256_abs_epi8(b);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, b)), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, b)), ones));
      } else if constexpr (kProduct == IntegerProduct::kOffset) {
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(b, w0), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(b, w1), ones));
      } else {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        acc[r][0] = _mm256_dpbusd_epi32(acc[r][0], b, w0);
        acc[r][1] = _mm256_dpbusd_epi32(acc[r][1], b, w1);
#endif
      }
    }
  }
  const double seconds = Seconds(start);
  int sum = 0;
  for (int r = 0; r < 4; ++r) sum += _mm256_extract_epi32(acc[r][0], 0) + _mm256_extract_epi32(acc[r][1], 3);
  if (sum == 12345) std::puts("");  // keeps the loop
  return iterations * 4.0 * 16 * 4 / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace jaxgen_cpu;
  const int64_t rows = argc > 1 ? std::atol(argv[1]) : 64;
  const int64_t depth = argc > 2 ? std::atol(argv[2]) : 576;
  const int64_t columns = argc > 3 ? std::atol(argv[3]) : 1536;
  if (depth % kActivationGroup != 0 || columns % kQuantPanel != 0 ||
      columns % kPanelWidth != 0) {
    std::fprintf(stderr, "DEPTH a multiple of 32, COLUMNS of 48\n");
    return 2;
  }
  const int64_t group = 32, groups = depth / group, panels = columns / kQuantPanel;
  std::vector<float> x(rows * depth), exact(rows * columns), out(rows * columns);
  for (auto& v : x) v = (std::rand() % 2001 - 1000) / 1000.0f;
  std::vector<uint8_t> codes(columns * depth);
  for (auto& v : codes) v = static_cast<uint8_t>(std::rand() % 255 - 127);
  std::vector<uint16_t> scales(panels * groups * kQuantPanel, 0x2000);  // 2^-7
  std::vector<float> weights(depth * columns);  // float32 panels: random, as the layout
  for (auto& v : weights) v = (std::rand() % 2001 - 1000) / 1000.0f;
  const QuantizedPanels w{codes.data(), scales.data(), nullptr, depth, columns, group, false};
  std::vector<int8_t> xq(rows * depth);
  std::vector<float> xs(rows * depth / kActivationGroup), scratch;

  const auto quantize = [&] {
    for (int64_t m = 0; m < rows; ++m) {
      QuantizeActivationRow(x.data() + m * depth, depth, xq.data() + m * depth,
                            xs.data() + m * depth / kActivationGroup);
    }
  };
  // Prints a block's out against a double-precision loop over x's codes (x_value(m, k): the
  // code times its scale) and the weight's.
  const auto compare_with_double_loop = [&](const char* block, auto x_value) {
    double error = 0, largest = 0;
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t n = 0; n < columns; ++n) {
        double total = 0;
        const int64_t p = n / kQuantPanel, lane = n % kQuantPanel;
        for (int64_t k = 0; k < depth; ++k) {
          total += x_value(m, k) * static_cast<int8_t>(codes[(p * depth + k) * kQuantPanel + lane]) *
                   HalfToFloat(scales[(p * groups + k / group) * kQuantPanel + lane]);
        }
        error = std::max(error, std::fabs(total - out[m * columns + n]));
        largest = std::max(largest, std::fabs(total));
      }
    }
    std::printf("%s vs double loop: max |error| %.2g of max |out| %.3g\n", block, error, largest);
  };
  quantize();
  Int8ActivationMatmulBlock(w, xq.data(), xs.data(), out.data(), 0, rows, 0, columns);
  compare_with_double_loop("W8A8 block", [&](int64_t m, int64_t k) {
    return double(xq[m * depth + k]) * xs[m * depth / 32 + k / 32];
  });
#if defined(JAXGEN_W8A8_VNNI)
  std::vector<uint8_t> vnni_codes(rows * depth * 2);
  std::vector<float> vnni_scales(rows * groups);
  const auto vnni_block = [&](auto bits) {  // x's codes of that many bits, then the block
    QuantizeRows<bits.value>(x.data(), depth, 0, rows, vnni_codes.data(), vnni_scales.data());
    W8A8Block<bits.value>(w, vnni_codes.data(), vnni_scales.data(), out.data(), 0, rows, 0,
                          panels);
  };
  vnni_block(std::integral_constant<int, 8>{});
  compare_with_double_loop("VNNI block, 8-bit x", [&](int64_t m, int64_t k) {
    return (double(vnni_codes[m * depth + k]) - 128) * vnni_scales[m * groups + k / 32];
  });
  vnni_block(std::integral_constant<int, 16>{});
  compare_with_double_loop("VNNI block, 16-bit x", [&](int64_t m, int64_t k) {
    const double code =
        256.0 * vnni_codes[2 * m * depth + k] + vnni_codes[(2 * m + 1) * depth + k] - 32768;
    return code * vnni_scales[m * groups + k / 32];
  });
#endif

  const double macs = double(rows) * depth * columns;
  for (int round = 0; round < 3; ++round) {
    const double fma = FloatPeak(100000000) / 1e9;
    const double sign_trick = IntegerPeak<IntegerProduct::kSignTrick>(50000000) / 1e9;
    const double offset = IntegerPeak<IntegerProduct::kOffset>(50000000) / 1e9;
    const double vnni = IntegerPeak<IntegerProduct::kVnni>(50000000) / 1e9;
    const int calls = 20;
    auto start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      MatmulBlock(x.data(), weights.data(), out.data(), depth, columns, 0, rows, 0, columns);
    }
    const double float32 = macs * calls / Seconds(start) / 1e9;
    start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      QuantizedMatmulBlock<false>(w, x.data(), out.data(), 0, rows, 0, columns, scratch);
    }
    const double int8 = macs * calls / Seconds(start) / 1e9;
    start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      quantize();
      Int8ActivationMatmulBlock(w, xq.data(), xs.data(), out.data(), 0, rows, 0, columns);
    }
    const double w8a8 = macs * calls / Seconds(start) / 1e9;
    double vnni_w8a8 = 0, vnni_w8a16 = 0;
#if defined(JAXGEN_W8A8_VNNI)
    start = Clock::now();
    for (int i = 0; i < calls; ++i) vnni_block(std::integral_constant<int, 8>{});
    vnni_w8a8 = macs * calls / Seconds(start) / 1e9;
    start = Clock::now();
    for (int i = 0; i < calls; ++i) vnni_block(std::integral_constant<int, 16>{});
    vnni_w8a16 = macs * calls / Seconds(start) / 1e9;
#endif
    std::printf(
        "G multiply-adds/s, one thread. Registers: float32 FMA %.1f, int8 8-bit x %.1f (%.2fx), "
        "7-bit x %.1f (%.2fx), vpdpbusd %.1f (%.2fx; 0: not built). Blocks %ldx%ldx%ld: float32 %.1f, int8 weights %.1f (%.2fx), "
        "W8A8 %.1f (%.2fx), VNNI 8-bit x %.1f (%.2fx), 16-bit x %.1f (%.2fx; 0: not built)\n",
        fma, sign_trick, sign_trick / fma, offset, offset / fma, vnni, vnni / fma, rows, depth, columns, float32,
        int8, int8 / float32, w8a8, w8a8 / float32, vnni_w8a8, vnni_w8a8 / float32, vnni_w8a16,
        vnni_w8a16 / float32);
  }
}
