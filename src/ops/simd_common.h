// Kernel bodies shared by the SIMD tiers, written once over an ISA policy struct S (block decoders,
// dot product, reductions). Included only by the per-tier translation units, and everything here
// has internal linkage: each tier compiles its own copy with its own -m flags (an inline function
// shared across tiers could otherwise be merged by the linker into the copy of a higher tier).
// A tier built with AVX512_VNNI defines DSV41_VNNI first: the integer dots then use vpdpwssd and
// vpdpbusd (bit-identical, see fp4_row_dot_i16 and indexer_scores_8keys).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "core/check.h"
#include "ops/cache_pack.h"
#include "ops/kernels.h"
#include "ops/select.h"

namespace dsv41::ops {
namespace {

constexpr int64_t kRowChunk = 2048;

// Defined in ops/simd_pack.h (included by every tier after this header): the tiers' cache-row
// unpackers, used by the attention kernels below.
void unpack_window_row_simd(const uint8_t* in, int64_t n, float* x);
void unpack_compressed_row_simd(const uint8_t* in, int64_t n, float* x);

inline float float_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// 2^(s - 127) from its bits (0 -> the subnormal 2^-127, 255 -> NaN); std::ldexp per block cost more
// than the block's arithmetic.
inline float e8m0_scalar(uint8_t s) {
  return float_from_bits(s == 0 ? 0x00400000u : s == 255 ? 0x7FC00000u : uint32_t(s) << 23);
}

inline float e4m3_scalar(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  if ((b & 0x7F) == 0x7F) v = NAN;
  return (b & 0x80) ? -v : v;
}

// ---- FP8 E4M3 through F16C -------------------------------------------------------------------
// An E4M3 byte s.eeee.mmm placed as the half-precision bits s.0eeee.mmm0000000 is the same value
// times 2^-8, subnormals included (both formats' subnormals scale alike), so decoding is an unpack,
// a shift, a mask and vcvtph2ps: exact, and about 2.5x cheaper than building fp32 bits. The 2^8
// goes into the block scale. (The NaN codes 0x7F/0xFF become finite; weights never hold NaN.)

// 32 E4M3 bytes -> v[0..4) = elements [0,8), [8,16), [16,24), [24,32) times 2^-8. The in-lane
// unpacks give lo = bytes 0-7 | 16-23 and hi = bytes 8-15 | 24-31, hence the half order below.
inline void e4m3x32_f16(const uint8_t* p, __m256 v[4]) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i z = _mm256_setzero_si256(), keep = _mm256_set1_epi16(static_cast<short>(0xBFFF));
  const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 1), keep);
  const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 1), keep);
  v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
  v[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
  v[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
  v[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

// The block scale 2^(s-127) times 2^8 (undoing the decoder's 2^-8) when that is a normal float; 0
// when it is not (s >= 247 or s == 0, where the caller applies the two factors one after the
// other).
inline float e8m0_times_256(uint8_t s) {
  return s == 0 || s >= 247 ? 0.0f : float_from_bits(uint32_t(s + 8) << 23);
}

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float hmax256(__m256 v) {
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  t = _mm_max_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

// max |x| over n (a multiple of 8) values, and whether all of them are finite.
inline bool amax_finite(const float* x, int64_t n, float& amax) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 big = _mm256_set1_ps(3.4028234663852886e38f);
  __m256 mx = _mm256_setzero_ps();
  int ok = 0xFF;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    ok &= _mm256_movemask_ps(_mm256_cmp_ps(v, big, _CMP_LE_OQ));
    mx = _mm256_max_ps(mx, v);
  }
  amax = hmax256(mx);
  return ok == 0xFF;
}

// One FP8 row (block scales srow, one per 32 inputs) dotted with x: two independent chains per
// block, the weights streamed with a software prefetch one KB ahead (the hardware prefetcher alone
// reached 6.2 GB/s from memory on one core in a standalone loop, 7.3 with it).
inline float fp8_row_dot_f16(const uint8_t* row, const uint8_t* srow, int64_t in, const float* x) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float rare = 0;  // blocks whose scale times 2^8 is not a normal float
  int64_t i = 0;
  for (; i + 32 <= in; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row + i + 1024), _MM_HINT_T0);
    __m256 v[4];
    e4m3x32_f16(row + i, v);
    __m256 b0 = _mm256_mul_ps(v[0], _mm256_loadu_ps(x + i));
    __m256 b1 = _mm256_mul_ps(v[1], _mm256_loadu_ps(x + i + 8));
    b0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + i + 16), b0);
    b1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + i + 24), b1);
    const float sc = e8m0_times_256(srow[i / 32]);
    if (sc != 0.0f) {
      const __m256 sv = _mm256_set1_ps(sc);
      acc0 = _mm256_fmadd_ps(b0, sv, acc0);
      acc1 = _mm256_fmadd_ps(b1, sv, acc1);
    } else {
      rare += hsum256(_mm256_add_ps(b0, b1)) * 256.0f * e8m0_scalar(srow[i / 32]);
    }
  }
  float s = hsum256(_mm256_add_ps(acc0, acc1)) + rare;
  if (i < in) {
    float tail = 0;
    for (int64_t k = i; k < in; ++k) tail += e4m3_scalar(row[k]) * x[k];
    s += tail * e8m0_scalar(srow[i / 32]);
  }
  return s;
}

// buf[0..n) = n (<= 32) FP8 weights of one block times the block scale `s`.
inline void fp8_block_f16(const uint8_t* w, float s, float* buf, int64_t n) {
  if (n < 32) {
    for (int64_t i = 0; i < n; ++i) buf[i] = e4m3_scalar(w[i]) * s;
    return;
  }
  __m256 v[4];
  e4m3x32_f16(w, v);
  const __m256 sv = _mm256_set1_ps(s), k = _mm256_set1_ps(256.0f);
  for (int j = 0; j < 4; ++j)
    _mm256_storeu_ps(buf + 8 * j, _mm256_mul_ps(_mm256_mul_ps(v[j], k), sv));
}

// One token, FP8: all 32 rows of a scale-block row share the scale of each column block, so the
// activations are scaled once per 32 rows (xs = x * scale * 2^8, exact: powers of two) and each
// row's dot is then decode + FMA only, no per-block scale work.
constexpr int64_t kFp8ScaledMax = 16384;  // longer rows, or scales past 2^119, take the plain path

