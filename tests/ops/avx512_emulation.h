// A lane-by-lane emulation of the AVX-512F/DQ (and VNNI) intrinsics the AVX-512 tiers' own code
// uses (src/ops/avx512/avx512_tier.h, the DSV41_VNNI branch of src/ops/simd_common.h), after
// Intel's Intrinsics Guide, so that code's logic (tails, masks, pair shuffles, reductions) is
// tested on CPUs without AVX-512 (the development VM and CI). It cannot show what the compiler or
// the hardware do with the real instructions: a machine with AVX-512 runs the real tier in the same
// tests. Include after <immintrin.h>; the names are macros so the tier's source compiles unchanged.
// Lanes the real instruction leaves undefined are NaN here, so a result that depends on them shows.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dsv41::ops::emu {

struct Ps {
  float f[16];
};
struct Si {
  int32_t i[16];
};
using Mask = uint16_t;

inline Ps setzero_ps() {
  return Ps{};
}
inline Ps set1_ps(float v) {
  Ps r;
  for (float& x : r.f) x = v;
  return r;
}
inline Si set1_epi32(int v) {
  Si r;
  for (int32_t& x : r.i) x = v;
  return r;
}
inline Si setr_epi32(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9,
                     int a10, int a11, int a12, int a13, int a14, int a15) {
  return Si{{a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15}};
}
inline Ps loadu_ps(const float* p) {
  Ps r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
// Masked-off lanes are zero and their memory is not touched (the real load does not fault there).
inline Ps maskz_loadu_ps(Mask m, const float* p) {
  Ps r{};
  for (int j = 0; j < 16; ++j)
    if ((m >> j) & 1) r.f[j] = p[j];
  return r;
}
inline void storeu_ps(float* p, Ps v) {
  std::memcpy(p, v.f, sizeof v.f);
}
inline Ps add_ps(Ps a, Ps b) {
  for (int j = 0; j < 16; ++j) a.f[j] += b.f[j];
  return a;
}
inline Ps mul_ps(Ps a, Ps b) {
  for (int j = 0; j < 16; ++j) a.f[j] *= b.f[j];
  return a;
}
// One rounding per lane, as vfmadd.
inline Ps fmadd_ps(Ps a, Ps b, Ps c) {
  for (int j = 0; j < 16; ++j) a.f[j] = std::fma(a.f[j], b.f[j], c.f[j]);
  return a;
}
inline Ps max_ps(Ps a, Ps b) {  // vmaxps: the second operand when either is NaN (none here)
  for (int j = 0; j < 16; ++j) a.f[j] = a.f[j] > b.f[j] ? a.f[j] : b.f[j];
  return a;
}
inline float reduce_max_ps(Ps a) {  // max is exact: the order does not matter
  float m = a.f[0];
  for (int j = 1; j < 16; ++j) m = std::max(m, a.f[j]);
  return m;
}
// vrndscaleps with imm 0 in the scale bits: round to an integer (the rounding mode the imm's low
// bits name: only round-to-nearest-even is used).
inline Ps roundscale_ps(Ps a, int imm) {
  for (float& x : a.f) x = (imm & 3) == 0 ? std::nearbyint(x) : std::trunc(x);
  return a;
}
// vscalefps for finite operands: a * 2^floor(b).
inline Ps scalef_ps(Ps a, Ps b) {
  for (int j = 0; j < 16; ++j) a.f[j] = std::ldexp(a.f[j], int(std::floor(b.f[j])));
  return a;
}
// GCC's order: the 256-bit halves, then 128-bit halves, then pairs.
inline float reduce_add_ps(Ps a) {
  float h8[8], h4[4];
  for (int j = 0; j < 8; ++j) h8[j] = a.f[j] + a.f[j + 8];
  for (int j = 0; j < 4; ++j) h4[j] = h8[j] + h8[j + 4];
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}
inline Ps castps256_ps512(__m256 v) {
  Ps r;
  _mm256_storeu_ps(r.f, v);
  for (int j = 8; j < 16; ++j) r.f[j] = std::numeric_limits<float>::quiet_NaN();
  return r;
}
inline Si castps_si512(Ps v) {
  Si r;
  std::memcpy(r.i, v.f, sizeof r.i);
  return r;
}
inline Ps castsi512_ps(Si v) {
  Ps r;
  std::memcpy(r.f, v.i, sizeof r.f);
  return r;
}
inline Si xor_si512(Si a, Si b) {
  for (int j = 0; j < 16; ++j) a.i[j] ^= b.i[j];
  return a;
}
// vpermilps with an immediate: within each 128-bit lane, element j takes imm's j-th 2-bit field.
inline Ps permute_ps(Ps a, int imm) {
  Ps r;
  for (int j = 0; j < 16; ++j) r.f[j] = a.f[(j & ~3) + ((imm >> (2 * (j & 3))) & 3)];
  return r;
}
// vpdpwssd (256-bit, AVX512_VNNI + VL): each int32 lane plus its two int16 pair-products, wrapping
// (the non-saturating form).
inline __m256i dpwssd_epi32(__m256i src, __m256i a, __m256i b) {
  int32_t s[8];
  int16_t x[16], y[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s), src);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), b);
  for (int j = 0; j < 8; ++j)
    s[j] = int32_t(uint32_t(s[j]) + uint32_t(int32_t(x[2 * j]) * y[2 * j]) +
                   uint32_t(int32_t(x[2 * j + 1]) * y[2 * j + 1]));
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
}
// vpdpbusd (256-bit): each int32 lane plus its four unsigned-byte x signed-byte products, wrapping.
inline __m256i dpbusd_epi32(__m256i src, __m256i a, __m256i b) {
  int32_t s[8];
  uint8_t x[32];
  int8_t y[32];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s), src);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), b);
  for (int j = 0; j < 8; ++j) {
    uint32_t acc = uint32_t(s[j]);
    for (int k = 0; k < 4; ++k) acc += uint32_t(int32_t(x[4 * j + k]) * y[4 * j + k]);
    s[j] = int32_t(acc);
  }
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
}
// vpermps: element j takes a[idx[j] mod 16].
inline Ps permutexvar_ps(Si idx, Ps a) {
  Ps r;
  for (int j = 0; j < 16; ++j) r.f[j] = a.f[idx.i[j] & 15];
  return r;
}

