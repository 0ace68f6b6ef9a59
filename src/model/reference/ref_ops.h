// Scalar building blocks of the reference forward (spec §3.4, §5), templated on the scalar type T
// (float for everyday use, double for exactness checks). Every arithmetic step, including
// fake-quant scale computations and RoPE angles, is carried out in T; written to be read, not fast.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/dtypes.h"

namespace dsv41::ref {

// Row-major matrix [rows, cols] held in T (tests and small helpers; model weights are WeightViews).
template <typename T>
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<T> v;
  const T* row(int64_t r) const { return v.data() + r * cols; }
  bool empty() const { return v.empty(); }
};

// y[r] = sum_c W[r, c] x[c] for rows [r0, r0 + n) (n = -1: all rows); summed left to right in T.
template <typename T>
void matvec(const Mat<T>& w, const T* x, T* y, int64_t r0 = 0, int64_t n = -1) {
  if (n < 0) n = w.rows - r0;
  for (int64_t r = 0; r < n; ++r) {
    const T* wr = w.row(r0 + r);
    T s = 0;
    for (int64_t c = 0; c < w.cols; ++c) s += wr[c] * x[c];
    y[r] = s;
  }
}

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
T silu(T x) {
  return x * sigmoid(x);
}

// torch.nn.functional.softplus with its default threshold (x > 20 returns x).
template <typename T>
T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

// 1 / sqrt(mean(x^2) + eps).
template <typename T>
T rms_inv(const T* x, int64_t n, T eps) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return T(1) / std::sqrt(s / T(n) + eps);
}

