// Full (non-causal) attention of the vision tower (Kernels::vision_attention, spec §9.1) for the
// SIMD tiers: one body templated on a vector policy V (VaYmm below, 8 lanes, for every SIMD tier's
// 256-bit code; the AVX-512 tiers' 16-lane VaZmm in ops/avx512/avx512_vision_attention.h), with
// internal linkage like the other shared bodies.
//
// Flash-attention style, fp32 throughout: per head, the keys are packed once per call into
// thread-local scratch (grown once, never shrunk): K transposed per block of kVaKeys keys
// ([block][dim][kVaKeys], so the scores of a tile are a small GEMM that broadcasts query values and
// loads key vectors) and V row-major with its dims zero-padded to the tile width ([key][dimp]);
// keys past nk are zero. Queries go in blocks of kVaQueries whose running state (max m, the sum l
// as V::kW lane partial sums, the unnormalised output O[dimp]) stays in L1; for each key block,
// every register tile of kVaTile queries of the block: scores S = Q K^T (kVaTile x kVaKeys), the
// online-softmax update, O = O * corr + P V.
//
// Reduction order of one query row and head (fixed: it depends on nk, never on nq, on where the
// row sits in a tile or block, or on the number of threads; a tile's short tail repeats its last
// query, whose slots compute the same thing and are dropped):
//   score s_j = fma chain over d = 0 .. dim-1 from 0 (one vector lane per key), t_j = s_j * scale;
//   key blocks of kVaKeys in ascending order from key 0 (the last one padded: its missing keys'
//   scores are -inf and their p exactly 0, so they change nothing);
//   per block: m_new = max(m, max_j t_j) (exact), corr = exp(m - m_new) (std::exp; 0 on the first
//   block, where m = -inf), p_j = exp(s_j * scale - m_new) with one rounding for the fma (the
//   policy's polynomial exp, within ~2 ulp), l lanes *= corr, then += each kW-key vector of p in
//   key order (lane r sums the keys = r mod kW); O[d] = O[d] * corr, then += p_j v_j[d] for j in
//   ascending order (one fma chain per dim);
//   at the end out[d] = O[d] / l with l = V::hsum of the lanes (a fixed tree).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/simd_common.h"