// vcvtph2ps (512-bit): 16 half-precision values to fp32 (exact), through the F16C conversion.
inline Ps cvtph_ps(__m256i h) {
  Ps r;
  _mm256_storeu_ps(r.f, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
  _mm256_storeu_ps(r.f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
  return r;
}
inline __m256 castps512_ps256(Ps v) {
  return _mm256_loadu_ps(v.f);
}
// vextractf32x8 (AVX512DQ): the 256-bit half `imm` (0 or 1).
inline __m256 extractf32x8_ps(Ps v, int imm) {
  return _mm256_loadu_ps(v.f + 8 * (imm & 1));
}

}  // namespace dsv41::ops::emu

// GCC defines some of these as macros itself (when not optimising, or always); replace them all.
#undef __m512
#define __m512 ::dsv41::ops::emu::Ps
#undef __m512i
#define __m512i ::dsv41::ops::emu::Si
#undef __mmask16
#define __mmask16 ::dsv41::ops::emu::Mask
#undef _mm512_setzero_ps
#define _mm512_setzero_ps ::dsv41::ops::emu::setzero_ps
#undef _mm512_set1_ps
#define _mm512_set1_ps ::dsv41::ops::emu::set1_ps
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 ::dsv41::ops::emu::set1_epi32
#undef _mm512_setr_epi32
#define _mm512_setr_epi32 ::dsv41::ops::emu::setr_epi32
#undef _mm512_loadu_ps
#define _mm512_loadu_ps ::dsv41::ops::emu::loadu_ps
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps ::dsv41::ops::emu::maskz_loadu_ps
#undef _mm512_storeu_ps
#define _mm512_storeu_ps ::dsv41::ops::emu::storeu_ps
#undef _mm512_add_ps
#define _mm512_add_ps ::dsv41::ops::emu::add_ps
#undef _mm512_mul_ps
#define _mm512_mul_ps ::dsv41::ops::emu::mul_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps ::dsv41::ops::emu::fmadd_ps
#undef _mm512_max_ps
#define _mm512_max_ps ::dsv41::ops::emu::max_ps
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps ::dsv41::ops::emu::reduce_max_ps
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps ::dsv41::ops::emu::roundscale_ps
#undef _mm512_scalef_ps
#define _mm512_scalef_ps ::dsv41::ops::emu::scalef_ps
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps ::dsv41::ops::emu::reduce_add_ps
#undef _mm512_castps256_ps512
#define _mm512_castps256_ps512 ::dsv41::ops::emu::castps256_ps512
#undef _mm512_castps_si512
#define _mm512_castps_si512 ::dsv41::ops::emu::castps_si512
#undef _mm512_castsi512_ps
#define _mm512_castsi512_ps ::dsv41::ops::emu::castsi512_ps
#undef _mm512_xor_si512
#define _mm512_xor_si512 ::dsv41::ops::emu::xor_si512
#undef _mm512_permute_ps
#define _mm512_permute_ps ::dsv41::ops::emu::permute_ps
#undef _mm512_permutexvar_ps
#define _mm512_permutexvar_ps ::dsv41::ops::emu::permutexvar_ps
#undef _mm256_dpwssd_epi32
#define _mm256_dpwssd_epi32 ::dsv41::ops::emu::dpwssd_epi32
#undef _mm256_dpbusd_epi32
#define _mm256_dpbusd_epi32 ::dsv41::ops::emu::dpbusd_epi32
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps ::dsv41::ops::emu::cvtph_ps
#undef _mm512_castps512_ps256
#define _mm512_castps512_ps256 ::dsv41::ops::emu::castps512_ps256
#undef _mm512_extractf32x8_ps
#define _mm512_extractf32x8_ps ::dsv41::ops::emu::extractf32x8_ps
