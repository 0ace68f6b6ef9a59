// Fuzz-style robustness of the chat front door under ASan+UBSan (built into test_text_asan): random
// mutations of request bodies through JSON parsing, validation and encoding, and random DSML-ish
// text through the parser. Nothing may crash; errors come back as a Status.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "text/chat.h"
#include "text/dsml_parser.h"

namespace dsv41 {
namespace {

const char* kSeedBody =
    R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]},
 {"role":"assistant","reasoning":"r","content":"c","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\": [1, 2.5e3, \"é\"]}"}}]},
 {"role":"tool","tool_call_id":"1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
 "chat_template_kwargs":{"thinking":true,"reasoning_effort":"max"}})";

TEST(ChatFuzz, MutatedRequestBodiesNeverCrash) {
  Rng rng(77);
  const std::string seed = kSeedBody;
  int parsed = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string body = seed;
    const int edits = 1 + static_cast<int>(rng.below(4));
    for (int e = 0; e < edits && !body.empty(); ++e) {
      std::size_t pos = rng.below(body.size());
      switch (rng.below(3)) {
        case 0:
          body[pos] = static_cast<char>(rng.below(256));
          break;
        case 1:
          body.erase(pos, 1 + rng.below(8));
          break;
        default:
          body.insert(pos, body.substr(rng.below(body.size()), rng.below(16)));
          break;
      }
    }
    auto json = parse_json_ordered(body);
    if (!json.is_ok()) continue;
    ++parsed;
    auto req = parse_chat_request(*json);
    if (!req.is_ok()) {
      EXPECT_FALSE(req.status().message().empty());
      continue;
    }
    auto text = encode_chat(req->messages, req->options);
    if (text.is_ok()) EXPECT_EQ(text->rfind("<｜begin▁of▁sentence｜>", 0), 0u);
  }
  EXPECT_GT(parsed, 100);  // the mutations must reach the validator, not only the JSON parser
}

TEST(ChatFuzz, RandomDsmlTextNeverCrashes) {
  static const std::string pieces[] = {"<｜DSML｜ calls>",
                                       "</｜DSML｜ calls>",
                                       "<｜DSML｜ invoke name=\"",
                                       "</｜DSML｜ invoke>",
                                       "<｜DSML｜ parameter name=\"",
                                       "\" string=\"false\">",
                                       "\" string=\"true\">",
                                       "</｜DSML｜ parameter>",
                                       "\">",
                                       "\n",
                                       "</think>",
                                       "x",
                                       "{\"a\": 1}",
                                       "[",
                                       "\xE4\xB8",
                                       "\n\n"};
  Rng rng(99);
  for (int it = 0; it < 4000; ++it) {
    std::string s;
    const std::size_t n = rng.below(30);
    for (std::size_t i = 0; i < n; ++i) s += pieces[rng.below(std::size(pieces))];
    for (bool thinking : {false, true}) {
      ParsedAssistant p = parse_assistant_text(s, thinking);
      // Nothing is invented: output text never exceeds the input.
      EXPECT_LE(p.reasoning.size() + p.content.size(), s.size());
    }
  }
}

}  // namespace
}  // namespace dsv41
