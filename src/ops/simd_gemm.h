// Prefill GEMMs shared by the SIMD tiers (FP8 block-scaled, bf16 and MXFP4 weights times fp32
// activations, fp32 accumulation), written with 256-bit AVX2/FMA intrinsics and included only by
// the per-tier translation units (internal linkage, as ops/simd_common.h).
//
// y[t, n] = sum_k W[n, k] x[t, k]: the weights play the GEMM's "A" (broadcast, six rows per
// micro-tile) and the tokens its "B" (two vectors of 8 tokens), so weights are decoded in their
// natural row order and the 6 x 16 tile keeps 12 accumulators in registers (15 of the 16 ymm
// registers in use). Blocking (GotoBLAS order):
//   K chunks of kKc = 256: the activations of every token are packed once per chunk into
//     token-block panels [kc][16] (16 KB each: one lives in L1 while it is used);
//   row panels of kNc = 96 rows: decoded once per K chunk into six-row micro-panels [kc][6] with
//   the
//     block scales folded in (96 KB: L2), then every token block runs over them.
// The decode cost is amortised over all tokens, so it matters only for short prompts; the
// micro-kernel is what runs. Partial tiles are padded with zeros and only valid results are stored.
// Memory: one thread-local buffer per thread for the packed activations (grows to the largest call,
// kept); the weight panel lives on the stack.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "ops/simd_common.h"

namespace dsv41::ops {
namespace {

constexpr int kRows = 16;     // weight rows per micro-tile (two vectors)
constexpr int kToks = 6;      // tokens per micro-tile (broadcast)
constexpr int64_t kKc = 256;  // K chunk (a multiple of 32: whole scale blocks)
constexpr int64_t kNc = 96;   // rows per decoded panel (a multiple of kRows)

// c[t * 16 + r] = sum_k a[k * lda + r] * b[k * 6 + t] over k < kc (lda = 16 for packed panels).
// Twelve named accumulators, not an array: GCC kept an accumulator array in memory in some
// instantiations (a store per FMA pair, 3x slower in a standalone loop on this machine's Zen 3).
inline void gemm_micro_16x6(const float* a, int64_t lda, const float* b, int64_t kc, float* c) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < kc; ++k, a += lda, b += kToks) {
    const __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
    __m256 bv = _mm256_broadcast_ss(b);
    c00 = _mm256_fmadd_ps(a0, bv, c00), c01 = _mm256_fmadd_ps(a1, bv, c01);
    bv = _mm256_broadcast_ss(b + 1);
    c10 = _mm256_fmadd_ps(a0, bv, c10), c11 = _mm256_fmadd_ps(a1, bv, c11);
    bv = _mm256_broadcast_ss(b + 2);
    c20 = _mm256_fmadd_ps(a0, bv, c20), c21 = _mm256_fmadd_ps(a1, bv, c21);
    bv = _mm256_broadcast_ss(b + 3);
    c30 = _mm256_fmadd_ps(a0, bv, c30), c31 = _mm256_fmadd_ps(a1, bv, c31);
    bv = _mm256_broadcast_ss(b + 4);
    c40 = _mm256_fmadd_ps(a0, bv, c40), c41 = _mm256_fmadd_ps(a1, bv, c41);
    bv = _mm256_broadcast_ss(b + 5);
    c50 = _mm256_fmadd_ps(a0, bv, c50), c51 = _mm256_fmadd_ps(a1, bv, c51);
  }
  const __m256 out[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  for (int i = 0; i < 12; ++i) _mm256_storeu_ps(c + 8 * i, out[i]);
}

// Packs x[t0 + t, k0 + k] (t < 6, k < kc; tokens past ntok are zero) as dst[k * 6 + t].
inline void gemm_pack_tokens(const float* x, int64_t ldx, int64_t t0, int64_t ntok, int64_t k0,
                             int64_t kc, float* dst) {
  const int64_t nt = std::min<int64_t>(kToks, ntok - t0);
  for (int64_t t = 0; t < kToks; ++t) {
    if (t >= nt) {
      for (int64_t k = 0; k < kc; ++k) dst[k * kToks + t] = 0.0f;
      continue;
    }
    const float* src = x + (t0 + t) * ldx + k0;
    for (int64_t k = 0; k < kc; ++k) dst[k * kToks + t] = src[k];
  }
}

// y[t * ldy + r] (+)= c[t * 16 + r] for t < nt, r < rows: whole vectors when the tile is full.
inline void gemm_store_tile(const float* c, int64_t nt, int64_t rows, bool add, float* y,
                            int64_t ldy) {
  for (int64_t t = 0; t < nt; ++t) {
    float* yt = y + t * ldy;
    const float* ct = c + t * kRows;
    if (rows == kRows) {
      for (int h = 0; h < 2; ++h) {
        const __m256 v = _mm256_loadu_ps(ct + 8 * h);
        _mm256_storeu_ps(yt + 8 * h, add ? _mm256_add_ps(_mm256_loadu_ps(yt + 8 * h), v) : v);
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) yt[r] = add ? yt[r] + ct[r] : ct[r];
    }
  }
}

// dst[k * 16 + r] = src[r * kKc + k] for r < 16, k < kc: 8x8 blocks transposed in registers (the
// element-wise scatter it replaces cost about as much as the micro-kernel at 16 tokens).
inline void transpose_to_panel(const float* src, int64_t kc, float* dst) {
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8)
    for (int half = 0; half < 2; ++half) {
      const float* s = src + half * 8 * kKc + k;
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * kKc);
      __m256 t[8], u[8];
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
      for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
      }
      float* d = dst + k * kRows + half * 8;
      for (int j = 0; j < 4; ++j) {
        _mm256_storeu_ps(d + j * kRows, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
        _mm256_storeu_ps(d + (j + 4) * kRows, _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
      }
    }
  for (; k < kc; ++k)
    for (int64_t r = 0; r < kRows; ++r) dst[k * kRows + r] = src[r * kKc + k];
}

