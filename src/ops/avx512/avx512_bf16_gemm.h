// The avx512_bf16 tier's act-quant GEMM family (Kernels::aq_*): FP8 block-scaled and MXFP4
// weights times activations already rounded to E4M3 with a power-of-two scale per 32 (act-quant
// on), on vdpbf16ps. Both factors are exact in bf16 (an E4M3 or E2M1 value has at most 4
// significant bits; the weight's block scale is a power of two folded into its exponent, the
// activation's scale is already in its value), and vdpbf16ps forms their products exactly, so the
// only rounding left is the fp32 sums, in one fixed order per output element:
//   acc = 0; for each 32-value chunk c of the (permuted, zero-padded) row, in order:
//     acc = vdpbf16ps(acc, W[o, c], X[t, c])        (16 lanes, each adds 2 products)
//   y[t, o] = the fixed horizontal sum of acc's 16 lanes.
// That sequence is the same whatever the number of tokens M, the tile that holds (o, t), or the
// path (weights decoded straight from memory for M <= 6, through a bf16 panel for more), so every
// token gets the same bits alone or among 499 others (batch invariance by construction, not by a
// GEMV shape). vdpbf16ps treats bf16 denormal inputs as zero and flushes denormal results:
// act-quant activations are never denormal (at least 2^-31: scale 2^-22 times the E4M3 step
// 2^-9), fp8_aq_scales_ok() keeps every product above 2^-126, and only a partial sum that cancels
// below 2^-126 is flushed where the fp32 path would keep a denormal.
//
// Weight decode, 64 FP8 bytes of one row at a time: vpermi2b looks up the bf16 high and low bytes
// of the 7-bit magnitude in two 128-entry tables (subnormals included), one ternary-logic op puts
// the sign back, two byte unpacks form the 16-bit words (so the words are in the in-lane unpack
// order: k 0-7, 16-23, 32-39, 48-55 in the first register, 8-15, 24-31, 40-47, 56-63 in the
// second; aq_pack_act lays the activations out in the same order), and a masked 16-bit add puts
// the block scale into the exponent of the non-zero words. Included by the avx512_bf16 tier's
// translation unit only (built with -mavx512bf16 -mavx512vbmi).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "ops/fp4_bf16_lut.h"
#include "ops/gate_up_pairs.h"
#include "ops/kernels.h"

namespace dsv41::ops {
namespace {

// Rows per tile straight from memory (one and two tokens; FP8 three: 4; the wide tiles for more:
// 2) and the software prefetch
// distance in each row's stream. Measured on Zen 5: one thread streaming 168-335 MB of weights
// gained from more concurrent row streams (FP8 one token 14 GB/s at 4 rows, 21 at 8, 23-26 at 16),
// but with both threads streaming (`bench kernels`, one run each) 16 one-token rows took 1.4-1.6x
// the time of 8 rows at two tokens on the same matrices, where 8 one-token rows took the same
// time: 8 rows. 512 bytes ahead measured as good as or better than 256-4,096. A row's first
// 512 bytes are never ahead of its own stream, and rows are short (MXFP4 down 1,152 bytes, wq_b
// 1,280): so each line of a tile also fetches the same line of the next tile (R rows on, the next
// bytes in memory) into L2. Real-shape one-token decode, huge pages, runs alternated: 112-116 ->
// 85-92 ms a step; 16 streams 659-665 -> 563-589 ms. The same for the panel decoders (prefill,
// 16 streams) changed nothing measurable.
#ifndef DSV41_AQ_R1
#define DSV41_AQ_R1 8
#endif
#ifndef DSV41_AQ_R2
#define DSV41_AQ_R2 8
#endif
#ifndef DSV41_AQ_PF
#define DSV41_AQ_PF 512
#endif
constexpr int kAqDirectRows1 = DSV41_AQ_R1;
constexpr int kAqDirectRows2 = DSV41_AQ_R2;
constexpr int64_t kAqPrefetch = DSV41_AQ_PF;

// bf16 bits of the E4M3 magnitude code m (0..127; 127 is NaN in E4M3 and never a weight).
constexpr uint16_t e4m3_mag_bf16(int m) {
  const int e = m >> 3, f = m & 7;
  if (m == 0) return 0;
  if (e == 0) {  // f * 2^-9 = (f / 8) * 2^-6: normalise
    int exp = -6, mant = f;
    while (mant < 8) mant <<= 1, --exp;  // mant in [8, 16): value (mant / 8) * 2^exp
    return static_cast<uint16_t>(((exp + 127) << 7) | ((mant - 8) << 4));
  }
  return static_cast<uint16_t>(((e - 7 + 127) << 7) | (f << 4));
}

struct AqLut {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
};
constexpr AqLut make_aq_lut() {
  AqLut t{};
  for (int m = 0; m < 128; ++m) {
    t.hi[m] = static_cast<uint8_t>(e4m3_mag_bf16(m) >> 8);
    t.lo[m] = static_cast<uint8_t>(e4m3_mag_bf16(m) & 0xFF);
  }
  return t;
}
alignas(64) constexpr AqLut kAqLut = make_aq_lut();

struct AqDecoder {
  __m512i hi_a, hi_b, lo_a, lo_b, sign, mag;
  AqDecoder()
      : hi_a(_mm512_load_si512(kAqLut.hi)),
        hi_b(_mm512_load_si512(kAqLut.hi + 64)),
        lo_a(_mm512_load_si512(kAqLut.lo)),
        lo_b(_mm512_load_si512(kAqLut.lo + 64)),
        sign(_mm512_set1_epi8(static_cast<char>(0x80))),
        mag(_mm512_set1_epi16(0x7FFF)) {}
  // 64 bytes b -> w0, w1 (32 bf16 each, unpack order), exponents raised by `add` (per 128-bit
  // lane: lanes 0-1 hold the first 32-block's values, lanes 2-3 the second's).
  void decode(__m512i b, __m512i add, __m512i& w0, __m512i& w1) const {
    __m512i hi = _mm512_permutex2var_epi8(hi_a, b, hi_b);
    const __m512i lo = _mm512_permutex2var_epi8(lo_a, b, lo_b);
    hi = _mm512_ternarylogic_epi32(hi, b, sign, 0xF8);  // hi | (b & 0x80)
    w0 = _mm512_unpacklo_epi8(lo, hi);
    w1 = _mm512_unpackhi_epi8(lo, hi);
    w0 = _mm512_mask_add_epi16(w0, _mm512_test_epi16_mask(w0, mag), w0, add);
    w1 = _mm512_mask_add_epi16(w1, _mm512_test_epi16_mask(w1, mag), w1, add);
  }
};

// The exponent adds of the 32-blocks 2j and 2j + 1 of one FP8 scale row (E8M0 s: (s - 127) << 7;
// past the row's last block: 0, the weights there are zero).
inline __m512i aq_scale_add(const uint8_t* srow, int64_t nblocks, int64_t j) {
  const int64_t b0 = 2 * j, b1 = 2 * j + 1;
  const short a0 = static_cast<short>((int(srow[b0]) - 127) * 128);
  const short a1 = b1 < nblocks ? static_cast<short>((int(srow[b1]) - 127) * 128) : short(0);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(a0)), _mm256_set1_epi16(a1),
                            1);
}

