// Dense float32 matmul for XLA:CPU over panel-packed weights, called through the XLA FFI.
//
// out[M, N] = x[M, K] @ w[K, N] with w given packed as [N / 24, K, 24] (pack_weight in
// matmul_cpu.py). The blocking lives in matmul_f32.h; this file splits the output into
// (row block, column block) items and runs them on XLA's intra-op thread pool. Reference:
// jnp.dot on the unpacked weight (tests/test_matmul_cpu.py).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "matmul_f32.h"
#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::Buffer<ffi::F32> packed, ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  if (xd.size() != 2 || pd.size() != 3 || pd[2] != jaxgen_cpu::kPanelWidth || pd[1] != xd[1]) {
    return ffi::Error::InvalidArgument("matmul_cpu: x [M, K] and packed w [N/24, K, 24] expected");
  }
  const int64_t rows = xd[0], depth = xd[1];
  const int64_t panels = pd[0], columns = panels * jaxgen_cpu::kPanelWidth;
  // Column blocks of a few panels; rows split too when there are too few column blocks to keep
  // every thread busy, and capped at 128 so a row block of x (128 KB per k-block) stays in L2.
  const int64_t workers = pool.num_threads() + 1;
  const int64_t block_panels = panels > 64 ? 8 : 4;
  const int64_t column_blocks = (panels + block_panels - 1) / block_panels;
  const int64_t row_tiles = (rows + jaxgen_cpu::kTileRows - 1) / jaxgen_cpu::kTileRows;
  int64_t row_blocks = std::max<int64_t>((3 * workers + column_blocks - 1) / column_blocks,
                                         (rows + 127) / 128);
  row_blocks = std::max<int64_t>(1, std::min(row_blocks, row_tiles));
  const int64_t block_rows = (row_tiles + row_blocks - 1) / row_blocks * jaxgen_cpu::kTileRows;
  row_blocks = (rows + block_rows - 1) / block_rows;

  const float* xs = x.typed_data();
  const float* ws = packed.typed_data();
  float* os = out->typed_data();
  const int64_t block_columns = block_panels * jaxgen_cpu::kPanelWidth;
  jaxgen_cpu::ParallelFor(pool, row_blocks * column_blocks, 1,
                          [=](int64_t item, std::vector<float>&) {
                            const int64_t m0 = (item / column_blocks) * block_rows;
                            const int64_t n0 = (item % column_blocks) * block_columns;
                            jaxgen_cpu::MatmulBlock(xs, ws, os, depth, columns, m0,
                                                    std::min(rows, m0 + block_rows), n0,
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
                                  .Ret<ffi::Buffer<ffi::F32>>());
