// Engram hashing: NumPy-exact multipliers (spec §6.2 constants) and hash vectors.
#include "model/engram_hash.h"

#include <gtest/gtest.h>

#include "model/test_config.h"

namespace dsv41 {
namespace {

TEST(EngramHash, MultipliersMatchReleasedConstants) {
  EXPECT_EQ(engram_multipliers(1, 99092, 4),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(engram_multipliers(14, 99092, 4),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}

TEST(EngramHash, ReleasedVectors) {
  auto cfg = parse_config(testing::released_config_json(), "config.json");
  ASSERT_TRUE(cfg.is_ok());
  EngramHasher h(cfg->text);
  ASSERT_EQ(h.columns(), 24u);
  std::vector<int32_t> hist = {10, 20, 30, 40};
  std::vector<int64_t> rows(24);
  h.hash(hist, 3, 0, rows.data());
  EXPECT_EQ(rows[0], 1326936);  // spec §6.2 derived vector
  h.hash(hist, 0, 0, rows.data());
  EXPECT_EQ(rows[0], 9400104);
  // Every row lands inside its column's prime-sized bucket of the layer's table.
  for (std::size_t e = 0; e < 2; ++e)
    for (int64_t p = 0; p < 4; ++p) {
      h.hash(hist, p, e, rows.data());
      for (std::size_t c = 0; c < 24; ++c) {
        EXPECT_GE(rows[c], h.layouts()[e].offsets[c]);
        EXPECT_LT(rows[c], h.layouts()[e].offsets[c] + h.layouts()[e].primes[c]);
      }
    }
}

TEST(EngramHash, DeadTokenBlocksLookBack) {
  auto cfg = parse_config(testing::released_config_json(), "config.json");
  ASSERT_TRUE(cfg.is_ok());
  EngramHasher h(cfg->text);
  std::vector<int64_t> a(24), b(24);
  // Position 3 with a DEAD token at 1: slots 2 and 3 become pad, as at position 1 of a fresh
  // history.
  std::vector<int32_t> dead = {7, kEngramDead, 5, 6};
  std::vector<int32_t> fresh = {5, 6};
  h.hash(dead, 3, 0, a.data());
  h.hash(fresh, 1, 0, b.data());
  EXPECT_EQ(a, b);
  // A pad-filled history gives the same rows as a history that holds pad ids.
  std::vector<int32_t> pads = {2, 2, 2, 9};
  std::vector<int32_t> start = {9};
  h.hash(pads, 3, 1, a.data());
  h.hash(start, 0, 1, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace dsv41