constexpr int64_t kTs = 64 * kToks;  // tokens per super-block (384)

// The GEMM over rows [0, out) with `decode(n, k0, kc, dst)` writing kc weights of row n from column
// k0 (scales applied) to dst[0..kc). y[t * ldy + n] for t < ntok.
// Loop order: token super-blocks of kTs = 384 (their activations packed once, all K: 7.9 MB at
// K = 5120, thread-local), then row panels, then K chunks; the y region a row panel touches in a
// super-block (384 x 96 floats, 147 KB) stays in L2 while its K chunks add into it (with K chunks
// outermost, y was re-read from memory per chunk: an eighth of the time in a perf profile). Weights
// are decoded once per super-block: one decode per 384 tokens' multiply-adds (bf16, m = 2048,
// 2 threads: 108-116 GFLOP/s with super-blocks of 192, 115-121 with 384).
template <typename Decode, typename Prefetch>
void gemm_rows(int64_t out, int64_t in, const float* x, int64_t ntok, float* y, int64_t ldy,
               const Decode& decode, const Prefetch& prefetch_row) {
  thread_local std::vector<float> packed;
  const int64_t kchunks = (in + kKc - 1) / kKc;
  const int64_t max_blocks = (std::min(ntok, kTs) + kToks - 1) / kToks;
  const std::size_t need = std::size_t(kchunks * max_blocks * kToks * kKc);
  if (packed.size() < need) packed.resize(need);
  alignas(64) float panel[kNc * kKc];     // 16-row micro-panels [kc][16], 96 KB
  alignas(64) float rows16[kRows * kKc];  // 16 decoded rows of one K chunk, row-major
  alignas(64) float c[kRows * kToks];
  for (int64_t ts0 = 0; ts0 < ntok; ts0 += kTs) {
    const int64_t nts = std::min(kTs, ntok - ts0), tblocks = (nts + kToks - 1) / kToks;
    auto block_panel = [&](int64_t chunk, int64_t tb) {
      return packed.data() + (chunk * max_blocks + tb) * kToks * kKc;
    };
    for (int64_t chunk = 0; chunk < kchunks; ++chunk)
      for (int64_t tb = 0; tb < tblocks; ++tb)
        gemm_pack_tokens(x + ts0 * in, in, tb * kToks, nts, chunk * kKc,
                         std::min(kKc, in - chunk * kKc), block_panel(chunk, tb));
    for (int64_t n0 = 0; n0 < out; n0 += kNc) {
      const int64_t nr = std::min(kNc, out - n0);
      const int64_t tiles = (nr + kRows - 1) / kRows;
      for (int64_t chunk = 0; chunk < kchunks; ++chunk) {
        const int64_t k0 = chunk * kKc, kc = std::min(kKc, in - k0);
        for (int64_t tile = 0; tile < tiles; ++tile) {  // decode 16 rows, then transpose them
          for (int64_t r = 0; r < kRows; ++r) {
            const int64_t n = tile * kRows + r;
            float* dst = rows16 + r * kKc;
            if (n >= nr) {  // padding rows of the last micro-panel
              std::fill(dst, dst + kc, 0.0f);
              continue;
            }
            decode(n0 + n, k0, kc, dst);
            if (n + 2 < nr) prefetch_row(n0 + n + 2, k0, kc);  // a separate stream per row
          }
          transpose_to_panel(rows16, kc, panel + tile * kRows * kKc);
        }
        for (int64_t tb = 0; tb < tblocks; ++tb) {
          const int64_t nt = std::min<int64_t>(kToks, nts - tb * kToks);
          for (int64_t tile = 0; tile < tiles; ++tile) {
            gemm_micro_16x6(panel + tile * kRows * kKc, kRows, block_panel(chunk, tb), kc, c);
            gemm_store_tile(c, nt, std::min<int64_t>(kRows, nr - tile * kRows), chunk > 0,
                            y + (ts0 + tb * kToks) * ldy + n0 + tile * kRows, ldy);
          }
        }
      }
    }
  }
}

