// Kernel bodies shared by the SIMD tiers, written once over an ISA policy struct S (block decoders,
// dot product, reductions). Included only by the per-tier translation units, and everything here
// has internal linkage: each tier compiles its own copy with its own -m flags (an inline function
// shared across tiers could otherwise be merged by the linker into the copy of a higher tier).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "ops/cache_pack.h"
#include "ops/kernels.h"
#include "ops/select.h"

namespace dsv41::ops {
namespace {

constexpr int64_t kRowChunk = 2048;

// Shapes beyond the SIMD kernels' stack buffers go to the scalar reference tier.
inline void sparse_attention_fallback(const float* q, int64_t heads, int64_t dim,
                                      const uint8_t* const* rows, const uint8_t* kinds,
                                      int64_t nrows, float scale, const float* sink, float* out) {
  kernels_for(Isa::kScalar).sparse_attention(q, heads, dim, rows, kinds, nrows, scale, sink, out);
}  // weights decoded per step (a multiple of 32; 8 KB of fp32)

inline float e8m0_scalar(uint8_t s) {
  return s == 255 ? NAN : std::ldexp(1.0f, int(s) - 127);
}

inline float e4m3_scalar(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  if ((b & 0x7F) == 0x7F) v = NAN;
  return (b & 0x80) ? -v : v;
}

// acc[t] += buf . x_t for every token, four tokens per pass over buf (one load of each weight
// vector feeds four FMAs), the rest one by one.
template <typename S>
inline void dots_all_tokens(const float* buf, int64_t n, const float* x, int64_t stride,
                            int64_t ntok, float* acc) {
  int64_t t = 0;
  for (; t + 4 <= ntok; t += 4) S::dot4(buf, x + t * stride, stride, n, acc + t);
  for (; t < ntok; ++t) acc[t] += S::dot(buf, x + t * stride, n);
}

// Several tokens: rows are decoded four at a time and each token vector is loaded once per four
// rows (two tokens per pass: 4 x 2 accumulators), so the activations stream from cache a quarter as
// often as with one row at a time.
constexpr int64_t kTileRows = 4, kTileChunk = 1024;

// acc[r * 16 + t] += buf_r . x_t for the four decoded rows and every token.
template <typename S>
inline void tile_dots(const float* buf, int64_t n, const float* x, int64_t stride, int64_t ntok,
                      float* acc) {
  int64_t t = 0;
  for (; t + 2 <= ntok; t += 2)
    S::dot4x2(buf, kTileChunk, x + t * stride, x + (t + 1) * stride, n, acc + t, 16);
  for (; t < ntok; ++t)
    for (int64_t r = 0; r < kTileRows; ++r)
      acc[r * 16 + t] += S::dot(buf + r * kTileChunk, x + t * stride, n);
}

// Rows [o, o + 4) of a GEMV with `decode(row, c0, n, dst)` filling dst with n weights of `row` from
// column c0 (scales applied); y[t * out + row] for every token.
template <typename S, typename Decode>
inline void tile_rows(int64_t o, int64_t out, int64_t in, const float* x, int64_t ntok, float* y,
                      const Decode& decode) {
  alignas(64) float buf[kTileRows * kTileChunk];
  float acc[kTileRows * 16] = {};
  for (int64_t c0 = 0; c0 < in; c0 += kTileChunk) {
    const int64_t n = std::min(kTileChunk, in - c0);
    for (int64_t r = 0; r < kTileRows; ++r) decode(o + r, c0, n, buf + r * kTileChunk);
    tile_dots<S>(buf, n, x + c0, in, ntok, acc);
  }
  for (int64_t r = 0; r < kTileRows; ++r)
    for (int64_t t = 0; t < ntok; ++t) y[t * out + o + r] = acc[r * 16 + t];
}

template <typename S>
void fp8_gemv_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                   int64_t ntok, float* y) {
  alignas(64) float buf[kRowChunk];
  float acc[16];
  const int64_t sin = (in + 31) / 32;
  auto decode = [&](int64_t o, int64_t c0, int64_t n, float* dst) {
    const uint8_t* row = w + o * in;
    const uint8_t* srow = scale + (o / 32) * sin;
    for (int64_t b = 0; b < n; b += 32)
      S::fp8_block(row + c0 + b, e8m0_scalar(srow[(c0 + b) / 32]), dst + b,
                   std::min<int64_t>(32, n - b));
  };
  int64_t o = 0;
  if (ntok > 1)
    for (; o + kTileRows <= out; o += kTileRows) tile_rows<S>(o, out, in, x, ntok, y, decode);
  for (; o < out; ++o) {
    if (ntok == 1) {  // one token: decode and multiply in registers, no buffer
      y[o] = S::fp8_row_dot(w + o * in, scale + (o / 32) * sin, in, x);
      continue;
    }
    std::fill(acc, acc + ntok, 0.0f);
    for (int64_t c0 = 0; c0 < in; c0 += kRowChunk) {
      const int64_t n = std::min(kRowChunk, in - c0);
      decode(o, c0, n, buf);
      dots_all_tokens<S>(buf, n, x + c0, in, ntok, acc);
    }
    for (int64_t t = 0; t < ntok; ++t) y[t * out + o] = acc[t];
  }
}

// Dot products of one MXFP4 row with every token's activations, accumulated into acc[0..ntok).
template <typename S>
void fp4_row_dots(const uint8_t* row, const uint8_t* srow, int64_t in, const float* x, int64_t ntok,
                  float* acc) {
  if (ntok == 1) {  // one token: decode and multiply in registers, no buffer
    acc[0] = S::fp4_row_dot(row, srow, in, x);
    return;
  }
  alignas(64) float buf[kRowChunk];
  std::fill(acc, acc + ntok, 0.0f);
  for (int64_t c0 = 0; c0 < in; c0 += kRowChunk) {
    const int64_t n = std::min(kRowChunk, in - c0);
    for (int64_t b = 0; b < n; b += 32)
      S::fp4_block(row + (c0 + b) / 2, e8m0_scalar(srow[(c0 + b) / 32]), buf + b);
    dots_all_tokens<S>(buf, n, x + c0, in, ntok, acc);
  }
}

template <typename S>
void mxfp4_gemv_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                     const float* x, int64_t ntok, float* y) {
  float acc[16];
  auto decode = [&](int64_t o, int64_t c0, int64_t n, float* dst) {
    const uint8_t* row = w + o * (in / 2);
    const uint8_t* srow = scale + o * (in / 32);
    for (int64_t b = 0; b < n; b += 32)
      S::fp4_block(row + (c0 + b) / 2, e8m0_scalar(srow[(c0 + b) / 32]), dst + b);
  };
  int64_t o = 0;
  if (ntok > 1)
    for (; o + kTileRows <= out; o += kTileRows) tile_rows<S>(o, out, in, x, ntok, y, decode);
  for (; o < out; ++o) {
    fp4_row_dots<S>(w + o * (in / 2), scale + o * (in / 32), in, x, ntok, acc);
    for (int64_t t = 0; t < ntok; ++t) y[t * out + o] = acc[t];
  }
}

