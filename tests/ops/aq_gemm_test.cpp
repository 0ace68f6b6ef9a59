// The act-quant GEMM family and the FP8 GEMM for fp32 activations of the tiers that have them
// (ops/avx512/avx512_bf16_gemm.h, avx512_fp8_f32_gemm.h) against the scalar tier's exact sums,
// bit for bit across token counts; the scales conditions they rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "model/reference/ref_ops.h"
#include "ops/kernel_tier.h"
#include "ops/kernels.h"

namespace dsv41::ops {
namespace {

using namespace kernel_tier;

// Per output row o, the sum of |W[o, i] x_i|: the scale of a row's summation error (FP8 with
// 32 x 32 block scales, MXFP4 with row scales per 32).
std::vector<double> fp8_term_sums(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                                  int64_t out, int64_t in, const float* x) {
  const int64_t sin = (in + 31) / 32;
  std::vector<double> mag(static_cast<std::size_t>(out));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      mag[std::size_t(o)] +=
          std::fabs(double(e4m3_to_float(w[std::size_t(o * in + i)])) *
                    e8m0_to_float(s[std::size_t((o / 32) * sin + i / 32)]) * x[i]);
  return mag;
}
std::vector<double> mxfp4_term_sums(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                                    int64_t out, int64_t in, const float* x) {
  std::vector<double> mag(static_cast<std::size_t>(out));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      const uint8_t byte = w[std::size_t((o * in + i) / 2)];
      const uint8_t code = i % 2 ? uint8_t(byte >> 4) : uint8_t(byte & 15);
      mag[std::size_t(o)] +=
          std::fabs(double(e2m1_to_float(code)) *
                    e8m0_to_float(s[std::size_t(o * (in / 32) + i / 32)]) * x[i]);
    }
  return mag;
}

// An FP8 GEMM shape with the tokens (M values) it is run at.
struct Fp8Shape {
  int64_t out, in;
  std::vector<int64_t> ms;
};

// Random E4M3 weights of one shape with block scales fp8_aq_scales_ok accepts, the least (41) and
// a large one (240; 246 would overflow the sums of these random values) among them.
void random_fp8_matrix(Gen& g, int64_t out, int64_t in, std::vector<uint8_t>* w,
                       std::vector<uint8_t>* s) {
  w->resize(static_cast<std::size_t>(out * in));
  s->resize(static_cast<std::size_t>((out + 31) / 32 * ((in + 31) / 32)));
  for (auto& b : *w) b = g.e4m3();
  for (auto& b : *s) b = static_cast<uint8_t>(112 + g.byte() % 24);
  (*s)[0] = 41;
  if (s->size() > 1) (*s)[1] = 240;
  ASSERT_TRUE(fp8_aq_scales_ok(s->data(), int64_t(s->size())));
}

// An FP8 GEMM (`gemm(t0, m, y, ldy)`: tokens t0 .. t0 + m - 1 of x, packed) against the scalar
// tier's exact sums at M = 1 (every token, or `sample`: the first 9 and every 7th), then at every
// M of the shape the one-token bits, with an output stride wider than the rows.
template <class Gemm>
void check_fp8_gemm(const Kernels& ref, const char* name, const Fp8Shape& sh,
                    const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                    const std::vector<float>& x, bool sample, const Gemm& gemm) {
  const int64_t out = sh.out, in = sh.in;
  const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
  std::vector<float> one(static_cast<std::size_t>(mmax * out), NAN),
      want(static_cast<std::size_t>(out));
  for (int64_t t = 0; t < mmax; ++t) {
    gemm(t, 1, one.data() + t * out, out);
    if (sample && t % 7 != 0 && t > 8) continue;
    ref.fp8_gemv(w.data(), s.data(), out, in, x.data() + t * in, 1, want.data());
    expect_close(std::vector<float>(one.begin() + t * out, one.begin() + (t + 1) * out), want,
                 fp8_term_sums(w, s, out, in, x.data() + t * in), sum_tol(in),
                 std::string(name) + " " + std::to_string(out) + "x" + std::to_string(in) + " t" +
                     std::to_string(t));
  }
  for (int64_t m : sh.ms) {
    const int64_t ldy = out + 5;
    std::vector<float> y(static_cast<std::size_t>(m * ldy), NAN);
    gemm(0, m, y.data(), ldy);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t o = 0; o < out; ++o)
        ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]),
                  bits_of_float(one[std::size_t(t * out + o)]))
            << name << " " << out << "x" << in << " M " << m << " t" << t << " row " << o;
  }
}

// An MXFP4 GEMM shape with the tokens (M values) it is run at.
struct Mxfp4Shape {
  int64_t out, in;
  std::vector<int64_t> ms;
};

