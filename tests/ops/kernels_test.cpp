// Every kernel of every ISA tier against the scalar reference (ops/ref), on fresh random inputs
// each run (the seed is printed on failure), over shapes with odd sizes, tails and chunk
// boundaries, with outputs poisoned (NaN) before each call. Tiers the CPU lacks are skipped and say
// so; the AVX2 tier is tested directly whatever the best tier is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string_view>
#include <vector>

#include "core/dtypes.h"
#include "model/reference/ref_ops.h"
#include "ops/cache_pack.h"
#include "ops/kernel_tier.h"
#include "ops/kernels.h"
#include "test_seed.h"

namespace dsv41::ops {

namespace {

using namespace kernel_tier;

TEST_P(KernelTier, Fp8Gemv) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 32}, {3, 40}, {33, 100}, {64, 5120}, {40, 2048 + 96}, {2, 7}, {35, 4096 + 40}};
  for (const auto& [out, in] : shapes)
    for (int64_t ntok : {1, 2, 5, 16}) {
      const int64_t sin = (in + 31) / 32;
      std::vector<uint8_t> w(static_cast<std::size_t>(out * in)),
          s(static_cast<std::size_t>((out + 31) / 32 * sin));
      for (auto& b : w) b = g_.e4m3();
      for (auto& b : s) b = g_.e8m0();
      std::vector<float> x(static_cast<std::size_t>(ntok * in));
      for (auto& v : x) v = g_.normal();
      std::vector<float> y(std::size_t(ntok * out), NAN), want(y.size());
      k_->fp8_gemv(w.data(), s.data(), out, in, x.data(), ntok, y.data());
      ref_->fp8_gemv(w.data(), s.data(), out, in, x.data(), ntok, want.data());
      std::vector<double> scale(y.size());
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i)
            scale[std::size_t(t * out + o)] +=
                std::fabs(double(e4m3_to_float(w[std::size_t(o * in + i)])) *
                          e8m0_to_double(s[std::size_t((o / 32) * sin + i / 32)]) *
                          x[std::size_t(t * in + i)]);
      expect_close(y, want, scale, sum_tol(in),
                   "fp8_gemv " + std::to_string(out) + "x" + std::to_string(in) + " t" +
                       std::to_string(ntok));
    }
}

// Scale exponents of 247 and more (2^120..2^127) cannot take the prescaled one-token path (the
// activations times scale x 2^8 would leave the float range): those 32-row groups use the plain
// per-block path; small weights keep the products finite.
TEST_P(KernelTier, Fp8GemvHugeScales) {
  const int64_t out = 70, in = 64, sin = 2;
  std::vector<uint8_t> w(std::size_t(out * in)), s(std::size_t((out + 31) / 32 * sin));
  for (auto& b : w) b = uint8_t((g_.byte() & 0x80) | (g_.byte() % 0x30));  // |value| < 0.5
  for (auto& b : s) b = g_.e8m0();
  s[1] = 250;  // group 0
  s[4] = 247;  // group 2
  std::vector<float> x(static_cast<std::size_t>(in));
  for (auto& v : x) v = g_.normal();
  std::vector<float> y(static_cast<std::size_t>(out), NAN), want(y.size());
  k_->fp8_gemv(w.data(), s.data(), out, in, x.data(), 1, y.data());
  ref_->fp8_gemv(w.data(), s.data(), out, in, x.data(), 1, want.data());
  std::vector<double> scale(y.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      scale[std::size_t(o)] +=
          std::fabs(double(e4m3_to_float(w[std::size_t(o * in + i)])) *
                    e8m0_to_double(s[std::size_t((o / 32) * sin + i / 32)]) * x[std::size_t(i)]);
  expect_close(y, want, scale, sum_tol(in), "fp8_gemv huge scales");
}

std::vector<double> fp4_scale(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                              int64_t out, int64_t in, const std::vector<float>& x, int64_t ntok) {
  std::vector<double> scale(static_cast<std::size_t>(ntok * out));
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        scale[std::size_t(t * out + o)] += std::fabs(
            double(e2m1_to_float(e2m1_nibble(w.data() + o * (in / 2), std::size_t(i)))) *
            e8m0_to_double(s[std::size_t(o * (in / 32) + i / 32)]) * x[std::size_t(t * in + i)]);
  return scale;
}

// The SIMD tiers' one-token MXFP4 path rounds each 32-block of activations to int16 (step
// max|x_block| / 32767, kernels.h): each value moves by at most half a step. Bound on what that
// adds to output o: sum_i |w_oi| * step(i) / 2, plus a little for the step's own float rounding.
std::vector<double> fp4_act_rounding(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s,
                                     int64_t out, int64_t in, const std::vector<float>& x,
                                     int64_t ntok) {
  std::vector<double> bound(static_cast<std::size_t>(ntok * out));
  for (int64_t t = 0; t < ntok; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t b = 0; b < in / 32; ++b) {
        double mx = 0, wsum = 0;
        for (int64_t i = b * 32; i < b * 32 + 32; ++i) {
          mx = std::max(mx, std::fabs(double(x[std::size_t(t * in + i)])));
          wsum += std::fabs(
              double(e2m1_to_float(e2m1_nibble(w.data() + o * (in / 2), std::size_t(i)))) *
              e8m0_to_double(s[std::size_t(o * (in / 32) + b)]));
        }
        bound[std::size_t(t * out + o)] += wsum * mx / 32767.0 * 0.5 * (1 + 1e-5);
      }
  return bound;
}

// expect_close with an absolute allowance per element added to tol * scale.
void expect_close_plus(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<double>& scale, double tol,
                       const std::vector<double>& extra, const std::string& what) {
  std::vector<double> combined(scale.size());
  for (std::size_t i = 0; i < scale.size(); ++i) combined[i] = scale[i] + extra[i] / tol;
  expect_close(got, want, combined, tol, what);
}

TEST_P(KernelTier, Mxfp4Gemv) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 32}, {7, 64}, {65, 2080}, {32, 5120}, {3, 2304}};
  for (const auto& [out, in] : shapes)
    for (int64_t ntok : {1, 3, 16}) {
      std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
          s(static_cast<std::size_t>(out * in / 32));
      for (auto& b : w) b = g_.byte();
      for (auto& b : s) b = g_.e8m0();
      std::vector<float> x(static_cast<std::size_t>(ntok * in));
      for (auto& v : x) v = g_.normal();
      std::vector<float> y(std::size_t(ntok * out), NAN), want(y.size());
      k_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), ntok, y.data());
      ref_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), ntok, want.data());
      const bool rounds = GetParam().isa != Isa::kScalar && ntok == 1;
      const auto extra =
          rounds ? fp4_act_rounding(w, s, out, in, x, ntok) : std::vector<double>(y.size(), 0.0);
      expect_close_plus(y, want, fp4_scale(w, s, out, in, x, ntok), sum_tol(in), extra,
                        "mxfp4_gemv " + std::to_string(out) + "x" + std::to_string(in));
    }
}

