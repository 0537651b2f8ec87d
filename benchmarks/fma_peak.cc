// This CPU's float32 FMA peak, on one thread and on two: twelve independent AVX2 FMA chains per
// thread, nothing read from memory. On a VM with noisy neighbours the two-thread figure shows
// whether both cores are really available at the moment (run it next to a benchmark).
//
//     g++ -O3 -march=native -pthread benchmarks/fma_peak.cc -o /tmp/fma_peak && /tmp/fma_peak

#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

float Run(long iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(i * 0.001f);
  const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
  for (long k = 0; k < iterations; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  float sum = 0.0f;
  for (int i = 0; i < 12; ++i) sum += acc[i][0];
  return sum;  // used, so the loop is not optimised away
}

}  // namespace

int main() {
  const long iterations = 200000000;
  for (int threads : {1, 2}) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    std::vector<float> sums(threads);
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sums[t] = Run(iterations); });
    for (auto& thread : pool) thread.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // 12 FMAs of 8 lanes, 2 FLOPs each, per iteration.
    std::printf("%d thread(s): %.1f GFLOP/s (checksum %g)\n", threads,
                threads * iterations * 12.0 * 16.0 / seconds / 1e9, sums[0]);
  }
}