// Random MXFP4 weights of one shape with row scales mxfp4_aq_scales_ok accepts, the least (33) and
// a large one (228) among them.
void random_mxfp4_matrix(Gen& g, int64_t out, int64_t in, std::vector<uint8_t>* w,
                         std::vector<uint8_t>* s) {
  w->resize(static_cast<std::size_t>(out * in / 2));
  s->resize(static_cast<std::size_t>(out * in / 32));
  for (auto& b : *w) b = g.byte();
  for (auto& b : *s) b = static_cast<uint8_t>(112 + g.byte() % 24);
  (*s)[0] = 33;
  (*s)[1] = 228;
  ASSERT_TRUE(mxfp4_aq_scales_ok(s->data(), int64_t(s->size())));
}

// An MXFP4 GEMM (`gemm(t0, m, y, ldy)`: tokens t0 .. t0 + m - 1 of x, packed; `w_off`/`s_off`
// shift the matrix by whole rows, as par_rows calls it) and its fused gate/up (`gate_up(m, h,
// ldh)` over all the rows as pairs, with `route` and the clamp `limit`) against the scalar tier's
// exact sums at M = 1 (every token, or `sample`: the first 9 and every 7th), then at every M of
// the shape the one-token bits, the gate/up epilogue on them bit for bit, and rows from 32 on
// called alone the whole call's bits.
template <class Gemm, class GateUp>
void check_mxfp4_gemm(const Kernels& ref, const char* name, const Mxfp4Shape& sh,
                      const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                      const std::vector<float>& x, const std::vector<float>& route, float limit,
                      bool sample, const Gemm& gemm, const GateUp& gate_up) {
  const int64_t out = sh.out, in = sh.in, inter = out / 2;
  const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
  const std::string shape = std::to_string(out) + "x" + std::to_string(in);
  std::vector<float> one(static_cast<std::size_t>(mmax * out), NAN),
      want(static_cast<std::size_t>(out));
  for (int64_t t = 0; t < mmax; ++t) {
    gemm(t, 1, 0, one.data() + t * out, out);
    if (sample && t % 7 != 0 && t > 8) continue;
    ref.mxfp4_gemv_f32(w.data(), s.data(), out, in, x.data() + t * in, 1, want.data());
    expect_close(std::vector<float>(one.begin() + t * out, one.begin() + (t + 1) * out), want,
                 mxfp4_term_sums(w, s, out, in, x.data() + t * in), sum_tol(in),
                 std::string(name) + " " + shape + " t" + std::to_string(t));
  }
  for (int64_t m : sh.ms) {
    const int64_t ldy = out + 5, ldh = inter + 3;
    std::vector<float> y(static_cast<std::size_t>(m * ldy), NAN),
        h(static_cast<std::size_t>(m * ldh), NAN), part(y.size(), NAN);
    gemm(0, m, 0, y.data(), ldy);
    gate_up(m, h.data(), ldh);
    if (out > 32) gemm(0, m, 32, part.data() + 32, ldy);  // rows [32, out) alone
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t o = 0; o < out; ++o) {
        ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]),
                  bits_of_float(one[std::size_t(t * out + o)]))
            << name << " " << shape << " M " << m << " t" << t << " row " << o;
        if (o >= 32 && out > 32)
          ASSERT_EQ(bits_of_float(part[std::size_t(t * ldy + o)]),
                    bits_of_float(y[std::size_t(t * ldy + o)]))
              << name << " rows from 32, " << shape << " M " << m << " t" << t << " row " << o;
      }
      for (int64_t j = 0; j < inter; ++j) {
        const float gc = std::min(one[std::size_t(t * out + 2 * j)], limit);
        const float uc = std::clamp(one[std::size_t(t * out + 2 * j + 1)], -limit, limit);
        const float want_h = gc / (1.0f + std::exp(-gc)) * uc * route[std::size_t(t)];
        ASSERT_EQ(bits_of_float(h[std::size_t(t * ldh + j)]), bits_of_float(want_h))
            << name << " gate/up " << shape << " M " << m << " t" << t << " " << j;
      }
    }
  }
}

