// The CPU quantised matmul (jaxgen/backends/cpu_kernels/native/matmul_quantized.h) alone, outside
// XLA: QuantizedMatmulBlock over the engine's column blocks (column_blocks.h) on the kernels'
// own worker pool (parallel_for.h; JAXGEN_CPU_THREADS caps it, as in the engine), the codes
// rotated over copies so that they stream from memory as in a decode step. Prints the best of
// five rounds: microseconds per call and weights per second. Codes and scales are random bytes
// taken as already packed (the layout does not change the speed).
//
//   g++ -O3 -march=native -std=c++17 -pthread -Ijaxgen/backends/cpu_kernels/native \
//       benchmarks/matmul_quantized_tile.cc -o /tmp/matmul_quantized_tile
//   [JAXGEN_CPU_THREADS=1] /tmp/matmul_quantized_tile ROWS DEPTH COLUMNS BITS [COPIES=100] [A8]
//
// A8 = 1 with BITS = 4 runs W4A8 (matmul_w4a8.h, AVX-512 VNNI): each call quantises x's rows
// (QuantizeRowsInt4Order), then W4A8Block over the same column blocks, as the engine's call does.
//
// To compare two versions of the header, build one binary per checkout (-I<checkout>/...) and
// alternate their runs: this VM's speed drifts by tens of percent over minutes.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "column_blocks.h"
#include "matmul_quantized.h"
#include "matmul_w4a8.h"
#include "parallel_for.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ROWS DEPTH COLUMNS BITS [COPIES]\n", argv[0]);
    return 2;
  }
  using jaxgen_cpu::kQuantPanel;
  const int64_t rows = std::atol(argv[1]), depth = std::atol(argv[2]);
  const int64_t columns = (std::atol(argv[3]) + kQuantPanel - 1) / kQuantPanel * kQuantPanel;
  const int bits = std::atoi(argv[4]);
  const int copies = argc > 5 ? std::atoi(argv[5]) : 100;
  const bool w4a8 = argc > 6 && std::atoi(argv[6]) == 1 && bits == 4;
#if !defined(JAXGEN_W8A8_VNNI)
  if (w4a8) {
    std::fprintf(stderr, "A8 needs AVX-512 VNNI + VBMI\n");
    return 2;
  }
#endif
  const int64_t group = 32;
  const int64_t panels = columns / kQuantPanel;
  const int64_t block =
      jaxgen_cpu::ColumnBlockPanels({panels}, rows, jaxgen_cpu::NumThreads(),
                                    w4a8 ? 8 : jaxgen_cpu::kQuantizedStreamRows)[0] *
      kQuantPanel;
  const int64_t code_bytes = columns * depth * bits / 8;
  const int64_t scale_count = columns / kQuantPanel * (depth / group) * kQuantPanel;
  std::vector<float> x(rows * depth), out(rows * columns);
  for (int64_t i = 0; i < rows * depth; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<std::vector<uint8_t>> codes(copies, std::vector<uint8_t>(code_bytes));
  for (auto& copy : codes) {
    for (auto& byte : copy) byte = static_cast<uint8_t>(std::rand());
  }
  std::vector<uint16_t> scales(scale_count, 0x2000), mins(scale_count, 0xA000);  // 2^-7, -2^-7
  std::vector<int8_t> x_codes(rows * depth);  // W4A8: x's codes, scales, minimum factors
  std::vector<float> x_scales(rows * depth / 32), x_factors(rows * depth / 32);
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int call = 0; call < 3 * copies; ++call) {
      const jaxgen_cpu::QuantizedPanels w{codes[call % copies].data(), scales.data(),
                                          bits == 4 ? mins.data() : nullptr, depth, columns,
                                          group, bits == 4};
#if defined(JAXGEN_W8A8_VNNI)
      if (w4a8) {
        jaxgen_cpu::QuantizeRowsInt4Order(x.data(), depth, 0, rows, x_codes.data(),
                                          x_scales.data(), x_factors.data());
        jaxgen_cpu::ParallelFor((columns + block - 1) / block, 1,
                                [&](int64_t item, std::vector<float>&) {
                                  const int64_t n0 = item * block;
                                  const int64_t n1 = std::min(columns, n0 + block);
                                  jaxgen_cpu::W4A8Block(w, x_codes.data(), x_scales.data(),
                                                        x_factors.data(), out.data(), 0, rows,
                                                        n0 / kQuantPanel, n1 / kQuantPanel);
                                });
        continue;
      }
#endif
      jaxgen_cpu::ParallelFor((columns + block - 1) / block, 1,
                              [&](int64_t item, std::vector<float>& scratch) {
                                const int64_t n0 = item * block;
                                const int64_t n1 = std::min(columns, n0 + block);
                                if (bits == 4) {
                                  jaxgen_cpu::QuantizedMatmulBlock<true>(
                                      w, x.data(), out.data(), 0, rows, n0, n1, scratch);
                                } else {
                                  jaxgen_cpu::QuantizedMatmulBlock<false>(
                                      w, x.data(), out.data(), 0, rows, n0, n1, scratch);
                                }
                              });
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, seconds / (3 * copies));
  }
  double checksum = 0;  // equal across builds of the same header (SIMD or portable)
  for (float value : out) checksum += value;
  std::printf("rows %ld depth %ld columns %ld int%d%s threads %ld: %.1f us, %.2f G weights/s "
              "(checksum %.6g)\n",
              rows, depth, columns, bits, w4a8 ? " x int8" : "", jaxgen_cpu::NumThreads(), best * 1e6,
              depth * columns / best / 1e9, checksum);
}
