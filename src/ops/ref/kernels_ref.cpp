// Scalar reference of every kernel (the `scalar` tier): plain loops, double accumulation, exact
// dequantization through core/dtypes. Written to be obviously right; SIMD tiers are tested against
// it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/dtypes.h"
#include "ops/cache_pack.h"
#include "ops/kernels.h"
#include "ops/select.h"

namespace dsv41::ops {
namespace {

void fp8_gemm(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
              int64_t ntok, float* y, int64_t ldy) {
  const int64_t sin = (in + 31) / 32;
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i)
        acc += double(e4m3_to_float(w[o * in + i])) *
               e8m0_to_double(scale[(o / 32) * sin + i / 32]) * x[t * in + i];
      y[t * ldy + o] = float(acc);
    }
}

void fp8_gemv(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
              int64_t ntok, float* y) {
  fp8_gemm(w, scale, out, in, x, ntok, y, out);
}

void bf16_gemm(const uint16_t* w, int64_t out, int64_t in, const float* x, int64_t ntok, float* y,
               int64_t ldy) {
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(bf16_to_float(w[o * in + i])) * x[t * in + i];
      y[t * ldy + o] = float(acc);
    }
}

void bf16_gemv(const uint16_t* w, int64_t out, int64_t in, const float* x, float* y) {
  bf16_gemm(w, out, in, x, 1, y, out);
}

void bf16_gemv_batch(const uint16_t* w, int64_t out, int64_t in, const float* x, int64_t ntok,
                     float* y, int64_t ldy) {
  bf16_gemm(w, out, in, x, ntok, y, ldy);  // tokens are independent in the scalar tier
}

double mxfp4_dot(const uint8_t* row, const uint8_t* srow, int64_t in, const float* x) {
  double acc = 0;
  for (int64_t i = 0; i < in; ++i)
    acc += double(e2m1_to_float(e2m1_nibble(row, std::size_t(i)))) * e8m0_to_double(srow[i / 32]) *
           x[i];
  return acc;
}

void mxfp4_gemm(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                int64_t ntok, float* y, int64_t ldy) {
  const int64_t sin = in / 32;
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < out; ++o)
      y[t * ldy + o] = float(mxfp4_dot(w + o * (in / 2), scale + o * sin, in, x + t * in));
}

void mxfp4_gemv(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                int64_t ntok, float* y) {
  mxfp4_gemm(w, scale, out, in, x, ntok, y, out);
}

void mxfp4_gate_up(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                   const float* x, const float* route, int64_t ntok, float limit, float* h) {
  const int64_t rb = dim / 2, sb = dim / 32;
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t j = 0; j < inter; ++j) {
      const double g = mxfp4_dot(w13 + (2 * j) * rb, s13 + (2 * j) * sb, dim, x + t * dim);
      const double u = mxfp4_dot(w13 + (2 * j + 1) * rb, s13 + (2 * j + 1) * sb, dim, x + t * dim);
      const double gc = std::min(g, double(limit));
      const double uc = std::clamp(u, -double(limit), double(limit));
      h[t * inter + j] = float(gc / (1 + std::exp(-gc)) * uc * route[t]);
    }
}

// The scalar tier's batch entries: every token alone through the one-token functions.
void fp8_gemv_batch(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                    int64_t ntok, float* y, int64_t ldy) {
  fp8_gemm(w, scale, out, in, x, ntok, y, ldy);
}

void mxfp4_gemv_batch(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                      const float* x, int64_t ntok, float* y, int64_t ldy) {
  mxfp4_gemm(w, scale, out, in, x, ntok, y, ldy);
}

void mxfp4_gate_up_batch(const uint8_t* w13, const uint8_t* s13, int64_t inter, int64_t dim,
                         const float* x, const float* route, int64_t ntok, float limit, float* h,
                         int64_t ldh) {
  for (int64_t t = 0; t < ntok; ++t)
    mxfp4_gate_up(w13, s13, inter, dim, x + t * dim, route + t, 1, limit, h + t * ldh);
}

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  const double r = 1 / std::sqrt(s / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = float(w[i] * (x[i] * r));
}

float read_sum(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return float(s);
}

