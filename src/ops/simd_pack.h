// Cache-row packers and unpackers of the SIMD tiers (256-bit AVX2 code shared by both tiers,
// internal linkage as ops/simd_common.h), bit-exact with the scalar packers
// (ops/ref/cache_pack.cpp) on every input: the per-block scale is computed by the same float
// expression; dividing by a power-of-two scale equals multiplying by its exact reciprocal (one
// rounding of the same exact value); E4M3 codes round the float mantissa to 3 bits half-to-even in
// integers (subnormals: cvtps2dq of |v| * 2^9, which rounds half to even); E2M1 codes count the
// midpoints below |v| (ties to the even code), as the scalar encoder walks them. Rows holding NaN
// or infinity, scale bytes past 2^119 and the E4M3 NaN codes take the scalar functions, whose rules
// for them are their own.
#pragma once

#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "ops/cache_pack.h"
#include "ops/simd_common.h"

namespace dsv41::ops {
namespace {

// 2^ceil(log2 x) for a normal x > 0 (the scalar packer's pow2_ceil).
inline float pow2_ceil_bits(float x) {
  const uint32_t b = bits_of(x);
  return (b & 0x7FFFFF) == 0 ? x : float_from_bits((b & 0x7F800000u) + 0x00800000u);
}

inline bool row_finite(const float* x, int64_t n) {
  float unused;
  return amax_finite(x, n, unused);
}

// Values j*8 .. j*8+7 of the block at x + b, and std::clamp(v, lo, hi) of 8 non-NaN values.
inline __m256 load8(const float* x, int64_t b, int j) {
  return _mm256_loadu_ps(x + b + 8 * j);
}
inline __m256 clamp8(__m256 v, __m256 lo, __m256 hi) {
  return _mm256_min_ps(_mm256_max_ps(v, lo), hi);
}

// E4M3 codes (in int32 lanes) of 8 finite values with |v| <= 448.
inline __m256i e4m3_encode8(__m256 v) {
  const __m256i sign =
      _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(int(0x80000000u)));
  const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))), v);
  const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));  // m * 2^-9
  const __m256i b = _mm256_castps_si256(a);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 20), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), odd));  // half to even
  const __m256i norm =
      _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32((127 - 7) << 3));
  const __m256 is_sub = _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m256i code = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(norm), _mm256_castsi256_ps(sub), is_sub));
  return _mm256_or_si256(code, _mm256_srli_epi32(sign, 24));
}

// E2M1 codes (int32 lanes, sign in bit 3) of 8 finite values with |v| <= 6, by midpoints.
inline __m256i e2m1_encode8(__m256 v) {
  const __m256i sign =
      _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(int(0x80000000u)));
  const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))), v);
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  __m256i code = _mm256_setzero_si256();
  for (int c = 0; c < 7; ++c) {
    const __m256 m = _mm256_set1_ps(kMid[c]);
    __m256 up = _mm256_cmp_ps(a, m, _CMP_GT_OQ);
    if (c % 2 == 1) up = _mm256_or_ps(up, _mm256_cmp_ps(a, m, _CMP_EQ_OQ));  // tie: the even code
    code = _mm256_sub_epi32(code, _mm256_castps_si256(up));
  }
  return _mm256_or_si256(code, _mm256_srli_epi32(sign, 28));
}

// 32 int32 codes (four vectors, element order) -> 32 bytes.
inline void store_bytes32(__m256i c0, __m256i c1, __m256i c2, __m256i c3, uint8_t* out) {
  const __m256i p01 = _mm256_packus_epi32(c0, c1), p23 = _mm256_packus_epi32(c2, c3);
  const __m256i q = _mm256_packus_epi16(p01, p23);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// 16 nibble codes (two vectors, element order) -> 8 bytes, element 2j in the low nibble.
inline void store_nibbles16(__m256i c0, __m256i c1, uint8_t* out) {
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);  // 16 x u16
  const __m128i bytes =
      _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));  // 16 x u8
  const __m128i pairs = _mm_maddubs_epi16(bytes, _mm_set1_epi16(0x1001));           // lo + 16 * hi
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(pairs, pairs));
}

// The E4M3 value (not its code) of 8 finite values with |v| <= 448: the rounding of
// e4m3_encode8, kept in float (the mantissa cut to 3 bits half to even; below 2^-6 a multiple of
// 2^-9), the sign put back.
inline __m256 e4m3_round8(__m256 v) {
  const __m256 signbit = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
  const __m256 a = _mm256_andnot_ps(signbit, v);
  const __m256 sub = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)),
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                   _mm256_set1_ps(0x1p-9f));
  const __m256i b = _mm256_castps_si256(a);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 20), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), odd)),
                       _mm256_set1_epi32(int(0xFFF00000u)));
  const __m256 is_sub = _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(rounded), sub, is_sub);
  return _mm256_or_ps(r, _mm256_and_ps(signbit, v));
}

