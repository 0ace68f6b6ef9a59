// The AVX-512 tiers' vector policy for the vision tower's attention (ops/simd_vision_attention.h):
// 16 lanes, 4 x 16 keys per score tile and 4 x 16 dims per output tile (16 accumulators of the 32
// zmm registers; one tile covers a whole 64-key block and a whole head of 64 dims at the released
// shape). Included by avx512_tier.h, so compiled with each AVX-512 tier's flags (and over the
// intrinsic emulation in tests/ops/avx512_emulated.cpp).
#pragma once

#include <immintrin.h>

#include "ops/simd_vision_attention.h"

namespace dsv41::ops {
namespace {

struct VaZmm {
  using T = __m512;
  static constexpr int kW = 16, kKeyVecs = 4, kDimVecs = 4;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static float hsum(T x) { return _mm512_reduce_add_ps(x); }
  static float hmax(T x) { return _mm512_reduce_max_ps(x); }
  // VaYmm::exp's steps; the rounding by vrndscaleps, the 2^n by vscalefps (exact here: n in
  // [-126, 0] and y in [0.7, 1.5]).
  static T exp(T x) {
    x = _mm512_max_ps(x, set1(kExpLo));
    const T n =
        _mm512_roundscale_ps(mul(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = fma(n, set1(-kLn2Hi), x);
    r = fma(n, set1(-kLn2Lo), r);
    T y = set1(kExpP0);
    y = fma(y, r, set1(kExpP1));
    y = fma(y, r, set1(kExpP2));
    y = fma(y, r, set1(kExpP3));
    y = fma(y, r, set1(kExpP4));
    y = fma(y, r, set1(kExpP5));
    y = add(fma(y, mul(r, r), r), set1(1.0f));
    return _mm512_scalef_ps(y, n);
  }
};

}  // namespace
}  // namespace dsv41::ops