// Prefetches n bytes from p into L2, one line at a time.
inline void prefetch_bytes(const void* p, int64_t n) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < n; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}

void fp8_gemm_simd(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                   int64_t ntok, float* y, int64_t ldy) {
  const int64_t sin = (in + 31) / 32;
  auto prefetch = [&](int64_t n, int64_t k0, int64_t kc) { prefetch_bytes(w + n * in + k0, kc); };
  gemm_rows(
      out, in, x, ntok, y, ldy,
      [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        const uint8_t* r = w + n * in;
        const uint8_t* sr = scale + (n / 32) * sin;
        for (int64_t b = 0; b < kc; b += 32)
          fp8_block_f16(r + k0 + b, e8m0_scalar(sr[(k0 + b) / 32]), dst + b,
                        std::min<int64_t>(32, kc - b));
      },
      prefetch);
}

void bf16_gemm_simd(const uint16_t* w, int64_t out, int64_t in, const float* x, int64_t ntok,
                    float* y, int64_t ldy) {
  auto prefetch = [&](int64_t n, int64_t k0, int64_t kc) {
    prefetch_bytes(w + n * in + k0, 2 * kc);
  };
  gemm_rows(
      out, in, x, ntok, y, ldy,
      [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        const uint16_t* r = w + n * in + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
          const __m256i v =
              _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + k)));
          _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; k < kc; ++k) {
          const uint32_t bits = uint32_t(r[k]) << 16;
          std::memcpy(dst + k, &bits, 4);
        }
      },
      prefetch);
}

void mxfp4_gemm_simd(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                     const float* x, int64_t ntok, float* y, int64_t ldy) {
  auto prefetch = [&](int64_t n, int64_t k0, int64_t kc) {
    prefetch_bytes(w + n * (in / 2) + k0 / 2, kc / 2);
  };
  gemm_rows(
      out, in, x, ntok, y, ldy,
      [&](int64_t n, int64_t k0, int64_t kc, float* dst) {
        const uint8_t* r = w + n * (in / 2);
        const uint8_t* sr = scale + n * (in / 32);
        for (int64_t b = 0; b < kc; b += 32)
          fp4_block_f32(r + (k0 + b) / 2, e8m0_scalar(sr[(k0 + b) / 32]), dst + b);
      },
      prefetch);
}

// Gate/up for any number of tokens: up to kMaxDecodeTokens the decode kernel; beyond, the grouped
// prefill variant: the GEMM over 96 interleaved rows (48 gate/up pairs) at a time into a
// thread-local buffer [ntok][96], then the clamp epilogue.
template <typename S, bool kInt16 = true>
void mxfp4_gate_up_any(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                       const float* x, const float* route, int64_t ntok, float limit, float* h) {
  if (ntok == 1)
    return mxfp4_gate_up_impl<S, kInt16>(w13, s13, inter, dim, x, route, ntok, limit, h);
  if (ntok <= kMaxDecodeTokens) {  // several tokens: the tiled GEMV over 96 rows at a time
    // (the GEMM's 6-token blocks measured slower at 16 tokens than these 4-row x 2-token tiles)
    constexpr int64_t kPairs = kNc / 2;
    float gu[kMaxDecodeTokens * kNc];
    for (int64_t j0 = 0; j0 < inter; j0 += kPairs) {
      const int64_t jn = std::min(kPairs, inter - j0);
      mxfp4_gemv_impl<S>(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, x, ntok,
                         gu);
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t j = 0; j < jn; ++j) {
          const float gc = std::min(gu[t * 2 * jn + 2 * j], limit);
          const float uc = std::clamp(gu[t * 2 * jn + 2 * j + 1], -limit, limit);
          h[t * inter + j0 + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
        }
    }
    return;
  }
  thread_local std::vector<float> gu;
  constexpr int64_t kPairs = kNc / 2;  // one decoded panel
  if (gu.size() < std::size_t(ntok * 2 * kPairs)) gu.resize(std::size_t(ntok * 2 * kPairs));
  for (int64_t j0 = 0; j0 < inter; j0 += kPairs) {
    const int64_t jn = std::min(kPairs, inter - j0);
    mxfp4_gemm_simd(w13 + 2 * j0 * (dim / 2), s13 + 2 * j0 * (dim / 32), 2 * jn, dim, x, ntok,
                    gu.data(), 2 * jn);
    for (int64_t t = 0; t < ntok; ++t)
      for (int64_t j = 0; j < jn; ++j) {
        const float gc = std::min(gu[std::size_t(t * 2 * jn + 2 * j)], limit);
        const float uc = std::clamp(gu[std::size_t(t * 2 * jn + 2 * j + 1)], -limit, limit);
        h[t * inter + j0 + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
      }
  }
}

}  // namespace
}  // namespace dsv41::ops