// Kernels::act_quant_fp8: whole finite 32-blocks here, a partial last block or a block holding
// NaN or infinity through the scalar rule.
void act_quant_fp8_simd(const float* x, int64_t n, float* y) {
  int64_t b = 0;
  for (; b + 32 <= n; b += 32) {
    float amax;
    if (!amax_finite(x + b, 32, amax)) {
      fake_fp8_pow2_row(x + b, 32, y + b);
      continue;
    }
    const float s = pow2_ceil_bits(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    const __m256 inv = _mm256_set1_ps(1.0f / s), sv = _mm256_set1_ps(s),
                 lo = _mm256_set1_ps(-448.0f), hi = _mm256_set1_ps(448.0f);
    __m256 r[4];
    for (int j = 0; j < 4; ++j)
      r[j] = _mm256_mul_ps(e4m3_round8(clamp8(_mm256_mul_ps(load8(x, b, j), inv), lo, hi)), sv);
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + b + 8 * j, r[j]);
  }
  if (b < n) fake_fp8_pow2_row(x + b, n - b, y + b);
}

void pack_window_row_simd(const float* x, int64_t n, uint8_t* out) {
  if (n % 32 != 0 || !row_finite(x, n)) return pack_window_row(x, n, out);
  for (int64_t b = 0; b < n; b += 32) {
    float amax;
    amax_finite(x + b, 32, amax);
    const float s = pow2_ceil_bits(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    const __m256 inv = _mm256_set1_ps(1.0f / s), lo = _mm256_set1_ps(-448.0f),
                 hi = _mm256_set1_ps(448.0f);
    __m256i c[4];
    for (int j = 0; j < 4; ++j)
      c[j] = e4m3_encode8(clamp8(_mm256_mul_ps(load8(x, b, j), inv), lo, hi));
    store_bytes32(c[0], c[1], c[2], c[3], out + b);
    out[n + b / 32] = static_cast<uint8_t>(bits_of(s) >> 23);
  }
}

void unpack_window_row_simd(const uint8_t* in, int64_t n, float* x) {
  if (n % 32 != 0) return unpack_window_row(in, n, x);
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t sb = in[n + b / 32];
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + b));
    const __m256i nan_codes =
        _mm256_cmpeq_epi8(_mm256_and_si256(codes, _mm256_set1_epi8(0x7F)), _mm256_set1_epi8(0x7F));
    const float s256 = e8m0_times_256(sb);
    if (s256 == 0.0f || sb == 0 || !_mm256_testz_si256(nan_codes, nan_codes)) {
      for (int64_t i = b; i < b + 32; ++i) x[i] = e4m3_scalar(in[i]) * e8m0_scalar(sb);
      continue;
    }
    __m256 v[4];
    e4m3x32_f16(in + b, v);  // values times 2^-8, exact
    const __m256 sv = _mm256_set1_ps(s256);
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(x + b + 8 * j, _mm256_mul_ps(v[j], sv));
  }
}

void pack_compressed_row_simd(const float* x, int64_t n, uint8_t* out) {
  if (n % 16 != 0 || !row_finite(x, n)) return pack_compressed_row(x, n, out);
  for (int64_t b = 0; b < n; b += 16) {
    float amax;
    amax_finite(x + b, 16, amax);
    // The scalar packer's e4m3_from_double(double(f)) of the same float f: saturating at 448,
    // otherwise the same rounding as the vector encoder.
    const float f = std::max(amax, 6.0f * 0x1p-9f) / 6.0f;
    const uint8_t sc = static_cast<uint8_t>(
        _mm256_cvtsi256_si32(e4m3_encode8(_mm256_set1_ps(std::min(f, 448.0f)))));
    const __m256 sv = _mm256_set1_ps(e4m3_scalar(sc)), lo = _mm256_set1_ps(-6.0f),
                 hi = _mm256_set1_ps(6.0f);
    __m256i c[2];
    for (int j = 0; j < 2; ++j)
      c[j] = e2m1_encode8(clamp8(_mm256_div_ps(load8(x, b, j), sv), lo, hi));
    store_nibbles16(c[0], c[1], out + b / 2);
    out[n / 2 + b / 16] = sc;
  }
}

void unpack_compressed_row_simd(const uint8_t* in, int64_t n, float* x) {
  if (n % 16 != 0) return unpack_compressed_row(in, n, x);
  for (int64_t b = 0; b < n; b += 16)
    e2m1x16_scaled(in + b / 2, e4m3_scalar(in[n / 2 + b / 16]), x + b);
}

void pack_index_key_simd(const float* x, int64_t n, uint8_t* out) {
  if (n % 32 != 0 || !row_finite(x, n)) return pack_index_key(x, n, out);
  for (int64_t b = 0; b < n; b += 32) {
    float amax;
    amax_finite(x + b, 32, amax);
    const float s = pow2_ceil_bits(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    const __m256 inv = _mm256_set1_ps(1.0f / s), lo = _mm256_set1_ps(-6.0f),
                 hi = _mm256_set1_ps(6.0f);
    __m256i c[4];
    for (int j = 0; j < 4; ++j)
      c[j] = e2m1_encode8(clamp8(_mm256_mul_ps(load8(x, b, j), inv), lo, hi));
    store_nibbles16(c[0], c[1], out + b / 2);
    store_nibbles16(c[2], c[3], out + b / 2 + 8);
    out[n / 2 + b / 32] = static_cast<uint8_t>(bits_of(s) >> 23);
  }
}

void unpack_index_key_simd(const uint8_t* in, int64_t n, float* x) {
  if (n % 32 != 0) return unpack_index_key(in, n, x);
  for (int64_t b = 0; b < n; b += 16)
    e2m1x16_scaled(in + b / 2, e8m0_scalar(in[n / 2 + b / 32]), x + b);
}

}  // namespace
}  // namespace dsv41::ops
