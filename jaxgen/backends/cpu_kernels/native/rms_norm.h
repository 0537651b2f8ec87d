// RMSNorm of a matmul's input rows, computed by the matmul kernel before its products (the
// "norm prologue"): normed[m, k] = x[m, k] / sqrt(mean_k(x[m, k]^2) + eps) * weight[k], as
// jaxgen.models.linear.rms_norm computes it in float32. In XLA that norm is four small thunks
// (square, partial sums, rsqrt, scale), ~3 us each at decode sizes, twice per layer; here it is a
// pass over rows the kernel reads next anyway. The sum of squares is accumulated in double, so
// the result differs from XLA's float32 tree sum by at most a rounding of the scale.

#pragma once

#include <cmath>
#include <cstdint>

namespace jaxgen_cpu {

// Writes the norm of rows [m0, m1) of x [M, depth] into the same rows of `normed`.
inline void RmsNormRows(const float* x, const float* weight, float eps, int64_t depth, int64_t m0,
                        int64_t m1, float* normed) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* row = x + m * depth;
    double sum = 0.0;
    for (int64_t k = 0; k < depth; ++k) sum += static_cast<double>(row[k]) * row[k];
    const float mean = static_cast<float>(sum / static_cast<double>(depth));
    const float scale = 1.0f / std::sqrt(mean + eps);
    float* out = normed + m * depth;
    for (int64_t k = 0; k < depth; ++k) out[k] = row[k] * scale * weight[k];
  }
}

}  // namespace jaxgen_cpu
