// The AVX2 tier's GEMMs for fp32 activations (Kernels::f32_act_stride, f32_pack_act,
// f32_fp8_gemm, f32_mxfp4_gemm, f32_mxfp4_gate_up): the batch-invariant GEMM family of this tier,
// for both act-quant modes (act-quant values are fp32 values too). FP8 or MXFP4 weights are
// decoded to fp32 with their block scale folded in (exact: a power of two within the scales
// conditions fp8_aq_scales_ok / mxfp4_aq_scales_ok), and each product with an fp32 activation is
// formed exactly inside an FMA, so the only rounding is the fp32 sums, in one fixed order per
// output element whatever the number of tokens is:
//   acc = 0 (8 lanes); for each 8-value group g of the packed row, in order: acc = fma(W[g], X[g],
//   acc); y = hsum256(acc)
// The same sequence in every tile and path (weights straight from memory for up to 6 tokens; an
// fp32 panel of 16 rows, 4-row x 3-token tiles over the whole K, beyond), so a token gets the same
// bits alone or among 499 others.
//
// Decoders, one 32-block (one scale) at a time: FP8 through fp16 (e4m3x32_f16: elements in order,
// times 2^-8), times the scale factor 2^(s - 119); MXFP4 16 bytes: the low and high nibbles side
// by side in one register, two vpshufb look up the bytes of each code's bf16 word, a saturating
// subtract puts the block scale in, unpacks with zero widen the words to floats (a2_fp4_decode:
// measured 1.4x the rate of fp16 words and vcvtph2ps times the scale, two threads, one token).
// The MXFP4 packed order per 8-value group g is elements g + 0, 2, 4, 6, 1, 3, 5, 7; FP8 rows are
// packed in their own order.
// Included by the AVX2 tier's translation unit (kernels_avx2.cpp) after ops/simd_table.h.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/check.h"

#include "ops/fp4_bf16_lut.h"
#include "ops/gate_up_pairs.h"
#include "ops/kernels.h"
#include "ops/simd_common.h"