void rope(float* v, int64_t n, int64_t dim, const float* cos, const float* sin, bool inverse) {
  float* x = v + (n - dim);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float c = cos[i], s = inverse ? -sin[i] : sin[i];
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

// The reference's loop: unpack both sides to floats, dot left to right, ReLU, weight, sum over
// heads.
void indexer_scores(const uint8_t* q, const float* w, int64_t nh, int64_t di, const uint8_t* keys,
                    int64_t nkeys, float* scores) {
  const int64_t row = index_key_bytes(di);
  std::vector<float> qf(static_cast<std::size_t>(nh * di)), kf(static_cast<std::size_t>(di));
  for (int64_t h = 0; h < nh; ++h) unpack_index_key(q + h * row, di, qf.data() + h * di);
  for (int64_t j = 0; j < nkeys; ++j) {
    unpack_index_key(keys + j * row, di, kf.data());
    float acc = 0;
    for (int64_t h = 0; h < nh; ++h) {
      float d = 0;
      for (int64_t i = 0; i < di; ++i)
        d += qf[static_cast<std::size_t>(h * di + i)] * kf[static_cast<std::size_t>(i)];
      acc += std::max(d, 0.0f) * w[h];
    }
    scores[j] = acc;
  }
}

// The reference's two passes (max, then exponentials and the weighted sum), per head.
void sparse_attention(const float* q, int64_t heads, int64_t dim, const uint8_t* const* rows,
                      const uint8_t* kinds, int64_t nrows, float scale, const float* sink,
                      float* out) {
  std::vector<float> v(static_cast<std::size_t>(nrows * dim)), z(static_cast<std::size_t>(nrows));
  for (int64_t r = 0; r < nrows; ++r) {
    float* dst = v.data() + r * dim;
    if (kinds[r] == 0)
      unpack_window_row(rows[r], dim, dst);
    else
      unpack_compressed_row(rows[r], dim, dst);
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* o = out + h * dim;
    std::fill(o, o + dim, 0.0f);
    if (nrows == 0) continue;
    const float* qh = q + h * dim;
    float mx = -INFINITY;
    for (int64_t r = 0; r < nrows; ++r) {
      double d = 0;
      for (int64_t i = 0; i < dim; ++i)
        d += double(qh[i]) * v[static_cast<std::size_t>(r * dim + i)];
      z[static_cast<std::size_t>(r)] = float(d) * scale;
      mx = std::max(mx, z[static_cast<std::size_t>(r)]);
    }
    double den = std::exp(double(sink[h]) - mx);
    std::vector<double> acc(static_cast<std::size_t>(dim), 0.0);
    for (int64_t r = 0; r < nrows; ++r) {
      const double p = std::exp(double(z[static_cast<std::size_t>(r)]) - mx);
      den += p;
      for (int64_t i = 0; i < dim; ++i)
        acc[static_cast<std::size_t>(i)] += p * v[static_cast<std::size_t>(r * dim + i)];
    }
    for (int64_t i = 0; i < dim; ++i) o[i] = float(acc[static_cast<std::size_t>(i)] / den);
  }
}

void hc_mix(const float* h, int64_t hc, int64_t d, const float* fn, const float* base,
            const float* scale, float norm_eps, float hc_eps, int64_t iters, float* pre,
            float* post, float* comb) {
  const int64_t n = hc * d, mix = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(h[i]) * h[i];
  const double r = 1 / std::sqrt(ss / double(n) + norm_eps);
  std::vector<float> m(static_cast<std::size_t>(mix));
  for (int64_t row = 0; row < mix; ++row) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += double(fn[row * n + i]) * h[i];
    m[static_cast<std::size_t>(row)] = float(acc * r);
  }
  hc_sinkhorn_ref(m.data(), base, scale, hc, hc_eps, iters, pre, post, comb);
}

// The collapse in float exactly as the model reference (0 + w0 h0 + ...), then rmsnorm (double).
void hc_collapse_rmsnorm(const float* h, const float* w, int64_t hc, int64_t d, const float* norm_w,
                         float eps, float* x) {
  for (int64_t i = 0; i < d; ++i) {
    float s = 0;
    for (int64_t j = 0; j < hc; ++j) s += w[j] * h[j * d + i];
    x[i] = s;
  }
  rmsnorm(x, norm_w, d, eps, x);
}

