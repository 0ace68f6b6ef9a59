// The fixture of the per-tier kernel tests (kernels_test.cpp, aq_gemm_test.cpp): a tier under test
// (a dispatch tier, or an AVX-512 tier's source over the intrinsic emulation), the scalar tier as
// reference, a random generator whose seed every failure names, and the comparison helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ops/kernels.h"
#include "test_seed.h"

namespace dsv41::ops {

extern const Kernels kAvx512EmulatedKernels;      // avx512_emulated.cpp
extern const Kernels kAvx512VnniEmulatedKernels;  // avx512_vnni_emulated.cpp

// Named (not anonymous): both test files' TEST_Ps use the one fixture type, instantiated once in
// kernels_test.cpp.
namespace kernel_tier {

struct Gen {
  std::mt19937_64 rng{fresh_seed()};
  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }
  uint8_t byte() { return static_cast<uint8_t>(rng() & 0xFF); }
  // E4M3 codes without the NaN codes (0x7F, 0xFF): weights never hold NaN.
  uint8_t e4m3() {
    for (;;) {
      const uint8_t b = byte();
      if ((b & 0x7F) != 0x7F) return b;
    }
  }
  // Mostly mid-range scales; one in 64 at 0 (2^-127, a float subnormal) or 150 (2^23).
  uint8_t e8m0() {
    const uint64_t r = rng();
    if (r % 64 == 0) return (r >> 8) % 2 ? 0 : 150;
    return static_cast<uint8_t>(112 + (r >> 8) % 24);
  }
};

// A tier under test: a dispatch tier, or the AVX-512 tier's own source compiled over the intrinsic
// emulation (avx512_emulated.cpp), whose shared bodies are AVX2 code.
struct Tier {
  Isa isa;
  bool emulated;
};
inline void PrintTo(const Tier& t, std::ostream* os) {
  *os << isa_name(t.isa) << (t.emulated ? " (emulated)" : "");
}

class KernelTier : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    const Tier t = GetParam();
    const Isa native = t.emulated ? Isa::kAvx2 : t.isa;
    if (!isa_supported(native)) GTEST_SKIP() << isa_name(native) << " is not supported by this CPU";
    // The sanitized suite (tests/fuzz) leaves an emulated tier to the main build where the CPU
    // runs the tier natively: the same source, and ASan time is CI time.
    const char* emu = std::getenv("DSV41_EMULATED_TIERS");
    if (t.emulated && emu != nullptr && std::string_view(emu) == "only-without-native" &&
        isa_supported(t.isa))
      GTEST_SKIP() << isa_name(t.isa) << " runs natively here (DSV41_EMULATED_TIERS)";
    k_ = !t.emulated                 ? &kernels_for(t.isa)
         : t.isa == Isa::kAvx512Vnni ? &kAvx512VnniEmulatedKernels
                                     : &kAvx512EmulatedKernels;
    ref_ = &kernels_for(Isa::kScalar);
  }
  const Kernels* k_ = nullptr;
  const Kernels* ref_ = nullptr;
  Gen g_;
  // Every failure in the test names the seed (DSV41_TEST_SEED replays it).
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, "seed " + std::to_string(fresh_seed())};
};

inline uint32_t bits_of_float(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// |got - want| <= tol * scale for every element, where scale is the sum of |terms| of that output.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& scale, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " not written";
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), tol * scale[i] + 1e-30)
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
}

// Relative accumulation tolerance for fp32 sums of n terms (chunked, several accumulators): far
// below the error of a wrong element, scale or order (~1/sqrt(n) of the scale), far above rounding.
inline double sum_tol(int64_t n) {
  return 1e-6 * (double(n) / 64 + 8);
}

}  // namespace kernel_tier
}  // namespace dsv41::ops