namespace dsv41::ops {
namespace {

constexpr int64_t kA2Prefetch = 1024;  // bytes ahead in each row's stream
constexpr int64_t kA2GroupRows = 16;   // panel rows decoded at a time (inside one FP8 scale row)
constexpr int kA2PanelRows = 4, kA2PanelTokens = 3;  // panel tile: 12 accumulators of 16 registers
// A token block's activations: up to 2 MB, so a call of a few hundred tokens decodes its weights
// once per block (the block streams from L3 once per row group; the group's panel stays in L2).
constexpr int64_t kA2XBlockFloats = 512 * 1024;

inline int64_t a2_stride(int64_t in) {
  return (in + 31) / 32 * 32;
}
inline int64_t a2_act_stride(int64_t in, AqFormat) {
  return a2_stride(in);
}

// x [ntok, in] -> packed rows (FP8: the row itself; MXFP4: the decoder's order per 32-block),
// zero-padded to whole 32-blocks.
inline void a2_pack_act(const float* x, int64_t ntok, int64_t in, AqFormat fmt, float* xp) {
  const int64_t st = a2_stride(in);
  for (int64_t t = 0; t < ntok; ++t) {
    const float* xt = x + t * in;
    float* pt = xp + t * st;
    if (fmt == AqFormat::kFp8) {
      std::memcpy(pt, xt, sizeof(float) * std::size_t(in));
      std::fill(pt + in, pt + st, 0.0f);
      continue;
    }
    for (int64_t g = 0; g < st; g += 8)  // group g: elements g + 0, 2, 4, 6, 1, 3, 5, 7
      for (int64_t i = 0; i < 8; ++i) {
        const int64_t k = g + (i < 4 ? 2 * i : 2 * (i - 4) + 1);
        pt[g + i] = k < in ? xt[k] : 0.0f;
      }
  }
}

// 32 weight bytes of an FP8 row at p (the first `valid` real; the rest read as zero) -> w[0..4),
// elements in order, times 2^-8 (the fp16 decode's factor; a2_fp8_scale undoes it).
inline void a2_fp8_bytes(const uint8_t* p, int64_t valid, __m256 (&w)[4]) {
  alignas(32) uint8_t tail[32];
  if (valid < 32) {
    std::memset(tail, 0, sizeof(tail));
    std::memcpy(tail, p, std::size_t(std::max<int64_t>(valid, 0)));
    p = tail;
  }
  e4m3x32_f16(p, w);
}
// The same times the block scale factor sv.
inline void a2_fp8_decode(const uint8_t* p, int64_t valid, __m256 sv, __m256 (&w)[4]) {
  a2_fp8_bytes(p, valid, w);
  for (auto& v : w) v = _mm256_mul_ps(v, sv);
}
// An FP8 block scale's factor: 2^(s - 127) times 2^8 (the fp16 decode's 2^-8); s <= 246.
inline __m256 a2_fp8_scale(uint8_t s) {
  return _mm256_castsi256_ps(_mm256_set1_epi32(int((uint32_t(s) + 8) << 23)));
}

// (The MXFP4 decoder's tables and bias: ops/fp4_bf16_lut.h, the act-quant decoder's.)

// One MXFP4 32-block (16 bytes at p) times 2^(s - 127) -> w[0..4) in the packed order: the low
// nibbles (even elements) in the first 128-bit lane of the codes, the high nibbles (odd ones) in
// the second; the byte unpacks make words e0 e2 .. e14 | e1 e3 .. e15 and e16 .. e30 | e17 ..
// e31, the 16-bit unpacks with zero the floats, group g = elements 8g + 0, 2, 4, 6, 1, 3, 5, 7.
inline void a2_fp4_decode(const uint8_t* p, uint8_t s, __m256 (&w)[4]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m256i codes =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), nib), _mm_and_si128(b, nib));
  const __m256i th =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kAq4Lut.hi)));
  const __m256i tl =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kAq4Lut.lo)));
  const __m256i hb = _mm256_shuffle_epi8(th, codes), lb = _mm256_shuffle_epi8(tl, codes);
  const __m256i sub = _mm256_set1_epi16(static_cast<short>((kAq4Bias + 127 - int(s)) << 7));
  const __m256i w0 = _mm256_subs_epu16(_mm256_unpacklo_epi8(lb, hb), sub);
  const __m256i w1 = _mm256_subs_epu16(_mm256_unpackhi_epi8(lb, hb), sub);
  const __m256i z = _mm256_setzero_si256();
  w[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w0));
  w[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w0));
  w[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, w1));
  w[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, w1));
}

// The four FMAs of one block for one (row, token).
inline __m256 a2_dots(__m256 acc, const __m256 (&w)[4], const float* x) {
  acc = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc);
  acc = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc);
  acc = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc);
  return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc);
}

template <int R, int NT>
inline void a2_store_sums(const __m256 (&acc)[R][NT], float* y, int64_t ldy) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) y[t * ldy + r] = hsum256(acc[r][t]);
}

// The weight formats: group_scale(o, b), the scale factor block b of row o's 32-row group shares
// (FP8; MXFP4 scales are per row), and decode(row, b, group scale, w): block b of a row.
struct A2Fp8 {
  static constexpr int64_t kBlockBytes = 32;
  const uint8_t *w, *scale;
  int64_t in, sin;
  int64_t row_bytes() const { return in; }
  __m256 group_scale(int64_t o, int64_t b) const { return a2_fp8_scale(scale[(o / 32) * sin + b]); }
  void decode(int64_t row, int64_t b, __m256 gsv, __m256 (&wv)[4]) const {
    a2_fp8_decode(w + row * in + 32 * b, in - 32 * b, gsv, wv);
  }
};
struct A2Fp4 {
  static constexpr int64_t kBlockBytes = 16;
  const uint8_t *w, *scale;
  int64_t in, sin;
  int64_t row_bytes() const { return in / 2; }
  __m256 group_scale(int64_t, int64_t) const { return _mm256_setzero_ps(); }
  void decode(int64_t row, int64_t b, __m256, __m256 (&wv)[4]) const {
    a2_fp4_decode(w + row * (in / 2) + 16 * b, scale[row * sin + b], wv);
  }
};

