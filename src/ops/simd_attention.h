// Sparse attention kernels of the SIMD tiers (decode: one query; prefill: a banded window plus
// per-query compressed rows), shared by both tiers with internal linkage (as ops/simd_common.h).
//
// One query, all heads, over nrows rows that serve as keys and values at once (MQA). The rows are
// unpacked once into a thread-local fp32 matrix R stored in strips of 16 dims, R[d / 16][r][d % 16]
// (prefill/decode scratch, grown once and kept; dim a multiple of 16, else the scalar tier), then
// the work is two small matrix products, the reference's two passes:
//   scores S = Q R^T [heads][nrows]: register tiles of 4 rows x 3 heads (12 accumulators, each row
//     and query vector loaded once per tile step);
//   softmax per head with the sink in the denominator (max, exp, sum, as the reference);
//   output O = P R [heads][dim]: the GEMM micro-kernel (16 output dims x 6 heads) reading R in
//   place
//     (row stride dim) against P^T packed per block of six heads.
// An earlier one-pass online softmax read and rewrote all heads' accumulators (128 KB at 64 x 512)
// for every row, which kept it at ~10 GFLOP/s.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "ops/cache_pack.h"
#include "ops/simd_common.h"
#include "ops/simd_gemm.h"

namespace dsv41::ops {
namespace {

constexpr int64_t kMaxStripDim = 2048;  // row scratch on the stack; wider rows: the scalar tier

// A violated caller contract (a programmer error): file:line and abort. Internal linkage on purpose
// (core/check.h's inline helper could be merged with a copy built for a higher tier).
[[noreturn]] inline void contract_failed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: %s\n", file, line, what);
  std::abort();
}

// Element (r, d) of the strip-major R of nrows rows.
inline int64_t strip_at(int64_t nrows, int64_t r, int64_t d) {
  return (d / kRows) * nrows * kRows + r * kRows + d % kRows;
}

// Unpacks packed row r (window FP8: kind 0, compressed FP4: kind 1) into strip-major R.
inline void unpack_to_strips(const uint8_t* row, uint8_t kind, int64_t dim, int64_t nrows,
                             int64_t r, float* R) {
  alignas(64) float tmp[kMaxStripDim];
  if (kind == 0)
    unpack_window_row_simd(row, dim, tmp);
  else
    unpack_compressed_row_simd(row, dim, tmp);
  for (int64_t d = 0; d < dim; d += kRows)
    std::memcpy(R + strip_at(nrows, r, d), tmp + d, kRows * sizeof(float));
}

// s[h * lds + r] = q_h . R_r for heads [0, heads) and rows [0, nrows), R strip-major.
inline void attn_scores(const float* q, int64_t heads, int64_t dim, const float* R, int64_t nrows,
                        float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + 4 <= nrows; r += 4) {
    int64_t h = 0;
    for (; h + 3 <= heads; h += 3) {
      const float *q0 = q + h * dim, *q1 = q0 + dim, *q2 = q1 + dim;
      __m256 acc[4][3];
      for (auto& a : acc) a[0] = a[1] = a[2] = _mm256_setzero_ps();
      for (int64_t i = 0; i < dim; i += 8) {
        const __m256 a0 = _mm256_loadu_ps(q0 + i), a1 = _mm256_loadu_ps(q1 + i),
                     a2 = _mm256_loadu_ps(q2 + i);
        const float* rp = R + strip_at(nrows, r, i);  // rows r..r+3 are 16 floats apart
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m256 v = _mm256_loadu_ps(rp + k * kRows);
          acc[k][0] = _mm256_fmadd_ps(a0, v, acc[k][0]);
          acc[k][1] = _mm256_fmadd_ps(a1, v, acc[k][1]);
          acc[k][2] = _mm256_fmadd_ps(a2, v, acc[k][2]);
        }
      }
      for (int k = 0; k < 4; ++k) {
        s[(h + 0) * lds + r + k] = hsum256(acc[k][0]);
        s[(h + 1) * lds + r + k] = hsum256(acc[k][1]);
        s[(h + 2) * lds + r + k] = hsum256(acc[k][2]);
      }
    }
    for (; h < heads; ++h)
      for (int k = 0; k < 4; ++k) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < dim; i += 8)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * dim + i),
                                _mm256_loadu_ps(R + strip_at(nrows, r + k, i)), acc);
        s[h * lds + r + k] = hsum256(acc);
      }
  }
  for (; r < nrows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < dim; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * dim + i),
                              _mm256_loadu_ps(R + strip_at(nrows, r, i)), acc);
      s[h * lds + r] = hsum256(acc);
    }
}