template <typename S>
void mxfp4_gate_up_impl(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                        const float* x, const float* route, int64_t ntok, float limit, float* h) {
  float g[16], u[16];
  for (int64_t j = 0; j < inter; ++j) {
    fp4_row_dots<S>(w13 + (2 * j) * (dim / 2), s13 + (2 * j) * (dim / 32), dim, x, ntok, g);
    fp4_row_dots<S>(w13 + (2 * j + 1) * (dim / 2), s13 + (2 * j + 1) * (dim / 32), dim, x, ntok, u);
    for (int64_t t = 0; t < ntok; ++t) {
      const float gc = std::min(g[t], limit), uc = std::clamp(u[t], -limit, limit);
      h[t * inter + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
    }
  }
}

template <typename S>
void rmsnorm_impl(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float r = 1.0f / std::sqrt(S::sum_squares(x, n) / float(n) + eps);
  S::scale_mul(x, w, r, n, y);
}

// hc = 4 (the model's hc_mult): the 4x4 Sinkhorn steps on SSE rows, each lane doing exactly the
// reference's operations in its order (column sums add rows top to bottom; row sums add a
// transposed copy left to right), so the result is bit-identical; the exps stay scalar (std::exp).
// Other hc use the reference.
inline void hc_sinkhorn_simd(const float* m, const float* base, const float* scale, int64_t hc,
                             float eps, int64_t iters, float* pre, float* post, float* comb) {
  if (hc != 4) return hc_sinkhorn_ref(m, base, scale, hc, eps, iters, pre, post, comb);
  // Sigmoids and the row softmax exactly as the reference (scalar), then the iterations in SIMD.
  hc_sinkhorn_ref(m, base, scale, hc, eps, 0, pre, post, comb);
  __m128 r0 = _mm_loadu_ps(comb), r1 = _mm_loadu_ps(comb + 4), r2 = _mm_loadu_ps(comb + 8),
         r3 = _mm_loadu_ps(comb + 12);
  const __m128 e = _mm_set1_ps(eps);
  auto col_step = [&] {
    const __m128 d =
        _mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_setzero_ps(), r0), r1), r2), r3);
    const __m128 q = _mm_add_ps(d, e);
    r0 = _mm_div_ps(r0, q), r1 = _mm_div_ps(r1, q), r2 = _mm_div_ps(r2, q), r3 = _mm_div_ps(r3, q);
  };
  auto row_step = [&] {
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // r_k now holds column k: lane j = c[j][k]
    const __m128 d =
        _mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_setzero_ps(), r0), r1), r2), r3);
    const __m128 q = _mm_add_ps(d, e);
    r0 = _mm_div_ps(r0, q), r1 = _mm_div_ps(r1, q), r2 = _mm_div_ps(r2, q), r3 = _mm_div_ps(r3, q);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  };
  col_step();
  for (int64_t it = 1; it < iters; ++it) row_step(), col_step();
  _mm_storeu_ps(comb, r0), _mm_storeu_ps(comb + 4, r1), _mm_storeu_ps(comb + 8, r2),
      _mm_storeu_ps(comb + 12, r3);
}

