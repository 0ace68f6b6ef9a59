// The avx512_bf16 tier's MXFP4 GEMMs for fp32 activations (Kernels::f32_mxfp4_gemm,
// f32_mxfp4_gate_up) and the fp32 activation packing of both weight formats (f32_act_stride,
// f32_pack_act). The act-quant-off experts' kernels: any fp32 activations, every product exact,
// the fp32 sums in one fixed order per output element whatever the number of tokens is.
//
// Decode, one 32-block (16 bytes of a row) at a time: the bytes widened to 32-bit lanes
// (vpmovzxbd), then vpermps looks each nibble up in the 16-entry table of E2M1 values already
// multiplied by the block's scale 2^(s - 127) (exact: a power of two, and mxfp4_aq_scales_ok's
// range keeps every scaled value a normal float): the low nibbles (vpermps reads only the low
// four bits of each index) give the block's even elements, the nibbles shifted down by four its
// odd ones. An FMA forms each product of a scaled E2M1 weight (2 significant bits) and an fp32
// activation exactly and rounds only the sum, so per (row, token):
//   acc = 0; for each 32-block b in order: acc = fma(W_even(b), X_even(b), acc);
//                                          acc = fma(W_odd(b), X_odd(b), acc)   (16 lanes)
//   y = aq_hsum(acc)
// for every M, tile and path (straight from memory up to 6 tokens, the fp32 panel beyond,
// avx512_fp8_f32_gemm.h's panel tiles), so a token's bits do not depend on its companions.
// f32_pack_act lays each 32-block of an MXFP4 activation row out as its 16 even elements, then
// its 16 odd ones. Included by the avx512_bf16 tier's translation unit after
// avx512_fp8_f32_gemm.h.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include "core/check.h"

#include "ops/avx512/avx512_fp8_f32_gemm.h"

namespace dsv41::ops {
namespace {

// E2M1 codes (bit 3 the sign) as floats.
alignas(64) constexpr float kE2m1Table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                              4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                              -2.0f, -3.0f, -4.0f, -6.0f};

// Packed floats per MXFP4 activation row: the row itself (MXFP4 rows are whole 32-blocks).
inline int64_t f32_mx_act_stride(int64_t in) {
  return (in + 31) / 32 * 32;
}

// x [ntok, in] -> per 32-block the even elements, then the odd ones.
inline void f32_mx_pack_act(const float* x, int64_t ntok, int64_t in, float* xp) {
  const int64_t st = f32_mx_act_stride(in);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < ntok; ++t) {
    const float* xt = x + t * in;
    float* pt = xp + t * st;
    int64_t b = 0;
    for (; b + 32 <= in; b += 32) {
      const __m512 a = _mm512_loadu_ps(xt + b), c = _mm512_loadu_ps(xt + b + 16);
      _mm512_storeu_ps(pt + b, _mm512_permutex2var_ps(a, even, c));
      _mm512_storeu_ps(pt + b + 16, _mm512_permutex2var_ps(a, odd, c));
    }
    for (; b < st; b += 32)  // a partial block (not an MXFP4 width; kept total), zero-padded
      for (int64_t j = 0; j < 16; ++j) {
        pt[b + j] = b + 2 * j < in ? xt[b + 2 * j] : 0.0f;
        pt[b + 16 + j] = b + 2 * j + 1 < in ? xt[b + 2 * j + 1] : 0.0f;
      }
  }
}

// Kernels::f32_act_stride / f32_pack_act: the layout of the weight format's GEMM.
inline int64_t f32_act_stride_impl(int64_t in, AqFormat fmt) {
  return fmt == AqFormat::kFp8 ? f32_fp8_act_stride(in) : f32_mx_act_stride(in);
}
inline void f32_pack_act_impl(const float* x, int64_t ntok, int64_t in, AqFormat fmt, float* xp) {
  if (fmt == AqFormat::kFp8)
    f32_fp8_pack_act(x, ntok, in, xp);
  else
    f32_mx_pack_act(x, ntok, in, xp);
}

// Block b of a row: its 32 weights times 2^(s - 127) as the even (lo) and odd (hi) registers.
struct F32Fp4Decoder {
  __m512 table = _mm512_load_ps(kE2m1Table);
  void decode(const uint8_t* bytes, uint8_t s, __m512& lo, __m512& hi) const {
    const __m512 tab =
        _mm512_mul_ps(table, _mm512_castsi512_ps(_mm512_set1_epi32(int(uint32_t(s) << 23))));
    const __m512i b =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
    lo = _mm512_permutexvar_ps(b, tab);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), tab);
  }
};

// One block b of R rows x NT tokens: the two FMAs of each (row, token), in the row's order. Up to
// two tokens their activations are loaded once for all the rows; more load them where they are
// used (from L1).
template <int R, int NT>
inline void f32_mx_block(const F32Fp4Decoder& dec, const uint8_t* w, int64_t rb,
                         const uint8_t* scale, int64_t nblocks, int64_t b, const float* xp,
                         int64_t xst, __m512 (&acc)[R][NT]) {
  __m512 xv[NT <= 2 ? NT : 1][2];
  if constexpr (NT <= 2)
    for (int t = 0; t < NT; ++t)
      xv[t][0] = _mm512_loadu_ps(xp + t * xst + 32 * b),
      xv[t][1] = _mm512_loadu_ps(xp + t * xst + 32 * b + 16);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m512 lo, hi;
    dec.decode(w + r * rb + 16 * b, scale[r * nblocks + b], lo, hi);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      if constexpr (NT <= 2) {
        acc[r][t] = _mm512_fmadd_ps(hi, xv[t][1], _mm512_fmadd_ps(lo, xv[t][0], acc[r][t]));
      } else {
        const float* x = xp + t * xst + 32 * b;
        acc[r][t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16),
                                    _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), acc[r][t]));
      }
    }
  }
}