// The fp32 entries (what the fast forward calls): no int16 rounding allowance at any ntok, and the
// fused gate/up equals gate/up computed from the fp32 GEMV's rows.
TEST_P(KernelTier, Mxfp4F32EntriesHaveNoRounding) {
  // Odd block counts (96: three 32-blocks) and gate/up past the first 48 pairs (inter 50) too.
  for (const auto& [out, in] :
       std::vector<std::pair<int64_t, int64_t>>{{7, 64}, {64, 2304}, {9, 96}, {36, 96}, {100, 96}})
    for (int64_t ntok : {1, 3}) {
      std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
          s(static_cast<std::size_t>(out * in / 32));
      for (auto& b : w) b = g_.byte();
      for (auto& b : s) b = g_.e8m0();
      std::vector<float> x(static_cast<std::size_t>(ntok * in));
      for (auto& v : x) v = g_.normal();
      std::vector<float> y(std::size_t(ntok * out), NAN), want(y.size());
      k_->mxfp4_gemv_f32(w.data(), s.data(), out, in, x.data(), ntok, y.data());
      ref_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), ntok, want.data());
      expect_close(y, want, fp4_scale(w, s, out, in, x, ntok), sum_tol(in),
                   "mxfp4_gemv_f32 " + std::to_string(out) + "x" + std::to_string(in));
      if (out % 2) continue;
      const std::vector<float> route(std::size_t(ntok), 0.75f);
      std::vector<float> h(std::size_t(ntok * out / 2), NAN), hwant(h.size());
      k_->mxfp4_gate_up_f32(w.data(), s.data(), out / 2, in, x.data(), route.data(), ntok, 10.0f,
                            h.data());
      ref_->mxfp4_gate_up(w.data(), s.data(), out / 2, in, x.data(), route.data(), ntok, 10.0f,
                          hwant.data());
      // The gate and up sums carry fp32 accumulation error (sum_tol of their rows' scale); h =
      // silu(min(g, L)) * clamp(u, L) * route moves by at most route * (1.1 |u'| dg + |silu(g')|
      // du) (silu' <= 1.1). A fixed relative bound failed on rows whose h is small beside g and u.
      const auto sc = fp4_scale(w, s, out, in, x, ntok);
      std::vector<float> rows(std::size_t(ntok * out));
      ref_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), ntok, rows.data());
      const int64_t inter = out / 2;
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t j = 0; j < inter; ++j) {
          const std::size_t gi = std::size_t(t * out + 2 * j), ui = gi + 1;
          const double gc = std::min(double(rows[gi]), 10.0);
          const double uc = std::clamp(double(rows[ui]), -10.0, 10.0);
          const double dg = sum_tol(in) * sc[gi], du = sum_tol(in) * sc[ui];
          const double tol =
              0.75 * (1.1 * std::fabs(uc) * dg + std::fabs(gc / (1 + std::exp(-gc))) * du) +
              1e-6 * (1 + std::fabs(double(hwant[std::size_t(t * inter + j)])));
          EXPECT_NEAR(h[std::size_t(t * inter + j)], hwant[std::size_t(t * inter + j)], tol)
              << "gate/up " << t << "," << j;
        }
    }
}

// One token of MXFP4 (GEMV and fused gate/up) is an exact integer dot per block in every SIMD tier
// (vpmaddwd + vpaddd, or vpdpwssd with VNNI) followed by the same float steps: the bits must agree
// with the AVX2 tier's. Weights of every nibble and scale code, including odd block counts.
TEST_P(KernelTier, Mxfp4OneTokenBitsEqualAcrossSimdTiers) {
  if (GetParam().isa == Isa::kScalar) GTEST_SKIP() << "the scalar tier dots in double";
  const Kernels& avx2 = kernels_for(Isa::kAvx2);
  for (const auto& [out, in] : std::vector<std::pair<int64_t, int64_t>>{{9, 96}, {16, 5120}}) {
    std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
        s(static_cast<std::size_t>(out * in / 32));
    for (auto& b : w) b = g_.byte();
    for (auto& b : s) b = g_.e8m0();
    std::vector<float> x(static_cast<std::size_t>(in));
    for (auto& v : x) v = g_.normal();
    std::vector<float> y(std::size_t(out), NAN), want(y.size());
    k_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, y.data());
    avx2.mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, want.data());
    for (std::size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(bits_of_float(y[i]), bits_of_float(want[i]))
          << "gemv " << out << "x" << in << " row " << i;
    const float route = 0.75f;
    std::vector<float> h(std::size_t(out / 2), NAN), hwant(h.size());
    k_->mxfp4_gate_up(w.data(), s.data(), out / 2, in, x.data(), &route, 1, 10.0f, h.data());
    avx2.mxfp4_gate_up(w.data(), s.data(), out / 2, in, x.data(), &route, 1, 10.0f, hwant.data());
    for (std::size_t i = 0; i < h.size(); ++i)
      ASSERT_EQ(bits_of_float(h[i]), bits_of_float(hwant[i]))
          << "gate/up " << out << "x" << in << " " << i;
  }
}

// Activations near the top of the float range are finite: the one-token path's int16 rounding must
// treat them as any other block (an early version counted values above 3e38 as non-finite and
// answered NaN). Small weight scales keep the products finite.
TEST_P(KernelTier, Mxfp4GemvHugeFiniteActivations) {
  const int64_t out = 5, in = 96;
  std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
      s(static_cast<std::size_t>(out * in / 32), 100);  // 2^-27
  for (auto& b : w) b = g_.byte();
  std::vector<float> x(static_cast<std::size_t>(in));
  for (auto& v : x) v = g_.normal() * 1e37f;
  x[3] = 3.3e38f, x[40] = -3.4e38f, x[95] = 3.0000001e38f;
  std::vector<float> y(static_cast<std::size_t>(out), NAN), want(y.size());
  k_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, y.data());
  ref_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, want.data());
  const bool rounds = GetParam().isa != Isa::kScalar;
  const auto extra =
      rounds ? fp4_act_rounding(w, s, out, in, x, 1) : std::vector<double>(y.size(), 0.0);
  expect_close_plus(y, want, fp4_scale(w, s, out, in, x, 1), sum_tol(in), extra,
                    "mxfp4_gemv huge activations");
}

// A block of tiny activations (largest magnitude 1e-35, below 2^-96) cannot be rounded to int16
// with a normal step: the call takes the fp32 path and matches the reference to fp32 rounding (no
// rounding allowance). Huge weight scales make the products large enough for the tolerance to bind.
TEST_P(KernelTier, Mxfp4GemvTinyActivations) {
  const int64_t out = 5, in = 64;
  std::vector<uint8_t> w(static_cast<std::size_t>(out * in / 2)),
      s(static_cast<std::size_t>(out * in / 32), 250);  // 2^123
  for (auto& b : w) b = g_.byte();
  std::vector<float> x(static_cast<std::size_t>(in));
  for (auto& v : x) v = g_.normal();
  for (int64_t i = 32; i < 64; ++i) x[std::size_t(i)] = g_.normal() * 3e-36f;
  x[40] = 1e-35f;
  std::vector<float> y(static_cast<std::size_t>(out), NAN), want(y.size());
  for (std::size_t i = 0; i < 32; ++i) x[i] *= 1e-30f;  // keep the first block's products finite
  k_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, y.data());
  ref_->mxfp4_gemv(w.data(), s.data(), out, in, x.data(), 1, want.data());
  expect_close(y, want, fp4_scale(w, s, out, in, x, 1), sum_tol(in), "mxfp4_gemv tiny activations");
}

TEST_P(KernelTier, Mxfp4GateUpWithClampEpilogue) {
  for (const auto& [inter, dim] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {3, 64}, {17, 2304}, {8, 5120}, {50, 96}})
    for (int64_t ntok : {1, 4, 16, 17, 40}) {  // above 16: the grouped prefill (GEMM) path
      std::vector<uint8_t> w(static_cast<std::size_t>(2 * inter * dim / 2)),
          s(static_cast<std::size_t>(2 * inter * dim / 32));
      for (auto& b : w) b = g_.byte();
      for (auto& b : s)
        b = static_cast<uint8_t>(std::max<int>(g_.e8m0(), 4) - 4);  // g, u near the clamp
      std::vector<float> x(static_cast<std::size_t>(ntok * dim)),
          route(static_cast<std::size_t>(ntok));
      for (auto& v : x) v = g_.normal();
      for (auto& r : route) r = std::fabs(g_.normal());
      std::vector<float> h(std::size_t(ntok * inter), NAN), want(h.size());
      k_->mxfp4_gate_up(w.data(), s.data(), inter, dim, x.data(), route.data(), ntok, 10.0f,
                        h.data());
      ref_->mxfp4_gate_up(w.data(), s.data(), inter, dim, x.data(), route.data(), ntok, 10.0f,
                          want.data());
      // Error bound through the epilogue: |d(silu(g) u)| <= (|u| |silu'| |dg| + |silu(g)| |du|)
      // with |silu'| <= 1.1, |u| <= 10; the gate/up rows' term sums bound |dg|, |du|.
      auto sc = fp4_scale(w, s, 2 * inter, dim, x, ntok);
      if (GetParam().isa != Isa::kScalar && ntok == 1) {  // activation rounding (see Mxfp4Gemv)
        const auto extra = fp4_act_rounding(w, s, 2 * inter, dim, x, ntok);
        for (std::size_t i = 0; i < sc.size(); ++i) sc[i] += extra[i] / sum_tol(dim);
      }
      std::vector<double> scale(h.size());
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t j = 0; j < inter; ++j)
          scale[std::size_t(t * inter + j)] =
              route[std::size_t(t)] * (11.0 * sc[std::size_t(t * 2 * inter + 2 * j)] +
                                       (10.0 + std::fabs(want[std::size_t(t * inter + j)])) *
                                           sc[std::size_t(t * 2 * inter + 2 * j + 1)]);
      expect_close(h, want, scale, sum_tol(dim),
                   "mxfp4_gate_up " + std::to_string(inter) + "x" + std::to_string(dim));
    }
}

