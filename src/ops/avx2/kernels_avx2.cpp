// AVX2 + FMA tier (built with -mavx2 -mfma -mf16c): the ISA policy struct (fp32 dots, tiles, RoPE,
// reductions) that the shared kernel bodies (ops/simd_common.h, simd_gemm.h, simd_attention.h,
// simd_pack.h) are instantiated with, and this tier's kernel table (ops/simd_table.h, plus the
// GEMMs for fp32 activations of avx2_f32_gemm.h). Must not
// hold static initialisers: this file's code may only run after dispatch has checked the CPU.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/avx2/avx2_f32_gemm.h"
#include "ops/simd_table.h"

namespace dsv41::ops {
namespace {

struct Avx2 {
  static constexpr int kWidth = 8;
  // Kernels::fp8_gemv at one token and fp8_gemv_batch of this tier: the shared 256-bit bodies.
  static void fp8_one_token(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                            const float* x, float* y) {
    fp8_gemv_one_token(w, scale, out, in, x, y);
  }
  static void fp8_gemv_batch(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                             const float* x, int64_t ntok, float* y, int64_t ldy) {
    fp8_gemv_batch_simd(w, scale, out, in, x, ntok, y, ldy);
  }
  // Kernels::vision_attention: the shared body on 8-lane vectors.
  static void vision_attention(const float* q, const float* k, const float* v, int64_t ld,
                               int64_t nq, int64_t nk, int64_t heads, int64_t dim, float scale,
                               float* out, int64_t ldo) {
    vision_attention_simd<VaYmm>(q, k, v, ld, nq, nk, heads, dim, scale, out, ldo);
  }
  static float dot(const float* a, const float* b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
  }
  // acc[k] += a . x_k for k < 4, x_k = x0 + k * stride: one load of `a` per four FMAs.
  static void dot4(const float* a, const float* x0, int64_t stride, int64_t n, float* acc) {
    const float *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 w = _mm256_loadu_ps(a + i);
      s0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + i), s0);
      s1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + i), s1);
      s2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x2 + i), s2);
      s3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x3 + i), s3);
    }
    float r0 = hsum256(s0), r1 = hsum256(s1), r2 = hsum256(s2), r3 = hsum256(s3);
    for (; i < n; ++i)
      r0 += a[i] * x0[i], r1 += a[i] * x1[i], r2 += a[i] * x2[i], r3 += a[i] * x3[i];
    acc[0] += r0, acc[1] += r1, acc[2] += r2, acc[3] += r3;
  }
  // RoPE on pairs [0, 4k) of x (see rope_impl); returns how many pairs it did.
  static int64_t rope_pairs(float* x, int64_t pairs, const float* cos, const float* sin,
                            bool inverse) {
    int64_t i = 0;
    const __m256 neg = _mm256_set1_ps(-0.0f);
    for (; i + 4 <= pairs; i += 4) {
      const __m256 v = _mm256_loadu_ps(x + 2 * i);  // a0 b0 a1 b1 a2 b2 a3 b3
      const __m128 c4 = _mm_loadu_ps(cos + i), s4raw = _mm_loadu_ps(sin + i);
      const __m128 s4 = inverse ? _mm_xor_ps(s4raw, _mm_set1_ps(-0.0f)) : s4raw;
      // c and s duplicated per pair: c0 c0 c1 c1 | c2 c2 c3 c3.
      const __m256 c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
      const __m256 s = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
      const __m256 sw = _mm256_permute_ps(v, 0xB1);  // b0 a0 b1 a1 ...
      // even lanes: a c - b s ; odd lanes: b c + a s  (= a s + b c: same two products, same sum)
      const __m256 p = _mm256_mul_ps(v, c);   // a c | b c
      const __m256 q = _mm256_mul_ps(sw, s);  // b s | a s
      const __m256 qs =
          _mm256_xor_ps(q, _mm256_blend_ps(neg, _mm256_setzero_ps(), 0xAA));  // -b s | a s
      _mm256_storeu_ps(x + 2 * i, _mm256_add_ps(p, qs));
    }
    return i;
  }
  // acc[r * astride + k] += w_r . x_k for four rows w_r = w + r * wstride and two tokens x0, x1.
  static void dot4x2(const float* w, int64_t wstride, const float* x0, const float* x1, int64_t n,
                     float* acc, int64_t astride) {
    __m256 s[4][2];
    for (auto& r : s) r[0] = r[1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 a = _mm256_loadu_ps(x0 + i), b = _mm256_loadu_ps(x1 + i);
      for (int r = 0; r < 4; ++r) {
        const __m256 wv = _mm256_loadu_ps(w + r * wstride + i);
        s[r][0] = _mm256_fmadd_ps(wv, a, s[r][0]);
        s[r][1] = _mm256_fmadd_ps(wv, b, s[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      float t0 = hsum256(s[r][0]), t1 = hsum256(s[r][1]);
      for (int64_t k = i; k < n; ++k)
        t0 += w[r * wstride + k] * x0[k], t1 += w[r * wstride + k] * x1[k];
      acc[r * astride] += t0;
      acc[r * astride + 1] += t1;
    }
  }
  static float sum_squares(const float* x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), acc);
    float s = hsum256(acc);
    for (; i < n; ++i) s += x[i] * x[i];
    return s;
  }
  static float sum(const float* x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
      a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
      a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
      a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) s += x[i];
    return s;
  }
  static void scale_mul(const float* x, const float* w, float r, int64_t n, float* y) {
    const __m256 rv = _mm256_set1_ps(r);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(
          y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
    for (; i < n; ++i) y[i] = w[i] * (x[i] * r);
  }
};

// The shared table plus this tier's GEMMs for fp32 activations (avx2_f32_gemm.h).
constexpr Kernels avx2_table() {
  Kernels k = simd_table<Avx2>(Isa::kAvx2);
  k.f32_act_stride = &a2_act_stride;
  k.f32_pack_act = &a2_pack_act;
  k.f32_fp8_gemm = &a2_fp8_gemm;
  k.f32_mxfp4_gemm = &a2_mxfp4_gemm;
  k.f32_mxfp4_gate_up = &a2_mxfp4_gate_up;
  return k;
}

}  // namespace

extern constinit const Kernels kAvx2Kernels = avx2_table();

}  // namespace dsv41::ops
