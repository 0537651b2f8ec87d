// Quantised-weight matmul for XLA:CPU, called through the XLA FFI.
//
// out_i[M, N_i] = x[M, K] @ dequant(w_i)[K, N_i] for a group of weights of one kind that read
// the same x (q/k/v; gate/up), each given as its packed values, scales and minimums (int4, and
// int8 with `has_mins`: GGUF's Q5_1 / Q5_K), float16 or (`scale_bits` 32: a K-quant's d times
// its sub-block scale) float32, or two-level (`super_groups` > 0: float16 super-block scales and
// minimums with int8 codes per group, a GGUF K-quant's own form; quantized_panels.h)
// (matmul_quantized.h has the layout and the tile), int4 codes optionally indexing a 16-entry
// `codebook` (IQ4_NL / IQ4_XS; no minimums), found at element offsets of their
// buffers (attributes `panels`, `groups` and `offsets`, per weight): a weight's own arrays, or
// buffers shared by every weight of a model so that a step passes three arrays, not hundreds.
// As the float32 kernel (matmul_cpu.cc): one call per group, only the rows in the two
// `live_rows` spans computed (the rest are zeros), the outputs split into (row block, weight,
// column block) items on the kernels' worker pool (column_blocks.h). With a non-empty
// `norm_weight` [K], x is an RMSNorm's input: the live rows are normed first (rms_norm.h;
// epsilon `eps`) and the products read the normed rows. With `activation_bits` 8 or 16 (int8
// weights; int4 ones take 8; needs AVX-512 VNNI, JaxgenW8A8HasVnni) the live rows are quantised
// per row and 32 columns and the products summed in integers (matmul_w8a8.h, matmul_w4a8.h).
// Reference:
// QuantizedWeight.matmul (tests/test_matmul_quantized_cpu.py).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "column_blocks.h"
#include "matmul_quantized.h"
#include "matmul_w4a8.h"
#include "matmul_w8a8.h"
#include "parallel_for.h"
#include "rms_norm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kSpans = 2;

struct Weight {
  jaxgen_cpu::QuantizedPanels panels;
  float* out;
  int64_t block_columns;
};

struct Item {
  int64_t w, m0, m1, n0, n1;
};

// Rows per block: all of them up to `whole` (one tile takes them: the weights read once, the
// threads sharing the columns), else whole 4-row tiles, enough blocks to give every thread
// work, at most 64 rows.
int64_t BlockRows(int64_t rows, int64_t column_blocks, int64_t threads, int64_t whole) {
  if (rows <= whole) return rows;
  const int64_t tiles = (rows + 3) / 4;
  int64_t blocks = std::max<int64_t>((3 * threads + column_blocks - 1) / column_blocks,
                                     (rows + 63) / 64);
  blocks = std::max<int64_t>(1, std::min(blocks, tiles));
  return (tiles + blocks - 1) / blocks * 4;
}

