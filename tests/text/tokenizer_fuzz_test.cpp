// Fuzz-style robustness under ASan+UBSan (built into test_text_asan): random byte strings (invalid
// UTF-8 included) through encode/decode and the stream decoder, and randomly mutated or truncated
// tokenizer.json files through loading. Nothing may crash; loads either succeed or return a Status.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

std::string random_bytes(Rng& rng, std::size_t max_len) {
  static const std::string alphabet[] = {
      "a",  " ", "\n",   "1",    "Hello", " world",     "é",
      "中", "😀", "\xF0", "\xFF", "\xC3",  "<｜User｜>", "<｜begin▁of▁sentence｜>",
      "  ", "\t"};
  std::string s;
  const std::size_t n = rng.below(max_len + 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (rng.below(4) == 0)
      s += char(rng.below(256));
    else
      s += alphabet[rng.below(std::size(alphabet))];
  }
  return s;
}

TEST(TokenizerFuzz, EncodeDecodeRandomBytes) {
  auto tok = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  Rng rng(1234);
  for (int it = 0; it < 3000; ++it) {
    const std::string s = random_bytes(rng, 40);
    const auto ids = (*tok)->encode(s);
    auto back = (*tok)->decode(ids);
    ASSERT_TRUE(back.is_ok());
    StreamDecoder d(**tok, {"wor", "\n\n"});
    std::string streamed;
    for (int32_t id : ids) {
      auto st = d.push(id);
      streamed += st.text;
      if (st.stopped) break;
    }
    streamed += d.finish().text;
    ASSERT_LE(streamed.size(), back->size() + 8);
  }
}

TEST(TokenizerFuzz, MutatedTokenizerJsonNeverCrashes) {
  const std::string base = make_tiny_tokenizer().tokenizer_json;
  Rng rng(99);
  int accepted = 0;
  for (int it = 0; it < 300; ++it) {
    std::string s = base;
    const int edits = 1 + int(rng.below(4));
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng.below(s.size());
      switch (rng.below(3)) {
        case 0:
          s[at] = char(rng.below(256));
          break;
        case 1:
          s.erase(at, rng.below(20));
          break;
        default:
          s.resize(at);
          break;
      }
    }
    auto t = Tokenizer::from_json(s, "mutated.json");
    auto table = parse_tokenizer_json(s, "mutated.json");
    if (t.is_ok()) {
      ++accepted;
      (void)(*t)->encode("Hello world 123 ok");
    } else {
      ASSERT_EQ(t.status().message().rfind("mutated.json", 0), 0u) << t.status().message();
    }
    (void)table;
  }
  EXPECT_LT(accepted, 300);  // the mutations do break files
}

}  // namespace
}  // namespace dsv41