// y = w * (x / rms(x)); y may alias x.
template <typename T>
void rmsnorm(const T* x, const T* w, int64_t n, T eps, T* y) {
  const T r = rms_inv(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// Smallest power of two >= x (x > 0): 2^ceil(log2 x), decided exactly from the binary exponent.
template <typename T>
T pow2_ceil(T x) {
  int e;
  const T m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == T(0.5) ? std::ldexp(T(1), e - 1) : std::ldexp(T(1), e);
}

template <typename T>
T clamp(T x, T lo, T hi) {
  return std::min(std::max(x, lo), hi);
}

// ---- trained KV-cache fake-quantizations (spec §3.4), in place ----

// What a traced fake-quantization decided, for flip reports: per element the chosen code and the
// scaled value it rounded (x / s, before rounding), per block the scale.
struct QuantTrace {
  std::vector<int64_t> codes;  // element codes, then one scale value code per block (appended)
  std::vector<double> scaled;  // x / s per element
  std::vector<double> scales;  // s per block
};

// Shared loop of the three fake-quantizations: per block, amax -> scale s (scale_of), then each
// value becomes dec(enc(clamp(x / s, -limit, limit))) * s.
template <typename T, typename Scale, typename Enc, typename Dec>
void fake_quant_blocks(T* x, int64_t n, int64_t block, T limit, Scale scale_of, Enc enc, Dec dec,
                       QuantTrace* tr) {
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = std::min(n, b + block);
    T amax = 0;
    for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const T s = scale_of(amax);
    for (int64_t i = b; i < e; ++i) {
      const T v = clamp(x[i] / s, -limit, limit);
      const uint8_t code = enc(double(v));
      if (tr) tr->codes.push_back(code), tr->scaled.push_back(double(v));
      x[i] = T(dec(code)) * s;
    }
    if (tr) tr->scales.push_back(double(s));
  }
}

// Window KV: FP8 E4M3, one power-of-two scale per 32 values: s = 2^ceil(log2(max(amax, 1e-4) /
// 448)).
template <typename T>
void fake_fp8_pow2(T* x, int64_t n, int64_t block = 32, QuantTrace* tr = nullptr) {
  fake_quant_blocks(
      x, n, block, T(448),
      [](T amax) { return pow2_ceil(std::max(amax, T(1e-4)) * (T(1) / T(448))); }, e4m3_from_double,
      e4m3_to_float, tr);
}

// Compressed KV: E2M1 with one E4M3 scale per 16 values: s = e4m3(max(amax, 6 * 2^-9) / 6).
template <typename T>
void fake_fp4_e4m3(T* x, int64_t n, int64_t block = 16, QuantTrace* tr = nullptr) {
  fake_quant_blocks(
      x, n, block, T(6),
      [](T amax) {
        return T(e4m3_to_float(
            e4m3_from_double(double(std::max(amax, T(6) * std::ldexp(T(1), -9)) / T(6)))));
      },
      e2m1_from_double, e2m1_to_float, tr);
}

// Indexer keys and queries: E2M1 with one power-of-two scale per 32:
// s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)).
template <typename T>
void fake_fp4_pow2(T* x, int64_t n, int64_t block = 32, QuantTrace* tr = nullptr) {
  fake_quant_blocks(
      x, n, block, T(6),
      [](T amax) {
        return pow2_ceil(std::max(amax, T(6) * std::ldexp(T(1), -126)) * (T(1) / T(6)));
      },
      e2m1_from_double, e2m1_to_float, tr);
}

// ---- RoPE (spec §5.5): interleaved pairs on the last rope_dim values of a vector ----

template <typename T>
struct Rope {
  int64_t dim = 0;      // rotary dims (even)
  std::vector<T> freq;  // dim / 2 inverse frequencies, in T

  // base^(-2i/dim), optionally YaRN-blended: f <- f/factor * ramp + f * (1 - ramp).
  static Rope make(int64_t dim, double base, bool yarn, double factor, double orig,
                   double beta_fast, double beta_slow) {
    Rope r;
    r.dim = dim;
    const T b = T(base);
    for (int64_t i = 0; i < dim / 2; ++i) r.freq.push_back(T(1) / std::pow(b, T(2 * i) / T(dim)));
    if (yarn) {
      const T pi = T(3.14159265358979323846264338327950288L);
      auto corr = [&](T rot) {
        return T(dim) * std::log(T(orig) / (T(2) * pi * rot)) / (T(2) * std::log(b));
      };
      const T low = std::max(std::floor(corr(T(beta_fast))), T(0));
      const T high = std::min(std::ceil(corr(T(beta_slow))), T(dim - 1));
      for (int64_t i = 0; i < dim / 2; ++i) {
        const T ramp = clamp((T(i) - low) / std::max(high - low, T(1e-3)), T(0), T(1));
        r.freq[std::size_t(i)] =
            r.freq[std::size_t(i)] / T(factor) * ramp + r.freq[std::size_t(i)] * (T(1) - ramp);
      }
    }
    return r;
  }

  // Rotates the last `dim` values of v (length n) by the angle of position pos (inverse:
  // conjugate).
  void apply(T* v, int64_t n, int64_t pos, bool inverse = false) const {
    T* x = v + (n - dim);
    for (int64_t i = 0; i < dim / 2; ++i) {
      const T th = T(pos) * freq[std::size_t(i)];
      const T c = std::cos(th), s = inverse ? -std::sin(th) : std::sin(th);
      const T a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = a * s + b * c;
    }
  }
};

// ---- mHC (spec §5.1, §5.2) ----

template <typename T>
struct HcMix {
  std::vector<T> pre, post, comb;  // comb[j * hc + k]
};

// Coefficients from the stream h[hc * d] (copy-major) with fn[(2+hc)*hc, hc*d], base, scale[3].
// M is any matrix with a matvec overload (Mat<T> or a checkpoint WeightView).
template <typename T, typename M>
HcMix<T> hc_mixes(const T* h, int64_t hc, int64_t d, const M& fn, const std::vector<T>& base,
                  const std::vector<T>& scale, T norm_eps, T hc_eps, int64_t iters) {
  const int64_t n = hc * d, mix = (2 + hc) * hc;
  const T r = rms_inv(h, n, norm_eps);
  std::vector<T> m(static_cast<std::size_t>(mix));
  matvec(fn, h, m.data());
  for (auto& v : m) v *= r;
  HcMix<T> out;
  out.pre.resize(std::size_t(hc));
  out.post.resize(std::size_t(hc));
  out.comb.resize(std::size_t(hc * hc));
  for (int64_t j = 0; j < hc; ++j) {
    out.pre[std::size_t(j)] = sigmoid(m[std::size_t(j)] * scale[0] + base[std::size_t(j)]) + hc_eps;
    out.post[std::size_t(j)] =
        T(2) * sigmoid(m[std::size_t(hc + j)] * scale[1] + base[std::size_t(hc + j)]);
  }
  T* c = out.comb.data();
  for (int64_t j = 0; j < hc; ++j) {  // row softmax over k, then + eps
    T* row = c + j * hc;
    for (int64_t k = 0; k < hc; ++k) {
      const std::size_t idx = std::size_t(2 * hc + j * hc + k);
      row[k] = m[idx] * scale[2] + base[idx];
    }
    const T mx = *std::max_element(row, row + hc);
    T s = 0;
    for (int64_t k = 0; k < hc; ++k) s += (row[k] = std::exp(row[k] - mx));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + hc_eps;
  }
  auto col_step = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      T s = 0;
      for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= (s + hc_eps);
    }
  };
  auto row_step = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      T s = 0;
      for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= (s + hc_eps);
    }
  };
  col_step();
  for (int64_t it = 1; it < iters; ++it) row_step(), col_step();
  return out;
}

// y = sum_j w[j] * h[j]
template <typename T>
void hc_collapse(const T* h, const std::vector<T>& w, int64_t hc, int64_t d, T* y) {
  for (int64_t i = 0; i < d; ++i) {
    T s = 0;
    for (int64_t j = 0; j < hc; ++j) s += w[std::size_t(j)] * h[j * d + i];
    y[i] = s;
  }
}

// out[k] = post[k] * y + sum_j comb[j][k] * res[j]   (out may not alias res)
template <typename T>
void hc_expand(const T* y, const T* res, const HcMix<T>& mx, int64_t hc, int64_t d, T* out) {
  for (int64_t k = 0; k < hc; ++k)
    for (int64_t i = 0; i < d; ++i) {
      T s = mx.post[std::size_t(k)] * y[i];
      for (int64_t j = 0; j < hc; ++j) s += mx.comb[std::size_t(j * hc + k)] * res[j * d + i];
      out[k * d + i] = s;
    }
}

// Indices of the k largest values (ties: lower index first), returned in ascending index order.
template <typename T>
std::vector<int64_t> topk_indices(const std::vector<T>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int64_t>(k, int64_t(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return v[std::size_t(a)] != v[std::size_t(b)] ? v[std::size_t(a)] > v[std::size_t(b)] : a < b;
  });
  idx.resize(std::size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace dsv41::ref