// The act-quant GEMM (aq_fp8_gemm, tiers with a bf16 dot): on E4M3-rounded activations every
// product is exact, so each output is the exact sum (the scalar tier's double-accumulated FP8 GEMV)
// up to fp32 sums of its terms; and every token's bits are the same for M in {1, 2, 3, 4, 5, 6, 7,
// 16, 17, 64, 500} (direct, wide and panel paths: 4-row panels, whole-K groups and K blocks; token
// blocks, tiles with remainders), rows past the tiles' multiples, widths with a tail inside a
// 32-block and past the last 64-value chunk.
TEST_P(KernelTier, AqFp8GemmExactProductsAndBitIdenticalAcrossM) {
  if (!k_->aq_fp8_gemm) GTEST_SKIP() << "no bf16 dot product in this tier (aq_* entries are null)";
  ASSERT_TRUE(k_->aq_pack_act && k_->aq_act_stride && k_->aq_mxfp4_gemm && k_->aq_mxfp4_gate_up);
  const std::vector<Fp8Shape> shapes = {{33, 64, {1, 2, 3, 4, 5, 6, 7, 16, 64, 500}},
                                        {35, 96, {1, 2, 3, 4, 7, 16}},
                                        {100, 40, {1, 3, 5, 7, 64}},
                                        {64, 2304, {1, 2, 3, 6, 7, 16, 64}},
                                        {40, 5120, {1, 2, 5, 7, 16, 500}},
                                        {35, 4096 + 40, {1, 3, 16}},
                                        {3, 7, {1, 2, 4, 5, 6, 7}},
                                        {8, 1280 + 32, {1, 7, 64}},
                                        {37, 4096 + 40, {1, 17, 64}},
                                        {9, 8192 + 64, {1, 17}}};
  for (const auto& sh : shapes) {
    const int64_t out = sh.out, in = sh.in;
    std::vector<uint8_t> w, s;
    random_fp8_matrix(g_, out, in, &w, &s);
    const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
    std::vector<float> x(static_cast<std::size_t>(mmax * in));
    for (auto& v : x) v = g_.normal() * (g_.byte() % 8 == 0 ? 1e-3f : 1.0f);
    for (int64_t t = 0; t < mmax; ++t) ref::fake_fp8_pow2(x.data() + t * in, in, 32);
    const int64_t st = k_->aq_act_stride(in, AqFormat::kFp8);
    ASSERT_GE(st, in);
    std::vector<uint16_t> xp(static_cast<std::size_t>(mmax * st));
    k_->aq_pack_act(x.data(), mmax, in, AqFormat::kFp8, xp.data());
    check_fp8_gemm(*ref_, "aq_fp8_gemm", sh, w, s, x, false,
                   [&](int64_t t0, int64_t m, float* y, int64_t ldy) {
                     k_->aq_fp8_gemm(w.data(), s.data(), out, in, xp.data() + t0 * st, m, y, ldy);
                   });
  }
}

// The act-quant MXFP4 entries: aq_mxfp4_gemm against the exact sum (the scalar tier's
// double-accumulated MXFP4 GEMV) up to fp32 sums, bit-identical across M; aq_mxfp4_gate_up equal
// bit for bit to the epilogue applied to aq_mxfp4_gemm's gate and up rows, at every M. Widths with
// a partial last 128-value chunk (an odd 32-block count), rows past the tiles' multiples.
TEST_P(KernelTier, AqMxfp4ExactProductsAndBitIdenticalAcrossM) {
  if (!k_->aq_mxfp4_gemm)
    GTEST_SKIP() << "no bf16 dot product in this tier (aq_* entries are null)";
  // (160 rows: 80 gate/up pairs, past the gate/up's 64 pairs a pass)
  const std::vector<Mxfp4Shape> shapes = {{34, 128, {1, 2, 3, 4, 5, 6, 7, 16, 64, 500}},
                                          {160, 128, {1, 2, 5, 7, 64}},
                                          {64, 2304, {1, 2, 3, 4, 6, 7, 16, 64}},
                                          {22, 5120, {1, 3, 5, 7, 16, 500}},
                                          {18, 96, {1, 2, 4, 6, 7, 16}},
                                          {35, 96, {3, 4, 5, 6}},
                                          {10, 32, {1, 3, 7}},
                                          {6, 8192 + 128, {1, 17}}};
  for (const auto& sh : shapes) {
    const int64_t out = sh.out, in = sh.in;
    std::vector<uint8_t> w, s;
    random_mxfp4_matrix(g_, out, in, &w, &s);
    const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
    std::vector<float> x(static_cast<std::size_t>(mmax * in)),
        route(static_cast<std::size_t>(mmax));
    for (auto& v : x) v = g_.normal();
    for (int64_t t = 0; t < mmax; ++t) ref::fake_fp8_pow2(x.data() + t * in, in, 32);
    for (auto& r : route) r = 0.5f + std::fabs(g_.normal());
    const int64_t st = k_->aq_act_stride(in, AqFormat::kMxfp4);
    ASSERT_GE(st, in);
    std::vector<uint16_t> xp(static_cast<std::size_t>(mmax * st));
    k_->aq_pack_act(x.data(), mmax, in, AqFormat::kMxfp4, xp.data());
    check_mxfp4_gemm(
        *ref_, "aq_mxfp4_gemm", sh, w, s, x, route, 7.0f, false,
        [&](int64_t t0, int64_t m, int64_t r0, float* y, int64_t ldy) {
          k_->aq_mxfp4_gemm(w.data() + r0 * (in / 2), s.data() + r0 * (in / 32), out - r0, in,
                            xp.data() + t0 * st, m, y, ldy);
        },
        [&](int64_t m, float* h, int64_t ldh) {
          k_->aq_mxfp4_gate_up(w.data(), s.data(), out / 2, in, xp.data(), route.data(), m, 7.0f, h,
                               ldh);
        });
  }
}