// Runs a prefill GEMM of the tier and the reference into y with row stride ldy = out + 3 and checks
// every valid element (fp32 vs double accumulation) and that the stride's gap stays untouched.
void check_gemm(const std::function<void(float*, int64_t, bool)>& run, int64_t out, int64_t ntok,
                const std::vector<double>& scale, int64_t in, const std::string& what) {
  const int64_t ldy = out + 3;
  std::vector<float> y(std::size_t(ntok * ldy), NAN), want(y.size(), NAN);
  run(y.data(), ldy, false);
  run(want.data(), ldy, true);
  std::vector<float> got_v, want_v;
  std::vector<double> scale_v;
  for (int64_t t = 0; t < ntok; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      got_v.push_back(y[std::size_t(t * ldy + o)]);
      want_v.push_back(want[std::size_t(t * ldy + o)]);
      scale_v.push_back(scale[std::size_t(t * out + o)]);
    }
    for (int64_t o = out; o < ldy; ++o)
      ASSERT_TRUE(std::isnan(y[std::size_t(t * ldy + o)])) << what << ": wrote past out";
  }
  expect_close(got_v, want_v, scale_v, sum_tol(in), what);
}

const std::vector<std::pair<int64_t, int64_t>> kGemmShapes = {
    {1, 32}, {7, 64}, {33, 288}, {100, 544}, {97, 96}};
const std::vector<int64_t> kGemmTokens = {1, 15, 16, 17, 40, 400};  // 400: two super-blocks

TEST_P(KernelTier, Fp8Gemm) {
  for (const auto& shape : kGemmShapes)
    for (int64_t ntok : kGemmTokens) {
      // Plain copies, not structured bindings: clang 14 cannot capture those in the lambdas below.
      int64_t out = shape.first, in = shape.second;
      if (in == 96) in = 40;  // a tail inside one scale block
      const int64_t sin = (in + 31) / 32;
      std::vector<uint8_t> w(std::size_t(out * in)), s(std::size_t((out + 31) / 32 * sin));
      for (auto& b : w) b = g_.e4m3();
      for (auto& b : s) b = g_.e8m0();
      std::vector<float> x(std::size_t(ntok * in));
      for (auto& v : x) v = g_.normal();
      std::vector<double> scale(std::size_t(ntok * out));
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i)
            scale[std::size_t(t * out + o)] +=
                std::fabs(double(e4m3_to_float(w[std::size_t(o * in + i)])) *
                          e8m0_to_double(s[std::size_t((o / 32) * sin + i / 32)]) *
                          x[std::size_t(t * in + i)]);
      check_gemm(
          [&](float* y, int64_t ldy, bool ref) {
            (ref ? ref_ : k_)->fp8_gemm(w.data(), s.data(), out, in, x.data(), ntok, y, ldy);
          },
          out, ntok, scale, in,
          "fp8_gemm " + std::to_string(out) + "x" + std::to_string(in) + " t" +
              std::to_string(ntok));
    }
}

TEST_P(KernelTier, Bf16Gemm) {
  for (const auto& shape : kGemmShapes)
    for (int64_t ntok : kGemmTokens) {
      // Plain copies, not structured bindings: clang 14 cannot capture those in the lambdas below.
      int64_t out = shape.first, in = shape.second;
      if (in == 96) in = 77;  // not a multiple of 8
      std::vector<uint16_t> w(std::size_t(out * in));
      for (auto& b : w) b = float_to_bf16(g_.normal());
      std::vector<float> x(std::size_t(ntok * in));
      for (auto& v : x) v = g_.normal();
      std::vector<double> scale(std::size_t(ntok * out));
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i)
            scale[std::size_t(t * out + o)] += std::fabs(
                double(bf16_to_float(w[std::size_t(o * in + i)])) * x[std::size_t(t * in + i)]);
      check_gemm(
          [&](float* y, int64_t ldy, bool ref) {
            (ref ? ref_ : k_)->bf16_gemm(w.data(), out, in, x.data(), ntok, y, ldy);
          },
          out, ntok, scale, in,
          "bf16_gemm " + std::to_string(out) + "x" + std::to_string(in) + " t" +
              std::to_string(ntok));
    }
}

// bf16_gemm (the vision tower's linears) gives a token the same bits alone and among others: each
// output's sum runs over K in one order whatever ntok is (tokens are broadcast lanes of the micro
// tile, partial tiles padded with zeros), which lets the rows of several images share one call.
TEST_P(KernelTier, Bf16GemmBitsDoNotDependOnTheTokenCount) {
  for (auto [out, in] : std::vector<std::pair<int64_t, int64_t>>{{100, 544}, {48, 3072}, {7, 77}}) {
    std::vector<uint16_t> w(std::size_t(out * in));
    for (auto& b : w) b = float_to_bf16(g_.normal());
    const int64_t most = 300;
    std::vector<float> x(std::size_t(most * in)), one(std::size_t(most * out));
    for (auto& v : x) v = g_.normal();
    for (int64_t t = 0; t < most; ++t)
      k_->bf16_gemm(w.data(), out, in, x.data() + t * in, 1, one.data() + t * out, out);
    for (int64_t n : {2, 7, 16, 17, 300}) {
      const int64_t ldy = out + 3;
      std::vector<float> y(std::size_t(n * ldy), NAN);
      k_->bf16_gemm(w.data(), out, in, x.data(), n, y.data(), ldy);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o)
          ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]),
                    bits_of_float(one[std::size_t(t * out + o)]))
              << "bf16_gemm " << out << "x" << in << " ntok " << n << " token " << t << " row "
              << o;
    }
  }
}

TEST_P(KernelTier, Bf16Gemv) {
  for (auto [out, in] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {7, 77}, {33, 512}, {9, 5120}}) {
    std::vector<uint16_t> w(static_cast<std::size_t>(out * in));
    for (auto& b : w) b = float_to_bf16(g_.normal());
    std::vector<float> x(static_cast<std::size_t>(in));
    for (auto& v : x) v = g_.normal();
    std::vector<float> y(std::size_t(out), NAN), want(y.size()), part(y.size(), NAN);
    std::vector<double> scale(y.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        scale[std::size_t(o)] +=
            std::fabs(double(bf16_to_float(w[std::size_t(o * in + i)])) * x[std::size_t(i)]);
    k_->bf16_gemv(w.data(), out, in, x.data(), y.data());
    ref_->bf16_gemv(w.data(), out, in, x.data(), want.data());
    expect_close(y, want, scale, sum_tol(in),
                 "bf16_gemv " + std::to_string(out) + "x" + std::to_string(in));
    // Rows split anywhere give the same bits (the fast forward splits rows over threads).
    for (int64_t o0 = 0; o0 < out; o0 += 3)
      k_->bf16_gemv(w.data() + o0 * in, std::min<int64_t>(3, out - o0), in, x.data(),
                    part.data() + o0);
    for (int64_t o = 0; o < out; ++o)
      ASSERT_EQ(bits_of_float(part[std::size_t(o)]), bits_of_float(y[std::size_t(o)])) << o;
  }
}