// Values per packed chunk: 64 for FP8 (64 bytes of weights), 128 for MXFP4 (64 bytes, two per
// byte).
constexpr int64_t aq_chunk(AqFormat fmt) {
  return fmt == AqFormat::kFp8 ? 64 : 128;
}

inline int64_t aq_act_stride_impl(int64_t in, AqFormat fmt) {
  const int64_t c = aq_chunk(fmt);
  return (in + c - 1) / c * c;
}

// The element of a chunk that packed position p (0 .. chunk-1) holds: FP8 words come in the byte
// unpack order (register w0: k 0-7, 16-23, 32-39, 48-55; w1: the other halves); MXFP4 registers
// A, B, C, D hold, in 128-bit lane L (block L of the chunk), elements 32L + 2j, 32L + 16 + 2j,
// 32L + 2j + 1, 32L + 17 + 2j for j < 8 (low nibbles of the lane's bytes 0-7 and 8-15, then the
// high nibbles).
inline int64_t aq_element_of(int64_t p, AqFormat fmt) {
  const int64_t z = p / 32, q = p % 32, lane = q / 8, j = q % 8;
  if (fmt == AqFormat::kFp8) return 16 * lane + (z == 0 ? 0 : 8) + j;
  const int64_t base = 32 * lane;
  switch (z) {
    case 0:
      return base + 2 * j;
    case 1:
      return base + 16 + 2 * j;
    case 2:
      return base + 2 * j + 1;
    default:
      return base + 17 + 2 * j;
  }
}

inline uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// Activations -> bf16 in the decoders' word order, zero-padded to whole chunks. The conversion
// rounds to nearest even; act-quant values are exact, so it changes nothing there.
inline void aq_pack_act_impl(const float* x, int64_t ntok, int64_t in, AqFormat fmt, uint16_t* xp) {
  const int64_t st = aq_act_stride_impl(in, fmt), ch = aq_chunk(fmt);
  for (int64_t t = 0; t < ntok; ++t) {
    const float* xt = x + t * in;
    uint16_t* pt = xp + t * st;
    int64_t c = 0;
    if (fmt == AqFormat::kFp8) {
      for (; c + 64 <= in; c += 64) {
        // natural 16-value quarters q0..q3 -> bf16; w0 = the low 8 words of each quarter, w1 the
        // high 8 (the unpack order above).
        __m256i q[4];
        for (int k = 0; k < 4; ++k)
          q[k] = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(xt + c + 16 * k)));
        const __m256i w0a = _mm256_permute2x128_si256(q[0], q[1], 0x20);
        const __m256i w0b = _mm256_permute2x128_si256(q[2], q[3], 0x20);
        const __m256i w1a = _mm256_permute2x128_si256(q[0], q[1], 0x31);
        const __m256i w1b = _mm256_permute2x128_si256(q[2], q[3], 0x31);
        _mm512_storeu_si512(pt + c, _mm512_inserti64x4(_mm512_castsi256_si512(w0a), w0b, 1));
        _mm512_storeu_si512(pt + c + 32, _mm512_inserti64x4(_mm512_castsi256_si512(w1a), w1b, 1));
      }
    }
    for (; c < st; c += ch)  // MXFP4 chunks and the last partial FP8 chunk, element by element
      for (int64_t p = 0; p < ch; ++p) {
        const int64_t k = c + aq_element_of(p, fmt);
        pt[c + p] = k < in ? bf16_rne(xt[k]) : uint16_t(0);
      }
  }
}

// bf16(f) rounded to nearest even, as a float (f finite).
inline float bf16_round(float f) {
  const uint32_t h = uint32_t(bf16_rne(f)) << 16;
  float r;
  std::memcpy(&r, &h, 4);
  return r;
}

