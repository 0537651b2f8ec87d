// ParallelFor over XLA's intra-op thread pool, shared by the native CPU kernels.
//
// Tried and left out: a pool of the kernels' own threads that spin between jobs (waking XLA's
// sleeping threads took 0.1-0.3 ms, as long as a small matmul). Spinning 2 ms made batch-4
// decode steps 14-18% faster, but on the mixed workload paged runs got 12% slower: the spinning
// thread shared the cores with XLA's own parallel prefill ops. Spinning 0.2 ms was neutral on
// both (docs/kernels.md).

#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxgen_cpu {

// Runs fn(i, scratch) for items [0, count) over the calling thread and the pool; `scratch` is a
// float vector owned by the running thread. Threads claim chunks from an atomic counter and the
// caller waits only for claimed chunks, so a pool that is busy (or the caller being one of its
// threads) can never deadlock: unclaimed work is done by the caller.
template <typename F>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count, int64_t chunk, F fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  const int64_t num_chunks = (count + chunk - 1) / chunk;
  auto work = [state, num_chunks, count, chunk, fn]() {
    std::vector<float> scratch;
    for (int64_t c; (c = state->next.fetch_add(1)) < num_chunks;) {
      for (int64_t i = c * chunk; i < std::min(count, (c + 1) * chunk); ++i) fn(i, scratch);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), num_chunks - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work]() { work(); });
  work();
  while (state->done.load(std::memory_order_acquire) < num_chunks) {
  }
}

}  // namespace jaxgen_cpu