// The batch entries give every token exactly the one-token entry's bits (the fast forward's batch
// invariance rests on it): FP8, BF16, MXFP4 GEMV and gate/up, several shapes and token counts,
// output strides wider than the rows; an odd count of 32-blocks (the MXFP4 tiles' lone last
// block), row counts past the tiles' multiples, token counts split into unequal passes, and FP8
// rows long enough for the AVX-512 one-token group path with a tail past the last 32-block.
TEST_P(KernelTier, BatchGemvsEqualOneTokenBitForBit) {
  for (const auto& [out, in] : std::vector<std::pair<int64_t, int64_t>>{
           {33, 64}, {35, 96}, {100, 96}, {64, 2304}, {40, 5120}, {35, 4096 + 40}})
    for (int64_t ntok : {1, 2, 3, 5, 7, 16, 64, 500}) {
      // the fast engine calls these with up to 64 tokens (its chunk); 500 on the small shapes
      if (ntok == 500 && in > 96) continue;
      const int64_t ldy = out + 3;
      std::vector<float> x(static_cast<std::size_t>(ntok * in));
      for (auto& v : x) v = g_.normal();
      x[5] = 0;  // a zero and a tiny block do not break the equality
      std::vector<float> y(static_cast<std::size_t>(ntok * ldy), NAN),
          one(static_cast<std::size_t>(out));
      // FP8
      std::vector<uint8_t> w8(static_cast<std::size_t>(out * in)),
          s8(static_cast<std::size_t>(((out + 31) / 32) * ((in + 31) / 32)));
      for (auto& b : w8) b = g_.e4m3();
      for (auto& b : s8) b = g_.e8m0();
      s8[0] = 250;  // 2^123 x 2^8 is past a normal float: group 0 takes the unprescaled path
      k_->fp8_gemv_batch(w8.data(), s8.data(), out, in, x.data(), ntok, y.data(), ldy);
      for (int64_t t = 0; t < ntok; ++t) {
        k_->fp8_gemv(w8.data(), s8.data(), out, in, x.data() + t * in, 1, one.data());
        for (int64_t o = 0; o < out; ++o)
          ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]), bits_of_float(one[std::size_t(o)]))
              << "fp8 " << out << "x" << in << " t" << t << "/" << ntok << " row " << o;
      }
      // BF16
      std::vector<uint16_t> wb(static_cast<std::size_t>(out * in));
      for (auto& b : wb) b = float_to_bf16(g_.normal());
      k_->bf16_gemv_batch(wb.data(), out, in, x.data(), ntok, y.data(), ldy);
      for (int64_t t = 0; t < ntok; ++t) {
        k_->bf16_gemv(wb.data(), out, in, x.data() + t * in, one.data());
        for (int64_t o = 0; o < out; ++o)
          ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]), bits_of_float(one[std::size_t(o)]))
              << "bf16 t" << t << " row " << o;
      }
      if (in % 32 != 0) continue;  // MXFP4 rows are whole 32-blocks
      // MXFP4
      std::vector<uint8_t> w4(static_cast<std::size_t>(out * in / 2)),
          s4(static_cast<std::size_t>(out * in / 32));
      for (auto& b : w4) b = g_.byte();
      for (auto& b : s4) b = g_.e8m0();
      k_->mxfp4_gemv_batch(w4.data(), s4.data(), out, in, x.data(), ntok, y.data(), ldy);
      for (int64_t t = 0; t < ntok; ++t) {
        k_->mxfp4_gemv_f32(w4.data(), s4.data(), out, in, x.data() + t * in, 1, one.data());
        for (int64_t o = 0; o < out; ++o)
          ASSERT_EQ(bits_of_float(y[std::size_t(t * ldy + o)]), bits_of_float(one[std::size_t(o)]))
              << "mxfp4 t" << t << " row " << o;
      }
      if (out % 2) continue;
      std::vector<float> route(static_cast<std::size_t>(ntok));
      for (auto& r : route) r = 0.5f + std::fabs(g_.normal());
      const int64_t inter = out / 2, ldh = inter + 1;
      std::vector<float> h(static_cast<std::size_t>(ntok * ldh), NAN),
          h1(static_cast<std::size_t>(inter));
      k_->mxfp4_gate_up_batch(w4.data(), s4.data(), inter, in, x.data(), route.data(), ntok, 10.0f,
                              h.data(), ldh);
      for (int64_t t = 0; t < ntok; ++t) {
        k_->mxfp4_gate_up_f32(w4.data(), s4.data(), inter, in, x.data() + t * in, route.data() + t,
                              1, 10.0f, h1.data());
        for (int64_t j = 0; j < inter; ++j)
          ASSERT_EQ(bits_of_float(h[std::size_t(t * ldh + j)]), bits_of_float(h1[std::size_t(j)]))
              << "gate/up t" << t << " " << j;
      }
    }
  // FP8 rows past kFp8ScaledMax (16,384 values) take the per-token path in every tier.
  const int64_t out = 3, in = 16384 + 32, ntok = 2;
  std::vector<float> x(static_cast<std::size_t>(ntok * in));
  for (auto& v : x) v = g_.normal();
  std::vector<uint8_t> w8(static_cast<std::size_t>(out * in)),
      s8(static_cast<std::size_t>((in + 31) / 32));
  for (auto& b : w8) b = g_.e4m3();
  for (auto& b : s8) b = g_.e8m0();
  std::vector<float> y(static_cast<std::size_t>(ntok * out), NAN),
      one(static_cast<std::size_t>(out));
  k_->fp8_gemv_batch(w8.data(), s8.data(), out, in, x.data(), ntok, y.data(), out);
  for (int64_t t = 0; t < ntok; ++t) {
    k_->fp8_gemv(w8.data(), s8.data(), out, in, x.data() + t * in, 1, one.data());
    for (int64_t o = 0; o < out; ++o)
      ASSERT_EQ(bits_of_float(y[std::size_t(t * out + o)]), bits_of_float(one[std::size_t(o)]))
          << "fp8 long rows t" << t << " row " << o;
  }
}

TEST_P(KernelTier, Mxfp4Gemm) {
  for (const auto& shape : kGemmShapes)
    for (int64_t ntok : kGemmTokens) {
      // Plain copies, not structured bindings: clang 14 cannot capture those in the lambdas below.
      int64_t out = shape.first, in = shape.second;
      std::vector<uint8_t> w(std::size_t(out * in / 2)), s(std::size_t(out * in / 32));
      for (auto& b : w) b = g_.byte();
      for (auto& b : s) b = g_.e8m0();
      std::vector<float> x(std::size_t(ntok * in));
      for (auto& v : x) v = g_.normal();
      check_gemm(
          [&](float* y, int64_t ldy, bool ref) {
            (ref ? ref_ : k_)->mxfp4_gemm(w.data(), s.data(), out, in, x.data(), ntok, y, ldy);
          },
          out, ntok, fp4_scale(w, s, out, in, x, ntok), in,
          "mxfp4_gemm " + std::to_string(out) + "x" + std::to_string(in) + " t" +
              std::to_string(ntok));
    }
}

TEST_P(KernelTier, RmsNorm) {
  for (int64_t n : {1, 7, 8, 33, 512, 5120}) {
    std::vector<float> x(static_cast<std::size_t>(n)), w(static_cast<std::size_t>(n));
    for (auto& v : x) v = g_.normal() * 3;
    for (auto& v : w) v = g_.normal();
    std::vector<float> y(std::size_t(n), NAN), want(y.size());
    k_->rmsnorm(x.data(), w.data(), n, 1e-20f, y.data());
    ref_->rmsnorm(x.data(), w.data(), n, 1e-20f, want.data());
    std::vector<double> scale(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) scale[i] = std::fabs(double(want[i])) + 1e-30;
    expect_close(y, want, scale, 4e-6 + 1e-7 * std::sqrt(double(n)),
                 "rmsnorm " + std::to_string(n));
    // In place (y aliases x).
    std::vector<float> inplace = x;
    k_->rmsnorm(inplace.data(), w.data(), n, 1e-20f, inplace.data());
    expect_close(inplace, want, scale, 4e-6 + 1e-7 * std::sqrt(double(n)), "rmsnorm in place");
  }
}

TEST_P(KernelTier, ReadSum) {
  for (int64_t n : {0, 1, 31, 32, 1000, 100000}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    double scale = 0;
    for (auto& v : x) scale += std::fabs(v = g_.normal());
    const float got = k_->read_sum(x.data(), n), want = ref_->read_sum(x.data(), n);
    EXPECT_LE(std::fabs(double(got) - want), sum_tol(n) * scale + 1e-30) << n;
  }
}