// Kernels::aq_pack_act_split3: each token's three terms as packed rows 3t .. 3t + 2.
inline void aq_pack_act_split3_impl(const float* x, int64_t ntok, int64_t in, AqFormat fmt,
                                    uint16_t* xp) {
  static thread_local std::unique_ptr<float[]> buf;  // one token's three term rows
  static thread_local int64_t cap = 0;
  if (cap < 3 * in) buf.reset(new float[std::size_t(3 * in)]), cap = 3 * in;
  float* terms = buf.get();
  const int64_t st = aq_act_stride_impl(in, fmt);
  for (int64_t t = 0; t < ntok; ++t) {
    const float* xt = x + t * in;
    for (int64_t i = 0; i < in; ++i) {
      const float hi = bf16_round(xt[i]), r1 = xt[i] - hi;  // exact
      const float mid = bf16_round(r1);
      terms[i] = hi, terms[in + i] = mid, terms[2 * in + i] = r1 - mid;  // exact, 8 bits at most
    }
    aq_pack_act_impl(terms, 3, in, fmt, xp + 3 * t * st);
  }
}

inline float aq_hsum(__m512 v) {
  return _mm512_reduce_add_ps(v);
}

// aq_hsum of four accumulators at once, to y[0..3], each by the very tree of
// _mm512_reduce_add_ps (lanes i + i+8, then i + i+4, i + i+2, i + i+1; a float sum is the same
// with its operands swapped), so the bits are aq_hsum's: 10 shuffles and 5 adds for four sums
// instead of ~8 operations each.
inline void aq_hsum4(__m512 a, __m512 b, __m512 c, __m512 d, float* y) {
  const __m512 ab =
      _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd =
      _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // quarters: a, b, c, d, each lane j < 4 the sum of its lanes j and j + 4 of the level above
  __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  w = _mm512_add_ps(w, _mm512_permute_ps(w, 0x4E));
  w = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));
  const __m512 packed =
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), w);
  _mm_storeu_ps(y, _mm512_castps512_ps128(packed));
}

inline __m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}

// 64 bytes of a row at p, the first `valid` of them real (the rest read as zero).
inline __m512i aq_load_bytes(const uint8_t* p, int64_t valid) {
  if (valid >= 64) return _mm512_loadu_si512(p);
  return _mm512_maskz_loadu_epi8(_cvtu64_mask64(valid <= 0 ? 0 : (~0ull >> (64 - valid))), p);
}

// y[t * ldy + r] = aq_hsum(acc[r][t]) for a tile; four rows of a token at once when R is a
// multiple of 4 (the same bits).
template <int R, int NT>
inline void aq_store_sums(const __m512 (&acc)[R][NT], float* y, int64_t ldy) {
  if constexpr (R % 4 == 0) {
    for (int r = 0; r < R; r += 4)
      for (int t = 0; t < NT; ++t)
        aq_hsum4(acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t], y + t * ldy + r);
  } else {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < NT; ++t) y[t * ldy + r] = aq_hsum(acc[r][t]);
  }
}

// Straight from memory: R rows (one scale group) x NT tokens, each step decodes 64 bytes per row
// and runs the NT tokens' dots on them. Up to 3 tokens their activations are preloaded in
// registers for the step; 4-6 tokens (the wide tiles, kAqWideRows rows) load them from L1 where
// they are used (NT x 2 preloaded vectors and R x NT accumulators would not fit the registers).
// The same dot sequence per (row, token) either way.
constexpr int kAqWideRows = 2;
constexpr int64_t kAqWideMaxTokens = 6;
template <int R, int NT>
inline void aq_direct_tile(const AqDecoder& dec, const uint8_t* w, int64_t in, const uint8_t* srow,
                           const uint16_t* xp, int64_t xst, float* y, int64_t ldy) {
  constexpr bool kPreload = NT <= 3;
  const int64_t st = aq_act_stride_impl(in, AqFormat::kFp8), nblocks = (in + 31) / 32;
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < st; c += 64) {
    const __m512i add = aq_scale_add(srow, nblocks, c / 64);
    __m512i x0[kPreload ? NT : 1], x1[kPreload ? NT : 1];
    if constexpr (kPreload)
      for (int t = 0; t < NT; ++t) {
        x0[t] = _mm512_loadu_si512(xp + t * xst + c);
        x1[t] = _mm512_loadu_si512(xp + t * xst + c + 32);
      }
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w + r * in;
      _mm_prefetch(reinterpret_cast<const char*>(row + c + kAqPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + c + R * in), _MM_HINT_T1);  // next tile
      __m512i w0, w1;
      dec.decode(aq_load_bytes(row + c, in - c), add, w0, w1);
      for (int t = 0; t < NT; ++t) {
        const __m512i a = kPreload ? x0[t] : _mm512_loadu_si512(xp + t * xst + c);
        const __m512i b = kPreload ? x1[t] : _mm512_loadu_si512(xp + t * xst + c + 32);
        acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(w0), as_bh(a));
        acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(w1), as_bh(b));
      }
    }
  }
  aq_store_sums<R, NT>(acc, y, ldy);
}

// R rows of one scale group decoded into a bf16 panel (R x st words, the decoder's order). The
// rows come from memory once per token block: prefetched as the direct tiles do (the panel
// GEMMs at 16-100 tokens ran 5-15% faster with it, two Zen 5 threads, cold weights).
template <int R>
inline void aq_decode_panel(const AqDecoder& dec, const uint8_t* w, int64_t in, const uint8_t* srow,
                            uint16_t* panel) {
  const int64_t st = aq_act_stride_impl(in, AqFormat::kFp8), nblocks = (in + 31) / 32;
  for (int64_t c = 0; c < st; c += 64) {
    const __m512i add = aq_scale_add(srow, nblocks, c / 64);
    for (int r = 0; r < R; ++r) {
      __m512i w0, w1;
      _mm_prefetch(reinterpret_cast<const char*>(w + r * in + c + kAqPrefetch), _MM_HINT_T0);
      dec.decode(aq_load_bytes(w + r * in + c, in - c), add, w0, w1);
      _mm512_store_si512(panel + r * st + c, w0);
      _mm512_store_si512(panel + r * st + c + 32, w1);
    }
  }
}

