// Sort-free top-k against the reference's full sort (same index set, ties to the lower index), and
// the mHC Sinkhorn kernel of every tier bit-identical to the reference's hc_mixes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/reference/ref_ops.h"
#include "ops/kernels.h"
#include "ops/select.h"
#include "test_seed.h"

namespace dsv41::ops {
namespace {

TEST(TopK, SameSetAsAFullSortWithTies) {
  std::mt19937_64 rng(fresh_seed());
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t n = 1 + int64_t(rng() % 20000);
    std::vector<float> v(static_cast<std::size_t>(n));
    const int kind = trial % 4;
    for (auto& x : v) {
      const float g = std::normal_distribution<float>(0.0f, 3.0f)(rng);
      x = kind == 0   ? g
          : kind == 1 ? std::round(g)
          : kind == 2 ? std::max(0.0f, std::round(g * 2) / 2)
                      : -std::fabs(g);
    }
    if (trial % 10 == 0) v[0] = -0.0f, v[static_cast<std::size_t>(n - 1)] = 0.0f;
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(5), int64_t(512), n / 2, n, n + 3}) {
      std::vector<int64_t> got(static_cast<std::size_t>(std::max<int64_t>(k, 0)) + 1);
      const int64_t m = topk_threshold(v.data(), n, k, got.data());
      got.resize(static_cast<std::size_t>(m));
      ASSERT_EQ(got, ref::topk_indices(v, k)) << "n " << n << " k " << k << " kind " << kind;
    }
  }
}

TEST(HcSinkhorn, EveryTierBitIdenticalToTheReference) {
  std::mt19937_64 rng(fresh_seed());
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (int64_t hc : {4, 2, 3}) {
    const int64_t d = 64, mix = (2 + hc) * hc;
    for (int trial = 0; trial < 50; ++trial) {
      ref::Mat<float> fn;
      fn.rows = mix;
      fn.cols = hc * d;
      fn.v.resize(static_cast<std::size_t>(mix * hc * d));
      for (auto& x : fn.v) x = std::normal_distribution<float>(0.0f, 0.05f)(rng);
      std::vector<float> h(static_cast<std::size_t>(hc * d)), base(static_cast<std::size_t>(mix)),
          scale(3);
      for (auto& x : h) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      for (auto& x : base) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
      for (auto& x : scale) x = std::normal_distribution<float>(0.5f, 0.3f)(rng);
      const float eps = 1e-6f;
      const auto want = ref::hc_mixes<float>(h.data(), hc, d, fn, base, scale, 1e-20f, eps, 20);
      // The kernel's input: the mix vector exactly as hc_mixes forms it.
      std::vector<float> m(static_cast<std::size_t>(mix));
      ref::matvec(fn, h.data(), m.data());
      const float r = ref::rms_inv(h.data(), hc * d, 1e-20f);
      for (auto& x : m) x *= r;
      for (int k = 0; k < kIsaCount; ++k) {
        if (!isa_supported(static_cast<Isa>(k))) continue;
        std::vector<float> pre(static_cast<std::size_t>(hc), NAN), post(pre),
            comb(static_cast<std::size_t>(hc * hc), NAN);
        kernels_for(static_cast<Isa>(k))
            .hc_sinkhorn(m.data(), base.data(), scale.data(), hc, eps, 20, pre.data(), post.data(),
                         comb.data());
        ASSERT_EQ(0, std::memcmp(pre.data(), want.pre.data(), pre.size() * 4))
            << isa_name(static_cast<Isa>(k));
        ASSERT_EQ(0, std::memcmp(post.data(), want.post.data(), post.size() * 4))
            << isa_name(static_cast<Isa>(k));
        ASSERT_EQ(0, std::memcmp(comb.data(), want.comb.data(), comb.size() * 4))
            << isa_name(static_cast<Isa>(k)) << " hc " << hc;
      }
    }
  }
}

}  // namespace
}  // namespace dsv41::ops