TEST_P(KernelTier, RopeBitIdenticalToTheReference) {
  for (int64_t dim : {2, 6, 10, 64, 128}) {
    for (int64_t n : {dim, dim + 448}) {
      auto rope = ref::Rope<float>::make(dim, 160000.0, dim >= 64, 16.0, 65536.0, 32.0, 1.0);
      for (int64_t pos : {int64_t(0), int64_t(1), int64_t(777), int64_t(65535)}) {
        for (bool inverse : {false, true}) {
          std::vector<float> v(static_cast<std::size_t>(n));
          for (auto& x : v) x = g_.normal();
          std::vector<float> want = v;
          rope.apply(want.data(), n, pos, inverse);
          std::vector<float> c(static_cast<std::size_t>(dim / 2)), sn(c.size());
          for (std::size_t i = 0; i < c.size(); ++i) {
            const float th = float(pos) * rope.freq[i];
            c[i] = std::cos(th), sn[i] = std::sin(th);
          }
          k_->rope(v.data(), n, dim, c.data(), sn.data(), inverse);
          ASSERT_EQ(0, std::memcmp(v.data(), want.data(), v.size() * 4))
              << "dim " << dim << " n " << n << " pos " << pos << " inverse " << inverse;
        }
      }
    }
  }
}

TEST_P(KernelTier, IndexerScoresOverPackedKeys) {
  for (const auto& shape : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {4, 64}, {32, 128}}) {
    const int64_t nh = shape.first, di = shape.second;  // copies: captured below (clang 14)
    const int64_t row = index_key_bytes(di);
    for (int64_t nkeys : {1, 7, 300}) {
      std::vector<uint8_t> q(static_cast<std::size_t>(nh * row)),
          keys(static_cast<std::size_t>(nkeys * row));
      std::vector<float> v(static_cast<std::size_t>(di)), w(static_cast<std::size_t>(nh));
      auto fill_row = [&](uint8_t* out, float mag) {
        for (auto& x : v) x = g_.normal() * mag;
        pack_index_key(v.data(), di, out);
      };
      for (int64_t h = 0; h < nh; ++h)
        fill_row(q.data() + h * row, std::ldexp(1.0f, int(g_.byte() % 8) - 4));
      for (int64_t j = 0; j < nkeys; ++j)
        fill_row(keys.data() + j * row, std::ldexp(1.0f, int(g_.byte() % 8) - 4));
      for (auto& x : w) x = g_.normal();
      std::vector<float> got(static_cast<std::size_t>(nkeys), NAN), want(got.size());
      k_->indexer_scores(q.data(), w.data(), nh, di, keys.data(), nkeys, got.data());
      ref_->indexer_scores(q.data(), w.data(), nh, di, keys.data(), nkeys, want.data());
      // Scale: sum over heads of |w_h| * sum_i |q_i k_i| (from the unpacked values).
      std::vector<float> qf(static_cast<std::size_t>(nh * di)), kf(static_cast<std::size_t>(di));
      for (int64_t h = 0; h < nh; ++h) unpack_index_key(q.data() + h * row, di, qf.data() + h * di);
      std::vector<double> scale(got.size());
      for (int64_t j = 0; j < nkeys; ++j) {
        unpack_index_key(keys.data() + j * row, di, kf.data());
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t i = 0; i < di; ++i)
            scale[static_cast<std::size_t>(j)] += std::fabs(
                double(w[static_cast<std::size_t>(h)]) * qf[static_cast<std::size_t>(h * di + i)] *
                kf[static_cast<std::size_t>(i)]);
      }
      expect_close(got, want, scale, sum_tol(nh * di),
                   "indexer " + std::to_string(nh) + "x" + std::to_string(di));
      // Keys scored eight at a time (across vector lanes) equal keys scored one by one.
      for (int64_t j = 0; j < nkeys; ++j) {
        float one = NAN;
        k_->indexer_scores(q.data(), w.data(), nh, di, keys.data() + j * row, 1, &one);
        ASSERT_EQ(one, got[std::size_t(j)]) << "key " << j << " of " << nkeys;
      }
    }
  }
}

TEST_P(KernelTier, SparseAttentionWithSinkOverPackedRows) {
  for (const auto& [heads, dim] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {4, 64}, {64, 512}}) {
    for (int64_t nrows : {0, 1, 5, 200}) {
      std::vector<std::vector<uint8_t>> packed(static_cast<std::size_t>(nrows));
      std::vector<const uint8_t*> rows;
      std::vector<uint8_t> kinds;
      std::vector<float> v(static_cast<std::size_t>(dim)),
          absmax(static_cast<std::size_t>(dim), 0.0f);
      for (int64_t r = 0; r < nrows; ++r) {
        const uint8_t kind = r % 3 == 0 ? 1 : 0;
        for (auto& x : v) x = g_.normal();
        auto& buf = packed[static_cast<std::size_t>(r)];
        buf.resize(
            static_cast<std::size_t>(kind ? compressed_row_bytes(dim) : window_row_bytes(dim)));
        if (kind)
          pack_compressed_row(v.data(), dim, buf.data());
        else
          pack_window_row(v.data(), dim, buf.data());
        std::vector<float> u(v.size());
        if (kind)
          unpack_compressed_row(buf.data(), dim, u.data());
        else
          unpack_window_row(buf.data(), dim, u.data());
        for (std::size_t i = 0; i < u.size(); ++i) absmax[i] = std::max(absmax[i], std::fabs(u[i]));
        rows.push_back(buf.data());
        kinds.push_back(kind);
      }
      std::vector<float> q(static_cast<std::size_t>(heads * dim)),
          sink(static_cast<std::size_t>(heads));
      for (auto& x : q) x = g_.normal();
      for (auto& x : sink) x = g_.normal() * 2;
      const float scale = 1.0f / std::sqrt(float(dim));
      std::vector<float> got(static_cast<std::size_t>(heads * dim), NAN), want(got.size());
      k_->sparse_attention(q.data(), heads, dim, rows.data(), kinds.data(), nrows, scale,
                           sink.data(), got.data());
      ref_->sparse_attention(q.data(), heads, dim, rows.data(), kinds.data(), nrows, scale,
                             sink.data(), want.data());
      // Each output is a weighted mean of row values (weights <= 1): errors scale with the rows'
      // size.
      std::vector<double> sc(got.size());
      for (std::size_t i = 0; i < sc.size(); ++i)
        sc[i] = absmax[i % static_cast<std::size_t>(dim)] + 1e-30;
      expect_close(got, want, sc, 2e-5 + 1e-6 * double(dim) / 64,
                   "attention " + std::to_string(heads) + "x" + std::to_string(dim) + " rows " +
                       std::to_string(nrows));
    }
  }
}