// FP8 rows against a token already scaled by each block's factor (a2_fp8_one_token): decode only.
struct A2Fp8Prescaled {
  static constexpr int64_t kBlockBytes = 32;
  const uint8_t* w;
  int64_t in;
  int64_t row_bytes() const { return in; }
  __m256 group_scale(int64_t, int64_t) const { return _mm256_setzero_ps(); }
  void decode(int64_t row, int64_t b, __m256, __m256 (&wv)[4]) const {
    a2_fp8_bytes(w + row * in + 32 * b, in - 32 * b, wv);
  }
};

// Straight from memory: rows o .. o + R - 1 (inside one 32-row group) x NT tokens, block by
// block, each row decoded and used before the next (16 registers).
template <int R, int NT, class F>
inline void a2_direct_tile(const F& f, int64_t o, const float* xp, int64_t xst, float* y,
                           int64_t ldy) {
  constexpr int64_t kPerLine = 64 / F::kBlockBytes;
  const int64_t nblocks = (f.in + 31) / 32, rb = f.row_bytes();
  __m256 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* base = f.w + o * rb;
  for (int64_t b = 0; b < nblocks; ++b) {
    if (b % kPerLine == 0)
      for (int r = 0; r < R; ++r) {
        const char* line = reinterpret_cast<const char*>(base + r * rb + b * F::kBlockBytes);
        _mm_prefetch(line + kA2Prefetch, _MM_HINT_T0);
        _mm_prefetch(line + R * rb, _MM_HINT_T1);  // the same line of the next tile
      }
    const __m256 gsv = f.group_scale(o, b);
    for (int r = 0; r < R; ++r) {
      __m256 wv[4];
      f.decode(o + r, b, gsv, wv);
      for (int t = 0; t < NT; ++t) acc[r][t] = a2_dots(acc[r][t], wv, xp + t * xst + 32 * b);
    }
  }
  a2_store_sums<R, NT>(acc, y, ldy);
}

template <int NT, class F>
inline void a2_direct_rows(const F& f, int64_t out, const float* xp, int64_t xst, float* y,
                           int64_t ldy) {
  constexpr int R = NT == 1 ? 4 : NT == 2 ? 2 : 1;  // 16 registers: R x NT accumulators + decode
  for (int64_t o0 = 0; o0 < out; o0 += 32) {        // tiles inside a 32-row group (FP8 scales)
    const int64_t o1 = std::min<int64_t>(out, o0 + 32);
    int64_t o = o0;
    for (; o + R <= o1; o += R) a2_direct_tile<R, NT>(f, o, xp, xst, y + o, ldy);
    for (; o < o1; ++o) a2_direct_tile<1, NT>(f, o, xp, xst, y + o, ldy);
  }
}

// The panel's R rows x NT tokens over the whole K: the direct tiles' sequence, one 8-value group
// of each row and token per step.
template <int R, int NT>
inline void a2_panel_tile(const float* panel, int64_t st, const float* xp, int64_t xst, float* y,
                          int64_t ldy) {
  __m256 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t c = 0; c < st; c += 8) {
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(xp + t * xst + c);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_load_ps(panel + r * st + c);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  a2_store_sums<R, NT>(acc, y, ldy);
}

template <int NT>
inline void a2_panel_rows(const float* panel, int64_t st, int64_t nrows, const float* xp, float* y,
                          int64_t ldy) {
  int64_t r = 0;
  for (; r + kA2PanelRows <= nrows; r += kA2PanelRows)
    a2_panel_tile<kA2PanelRows, NT>(panel + r * st, st, xp, st, y + r, ldy);
  for (; r < nrows; ++r) a2_panel_tile<1, NT>(panel + r * st, st, xp, st, y + r, ldy);
}