// xs[i] = x[i] * 2^(s_b - 127 + 8) for the 32-row group's scales srow; false when some scale times
// 2^8 is not a normal float (the caller then uses fp8_row_dot_f16).
inline bool fp8_prescale(const uint8_t* srow, int64_t in, const float* x, float* xs) {
  for (int64_t b = 0; b * 32 < in; ++b) {
    const float sc = e8m0_times_256(srow[b]);
    if (sc == 0.0f) return false;
    const int64_t n = std::min<int64_t>(32, in - b * 32);
    const __m256 sv = _mm256_set1_ps(sc);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(xs + b * 32 + i, _mm256_mul_ps(_mm256_loadu_ps(x + b * 32 + i), sv));
    for (; i < n; ++i) xs[b * 32 + i] = x[b * 32 + i] * sc;
  }
  return true;
}

// Dot of one FP8 row with prescaled activations (the values times 2^-8 from the decoder meet the
// 2^8 in xs). Four independent chains.
inline float fp8_row_dot_prescaled(const uint8_t* row, int64_t in, const float* xs) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= in; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row + i + 1024), _MM_HINT_T0);
    __m256 v[4];
    e4m3x32_f16(row + i, v);
    a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xs + i), a0);
    a1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xs + i + 8), a1);
    a2 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xs + i + 16), a2);
    a3 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xs + i + 24), a3);
  }
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  if (i < in) {
    float tail = 0;
    for (int64_t k = i; k < in; ++k) tail += e4m3_scalar(row[k]) * 0x1p-8f * xs[k];
    s += tail;
  }
  return s;
}

// y[o] for rows [0, out) of a one-token FP8 GEMV (w at row 0 of a 32-row scale group).
inline void fp8_gemv_one_token(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                               const float* x, float* y) {
  const int64_t sin = (in + 31) / 32;
  alignas(64) float xs[kFp8ScaledMax];
  for (int64_t g = 0; g * 32 < out; ++g) {
    const uint8_t* srow = scale + g * sin;
    const int64_t o1 = std::min<int64_t>(out, (g + 1) * 32);
    if (in <= kFp8ScaledMax && fp8_prescale(srow, in, x, xs)) {
      for (int64_t o = g * 32; o < o1; ++o) y[o] = fp8_row_dot_prescaled(w + o * in, in, xs);
    } else {
      for (int64_t o = g * 32; o < o1; ++o) y[o] = fp8_row_dot_f16(w + o * in, srow, in, x);
    }
  }
}

// ---- MXFP4 decoded to fp32 --------------------------------------------------------------------
// 8 packed bytes (16 E2M1 values) -> 16 floats in element order, times s: exact products (one
// rounding of value x s, as the scalar code), -0 kept. Every SIMD path that needs MXFP4 or packed
// FP4 values in fp32 (several-token GEMVs, GEMM panels, cache unpackers) decodes with this.
inline void e2m1x16_scaled(const uint8_t* p, float s, float* x) {
  const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  auto decode = [&](__m256i nib) {
    const __m256 v = _mm256_permutevar8x32_ps(mag, nib);  // the low 3 bits
    const __m256i sg = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(v, _mm256_castsi256_ps(sg));
  };
  const __m256 l = decode(_mm256_and_si256(b, _mm256_set1_epi32(15)));
  const __m256 h = decode(_mm256_srli_epi32(b, 4));
  const __m256 a = _mm256_unpacklo_ps(l, h), c = _mm256_unpackhi_ps(l, h);
  const __m256 sv = _mm256_set1_ps(s);
  _mm256_storeu_ps(x, _mm256_mul_ps(_mm256_permute2f128_ps(a, c, 0x20), sv));
  _mm256_storeu_ps(x + 8, _mm256_mul_ps(_mm256_permute2f128_ps(a, c, 0x31), sv));
}

// 32 MXFP4 values (16 bytes) of one block times its scale s -> dst[0..32).
inline void fp4_block_f32(const uint8_t* p, float s, float* dst) {
  e2m1x16_scaled(p, s, dst);
  e2m1x16_scaled(p + 8, s, dst + 16);
}

// ---- MXFP4 through int16 dot products ---------------------------------------------------------
// A token's activations are rounded once per call to int16 per 32-block (step max|x| / 32767, so
// each value moves by at most 1/65534 of its block's largest magnitude); then every weight block is
// an exact integer dot product: E2M1 x 2 is an integer in [-12, 12], looked up from the nibbles
// with a byte shuffle, placed in the high byte of an int16 lane (x 256, sign for free) and
// multiplied with vpmaddwd (vpdpwssd in the VNNI tier). The eight products summed per int32 lane
// stay below 2^30 (8 x 12 x 256 x 32767), so the integer sums are exact in any order. One float
// multiply-add per block applies (weight scale) x (activation step) / 512. This is the numerics
// decision of the MXFP4 path (docs/perf.md): the rounding of the activations is the only difference
// from an fp32 dot product.
constexpr int64_t kFp4ActMax = 8192;  // longer activations take the fp32 path

struct Fp4Act {
  // Per pair of blocks (64 values), in the order the nibble unpacking produces them: even
  // elements of both blocks first (pairs 0-7 of block 0, of block 1, pairs 8-15 of each), then odd.
  alignas(32) int16_t q[kFp4ActMax];
  alignas(32) float step[kFp4ActMax / 32 + 8];  // x step / 512 per block, zero past the end
};

// Position inside its 64-value group of element k (0..31) of block `blk` (0, 1) of the pair.
constexpr int fp4_act_slot(int blk, int k) {
  return (k % 2) * 32 + (k / 2 / 8) * 16 + blk * 8 + (k / 2) % 8;
}

// Quantizes x[0..n) (n a multiple of 32, <= kFp4ActMax). A block holding NaN or infinity gets a NaN
// step, so its outputs are NaN as the fp32 product's would be (or inf-NaN: never a finite lie).
// False when a nonzero block's largest magnitude is below 2^-96: 32767 / max would overflow and the
// step underflow, so such calls take the fp32 path.
inline bool fp4_act_prepare(const float* x, int64_t n, Fp4Act& a) {
  const int64_t padded = (n + 63) / 64 * 64;  // a lone last block's pair partner is all zero
  std::fill(a.q + n / 64 * 64, a.q + padded, int16_t{0});
  std::fill(a.step + n / 32, a.step + kFp4ActMax / 32 + 8, 0.0f);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float m;
    const bool finite = amax_finite(xb, 32, m);
    int16_t* q = a.q + (b / 2) * 64;
    const int blk = int(b % 2);
    if (!finite || m == 0.0f) {
      for (int k = 0; k < 32; ++k) q[fp4_act_slot(blk, k)] = 0;
      a.step[b] = finite ? 0.0f : NAN;
      continue;
    }
    if (m < 0x1p-96f) return false;
    const __m256 inv = _mm256_set1_ps(32767.0f / m);
    alignas(32) int32_t r[32];
    for (int j = 0; j < 4; ++j)  // round to nearest (MXCSR default), |r| <= 32767
      _mm256_store_si256(reinterpret_cast<__m256i*>(r + 8 * j),
                         _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * j), inv)));
    for (int k = 0; k < 32; ++k)
      q[fp4_act_slot(blk, k)] = static_cast<int16_t>(std::clamp(r[k], -32767, 32767));
    a.step[b] = m / 32767.0f / 512.0f;
  }
  return true;
}