// Prefill attention: a block of queries over a banded window (held from position wpos0) plus
// per-query compressed rows, against the reference (the one-query kernel on each query's row list),
// and against the tier's own one-query kernel on the same list (the banded path must not change
// what a query sees).
TEST_P(KernelTier, PrefillAttentionBandedWindowAndCompressed) {
  struct Case {
    int64_t heads, dim, nq, p0, window;
  };
  for (const Case& c : std::vector<Case>{
           {1, 32, 1, 0, 4}, {4, 64, 9, 0, 4}, {4, 64, 7, 20, 8}, {8, 512, 20, 130, 128}}) {
    const int64_t wpos0 = std::max<int64_t>(0, c.p0 - c.window + 1) - (c.p0 > 3 ? 2 : 0);
    const int64_t nwin = c.p0 + c.nq - wpos0 + 1;  // one spare row past the last query
    const int64_t wb = window_row_bytes(c.dim), cb = compressed_row_bytes(c.dim);
    std::vector<uint8_t> win(std::size_t(nwin * wb));
    std::vector<float> v(std::size_t(c.dim)), absmax(std::size_t(c.dim), 0.0f),
        u(std::size_t(c.dim));
    for (int64_t r = 0; r < nwin; ++r) {
      for (auto& x : v) x = g_.normal();
      pack_window_row(v.data(), c.dim, win.data() + r * wb);
      unpack_window_row(win.data() + r * wb, c.dim, u.data());
      for (std::size_t i = 0; i < u.size(); ++i) absmax[i] = std::max(absmax[i], std::fabs(u[i]));
    }
    std::vector<std::vector<uint8_t>> comp_store;
    std::vector<int64_t> cofs = {0};
    for (int64_t i = 0; i < c.nq; ++i) {
      const int64_t n = int64_t(g_.rng() % 6);  // 0..5 compressed rows for this query
      for (int64_t k = 0; k < n; ++k) {
        for (auto& x : v) x = g_.normal();
        comp_store.emplace_back(std::size_t(cb));
        pack_compressed_row(v.data(), c.dim, comp_store.back().data());
        unpack_compressed_row(comp_store.back().data(), c.dim, u.data());
        for (std::size_t j = 0; j < u.size(); ++j) absmax[j] = std::max(absmax[j], std::fabs(u[j]));
      }
      cofs.push_back(cofs.back() + n);
    }
    std::vector<const uint8_t*> comp;
    for (auto& r : comp_store) comp.push_back(r.data());
    std::vector<float> q(std::size_t(c.nq * c.heads * c.dim)), sink(std::size_t(c.heads));
    for (auto& x : q) x = g_.normal();
    for (auto& x : sink) x = g_.normal() * 2;
    const float scale = 1.0f / std::sqrt(float(c.dim));
    std::vector<float> got(q.size(), NAN), want(q.size(), NAN), single(q.size(), NAN);
    k_->prefill_attention(q.data(), c.nq, c.heads, c.dim, win.data(), wpos0, nwin, c.p0, c.window,
                          comp.data(), cofs.data(), scale, sink.data(), got.data());
    ref_->prefill_attention(q.data(), c.nq, c.heads, c.dim, win.data(), wpos0, nwin, c.p0, c.window,
                            comp.data(), cofs.data(), scale, sink.data(), want.data());
    for (int64_t i = 0; i < c.nq; ++i) {  // the tier's one-query kernel on the same row list
      std::vector<const uint8_t*> rows;
      std::vector<uint8_t> kinds;
      const int64_t p = c.p0 + i;
      for (int64_t k = std::max<int64_t>(0, p - c.window + 1); k <= p; ++k)
        rows.push_back(win.data() + (k - wpos0) * wb), kinds.push_back(0);
      for (int64_t k = cofs[std::size_t(i)]; k < cofs[std::size_t(i) + 1]; ++k)
        rows.push_back(comp[std::size_t(k)]), kinds.push_back(1);
      k_->sparse_attention(q.data() + i * c.heads * c.dim, c.heads, c.dim, rows.data(),
                           kinds.data(), int64_t(rows.size()), scale, sink.data(),
                           single.data() + i * c.heads * c.dim);
    }
    std::vector<double> sc(got.size());
    for (std::size_t i = 0; i < sc.size(); ++i) sc[i] = absmax[i % std::size_t(c.dim)] + 1e-30;
    const std::string what = "prefill attention " + std::to_string(c.heads) + "x" +
                             std::to_string(c.dim) + " nq " + std::to_string(c.nq);
    expect_close(got, want, sc, 2e-5 + 1e-6 * double(c.dim) / 64, what);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], single[i]) << what << ": differs from the one-query kernel at " << i;
  }
}

// The vision tower's attention (Kernels::vision_attention) on inputs laid out as the tower holds
// them: one buffer of rows [q | k | v], heads in order inside each. Normal cases: N(0, 1) values,
// scale 1/sqrt(dim). Exact cases: integer q and k in [-7, 7] and scale 1/2, so every score is exact
// in fp32 and they spread over hundreds (a kernel without the max subtraction overflows exp there).
struct VaCase {
  int64_t n, heads, dim;
  bool exact;
};
struct VaInputs {
  std::vector<float> qkv;
  int64_t ld = 0;
  float scale = 0;
};
VaInputs va_inputs(const VaCase& c, Gen& g) {
  VaInputs in;
  const int64_t w = c.heads * c.dim;
  in.ld = 3 * w;
  in.scale = c.exact ? 0.5f : 1.0f / std::sqrt(float(c.dim));
  in.qkv.resize(std::size_t(c.n * in.ld));
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t e = 0; e < in.ld; ++e)
      in.qkv[std::size_t(r * in.ld + e)] =
          c.exact && e < 2 * w ? float(int64_t(g.rng() % 15) - 7) : g.normal();
  return in;
}
using VaFn = std::function<void(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, float, float*, int64_t)>;
// out [n, heads * dim] of f on the inputs, all queries in one call.
std::vector<float> va_run(const VaFn& f, const VaCase& c, const VaInputs& in) {
  const int64_t w = c.heads * c.dim;
  std::vector<float> out(std::size_t(c.n * w), NAN);
  const float* b = in.qkv.data();
  f(b, b + w, b + 2 * w, in.ld, c.n, c.n, c.heads, c.dim, in.scale, out.data(), w);
  return out;
}
// Per (query, head) row, the weighted sum of the values' magnitudes, sum_j p_j |v_j| (in double):
// what the fp32 sums of a row can err by is relative to it, not to the output, which the signs of
// random values cancel well below it (relative to the output, the errors of every tier reach
// 1.3e-6 at 1,000 keys).
std::vector<double> va_abs_rows(const VaCase& c, const VaInputs& in) {
  const int64_t w = c.heads * c.dim;
  std::vector<double> a(std::size_t(c.n * w), 0.0), p(std::size_t(c.n));
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i = 0; i < c.n; ++i) {
      double mx = -INFINITY, den = 0;
      for (int64_t j = 0; j < c.n; ++j) {
        double d = 0;
        for (int64_t e = 0; e < c.dim; ++e)
          d += double(in.qkv[std::size_t(i * in.ld + h * c.dim + e)]) *
               in.qkv[std::size_t(j * in.ld + w + h * c.dim + e)];
        mx = std::max(mx, p[std::size_t(j)] = d * in.scale);
      }
      for (auto& x : p) den += (x = std::exp(x - mx));
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t e = 0; e < c.dim; ++e)
          a[std::size_t(i * w + h * c.dim + e)] +=
              p[std::size_t(j)] / den *
              std::fabs(double(in.qkv[std::size_t(j * in.ld + 2 * w + h * c.dim + e)]));
    }
  return a;
}
// The worst over the (query, head) rows of |got - want| / |abs row| (L2 norms); +inf if got holds
// a NaN or an infinity.
double va_worst_err(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<double>& abs_rows, int64_t dim) {
  double worst = 0;
  for (std::size_t r = 0; r < got.size(); r += std::size_t(dim)) {
    double num = 0, den = 0;
    for (std::size_t e = r; e < r + std::size_t(dim); ++e) {
      if (!std::isfinite(got[e])) return INFINITY;
      num += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
      den += abs_rows[e] * abs_rows[e];
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-300)));
  }
  return worst;
}
const std::vector<VaCase>& va_cases() {
  // tiny (2 x 16), demo/small (4 x 32) and released (16 x 64) head shapes; n = 1, below, at and
  // past one 64-key block, and long rows.
  static const std::vector<VaCase> cases = {
      {1, 2, 16, false},   {5, 2, 16, false},    {64, 2, 16, false},   {65, 4, 32, false},
      {130, 4, 20, false}, {257, 16, 64, false}, {1000, 2, 64, false}, {1, 16, 64, true},
      {100, 4, 64, true},  {193, 16, 64, true}};
  return cases;
}
// fp32 against the double reference: measured 7e-8 to 3.5e-7 per case on every tier (Zen 4, several
// seeds); a dropped key or a missing max subtraction is far above it
// (VisionAttention.TheToleranceCatchesWrongKernels).
constexpr double kVaTol = 1e-6;