// The panel's R rows x NT tokens over the words [c0, c1) of their rows: the same dot sequence as
// aq_direct_tile, cut into K blocks. Between blocks the 16-lane accumulators wait in `spill`
// (R x NT vectors; storing and reloading fp32 changes no bit); the last block sums them into y.
template <int R, int NT>
inline void aq_panel_tile(const uint16_t* panel, int64_t st, const uint16_t* xp, int64_t xst,
                          int64_t c0, int64_t c1, float* spill, float* y, int64_t ldy) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t)
      acc[r][t] = c0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(spill + (r * NT + t) * 16);
  for (int64_t c = c0; c < c1; c += 32) {
    __m512i xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_si512(xp + t * xst + c);
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_load_si512(panel + r * st + c);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv), as_bh(xv[t]));
    }
  }
  if (c1 == st) {
    aq_store_sums<R, NT>(acc, y, ldy);
  } else {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < NT; ++t) _mm512_store_ps(spill + (r * NT + t) * 16, acc[r][t]);
  }
}

constexpr int kAqPanelRows = 4;            // rows per panel tile (4 x 6: 24 accumulators)
constexpr int kAqPanelTokens = 6;          // tokens per panel tile
constexpr int64_t kAqDirectMaxTokens = 3;  // up to here the weights are decoded per token pass
// A token block's activations: up to 2 MB, so a call of a few hundred tokens decodes its weights
// once (the block streams from L3 once per row group; the decoded group stays in L2). One
// Zen 5 core per format, both cores busy, 64-256 tokens on [2304, 5120] MXFP4 and [1024, 5120]
// FP8: 6-12% faster than blocks of 512 KB (in L2 beside the group); 8 MB: no faster.
constexpr int64_t kAqXBlockWords = 1024 * 1024;
// Rows longer than kAqWholeKMaxWords (below), blocked for the caches: a scale group's 32 rows are
// decoded into the panel (L2) once per token block; then for each 6-token tile, K block by K
// block, all the group's row
// tiles run over that tile's activations (6 x 1,024 words: 12 KB, in L1), their accumulators
// spilled between blocks (8 tiles x 24 vectors: 12 KB). Unblocked, every 4-row tile streamed its
// tokens' whole rows from L2 (the micro-kernel ran at 0.68x its in-L1 rate, one Zen 5 core).
// Measured on Zen 5, one core, [1024, 5120] x 240 tokens: 226 GFLOP/s unblocked, 264-295 with
// blocks of 1,024 words (256: 235-246, 512: 255-271).
constexpr int64_t kAqGroupRows = 32;
constexpr int64_t kAqKBlockWords = 1024;
// Rows of up to kAqWholeKMaxWords words (every matrix of the model: the longest, wo_b, has 8,192)
// skip the K blocks: kAqWholeGroupRows rows are decoded into the panel, then each 6-token tile
// runs each 4-row tile over the whole K with its accumulators in registers (aq_panel_tile_whole;
// the activations stream from L2, or L3 for the group's first row tile, and no accumulator is
// spilled). Measured on Zen 4 (avx512_bf16) with the vCPU at ~230 GFLOP/s of vdpbf16ps per core
// (oneDNN's bf16 matmul 430-450 on two): one core over a mix of engine shapes 164 -> 200 GFLOP/s
// against the K blocks; two threads on a prefill-512 mix of every linear of a layer and 24
// experts (weights cycled from memory, variants alternated in one process) 328 -> 384-390 for
// groups of 4, 8, 16 or 32 rows alike; `bench prefill --lengths 512` 0.37-0.51 -> 0.56 of
// its roofline. The K blocks had measured faster (above) on the same machine kind in a phase when
// oneDNN ran at 730-790 GFLOP/s: at that rate the whole-K tiles' activation traffic (16 B per
// vdpbf16ps from the L2, and from the L3 once per group) may bind; 16-row groups keep the L3
// share at a quarter of 4-row panels'.
constexpr int64_t kAqWholeKMaxWords = 8192;
constexpr int64_t kAqWholeGroupRows = 16;
// Up to this many tokens, and for rows of up to 2,048 words, the FP8 path decodes 4 rows and runs
// them over all tokens and the whole K at once, while they are in L1 (the order before the
// blocking: as fast at 16 tokens, [1024, 5120], and 3-7% faster at k = 1280, one Zen 5 core).
constexpr int64_t kAqPanelOuterMaxTokens = 16;

// A thread's panel (`words` words, 64-byte aligned): grown once per thread and
// width (no allocation in steady state); a raw array, not a std::vector, so no shared template
// instance is compiled with this tier's flags.
inline uint16_t* aq_panel_scratch(int64_t words) {
  static thread_local std::unique_ptr<uint16_t[]> buf;
  static thread_local std::size_t cap = 0;
  const std::size_t need = std::size_t(words + 32);
  if (cap < need) buf.reset(new uint16_t[need]), cap = need;
  return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(buf.get()) + 63) &
                                     ~uintptr_t(63));
}

// Token blocks of at most kAqXBlockWords activation words while every row of a call passes over
// them, all of about one size (a block of few tokens pays for a whole decode of the weights and
// runs the slower few-token order: with 512 KB blocks, 64 tokens at 5,120 values as 36 + 28
// rather than 48 + 16 ran 5-15% faster on [2304, 5120] and [5120, 8192], two Zen 5 threads).
inline int64_t aq_token_block(int64_t st, int64_t ntok) {
  const int64_t most =
      std::max<int64_t>(kAqPanelTokens, kAqXBlockWords / st / kAqPanelTokens * kAqPanelTokens);
  const int64_t blocks = (ntok + most - 1) / most, even = (ntok + blocks - 1) / blocks;
  return std::min(most, (even + kAqPanelTokens - 1) / kAqPanelTokens * kAqPanelTokens);
}

