// Statistics helpers of the engine's sampling tests (sampler_test.cpp, speculative_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <vector>

namespace dsv41::testing {

// Pearson chi-square of counts against expected probabilities (zero-probability cells must be
// empty).
inline double chi_square(const std::vector<int>& h, const std::vector<double>& p, int n) {
  double chi = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(h[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = p[i] * n;
    chi += (h[i] - e) * (h[i] - e) / e;
  }
  return chi;
}

}  // namespace dsv41::testing