TEST_P(KernelTier, VisionAttentionAgainstTheReference) {
  for (const VaCase& c : va_cases()) {
    const VaInputs in = va_inputs(c, g_);
    const std::vector<float> got = va_run(k_->vision_attention, c, in),
                             want = va_run(ref_->vision_attention, c, in);
    const std::string what = "vision attention n " + std::to_string(c.n) + " " +
                             std::to_string(c.heads) + "x" + std::to_string(c.dim) +
                             (c.exact ? " exact" : "");
    const double err = va_worst_err(got, want, va_abs_rows(c, in), c.dim);
    EXPECT_LE(err, kVaTol) << what;
    std::printf("%s: worst row error %.3g\n", what.c_str(), err);
    // The same bits whatever the split: each head alone, the queries in three uneven calls.
    const int64_t w = c.heads * c.dim, a = c.n / 3, b = std::min<int64_t>(c.n, a + 7);
    std::vector<float> split(got.size(), NAN);
    const float* base = in.qkv.data();
    for (int64_t h = 0; h < c.heads; ++h)
      for (auto [i0, i1] : {std::pair{int64_t(0), a}, {a, b}, {b, c.n}}) {
        if (i1 <= i0) continue;
        const float* qh = base + i0 * in.ld + h * c.dim;
        k_->vision_attention(qh, base + w + h * c.dim, base + 2 * w + h * c.dim, in.ld, i1 - i0,
                             c.n, 1, c.dim, in.scale, split.data() + i0 * w + h * c.dim, w);
      }
    ASSERT_EQ(0, std::memcmp(split.data(), got.data(), got.size() * sizeof(float)))
        << what << ": a split of the rows changed the bits";
  }
  // No keys: zeros.
  std::vector<float> q(64, 1.0f), out(64, NAN);
  k_->vision_attention(q.data(), q.data(), q.data(), 64, 1, 0, 4, 16, 0.25f, out.data(), 64);
  for (float x : out) ASSERT_EQ(x, 0.0f);
}

// The tolerance binds: kernels with a deliberate mistake fail it on the cases above (on the best
// tier of this CPU): the last key dropped, the first key dropped, and an fp32 kernel without the
// max subtraction (exp overflows on the exact cases).
TEST(VisionAttention, TheToleranceCatchesWrongKernels) {
  const Kernels& best = kernels();
  const Kernels& ref = kernels_for(Isa::kScalar);
  const VaFn drop_last = [&](const float* q, const float* k, const float* v, int64_t ld, int64_t nq,
                             int64_t nk, int64_t heads, int64_t dim, float scale, float* out,
                             int64_t ldo) {
    best.vision_attention(q, k, v, ld, nq, nk - 1, heads, dim, scale, out, ldo);
  };
  const VaFn drop_first = [&](const float* q, const float* k, const float* v, int64_t ld,
                              int64_t nq, int64_t nk, int64_t heads, int64_t dim, float scale,
                              float* out, int64_t ldo) {
    best.vision_attention(q, k + ld, v + ld, ld, nq, nk - 1, heads, dim, scale, out, ldo);
  };
  const VaFn no_max = [](const float* q, const float* k, const float* v, int64_t ld, int64_t nq,
                         int64_t nk, int64_t heads, int64_t dim, float scale, float* out,
                         int64_t ldo) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < nq; ++i) {
        std::vector<float> acc(std::size_t(dim), 0.0f);
        float den = 0;
        for (int64_t j = 0; j < nk; ++j) {
          float s = 0;
          for (int64_t e = 0; e < dim; ++e) s += q[i * ld + h * dim + e] * k[j * ld + h * dim + e];
          const float p = std::exp(s * scale);
          den += p;
          for (int64_t e = 0; e < dim; ++e) acc[std::size_t(e)] += p * v[j * ld + h * dim + e];
        }
        for (int64_t e = 0; e < dim; ++e) out[i * ldo + h * dim + e] = acc[std::size_t(e)] / den;
      }
  };
  Gen g;
  auto err = [&](const VaFn& f, const VaCase& c) {
    const VaInputs in = va_inputs(c, g);
    return va_worst_err(va_run(f, c, in), va_run(ref.vision_attention, c, in), va_abs_rows(c, in),
                        c.dim);
  };
  // One key of 257 or 1,000 missing, on the long rows, is far above the tolerance.
  for (const VaCase& c : {VaCase{257, 16, 64, false}, VaCase{1000, 2, 64, false}}) {
    EXPECT_GT(err(drop_last, c), 100 * kVaTol) << "last key dropped, n " << c.n;
    EXPECT_GT(err(drop_first, c), 100 * kVaTol) << "first key dropped, n " << c.n;
  }
  // Without the max subtraction exp overflows on the exact cases' scores (NaN or inf: +inf).
  EXPECT_GT(err(no_max, VaCase{193, 16, 64, true}), 100 * kVaTol);
  EXPECT_GT(err(no_max, VaCase{100, 4, 64, true}), 100 * kVaTol);
}

// mHC expand: bit-identical to the model reference's expand (float) on every tier.
TEST_P(KernelTier, HcExpandBitIdenticalToTheReference) {
  for (int64_t hc : {1, 2, 4})
    for (int64_t d : {5, 8, 100, 5120}) {
      std::vector<float> y(static_cast<std::size_t>(d)), res(static_cast<std::size_t>(hc * d));
      for (auto& v : y) v = g_.normal();
      for (auto& v : res) v = g_.normal();
      ref::HcMix<float> mx;
      for (int64_t k = 0; k < hc; ++k) mx.post.push_back(std::fabs(g_.normal()));
      for (int64_t k = 0; k < hc * hc; ++k) mx.comb.push_back(std::fabs(g_.normal()) / 2);
      std::vector<float> got(res.size(), NAN), want(res.size());
      k_->hc_expand(y.data(), res.data(), mx.post.data(), mx.comb.data(), hc, d, got.data());
      ref::hc_expand(y.data(), res.data(), mx, hc, d, want.data());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "hc " << hc << " d " << d << " at " << i;
    }
}

// Collapse + RMSNorm: the collapse is the model reference's (float, bit-identical x); the rms is
// compared with its exact value (double over those x), under a worst-case bound, not a statistical
// one: the SIMD tiers sum squares in 8 lanes of d/8 fused multiply-adds each, then 3 adds across
// lanes and up to 7 tail terms of 2 roundings: |rel error of the sum| <= (d/8 + 17) u; /d, +eps,
// sqrt (halves it), 1/x, x*r and w*(.) add 5 u. A divisor of d - 1 (seen failing) or a lost tail or
// block is caught (d = 5120: d - 1 moves every output by 1/(2d) = 1e-4, 5x the bound).
TEST_P(KernelTier, HcCollapseFusedWithRmsNorm) {
  constexpr double kU = 0x1p-24;
  for (int64_t hc : {1, 3, 4})
    for (int64_t d : {7, 64, 100, 5120}) {
      std::vector<float> h(static_cast<std::size_t>(hc * d)), nw(static_cast<std::size_t>(d));
      for (auto& v : h) v = g_.normal();
      for (auto& v : nw) v = g_.normal();
      std::vector<float> w;
      for (int64_t j = 0; j < hc; ++j) w.push_back(std::fabs(g_.normal()) + 0.1f);
      std::vector<float> got(static_cast<std::size_t>(d), NAN), x(got.size());
      k_->hc_collapse_rmsnorm(h.data(), w.data(), hc, d, nw.data(), 1e-6f, got.data());
      ref::hc_collapse(h.data(), w, hc, d, x.data());
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double r = 1 / std::sqrt(ss / double(d) + double(1e-6f));
      const double tol = (0.5 * (double(d) / 8 + 17) + 5) * kU;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double want = double(nw[i]) * double(x[i]) * r;
        ASSERT_LE(std::fabs(double(got[i]) - want), tol * std::fabs(want) + 1e-30)
            << "hc " << hc << " d " << d << " at " << i << " got " << got[i] << " want " << want;
      }
    }
}

