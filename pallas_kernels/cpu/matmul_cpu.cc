// Dense float32 matmul for XLA:CPU over panel-packed weights, called through the XLA FFI.
//
// out[M, N] = x[M, K] @ w[K, N] with w given packed as [N / 24, K, 24] (pack_weight in
// matmul_cpu.py), for the rows inside two [begin, end) spans (`live_rows`, int32 [2, 2]: an
// engine step's decode and prefill tokens); the other rows, padding up to a shape bucket, come
// out as zeros without being computed. The blocking lives in matmul_f32.h; this file splits
// each span's output into (row block, column block) items and runs them on XLA's intra-op
// thread pool. Reference:
// jnp.dot on the unpacked weight (tests/test_matmul_cpu.py).

#include <algorithm>
#include <cstdint>
#include <vector>

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

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::Buffer<ffi::F32> packed, ffi::Buffer<ffi::S32> live_rows,
                      ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 3 || pd[2] != jaxgen_cpu::kPanelWidth || pd[1] != xd[1]) {
    return ffi::Error::InvalidArgument("matmul_cpu: x [M, K] and packed w [N/24, K, 24] expected");
  }
  if (live_rows.element_count() != 2 * kMaxSpans) {
    return ffi::Error::InvalidArgument("matmul_cpu: live_rows [2, 2] expected");
  }
  const int64_t rows = xd[0], depth = xd[1];
  const int64_t panels = pd[0], columns = panels * jaxgen_cpu::kPanelWidth;
  const int64_t workers = pool.num_threads() + 1;
  const int64_t block_panels = panels > 64 ? 8 : 4;
  const int64_t column_blocks = (panels + block_panels - 1) / block_panels;
  const int64_t block_columns = block_panels * jaxgen_cpu::kPanelWidth;
  const float* xs = x.typed_data();
  const float* ws = packed.typed_data();
  float* os = out->typed_data();

  // Rows outside the live spans are bucket padding: their outputs are zeros, not computed.
  Span spans[kMaxSpans];
  const int32_t* bounds = live_rows.typed_data();
  for (int s = 0; s < kMaxSpans; ++s) {
    const int64_t begin = std::clamp<int64_t>(bounds[2 * s], 0, rows);
    const int64_t end = std::clamp<int64_t>(bounds[2 * s + 1], begin, rows);
    spans[s] = {begin, end, end > begin ? BlockRows(end - begin, column_blocks, workers) : 1};
  }
  for (int64_t m = 0; m < rows; ++m) {
    bool live = false;
    for (const Span& span : spans) live |= span.begin <= m && m < span.end;
    if (!live) std::fill(os + m * columns, os + (m + 1) * columns, 0.0f);
  }
  int64_t first_item[kMaxSpans + 1] = {0};
  for (int s = 0; s < kMaxSpans; ++s) {
    const int64_t row_blocks = (spans[s].end - spans[s].begin + spans[s].block_rows - 1) /
                               spans[s].block_rows;
    first_item[s + 1] = first_item[s] + row_blocks * column_blocks;
  }
  jaxgen_cpu::ParallelFor(
      pool, first_item[kMaxSpans], 1, [=](int64_t item, std::vector<float>&) {
        int s = 0;
        while (item >= first_item[s + 1]) ++s;
        const Span& span = spans[s];
        item -= first_item[s];
        const int64_t m0 = span.begin + (item / column_blocks) * span.block_rows;
        const int64_t n0 = (item % column_blocks) * block_columns;
        jaxgen_cpu::MatmulBlock(xs, ws, os, depth, columns, m0,
                                std::min(span.end, m0 + span.block_rows), n0,
                                std::min(columns, n0 + block_columns));
      });
  return ffi::Error::Success();
}

}  // namespace

// True when the blocked AVX2 + FMA path was compiled in; without it callers keep XLA's dot.
extern "C" bool JaxgenMatmulHasSimd() { return jaxgen_cpu::kHasSimd; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenMatmulF32, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