// The greatest scale mxfp4_aq_scales_ok allows (252: the scale fold subtracts nothing) beside
// the least, on activations small enough that the sums stay finite: against the exact sum, at
// M = 1 and through the panel path.
TEST_P(KernelTier, AqMxfp4ExtremeScales) {
  if (!k_->aq_mxfp4_gemm)
    GTEST_SKIP() << "no bf16 dot product in this tier (aq_* entries are null)";
  const int64_t out = 8, in = 96, m = 9;
  std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
      s(static_cast<std::size_t>(out * in / 32));
  for (auto& b : w) b = g_.byte();
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = i % 3 == 0 ? 252 : i % 3 == 1 ? 33 : 127;
  ASSERT_TRUE(mxfp4_aq_scales_ok(s.data(), int64_t(s.size())));
  std::vector<float> x(static_cast<std::size_t>(m * in));
  // ~2^-20 (act-quant's floor keeps values from 2^-31 on): products up to ~2^108 at scale 252
  for (auto& v : x) v = std::ldexp(g_.normal(), -20);
  for (int64_t t = 0; t < m; ++t) ref::fake_fp8_pow2(x.data() + t * in, in, 32);
  const int64_t st = k_->aq_act_stride(in, AqFormat::kMxfp4);
  std::vector<uint16_t> xp(static_cast<std::size_t>(m * st));
  k_->aq_pack_act(x.data(), m, in, AqFormat::kMxfp4, xp.data());
  std::vector<float> y(static_cast<std::size_t>(m * out), NAN), one(static_cast<std::size_t>(out)),
      want(static_cast<std::size_t>(out));
  k_->aq_mxfp4_gemm(w.data(), s.data(), out, in, xp.data(), m, y.data(), out);
  int large = 0;  // outputs the scale-252 blocks make large: most of the 72
  for (int64_t t = 0; t < m; ++t) {
    k_->aq_mxfp4_gemm(w.data(), s.data(), out, in, xp.data() + t * st, 1, one.data(), out);
    ref_->mxfp4_gemv_f32(w.data(), s.data(), out, in, x.data() + t * in, 1, want.data());
    expect_close(one, want, mxfp4_term_sums(w, s, out, in, x.data() + t * in), sum_tol(in),
                 "extreme scales t" + std::to_string(t));
    for (int64_t o = 0; o < out; ++o) {
      ASSERT_TRUE(std::isfinite(one[std::size_t(o)])) << "t" << t << " row " << o;
      // (a 252 block's 32 products are integer multiples of one unit and can cancel exactly)
      large += std::fabs(want[std::size_t(o)]) > 1e20f;
      ASSERT_EQ(bits_of_float(y[std::size_t(t * out + o)]), bits_of_float(one[std::size_t(o)]));
    }
  }
  EXPECT_GE(large, m * out / 2);
}

// act_quant_fp8 is the reference's fake_fp8_pow2<float> bit for bit on every tier: magnitudes
// from 1e-9 to 1e9 (tiny blocks below the 1e-4 floor, E4M3 subnormals after scaling), exact ties
// between E4M3 neighbours, zeros of both signs, partial last blocks, a block with an infinity, in
// place and out of place.
TEST_P(KernelTier, ActQuantFp8IsTheReferenceBitForBit) {
  for (int64_t n :
       {int64_t(1), int64_t(7), int64_t(32), int64_t(100), int64_t(512), int64_t(5120 + 16)}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float mag = std::pow(10.0f, float(int(g_.byte() % 19) - 9));
        x[std::size_t(i)] = g_.normal() * ((i / 32) % 3 == 2 ? 1e-6f : mag);
      }
      if (n > 40) {
        x[3] = 0.0f, x[4] = -0.0f;
        // exact ties: with amax 448 * 2^-3 the scale is 2^-3; 1.0625 and 0.0068359375 (= 3.5 *
        // 2^-9) are midpoints of E4M3 neighbours once divided by it
        x[32] = 56.0f, x[33] = 1.0625f * 0.125f, x[34] = -3.5f * 0x1p-9f * 0.125f;
        x[35] = 1.1875f * 0.125f;
        for (int64_t i = 36; i < 64; ++i) x[std::size_t(i)] = 0.01f * float(i - 50);  // amax 56
      }
      if (trial == 3 && n >= 64) x[std::size_t(n - 2)] = INFINITY;
      std::vector<float> want = x, got(x.size(), NAN), inplace = x;
      ref::fake_fp8_pow2(want.data(), n, 32);
      k_->act_quant_fp8(x.data(), n, got.data());
      k_->act_quant_fp8(inplace.data(), n, inplace.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits_of_float(got[std::size_t(i)]), bits_of_float(want[std::size_t(i)]))
            << "n " << n << " at " << i << ": x " << x[std::size_t(i)] << " got "
            << got[std::size_t(i)] << " want " << want[std::size_t(i)];
        ASSERT_EQ(bits_of_float(inplace[std::size_t(i)]), bits_of_float(want[std::size_t(i)]));
      }
    }
  }
}

