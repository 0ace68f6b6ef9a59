// The avx512_bf16 tier's FP8 GEMM for fp32 activations (Kernels::f32_fp8_gemm): the FP8
// block-scaled weights decoded as for the act-quant GEMMs (avx512_bf16_gemm.h: E4M3 -> bf16 with
// the block scale in the exponent, exact), widened to fp32 (exact), and multiplied with fp32
// activations by FMAs. An FMA rounds only its sum (the product of an fp32 activation and a
// scaled E4M3 weight is formed exactly), so every product is exact and the only rounding is the
// fp32 sums, in one fixed order per output element:
//   acc = 0; for each 64-value chunk c of the (permuted, zero-padded) row, in order:
//     acc = fma(W[o, c, A], X[t, c, A], acc); then B, C, D      (16 lanes each)
//   y[t, o] = the fixed horizontal sum of acc's 16 lanes (aq_hsum's tree).
// The same for every M, tile and path (weights straight from memory for up to 6 tokens; a fp32
// panel for more), so a token gets the same bits alone or among 499 others. This replaces the
// three exact bf16 terms of aq_pack_act_split3 (three vdpbf16ps passes, each 32 products) with
// one pass of two FMAs per 32 products: 1.5x fewer multiply instructions where the activations
// are not E4M3. The engine uses it for every FP8 linear with act-quant off and for wo_a's input
// with act-quant on. The panel driver (f32_panel_gemm) serves the MXFP4 GEMM too
// (avx512_mxfp4_f32_gemm.h).
//
// Lanes: the FP8 decoder gives per 128-bit lane L the words of k = 16L + 0..7 (w0) and
// 16L + 8..15 (w1); widening the low and high four words of each lane gives A: 16L + 0..3,
// B: 16L + 4..7, C: 16L + 8..11, D: 16L + 12..15 (lane 4L + j). f32_pack_act lays the
// activations out in that order. Included by the avx512_bf16 tier's translation unit after
// avx512_bf16_gemm.h (its decoder, tiles' sums and constants).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "ops/avx512/avx512_bf16_gemm.h"

namespace dsv41::ops {
namespace {

// Activation words (floats) per packed row: whole 64-value chunks.
inline int64_t f32_fp8_act_stride(int64_t in) {
  return (in + 63) / 64 * 64;
}

// The element of a 64-chunk that packed position p holds (register p / 16, lane p % 16).
inline int64_t f32_element_of(int64_t p) {
  const int64_t reg = p / 16, lane = p % 16;
  return 16 * (lane / 4) + 4 * reg + lane % 4;
}

// x [ntok, in] -> packed rows of f32_fp8_act_stride(in) floats, zero-padded.
inline void f32_fp8_pack_act(const float* x, int64_t ntok, int64_t in, float* xp) {
  const int64_t st = f32_fp8_act_stride(in);
  // One 64-chunk's gather: lane 4L + j of register r reads element 16L + 4r + j.
  const __m512i idx0 =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51);
  for (int64_t t = 0; t < ntok; ++t) {
    const float* xt = x + t * in;
    float* pt = xp + t * st;
    int64_t c = 0;
    for (; c + 64 <= in; c += 64)
      for (int r = 0; r < 4; ++r)
        _mm512_storeu_ps(
            pt + c + 16 * r,
            _mm512_i32gather_ps(_mm512_add_epi32(idx0, _mm512_set1_epi32(4 * r)), xt + c, 4));
    for (; c < st; c += 64)  // the last partial chunk, element by element
      for (int64_t p = 0; p < 64; ++p) {
        const int64_t k = c + f32_element_of(p);
        pt[c + p] = k < in ? xt[k] : 0.0f;
      }
  }
}

// bf16 words w0, w1 (the FP8 decoder's) -> the four fp32 registers A..D.
inline void f32_widen(__m512i w0, __m512i w1, __m512 (&w)[4]) {
  const __m512i z = _mm512_setzero_si512();
  w[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w0));
  w[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w0));
  w[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w1));
  w[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w1));
}

inline __m512 f32_dots(__m512 acc, const __m512 (&w)[4], const float* x) {
  acc = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x), acc);
  acc = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + 16), acc);
  acc = _mm512_fmadd_ps(w[2], _mm512_loadu_ps(x + 32), acc);
  return _mm512_fmadd_ps(w[3], _mm512_loadu_ps(x + 48), acc);
}