ffi::Error QuantizedMatmulImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> live_rows,
                               ffi::Buffer<ffi::F32> norm_weight, ffi::RemainingArgs args,
                               ffi::RemainingRets outs, float eps, int64_t bits,
                               int64_t activation_bits, int64_t scale_bits, int64_t has_mins,
                               int64_t super_groups, ffi::Span<const int64_t> book,
                               ffi::Span<const int64_t> panel_counts,
                               ffi::Span<const int64_t> group_counts,
                               ffi::Span<const int64_t> offsets) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("matmul_quantized_cpu: x [M, K]");
  if (live_rows.element_count() != 2 * kSpans) {
    return ffi::Error::InvalidArgument("matmul_quantized_cpu: live_rows [2, 2] expected");
  }
  if (bits != 4 && bits != 8) return ffi::Error::InvalidArgument("matmul_quantized_cpu: bits");
  const bool two_level = super_groups > 0;
  const bool has_book = book.size() != 0;
  if ((scale_bits != 16 && scale_bits != 32) ||
      (bits == 4 && !has_mins && !two_level && !has_book) || super_groups < 0 ||
      (two_level && scale_bits != 16) ||
      (has_book && (book.size() != 16 || bits != 4 || has_mins || activation_bits != 32))) {
    return ffi::Error::InvalidArgument(
        "matmul_quantized_cpu: scale_bits 16 or 32 (two-level: 16); int4 mins; a codebook: 16 "
        "numbers for int4 codes without mins, float activations");
  }
  int8_t codebook[16];  // the numbers int4 codes index (has_book)
  for (size_t i = 0; has_book && i < 16; ++i) {
    if (book[i] < -128 || book[i] > 127) {
      return ffi::Error::InvalidArgument("matmul_quantized_cpu: codebook numbers are int8");
    }
    codebook[i] = static_cast<int8_t>(book[i]);
  }
  const bool float_scales = scale_bits == 32;
  const bool integer_activations = activation_bits == 8 || activation_bits == 16;
  if (!integer_activations && activation_bits != 32) {
    return ffi::Error::InvalidArgument("matmul_quantized_cpu: activation_bits 32, 16 or 8");
  }
  if (integer_activations &&
      (!jaxgen_cpu::kW8A8Vnni || float_scales || two_level || (bits == 8 && has_mins) || (bits == 4 && activation_bits != 8) || xd.size() != 2 ||
       xd[1] % jaxgen_cpu::kActivationGroup != 0)) {
    return ffi::Error::InvalidArgument(
        "matmul_quantized_cpu: integer activations need int8 weights without minimums (int4 "
        "ones: 8-bit activations) with float16 scales, K a multiple of 32 and AVX-512 VNNI");
  }
  const bool int4 = bits == 4;
  // Per weight: values, scales, [mins], [scale codes, [min codes]] (two-level).
  const size_t per_weight = (has_mins ? 3 : 2) + (two_level ? (has_mins ? 2 : 1) : 0);
  const size_t count = outs.size();
  constexpr size_t kOffsets = 5;  // values, scales, mins, scale codes, min codes
  if (count == 0 || args.size() != per_weight * count || panel_counts.size() != count ||
      group_counts.size() != count || offsets.size() != kOffsets * count) {
    return ffi::Error::InvalidArgument("matmul_quantized_cpu: arguments per weight mismatch");
  }
  const int64_t rows = xd[0], depth = xd[1];
  const bool normed = norm_weight.element_count() != 0;
  if (normed && static_cast<int64_t>(norm_weight.element_count()) != depth) {
    return ffi::Error::InvalidArgument("matmul_quantized_cpu: norm_weight [K] expected");
  }
  const int64_t code_rows = int4 ? depth / 2 : depth;
  std::vector<Weight> group;
  int64_t column_blocks = 0;
  // The weight-only tiles take up to kQuantizedStreamRows rows whole, W4A8's 8; W8A8's blocks
  // keep 4.
  const bool w4a8 = integer_activations && int4;
  const int64_t whole_rows = w4a8                  ? 8
                             : integer_activations ? 0
                                                   : jaxgen_cpu::kWholeBlockRows;
  const std::vector<int64_t> block_panels = jaxgen_cpu::ColumnBlockPanels(
      std::vector<int64_t>(panel_counts.begin(), panel_counts.end()),
      jaxgen_cpu::LiveRowCount(live_rows.typed_data(), kSpans, rows), jaxgen_cpu::NumThreads(),
      w4a8 ? 8 : integer_activations ? 4 : jaxgen_cpu::kQuantizedStreamRows);
  for (size_t i = 0; i < count; ++i) {
    auto values = args.get<ffi::AnyBuffer>(per_weight * i);
    auto scales = args.get<ffi::AnyBuffer>(per_weight * i + 1);
    auto out = outs.get<ffi::Buffer<ffi::F32>>(i);
    if (!values.has_value() || !scales.has_value() || !out.has_value()) {
      return ffi::Error::InvalidArgument("matmul_quantized_cpu: bad buffers");
    }
    const ffi::DataType scale_type = float_scales ? ffi::DataType::F32 : ffi::DataType::F16;
    if (scales->element_type() != scale_type) {
      return ffi::Error::InvalidArgument("matmul_quantized_cpu: scales' dtype (scale_bits)");
    }
    // Weight i is `panels` panels of codes [code_rows, 16] and scales (and mins) [groups, 16]
    // (two-level: [groups / super_groups, 16], and codes [groups, 16]) at element
    // `offsets[5i..5i+4]` of its buffers: its own arrays, or buffers it shares.
    const int64_t panels = panel_counts[i], groups = group_counts[i];
    const int64_t* offset = &offsets[kOffsets * i];
    const int64_t code_end = offset[0] + panels * code_rows * jaxgen_cpu::kQuantPanel;
    const int64_t group_elements = panels * groups * jaxgen_cpu::kQuantPanel;
    const int64_t scale_elements = two_level ? group_elements / super_groups : group_elements;
    if (panels < 1 || groups < 1 || depth % groups != 0 ||
        (two_level && groups % super_groups != 0) ||
        (int4 && (depth / groups) % jaxgen_cpu::kInt4BlockRows != 0) ||
        (integer_activations && (depth / groups) % jaxgen_cpu::kActivationGroup != 0) ||
        std::any_of(offset, offset + kOffsets, [](int64_t o) { return o < 0; }) ||
        code_end > static_cast<int64_t>(values->element_count()) ||
        offset[1] + scale_elements > static_cast<int64_t>(scales->element_count()) ||
        (*out)->element_count() != static_cast<size_t>(rows * panels * jaxgen_cpu::kQuantPanel)) {
      return ffi::Error::InvalidArgument("matmul_quantized_cpu: packed weight shapes");
    }
    const void* mins = nullptr;
    if (has_mins) {
      auto m = args.get<ffi::AnyBuffer>(per_weight * i + 2);
      if (!m.has_value() ||
          offset[2] + scale_elements > static_cast<int64_t>(m->element_count()) ||
          m->element_type() != scale_type) {
        return ffi::Error::InvalidArgument("matmul_quantized_cpu: mins");
      }
      mins = static_cast<const uint8_t*>(m->untyped_data()) + offset[2] * (scale_bits / 8);
    }
    const int8_t* group_codes[2] = {nullptr, nullptr};  // two-level scale and min codes
    for (int c = 0; two_level && c < (has_mins ? 2 : 1); ++c) {
      auto codes = args.get<ffi::AnyBuffer>(per_weight * i + (has_mins ? 3 : 2) + c);
      if (!codes.has_value() || codes->element_type() != ffi::DataType::S8 ||
          offset[3 + c] + group_elements > static_cast<int64_t>(codes->element_count())) {
        return ffi::Error::InvalidArgument("matmul_quantized_cpu: two-level scale codes");
      }
      group_codes[c] = static_cast<const int8_t*>(codes->untyped_data()) + offset[3 + c];
    }
    const int64_t blocks = (panels + block_panels[i] - 1) / block_panels[i];
    jaxgen_cpu::QuantizedPanels p{
        static_cast<const uint8_t*>(values->untyped_data()) + offset[0],
        static_cast<const uint8_t*>(scales->untyped_data()) + offset[1] * (scale_bits / 8),
        mins,
        depth,
        panels * jaxgen_cpu::kQuantPanel,
        depth / groups,
        int4,
        float_scales,
        group_codes[0],
        group_codes[1],
        two_level ? super_groups : 1,
        has_book ? codebook : nullptr};
    group.push_back({p, (*out)->typed_data(), block_panels[i] * jaxgen_cpu::kQuantPanel});
    column_blocks += blocks;
  }
  struct Span {
    int64_t begin, end, block_rows;
  } spans[kSpans];
  const int32_t* bounds = live_rows.typed_data();
  for (int s = 0; s < kSpans; ++s) {
    const int64_t begin = std::clamp<int64_t>(bounds[2 * s], 0, rows);
    const int64_t end = std::clamp<int64_t>(bounds[2 * s + 1], begin, rows);
    const int64_t threads = jaxgen_cpu::NumThreads();
    const int64_t block_rows =
        end > begin ? BlockRows(end - begin, column_blocks, threads, whole_rows) : 1;
    spans[s] = {begin, end, block_rows};
  }
  for (const Weight& w : group) {
    const int64_t n = w.panels.columns;
    for (int64_t m = 0; m < rows; ++m) {
      bool live = false;
      for (const auto& span : spans) live |= span.begin <= m && m < span.end;
      if (!live) std::fill(w.out + m * n, w.out + (m + 1) * n, 0.0f);
    }
  }
  std::vector<Item> items;
  for (const auto& span : spans) {
    for (int64_t m0 = span.begin; m0 < span.end; m0 += span.block_rows) {
      const int64_t m1 = std::min(span.end, m0 + span.block_rows);
      for (int64_t w = 0; w < static_cast<int64_t>(group.size()); ++w) {
        const int64_t n = group[w].panels.columns;
        for (int64_t n0 = 0; n0 < n; n0 += group[w].block_columns) {
          items.push_back({w, m0, m1, n0, std::min(n, n0 + group[w].block_columns)});
        }
      }
    }
  }
  const float* xs = x.typed_data();
  if (normed) {  // the products read the normed rows; rows outside the spans are never read
    thread_local std::vector<float> normed_rows;
    normed_rows.resize(rows * depth);
    for (const auto& span : spans) {
      jaxgen_cpu::RmsNormRows(xs, norm_weight.typed_data(), eps, depth, span.begin, span.end,
                              normed_rows.data());
    }
    xs = normed_rows.data();
  }