// aq_pack_act_split3: three bf16 terms whose sum is x exactly. A one-hot FP8 matrix (row o picks
// x[o]) returns every x bit for bit from (hi + mid) + lo of the terms' dots; a random matrix gives
// the exact sum up to fp32 sums, with the same bits for every M (3M packed rows).
TEST_P(KernelTier, AqSplit3IsExactAndBitIdenticalAcrossM) {
  if (!k_->aq_pack_act_split3) GTEST_SKIP() << "no bf16 dot product in this tier";
  auto combine = [](const std::vector<float>& y3, int64_t m, int64_t out) {
    std::vector<float> y(static_cast<std::size_t>(m * out));
    for (int64_t t = 0; t < m; ++t)
      for (int64_t o = 0; o < out; ++o)
        y[std::size_t(t * out + o)] =
            (y3[std::size_t(3 * t * out + o)] + y3[std::size_t((3 * t + 1) * out + o)]) +
            y3[std::size_t((3 * t + 2) * out + o)];
    return y;
  };
  {  // one-hot
    const int64_t n = 96, st = k_->aq_act_stride(n, AqFormat::kFp8);
    std::vector<uint8_t> w(static_cast<std::size_t>(n * n), 0), s(9, 127);
    for (int64_t o = 0; o < n; ++o) w[std::size_t(o * n + o)] = 0x38;  // E4M3 1.0
    std::vector<float> x(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      x[std::size_t(i)] = g_.normal() * std::pow(10.0f, float(int(g_.byte() % 13) - 6));
    std::vector<uint16_t> xp(static_cast<std::size_t>(3 * st));
    k_->aq_pack_act_split3(x.data(), 1, n, AqFormat::kFp8, xp.data());
    std::vector<float> y3(static_cast<std::size_t>(3 * n), NAN);
    k_->aq_fp8_gemm(w.data(), s.data(), n, n, xp.data(), 3, y3.data(), n);
    const auto y = combine(y3, 1, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(bits_of_float(y[std::size_t(i)]), bits_of_float(x[std::size_t(i)]))
          << i << ": " << x[std::size_t(i)] << " came back as " << y[std::size_t(i)];
  }
  for (const auto& [out, in] :
       std::vector<std::pair<int64_t, int64_t>>{{33, 64}, {40, 5120}, {35, 4096 + 40}}) {
    const int64_t sin = (in + 31) / 32, st = k_->aq_act_stride(in, AqFormat::kFp8);
    std::vector<uint8_t> w(static_cast<std::size_t>(out * in)),
        s(static_cast<std::size_t>((out + 31) / 32 * sin));
    for (auto& b : w) b = g_.e4m3();
    for (auto& b : s) b = static_cast<uint8_t>(112 + g_.byte() % 24);
    const int64_t mmax = 64;
    std::vector<float> x(static_cast<std::size_t>(mmax * in));
    for (auto& v : x) v = g_.normal();
    std::vector<uint16_t> xp(static_cast<std::size_t>(3 * mmax * st));
    k_->aq_pack_act_split3(x.data(), mmax, in, AqFormat::kFp8, xp.data());
    std::vector<float> y3(static_cast<std::size_t>(3 * mmax * out), NAN);
    k_->aq_fp8_gemm(w.data(), s.data(), out, in, xp.data(), 3 * mmax, y3.data(), out);
    const auto all = combine(y3, mmax, out);
    std::vector<float> want(static_cast<std::size_t>(out));
    std::vector<double> mag(static_cast<std::size_t>(out));
    for (int64_t t = 0; t < mmax; t += 7) {
      ref_->fp8_gemv(w.data(), s.data(), out, in, x.data() + t * in, 1, want.data());
      mag = fp8_term_sums(w, s, out, in, x.data() + t * in);
      expect_close(std::vector<float>(all.begin() + t * out, all.begin() + (t + 1) * out), want,
                   mag, sum_tol(in), "split3 " + std::to_string(out) + "x" + std::to_string(in));
    }
    for (int64_t m : {1, 2, 7, 16}) {  // the first m tokens alone: the same bits
      std::vector<float> ym(static_cast<std::size_t>(3 * m * out), NAN);
      k_->aq_fp8_gemm(w.data(), s.data(), out, in, xp.data(), 3 * m, ym.data(), out);
      const auto got = combine(ym, m, out);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(bits_of_float(got[i]), bits_of_float(all[i])) << "M " << m << " at " << i;
    }
  }
}

// The FP8 GEMM for fp32 activations (f32_fp8_gemm; the avx512_bf16 and avx2 tiers): every product
// exact (FMA), so each output is the exact sum (the scalar tier's double-accumulated FP8 GEMV) up
// to fp32 sums; a one-hot matrix gives any activation back bit for bit (what three bf16 terms did);
// and every token's bits are the same for M in {1, ..., 7, 16, 17, 64, 130, 200, 500} (direct
// tiles, the panel, token blocks of unequal sizes, tiles with remainders), rows past the tiles'
// multiples, widths with a tail inside a 32-block and past the last 64-value chunk; rows from 32
// on called alone (as the engine splits them) give the whole call's bits.
TEST_P(KernelTier, F32Fp8GemmExactProductsAndBitIdenticalAcrossM) {
  if (!k_->f32_fp8_gemm) GTEST_SKIP() << "this tier has no f32_fp8_gemm";
  ASSERT_TRUE(k_->f32_pack_act && k_->f32_act_stride);
  {  // one-hot: y = x exactly, whatever the magnitudes
    const int64_t n = 96, st = k_->f32_act_stride(n, AqFormat::kFp8);
    std::vector<uint8_t> w(static_cast<std::size_t>(n * n), 0), s(9, 127);
    for (int64_t o = 0; o < n; ++o) w[std::size_t(o * n + o)] = 0x38;  // E4M3 1.0
    std::vector<float> x(static_cast<std::size_t>(2 * n));
    for (auto& v : x) v = g_.normal() * std::pow(10.0f, float(int(g_.byte() % 13) - 6));
    std::vector<float> xp(static_cast<std::size_t>(2 * st)), y(static_cast<std::size_t>(2 * n));
    k_->f32_pack_act(x.data(), 2, n, AqFormat::kFp8, xp.data());
    k_->f32_fp8_gemm(w.data(), s.data(), n, n, xp.data(), 2, y.data(), n);
    for (int64_t i = 0; i < 2 * n; ++i)
      ASSERT_EQ(bits_of_float(y[std::size_t(i)]), bits_of_float(x[std::size_t(i)]))
          << i << ": " << x[std::size_t(i)] << " came back as " << y[std::size_t(i)];
  }
  const std::vector<Fp8Shape> shapes = {{33, 64, {1, 2, 3, 4, 5, 6, 7, 16, 64, 500}},
                                        {35, 96, {1, 2, 3, 4, 7, 16}},
                                        {100, 40, {1, 3, 5, 7, 64}},
                                        {64, 2304, {1, 2, 3, 6, 7, 16, 64}},
                                        {40, 5120, {1, 2, 5, 7, 16, 200}},
                                        {37, 4096 + 40, {1, 3, 17, 64, 130}},
                                        {3, 7, {1, 2, 4, 5, 6, 7}}};
  for (const auto& sh : shapes) {
    const int64_t out = sh.out, in = sh.in;
    std::vector<uint8_t> w, s;
    random_fp8_matrix(g_, out, in, &w, &s);
    const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
    std::vector<float> x(static_cast<std::size_t>(mmax * in));
    for (auto& v : x) v = g_.normal() * (g_.byte() % 8 == 0 ? 1e-3f : 1.0f);  // any fp32 values
    const int64_t st = k_->f32_act_stride(in, AqFormat::kFp8);
    ASSERT_GE(st, in);
    std::vector<float> xp(static_cast<std::size_t>(mmax * st));
    k_->f32_pack_act(x.data(), mmax, in, AqFormat::kFp8, xp.data());
    check_fp8_gemm(*ref_, "f32_fp8_gemm", sh, w, s, x, true,
                   [&](int64_t t0, int64_t m, float* y, int64_t ldy) {
                     k_->f32_fp8_gemm(w.data(), s.data(), out, in, xp.data() + t0 * st, m, y, ldy);
                   });
    if (out > 32) {  // rows [32, out) alone, as par_rows calls them: the whole call's bits
      const int64_t sin = (in + 31) / 32;
      std::vector<float> all(static_cast<std::size_t>(mmax * out)), part(all.size(), NAN);
      k_->f32_fp8_gemm(w.data(), s.data(), out, in, xp.data(), mmax, all.data(), out);
      k_->f32_fp8_gemm(w.data() + 32 * in, s.data() + sin, out - 32, in, xp.data(), mmax,
                       part.data() + 32, out);
      for (int64_t t = 0; t < mmax; ++t)
        for (int64_t o = 32; o < out; ++o)
          ASSERT_EQ(bits_of_float(part[std::size_t(t * out + o)]),
                    bits_of_float(all[std::size_t(t * out + o)]))
              << "f32_fp8_gemm rows from 32, " << out << "x" << in << " t" << t << " row " << o;
    }
  }
}

// One token whose values a row group's scales take below the normal range (an avx2 one-token path
// scales the token once per 32-row group and must fall back to scaling the weights there): rows
// 0-31 with every scale 41 (x 2^-86) against values near 2^-56 (scaled by 2^-78 they would be
// subnormal, their low bits lost; most of these rows' outputs are subnormal too), rows 32-63 with
// the usual scales (scaled values normal), rows 64-95 with one weight each, x 2^-77 on their first
// block, where token 6's values 0x1.fffffep-50 scale to 2^-126 - 2^-150, which rounds up to the
// least normal float (a check of the rounded value alone would pass it; its low bit is lost all
// the same, and the one product in each row shows it).
// Every token's bits alone equal its bits among 7 (the panel, which scales the weights).
TEST_P(KernelTier, F32Fp8OneTokenBitsWhereScaledValuesLeaveTheNormalRange) {
  if (!k_->f32_fp8_gemm) GTEST_SKIP() << "this tier has no f32_fp8_gemm";
  const int64_t out = 96, in = 256, m = 7, st = k_->f32_act_stride(in, AqFormat::kFp8);
  std::vector<uint8_t> w, s;
  random_fp8_matrix(g_, out, in, &w, &s);
  for (int64_t b = 0; b < in / 32; ++b) {
    s[std::size_t(b)] = 41;
    s[std::size_t(2 * (in / 32) + b)] = b == 0 ? 42 : 127;
  }
  for (int64_t o = 64; o < 96; ++o)  // one weight each, 448 (E4M3 0x7E) on column o - 64
    for (int64_t i = 0; i < in; ++i) w[std::size_t(o * in + i)] = i == o - 64 ? 0x7E : 0;
  ASSERT_TRUE(fp8_aq_scales_ok(s.data(), int64_t(s.size())));
  std::vector<float> x(static_cast<std::size_t>(m * in));
  for (auto& v : x) v = std::ldexp(g_.normal(), -56);
  for (int64_t i = 0; i < 32; ++i)  // token 6's first block: see rows 64-95 above
    x[std::size_t(6 * in + i)] = (g_.byte() % 2 ? -1.0f : 1.0f) * 0x1.fffffep-50f;
  std::vector<float> xp(static_cast<std::size_t>(m * st)), all(static_cast<std::size_t>(m * out)),
      one(static_cast<std::size_t>(out));
  k_->f32_pack_act(x.data(), m, in, AqFormat::kFp8, xp.data());
  k_->f32_fp8_gemm(w.data(), s.data(), out, in, xp.data(), m, all.data(), out);
  int64_t subnormal = 0;
  for (int64_t t = 0; t < m; ++t) {
    k_->f32_fp8_gemm(w.data(), s.data(), out, in, xp.data() + t * st, 1, one.data(), out);
    for (int64_t o = 0; o < out; ++o) {
      ASSERT_EQ(bits_of_float(one[std::size_t(o)]), bits_of_float(all[std::size_t(t * out + o)]))
          << "token " << t << " row " << o;
      subnormal += std::fpclassify(one[std::size_t(o)]) == FP_SUBNORMAL;
    }
  }
  EXPECT_GT(subnormal, m * 16) << "the first row group's outputs should be subnormal";
}

// The MXFP4 GEMMs for fp32 activations (f32_mxfp4_gemm, f32_mxfp4_gate_up; the avx512_bf16 and
// avx2 tiers): every product exact, so each output is the exact sum (the scalar tier's
// double-accumulated MXFP4 GEMV) up to fp32 sums; a one-hot matrix gives any activation back bit
// for bit; the least and greatest scales mxfp4_aq_scales_ok allows; every token's bits the same
// for M in {1, ..., 7, 16, 17, 64, 130, 500} (direct tiles with remainders, the panel, two token
// blocks at 5,120 x 130); the fused gate/up bit for bit the epilogue on the GEMM's rows, at every
// M; rows from 32 on called alone (as the engine splits them) give the whole call's bits.
TEST_P(KernelTier, F32Mxfp4GemmExactProductsAndBitIdenticalAcrossM) {
  if (!k_->f32_mxfp4_gemm) GTEST_SKIP() << "this tier has no f32_mxfp4_gemm";
  ASSERT_TRUE(k_->f32_pack_act && k_->f32_act_stride && k_->f32_mxfp4_gate_up);
  {  // one-hot: y = x exactly, whatever the magnitudes
    const int64_t n = 96, st = k_->f32_act_stride(n, AqFormat::kMxfp4);
    std::vector<uint8_t> w(static_cast<std::size_t>(n * n / 2), 0), s(std::size_t(n * n / 32), 127);
    for (int64_t o = 0; o < n; ++o)  // E2M1 code 2 is 1.0
      w[std::size_t((o * n + o) / 2)] = o % 2 ? uint8_t(2 << 4) : uint8_t(2);
    std::vector<float> x(static_cast<std::size_t>(2 * n));
    for (auto& v : x) v = g_.normal() * std::pow(10.0f, float(int(g_.byte() % 13) - 6));
    std::vector<float> xp(static_cast<std::size_t>(2 * st)), y(static_cast<std::size_t>(2 * n));
    k_->f32_pack_act(x.data(), 2, n, AqFormat::kMxfp4, xp.data());
    k_->f32_mxfp4_gemm(w.data(), s.data(), n, n, xp.data(), 2, y.data(), n);
    for (int64_t i = 0; i < 2 * n; ++i)
      ASSERT_EQ(bits_of_float(y[std::size_t(i)]), bits_of_float(x[std::size_t(i)]))
          << i << ": " << x[std::size_t(i)] << " came back as " << y[std::size_t(i)];
  }
  // (160 rows: 80 gate/up pairs, past the gate/up's 64 pairs a pass)
  const std::vector<Mxfp4Shape> shapes = {{34, 128, {1, 2, 3, 4, 5, 6, 7, 16, 64, 500}},
                                          {160, 128, {1, 2, 5, 7, 64}},
                                          {64, 2304, {1, 2, 3, 4, 6, 7, 16, 130}},
                                          {22, 5120, {1, 3, 5, 7, 17, 130}},
                                          {19, 96, {1, 2, 4, 6, 7, 16}},
                                          {10, 32, {1, 3, 7}}};
  for (const auto& sh : shapes) {
    const int64_t out = sh.out, in = sh.in;
    std::vector<uint8_t> w, s;
    random_mxfp4_matrix(g_, out, in, &w, &s);
    const int64_t mmax = *std::max_element(sh.ms.begin(), sh.ms.end());
    std::vector<float> x(static_cast<std::size_t>(mmax * in)),
        route(static_cast<std::size_t>(mmax));
    for (auto& v : x) v = g_.normal() * (g_.byte() % 8 == 0 ? 1e-3f : 1.0f);  // any fp32 values
    for (auto& r : route) r = 0.5f + std::fabs(g_.normal());
    const int64_t st = k_->f32_act_stride(in, AqFormat::kMxfp4);
    ASSERT_GE(st, in);
    std::vector<float> xp(static_cast<std::size_t>(mmax * st));
    k_->f32_pack_act(x.data(), mmax, in, AqFormat::kMxfp4, xp.data());
    check_mxfp4_gemm(
        *ref_, "f32_mxfp4_gemm", sh, w, s, x, route, 7.0f, true,
        [&](int64_t t0, int64_t m, int64_t r0, float* y, int64_t ldy) {
          k_->f32_mxfp4_gemm(w.data() + r0 * (in / 2), s.data() + r0 * (in / 32), out - r0, in,
                             xp.data() + t0 * st, m, y, ldy);
        },
        [&](int64_t m, float* h, int64_t ldh) {
          k_->f32_mxfp4_gate_up(w.data(), s.data(), out / 2, in, xp.data(), route.data(), m, 7.0f,
                                h, ldh);
        });
  }
  {  // the greatest scale (252) beside the least (33), small activations: finite, exact sums
    const int64_t out = 8, in = 96, m = 9;
    std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
        s(static_cast<std::size_t>(out * in / 32));
    for (auto& b : w) b = g_.byte();
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = i % 3 == 0 ? 252 : i % 3 == 1 ? 33 : 127;
    ASSERT_TRUE(mxfp4_aq_scales_ok(s.data(), int64_t(s.size())));
    std::vector<float> x(static_cast<std::size_t>(m * in));
    for (auto& v : x) v = std::ldexp(g_.normal(), -20);
    const int64_t st = k_->f32_act_stride(in, AqFormat::kMxfp4);
    std::vector<float> xp(static_cast<std::size_t>(m * st)), y(static_cast<std::size_t>(m * out)),
        want(static_cast<std::size_t>(out));
    k_->f32_pack_act(x.data(), m, in, AqFormat::kMxfp4, xp.data());
    k_->f32_mxfp4_gemm(w.data(), s.data(), out, in, xp.data(), m, y.data(), out);
    for (int64_t t = 0; t < m; ++t) {
      ref_->mxfp4_gemv_f32(w.data(), s.data(), out, in, x.data() + t * in, 1, want.data());
      const std::vector<float> got(y.begin() + t * out, y.begin() + (t + 1) * out);
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << "t" << t;
      expect_close(got, want, mxfp4_term_sums(w, s, out, in, x.data() + t * in), sum_tol(in),
                   "f32_mxfp4_gemm extreme scales t" + std::to_string(t));
    }
  }
}

TEST(Dispatch, Fp8AqScalesOkBounds) {
  const uint8_t ok[] = {41, 127, 246}, low[] = {127, 40}, high[] = {247}, zero[] = {0};
  EXPECT_TRUE(fp8_aq_scales_ok(ok, 3));
  EXPECT_FALSE(fp8_aq_scales_ok(low, 2));
  EXPECT_FALSE(fp8_aq_scales_ok(high, 1));
  EXPECT_FALSE(fp8_aq_scales_ok(zero, 1));
  EXPECT_TRUE(fp8_aq_scales_ok(zero, 0));
  const uint8_t ok4[] = {33, 127, 252}, low4[] = {32}, high4[] = {253};
  EXPECT_TRUE(mxfp4_aq_scales_ok(ok4, 3));
  EXPECT_FALSE(mxfp4_aq_scales_ok(low4, 1));
  EXPECT_FALSE(mxfp4_aq_scales_ok(high4, 1));
}

}  // namespace
}  // namespace dsv41::ops