// mHC coefficients (rms, the (2 + hc) * hc row dots, epilogue and Sinkhorn): the scalar tier
// against the model reference in double; every tier against the scalar tier (pre, post and comb
// are O(1); a wrong row, scale or rms moves them by far more than the tolerance).
TEST_P(KernelTier, HcMixCoefficients) {
  for (int64_t hc : {2, 4})
    for (int64_t d : {16, 64, 300}) {
      const int64_t n = hc * d, mix = (2 + hc) * hc;
      ref::Mat<double> fn;
      fn.rows = mix, fn.cols = n;
      fn.v.resize(static_cast<std::size_t>(mix * n));
      for (auto& v : fn.v) v = double(g_.normal() * 0.05f);
      std::vector<double> hd(static_cast<std::size_t>(n)), based(static_cast<std::size_t>(mix)),
          scaled = {0.9, 1.1, 1.3};
      for (auto& v : hd) v = double(g_.normal());
      for (auto& v : based) v = double(g_.normal() * 0.3f);
      std::vector<float> h(hd.begin(), hd.end()), f(fn.v.begin(), fn.v.end()),
          base(based.begin(), based.end()), scale(scaled.begin(), scaled.end());
      const auto want = ref::hc_mixes(hd.data(), hc, d, fn, based, scaled, 1e-6, 1e-6, 20);
      std::vector<float> pre(std::size_t(hc), NAN), post(std::size_t(hc), NAN),
          comb(std::size_t(hc * hc), NAN), rpre = pre, rpost = post, rcomb = comb;
      ref_->hc_mix(h.data(), hc, d, f.data(), base.data(), scale.data(), 1e-6f, 1e-6f, 20,
                   rpre.data(), rpost.data(), rcomb.data());
      k_->hc_mix(h.data(), hc, d, f.data(), base.data(), scale.data(), 1e-6f, 1e-6f, 20, pre.data(),
                 post.data(), comb.data());
      for (int64_t j = 0; j < hc; ++j) {
        EXPECT_NEAR(rpre[std::size_t(j)], want.pre[std::size_t(j)], 1e-5);
        EXPECT_NEAR(rpost[std::size_t(j)], want.post[std::size_t(j)], 1e-5);
        EXPECT_NEAR(pre[std::size_t(j)], rpre[std::size_t(j)], 1e-5);
        EXPECT_NEAR(post[std::size_t(j)], rpost[std::size_t(j)], 1e-5);
      }
      for (int64_t j = 0; j < hc * hc; ++j) {
        EXPECT_NEAR(rcomb[std::size_t(j)], want.comb[std::size_t(j)], 1e-5);
        EXPECT_NEAR(comb[std::size_t(j)], rcomb[std::size_t(j)], 1e-5);
      }
    }
}

// Cache-row packers and unpackers of every tier against the scalar ones, bit for bit. Rows mix
// blocks of very different magnitudes (down to float subnormals, up to the clamps), zeros and -0,
// exact E2M1/E4M3 rounding midpoints, and (in some rows) NaN and infinity; unpackers get random
// bytes, which include the E4M3 NaN codes and extreme scale bytes.
TEST_P(KernelTier, CachePackersBitExact) {
  auto same_bits = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
  };
  const int64_t ns[] = {32, 128, 512, 96};
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t n = ns[rep % 4];
    std::vector<float> x(static_cast<std::size_t>(n));
    for (int64_t b = 0; b < n; b += 16) {
      const int kind = int(g_.rng() % 6);
      const float mag = std::ldexp(1.0f, int(g_.rng() % 260) - 140);
      for (int64_t i = b; i < b + 16; ++i) {
        float v = g_.normal() * mag;
        if (kind == 1) v = 0.0f;
        if (kind == 2) v = (g_.rng() % 2) ? -0.0f : 0.0f;
        if (kind == 3) {  // E2M1 midpoints and E4M3 half-quanta on a power-of-two grid
          const float mids[] = {0.25f, 0.75f, 1.25f,   1.75f,        2.5f,
                                3.5f,  5.0f,  1.0625f, 0.0146484375f};
          v = mids[g_.rng() % 9] * std::ldexp(1.0f, int(g_.rng() % 8) - 4) *
              ((g_.rng() % 2) ? -1.0f : 1.0f);
        }
        x[std::size_t(i)] = v;
      }
      if (g_.rng() % 2 == 0) x[std::size_t(b)] = 6.0f * mag;  // a block maximum on the grid
    }
    if (rep % 4 == 1) {  // a window block scaled by exactly 2^k whose values are E4M3 ties
      const int k = int(g_.rng() % 200) - 100;
      const float ties[] = {1.0625f,        1.1875f,        1.3125f,        1.4375f,
                            0.5f * 0x1p-9f, 1.5f * 0x1p-9f, 2.5f * 0x1p-9f, 7.5f * 0x1p-9f,
                            432.0f,         0.0146484375f,  3.75f};
      x[0] = std::ldexp(448.0f, k);
      for (int64_t i = 1; i < 32; ++i)
        x[std::size_t(i)] = std::ldexp(ties[g_.rng() % 11], k) * ((g_.rng() % 2) ? -1.0f : 1.0f);
    }
    if (rep % 25 == 7) x[std::size_t(g_.rng() % std::size_t(n))] = NAN;
    if (rep % 25 == 11) x[std::size_t(g_.rng() % std::size_t(n))] = -INFINITY;
    using Pack = void (*)(const float*, int64_t, uint8_t*);
    using Unpack = void (*)(const uint8_t*, int64_t, float*);
    const struct {
      Pack pk, rpk;
      Unpack up, rup;
      int64_t bytes;
      const char* name;
    } kinds[] = {
        {k_->pack_window_row, ref_->pack_window_row, k_->unpack_window_row, ref_->unpack_window_row,
         window_row_bytes(n), "window"},
        {k_->pack_compressed_row, ref_->pack_compressed_row, k_->unpack_compressed_row,
         ref_->unpack_compressed_row, compressed_row_bytes(n), "compressed"},
        {k_->pack_index_key, ref_->pack_index_key, k_->unpack_index_key, ref_->unpack_index_key,
         index_key_bytes(n), "index key"},
    };
    for (const auto& kd : kinds) {
      std::vector<uint8_t> got(std::size_t(kd.bytes), 0xAB), want(std::size_t(kd.bytes), 0xCD);
      kd.pk(x.data(), n, got.data());
      kd.rpk(x.data(), n, want.data());
      ASSERT_EQ(got, want) << kd.name << " pack, n " << n << " rep " << rep;
      std::vector<uint8_t> bytes(std::size_t(kd.bytes));
      for (auto& b : bytes) b = g_.byte();
      if (rep % 3 == 0) bytes = got;  // also what the packer wrote
      std::vector<float> u(std::size_t(n), 1.0f), uw(std::size_t(n), 2.0f);
      kd.up(bytes.data(), n, u.data());
      kd.rup(bytes.data(), n, uw.data());
      for (std::size_t i = 0; i < u.size(); ++i)
        ASSERT_TRUE(same_bits(u[i], uw[i]))
            << kd.name << " unpack, n " << n << " at " << i << ": " << u[i] << " vs " << uw[i];
    }
  }
}

TEST(Dispatch, ResolvedTierIsSupportedAndTablesAreComplete) {
  EXPECT_TRUE(isa_supported(active_isa()));
  EXPECT_EQ(kernels().isa, active_isa());
  for (int k = 0; k < kIsaCount; ++k) {
    const Kernels& t = kernels_for(static_cast<Isa>(k));
    EXPECT_EQ(static_cast<int>(t.isa), k);
    EXPECT_TRUE(t.fp8_gemv && t.mxfp4_gemv && t.mxfp4_gate_up && t.rmsnorm && t.read_sum &&
                t.rope && t.indexer_scores && t.sparse_attention && t.hc_sinkhorn && t.fp8_gemm &&
                t.bf16_gemm && t.mxfp4_gemm && t.prefill_attention && t.hc_mix &&
                t.hc_collapse_rmsnorm && t.hc_expand && t.pack_window_row && t.unpack_window_row &&
                t.act_quant_fp8 && t.pack_compressed_row && t.unpack_compressed_row &&
                t.pack_index_key && t.unpack_index_key && t.vision_attention)
        << isa_name(t.isa);
  }
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  // Tiers are ordered: each needs every feature of the ones below it.
  for (int k = 1; k < kIsaCount; ++k)
    if (isa_supported(static_cast<Isa>(k))) EXPECT_TRUE(isa_supported(static_cast<Isa>(k - 1)));
  EXPECT_EQ(kAvx512EmulatedKernels.isa, Isa::kAvx512);
  EXPECT_EQ(kAvx512VnniEmulatedKernels.isa, Isa::kAvx512Vnni);
}

INSTANTIATE_TEST_SUITE_P(Tiers, KernelTier,
                         ::testing::Values(Tier{Isa::kScalar, false}, Tier{Isa::kAvx2, false},
                                           Tier{Isa::kAvx512, false}, Tier{Isa::kAvx512Vnni, false},
                                           Tier{Isa::kAvx512Bf16, false}, Tier{Isa::kAvx512, true},
                                           Tier{Isa::kAvx512Vnni, true}),
                         [](const ::testing::TestParamInfo<Tier>& i) {
                           return std::string(isa_name(i.param.isa)) +
                                  (i.param.emulated ? "_emulated" : "");
                         });

}  // namespace
}  // namespace dsv41::ops
