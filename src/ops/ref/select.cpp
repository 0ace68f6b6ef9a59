// Scalar top-k by radix select and the reference mHC coefficient epilogue (see ops/select.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/select.h"

namespace dsv41::ops {
namespace {

// Order-preserving map from float to uint32 (larger float -> larger key); -0 and +0 share a key.
inline uint32_t key_of(float f) {
  if (f == 0.0f) f = 0.0f;
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace

int64_t topk_threshold(const float* v, int64_t n, int64_t k, int64_t* out) {
  k = std::min(k, n);
  if (k <= 0) return 0;
  // Radix select of the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = k;  // how many of the keys matching prefix/mask are still to be taken
  for (int shift = 24; shift >= 0; shift -= 8) {
    int64_t count[256] = {};
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t key = key_of(v[i]);
      if ((key & mask) == prefix) ++count[(key >> shift) & 0xFF];
    }
    int b = 255;
    for (; b > 0 && count[b] < remaining; --b) remaining -= count[b];
    prefix |= uint32_t(b) << shift;
    mask |= 0xFFu << shift;
  }
  // prefix is the k-th largest key; `remaining` of its ties are taken, lowest indices first.
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = key_of(v[i]);
    if (key > prefix || (key == prefix && remaining-- > 0)) out[m++] = i;
  }
  return m;
}

void hc_sinkhorn_ref(const float* m, const float* base, const float* scale, int64_t hc, float eps,
                     int64_t iters, float* pre, float* post, float* comb) {
  auto sigmoid = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
    post[j] = 2.0f * sigmoid(m[hc + j] * scale[1] + base[hc + j]);
  }
  float* c = comb;
  for (int64_t j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    for (int64_t k = 0; k < hc; ++k)
      row[k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
    const float mx = *std::max_element(row, row + hc);
    float s = 0;
    for (int64_t k = 0; k < hc; ++k) s += (row[k] = std::exp(row[k] - mx));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + eps;
  }
  if (iters <= 0) return;  // softmax only (used by the SIMD tiers, which iterate themselves)
  auto col_step = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0;
      for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= (s + eps);
    }
  };
  auto row_step = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= (s + eps);
    }
  };
  col_step();
  for (int64_t it = 1; it < iters; ++it) row_step(), col_step();
}

}  // namespace dsv41::ops