// Straight from memory: R rows (one scale group) x NT tokens; each step decodes 64 bytes a row
// and runs the NT tokens' four FMAs on them. Up to two tokens their activations are preloaded in
// registers for the step; more load them from L1 where they are used (the same sequence).
template <int R, int NT>
inline void f32_direct_tile(const AqDecoder& dec, const uint8_t* w, int64_t in, const uint8_t* srow,
                            const float* xp, int64_t xst, float* y, int64_t ldy) {
  constexpr bool kPreload = NT <= 2;
  const int64_t st = f32_fp8_act_stride(in), nblocks = (in + 31) / 32;
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < st; c += 64) {
    const __m512i add = aq_scale_add(srow, nblocks, c / 64);
    __m512 xv[kPreload ? NT : 1][4];
    if constexpr (kPreload)
      for (int t = 0; t < NT; ++t)
        for (int z = 0; z < 4; ++z) xv[t][z] = _mm512_loadu_ps(xp + t * xst + c + 16 * z);
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w + r * in;
      _mm_prefetch(reinterpret_cast<const char*>(row + c + kAqPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + c + R * in), _MM_HINT_T1);  // next tile
      __m512i w0, w1;
      dec.decode(aq_load_bytes(row + c, in - c), add, w0, w1);
      __m512 wv[4];
      f32_widen(w0, w1, wv);
      for (int t = 0; t < NT; ++t) {
        if constexpr (kPreload) {
          acc[r][t] = _mm512_fmadd_ps(wv[0], xv[t][0], acc[r][t]);
          acc[r][t] = _mm512_fmadd_ps(wv[1], xv[t][1], acc[r][t]);
          acc[r][t] = _mm512_fmadd_ps(wv[2], xv[t][2], acc[r][t]);
          acc[r][t] = _mm512_fmadd_ps(wv[3], xv[t][3], acc[r][t]);
        } else {
          acc[r][t] = f32_dots(acc[r][t], wv, xp + t * xst + c);
        }
      }
    }
  }
  aq_store_sums<R, NT>(acc, y, ldy);
}

// R rows decoded into a fp32 panel (R x st floats, the packed order, scales folded in).
template <int R>
inline void f32_decode_panel(const AqDecoder& dec, const uint8_t* w, int64_t in,
                             const uint8_t* srow, float* panel) {
  const int64_t st = f32_fp8_act_stride(in), nblocks = (in + 31) / 32;
  for (int64_t c = 0; c < st; c += 64) {
    const __m512i add = aq_scale_add(srow, nblocks, c / 64);
    for (int r = 0; r < R; ++r) {
      __m512i w0, w1;
      _mm_prefetch(reinterpret_cast<const char*>(w + r * in + c + kAqPrefetch), _MM_HINT_T0);
      dec.decode(aq_load_bytes(w + r * in + c, in - c), add, w0, w1);
      __m512 wv[4];
      f32_widen(w0, w1, wv);
      for (int z = 0; z < 4; ++z) _mm512_store_ps(panel + r * st + c + 16 * z, wv[z]);
    }
  }
}

// The panel's R rows x NT tokens over the whole K: the dot sequence of f32_direct_tile, 16 values
// (one register of each row and token) per step.
template <int R, int NT>
inline void f32_panel_tile(const float* panel, int64_t st, const float* xp, int64_t xst, float* y,
                           int64_t ldy) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < st; c += 16) {
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(xp + t * xst + c);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = _mm512_load_ps(panel + r * st + c);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  aq_store_sums<R, NT>(acc, y, ldy);
}

// Rows [0, nrows) of the panel (4-row tiles, then single rows) for the NT tokens at xp.
template <int NT>
inline void f32_panel_rows(const float* panel, int64_t st, int64_t nrows, const float* xp, float* y,
                           int64_t ldy) {
  int64_t r = 0;
  for (; r + kAqPanelRows <= nrows; r += kAqPanelRows)
    f32_panel_tile<kAqPanelRows, NT>(panel + r * st, st, xp, st, y + r, ldy);
  for (; r < nrows; ++r) f32_panel_tile<1, NT>(panel + r * st, st, xp, st, y + r, ldy);
}

// A thread's fp32 panel, grown once (as aq_panel_scratch).
inline float* f32_panel_scratch(int64_t floats) {
  static thread_local std::unique_ptr<float[]> buf;
  static thread_local std::size_t cap = 0;
  const std::size_t need = std::size_t(floats + 16);
  if (cap < need) buf.reset(new float[need]), cap = need;
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.get()) + 63) & ~uintptr_t(63));
}

