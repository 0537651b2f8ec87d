// ParallelFor over the native CPU kernels' own pool of worker threads, which spin briefly
// between jobs. Every kernel under native/ is built into one library, so they share one pool.
//
// Why not XLA's intra-op pool (the kernels used it until the seventh session): its idle threads
// sleep, and in a decode step the next kernel call comes tens of microseconds after the last one
// (an RMSNorm or a residual add in between). Waking a sleeping pool thread took 0.1-0.3 ms on
// the 2-core VM here, as long as a small matmul, and a decode step makes 121 matmul calls. These
// workers spin for kSpinMicros after each job (yielding to any other runnable thread now and
// then), then sleep on a condition variable, so an idle engine costs nothing.
//
// One job runs at a time. A caller that finds the pool busy (XLA runs independent thunks
// concurrently) runs its items itself: the other cores are already working, so nothing is lost,
// and no caller ever waits for another (no deadlock).

#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace jaxgen_cpu {

constexpr int64_t kSpinMicros = 300;  // how long an idle worker stays awake for the next job

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

class WorkerPool {
 public:
  using RunItem = void (*)(void* context, int64_t item, std::vector<float>& scratch);

  // The process's pool: one worker fewer than the CPUs this process may run on (the caller is
  // the last). JAXGEN_CPU_THREADS caps the threads (caller included).
  static WorkerPool& Get() {
    static WorkerPool* pool = new WorkerPool(Threads() - 1);  // never destroyed: detached
    return *pool;                                              // workers outlive static teardown
  }

  // Threads that run a job's items: the caller and the workers.
  int64_t num_threads() const { return static_cast<int64_t>(threads_.size()) + 1; }

  // Runs run(context, item, scratch) for every item in [0, count), `chunk` items per claim.
  void Run(int64_t count, int64_t chunk, RunItem run, void* context) {
    thread_local std::vector<float> scratch;
    const int64_t chunks = (count + chunk - 1) / chunk;
    if (chunks <= 1 || threads_.empty() || !busy_.try_lock()) {
      for (int64_t i = 0; i < count; ++i) run(context, i, scratch);
      return;
    }
    run_ = run;
    context_ = context;
    count_ = count;
    chunk_ = chunk;
    chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    open_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
    Claim(scratch);
    while (done_.load(std::memory_order_acquire) < chunks_) CpuRelax();
    // Close the job, then let every worker that saw it open leave before the next one starts.
    open_.store(false, std::memory_order_seq_cst);
    while (inside_.load(std::memory_order_seq_cst) > 0) CpuRelax();
    busy_.unlock();
  }

 private:
  explicit WorkerPool(int64_t workers) {
    for (int64_t i = 0; i < workers; ++i) threads_.emplace_back([this] { Loop(); });
    for (auto& thread : threads_) thread.detach();
  }

  static int64_t Threads() {
    int64_t cpus = std::max<int64_t>(1, std::thread::hardware_concurrency());
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
    if (const char* cap = std::getenv("JAXGEN_CPU_THREADS")) {
      const int64_t threads = std::atoll(cap);
      if (threads > 0) cpus = std::min(cpus, threads);
    }
    return cpus;
  }

  void Claim(std::vector<float>& scratch) {
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < chunks_;) {
      const int64_t end = std::min(count_, (c + 1) * chunk_);
      for (int64_t i = c * chunk_; i < end; ++i) run_(context_, i, scratch);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void Loop() {
    std::vector<float> scratch;
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      const auto idle_since = std::chrono::steady_clock::now();
      for (int64_t spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        CpuRelax();
        if (spins % 64 != 63) continue;
        sched_yield();  // let any runnable thread (XLA's, Python's) have this core
        if (std::chrono::steady_clock::now() - idle_since >
            std::chrono::microseconds(kSpinMicros)) {
          std::unique_lock<std::mutex> lock(sleep_mutex_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        }
      }
      seen = generation_.load(std::memory_order_acquire);
      // Dekker-style handshake with Run: either this worker sees the job closed, or Run sees it
      // inside and waits for it, so a job's fields never change under a worker.
      inside_.fetch_add(1, std::memory_order_seq_cst);
      if (open_.load(std::memory_order_seq_cst)) Claim(scratch);
      inside_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex busy_;  // held by the caller whose job the workers are running
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> sleepers_{0};
  std::atomic<int64_t> inside_{0};
  std::atomic<bool> open_{false};
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
  RunItem run_ = nullptr;
  void* context_ = nullptr;
  int64_t count_ = 0, chunk_ = 1, chunks_ = 0;
};

// Threads a ParallelFor runs on: the caller and the workers.
inline int64_t NumThreads() { return WorkerPool::Get().num_threads(); }

// Runs fn(i, scratch) for i in [0, count) on the caller and the pool's workers, `chunk` items
// per claim; `scratch` is a float vector owned by the running thread.
template <typename F>
void ParallelFor(int64_t count, int64_t chunk, F fn) {
  auto run = [](void* context, int64_t i, std::vector<float>& scratch) {
    (*static_cast<F*>(context))(i, scratch);
  };
  WorkerPool::Get().Run(count, chunk, run, &fn);
}

}  // namespace jaxgen_cpu
