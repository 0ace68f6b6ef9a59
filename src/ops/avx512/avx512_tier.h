// The AVX-512 tiers' shared code: the 16-wide policy struct (fp32 dots and tiles, RoPE,
// reductions) that the shared 256-bit bodies (ops/simd_*.h, table in ops/simd_table.h) use.
// Included by each AVX-512 tier's translation unit, which compiles it with that tier's flags;
// everything here has internal linkage, so each tier keeps its own copy. A tier with VNNI defines
// DSV41_VNNI before including it (see ops/simd_common.h).
#pragma once

// Read by the shared bodies (ops/simd_common.h) for this tier's tile shapes; set here rather than
// read from __AVX512VL__ so the emulated tiers (built with AVX2 flags) run the same shapes.
#define DSV41_AVX512_TIER 1

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/avx512/avx512_fp8_batch.h"
#include "ops/avx512/avx512_vision_attention.h"
#include "ops/simd_table.h"

namespace dsv41::ops {
namespace {

struct Avx512 {
  // Kernels::fp8_gemv at one token and fp8_gemv_batch of the AVX-512 tiers: 16-lane registers
  // (avx512_fp8_batch.h).
  static void fp8_one_token(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                            const float* x, float* y) {
    fp8_gemv_batch_zmm(w, scale, out, in, x, 1, y, out);
  }
  static void fp8_gemv_batch(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                             const float* x, int64_t ntok, float* y, int64_t ldy) {
    fp8_gemv_batch_zmm(w, scale, out, in, x, ntok, y, ldy);
  }
  // Kernels::vision_attention: the shared body on 16-lane vectors (avx512_vision_attention.h).
  static void vision_attention(const float* q, const float* k, const float* v, int64_t ld,
                               int64_t nq, int64_t nk, int64_t heads, int64_t dim, float scale,
                               float* out, int64_t ldo) {
    vision_attention_simd<VaZmm>(q, k, v, ld, nq, nk, heads, dim, scale, out, ldo);
  }
  static float dot(const float* a, const float* b, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16)
      acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      acc1 =
          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  }
  static float sum(const float* x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
      a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; ++i) s += x[i];
    return s;
  }
  // acc[k] += a . x_k for k < 4, x_k = x0 + k * stride: one load of `a` per four FMAs.
  static void dot4(const float* a, const float* x0, int64_t stride, int64_t n, float* acc) {
    const float *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
           s3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 w = _mm512_loadu_ps(a + i);
      s0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x0 + i), s0);
      s1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x1 + i), s1);
      s2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x2 + i), s2);
      s3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x3 + i), s3);
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      const __m512 w = _mm512_maskz_loadu_ps(m, a + i);
      s0 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x0 + i), s0);
      s1 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x1 + i), s1);
      s2 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x2 + i), s2);
      s3 = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m, x3 + i), s3);
    }
    acc[0] += _mm512_reduce_add_ps(s0), acc[1] += _mm512_reduce_add_ps(s1);
    acc[2] += _mm512_reduce_add_ps(s2), acc[3] += _mm512_reduce_add_ps(s3);
  }
  // RoPE on pairs [0, 8k) of x (see rope_impl); returns how many pairs it did.
  static int64_t rope_pairs(float* x, int64_t pairs, const float* cos, const float* sin,
                            bool inverse) {
    int64_t i = 0;
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512 sign = _mm512_castsi512_ps(_mm512_setr_epi32(
        int(0x80000000u), 0, int(0x80000000u), 0, int(0x80000000u), 0, int(0x80000000u), 0,
        int(0x80000000u), 0, int(0x80000000u), 0, int(0x80000000u), 0, int(0x80000000u), 0));
    for (; i + 8 <= pairs; i += 8) {
      const __m512 v = _mm512_loadu_ps(x + 2 * i);
      const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cos + i)));
      __m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sin + i)));
      if (inverse)
        s = _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(s), _mm512_set1_epi32(int(0x80000000u))));
      const __m512 sw = _mm512_permute_ps(v, 0xB1);
      const __m512 p = _mm512_mul_ps(v, c);
      const __m512 q = _mm512_castsi512_ps(
          _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(sw, s)), _mm512_castps_si512(sign)));
      _mm512_storeu_ps(x + 2 * i, _mm512_add_ps(p, q));
    }
    return i;
  }
  // acc[r * astride + k] += w_r . x_k for four rows w_r = w + r * wstride and two tokens x0, x1.
  static void dot4x2(const float* w, int64_t wstride, const float* x0, const float* x1, int64_t n,
                     float* acc, int64_t astride) {
    __m512 s[4][2];
    for (auto& r : s) r[0] = r[1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 a = _mm512_loadu_ps(x0 + i), b = _mm512_loadu_ps(x1 + i);
      for (int r = 0; r < 4; ++r) {
        const __m512 wv = _mm512_loadu_ps(w + r * wstride + i);
        s[r][0] = _mm512_fmadd_ps(wv, a, s[r][0]);
        s[r][1] = _mm512_fmadd_ps(wv, b, s[r][1]);
      }
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      const __m512 a = _mm512_maskz_loadu_ps(m, x0 + i), b = _mm512_maskz_loadu_ps(m, x1 + i);
      for (int r = 0; r < 4; ++r) {
        const __m512 wv = _mm512_maskz_loadu_ps(m, w + r * wstride + i);
        s[r][0] = _mm512_fmadd_ps(wv, a, s[r][0]);
        s[r][1] = _mm512_fmadd_ps(wv, b, s[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      acc[r * astride] += _mm512_reduce_add_ps(s[r][0]);
      acc[r * astride + 1] += _mm512_reduce_add_ps(s[r][1]);
    }
  }
  static float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }
  static void scale_mul(const float* x, const float* w, float r, int64_t n, float* y) {
    const __m512 rv = _mm512_set1_ps(r);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(
          y + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), rv)));
    for (; i < n; ++i) y[i] = w[i] * (x[i] * r);
  }
};

}  // namespace
}  // namespace dsv41::ops