// Up to this many tokens the weights are decoded per pass over them (8-, 4- and 2-row tiles at
// 1, 2 and 3-6 tokens); more go through the panel: groups of kF32GroupRows rows decoded once per
// token block (the block's activations at most 2 MB, aq_token_block's bytes: streamed from
// L2/L3), then 6-token x 4-row tiles over the whole K (rows of any length: the tile keeps its 24
// accumulators in registers). A 4-row decode reads one FP8 scale row: groups never straddle one.
constexpr int64_t kF32DirectMaxTokens = 6;
constexpr int64_t kF32GroupRows = 16;
static_assert(32 % kF32GroupRows == 0 && kF32GroupRows % kAqPanelRows == 0);

// The panel path of every fp32-activation GEMM: per token block (its activations at most 2 MB),
// groups of kF32GroupRows rows decoded into the thread's fp32 panel by `decode` (decode<R>(o,
// panel) writes rows o .. o + R - 1 at panel, panel + st, ...; R is kAqPanelRows or 1), then
// 6-token x 4-row tiles over the whole K.
template <class Decode>
inline void f32_panel_gemm(int64_t out, int64_t st, const float* xp, int64_t ntok, float* y,
                           int64_t ldy, const Decode& decode) {
  float* panel = f32_panel_scratch(kF32GroupRows * st);
  const int64_t most = aq_token_block(2 * st, ntok);  // a float is two bf16 words' bytes
  for (int64_t t0 = 0; t0 < ntok; t0 += most) {
    const int64_t nt = std::min(most, ntok - t0);
    for (int64_t o0 = 0; o0 < out; o0 += kF32GroupRows) {
      const int64_t nrows = std::min(kF32GroupRows, out - o0);
      int64_t r = 0;
      for (; r + kAqPanelRows <= nrows; r += kAqPanelRows)
        decode.template operator()<kAqPanelRows>(o0 + r, panel + r * st);
      for (; r < nrows; ++r) decode.template operator()<1>(o0 + r, panel + r * st);
      for (int64_t t = 0; t < nt; t += kAqPanelTokens) {
        const float* xt = xp + (t0 + t) * st;
        float* yt = y + (t0 + t) * ldy + o0;
        switch (std::min<int64_t>(kAqPanelTokens, nt - t)) {
          case 6:
            f32_panel_rows<6>(panel, st, nrows, xt, yt, ldy);
            break;
          case 5:
            f32_panel_rows<5>(panel, st, nrows, xt, yt, ldy);
            break;
          case 4:
            f32_panel_rows<4>(panel, st, nrows, xt, yt, ldy);
            break;
          case 3:
            f32_panel_rows<3>(panel, st, nrows, xt, yt, ldy);
            break;
          case 2:
            f32_panel_rows<2>(panel, st, nrows, xt, yt, ldy);
            break;
          default:
            f32_panel_rows<1>(panel, st, nrows, xt, yt, ldy);
            break;
        }
      }
    }
  }
}

// Kernels::f32_fp8_gemm: y[t * ldy + o] = sum_k W[o, k] x[t, k], x packed by f32_pack_act.
inline void f32_fp8_gemm_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                              const float* xp, int64_t ntok, float* y, int64_t ldy) {
  const AqDecoder dec;
  const int64_t st = f32_fp8_act_stride(in), sin = (in + 31) / 32;
  if (ntok <= kF32DirectMaxTokens) {
    auto groups = [&]<int NT>() {
      constexpr int R = NT == 1 ? 8 : NT == 2 ? 4 : 2;  // 8 x 1: as fast as split3 at one token
      for (int64_t o0 = 0; o0 < out; o0 += 32) {
        const int64_t nrows = std::min<int64_t>(out, o0 + 32) - o0;
        const uint8_t* srow = scale + (o0 / 32) * sin;
        int64_t r = 0;
        for (; r + R <= nrows; r += R)
          f32_direct_tile<R, NT>(dec, w + (o0 + r) * in, in, srow, xp, st, y + o0 + r, ldy);
        for (; r < nrows; ++r)
          f32_direct_tile<1, NT>(dec, w + (o0 + r) * in, in, srow, xp, st, y + o0 + r, ldy);
      }
    };
    switch (ntok) {
      case 1:
        return groups.template operator()<1>();
      case 2:
        return groups.template operator()<2>();
      case 3:
        return groups.template operator()<3>();
      case 4:
        return groups.template operator()<4>();
      case 5:
        return groups.template operator()<5>();
      case 6:
        return groups.template operator()<6>();
      default:  // no tokens
        return;
    }
  }
  f32_panel_gemm(out, st, xp, ntok, y, ldy, [&]<int R>(int64_t o, float* panel) {
    f32_decode_panel<R>(dec, w + o * in, in, scale + (o / 32) * sin, panel);
  });
}

}  // namespace
}  // namespace dsv41::ops
