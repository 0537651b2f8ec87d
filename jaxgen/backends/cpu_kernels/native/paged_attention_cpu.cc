// Paged decode attention for XLA:CPU, called through the XLA FFI (jax.ffi.ffi_call).
//
// One query token per sequence reads its keys and values page by page straight from the pool,
// so nothing is gathered or transposed into a temporary: on a 2-core CPU the XLA formulation
// spent most of its time in those copies. Work is split over (sequence, kv head) pairs and run
// on the kernels' worker pool (parallel_for.h). Reference: paged_attention_reference.
//
// Shapes: q [B, Hq, D], k_pages / v_pages [Hkv, P, S, D], lengths [B], block_tables [B, W],
// out [B, Hq, D]; float32 throughout. Rows with length 0 produce zeros.
//
// The 8-bit variant (JaxgenPagedDecodeQ8) reads an int8 or fp8 (e4m3fn) pool as raw bytes,
// k_codes / v_codes [Hkv, P, S, D] uint8 with k_scales / v_scales [Hkv, P, S, G] uint16 (bfloat16 bits; one
// scale per token, head and D / G elements), and dequantises each 8-element load in registers:
// the pool is never expanded to float. The same templated loops serve both pools.

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

// Slot of token t in the pool, through its sequence's block table.
inline int64_t TokenSlot(const Problem& p, const int32_t* table, int64_t t) {
  return static_cast<int64_t>(table[t / p.page_size]) * p.page_size + t % p.page_size;
}

// A float32 pool: one kv head's rows.
struct FloatRows {
  const float* head;
  int64_t dim;
  struct Row {
    const float* values;
    float Load(int64_t d) const { return values[d]; }
  };
  Row At(int64_t slot) const { return {head + slot * dim}; }
};

// fp8 e4m3fn bytes as floats (bias 7, no infinities, 0x7f / 0xff NaN).
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 15, mantissa = code & 7;
      float x = exponent == 0 ? std::ldexp(mantissa / 8.0f, -6)
                              : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
      if (exponent == 15 && mantissa == 7) x = NAN;
      value[code] = (code & 128) ? -x : x;
    }
  }
};
const Fp8Table kFp8;

// A bfloat16 as float32: its bits are float32's top half.
inline float Bfloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// An 8-bit pool (int8 or fp8 codes, bfloat16 scales per `group_width` elements): one kv head's
// rows.
template <bool kFp8Codes>
struct QuantizedRows {
  const uint8_t* codes;
  const uint16_t* scales;
  int64_t dim, groups, group_width;
  struct Row {
    const uint8_t* codes;
    const uint16_t* scales;
    int64_t group_width;
    float Scale(int64_t d) const { return Bfloat16ToFloat(scales[d / group_width]); }
    float Load(int64_t d) const {
      const float code = kFp8Codes ? kFp8.value[codes[d]] : static_cast<int8_t>(codes[d]);
      return code * Scale(d);
    }
  };
  Row At(int64_t slot) const { return {codes + slot * dim, scales + slot * groups, group_width}; }
};

#if defined(__AVX2__) && defined(__FMA__)
// Eight consecutive elements d..d+7 of a row (d a multiple of 8, within one scale group).
inline __m256 Load8(const FloatRows::Row& row, int64_t d) { return _mm256_loadu_ps(row.values + d); }

template <bool kFp8Codes>
inline __m256 Load8(const typename QuantizedRows<kFp8Codes>::Row& row, int64_t d) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.codes + d));
  __m256 codes;
  if constexpr (kFp8Codes) {
    codes = _mm256_i32gather_ps(kFp8.value, _mm256_cvtepu8_epi32(bytes), 4);
  } else {
    codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
  return _mm256_mul_ps(codes, _mm256_set1_ps(row.Scale(d)));
}
inline __m256 Load8(const QuantizedRows<false>::Row& row, int64_t d) { return Load8<false>(row, d); }
inline __m256 Load8(const QuantizedRows<true>::Row& row, int64_t d) { return Load8<true>(row, d); }