// Rows [0, nrows) of the panel (4-row tiles, then single rows) for the NT tokens at xp over the
// words [c0, c1); spill holds kAqPanelRows x kAqPanelTokens vectors per tile.
template <int NT>
inline void aq_panel_rows(const uint16_t* panel, int64_t st, int64_t nrows, const uint16_t* xp,
                          int64_t c0, int64_t c1, float* spill, float* y, int64_t ldy) {
  constexpr int64_t kSlot = kAqPanelRows * kAqPanelTokens * 16;
  int64_t r = 0, slot = 0;
  for (; r + kAqPanelRows <= nrows; r += kAqPanelRows, ++slot)
    aq_panel_tile<kAqPanelRows, NT>(panel + r * st, st, xp, st, c0, c1, spill + slot * kSlot, y + r,
                                    ldy);
  for (; r < nrows; ++r, ++slot)
    aq_panel_tile<1, NT>(panel + r * st, st, xp, st, c0, c1, spill + slot * kSlot, y + r, ldy);
}

// The panel's R rows x NT tokens over the whole K: the same dot sequence as aq_direct_tile. Kept
// apart from the K-blocked aq_panel_tile above: called with the whole K, that one ran 25% slower
// at 16 tokens ([1024, 5120], one Zen 5 core; GCC's code for the spill branches, not studied).
template <int R, int NT>
inline void aq_panel_tile_whole(const uint16_t* panel, int64_t st, const uint16_t* xp, int64_t xst,
                                float* y, int64_t ldy) {
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < st; c += 32) {
    __m512i xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_si512(xp + t * xst + c);
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_load_si512(panel + r * st + c);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv), as_bh(xv[t]));
    }
  }
  aq_store_sums<R, NT>(acc, y, ldy);
}

// R decoded rows over all nt tokens and the whole K (few tokens: kAqPanelOuterMaxTokens).
template <int R>
inline void aq_panel_tokens(const uint16_t* panel, int64_t st, const uint16_t* xp, int64_t nt,
                            float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + kAqPanelTokens <= nt; t += kAqPanelTokens)
    aq_panel_tile_whole<R, kAqPanelTokens>(panel, st, xp + t * st, st, y + t * ldy, ldy);
  switch (nt - t) {
    case 5:
      return aq_panel_tile_whole<R, 5>(panel, st, xp + t * st, st, y + t * ldy, ldy);
    case 4:
      return aq_panel_tile_whole<R, 4>(panel, st, xp + t * st, st, y + t * ldy, ldy);
    case 3:
      return aq_panel_tile_whole<R, 3>(panel, st, xp + t * st, st, y + t * ldy, ldy);
    case 2:
      return aq_panel_tile_whole<R, 2>(panel, st, xp + t * st, st, y + t * ldy, ldy);
    case 1:
      return aq_panel_tile_whole<R, 1>(panel, st, xp + t * st, st, y + t * ldy, ldy);
    default:
      return;
  }
}

// The decoded group (nrows <= kAqGroupRows rows) for the nt tokens at xp: token tiles, K blocks,
// row tiles.
inline void aq_panel_group(const uint16_t* panel, int64_t st, int64_t nrows, const uint16_t* xp,
                           int64_t nt, float* y, int64_t ldy) {
  alignas(64) static thread_local float spill[kAqGroupRows * kAqPanelRows * kAqPanelTokens * 16];
  // Reached for rows longer than kAqWholeKMaxWords only (aq_panel_gemm): always K blocks.
  const int64_t kb = kAqKBlockWords;
  for (int64_t t = 0; t < nt; t += kAqPanelTokens) {
    const int64_t n = std::min<int64_t>(kAqPanelTokens, nt - t);
    const uint16_t* xt = xp + t * st;
    float* yt = y + t * ldy;
    for (int64_t c0 = 0; c0 < st; c0 += kb) {
      const int64_t c1 = std::min(st, c0 + kb);
      switch (n) {
        case 6:
          aq_panel_rows<6>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
        case 5:
          aq_panel_rows<5>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
        case 4:
          aq_panel_rows<4>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
        case 3:
          aq_panel_rows<3>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
        case 2:
          aq_panel_rows<2>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
        default:
          aq_panel_rows<1>(panel, st, nrows, xt, c0, c1, spill, yt, ldy);
          break;
      }
    }
  }
}

// The decoded rows [0, nrows) of the panel (nrows <= kAqWholeGroupRows) for the nt tokens at xp:
// token tiles, then row tiles over the whole K (rows of at most kAqWholeKMaxWords words).
inline void aq_panel_group_whole(const uint16_t* panel, int64_t st, int64_t nrows,
                                 const uint16_t* xp, int64_t nt, float* y, int64_t ldy) {
  for (int64_t t = 0; t < nt; t += kAqPanelTokens) {
    const uint16_t* xt = xp + t * st;
    float* yt = y + t * ldy;
    auto rows = [&]<int NT>() {
      int64_t r = 0;
      for (; r + kAqPanelRows <= nrows; r += kAqPanelRows)
        aq_panel_tile_whole<kAqPanelRows, NT>(panel + r * st, st, xt, st, yt + r, ldy);
      for (; r < nrows; ++r) aq_panel_tile_whole<1, NT>(panel + r * st, st, xt, st, yt + r, ldy);
    };
    switch (std::min<int64_t>(kAqPanelTokens, nt - t)) {
      case 6:
        rows.template operator()<6>();
        break;
      case 5:
        rows.template operator()<5>();
        break;
      case 4:
        rows.template operator()<4>();
        break;
      case 3:
        rows.template operator()<3>();
        break;
      case 2:
        rows.template operator()<2>();
        break;
      default:
        rows.template operator()<1>();
        break;
    }
  }
}