// Eight blocks' combined scales: 2^(e-127) (bits; 0 -> 2^-127, 255 -> NaN) times the steps.
inline __m256 fp4_scales8(const uint8_t* srow, int64_t nblocks_left, const float* step) {
  uint8_t tmp[8] = {};
  const uint8_t* p = srow;
  if (nblocks_left < 8) {
    std::memcpy(tmp, srow, std::size_t(nblocks_left));
    p = tmp;
  }
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i special =
      _mm256_and_si256(_mm256_or_si256(_mm256_cmpeq_epi32(e, _mm256_setzero_si256()),
                                       _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255))),
                       _mm256_set1_epi32(0x00400000));
  const __m256 w = _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(e, 23), special));
  return _mm256_mul_ps(w, _mm256_loadu_ps(step));
}

// The exact int32 lane sums of one block's int16 weights (w0..w3) times 64 int16 activations
// at x: the one-token and the several-token MXFP4 paths share it, so their bits agree.
// The VNNI tier accumulates with vpdpwssd: the same exact sums (no lane can overflow: eight
// products of at most 12 x 256 x 32767 each), so the bits agree with the other tiers'.
inline __m256i i16_block_dot(__m256i w0, __m256i w1, __m256i w2, __m256i w3, const __m256i* x) {
#ifdef DSV41_VNNI
  __m256i s = _mm256_madd_epi16(w0, x[0]);
  s = _mm256_dpwssd_epi32(s, w1, x[1]);
  s = _mm256_dpwssd_epi32(s, w2, x[2]);
  return _mm256_dpwssd_epi32(s, w3, x[3]);
#else
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(w0, x[0]), _mm256_madd_epi16(w1, x[1])),
      _mm256_add_epi32(_mm256_madd_epi16(w2, x[2]), _mm256_madd_epi16(w3, x[3])));
#endif
}

// A block pair's 64 E2M1 weights (32 bytes at p; only the first block when !pair) as the four int16
// vectors the dots take: each value times 2 (an integer in [-12, 12], looked up from its nibble
// with a byte shuffle) in the high byte of its lane (x 256, sign for free); w[0], w[1] hold the
// even elements, w[2], w[3] the odd ones, in the order Fp4Act / Fp4Act2 store the activations.
inline void fp4_pair_i16(const uint8_t* p, bool pair, __m256i w[4]) {
  const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0,
                                       1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i nib = _mm256_set1_epi8(0x0F), z = _mm256_setzero_si256();
  const __m256i v =
      pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
           : _mm256_inserti128_si256(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), 0);
  const __m256i we = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib));
  const __m256i wo = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
  w[0] = _mm256_unpacklo_epi8(z, we);
  w[1] = _mm256_unpackhi_epi8(z, we);
  w[2] = _mm256_unpacklo_epi8(z, wo);
  w[3] = _mm256_unpackhi_epi8(z, wo);
}

// One MXFP4 row (in a multiple of 32, srow one scale per block) dotted with prepared activations.
inline float fp4_row_dot_i16(const uint8_t* row, const uint8_t* srow, int64_t in, const Fp4Act& a) {
  const int64_t nblocks = in / 32;
  __m256 acc = _mm256_setzero_ps(), sv = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; b += 2) {
    if ((b & 7) == 0) sv = fp4_scales8(srow + b, nblocks - b, a.step + b);
    _mm_prefetch(reinterpret_cast<const char*>(row + b * 16 + 512), _MM_HINT_T0);
    const bool pair = b + 2 <= nblocks;
    __m256i w[4];
    fp4_pair_i16(row + b * 16, pair, w);
    const __m256i* xq = reinterpret_cast<const __m256i*>(a.q + b * 32);
#ifdef DSV41_VNNI
    // The four vpmaddwd pair sums, accumulated by vpdpwssd: exact, as below, so the bits agree.
    __m256i isum = _mm256_madd_epi16(w[0], xq[0]);
    isum = _mm256_dpwssd_epi32(isum, w[1], xq[1]);
    isum = _mm256_dpwssd_epi32(isum, w[2], xq[2]);
    isum = _mm256_dpwssd_epi32(isum, w[3], xq[3]);
#else
    const __m256i even =
        _mm256_add_epi32(_mm256_madd_epi16(w[0], xq[0]), _mm256_madd_epi16(w[1], xq[1]));
    const __m256i odd =
        _mm256_add_epi32(_mm256_madd_epi16(w[2], xq[2]), _mm256_madd_epi16(w[3], xq[3]));
    const __m256i isum = _mm256_add_epi32(even, odd);
#endif
    const int k = int(b & 7);
    __m256 sc =
        _mm256_permutevar8x32_ps(sv, _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1));
    if (!pair) sc = _mm256_blend_ps(sc, _mm256_setzero_ps(), 0xF0);  // lanes 4-7: no second block
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sc, acc);
  }
  return hsum256(acc);
}

// ---- MXFP4 through two int16 terms per activation (the "exact" one-token path) ------------------
// As above, but each 32-block's activations are split as x = step * hi + (step / 32768) * lo with
// step the power of two >= max|x| / 32767: hi = round(x / step), and the remainder x - step * hi
// (exact: step is a power of two) rounded again, lo = round(remainder * 32768 / step), |lo| <=
// 16384. What is left is at most step / 65536 <= max / (32767 * 32768), about 2^-30 of the block's
// largest magnitude: values within 2^7 of the maximum are represented exactly, and the error of the
// whole dot product stays far below the fp32 rounding of a plain product sum. Both integer dots are
// exact; the weights are looked up once for both. Twice the integer work of the int16 path, a
// fraction of the fp32 path's.
struct Fp4Act2 {
  alignas(32) int16_t hi[kFp4ActMax];
  alignas(32) int16_t lo[kFp4ActMax];
  alignas(32) float step[kFp4ActMax / 32 + 8];  // step / 512 per block, zero past the end
};

