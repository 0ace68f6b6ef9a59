// The AVX-512 tiers' batch-invariant several-token FP8 GEMV (Kernels::fp8_gemv_batch): every
// (row, token) is bit for bit fp8_row_dot_prescaled's arithmetic (ops/simd_common.h), on 512-bit
// registers. That dot keeps four 8-lane chains a0..a3 over each 32-value step (a_j takes values
// 8j..8j+7); here one 16-lane register holds a0|a1 and another a2|a3, and each lane's
// multiply-adds are the same operations in the same order, so the bits are the same; the final
// sum splits them back into the four halves and adds them as the one-token code does.
// What changes is the sharing: two rows are decoded per step and every token's activations are
// loaded once for both (x loads per FMA halve), and one instruction covers 16 lanes. Measured
// against the 256-bit several-token code on Zen 4 (2 threads, weights from DRAM, one run):
// 0.56-0.78x the time at 2-6 tokens with rows of 5,120-8,192 values, 0.94-1.16x at 1,280. Included
// by avx512_tier.h; the emulated tiers (tests/ops/avx512_emulation.h) run it too.
#pragma once

#include <immintrin.h>

#include <algorithm>

#include "ops/simd_common.h"

namespace dsv41::ops {
namespace {

// 32 FP8 weights at p as two 16-lane vectors (values 0-15, 16-31) times 2^-8: the half-precision
// bit trick of e4m3x32_f16, its 128-bit lanes put back in value order.
inline void e4m3x32_f16_zmm(const uint8_t* p, __m512& v01, __m512& v23) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i z = _mm256_setzero_si256(), keep = _mm256_set1_epi16(static_cast<short>(0xBFFF));
  const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), keep);
  const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), keep);
  // lo holds values 0-7 | 16-23 and hi 8-15 | 24-31 (per 128-bit lane).
  v01 = _mm512_cvtph_ps(_mm256_permute2x128_si256(lo, hi, 0x20));
  v23 = _mm512_cvtph_ps(_mm256_permute2x128_si256(lo, hi, 0x31));
}

constexpr int kFp8ZmmTokens = 3;        // tokens per pass: 2 rows x 3 tokens x 2 accumulators
constexpr int64_t kFp8ZmmChunk = 1024;  // k per pass over a group's rows (activations stay in L1)

// Rows [0, R) at w (stride in), values [k0, k1) (multiples of 32), NT tokens: acc[r][t] holds the
// chains between chunks (a store and reload keeps their bits).
template <int R, int NT>
inline void fp8_zmm_rows(const uint8_t* w, int64_t in, int64_t k0, int64_t k1,
                         const float* const* xs, __m512 (*acc)[kFp8ZmmTokens][2]) {
  __m512 a[R][NT][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) a[r][t][0] = acc[r][t][0], a[r][t][1] = acc[r][t][1];
  for (int64_t i = k0; i < k1; i += 32) {
    __m512 v[R][2];
    for (int r = 0; r < R; ++r) {
      if ((i & 63) == 0)  // the row a chunk ahead: the group's row streams defeat the prefetcher
        _mm_prefetch(reinterpret_cast<const char*>(w + r * in + i + kFp8ZmmChunk), _MM_HINT_T0);
      e4m3x32_f16_zmm(w + r * in + i, v[r][0], v[r][1]);
    }
    for (int t = 0; t < NT; ++t) {
      const __m512 x01 = _mm512_loadu_ps(xs[t] + i), x23 = _mm512_loadu_ps(xs[t] + i + 16);
      for (int r = 0; r < R; ++r) {
        a[r][t][0] = _mm512_fmadd_ps(v[r][0], x01, a[r][t][0]);
        a[r][t][1] = _mm512_fmadd_ps(v[r][1], x23, a[r][t][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t][0] = a[r][t][0], acc[r][t][1] = a[r][t][1];
}

// One 32-row scale group (nrows rows at w) for NT tokens' prescaled activations xs[t]; out[t][r].
template <int NT>
inline void fp8_zmm_group(const uint8_t* w, int64_t nrows, int64_t in, const float* const* xs,
                          __m512 (*acc)[kFp8ZmmTokens][2], float* const* out) {
  const int64_t full = in / 32 * 32;
  for (int64_t r = 0; r < nrows; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < full; k0 += kFp8ZmmChunk) {
    const int64_t k1 = std::min(full, k0 + kFp8ZmmChunk);
    int64_t r = 0;
    for (; r + 2 <= nrows; r += 2) fp8_zmm_rows<2, NT>(w + r * in, in, k0, k1, xs, acc + r);
    for (; r < nrows; ++r) fp8_zmm_rows<1, NT>(w + r * in, in, k0, k1, xs, acc + r);
  }
  for (int64_t r = 0; r < nrows; ++r)
    for (int t = 0; t < NT; ++t) {
      // The one-token code's final sum: (a0 + a1) + (a2 + a3), then its horizontal order.
      const __m256 a0 = _mm512_castps512_ps256(acc[r][t][0]);
      const __m256 a1 = _mm512_extractf32x8_ps(acc[r][t][0], 1);
      const __m256 a2 = _mm512_castps512_ps256(acc[r][t][1]);
      const __m256 a3 = _mm512_extractf32x8_ps(acc[r][t][1], 1);
      float sum = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      if (full < in) {
        float tail = 0;
        for (int64_t k = full; k < in; ++k) tail += e4m3_scalar(w[r * in + k]) * 0x1p-8f * xs[t][k];
        sum += tail;
      }
      out[t][r] = sum;
    }
}

// One token: rows of at least kFp8ZmmOneTokenMin values go through the group kernel (two rows per
// step: 0.67-0.87x the time of the row-streaming fp8_gemv_one_token at 5,120-8,192 values on Zen
// 4), shorter ones stream row by row (the group kernel measured 1.4-1.5x slower at 1,280). Same
// bits either way.
constexpr int64_t kFp8ZmmOneTokenMin = 4096;

inline void fp8_gemv_batch_zmm(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                               const float* x, int64_t ntok, float* y, int64_t ldy) {
  if (ntok == 1 && in < kFp8ZmmOneTokenMin) return fp8_gemv_one_token(w, scale, out, in, x, y);
  alignas(64) __m512 acc[32][kFp8ZmmTokens][2];
  fp8_batch_groups<kFp8ZmmTokens>(
      w, scale, out, in, x, ntok, y, ldy,
      [&](const uint8_t* wg, int64_t nrows, const float* const* xp, int nt, float* const* op) {
        if (nt == 3)
          fp8_zmm_group<3>(wg, nrows, in, xp, acc, op);
        else if (nt == 2)
          fp8_zmm_group<2>(wg, nrows, in, xp, acc, op);
        else
          fp8_zmm_group<1>(wg, nrows, in, xp, acc, op);
      });
}

}  // namespace
}  // namespace dsv41::ops
