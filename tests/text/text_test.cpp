// text/: byte-level alphabet, Engram normalisation rules (spec §6.1), tokenizer.json id tables.
#include <gtest/gtest.h>

#include "text/byte_level.h"
#include "text/engram_token_map.h"
#include "text/special_tokens.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

TEST(ByteLevel, AlphabetRoundTrip) {
  EXPECT_EQ(byte_to_symbol(' '), "\u0120");   // 'Ġ'
  EXPECT_EQ(byte_to_symbol('\n'), "\u010A");  // 'Ċ'
  EXPECT_EQ(byte_to_symbol('a'), "a");
  EXPECT_EQ(byte_to_symbol(0xAD), "\u0143");  // soft hyphen is remapped
  std::string all;
  for (int b = 0; b < 256; ++b) all += byte_to_symbol(uint8_t(b));
  auto back = symbols_to_bytes(all);
  ASSERT_TRUE(back.has_value());
  ASSERT_EQ(back->size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(uint8_t((*back)[std::size_t(b)]), b);
  EXPECT_FALSE(symbols_to_bytes("\u4E00").has_value());  // not in the alphabet
}

TEST(ByteLevel, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("héllo ✓ 😀"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));              // truncated
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

std::string norm(const std::string& s) {
  auto r = engram_normalize(s);
  EXPECT_TRUE(r.is_ok());
  return r.value();
}

TEST(EngramNormalize, Rules) {
  EXPECT_EQ(norm(" The"), "the");
  EXPECT_EQ(norm("THE"), "the");
  EXPECT_EQ(norm("Café"), "cafe");            // NFD + strip accents
  EXPECT_EQ(norm("ﬁ"), "fi");                 // NFKC compatibility
  EXPECT_EQ(norm("<｜User｜>"), "<|user|>");  // fullwidth bar folds under NFKC
  EXPECT_EQ(norm("ΟΔΟΣ"), "οδοσ");            // per-character lowercase: no final sigma
  EXPECT_EQ(norm("\u0130"), "i");             // İ -> I + dot (NFD), mark stripped, then lowercase
  EXPECT_EQ(norm("\u0915\u093E"), "\u0915");  // Devanagari vowel sign (Mc) removed
  EXPECT_EQ(norm(" "), " ");                  // a lone space survives (sentinel)
  EXPECT_EQ(norm("\t\n "), " ");              // run of ASCII whitespace -> one space -> kept
  EXPECT_EQ(norm("  a  b "), "a b");
  EXPECT_EQ(norm("\u00A0x\u3000"), "x");  // Unicode White_Space trimmed
  EXPECT_EQ(norm("\x1C"), "\x1C");        // U+001C is not Rust whitespace
  EXPECT_EQ(norm("\u200B"), "\u200B");    // nor is ZERO WIDTH SPACE
  EXPECT_EQ(norm("\v"), "");              // trimmed to empty (caller keeps the raw text)
}

TEST(EngramTokenMap, FirstAppearanceAndRawKeys) {
  std::vector<TokenText> toks = {
      {"<s>", "<s>"},     {"hello", "hello"}, {" Hello", "\u0120Hello"},
      {"\xE4", "\u00E4"}, {"\xE4", "X"},      {"\v", "\u010B"},
  };
  auto m = build_engram_token_map(toks);
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->map, (std::vector<int32_t>{0, 1, 1, 2, 3, 4}));  // partial bytes keyed by raw string
  EXPECT_EQ(m->size, 5);
}

TEST(TokenizerFile, TinyTokenizerTable) {
  const GeneratedTokenizer g = make_tiny_tokenizer();
  auto t = parse_tokenizer_json(g.tokenizer_json, "tiny");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->id_of(tokens::kBos), 0);
  EXPECT_EQ(t->id_of(tokens::kEos), 1);
  EXPECT_EQ(t->id_of(tokens::kPad), 2);
  for (const char* s : {tokens::kSystem, tokens::kUser, tokens::kAssistant, tokens::kThinkBegin,
                        tokens::kThinkEnd, tokens::kDsml, tokens::kImage})
    EXPECT_GT(t->id_of(s), 258) << s;
  EXPECT_EQ(t->texts[3].decoded, std::string(1, '\0'));  // byte tokens follow the three specials
  EXPECT_GT(t->size, 259 + 100);
  EXPECT_EQ(make_tiny_tokenizer().tokenizer_json, g.tokenizer_json);  // deterministic
}

TEST(TokenizerFile, MalformedRefused) {
  EXPECT_FALSE(parse_tokenizer_json("{", "x").is_ok());
  EXPECT_FALSE(parse_tokenizer_json("{\"model\":{}}", "x").is_ok());
  auto gap = parse_tokenizer_json(R"({"model":{"vocab":{"a":0,"b":2}}})", "x");
  ASSERT_FALSE(gap.is_ok());
  EXPECT_NE(gap.status().message().find("not contiguous"), std::string::npos);
  EXPECT_FALSE(parse_tokenizer_json(R"({"model":{"vocab":{"\u4e00":0}}})", "x").is_ok());
}

}  // namespace
}  // namespace dsv41