namespace dsv41::ops {
namespace {

constexpr int64_t kVaKeys = 64;     // keys per block: K^T and V blocks of 16 KB each at dim 64
constexpr int64_t kVaQueries = 64;  // queries per block: their O state is 16 KB at dim 64
constexpr int kVaTile = 4;          // queries per register tile

// e^x for x <= 0 on vectors (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial,
// times 2^n). x is clamped at -87.33654 (e^x = 2^-126, the least normal float): anything smaller
// gives ~1.2e-38 instead of less, which no softmax sum can see; -inf gives the same.
constexpr float kExpLo = -87.33654f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f, kExpP1 = 1.3981999507e-3f, kExpP2 = 8.3334519073e-3f,
                kExpP3 = 4.1665795894e-2f, kExpP4 = 1.6666665459e-1f, kExpP5 = 5.0000001201e-1f;

// The 8-lane policy (AVX2 + FMA): 2 x 8 keys per score tile, 2 x 8 dims per output tile (8
// accumulators each, within the 16 ymm registers).
struct VaYmm {
  using T = __m256;
  static constexpr int kW = 8, kKeyVecs = 2, kDimVecs = 2;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static float hsum(T x) { return hsum256(x); }
  static float hmax(T x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static T exp(T x) {
    x = _mm256_max_ps(x, set1(kExpLo));
    const T n =
        _mm256_round_ps(mul(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = fma(n, set1(-kLn2Hi), x);
    r = fma(n, set1(-kLn2Lo), r);
    T y = set1(kExpP0);
    y = fma(y, r, set1(kExpP1));
    y = fma(y, r, set1(kExpP2));
    y = fma(y, r, set1(kExpP3));
    y = fma(y, r, set1(kExpP4));
    y = fma(y, r, set1(kExpP5));
    y = add(fma(y, mul(r, r), r), set1(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);  // 2^n, n >= -126
    return mul(y, _mm256_castsi256_ps(e));
  }
};

// st[i * kVaKeys + j] = q_i . k_j for the tile's queries and the block's keys, kt = [dim][kVaKeys].
template <typename V>
inline void va_scores(const float* const* qrow, const float* kt, int64_t dim, float* st) {
  using T = typename V::T;
  for (int64_t c = 0; c < kVaKeys; c += V::kKeyVecs * V::kW) {
    T acc[kVaTile][V::kKeyVecs];
    for (auto& a : acc)
      for (auto& x : a) x = V::zero();
    for (int64_t d = 0; d < dim; ++d) {
      T b[V::kKeyVecs];
      for (int kv = 0; kv < V::kKeyVecs; ++kv) b[kv] = V::load(kt + d * kVaKeys + c + kv * V::kW);
#pragma GCC unroll 4
      for (int i = 0; i < kVaTile; ++i) {
        const T a = V::set1(qrow[i][d]);
        for (int kv = 0; kv < V::kKeyVecs; ++kv) acc[i][kv] = V::fma(a, b[kv], acc[i][kv]);
      }
    }
    for (int i = 0; i < kVaTile; ++i)
      for (int kv = 0; kv < V::kKeyVecs; ++kv)
        V::store(st + i * kVaKeys + c + kv * V::kW, acc[i][kv]);
  }
}

// The online-softmax step of one tile over one key block (`valid` real keys): scores in st become
// the block's p; m, the l lanes (lv, kW per query) and corr (per query) are updated / set.
template <typename V>
inline void va_softmax(float* st, int64_t valid, float scale, float* m, float* lv, float* corr) {
  using T = typename V::T;
  for (int i = 0; i < kVaTile; ++i) {
    float* s = st + i * kVaKeys;
    for (int64_t j = valid; j < kVaKeys; ++j) s[j] = -INFINITY;
    T mx = V::load(s);
    for (int64_t c = V::kW; c < kVaKeys; c += V::kW) mx = V::max(mx, V::load(s + c));
    const float mnew = std::max(m[i], V::hmax(mx) * scale);
    corr[i] = std::exp(m[i] - mnew);
    m[i] = mnew;
    const T sc = V::set1(scale), negm = V::set1(-mnew);
    for (int64_t c = 0; c < kVaKeys; c += V::kW)
      V::store(s + c, V::exp(V::fma(V::load(s + c), sc, negm)));
    for (int64_t j = valid; j < kVaKeys; ++j) s[j] = 0.0f;
    T l = V::mul(V::load(lv + i * V::kW), V::set1(corr[i]));
    for (int64_t c = 0; c < kVaKeys; c += V::kW) l = V::add(l, V::load(s + c));
    V::store(lv + i * V::kW, l);
  }
}

// o[i] = o[i] * corr[i] + sum_j p[i][j] v_j over the block's keys (vp = [kVaKeys][dimp]).
template <typename V>
inline void va_accumulate(const float* st, const float* corr, const float* vp, int64_t dimp,
                          float* o) {
  using T = typename V::T;
  for (int64_t c = 0; c < dimp; c += V::kDimVecs * V::kW) {
    T acc[kVaTile][V::kDimVecs];
    for (int i = 0; i < kVaTile; ++i) {
      const T cv = V::set1(corr[i]);
      for (int dv = 0; dv < V::kDimVecs; ++dv)
        acc[i][dv] = V::mul(V::load(o + i * dimp + c + dv * V::kW), cv);
    }
    for (int64_t j = 0; j < kVaKeys; ++j) {
      T b[V::kDimVecs];
      for (int dv = 0; dv < V::kDimVecs; ++dv) b[dv] = V::load(vp + j * dimp + c + dv * V::kW);
#pragma GCC unroll 4
      for (int i = 0; i < kVaTile; ++i) {
        const T a = V::set1(st[i * kVaKeys + j]);
        for (int dv = 0; dv < V::kDimVecs; ++dv) acc[i][dv] = V::fma(a, b[dv], acc[i][dv]);
      }
    }
    for (int i = 0; i < kVaTile; ++i)
      for (int dv = 0; dv < V::kDimVecs; ++dv) V::store(o + i * dimp + c + dv * V::kW, acc[i][dv]);
  }
}

// Packs head h's keys (K^T per block) and values (dims padded to dimp) into kt and vp.
inline void va_pack(const float* k, const float* v, int64_t ld, int64_t nk, int64_t dim,
                    int64_t dimp, int64_t nkb, float* kt, float* vp) {
  std::fill(kt, kt + nkb * kVaKeys * dim, 0.0f);
  std::fill(vp, vp + nkb * kVaKeys * dimp, 0.0f);
  for (int64_t j = 0; j < nk; ++j) {
    const float* kr = k + j * ld;
    float* col = kt + (j / kVaKeys) * dim * kVaKeys + j % kVaKeys;
    for (int64_t d = 0; d < dim; ++d) col[d * kVaKeys] = kr[d];
    std::memcpy(vp + j * dimp, v + j * ld, std::size_t(dim) * sizeof(float));
  }
}

// Kernels::vision_attention (see the file comment).
template <typename V>
void vision_attention_simd(const float* q, const float* k, const float* v, int64_t ld, int64_t nq,
                           int64_t nk, int64_t heads, int64_t dim, float scale, float* out,
                           int64_t ldo) {
  if (nq <= 0) return;
  if (nk <= 0) {
    for (int64_t i = 0; i < nq; ++i) std::fill(out + i * ldo, out + i * ldo + heads * dim, 0.0f);
    return;
  }
  constexpr int64_t kDimStep = V::kDimVecs * V::kW;
  const int64_t nkb = (nk + kVaKeys - 1) / kVaKeys,
                dimp = (dim + kDimStep - 1) / kDimStep * kDimStep;
  thread_local std::vector<float> kt, vp, o, lv, st;
  auto grow = [](std::vector<float>& b, int64_t n) {
    if (int64_t(b.size()) < n) b.resize(std::size_t(n));
  };
  grow(kt, nkb * kVaKeys * dim);
  grow(vp, nkb * kVaKeys * dimp);
  grow(o, kVaQueries * dimp);
  grow(lv, kVaQueries * V::kW);
  grow(st, kVaTile * kVaKeys);
  float m[kVaQueries], corr[kVaTile];
  for (int64_t h = 0; h < heads; ++h) {
    va_pack(k + h * dim, v + h * dim, ld, nk, dim, dimp, nkb, kt.data(), vp.data());
    for (int64_t q0 = 0; q0 < nq; q0 += kVaQueries) {
      const int64_t nqb = std::min(kVaQueries, nq - q0);
      const int64_t ntiles = (nqb + kVaTile - 1) / kVaTile;
      std::fill(m, m + kVaQueries, -INFINITY);
      std::fill(lv.data(), lv.data() + kVaQueries * V::kW, 0.0f);
      std::fill(o.data(), o.data() + kVaQueries * dimp, 0.0f);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t valid = std::min(kVaKeys, nk - kb * kVaKeys);
        for (int64_t t = 0; t < ntiles; ++t) {
          const float* qrow[kVaTile];
          for (int i = 0; i < kVaTile; ++i)
            qrow[i] = q + std::min(q0 + t * kVaTile + i, nq - 1) * ld + h * dim;
          va_scores<V>(qrow, kt.data() + kb * dim * kVaKeys, dim, st.data());
          va_softmax<V>(st.data(), valid, scale, m + t * kVaTile, lv.data() + t * kVaTile * V::kW,
                        corr);
          va_accumulate<V>(st.data(), corr, vp.data() + kb * kVaKeys * dimp, dimp,
                           o.data() + t * kVaTile * dimp);
        }
      }
      for (int64_t i = 0; i < nqb; ++i) {
        const float l = V::hsum(V::load(lv.data() + i * V::kW));
        float* dst = out + (q0 + i) * ldo + h * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = o[std::size_t(i * dimp + d)] / l;
      }
    }
  }
}

}  // namespace
}  // namespace dsv41::ops