// Rows [o0, o0 + nrows) decoded into the panel, R at a time (then single rows).
template <class Decode>
inline void aq_decode_rows(const Decode& decode, int64_t o0, int64_t nrows, int64_t st,
                           uint16_t* panel) {
  int64_t r = 0;
  for (; r + kAqPanelRows <= nrows; r += kAqPanelRows)
    decode.template operator()<kAqPanelRows>(o0 + r, panel + r * st);
  for (; r < nrows; ++r) decode.template operator()<1>(o0 + r, panel + r * st);
}

// The panel path of both formats: each group of kAqGroupRows rows (FP8: one scale group) is
// decoded into bf16 words with the scales folded in (decode.template operator()<R>(o, panel)
// writes rows o .. o + R - 1 at panel, R x st words) once per token block, then run over the
// block's tokens. Few tokens or short rows: 4-row panels used while they are in L1; rows of up to
// kAqWholeKMaxWords: kAqWholeGroupRows at a time, then aq_panel_group_whole's token tiles and
// whole-K row tiles; longer rows: the whole group, then aq_panel_group's token tiles, K blocks and
// row tiles.
template <class Decode>
inline void aq_panel_gemm(int64_t out, int64_t st, const uint16_t* xp, int64_t ntok, float* y,
                          int64_t ldy, const Decode& decode) {
  uint16_t* panel = aq_panel_scratch(kAqGroupRows * st);
  const int64_t tb = aq_token_block(st, ntok);
  for (int64_t t0 = 0; t0 < ntok; t0 += tb) {
    const int64_t nt = std::min(tb, ntok - t0);
    for (int64_t o0 = 0; o0 < out; o0 += kAqGroupRows) {
      const int64_t nrows = std::min(kAqGroupRows, out - o0);
      int64_t r = 0;
      if (nt <= kAqPanelOuterMaxTokens || st <= 2 * kAqKBlockWords) {  // panels used in L1
        for (; r + kAqPanelRows <= nrows; r += kAqPanelRows) {
          decode.template operator()<kAqPanelRows>(o0 + r, panel);
          aq_panel_tokens<kAqPanelRows>(panel, st, xp + t0 * st, nt, y + t0 * ldy + o0 + r, ldy);
        }
        for (; r < nrows; ++r) {
          decode.template operator()<1>(o0 + r, panel);
          aq_panel_tokens<1>(panel, st, xp + t0 * st, nt, y + t0 * ldy + o0 + r, ldy);
        }
        continue;
      }
      if (st <= kAqWholeKMaxWords) {
        for (int64_t g = 0; g < nrows; g += kAqWholeGroupRows) {
          const int64_t gn = std::min(kAqWholeGroupRows, nrows - g);
          aq_decode_rows(decode, o0 + g, gn, st, panel);
          aq_panel_group_whole(panel, st, gn, xp + t0 * st, nt, y + t0 * ldy + o0 + g, ldy);
        }
        continue;
      }
      aq_decode_rows(decode, o0, nrows, st, panel);
      aq_panel_group(panel, st, nrows, xp + t0 * st, nt, y + t0 * ldy + o0, ldy);
    }
  }
}

template <int NT>
inline void aq_direct_group(const AqDecoder& dec, const uint8_t* w, int64_t nrows, int64_t in,
                            const uint8_t* srow, const uint16_t* xp, int64_t xst, float* y,
                            int64_t ldy) {
  constexpr int R = NT == 1 ? kAqDirectRows1 : NT == 2 ? kAqDirectRows2 : 4;
  int64_t r = 0;
  for (; r + R <= nrows; r += R)
    aq_direct_tile<R, NT>(dec, w + r * in, in, srow, xp, xst, y + r, ldy);
  for (; r < nrows; ++r) aq_direct_tile<1, NT>(dec, w + r * in, in, srow, xp, xst, y + r, ldy);
}

// Kernels::aq_fp8_gemm: y[t * ldy + o] = sum_k W[o, k] x[t, k], x packed by aq_pack_act.
inline void aq_fp8_gemm_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                             const uint16_t* xp, int64_t ntok, float* y, int64_t ldy) {
  const AqDecoder dec;
  const int64_t st = aq_act_stride_impl(in, AqFormat::kFp8), sin = (in + 31) / 32;
  if (ntok > kAqDirectMaxTokens && ntok <= kAqWideMaxTokens) {  // one pass over the weights
    auto groups = [&]<int NT>() {
      for (int64_t g = 0; g * 32 < out; ++g) {
        const int64_t o0 = g * 32, nrows = std::min<int64_t>(out, o0 + 32) - o0;
        const uint8_t* wg = w + o0 * in;
        const uint8_t* srow = scale + g * sin;
        int64_t r = 0;
        for (; r + kAqWideRows <= nrows; r += kAqWideRows)
          aq_direct_tile<kAqWideRows, NT>(dec, wg + r * in, in, srow, xp, st, y + o0 + r, ldy);
        for (; r < nrows; ++r)
          aq_direct_tile<1, NT>(dec, wg + r * in, in, srow, xp, st, y + o0 + r, ldy);
      }
    };
    if (ntok == 4) groups.template operator()<4>();
    if (ntok == 5) groups.template operator()<5>();
    if (ntok == 6) groups.template operator()<6>();
    return;
  }
  if (ntok <= kAqDirectMaxTokens) {
    for (int64_t g = 0; g * 32 < out; ++g) {
      const int64_t o0 = g * 32, nrows = std::min<int64_t>(out, o0 + 32) - o0;
      const uint8_t* wg = w + o0 * in;
      const uint8_t* srow = scale + g * sin;
      int64_t t = 0;
      for (; t + 3 <= ntok; t += 3)
        aq_direct_group<3>(dec, wg, nrows, in, srow, xp + t * st, st, y + t * ldy + o0, ldy);
      if (ntok - t == 2)
        aq_direct_group<2>(dec, wg, nrows, in, srow, xp + t * st, st, y + t * ldy + o0, ldy);
      else if (ntok - t == 1)
        aq_direct_group<1>(dec, wg, nrows, in, srow, xp + t * st, st, y + t * ldy + o0, ldy);
    }
    return;
  }
  aq_panel_gemm(out, st, xp, ntok, y, ldy, [&]<int R>(int64_t o, uint16_t* panel) {
    aq_decode_panel<R>(dec, w + o * in, in, scale + (o / 32) * sin, panel);
  });
}