// In float exactly as the model reference's expand.
void hc_expand(const float* y, const float* res, const float* post, const float* comb, int64_t hc,
               int64_t d, float* out) {
  for (int64_t k = 0; k < hc; ++k)
    for (int64_t i = 0; i < d; ++i) {
      float s = post[k] * y[i];
      for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k] * res[j * d + i];
      out[k * d + i] = s;
    }
}

// Per query, the one-query reference on the row list the band and the query's compressed rows make.
void prefill_attention(const float* q, int64_t nq, int64_t heads, int64_t dim, const uint8_t* win,
                       int64_t wpos0, int64_t nwin, int64_t p0, int64_t window,
                       const uint8_t* const* comp, const int64_t* cofs, float scale,
                       const float* sink, float* out) {
  const int64_t wb = window_row_bytes(dim);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = p0 + i, lo = std::max<int64_t>(0, p - window + 1);
    DSV41_CHECK(lo >= wpos0 && p < wpos0 + nwin);
    std::vector<const uint8_t*> rows;
    std::vector<uint8_t> kinds;
    for (int64_t k = lo; k <= p; ++k) rows.push_back(win + (k - wpos0) * wb), kinds.push_back(0);
    for (int64_t c = cofs[i]; c < cofs[i + 1]; ++c) rows.push_back(comp[c]), kinds.push_back(1);
    sparse_attention(q + i * heads * dim, heads, dim, rows.data(), kinds.data(),
                     int64_t(rows.size()), scale, sink, out + i * heads * dim);
  }
}

// Per head and query, the plain two-pass softmax in double: the scores, their maximum subtracted,
// exp, the weighted sum of the value rows divided by the sum of the weights.
void vision_attention(const float* q, const float* k, const float* v, int64_t ld, int64_t nq,
                      int64_t nk, int64_t heads, int64_t dim, float scale, float* out,
                      int64_t ldo) {
  std::vector<double> s(static_cast<std::size_t>(nk)), acc(static_cast<std::size_t>(dim));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = q + i * ld + h * dim;
      double mx = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        const float* kj = k + j * ld + h * dim;
        double d = 0;
        for (int64_t e = 0; e < dim; ++e) d += double(qi[e]) * kj[e];
        s[std::size_t(j)] = d * scale;
        mx = std::max(mx, s[std::size_t(j)]);
      }
      double den = 0;
      for (int64_t j = 0; j < nk; ++j)
        den += (s[std::size_t(j)] = std::exp(s[std::size_t(j)] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < nk; ++j) {
        const float* vj = v + j * ld + h * dim;
        for (int64_t e = 0; e < dim; ++e) acc[std::size_t(e)] += s[std::size_t(j)] * vj[e];
      }
      float* o = out + i * ldo + h * dim;
      for (int64_t e = 0; e < dim; ++e) o[e] = nk > 0 ? float(acc[std::size_t(e)] / den) : 0.0f;
    }
}

}  // namespace

extern const Kernels kScalarKernels = {
    Isa::kScalar, fp8_gemv, mxfp4_gemv, mxfp4_gate_up, rmsnorm, read_sum, rope, indexer_scores,
    sparse_attention, hc_sinkhorn_ref, fp8_gemm, bf16_gemm, mxfp4_gemm, hc_mix, hc_collapse_rmsnorm,
    hc_expand, prefill_attention, pack_window_row, unpack_window_row, pack_compressed_row,
    unpack_compressed_row, pack_index_key, unpack_index_key, mxfp4_gemv, mxfp4_gate_up, bf16_gemv,
    fp8_gemv_batch, bf16_gemv_batch, mxfp4_gemv_batch, mxfp4_gate_up_batch, fake_fp8_pow2_row,
    // no act-quant GEMMs: the scalar FP8/MXFP4 GEMVs above
    // are their reference (exact sums in double)
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    // nor the GEMMs for fp32 activations (fp8_gemv and mxfp4_gemv above are their references too)
    nullptr, nullptr, nullptr, nullptr, nullptr, vision_attention};

}  // namespace dsv41::ops