// False as fp4_act_prepare (a nonzero block below 2^-96: the fp32 path); NaN/inf blocks get a NaN
// step.
inline bool fp4_act_prepare2(const float* x, int64_t n, Fp4Act2& a) {
  const int64_t padded = (n + 63) / 64 * 64;
  std::fill(a.hi + n / 64 * 64, a.hi + padded, int16_t{0});
  std::fill(a.lo + n / 64 * 64, a.lo + padded, int16_t{0});
  std::fill(a.step + n / 32, a.step + kFp4ActMax / 32 + 8, 0.0f);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float m;
    const bool finite = amax_finite(xb, 32, m);
    int16_t* qh = a.hi + (b / 2) * 64;
    int16_t* ql = a.lo + (b / 2) * 64;
    const int blk = int(b % 2);
    if (!finite || m == 0.0f) {
      for (int k = 0; k < 32; ++k) qh[fp4_act_slot(blk, k)] = ql[fp4_act_slot(blk, k)] = 0;
      a.step[b] = finite ? 0.0f : NAN;
      continue;
    }
    if (m < 0x1p-96f) return false;
    int e;
    std::frexp(m / 32767.0f, &e);  // m / 32767 in [2^(e-1), 2^e): step = 2^e >= m / 32767
    const float step = std::ldexp(1.0f, e), inv = std::ldexp(1.0f, -e);
    const float inv_lo = std::ldexp(1.0f, 15 - e);
    for (int k = 0; k < 32; ++k) {
      const float h = std::nearbyint(xb[k] * inv);  // |h| <= 32767
      const float r = xb[k] - h * step;             // exact
      qh[fp4_act_slot(blk, k)] = static_cast<int16_t>(h);
      ql[fp4_act_slot(blk, k)] = static_cast<int16_t>(std::nearbyint(r * inv_lo));
    }
    a.step[b] = step / 512.0f;
  }
  return true;
}

// fn(t0, nt) for ntok tokens in near-equal passes of at most max_nt (5 tokens by 3: 3 + 2; 4 by
// 3: 2 + 2, not 3 + 1).
template <typename Fn>
inline void token_passes(int64_t ntok, int64_t max_nt, const Fn& fn) {
  const int64_t passes = (ntok + max_nt - 1) / max_nt;
  for (int64_t p = 0, t0 = 0; p < passes; ++p) {
    const int64_t nt = (ntok - t0 + (passes - p) - 1) / (passes - p);
    fn(t0, nt);
    t0 += nt;
  }
}

// The two-term MXFP4 dots of R rows x NT tokens (one token: the one-token path; several: every
// token's bits are those of the one-token path for it alone). Per (row, token): the combined
// scales of 8 blocks at a time, each block pair's two exact integer dots (hi and lo) converted and
// multiply-added with its scales into two accumulators, in block order, and the final sum
// hsum(acc + lo / 32768). Only the sharing changes with R and NT: a row's decoded block pair feeds
// every token and each token's activations are loaded once per R rows. R and NT are compile-time so
// the compiler can keep the 2 x R x NT accumulators and the R decoded block pairs in registers (an
// earlier version with the token count at run time kept every accumulator in memory and did no
// better at 2-3 tokens than one call per token). The AVX-512 tiers (DSV41_AVX512_TIER, set by
// avx512_tier.h; AVX-512VL gives the 256-bit code 32 registers) take 4 rows x 2 tokens: 40 values
// for 32 registers, so some spill, but measured a little faster than 2 x 4 and 2 x 3 at 2-6 tokens
// on Zen 4. The emulated AVX-512 tiers run the same shape with AVX2's 16 registers (slower, the
// same logic). AVX2: 1 row x 3 tokens.
#ifdef DSV41_AVX512_TIER
constexpr int kFp4TileRows = 4, kFp4TileTokens = 2;
#else
constexpr int kFp4TileRows = 1, kFp4TileTokens = 3;
#endif

// One block pair (one block when !kPair: the row's odd last block) of fp4_tile_i16x2.
template <int R, int NT, bool kPair>
inline void fp4_tile_step(const uint8_t* w, int64_t in, const Fp4Act2* acts, int64_t b,
                          const __m256 (&sv)[R][NT], __m256 (&acc)[R][NT], __m256 (&lo)[R][NT]) {
  const int k = int(b & 7);
  const __m256i perm = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
  __m256i wq[R][4];
  for (int r = 0; r < R; ++r) {
    const uint8_t* row = w + r * (in / 2);
    if ((b & 3) == 0)  // a 64-byte line every 4 blocks, 512 bytes ahead
      _mm_prefetch(reinterpret_cast<const char*>(row + b * 16 + 512), _MM_HINT_T0);
    fp4_pair_i16(row + b * 16, kPair, wq[r]);
  }
  for (int t = 0; t < NT; ++t) {
    const __m256i* xh = reinterpret_cast<const __m256i*>(acts[t].hi + b * 32);
    const __m256i* xl = reinterpret_cast<const __m256i*>(acts[t].lo + b * 32);
    for (int r = 0; r < R; ++r) {
      const __m256i ih = i16_block_dot(wq[r][0], wq[r][1], wq[r][2], wq[r][3], xh);
      const __m256i il = i16_block_dot(wq[r][0], wq[r][1], wq[r][2], wq[r][3], xl);
      __m256 sc = _mm256_permutevar8x32_ps(sv[r][t], perm);
      if (!kPair) sc = _mm256_blend_ps(sc, _mm256_setzero_ps(), 0xF0);  // no second block
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih), sc, acc[r][t]);
      lo[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il), sc, lo[r][t]);
    }
  }
}

template <int R, int NT>
inline void fp4_tile_i16x2(const uint8_t* w, const uint8_t* scale, int64_t in, const Fp4Act2* acts,
                           float* out, int64_t ldo) {
  const int64_t nblocks = in / 32;
  __m256 acc[R][NT], lo[R][NT], sv[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = lo[r][t] = sv[r][t] = _mm256_setzero_ps();
  auto scales = [&](int64_t b) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < NT; ++t)
        sv[r][t] = fp4_scales8(scale + r * (in / 32) + b, nblocks - b, acts[t].step + b);
  };
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2) {
    if ((b & 7) == 0) scales(b);
    fp4_tile_step<R, NT, true>(w, in, acts, b, sv, acc, lo);
  }
  if (b < nblocks) {
    if ((b & 7) == 0) scales(b);
    fp4_tile_step<R, NT, false>(w, in, acts, b, sv, acc, lo);
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t)
      out[t * ldo + r] = hsum256(
          _mm256_add_ps(acc[r][t], _mm256_mul_ps(lo[r][t], _mm256_set1_ps(1.0f / 32768.0f))));
}