// A thread's fp32 panel, grown once.
inline float* a2_panel_scratch(int64_t floats) {
  static thread_local std::unique_ptr<float[]> buf;
  static thread_local std::size_t cap = 0;
  const std::size_t need = std::size_t(floats + 8);
  if (cap < need) buf.reset(new float[need]), cap = need;
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.get()) + 31) & ~uintptr_t(31));
}

template <class F>
inline void a2_panel_gemm(const F& f, int64_t out, const float* xp, int64_t ntok, float* y,
                          int64_t ldy) {
  const int64_t st = a2_stride(f.in), nblocks = st / 32;
  float* panel = a2_panel_scratch(kA2GroupRows * st);
  const int64_t most =
      std::max<int64_t>(kA2PanelTokens, kA2XBlockFloats / st / kA2PanelTokens * kA2PanelTokens);
  const int64_t nb = (ntok + most - 1) / most;
  const int64_t tb =
      std::min(most, ((ntok + nb - 1) / nb + kA2PanelTokens - 1) / kA2PanelTokens * kA2PanelTokens);
  for (int64_t t0 = 0; t0 < ntok; t0 += tb) {
    const int64_t nt = std::min(tb, ntok - t0);
    for (int64_t o0 = 0; o0 < out; o0 += kA2GroupRows) {
      const int64_t nrows = std::min(kA2GroupRows, out - o0);
      for (int64_t b = 0; b < nblocks; ++b) {  // the group's rows share FP8 scale rows
        const __m256 gsv = f.group_scale(o0, b);
        for (int64_t r = 0; r < nrows; ++r) {
          if (b % (64 / F::kBlockBytes) == 0)
            _mm_prefetch(reinterpret_cast<const char*>(f.w + (o0 + r) * f.row_bytes() +
                                                       b * F::kBlockBytes + kA2Prefetch),
                         _MM_HINT_T0);
          __m256 wv[4];
          f.decode(o0 + r, b, gsv, wv);
          for (int z = 0; z < 4; ++z) _mm256_store_ps(panel + r * st + 32 * b + 8 * z, wv[z]);
        }
      }
      for (int64_t t = 0; t < nt; t += kA2PanelTokens) {
        const float* xt = xp + (t0 + t) * st;
        float* yt = y + (t0 + t) * ldy + o0;
        const int64_t n = std::min<int64_t>(kA2PanelTokens, nt - t);
        if (n == 3)
          a2_panel_rows<3>(panel, st, nrows, xt, yt, ldy);
        else if (n == 2)
          a2_panel_rows<2>(panel, st, nrows, xt, yt, ldy);
        else
          a2_panel_rows<1>(panel, st, nrows, xt, yt, ldy);
      }
    }
  }
}

// One token, FP8: the 32 rows of a scale group share each block's scale, so the token's values are
// scaled once per group, xs = x * 2^(s_b - 119), and each row block is decode + FMA with no
// multiply (the direct tile's four per block). When every scaled value is a normal float or zero,
// xs is exact and w_dec * xs is the same real number as (w_dec * factor) * x: the same exact
// product in the same FMA, so the same bits as the direct tile and the panel. A group where some
// value would leave the normal range (or is not finite) takes the direct tile. Measured (avx2 tier
// forced on a Zen 4, two threads, 4,096 x 4,096 matrices from DRAM, alternated with the GEMV-shaped
// fp8_gemv): 0.85x its rate with the direct tile, 0.87-0.93x with this and prefetches 1,024 bytes
// ahead (was 512).
constexpr int64_t kA2ScaledMax = 16384;  // longer rows take the direct tile

