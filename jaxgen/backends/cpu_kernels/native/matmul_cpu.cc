// Dense float32 matmul for XLA:CPU over panel-packed weights, called through the XLA FFI.
//
// out_i[M, N_i] = x[M, K] @ w_i[K, N_i] for a group of weights that read the same x (the q, k
// and v projections; gate and up), each given packed as [N_i / 24, K, 24] (pack_weight in
// matmul.py): one call, so the group runs as one parallel job instead of several small ones
// (each job has a fixed cost: handing it to the worker threads). Only the rows inside two
// [begin, end) spans are computed (`live_rows`, int32 [2, 2]: an engine step's decode and
// prefill tokens); the other rows, padding up to a shape bucket, come out as zeros. The blocking
// lives in matmul_f32.h; this file splits each span's outputs into (row block, weight, column
// block) items (column_blocks.h) and runs them on the kernels' worker pool (parallel_for.h).
// Reference: jnp.dot on the unpacked weight (tests/test_matmul_cpu.py).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "column_blocks.h"
#include "matmul_f32.h"
#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kMaxSpans = 2;  // live_rows holds two [begin, end) row spans

struct Span {
  int64_t begin, end, block_rows;
};

// Splits `rows` rows into blocks of whole 4-row tiles: enough blocks (with `column_blocks`
// column blocks) to keep every thread busy, each capped at 128 rows so a row block of x (128 KB
// per k-block) stays in L2.
int64_t BlockRows(int64_t rows, int64_t column_blocks, int64_t workers) {
  const int64_t row_tiles = (rows + jaxgen_cpu::kTileRows - 1) / jaxgen_cpu::kTileRows;
  int64_t row_blocks = std::max<int64_t>((3 * workers + column_blocks - 1) / column_blocks,
                                         (rows + 127) / 128);
  row_blocks = std::max<int64_t>(1, std::min(row_blocks, row_tiles));
  return (row_tiles + row_blocks - 1) / row_blocks * jaxgen_cpu::kTileRows;
}

// One weight of the group: its packed panels, its output and how its columns are blocked.
struct Weight {
  const float* packed;
  float* out;
  int64_t columns, column_blocks, block_columns;
};

// An item of work: rows [m0, m1) of weight w's output columns [n0, n1).
struct Item {
  int64_t w, m0, m1, n0, n1;
};

ffi::Error MatmulImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> live_rows,
                      ffi::RemainingArgs weights, ffi::RemainingRets outs) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("matmul_cpu: x [M, K] expected");
  if (live_rows.element_count() != 2 * kMaxSpans) {
    return ffi::Error::InvalidArgument("matmul_cpu: live_rows [2, 2] expected");
  }
  if (weights.size() == 0 || weights.size() != outs.size()) {
    return ffi::Error::InvalidArgument("matmul_cpu: one output per packed weight expected");
  }
  const int64_t rows = xd[0], depth = xd[1];
  std::vector<Weight> group;
  int64_t column_blocks = 0;
  std::vector<int64_t> panel_counts;
  for (size_t i = 0; i < weights.size(); ++i) {
    auto packed = weights.get<ffi::Buffer<ffi::F32>>(i);
    const bool packed_3d = packed.has_value() && packed->dimensions().size() == 3;
    panel_counts.push_back(packed_3d ? packed->dimensions()[0] : 1);  // else rejected below
  }
  const std::vector<int64_t> block_panels = jaxgen_cpu::ColumnBlockPanels(
      panel_counts, jaxgen_cpu::LiveRowCount(live_rows.typed_data(), kMaxSpans, rows),
      jaxgen_cpu::NumThreads());
  for (size_t i = 0; i < weights.size(); ++i) {
    auto packed = weights.get<ffi::Buffer<ffi::F32>>(i);
    auto out = outs.get<ffi::Buffer<ffi::F32>>(i);
    if (!packed.has_value() || !out.has_value()) {
      return ffi::Error::InvalidArgument("matmul_cpu: float32 weights and outputs expected");
    }
    auto pd = packed->dimensions();
    if (pd.size() != 3 || pd[2] != jaxgen_cpu::kPanelWidth || pd[1] != depth) {
      return ffi::Error::InvalidArgument("matmul_cpu: packed w [N/24, K, 24] expected");
    }
    const int64_t panels = pd[0];
    const int64_t blocks = (panels + block_panels[i] - 1) / block_panels[i];
    group.push_back({packed->typed_data(), (*out)->typed_data(),
                     panels * jaxgen_cpu::kPanelWidth, blocks,
                     block_panels[i] * jaxgen_cpu::kPanelWidth});
    column_blocks += blocks;
  }

  // Rows outside the live spans are bucket padding: their outputs are zeros, not computed.
  Span spans[kMaxSpans];
  const int32_t* bounds = live_rows.typed_data();
  for (int s = 0; s < kMaxSpans; ++s) {
    const int64_t begin = std::clamp<int64_t>(bounds[2 * s], 0, rows);
    const int64_t end = std::clamp<int64_t>(bounds[2 * s + 1], begin, rows);
    const int64_t block_rows =
        end > begin ? BlockRows(end - begin, column_blocks, jaxgen_cpu::NumThreads()) : 1;
    spans[s] = {begin, end, block_rows};
  }
  for (const Weight& w : group) {
    for (int64_t m = 0; m < rows; ++m) {
      bool live = false;
      for (const Span& span : spans) live |= span.begin <= m && m < span.end;
      if (!live) std::fill(w.out + m * w.columns, w.out + (m + 1) * w.columns, 0.0f);
    }
  }
  std::vector<Item> items;
  for (const Span& span : spans) {
    for (int64_t m0 = span.begin; m0 < span.end; m0 += span.block_rows) {
      const int64_t m1 = std::min(span.end, m0 + span.block_rows);
      for (int64_t w = 0; w < static_cast<int64_t>(group.size()); ++w) {
        for (int64_t n0 = 0; n0 < group[w].columns; n0 += group[w].block_columns) {
          items.push_back({w, m0, m1, n0, std::min(group[w].columns, n0 + group[w].block_columns)});
        }
      }
    }
  }
  const float* xs = x.typed_data();
  auto run = [&](int64_t i, std::vector<float>&) {
    const Item& item = items[i];
    const Weight& w = group[item.w];
    jaxgen_cpu::MatmulBlock(xs, w.packed, w.out, depth, w.columns, item.m0, item.m1, item.n0,
                            item.n1);
  };
  jaxgen_cpu::ParallelFor(items.size(), 1, run);
  return ffi::Error::Success();
}

}  // namespace

// True when the blocked AVX2 + FMA path was compiled in; without it callers keep XLA's dot.
extern "C" bool JaxgenMatmulHasSimd() { return jaxgen_cpu::kHasSimd; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenMatmulF32, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