// Rows [0, out) for NT tokens: kFp4TileRows rows at a time, the rest one by one.
template <int NT>
inline void fp4_rows_nt(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                        const Fp4Act2* acts, float* y, int64_t ldy) {
  int64_t o = 0;
  for (; o + kFp4TileRows <= out; o += kFp4TileRows)
    fp4_tile_i16x2<kFp4TileRows, NT>(w + o * (in / 2), scale + o * (in / 32), in, acts, y + o, ldy);
  for (; o < out; ++o)
    fp4_tile_i16x2<1, NT>(w + o * (in / 2), scale + o * (in / 32), in, acts, y + o, ldy);
}

// Rows [0, out) of the tile kernel for every token, the tokens in near-equal passes of at most
// kFp4TileTokens over all rows (a pass's activations stay in cache while the rows stream; rows
// outermost with every pass per row tile measured slower at 4-6 tokens).
inline void fp4_rows_i16x2(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                           const Fp4Act2* acts, int64_t ntok, float* y, int64_t ldy) {
  token_passes(ntok, kFp4TileTokens, [&](int64_t t0, int64_t nt) {
    float* yt = y + t0 * ldy;
    switch (nt) {
      case 1:
        fp4_rows_nt<1>(w, scale, out, in, acts + t0, yt, ldy);
        break;
      case 2:
        fp4_rows_nt<2>(w, scale, out, in, acts + t0, yt, ldy);
        break;
      case 3:
        fp4_rows_nt<3>(w, scale, out, in, acts + t0, yt, ldy);
        break;
      default:
        DSV41_CHECK(false);
    }
  });
}

// Gate/up rows for prepared tokens: 48 gate/up pairs (96 interleaved rows) at a time into `gu`
// (ntok x 96 floats), then the clamp/SwiGLU/route epilogue per token into h[t * ldh + j].
constexpr int64_t kGateUpPairs = 48;

inline void fp4_gate_up_rows(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                             const Fp4Act2* acts, int64_t ntok, const float* route, float limit,
                             float* h, int64_t ldh, float* gu) {
  for (int64_t j0 = 0; j0 < inter; j0 += kGateUpPairs) {
    const int64_t jn = std::min(kGateUpPairs, inter - j0);
    fp4_rows_i16x2(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, acts, ntok, gu,
                   2 * jn);
    for (int64_t t = 0; t < ntok; ++t)
      for (int64_t j = 0; j < jn; ++j) {
        const float gc = std::min(gu[t * 2 * jn + 2 * j], limit);
        const float uc = std::clamp(gu[t * 2 * jn + 2 * j + 1], -limit, limit);
        h[t * ldh + j0 + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
      }
  }
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
    for (int64_t b = 0; b < n; b += 32) {
      // The same row one chunk ahead, or past its end the row a tile further (a prefetch never
      // faults, even past the matrix): four row streams defeat the hardware prefetcher.
      _mm_prefetch(
          reinterpret_cast<const char*>(row + c0 + b + kTileChunk +
                                        (c0 + b + kTileChunk < in ? 0 : (kTileRows - 1) * in)),
          _MM_HINT_T0);
      fp8_block_f16(row + c0 + b, e8m0_scalar(srow[(c0 + b) / 32]), dst + b,
                    std::min<int64_t>(32, n - b));
    }
  };
  if (ntok == 1) return S::fp8_one_token(w, scale, out, in, x, y);
  int64_t o = 0;
  for (; o + kTileRows <= out; o += kTileRows) tile_rows<S>(o, out, in, x, ntok, y, decode);
  for (; o < out; ++o) {
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
  alignas(64) float buf[kRowChunk];
  std::fill(acc, acc + ntok, 0.0f);
  for (int64_t c0 = 0; c0 < in; c0 += kRowChunk) {
    const int64_t n = std::min(kRowChunk, in - c0);
    for (int64_t b = 0; b < n; b += 32)
      fp4_block_f32(row + (c0 + b) / 2, e8m0_scalar(srow[(c0 + b) / 32]), buf + b);
    dots_all_tokens<S>(buf, n, x + c0, in, ntok, acc);
  }
}

// kInt16 = false: the one-token int16 rounding is replaced by the two-term split (fp4_act_prepare2,
// error below 2^-30 of each block's largest activation); several tokens: fp32 products either way.
template <typename S, bool kInt16 = true>
void mxfp4_gemv_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                     const float* x, int64_t ntok, float* y) {
  float acc[16];
  auto decode = [&](int64_t o, int64_t c0, int64_t n, float* dst) {
    const uint8_t* row = w + o * (in / 2);
    const uint8_t* srow = scale + o * (in / 32);
    for (int64_t b = 0; b < n; b += 32) {
      if (b % 128 == 0)  // one chunk ahead, as the FP8 decode (64-byte lines: every 128 values)
        _mm_prefetch(reinterpret_cast<const char*>(
                         row + (c0 + b + kTileChunk) / 2 +
                         (c0 + b + kTileChunk < in ? 0 : (kTileRows - 1) * (in / 2))),
                     _MM_HINT_T0);
      fp4_block_f32(row + (c0 + b) / 2, e8m0_scalar(srow[(c0 + b) / 32]), dst + b);
    }
  };
  Fp4Act a;
  if (kInt16 && ntok == 1 && in <= kFp4ActMax && fp4_act_prepare(x, in, a)) {
    for (int64_t o = 0; o < out; ++o)
      y[o] = fp4_row_dot_i16(w + o * (in / 2), scale + o * (in / 32), in, a);
    return;
  }
  if (!kInt16 && ntok == 1 && in <= kFp4ActMax) {
    static thread_local Fp4Act2 a2;  // 32 KB: off the stack, reused (no allocation per call)
    if (fp4_act_prepare2(x, in, a2)) return fp4_rows_i16x2(w, scale, out, in, &a2, 1, y, out);
  }
  int64_t o = 0;
  if (ntok > 1)
    for (; o + kTileRows <= out; o += kTileRows) tile_rows<S>(o, out, in, x, ntok, y, decode);
  for (; o < out; ++o) {
    fp4_row_dots<S>(w + o * (in / 2), scale + o * (in / 32), in, x, ntok, acc);
    for (int64_t t = 0; t < ntok; ++t) y[t * out + o] = acc[t];
  }
}