inline bool a2_fp8_prescale(const uint8_t* srow, int64_t st, const float* xp, float* xs) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(0x1p-126f), hi = _mm256_set1_ps(0x1.fffffep127f);
  __m256 bad = _mm256_setzero_ps();
  for (int64_t b = 0; b < st / 32; ++b) {
    const __m256 sv = a2_fp8_scale(srow[b]);
    for (int64_t i = 32 * b; i < 32 * b + 32; i += 8) {
      const __m256 xv = _mm256_loadu_ps(xp + i);
      const __m256 p = _mm256_mul_ps(xv, sv), ap = _mm256_and_ps(p, abs_mask);
      // bad: a nonzero value scaled below the normal range, or past it (inf, NaN: unordered).
      // At 2^-126 itself too: a value just below it can round up to it (2^-126 - 2^-150 is a tie
      // on the subnormal grid), and an exact 2^-126 taking the direct tile costs nothing.
      const __m256 under = _mm256_andnot_ps(_mm256_cmp_ps(xv, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                            _mm256_cmp_ps(ap, lo, _CMP_LE_OQ));
      bad = _mm256_or_ps(bad, _mm256_or_ps(under, _mm256_cmp_ps(ap, hi, _CMP_NLE_UQ)));
      _mm256_storeu_ps(xs + i, p);
    }
  }
  return _mm256_movemask_ps(bad) == 0;
}

inline void a2_fp8_one_token(const A2Fp8& f, int64_t out, const float* xp, float* y) {
  const int64_t st = a2_stride(f.in);
  if (st > kA2ScaledMax) return a2_direct_rows<1>(f, out, xp, st, y, 1);
  alignas(32) float xs[kA2ScaledMax];
  for (int64_t o0 = 0; o0 < out; o0 += 32) {  // one scale group: the direct tiles, either format
    const int64_t rows = std::min<int64_t>(32, out - o0);
    const uint8_t *w = f.w + o0 * f.in, *srow = f.scale + (o0 / 32) * f.sin;
    if (a2_fp8_prescale(srow, st, xp, xs))
      a2_direct_rows<1>(A2Fp8Prescaled{w, f.in}, rows, xs, st, y + o0, 1);
    else
      a2_direct_rows<1>(A2Fp8{w, srow, f.in, f.sin}, rows, xp, st, y + o0, 1);
  }
}

template <class F>
inline void a2_gemm(const F& f, int64_t out, const float* xp, int64_t ntok, float* y, int64_t ldy) {
  const int64_t st = a2_stride(f.in);
  switch (ntok) {
    case 0:
      return;
    case 1:
      return a2_direct_rows<1>(f, out, xp, st, y, ldy);
    case 2:
      return a2_direct_rows<2>(f, out, xp, st, y, ldy);
    case 3:
      return a2_direct_rows<3>(f, out, xp, st, y, ldy);
    case 4:
      return a2_direct_rows<4>(f, out, xp, st, y, ldy);
    case 5:
      return a2_direct_rows<5>(f, out, xp, st, y, ldy);
    case 6:
      return a2_direct_rows<6>(f, out, xp, st, y, ldy);
    default:
      return a2_panel_gemm(f, out, xp, ntok, y, ldy);
  }
}

// Kernels::f32_fp8_gemm / f32_mxfp4_gemm / f32_mxfp4_gate_up of this tier.
inline void a2_fp8_gemm(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                        const float* xp, int64_t ntok, float* y, int64_t ldy) {
  const A2Fp8 f{w, scale, in, (in + 31) / 32};
  if (ntok == 1) return a2_fp8_one_token(f, out, xp, y);
  a2_gemm(f, out, xp, ntok, y, ldy);
}
inline void a2_mxfp4_gemm(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                          const float* xp, int64_t ntok, float* y, int64_t ldy) {
  DSV41_CHECK_MSG(in % 32 == 0, "MXFP4 rows hold whole 32-blocks");
  a2_gemm(A2Fp4{w, scale, in, in / 32}, out, xp, ntok, y, ldy);
}

// Gate and up rows through a2_mxfp4_gemm, then the shared epilogue (ops/gate_up_pairs.h).
inline void a2_mxfp4_gate_up(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                             const float* xp, const float* route, int64_t ntok, float limit,
                             float* h, int64_t ldh) {
  gate_up_by_pairs(inter, route, ntok, limit, h, ldh, [&](int64_t j0, int64_t jn, float* gu) {
    a2_mxfp4_gemm(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, xp, ntok, gu,
                  2 * jn);
  });
}

}  // namespace
}  // namespace dsv41::ops