#if defined(JAXGEN_W8A8_VNNI)
  if (w4a8) {  // x's signed codes in the int4 lanes' order, then integer products
    thread_local std::vector<int8_t> codes;
    thread_local std::vector<float> scales, minimum_factors;
    const int64_t activation_groups = depth / jaxgen_cpu::kActivationGroup;
    codes.resize(rows * depth);
    scales.resize(rows * activation_groups);
    minimum_factors.resize(rows * activation_groups);
    for (const auto& span : spans) {
      jaxgen_cpu::QuantizeRowsInt4Order(xs, depth, span.begin, span.end, codes.data(),
                                        scales.data(), minimum_factors.data());
    }
    const int8_t* code_data = codes.data();
    const float* scale_data = scales.data();
    const float* factor_data = minimum_factors.data();
    jaxgen_cpu::ParallelFor(items.size(), 1, [&](int64_t i, std::vector<float>&) {
      const Item& item = items[i];
      jaxgen_cpu::W4A8Block(group[item.w].panels, code_data, scale_data, factor_data,
                            group[item.w].out, item.m0, item.m1,
                            item.n0 / jaxgen_cpu::kQuantPanel, item.n1 / jaxgen_cpu::kQuantPanel);
    });
    return ffi::Error::Success();
  }
  if (integer_activations) {  // x's codes and scales for the live rows, then integer products
    thread_local std::vector<uint8_t> codes;
    thread_local std::vector<float> scales;
    const bool wide = activation_bits == 16;
    codes.resize(rows * depth * (wide ? 2 : 1));
    scales.resize(rows * depth / jaxgen_cpu::kActivationGroup);
    for (const auto& span : spans) {
      if (wide) {
        jaxgen_cpu::QuantizeRows<16>(xs, depth, span.begin, span.end, codes.data(),
                                     scales.data());
      } else {
        jaxgen_cpu::QuantizeRows<8>(xs, depth, span.begin, span.end, codes.data(), scales.data());
      }
    }
    const uint8_t* code_data = codes.data();
    const float* scale_data = scales.data();
    jaxgen_cpu::ParallelFor(items.size(), 1, [&](int64_t i, std::vector<float>&) {
      const Item& item = items[i];
      const Weight& w = group[item.w];
      const int64_t p0 = item.n0 / jaxgen_cpu::kQuantPanel;
      const int64_t p1 = item.n1 / jaxgen_cpu::kQuantPanel;
      if (wide) {
        jaxgen_cpu::W8A8Block<16>(w.panels, code_data, scale_data, w.out, item.m0, item.m1, p0,
                                  p1);
      } else {
        jaxgen_cpu::W8A8Block<8>(w.panels, code_data, scale_data, w.out, item.m0, item.m1, p0,
                                 p1);
      }
    });
    return ffi::Error::Success();
  }