template <typename S, bool kInt16 = true>
void mxfp4_gate_up_impl(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                        const float* x, const float* route, int64_t ntok, float limit, float* h) {
  float g[16], u[16];
  Fp4Act a;
  if (kInt16 && ntok == 1 && dim <= kFp4ActMax && fp4_act_prepare(x, dim, a)) {
    for (int64_t j = 0; j < inter; ++j) {
      const float gc = std::min(
          fp4_row_dot_i16(w13 + 2 * j * (dim / 2), s13 + 2 * j * (dim / 32), dim, a), limit);
      const float uc = std::clamp(
          fp4_row_dot_i16(w13 + (2 * j + 1) * (dim / 2), s13 + (2 * j + 1) * (dim / 32), dim, a),
          -limit, limit);
      h[j] = gc / (1.0f + std::exp(-gc)) * uc * route[0];
    }
    return;
  }
  if (!kInt16 && ntok == 1 && dim <= kFp4ActMax) {
    static thread_local Fp4Act2 a2;
    float gu[2 * kGateUpPairs];
    if (fp4_act_prepare2(x, dim, a2))
      return fp4_gate_up_rows(w13, s13, inter, dim, &a2, 1, route, limit, h, inter, gu);
  }
  for (int64_t j = 0; j < inter; ++j) {
    fp4_row_dots<S>(w13 + (2 * j) * (dim / 2), s13 + (2 * j) * (dim / 32), dim, x, ntok, g);
    fp4_row_dots<S>(w13 + (2 * j + 1) * (dim / 2), s13 + (2 * j + 1) * (dim / 32), dim, x, ntok, u);
    for (int64_t t = 0; t < ntok; ++t) {
      const float gc = std::min(g[t], limit), uc = std::clamp(u[t], -limit, limit);
      h[t * inter + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
    }
  }
}

// ---- BF16 one-token GEMV -----------------------------------------------------------------------
// y[o] = W[o, :] . x for one token, W bf16 row-major: each row's 16-wide chunks widened to fp32 (a
// shift: exact) and accumulated by FMA in two registers, the tail in scalar. Four rows at a time
// share the activation loads; every row's sum runs in the same order whether it falls in a group
// of four or in the remainder (its own accumulators, the same chunk order), so a row's result does
// not depend on how the rows are split.
inline __m256 bf16x8_to_f32(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int R>
inline void bf16_rows_dot(const uint16_t* w, int64_t in, const float* x, float* y) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_fmadd_ps(bf16x8_to_f32(w + r * in + i), x0, a0[r]);
      a1[r] = _mm256_fmadd_ps(bf16x8_to_f32(w + r * in + i + 8), x1, a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum256(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t k = i; k < in; ++k) {
      const uint32_t bits = uint32_t(w[r * in + k]) << 16;
      float wf;
      std::memcpy(&wf, &bits, 4);
      s += wf * x[k];
    }
    y[r] = s;
  }
}

inline void bf16_gemv_simd(const uint16_t* w, int64_t out, int64_t in, const float* x, float* y) {
  int64_t o = 0;
  for (; o + 4 <= out; o += 4) {
    if (o + 8 <= out)  // the next group's first lines, a group ahead
      for (int r = 0; r < 4; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (o + 4 + r) * in), _MM_HINT_T0);
    bf16_rows_dot<4>(w + o * in, in, x, y + o);
  }
  for (; o < out; ++o) bf16_rows_dot<1>(w + o * in, in, x, y + o);
}

// ---- Batch-invariant several-token GEMVs ------------------------------------------------------
// Token t's outputs are bit for bit what the one-token kernel gives for x_t alone (the fast
// forward's batch invariance, docs/decisions.md): each token runs the one-token path's arithmetic
// in its order; only the memory traffic is shared (a row is decoded or loaded once, then every
// token's dot reads it from L1). y[t * ldy + o].

// Rows [0, nrows) of one 32-row scale group times NT (1..3) tokens' prescaled activations, each
// (row, token) exactly fp8_row_dot_prescaled's arithmetic: the same four chains over 32-value
// steps in k order, the same final sum and tail. The reordering only shares work: a row's 32
// decoded weights (four registers) feed NT tokens' FMAs, and k runs in chunks of kFp8KChunk so the
// NT tokens' activation chunks stay in L1 across the group's rows (the chains wait in acc between
// chunks; a store and reload keeps their bits).
constexpr int64_t kFp8KChunk = 1024;

template <int NT>
inline void fp8_group_dots(const uint8_t* w, int64_t nrows, int64_t in, const float* const* xs,
                           __m256 (*acc)[3][4], float* const* out) {
  const int64_t full = in / 32 * 32;
  for (int64_t r = 0; r < nrows; ++r)
    for (int t = 0; t < NT; ++t)
      for (int j = 0; j < 4; ++j) acc[r][t][j] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < full; k0 += kFp8KChunk) {
    const int64_t k1 = std::min(full, k0 + kFp8KChunk);
    for (int64_t r = 0; r < nrows; ++r) {
      const uint8_t* row = w + r * in;
      if (r + 1 < nrows) _mm_prefetch(reinterpret_cast<const char*>(row + in + k0), _MM_HINT_T0);
      __m256 a[NT][4];
      for (int t = 0; t < NT; ++t)
        for (int j = 0; j < 4; ++j) a[t][j] = acc[r][t][j];
      for (int64_t i = k0; i < k1; i += 32) {
        __m256 v[4];
        e4m3x32_f16(row + i, v);
        for (int t = 0; t < NT; ++t)
          for (int j = 0; j < 4; ++j)
            a[t][j] = _mm256_fmadd_ps(v[j], _mm256_loadu_ps(xs[t] + i + 8 * j), a[t][j]);
      }
      for (int t = 0; t < NT; ++t)
        for (int j = 0; j < 4; ++j) acc[r][t][j] = a[t][j];
    }
  }
  for (int64_t r = 0; r < nrows; ++r)
    for (int t = 0; t < NT; ++t) {
      const __m256* a = acc[r][t];
      float sum = hsum256(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
      if (full < in) {
        float tail = 0;
        for (int64_t k = full; k < in; ++k) tail += e4m3_scalar(w[r * in + k]) * 0x1p-8f * xs[t][k];
        sum += tail;
      }
      out[t][r] = sum;
    }
}