// Straight from memory: R rows x NT tokens, four blocks (a 64-byte line of each row) per step,
// with the prefetches of the lines ahead (kAqPrefetch in each row, and the same line of the next
// tile), then the last blocks one by one: the same sequence per (row, token) either way.
template <int R, int NT>
inline void f32_mx_direct_tile(const F32Fp4Decoder& dec, const uint8_t* w, const uint8_t* scale,
                               int64_t in, const float* xp, int64_t xst, float* y, int64_t ldy) {
  const int64_t nblocks = in / 32, rb = in / 2;
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nblocks; b += 4) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const char* line = reinterpret_cast<const char*>(w + r * rb + 16 * b);
      _mm_prefetch(line + kAqPrefetch, _MM_HINT_T0);
      _mm_prefetch(line + R * rb, _MM_HINT_T1);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      f32_mx_block<R, NT>(dec, w, rb, scale, nblocks, b + j, xp, xst, acc);
  }
  for (int64_t j = 0; j < nblocks % 4; ++j)
    f32_mx_block<R, NT>(dec, w, rb, scale, nblocks, b + j, xp, xst, acc);
  aq_store_sums<R, NT>(acc, y, ldy);
}

// R rows decoded into the fp32 panel (R x in floats, the packed order, scales folded in).
template <int R>
inline void f32_mx_decode_panel(const F32Fp4Decoder& dec, const uint8_t* w, const uint8_t* scale,
                                int64_t in, float* panel) {
  const int64_t nblocks = in / 32, rb = in / 2, st = f32_mx_act_stride(in);
  for (int64_t b = 0; b < nblocks; ++b)
    for (int r = 0; r < R; ++r) {
      if (b % 4 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * rb + 16 * b + kAqPrefetch), _MM_HINT_T0);
      __m512 lo, hi;
      dec.decode(w + r * rb + 16 * b, scale[r * nblocks + b], lo, hi);
      _mm512_store_ps(panel + r * st + 32 * b, lo);
      _mm512_store_ps(panel + r * st + 32 * b + 16, hi);
    }
}

// Rows per direct tile: 8 at one token, 4 at two, 2 at 3-6 (as f32_fp8_gemm's).
constexpr int f32_mx_direct_rows(int nt) {
  return nt == 1 ? 8 : nt == 2 ? 4 : 2;
}

// Kernels::f32_mxfp4_gemm: y[t * ldy + o] = sum_k W[o, k] x[t, k], in a multiple of 32, x packed
// by f32_pack_act(.., kMxfp4, ..), scales within mxfp4_aq_scales_ok.
inline void f32_mxfp4_gemm_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                                const float* xp, int64_t ntok, float* y, int64_t ldy) {
  DSV41_CHECK_MSG(in % 32 == 0, "MXFP4 rows hold whole 32-blocks");
  const F32Fp4Decoder dec;
  const int64_t st = f32_mx_act_stride(in), nblocks = in / 32, rb = in / 2;
  if (ntok <= kF32DirectMaxTokens) {
    auto rows = [&]<int NT>() {
      constexpr int R = f32_mx_direct_rows(NT);
      int64_t r = 0;
      for (; r + R <= out; r += R)
        f32_mx_direct_tile<R, NT>(dec, w + r * rb, scale + r * nblocks, in, xp, st, y + r, ldy);
      for (; r < out; ++r)
        f32_mx_direct_tile<1, NT>(dec, w + r * rb, scale + r * nblocks, in, xp, st, y + r, ldy);
    };
    switch (ntok) {
      case 1:
        return rows.template operator()<1>();
      case 2:
        return rows.template operator()<2>();
      case 3:
        return rows.template operator()<3>();
      case 4:
        return rows.template operator()<4>();
      case 5:
        return rows.template operator()<5>();
      case 6:
        return rows.template operator()<6>();
      default:  // no tokens
        return;
    }
  }
  f32_panel_gemm(out, st, xp, ntok, y, ldy, [&]<int R>(int64_t o, float* panel) {
    f32_mx_decode_panel<R>(dec, w + o * rb, scale + o * nblocks, in, panel);
  });
}

// Kernels::f32_mxfp4_gate_up: the gate and up rows through f32_mxfp4_gemm_impl, kGemmGateUpPairs
// pairs at a time, then aq_mxfp4_gate_up's epilogue.
inline void f32_mxfp4_gate_up_impl(const uint8_t* w13, const uint8_t* s13, int64_t inter,
                                   int64_t dim, const float* xp, const float* route, int64_t ntok,
                                   float limit, float* h, int64_t ldh) {
  gate_up_by_pairs(inter, route, ntok, limit, h, ldh, [&](int64_t j0, int64_t jn, float* gu) {
    f32_mxfp4_gemm_impl(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, xp, ntok,
                        gu, 2 * jn);
  });
}

}  // namespace
}  // namespace dsv41::ops
