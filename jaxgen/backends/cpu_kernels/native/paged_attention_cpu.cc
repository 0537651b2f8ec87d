// Paged decode attention for XLA:CPU, called through the XLA FFI (jax.ffi.ffi_call).
//
// One query token per sequence reads its keys and values page by page straight from the pool,
// so nothing is gathered or transposed into a temporary: on a 2-core CPU the XLA formulation
// spent most of its time in those copies. Work is split over (sequence, kv head) pairs and run
// on the kernels' worker pool (parallel_for.h). Reference: paged_attention_reference.
//
// Shapes: q [B, Hq, D], k_pages / v_pages [Hkv, P, S, D], lengths [B], block_tables [B, W],
// out [B, Hq, D]; float32 throughout. Rows with length 0 produce zeros.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

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

// Address of token t's row (of one kv head) in the pool.
inline const float* TokenRow(const Problem& p, const float* head, const int32_t* table, int64_t t) {
  const int64_t slot = static_cast<int64_t>(table[t / p.page_size]) * p.page_size + t % p.page_size;
  return head + slot * p.head_dim;
}

#if defined(__AVX2__) && defined(__FMA__)
inline float HorizontalSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// scores[t] = q . key_t for t in [start, length), four keys at a time: four independent FMA
// chains (one chain per dot product would wait on the FMA latency at every step).
void Scores(const Problem& p, const float* q, const float* head, const int32_t* table,
            int64_t start, int64_t length, float* scores) {
  const int64_t dim = p.head_dim;
  int64_t t = start;
  for (; t + 4 <= length; t += 4) {
    const float* k0 = TokenRow(p, head, table, t);
    const float* k1 = TokenRow(p, head, table, t + 1);
    const float* k2 = TokenRow(p, head, table, t + 2);
    const float* k3 = TokenRow(p, head, table, t + 3);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < dim; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    scores[t] = HorizontalSum(a0);
    scores[t + 1] = HorizontalSum(a1);
    scores[t + 2] = HorizontalSum(a2);
    scores[t + 3] = HorizontalSum(a3);
  }
  for (; t < length; ++t) {
    const float* key = TokenRow(p, head, table, t);
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(key + d), a);
    }
    scores[t] = HorizontalSum(a);
  }
}

// out[:dim] = sum_t weights[t] * value_t, 64 columns at a time in eight register accumulators
// (accumulating in memory would make every token wait on a store of the previous one).
void WeightedValues(const Problem& p, const float* weights, const float* head,
                    const int32_t* table, int64_t start, int64_t length, float* out) {
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    const int64_t vectors = std::min<int64_t>(8, (p.head_dim - d0) / 8);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
           c7 = c0;
    for (int64_t t = start; t < length; ++t) {
      const float* v = TokenRow(p, head, table, t) + d0;
      const __m256 w = _mm256_broadcast_ss(weights + t);
      c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), c0);
      if (vectors > 1) c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), c1);
      if (vectors > 2) c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), c2);
      if (vectors > 3) c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), c3);
      if (vectors > 4) c4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 32), c4);
      if (vectors > 5) c5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 40), c5);
      if (vectors > 6) c6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 48), c6);
      if (vectors > 7) c7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 56), c7);
    }
    const __m256 sums[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
    for (int64_t j = 0; j < vectors; ++j) _mm256_storeu_ps(out + d0 + 8 * j, sums[j]);
  }
}
constexpr int64_t kVectorWidth = 8;  // the vector paths need head_dim % 8 == 0
#else
constexpr int64_t kVectorWidth = 0;  // portable loops only
void Scores(const Problem&, const float*, const float*, const int32_t*, int64_t, int64_t,
            float*) {}
void WeightedValues(const Problem&, const float*, const float*, const int32_t*, int64_t,
                    int64_t, float*) {}
#endif

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
  const bool vector = kVectorWidth > 0 && dim % 8 == 0;
  scores.assign(group * length, 0.0f);

  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * length;
    if (vector) {
      Scores(p, q + g * dim, k_head, table, start, length, s);
    } else {
      for (int64_t t = start; t < length; ++t) {
        const float* key = TokenRow(p, k_head, table, t);
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += q[g * dim + d] * key[d];
        s[t] = dot;
      }
    }
    float max_score = -INFINITY;
    for (int64_t t = start; t < length; ++t) {
      float x = s[t] * p.scale;
      if (p.soft_cap > 0.0f) x = p.soft_cap * std::tanh(x / p.soft_cap);
      s[t] = x;
      max_score = std::max(max_score, x);
    }
    float total = 0.0f;
    for (int64_t t = start; t < length; ++t) s[t] = ExpNonPositive(s[t] - max_score);
    for (int64_t t = start; t < length; ++t) total += s[t];
    const float inv = 1.0f / total;
    for (int64_t t = start; t < length; ++t) s[t] *= inv;
    float* o = out + g * dim;
    if (vector) {
      WeightedValues(p, s, v_head, table, start, length, o);
    } else {
      std::fill(o, o + dim, 0.0f);
      for (int64_t t = start; t < length; ++t) {
        const float* value = TokenRow(p, v_head, table, t);
        for (int64_t d = 0; d < dim; ++d) o[d] += s[t] * value[d];
      }
    }
  }
}

ffi::Error PagedDecodeImpl(ffi::Buffer<ffi::F32> q,
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
  const int64_t chunk = std::max<int64_t>(1, items / (4 * jaxgen_cpu::NumThreads()));
  jaxgen_cpu::ParallelFor(items, chunk, [&p](int64_t i, std::vector<float>& scores) {
    AttendOne(p, i / p.num_kv_heads, i % p.num_kv_heads, scores);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenPagedDecodeF32, PagedDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("soft_cap")
                                  .Attr<int64_t>("sliding_window"));