// Attention of one query over the unpacked strip-major rows R (see the file comment).
inline void attend_unpacked(const float* q, int64_t heads, int64_t dim, const float* R,
                            int64_t nrows, float scale, const float* sink, float* out) {
  std::fill(out, out + heads * dim, 0.0f);
  if (nrows == 0) return;
  thread_local std::vector<float> s, pt;
  s.resize(std::size_t(heads * nrows));
  attn_scores(q, heads, dim, R, nrows, s.data(), nrows);
  const int64_t hblocks = (heads + kToks - 1) / kToks;
  pt.resize(std::size_t(hblocks * nrows * kToks));
  for (int64_t h = 0; h < heads; ++h) {  // softmax: p = exp(z - max) / (sum + exp(sink - max))
    float* z = s.data() + h * nrows;
    float mx = -INFINITY;
    for (int64_t r = 0; r < nrows; ++r) mx = std::max(mx, z[r] *= scale);
    float den = std::exp(sink[h] - mx);
    for (int64_t r = 0; r < nrows; ++r) den += (z[r] = std::exp(z[r] - mx));
    const float inv = 1.0f / den;
    float* p = pt.data() + (h / kToks) * nrows * kToks + h % kToks;
    for (int64_t r = 0; r < nrows; ++r) p[r * kToks] = z[r] * inv;
  }
  for (int64_t h = heads; h < hblocks * kToks; ++h) {  // padding heads of the last block
    float* p = pt.data() + (h / kToks) * nrows * kToks + h % kToks;
    for (int64_t r = 0; r < nrows; ++r) p[r * kToks] = 0.0f;
  }
  alignas(64) float c[kRows * kToks];
  for (int64_t d0 = 0; d0 < dim; d0 += kRows)  // one strip of R (nrows x 16) for every head block
    for (int64_t hb = 0; hb < hblocks; ++hb) {
      gemm_micro_16x6(R + strip_at(nrows, 0, d0), kRows, pt.data() + hb * nrows * kToks, nrows, c);
      const int64_t nh = std::min<int64_t>(kToks, heads - hb * kToks);
      gemm_store_tile(c, nh, kRows, false, out + hb * kToks * dim + d0, dim);
    }
}

// Sparse attention (see Kernels::sparse_attention).
void sparse_attention_simd(const float* q, int64_t heads, int64_t dim, const uint8_t* const* rows,
                           const uint8_t* kinds, int64_t nrows, float scale, const float* sink,
                           float* out) {
  if (dim % kRows != 0 || dim > kMaxStripDim)
    return kernels_for(Isa::kScalar)
        .sparse_attention(q, heads, dim, rows, kinds, nrows, scale, sink, out);
  thread_local std::vector<float> R;
  R.resize(std::size_t(nrows * dim));
  for (int64_t r = 0; r < nrows; ++r) unpack_to_strips(rows[r], kinds[r], dim, nrows, r, R.data());
  attend_unpacked(q, heads, dim, R.data(), nrows, scale, sink, out);
}

// Prefill attention (see Kernels::prefill_attention): every window row of the block's bands is
// unpacked once; each query's rows (its band, then its compressed rows) are gathered from there.
void prefill_attention_simd(const float* q, int64_t nq, int64_t heads, int64_t dim,
                            const uint8_t* win, int64_t wpos0, int64_t nwin, int64_t p0,
                            int64_t window, const uint8_t* const* comp, const int64_t* cofs,
                            float scale, const float* sink, float* out) {
  if (nq <= 0) return;
  const int64_t lo_all = std::max<int64_t>(0, p0 - window + 1), hi_all = p0 + nq - 1;
  if (lo_all < wpos0 || hi_all >= wpos0 + nwin)
    contract_failed(__FILE__, __LINE__, "the window rows do not cover every query's band");
  if (dim % kRows != 0 || dim > kMaxStripDim)
    return kernels_for(Isa::kScalar)
        .prefill_attention(q, nq, heads, dim, win, wpos0, nwin, p0, window, comp, cofs, scale, sink,
                           out);
  thread_local std::vector<float> band, R;
  band.resize(std::size_t((hi_all - lo_all + 1) * dim));
  const int64_t wb = window_row_bytes(dim);
  for (int64_t k = lo_all; k <= hi_all; ++k)
    unpack_window_row_simd(win + (k - wpos0) * wb, dim, band.data() + (k - lo_all) * dim);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = p0 + i, lo = std::max<int64_t>(0, p - window + 1), nband = p - lo + 1;
    const int64_t c0 = cofs[i], ncomp = cofs[i + 1] - c0, n = nband + ncomp;
    R.resize(std::size_t(n * dim));
    for (int64_t r = 0; r < nband; ++r)  // the band's rows, unpacked once for the whole block
      for (int64_t d = 0; d < dim; d += kRows)
        std::memcpy(R.data() + strip_at(n, r, d), band.data() + (lo - lo_all + r) * dim + d,
                    kRows * sizeof(float));
    for (int64_t c = 0; c < ncomp; ++c)
      unpack_to_strips(comp[c0 + c], 1, dim, n, nband + c, R.data());
    attend_unpacked(q + i * heads * dim, heads, dim, R.data(), n, scale, sink,
                    out + i * heads * dim);
  }
}

}  // namespace
}  // namespace dsv41::ops