inline float HorizontalSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// scores[t] = q . key_t for t in [start, length), four keys at a time: four independent FMA
// chains (one chain per dot product would wait on the FMA latency at every step).
template <class Rows>
void Scores(const Problem& p, const float* q, const Rows& keys, const int32_t* table,
            int64_t start, int64_t length, float* scores) {
  const int64_t dim = p.head_dim;
  int64_t t = start;
  for (; t + 4 <= length; t += 4) {
    const auto k0 = keys.At(TokenSlot(p, table, t));
    const auto k1 = keys.At(TokenSlot(p, table, t + 1));
    const auto k2 = keys.At(TokenSlot(p, table, t + 2));
    const auto k3 = keys.At(TokenSlot(p, table, t + 3));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < dim; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, Load8(k0, d), a0);
      a1 = _mm256_fmadd_ps(qv, Load8(k1, d), a1);
      a2 = _mm256_fmadd_ps(qv, Load8(k2, d), a2);
      a3 = _mm256_fmadd_ps(qv, Load8(k3, d), a3);
    }
    scores[t] = HorizontalSum(a0);
    scores[t + 1] = HorizontalSum(a1);
    scores[t + 2] = HorizontalSum(a2);
    scores[t + 3] = HorizontalSum(a3);
  }
  for (; t < length; ++t) {
    const auto key = keys.At(TokenSlot(p, table, t));
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), Load8(key, d), a);
    }
    scores[t] = HorizontalSum(a);
  }
}

// out[:dim] = sum_t weights[t] * value_t, 64 columns at a time in eight register accumulators
// (accumulating in memory would make every token wait on a store of the previous one).
template <class Rows>
void WeightedValues(const Problem& p, const float* weights, const Rows& values,
                    const int32_t* table, int64_t start, int64_t length, float* out) {
  for (int64_t d0 = 0; d0 < p.head_dim; d0 += 64) {
    const int64_t vectors = std::min<int64_t>(8, (p.head_dim - d0) / 8);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
           c7 = c0;
    for (int64_t t = start; t < length; ++t) {
      const auto v = values.At(TokenSlot(p, table, t));
      const __m256 w = _mm256_broadcast_ss(weights + t);
      c0 = _mm256_fmadd_ps(w, Load8(v, d0), c0);
      if (vectors > 1) c1 = _mm256_fmadd_ps(w, Load8(v, d0 + 8), c1);
      if (vectors > 2) c2 = _mm256_fmadd_ps(w, Load8(v, d0 + 16), c2);
      if (vectors > 3) c3 = _mm256_fmadd_ps(w, Load8(v, d0 + 24), c3);
      if (vectors > 4) c4 = _mm256_fmadd_ps(w, Load8(v, d0 + 32), c4);
      if (vectors > 5) c5 = _mm256_fmadd_ps(w, Load8(v, d0 + 40), c5);
      if (vectors > 6) c6 = _mm256_fmadd_ps(w, Load8(v, d0 + 48), c6);
      if (vectors > 7) c7 = _mm256_fmadd_ps(w, Load8(v, d0 + 56), c7);
    }
    const __m256 sums[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
    for (int64_t j = 0; j < vectors; ++j) _mm256_storeu_ps(out + d0 + 8 * j, sums[j]);
  }
}
constexpr int64_t kVectorWidth = 8;  // the vector paths need head_dim % 8 == 0
#else
constexpr int64_t kVectorWidth = 0;  // portable loops only
template <class Rows>
void Scores(const Problem&, const float*, const Rows&, const int32_t*, int64_t, int64_t,
            float*) {}
template <class Rows>
void WeightedValues(const Problem&, const float*, const Rows&, const int32_t*, int64_t,
                    int64_t, float*) {}
#endif

// One (sequence, kv head) pair: its `group` query heads share every key and value read.
// `keys` / `values` read that kv head's rows of the pool.
template <class Rows>
void AttendOne(const Problem& p, int64_t b, int64_t h, const Rows& keys, const Rows& values,
               std::vector<float>& scores) {
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
  const bool vector = kVectorWidth > 0 && dim % 8 == 0;
  scores.assign(group * length, 0.0f);

  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * length;
    if (vector) {
      Scores(p, q + g * dim, keys, table, start, length, s);
    } else {
      for (int64_t t = start; t < length; ++t) {
        const auto key = keys.At(TokenSlot(p, table, t));
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += q[g * dim + d] * key.Load(d);
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
      WeightedValues(p, s, values, table, start, length, o);
    } else {
      std::fill(o, o + dim, 0.0f);
      for (int64_t t = start; t < length; ++t) {
        const auto value = values.At(TokenSlot(p, table, t));
        for (int64_t d = 0; d < dim; ++d) o[d] += s[t] * value.Load(d);
      }
    }
  }
}

// The problem's fields from q, a pool ([Hkv, P, S, D]) and the tables; an error when inconsistent.
ffi::Error MakeProblem(ffi::Buffer<ffi::F32>& q, ffi::Span<const int64_t> kd,
                       ffi::Buffer<ffi::S32>& lengths, ffi::Buffer<ffi::S32>& block_tables,
                       ffi::ResultBuffer<ffi::F32>& out, float scale, float soft_cap,
                       int64_t sliding_window, Problem& p) {
  auto qd = q.dimensions();
  auto td = block_tables.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: unexpected ranks");
  }
  p = Problem{q.typed_data(), lengths.typed_data(), block_tables.typed_data(), out->typed_data(),
              qd[0], qd[1], kd[0], qd[2], kd[1], kd[2], td[1], scale, soft_cap, sliding_window};
  if (p.num_heads % p.num_kv_heads != 0 || kd[3] != p.head_dim || td[0] != p.batch) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: inconsistent shapes");
  }
  return ffi::Error::Success();
}