// RoPE over interleaved pairs, 4 pairs (8 floats) per step with SSE/AVX-free scalar-equivalent
// math: the pair swap and the sign pattern are lane shuffles, the products and sums separate
// operations, so every value is bit-identical to the reference rotation.
template <typename S>
void rope_impl(float* v, int64_t n, int64_t dim, const float* cos, const float* sin, bool inverse) {
  float* x = v + (n - dim);
  const int64_t pairs = dim / 2;
  int64_t i = S::rope_pairs(x, pairs, cos, sin, inverse);
  for (; i < pairs; ++i) {
    const float c = cos[i], s = inverse ? -sin[i] : sin[i];
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

// 16 packed bytes (32 E2M1 values) -> 32 int8 = 2 x value, in [-12, 12] (low nibbles, then high).
inline __m256i fp4_block_to_i8(const uint8_t* p) {
  const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_setr_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(v, m)),
                           _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}

// sum(a * b) of two int8 x 32 vectors with |a|, |b| <= 12 (pairwise sums fit int16), exactly.
inline int32_t i8_dot32(__m256i a, __m256i b) {
  const __m256i prod16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  const __m256i prod32 = _mm256_madd_epi16(prod16, _mm256_set1_epi16(1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(prod32), _mm256_extracti128_si256(prod32, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Indexer scores (see Kernels::indexer_scores) as a small GEMM: the queries are decoded to int8
// once per call, each key once; every (head, 32-block) dot is then exact in integers and scaled by
// the two blocks' powers of two (x 1/4 for the doubled values). Block results are summed in float
// in block order, which equals the reference's element-by-element float sum except where the latter
// rounds (only when a key's blocks span more than 24 binades); tested against it with a tight
// tolerance.
inline void indexer_scores_simd(const uint8_t* q, const float* w, int64_t nh, int64_t di,
                                const uint8_t* keys, int64_t nkeys, float* scores) {
  constexpr int64_t kMaxBlocks =
      64 * 8;  // heads x blocks of one call's decoded queries (64 x 256 dims)
  const int64_t row = di / 2 + di / 32, nb = di / 32;
  if (nh * nb > kMaxBlocks || nb > 8) {  // beyond the stack buffers: one block pair at a time
    for (int64_t j = 0; j < nkeys; ++j) {
      const uint8_t* k = keys + j * row;
      float acc = 0;
      for (int64_t h = 0; h < nh; ++h) {
        const uint8_t* qh = q + h * row;
        float d = 0;
        for (int64_t b = 0; b < nb; ++b)
          d += float(i8_dot32(fp4_block_to_i8(qh + 16 * b), fp4_block_to_i8(k + 16 * b))) *
               (e8m0_scalar(qh[di / 2 + b]) * e8m0_scalar(k[di / 2 + b]) * 0.25f);
        acc += std::max(d, 0.0f) * w[h];
      }
      scores[j] = acc;
    }
    return;
  }
  __m256i qi[kMaxBlocks];
  float qs[kMaxBlocks];
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t b = 0; b < nb; ++b) {
      qi[h * nb + b] = fp4_block_to_i8(q + h * row + 16 * b);
      qs[h * nb + b] = e8m0_scalar(q[h * row + di / 2 + b]);
    }
  __m256i ki[8];
  float ks[8];
  for (int64_t j = 0; j < nkeys; ++j) {
    const uint8_t* k = keys + j * row;
    for (int64_t b = 0; b < nb; ++b)
      ki[b] = fp4_block_to_i8(k + 16 * b), ks[b] = e8m0_scalar(k[di / 2 + b]);
    float acc = 0;
    for (int64_t h = 0; h < nh; ++h) {
      float d = 0;
      for (int64_t b = 0; b < nb; ++b)
        d += float(i8_dot32(qi[h * nb + b], ki[b])) * (qs[h * nb + b] * ks[b] * 0.25f);
      acc += std::max(d, 0.0f) * w[h];
    }
    scores[j] = acc;
  }
}

// Sparse attention (see Kernels::sparse_attention) in one pass with an online softmax: each row is
// unpacked once and serves every head; per head a running maximum m, denominator l and accumulator,
// rescaled by exp(m_old - m_new) when the maximum grows. The sink joins the denominator at the end.
template <typename S>
void sparse_attention_impl(const float* q, int64_t heads, int64_t dim, const uint8_t* const* rows,
                           const uint8_t* kinds, int64_t nrows, float scale, const float* sink,
                           float* out) {
  constexpr int64_t kMaxHeads = 128, kMaxDim = 1024;
  std::fill(out, out + heads * dim, 0.0f);
  if (nrows == 0) return;
  if (heads > kMaxHeads || dim > kMaxDim)
    return sparse_attention_fallback(q, heads, dim, rows, kinds, nrows, scale, sink, out);
  alignas(64) float row[kMaxDim];
  float m[kMaxHeads], l[kMaxHeads];
  std::fill(m, m + heads, -INFINITY);
  std::fill(l, l + heads, 0.0f);
  for (int64_t r = 0; r < nrows; ++r) {
    if (kinds[r] == 0)
      unpack_window_row(rows[r], dim, row);
    else
      unpack_compressed_row(rows[r], dim, row);
    for (int64_t h = 0; h < heads; ++h) {
      const float z = S::dot(q + h * dim, row, dim) * scale;
      float* o = out + h * dim;
      if (z > m[h]) {
        const float alpha = std::exp(m[h] - z);  // 0 for the first row (m = -inf)
        l[h] = l[h] * alpha + 1.0f;
        S::scale_add(o, alpha, 1.0f, row, dim);
        m[h] = z;
      } else {
        const float p = std::exp(z - m[h]);
        l[h] += p;
        S::scale_add(o, 1.0f, p, row, dim);
      }
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float inv = 1.0f / (l[h] + std::exp(sink[h] - m[h]));
    S::scale_add(out + h * dim, inv, 0.0f, row, dim);
  }
}

template <typename S>
float read_sum_impl(const float* x, int64_t n) {
  return S::sum(x, n);
}

}  // namespace
}  // namespace dsv41::ops