// ---- MXFP4 ----------------------------------------------------------------------------------
// 64 bytes of a row are 128 E2M1 weights, four 32-blocks, one per 128-bit lane. vpshufb looks up
// the two bytes of each nibble's bf16 word with its exponent raised by kAq4Bias (the sign is bit 3
// of the code; both zeros give the word 0), four byte unpacks form the words (registers A..D,
// aq_element_of), and one saturating 16-bit subtract per register puts the lane's block scale in:
// (kAq4Bias + 127 - s) << 7 off the word, which leaves a zero word zero (it saturates) and gives
// any other the bf16 of its value times 2^(s - 127), exactly. mxfp4_aq_scales_ok keeps s in
// [33, 252], so the subtrahend is never negative, the exponent lands in 32..254 (no borrow into
// the sign, no denormal word) and every product with an act-quant activation (at least 2^-31)
// stays at or above 2^-126. The words are then FP8's: the same dot sequence
//   acc = 0; for each 32-word register of the (permuted, zero-padded) row: acc = vdpbf16ps(acc, W,
//   X)
// and the same panel tiles. (Keeping the scales out of the words cost each 128-value chunk four
// dots from zero and an fma per (row, token), so the panel tile had 12 chunk sums beside 12
// accumulators; the masked exponent add of FP8's decoder costs two operations a register where
// this subtract costs one.)
// (kAq4Bias, kAq4Lut: ops/fp4_bf16_lut.h, shared with the avx2 tier's decoder.)

struct AqFp4Decoder {
  __m512i thi, tlo, nib, lane_of_word, top;
  AqFp4Decoder()
      : thi(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kAq4Lut.hi)))),
        tlo(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kAq4Lut.lo)))),
        nib(_mm512_set1_epi8(0x0F)),
        // byte 2i of the scale lookup: the lane of word i (8 words a lane); odd bytes masked off
        lane_of_word(_mm512_set_epi64(0x0303030303030303, 0x0303030303030303, 0x0202020202020202,
                                      0x0202020202020202, 0x0101010101010101, 0x0101010101010101, 0,
                                      0)),
        top(_mm512_set1_epi16(kAq4Bias + 127)) {}
  // The subtrahends of blocks 4j .. 4j + 3 of a row: (kAq4Bias + 127 - s) << 7 in every word of
  // block L's lane (past the row's last block s reads 0: its words are zero and stay zero).
  __m512i scale_sub(const uint8_t* srow, int64_t nblocks, int64_t j) const {
    const int64_t b0 = 4 * j, nb = std::min<int64_t>(4, nblocks - b0);
    uint32_t four = 0;
    if (nb >= 4)
      std::memcpy(&four, srow + b0, 4);
    else
      for (int64_t i = 0; i < nb; ++i) four |= uint32_t(srow[b0 + i]) << (8 * i);
    const __m512i s = _mm512_maskz_permutexvar_epi8(
        0x5555555555555555ull, lane_of_word, _mm512_castsi128_si512(_mm_cvtsi32_si128(int(four))));
    return _mm512_slli_epi16(_mm512_sub_epi16(top, s), 7);
  }
  void decode(__m512i b, __m512i sub, __m512i w[4]) const {
    const __m512i lo_n = _mm512_and_si512(b, nib);
    const __m512i hi_n = _mm512_and_si512(_mm512_srli_epi16(b, 4), nib);
    const __m512i lh = _mm512_shuffle_epi8(thi, lo_n), ll = _mm512_shuffle_epi8(tlo, lo_n);
    const __m512i hh = _mm512_shuffle_epi8(thi, hi_n), hl = _mm512_shuffle_epi8(tlo, hi_n);
    w[0] = _mm512_subs_epu16(_mm512_unpacklo_epi8(ll, lh), sub);
    w[1] = _mm512_subs_epu16(_mm512_unpackhi_epi8(ll, lh), sub);
    w[2] = _mm512_subs_epu16(_mm512_unpacklo_epi8(hl, hh), sub);
    w[3] = _mm512_subs_epu16(_mm512_unpackhi_epi8(hl, hh), sub);
  }
};

// One chunk of one (row, token): its four registers' dots, in order (written out: GCC kept the
// accumulators of a z loop in memory).
inline __m512 aq4_dots(__m512 acc, const __m512i* w, const __m512i* x) {
  acc = _mm512_dpbf16_ps(acc, as_bh(w[0]), as_bh(x[0]));
  acc = _mm512_dpbf16_ps(acc, as_bh(w[1]), as_bh(x[1]));
  acc = _mm512_dpbf16_ps(acc, as_bh(w[2]), as_bh(x[2]));
  return _mm512_dpbf16_ps(acc, as_bh(w[3]), as_bh(x[3]));
}