// The several-token FP8 driver both SIMD bodies share: rows past kFp8ScaledMax go token by token
// through the one-token kernel; otherwise per 32-row scale group the tokens' activations are
// prescaled once (when a scale is past a normal float, every (row, token) takes fp8_row_dot_f16,
// as the one-token kernel does), then `group(wg, nrows, xs, nt, out)` runs each pass of at most
// kMaxNT tokens: xs[t] their prescaled activations, out[t] + r where row r's result goes.
template <int kMaxNT, typename Group>
inline void fp8_batch_groups(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                             const float* x, int64_t ntok, float* y, int64_t ldy,
                             const Group& group) {
  if (in > kFp8ScaledMax) {
    for (int64_t t = 0; t < ntok; ++t)
      fp8_gemv_one_token(w, scale, out, in, x + t * in, y + t * ldy);
    return;
  }
  static thread_local std::vector<float> xs;  // grows once per thread: no allocation per step
  if (xs.size() < std::size_t(ntok * in)) xs.resize(std::size_t(ntok * in));
  const int64_t sin = (in + 31) / 32;
  for (int64_t g = 0; g * 32 < out; ++g) {
    const uint8_t* srow = scale + g * sin;
    const int64_t o0 = g * 32, nrows = std::min<int64_t>(out, o0 + 32) - o0;
    bool ok = true;  // depends on the scales only: the same answer for every token
    for (int64_t t = 0; t < ntok && ok; ++t)
      ok = fp8_prescale(srow, in, x + t * in, xs.data() + t * in);
    if (!ok) {
      for (int64_t o = o0; o < o0 + nrows; ++o)
        for (int64_t t = 0; t < ntok; ++t)
          y[t * ldy + o] = fp8_row_dot_f16(w + o * in, srow, in, x + t * in);
      continue;
    }
    token_passes(ntok, kMaxNT, [&](int64_t t0, int64_t nt) {
      const float* xp[kMaxNT];
      float* op[kMaxNT];
      for (int64_t t = 0; t < nt; ++t)
        xp[t] = xs.data() + (t0 + t) * in, op[t] = y + (t0 + t) * ldy + o0;
      group(w + o0 * in, nrows, xp, int(nt), op);
    });
  }
}

inline void fp8_gemv_batch_simd(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                                const float* x, int64_t ntok, float* y, int64_t ldy) {
  alignas(32) __m256 acc[32][3][4];
  fp8_batch_groups<3>(
      w, scale, out, in, x, ntok, y, ldy,
      [&](const uint8_t* wg, int64_t nrows, const float* const* xp, int nt, float* const* op) {
        if (nt == 3)
          fp8_group_dots<3>(wg, nrows, in, xp, acc, op);
        else if (nt == 2)
          fp8_group_dots<2>(wg, nrows, in, xp, acc, op);
        else
          fp8_group_dots<1>(wg, nrows, in, xp, acc, op);
      });
}

inline void bf16_gemv_batch_simd(const uint16_t* w, int64_t out, int64_t in, const float* x,
                                 int64_t ntok, float* y, int64_t ldy) {
  int64_t o = 0;
  float tmp[4];
  for (; o + 4 <= out; o += 4)
    for (int64_t t = 0; t < ntok; ++t) {
      bf16_rows_dot<4>(w + o * in, in, x + t * in, tmp);
      for (int r = 0; r < 4; ++r) y[t * ldy + o + r] = tmp[r];
    }
  for (; o < out; ++o)
    for (int64_t t = 0; t < ntok; ++t)
      bf16_rows_dot<1>(w + o * in, in, x + t * in, y + t * ldy + o);
}

// MXFP4, several tokens, each exactly as mxfp4_gemv_impl<S, false> / mxfp4_gate_up_impl<S, false>
// with that token alone: the two-term activations per token, the weights read once for all.
template <typename S>
void mxfp4_gemv_batch_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                           const float* x, int64_t ntok, float* y, int64_t ldy) {
  static thread_local std::vector<Fp4Act2> acts;
  static thread_local std::vector<float> tmp;
  if (acts.size() < std::size_t(ntok)) acts.resize(std::size_t(ntok));
  bool all = in <= kFp4ActMax;
  for (int64_t t = 0; t < ntok && all; ++t)
    all = fp4_act_prepare2(x + t * in, in, acts[std::size_t(t)]);
  if (!all) {  // some token takes the fp32 path: each token alone, as the one-token kernel
    if (tmp.size() < std::size_t(out)) tmp.resize(std::size_t(out));
    for (int64_t t = 0; t < ntok; ++t) {
      mxfp4_gemv_impl<S, false>(w, scale, out, in, x + t * in, 1, tmp.data());
      std::copy_n(tmp.data(), out, y + t * ldy);
    }
    return;
  }
  fp4_rows_i16x2(w, scale, out, in, acts.data(), ntok, y, ldy);
}

template <typename S>
void mxfp4_gate_up_batch_impl(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                              const float* x, const float* route, int64_t ntok, float limit,
                              float* h, int64_t ldh) {
  static thread_local std::vector<Fp4Act2> acts;
  static thread_local std::vector<float> gu;
  if (acts.size() < std::size_t(ntok)) acts.resize(std::size_t(ntok));
  bool all = dim <= kFp4ActMax;
  for (int64_t t = 0; t < ntok && all; ++t)
    all = fp4_act_prepare2(x + t * dim, dim, acts[std::size_t(t)]);
  if (!all) {
    for (int64_t t = 0; t < ntok; ++t)
      mxfp4_gate_up_impl<S, false>(w13, s13, inter, dim, x + t * dim, route + t, 1, limit,
                                   h + t * ldh);
    return;
  }
  if (gu.size() < std::size_t(ntok * 2 * kGateUpPairs))
    gu.resize(std::size_t(ntok * 2 * kGateUpPairs));
  fp4_gate_up_rows(w13, s13, inter, dim, acts.data(), ntok, route, limit, h, ldh, gu.data());
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

// mHC coefficients (see Kernels::hc_mix): the rms and the (2 + hc) * hc row dots in the tier's
// order (four rows per pass over h), then the bit-identical epilogue. More than 64 coefficients
// (hc > 6) go to the scalar tier.
template <typename S>
void hc_mix_impl(const float* h, int64_t hc, int64_t d, const float* fn, const float* base,
                 const float* scale, float norm_eps, float hc_eps, int64_t iters, float* pre,
                 float* post, float* comb) {
  const int64_t n = hc * d, mix = (2 + hc) * hc;
  if (mix > 64)
    return kernels_for(Isa::kScalar)
        .hc_mix(h, hc, d, fn, base, scale, norm_eps, hc_eps, iters, pre, post, comb);
  const float r = 1.0f / std::sqrt(S::sum_squares(h, n) / float(n) + norm_eps);
  float m[64] = {};
  int64_t row = 0;
  for (; row + 4 <= mix; row += 4) S::dot4(h, fn + row * n, n, n, m + row);
  for (; row < mix; ++row) m[row] = S::dot(fn + row * n, h, n);
  for (row = 0; row < mix; ++row) m[row] *= r;
  hc_sinkhorn_simd(m, base, scale, hc, hc_eps, iters, pre, post, comb);
}

// Collapse + RMSNorm in one pass over the streams (see Kernels::hc_collapse_rmsnorm): each x value
// is the reference's sum (0 + w0 h0 + w1 h1 + ..., separate multiplies and adds in j order) and
// its square joins the rms sum in the same pass; a second pass over x (in L1) applies
// norm_w * (x * r) as the reference's rmsnorm does.
inline void hc_collapse_rmsnorm_simd(const float* h, const float* w, int64_t hc, int64_t d,
                                     const float* norm_w, float eps, float* x) {
  __m256 ss = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    __m256 s = _mm256_setzero_ps();
    for (int64_t j = 0; j < hc; ++j)
      s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(h + j * d + i)));
    _mm256_storeu_ps(x + i, s);
    ss = _mm256_fmadd_ps(s, s, ss);
  }
  float sum = hsum256(ss);
  for (; i < d; ++i) {
    float s = 0;
    for (int64_t j = 0; j < hc; ++j) s += w[j] * h[j * d + i];
    x[i] = s;
    sum += s * s;
  }
  const float r = 1.0f / std::sqrt(sum / float(d) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (i = 0; i + 8 <= d; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(norm_w + i),
                                          _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
  for (; i < d; ++i) x[i] = norm_w[i] * (x[i] * r);
}

// Expand (see Kernels::hc_expand): per output stream k, post[k] y + comb[j][k] res_j in j order
// with separate multiplies and adds: bit-identical to the reference.
inline void hc_expand_simd(const float* y, const float* res, const float* post, const float* comb,
                           int64_t hc, int64_t d, float* out) {
  for (int64_t k = 0; k < hc; ++k) {
    const __m256 pk = _mm256_set1_ps(post[k]);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
      __m256 s = _mm256_mul_ps(pk, _mm256_loadu_ps(y + i));
      for (int64_t j = 0; j < hc; ++j)
        s = _mm256_add_ps(
            s, _mm256_mul_ps(_mm256_set1_ps(comb[j * hc + k]), _mm256_loadu_ps(res + j * d + i)));
      _mm256_storeu_ps(out + k * d + i, s);
    }
    for (; i < d; ++i) {
      float s = post[k] * y[i];
      for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k] * res[j * d + i];
      out[k * d + i] = s;
    }
  }
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