// Runs AttendOne over every (sequence, kv head) pair; `rows(pool, h)` gives head h's reader.
template <class MakeRows>
void AttendAll(const Problem& p, const MakeRows& rows) {
  const int64_t items = p.batch * p.num_kv_heads;
  const int64_t chunk = std::max<int64_t>(1, items / (4 * jaxgen_cpu::NumThreads()));
  jaxgen_cpu::ParallelFor(items, chunk, [&p, &rows](int64_t i, std::vector<float>& scores) {
    const int64_t h = i % p.num_kv_heads;
    AttendOne(p, i / p.num_kv_heads, h, rows(0, h), rows(1, h), scores);
  });
}

ffi::Error PagedDecodeImpl(ffi::Buffer<ffi::F32> q,
                           ffi::Buffer<ffi::F32> k_pages, ffi::Buffer<ffi::F32> v_pages,
                           ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> block_tables,
                           ffi::ResultBuffer<ffi::F32> out, float scale, float soft_cap,
                           int64_t sliding_window) {
  Problem p;
  ffi::Error error = MakeProblem(q, k_pages.dimensions(), lengths, block_tables, out, scale,
                                 soft_cap, sliding_window, p);
  if (error.failure()) return error;
  const float* pools[2] = {k_pages.typed_data(), v_pages.typed_data()};
  const int64_t head_stride = p.num_pages * p.page_size * p.head_dim;
  AttendAll(p, [&](int pool, int64_t h) {
    return FloatRows{pools[pool] + h * head_stride, p.head_dim};
  });
  return ffi::Error::Success();
}

template <bool kFp8Codes>
void AttendQuantized(const Problem& p, const uint8_t* const codes[2],
                     const uint16_t* const scales[2], int64_t groups) {
  const int64_t slots = p.num_pages * p.page_size;
  AttendAll(p, [&](int pool, int64_t h) {
    return QuantizedRows<kFp8Codes>{codes[pool] + h * slots * p.head_dim,
                                    scales[pool] + h * slots * groups, p.head_dim, groups,
                                    p.head_dim / groups};
  });
}

ffi::Error PagedDecodeQ8Impl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::U8> k_codes,
                             ffi::Buffer<ffi::U16> k_scales, ffi::Buffer<ffi::U8> v_codes,
                             ffi::Buffer<ffi::U16> v_scales, ffi::Buffer<ffi::S32> lengths,
                             ffi::Buffer<ffi::S32> block_tables, ffi::ResultBuffer<ffi::F32> out,
                             float scale, float soft_cap, int64_t sliding_window, int64_t fp8) {
  Problem p;
  ffi::Error error = MakeProblem(q, k_codes.dimensions(), lengths, block_tables, out, scale,
                                 soft_cap, sliding_window, p);
  if (error.failure()) return error;
  auto sd = k_scales.dimensions();
  const int64_t groups = sd.size() == 4 ? sd[3] : 0;
  if (sd.size() != 4 || sd[0] != p.num_kv_heads || sd[1] != p.num_pages ||
      sd[2] != p.page_size || groups < 1 || p.head_dim % groups != 0 ||
      (groups != 1 && (p.head_dim / groups) % 8 != 0)) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: scales must be [Hkv, P, S, G]");
  }
  const uint8_t* const codes[2] = {k_codes.typed_data(), v_codes.typed_data()};
  const uint16_t* const scales[2] = {k_scales.typed_data(), v_scales.typed_data()};
  if (fp8) {
    AttendQuantized<true>(p, codes, scales, groups);
  } else {
    AttendQuantized<false>(p, codes, scales, groups);
  }
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgenPagedDecodeQ8, PagedDecodeQ8Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::U16>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::U16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("soft_cap")
                                  .Attr<int64_t>("sliding_window")
                                  .Attr<int64_t>("fp8"));