// Straight from memory: R rows x NT tokens, 64 bytes (128 weights, four registers) of each row per
// step. Up to 2 tokens their activations are preloaded in registers for the step; 3-6 tokens (the
// wide tiles, kAq4WideRows rows) load them from L1 where they are used. The same sequence per
// (row, token) either way, and as the panel tiles'. (16 streams give each expert about two
// tokens, many 3-6: one pass over the weights for them, not a panel decode.)
// Three rows: one Zen 5 core, [256, 5120] in L2, 3-6 tokens 12-15% faster than two rows (four:
// as three at 4 tokens, slower at 3 and 6; tokens outermost over two decoded rows: slower).
constexpr int kAq4WideRows = 3;
constexpr int64_t kAq4DirectMaxTokens = 6;
template <int R, int NT>
inline void aq4_direct_tile(const AqFp4Decoder& dec, const uint8_t* w, const uint8_t* scale,
                            int64_t in, const uint16_t* xp, int64_t xst, float* y, int64_t ldy) {
  constexpr bool kPreload = NT <= 2;
  const int64_t st = aq_act_stride_impl(in, AqFormat::kMxfp4), nblocks = in / 32, rb = in / 2;
  __m512 acc[R][NT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < st; c += 128) {
    __m512i xv[kPreload ? NT : 1][4];
    if constexpr (kPreload)
      for (int t = 0; t < NT; ++t)
        for (int z = 0; z < 4; ++z) xv[t][z] = _mm512_loadu_si512(xp + t * xst + c + 32 * z);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w + r * rb;
      _mm_prefetch(reinterpret_cast<const char*>(row + c / 2 + kAqPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + c / 2 + R * rb), _MM_HINT_T1);  // next tile
      __m512i wv[4];
      dec.decode(aq_load_bytes(row + c / 2, rb - c / 2),
                 dec.scale_sub(scale + r * nblocks, nblocks, c / 128), wv);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        if constexpr (kPreload) {
          acc[r][t] = aq4_dots(acc[r][t], wv, xv[t]);
        } else {
          __m512i x[4];
          for (int z = 0; z < 4; ++z) x[z] = _mm512_loadu_si512(xp + t * xst + c + 32 * z);
          acc[r][t] = aq4_dots(acc[r][t], wv, x);
        }
      }
    }
  }
  aq_store_sums<R, NT>(acc, y, ldy);
}

// R rows decoded into a panel of R x st words (the decoder's order, scales folded in), as
// aq_decode_panel does for FP8.
template <int R>
inline void aq4_decode_panel(const AqFp4Decoder& dec, const uint8_t* w, const uint8_t* scale,
                             int64_t in, uint16_t* panel) {
  const int64_t st = aq_act_stride_impl(in, AqFormat::kMxfp4), nblocks = in / 32, rb = in / 2;
  for (int64_t c = 0; c < st; c += 128)
    for (int r = 0; r < R; ++r) {
      __m512i wv[4];
      _mm_prefetch(reinterpret_cast<const char*>(w + r * rb + c / 2 + kAqPrefetch), _MM_HINT_T0);
      dec.decode(aq_load_bytes(w + r * rb + c / 2, rb - c / 2),
                 dec.scale_sub(scale + r * nblocks, nblocks, c / 128), wv);
      for (int z = 0; z < 4; ++z) _mm512_store_si512(panel + r * st + c + 32 * z, wv[z]);
    }
}

// Rows [0, out) of an MXFP4 matrix (in a multiple of 32) for ntok packed tokens.
inline void aq_mxfp4_gemm_impl(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                               const uint16_t* xp, int64_t ntok, float* y, int64_t ldy) {
  const AqFp4Decoder dec;
  const int64_t st = aq_act_stride_impl(in, AqFormat::kMxfp4), nblocks = in / 32, rb = in / 2;
  if (ntok <= kAq4DirectMaxTokens) {  // one pass over the weights: R-row tiles, then single rows
    auto rows = [&]<int NT>() {
      constexpr int R = NT > 2 ? kAq4WideRows : NT == 1 ? kAqDirectRows1 : kAqDirectRows2;
      auto tile = [&]<int RR>(int64_t r) {
        aq4_direct_tile<RR, NT>(dec, w + r * rb, scale + r * nblocks, in, xp, st, y + r, ldy);
      };
      int64_t r = 0;
      for (; r + R <= out; r += R) tile.template operator()<R>(r);
      for (; r < out; ++r) tile.template operator()<1>(r);
    };
    if (ntok == 1) rows.template operator()<1>();
    if (ntok == 2) rows.template operator()<2>();
    if (ntok == 3) rows.template operator()<3>();
    if (ntok == 4) rows.template operator()<4>();
    if (ntok == 5) rows.template operator()<5>();
    if (ntok == 6) rows.template operator()<6>();
    return;
  }
  aq_panel_gemm(out, st, xp, ntok, y, ldy, [&]<int R>(int64_t o, uint16_t* panel) {
    aq4_decode_panel<R>(dec, w + o * rb, scale + o * nblocks, in, panel);
  });
}

// Fused gate/up over the interleaved w13: the act-quant GEMM's rows through gate_up_by_pairs
// (ops/gate_up_pairs.h).
// Kernels::aq_mxfp4_gate_up.
inline void aq_mxfp4_gate_up_impl(const uint8_t* w13, const uint8_t* s13, int64_t inter,
                                  int64_t dim, const uint16_t* xp, const float* route, int64_t ntok,
                                  float limit, float* h, int64_t ldh) {
  gate_up_by_pairs(inter, route, ntok, limit, h, ldh, [&](int64_t j0, int64_t jn, float* gu) {
    aq_mxfp4_gemm_impl(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, xp, ntok,
                       gu, 2 * jn);
  });
}

}  // namespace
}  // namespace dsv41::ops
