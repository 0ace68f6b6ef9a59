// Cache-row packers against the reference fake quantizations (model/reference/ref_ops.h, T =
// float): unpack(pack(x)) must equal the fake-quantized x bit for bit, on random rows of many
// magnitudes, rows with zeros, ties at E2M1 midpoints, and extreme values; the row sizes are the
// spec's.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "model/reference/ref_ops.h"
#include "ops/cache_pack.h"
#include "test_seed.h"

namespace dsv41::ops {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<std::vector<float>> rows(int64_t n) {
  // One stream for the run: each call draws new rows, and DSV41_TEST_SEED replays them all.
  static std::mt19937_64 rng(fresh_seed());
  std::vector<std::vector<float>> out;
  for (int k = 0; k < 300; ++k) {
    std::vector<float> r(static_cast<std::size_t>(n));
    const float mag = std::ldexp(1.0f, int(rng() % 40) - 20);
    for (auto& v : r) v = std::normal_distribution<float>(0.0f, mag)(rng);
    if (k % 7 == 0)
      for (std::size_t i = 0; i < r.size(); i += 3) r[i] = 0.0f;
    if (k % 11 == 0)
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = (i % 2 ? -1.0f : 1.0f) * 0.0f;
    out.push_back(r);
  }
  // E2M1 midpoint ties after scaling: amax 6 (scale 1 for the pow2 keys), values on every midpoint.
  std::vector<float> ties(static_cast<std::size_t>(n));
  const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  for (std::size_t i = 0; i < ties.size(); ++i) ties[i] = (i % 2 ? -1.0f : 1.0f) * mids[i % 8];
  out.push_back(ties);
  std::vector<float> big(static_cast<std::size_t>(n), 3.0e38f),
      tiny(static_cast<std::size_t>(n), 1.0e-40f);
  out.push_back(big);
  out.push_back(tiny);
  return out;
}

template <typename Pack, typename Unpack, typename Fake>
void check(int64_t n, int64_t bytes, Pack pack, Unpack unpack, Fake fake, const char* what) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (const auto& r : rows(n)) {
    std::vector<uint8_t> packed(static_cast<std::size_t>(bytes), 0xCD);
    pack(r.data(), n, packed.data());
    std::vector<float> got(r.size(), NAN), want = r;
    unpack(packed.data(), n, got.data());
    fake(want.data(), n);
    for (std::size_t i = 0; i < r.size(); ++i)
      ASSERT_EQ(bits(got[i]), bits(want[i]))
          << what << " element " << i << " of a row (x = " << r[i] << "): got " << got[i]
          << " want " << want[i];
  }
}

TEST(CachePack, RowSizesAreTheSpecs) {
  EXPECT_EQ(window_row_bytes(512), 528);
  EXPECT_EQ(compressed_row_bytes(512), 288);
  EXPECT_EQ(index_key_bytes(128), 68);
}

TEST(CachePack, WindowRowMatchesFakeFp8Pow2) {
  check(
      512, window_row_bytes(512), pack_window_row, unpack_window_row,
      [](float* x, int64_t n) { ref::fake_fp8_pow2<float>(x, n); }, "window");
}

TEST(CachePack, CompressedRowMatchesFakeFp4E4m3) {
  check(
      512, compressed_row_bytes(512), pack_compressed_row, unpack_compressed_row,
      [](float* x, int64_t n) { ref::fake_fp4_e4m3<float>(x, n); }, "compressed");
}

TEST(CachePack, IndexKeyMatchesFakeFp4Pow2) {
  check(
      128, index_key_bytes(128), pack_index_key, unpack_index_key,
      [](float* x, int64_t n) { ref::fake_fp4_pow2<float>(x, n); }, "index key");
}

TEST(CachePack, MidpointEncoderEqualsTheExactEncoderEverywhere) {
  // Every float in [-6.5, 6.5] on a fine grid plus all midpoints and their neighbours.
  std::vector<float> vs;
  for (int i = -6500; i <= 6500; ++i) vs.push_back(float(i) / 1000.0f);
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
    for (float s : {1.0f, -1.0f}) {
      vs.push_back(s * m);
      vs.push_back(std::nextafter(s * m, 0.0f));
      vs.push_back(std::nextafter(s * m, s * 10.0f));
    }
  vs.push_back(-0.0f);
  for (float v : vs) EXPECT_EQ(e2m1_code_by_midpoints(v), e2m1_from_double(double(v))) << v;
}

}  // namespace
}  // namespace dsv41::ops
