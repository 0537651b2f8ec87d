// Paged decode attention for XLA:CPU, called through the XLA FFI (jax.ffi.ffi_call).
//
// One query token per sequence reads its keys and values page by page straight from the pool,
// so nothing is gathered or transposed into a temporary: on a 2-core CPU the XLA formulation
// spent most of its time in those copies. Work is split over (sequence, kv head) pairs and run
// on XLA's intra-op thread pool. The pure-JAX reference is paged_attention_reference.
//
// Shapes: q [B, Hq, D], k_pages / v_pages [Hkv, P, S, D], lengths [B], block_tables [B, W],
// out [B, Hq, D]; float32 throughout. Rows with length 0 produce zeros.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Problem {
  const float* q;
  const float* k;
  const float* v;
  const int32_t* lengths;
  const int32_t* tables;
  float* out;
  int64_t batch, num_heads, num_kv_heads, head_dim, num_pages, page_size, width;
  float scale, soft_cap;
  int64_t sliding_window;
};

// exp for x <= 0 (softmax after subtracting the max), written so the compiler vectorises it:
// Cody-Waite range reduction and Cephes' degree-5 polynomial, relative error ~2e-7.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float k = std::floor(x * 1.44269504f + 0.5f);
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// One (sequence, kv head) pair: its `group` query heads share every key and value read.
void AttendOne(const Problem& p, int64_t b, int64_t h, std::vector<float>& scores) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t dim = p.head_dim;
  float* out = p.out + (b * p.num_heads + h * group) * dim;
  const int64_t length = std::min<int64_t>(p.lengths[b], p.width * p.page_size);
  if (length <= 0) {
    std::fill(out, out + group * dim, 0.0f);
    return;
  }
  const int64_t start = p.sliding_window > 0 ? std::max<int64_t>(0, length - p.sliding_window) : 0;
  const float* q = p.q + (b * p.num_heads + h * group) * dim;
  const int32_t* table = p.tables + b * p.width;
  const int64_t head_stride = p.num_pages * p.page_size * dim;
  const float* k_head = p.k + h * head_stride;
  const float* v_head = p.v + h * head_stride;
  scores.assign(group * length, 0.0f);

  for (int64_t t = start; t < length; ++t) {
    const int64_t slot = static_cast<int64_t>(table[t / p.page_size]) * p.page_size + t % p.page_size;
    const float* key = k_head + slot * dim;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * dim;
      float dot = 0.0f;
      for (int64_t d = 0; d < dim; ++d) dot += qg[d] * key[d];
      dot *= p.scale;
      if (p.soft_cap > 0.0f) dot = p.soft_cap * std::tanh(dot / p.soft_cap);
      scores[g * length + t] = dot;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * length;
    float max_score = -INFINITY;
    for (int64_t t = start; t < length; ++t) max_score = std::max(max_score, s[t]);
    float total = 0.0f;
    for (int64_t t = start; t < length; ++t) s[t] = ExpNonPositive(s[t] - max_score);
    for (int64_t t = start; t < length; ++t) total += s[t];
    const float inv = 1.0f / total;
    for (int64_t t = start; t < length; ++t) s[t] *= inv;
    std::fill(out + g * dim, out + (g + 1) * dim, 0.0f);
  }
  for (int64_t t = start; t < length; ++t) {
    const int64_t slot = static_cast<int64_t>(table[t / p.page_size]) * p.page_size + t % p.page_size;
    const float* value = v_head + slot * dim;
    for (int64_t g = 0; g < group; ++g) {
      const float w = scores[g * length + t];
      float* o = out + g * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] += w * value[d];
    }
  }
}

ffi::Error PagedDecodeImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                           ffi::Buffer<ffi::F32> k_pages, ffi::Buffer<ffi::F32> v_pages,
                           ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> block_tables,
                           ffi::ResultBuffer<ffi::F32> out, float scale, float soft_cap,
                           int64_t sliding_window) {
  auto qd = q.dimensions();
  auto kd = k_pages.dimensions();
  auto td = block_tables.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: unexpected ranks");
  }
  Problem p{q.typed_data(), k_pages.typed_data(), v_pages.typed_data(), lengths.typed_data(),
            block_tables.typed_data(), out->typed_data(),
            qd[0], qd[1], kd[0], qd[2], kd[1], kd[2], td[1], scale, soft_cap, sliding_window};
  if (p.num_heads % p.num_kv_heads != 0 || kd[3] != p.head_dim || td[0] != p.batch) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: inconsistent shapes");
  }
  const int64_t items = p.batch * p.num_kv_heads;
  const int64_t chunk = std::max<int64_t>(1, items / (4 * (pool.num_threads() + 1)));
  jaxgen_cpu::ParallelFor(pool, items, chunk, [&p](int64_t i, std::vector<float>& scores) {
    AttendOne(p, i / p.num_kv_heads, i % p.num_kv_heads, scores);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenPagedDecodeF32, PagedDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("soft_cap")
                                  .Attr<int64_t>("sliding_window"));