// 16 packed bytes (32 E2M1 values) -> 32 uint8 = 2 x value + 12, in [0, 24] (the element order of
// fp4_block_to_i8): unsigned, so one vpmaddubsw multiplies it with signed query bytes directly.
inline __m256i fp4_block_to_u8_offset(const uint8_t* p) {
  const __m128i lut = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_setr_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(v, m)),
                           _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}

// Eight int32 vectors -> one vector of their eight lane sums (element j = sum of m[j]'s lanes).
inline __m256i hsum8_epi32(const __m256i m[8]) {
  const __m256i t01 = _mm256_hadd_epi32(m[0], m[1]), t23 = _mm256_hadd_epi32(m[2], m[3]);
  const __m256i t45 = _mm256_hadd_epi32(m[4], m[5]), t67 = _mm256_hadd_epi32(m[6], m[7]);
  const __m256i u0 = _mm256_hadd_epi32(t01, t23), u1 = _mm256_hadd_epi32(t45, t67);
  // u0 = [k0 k1 k2 k3 (low halves) | k0 k1 k2 k3 (high halves)], u1 the same for k4..k7
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// Scores of eight consecutive keys (nb <= 4 blocks of 32), lanes = keys: per (head, block) eight
// exact integer dots q . (k + 12) - 12 sum(q), one float multiply by the two blocks' scales (x 1/4)
// and an add in block order, then ReLU and the head weight, heads in order: the same operations as
// the one-key path below, so the same results.
inline void indexer_scores_8keys(const __m256i* qi, const float* qs, const int32_t* qsum,
                                 const float* w, int64_t nh, int64_t nb, const uint8_t* keys,
                                 int64_t row, int64_t di, float* scores) {
  __m256i ku[4][8];
  __m256 ksv[4];
  for (int64_t b = 0; b < nb; ++b) {
    alignas(32) float ks[8];
    for (int j = 0; j < 8; ++j) {
      ku[b][j] = fp4_block_to_u8_offset(keys + j * row + 16 * b);
      ks[j] = e8m0_scalar(keys[j * row + di / 2 + b]);
    }
    ksv[b] = _mm256_load_ps(ks);
  }
#ifndef DSV41_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  __m256 acc = _mm256_setzero_ps();
  for (int64_t h = 0; h < nh; ++h) {
    __m256 d = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = qi[h * nb + b];
      __m256i m[8];
#ifdef DSV41_VNNI
      // vpdpbusd: the four u8 x s8 products of each int32 lane summed in one instruction; the
      // pairs below never saturate (|sum| <= 2 x 24 x 12), so the bits agree.
      for (int j = 0; j < 8; ++j) m[j] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ku[b][j], q);
#else
      for (int j = 0; j < 8; ++j) m[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ku[b][j], q), ones);
#endif
      const __m256i dots =
          _mm256_sub_epi32(hsum8_epi32(m), _mm256_set1_epi32(12 * qsum[h * nb + b]));
      const __m256 sc = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(qs[h * nb + b]), ksv[b]),
                                      _mm256_set1_ps(0.25f));
      d = _mm256_add_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(dots), sc));
    }
    acc = _mm256_add_ps(acc,
                        _mm256_mul_ps(_mm256_max_ps(d, _mm256_setzero_ps()), _mm256_set1_ps(w[h])));
  }
  _mm256_storeu_ps(scores, acc);
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
  int32_t qsum[kMaxBlocks];
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t b = 0; b < nb; ++b) {
      qi[h * nb + b] = fp4_block_to_i8(q + h * row + 16 * b);
      qs[h * nb + b] = e8m0_scalar(q[h * row + di / 2 + b]);
      alignas(32) int8_t qb[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(qb), qi[h * nb + b]);
      qsum[h * nb + b] = 0;
      for (int8_t v : qb) qsum[h * nb + b] += v;
    }
  int64_t j0 = 0;
  if (nb <= 4) {  // the model's shape (128 dims): eight keys per pass, across vector lanes
    j0 = nkeys / 8 * 8;
    for (int64_t j = 0; j < j0; j += 8)
      indexer_scores_8keys(qi, qs, qsum, w, nh, nb, keys + j * row, row, di, scores + j);
  }
  __m256i ki[8];
  float ks[8];
  for (int64_t j = j0; j < nkeys; ++j) {
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

template <typename S>
float read_sum_impl(const float* x, int64_t n) {
  return S::sum(x, n);
}

}  // namespace
}  // namespace dsv41::ops
