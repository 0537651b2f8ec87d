// The CPU matmul's blocking (jaxgen/backends/cpu_kernels/native/matmul_f32.h) alone, outside
// XLA: T threads, each running MatmulBlock over its share of the output columns (as the engine's
// items split them), the weights rotated over copies so that they stream from memory as in a
// decode step. Prints the best aggregate GFLOP/s of seven rounds. Weights are random floats taken
// as already packed (the layout does not change the speed).
//
//   g++ -O2 -mavx2 -mfma -std=c++17 -pthread -Ijaxgen/backends/cpu_kernels/native \
//       benchmarks/matmul_tile.cc -o /tmp/matmul_tile
//   /tmp/matmul_tile ROWS DEPTH COLUMNS [THREADS=2] [COPIES=20] [CALLS=100]
//
// To compare two versions of the header, build one binary per checkout (-I<checkout>/...) and
// alternate their runs: this VM's speed drifts by tens of percent over minutes.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "matmul_f32.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ROWS DEPTH COLUMNS [THREADS] [COPIES] [CALLS]\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atol(argv[1]), depth = std::atol(argv[2]);
  const int64_t panels = (std::atol(argv[3]) + jaxgen_cpu::kPanelWidth - 1) /
                         jaxgen_cpu::kPanelWidth;
  const int64_t columns = panels * jaxgen_cpu::kPanelWidth;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const int copies = argc > 5 ? std::atoi(argv[5]) : 20;
  const long calls = argc > 6 ? std::atol(argv[6]) : 100;
  std::vector<float> x(rows * depth), out(rows * columns);
  for (auto& v : x) v = static_cast<float>(std::rand() % 100) / 100.0f;
  std::vector<std::vector<float>> weights(copies, std::vector<float>(depth * columns));
  for (auto& copy : weights) {
    for (auto& v : copy) v = static_cast<float>(std::rand() % 100) / 100.0f;
  }
  double best = 0;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const int64_t n0 = panels * t / threads * jaxgen_cpu::kPanelWidth;
        const int64_t n1 = panels * (t + 1) / threads * jaxgen_cpu::kPanelWidth;
        for (long call = 0; call < calls; ++call) {
          jaxgen_cpu::MatmulBlock(x.data(), weights[call % copies].data(), out.data(), depth,
                                  columns, 0, rows, n0, n1);
        }
      });
    }
    for (auto& thread : pool) thread.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * rows * depth * columns * calls / seconds / 1e9);
  }
  std::printf("rows %ld depth %ld columns %ld threads %d: best %.1f GFLOP/s (out[0] %.3f)\n",
              rows, depth, columns, threads, best, out[0]);
}
