// How a matmul call cuts its weights' output columns into items for the worker pool.
//
// Items are (row block, weight, column block); the pool hands them out in order, one at a time.
// - Few rows (at most 4, or `stream_rows`: decode, memory-bound): the group's panels are cut into one stretch per
//   thread (blocks of ceil(panels / threads), in weight order), so each thread streams one long
//   run of weights. On the int4 kernel (benchmarks/matmul_quantized_tile.cc, one row, two
//   threads) 1 x 1536 x 576 took 24.1-24.6 us in two blocks against 28.7-30.5 in 4-panel ones,
//   1 x 576 x 1536 20.9-21.0 against 23.5-25.0 in 8-panel ones: short items restart the
//   hardware prefetchers' streams.
// - More rows (compute-bound): a weight wider than 64 panels takes blocks of 8 panels; the
//   narrower ones share the width of 4, 3 or 2 panels whose items, each handed to the first free
//   thread, finish soonest (ties: the wider). Four panels throughout gave the default model's
//   int4 o and down projections (36 panels of 16 columns) 9 items, 5 on one thread and 4 on the
//   other: 64 x 1536 x 576 ran in 587-593 us with 4-panel blocks, 539-541 with 3-panel ones.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace jaxgen_cpu {

// Rows inside `spans` [begin, end) pairs (int32, clamped to [0, rows]): the rows a call computes.
inline int64_t LiveRowCount(const int32_t* bounds, int spans, int64_t rows) {
  int64_t live = 0;
  for (int s = 0; s < spans; ++s) {
    const int64_t begin = std::clamp<int64_t>(bounds[2 * s], 0, rows);
    live += std::clamp<int64_t>(bounds[2 * s + 1], begin, rows) - begin;
  }
  return live;
}

// Panels per column block for each weight of a group of `panel_counts` panels, for a call
// computing `rows` live rows on `threads` threads; up to `stream_rows` rows a call streams
// (the quantised kernel's register tiles take 8 rows whole with AVX-512).
inline std::vector<int64_t> ColumnBlockPanels(const std::vector<int64_t>& panel_counts,
                                              int64_t rows, int64_t threads,
                                              int64_t stream_rows = 4) {
  threads = std::max<int64_t>(threads, 1);
  std::vector<int64_t> widths(panel_counts.size());
  if (rows <= stream_rows) {
    int64_t total = 0;
    for (int64_t panels : panel_counts) total += panels;
    const int64_t stretch = std::max<int64_t>(1, (total + threads - 1) / threads);
    for (size_t i = 0; i < widths.size(); ++i) {
      widths[i] = std::max<int64_t>(1, std::min(panel_counts[i], stretch));
    }
    return widths;
  }
  int64_t best_finish = -1;
  for (int64_t narrow : {4, 3, 2}) {
    std::vector<int64_t> busy(threads, 0);  // panels run per thread
    for (int64_t panels : panel_counts) {
      const int64_t block = panels > 64 ? 8 : narrow;
      for (int64_t first = 0; first < panels; first += block) {
        *std::min_element(busy.begin(), busy.end()) += std::min(block, panels - first);
      }
    }
    const int64_t finish = *std::max_element(busy.begin(), busy.end());
    if (best_finish < 0 || finish < best_finish) {
      best_finish = finish;
      for (size_t i = 0; i < widths.size(); ++i) {
        widths[i] = panel_counts[i] > 64 ? 8 : narrow;
      }
    }
  }
  return widths;
}

}  // namespace jaxgen_cpu
