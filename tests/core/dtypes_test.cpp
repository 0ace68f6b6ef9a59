// Exact dtype conversions on hand-made bytes, plus exhaustive/brute-force checks of the encoders.
#include "core/dtypes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/rng.h"

namespace dsv41 {
namespace {

TEST(DTypes, NamesAndSizes) {
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kF8_E4M3);
  EXPECT_EQ(parse_dtype("F8_E8M0"), DType::kF8_E8M0);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_FALSE(parse_dtype("F4").has_value());
  EXPECT_FALSE(parse_dtype("bf16").has_value());
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kI8), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_name(DType::kF8_E4M3), "F8_E4M3");
}

TEST(DTypes, Bf16Decode) {
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FC0)));
}

TEST(DTypes, Bf16EncodeRoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  const uint16_t nan = float_to_bf16(std::nanf(""));
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  // Every bf16 value survives the round trip.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_float(uint16_t(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), b) << b;
  }
}

TEST(DTypes, E4M3Decode) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x3F), 1.875f);
  EXPECT_EQ(e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x77), 240.0f);  // e=14, m=7: 1.875 * 128
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  int nans = 0;
  for (int b = 0; b < 256; ++b) nans += std::isnan(e4m3_to_float(uint8_t(b)));
  EXPECT_EQ(nans, 2);  // no inf, exactly two NaN codes
}

// Nearest representable e4m3 by search, ties to the even code: the definition the encoder must
// meet.
uint8_t e4m3_by_search(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double a = std::min(std::fabs(x), 448.0);
  int best = 0;
  double best_err = 1e300;
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(double(e4m3_to_float(uint8_t(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
  }
  return sign | uint8_t(best);
}

TEST(DTypes, E4M3EncodeExactAndTies) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(uint8_t(c));
    if (std::isnan(v)) continue;
    ASSERT_EQ(e4m3_from_double(v), c) << c;
  }
  EXPECT_EQ(e4m3_from_double(1.0625), 0x38);  // midpoint 1.0 / 1.125 -> even mantissa 0
  EXPECT_EQ(e4m3_from_double(1.1875), 0x3A);  // midpoint 1.125 / 1.25 -> even mantissa 2
  EXPECT_EQ(e4m3_from_double(std::ldexp(1.0, -10)), 0x00);  // half the smallest subnormal -> 0
  EXPECT_EQ(e4m3_from_double(1.5 * std::ldexp(1.0, -9)), 0x02);
  EXPECT_EQ(e4m3_from_double(7.5 * std::ldexp(1.0, -9)), 0x08);  // rounds up into the first normal
  EXPECT_EQ(e4m3_from_double(1.9375), 0x40);                     // tie 1.875/2.0 -> 2.0 (even code)
  EXPECT_EQ(e4m3_from_double(460.0), 0x7E);                      // saturates, never NaN
  EXPECT_EQ(e4m3_from_double(-1e9), 0xFE);
  EXPECT_EQ(e4m3_from_double(-0.0), 0x80);
  EXPECT_EQ(e4m3_from_double(std::nan("")), 0x7F);
  Rng rng(42);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(rng.uniform(-1, 1), int(rng.below(24)) - 14);
    ASSERT_EQ(e4m3_from_double(x), e4m3_by_search(x)) << x;
  }
  // Exact midpoints between all neighbours.
  for (int c = 0; c < 0x7E; ++c) {
    const double mid = (double(e4m3_to_float(uint8_t(c))) + e4m3_to_float(uint8_t(c + 1))) / 2;
    ASSERT_EQ(e4m3_from_double(mid), (c & 1) ? c + 1 : c) << c;
  }
}

TEST(DTypes, E8M0) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(120), 1.0f / 128);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_GT(e8m0_to_float(0), 0.0f);
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_double(1), std::ldexp(1.0, -126));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  EXPECT_EQ(e8m0_from_exponent(0), 127);
  EXPECT_EQ(e8m0_from_exponent(-127), 0);
}

TEST(DTypes, E2M1DecodeAndNibbleOrder) {
  const float expect[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int n = 0; n < 16; ++n) EXPECT_EQ(e2m1_to_float(uint8_t(n)), expect[n]) << n;
  EXPECT_TRUE(std::signbit(e2m1_to_float(0x8)));
  // Byte 0x2F: low nibble 0xF (element 0 = -6), high nibble 0x2 (element 1 = 1.0).
  const uint8_t packed[2] = {0x2F, 0x93};
  EXPECT_EQ(e2m1_to_float(e2m1_nibble(packed, 0)), -6.0f);
  EXPECT_EQ(e2m1_to_float(e2m1_nibble(packed, 1)), 1.0f);
  EXPECT_EQ(e2m1_to_float(e2m1_nibble(packed, 2)), 1.5f);
  EXPECT_EQ(e2m1_to_float(e2m1_nibble(packed, 3)), -0.5f);
}

TEST(DTypes, E2M1EncodeDecisionPoints) {
  struct Case {
    double x;
    float want;
  };
  const Case cases[] = {
      {0.0, 0},    {0.24, 0},   {0.25, 0}, {0.26, 0.5}, {0.74, 0.5}, {0.75, 1},  {1.25, 1},
      {1.26, 1.5}, {1.74, 1.5}, {1.75, 2}, {2.5, 2},    {2.51, 3},   {3.49, 3},  {3.5, 4},
      {5.0, 4},    {5.01, 6},   {6.0, 6},  {100.0, 6},  {-0.75, -1}, {-5.0, -4}, {-7, -6},
  };
  for (const auto& c : cases) EXPECT_EQ(e2m1_to_float(e2m1_from_double(c.x)), c.want) << c.x;
  EXPECT_EQ(e2m1_from_double(-0.1), 0x8);  // sign kept: -0
  EXPECT_EQ(e2m1_from_double(-0.0), 0x8);
  for (uint8_t n = 0; n < 16; ++n) EXPECT_EQ(e2m1_from_double(e2m1_to_float(n)), n);
}

}  // namespace
}  // namespace dsv41