#endif
  jaxgen_cpu::ParallelFor(items.size(), 1, [&](int64_t i, std::vector<float>& scratch) {
    const Item& item = items[i];
    const Weight& w = group[item.w];
    const auto& p = w.panels;
    if (two_level && int4) {
      jaxgen_cpu::QuantizedMatmulBlock<true, float, true>(p, xs, w.out, item.m0, item.m1,
                                                          item.n0, item.n1, scratch);
    } else if (two_level) {
      jaxgen_cpu::QuantizedMatmulBlock<false, float, true>(p, xs, w.out, item.m0, item.m1,
                                                           item.n0, item.n1, scratch);
      if (p.mins) {
        jaxgen_cpu::AddGroupMins<float, true>(p, xs, w.out, item.m0, item.m1, item.n0, item.n1);
      }
    } else if (int4 && float_scales) {
      jaxgen_cpu::QuantizedMatmulBlock<true, float>(p, xs, w.out, item.m0, item.m1, item.n0,
                                                    item.n1, scratch);
    } else if (int4) {
      jaxgen_cpu::QuantizedMatmulBlock<true, uint16_t>(p, xs, w.out, item.m0, item.m1, item.n0,
                                                       item.n1, scratch);
    } else if (float_scales) {
      jaxgen_cpu::QuantizedMatmulBlock<false, float>(p, xs, w.out, item.m0, item.m1, item.n0,
                                                     item.n1, scratch);
      if (p.mins) jaxgen_cpu::AddGroupMins<float>(p, xs, w.out, item.m0, item.m1, item.n0, item.n1);
    } else {
      jaxgen_cpu::QuantizedMatmulBlock<false, uint16_t>(p, xs, w.out, item.m0, item.m1, item.n0,
                                                        item.n1, scratch);
      if (p.mins) {
        jaxgen_cpu::AddGroupMins<uint16_t>(p, xs, w.out, item.m0, item.m1, item.n0, item.n1);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

// True when the AVX2 + FMA + F16C path was compiled in; without it callers keep XLA's path.
extern "C" bool JaxgenQuantizedMatmulHasSimd() { return jaxgen_cpu::kQuantizedSimd; }

// True when the integer-activation path (AVX-512 VNNI + VBMI) was compiled in; without it
// weights with int8 activations quantise x in XLA and those with int16 ones take x as it is.
extern "C" bool JaxgenW8A8HasVnni() { return jaxgen_cpu::kW8A8Vnni; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenMatmulQuantized, QuantizedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("activation_bits")
                                  .Attr<int64_t>("scale_bits")
                                  .Attr<int64_t>("has_mins")
                                  .Attr<int64_t>("super_groups")
                                  .Attr<ffi::Span<const int64_t>>("codebook")
                                  .Attr<ffi::Span<const int64_t>>("panels")
                                  .Attr<ffi::Span<const int64_t>>("groups")
                                  .Attr<ffi::Span<const int64_t>>("offsets"));
