// Composed grammars (GrammarComposer, Grammar::compose) and placed tokens on the small vocabulary:
// literals around JSON values of sub-schemas ($refs resolved in the whole document), a placed
// added token allowed exactly where the composition names it and never spelled by bytes, masks
// equal to the brute force on random walks, errors naming the piece, the compile budget, keys.
#include <gtest/gtest.h>

#include <chrono>

#include "grammar/grammar.h"
#include "grammar_test_util.h"

namespace dsv41 {
namespace {

using namespace grammar_test;
using json = nlohmann::ordered_json;

// The small vocabulary with id kSpecial ("<think>") placed.
std::shared_ptr<const TokenVocab> placed_vocab() {
  auto v = TokenVocab::create(small_vocab_bytes(), {kSpecial}, {kEos}, {kSpecial});
  EXPECT_TRUE(v.is_ok()) << v.status().message();
  return v.value();
}

const char* kDoc = R"({"$defs":{"n":{"type":"integer","minimum":1,"maximum":3}},
  "properties":{"a":{"$ref":"#/$defs/n"},"b":{"type":"array","items":{"$ref":"#/$defs/n"},
  "maxItems":2}}})";

// "<" MARK "a=" A ";" ("b=" B ";")? then (x|yy), MARK being the placed token.
struct Built {
  GrammarComposer c;
  int root = -1;
};
Built build(int32_t mark) {
  Built b;
  GrammarComposer& c = b.c;
  const int doc = c.document(json::parse(kDoc).dump());
  const int a = c.seq({c.literal("a="), c.json_value(doc, "/properties/a", "a"), c.literal(";")});
  const int bb = c.seq({c.literal("b="), c.json_value(doc, "/properties/b", "b"), c.literal(";")});
  b.root = c.seq({c.literal("<"), c.token(mark), a, c.repeat(bb, 0, 1),
                  c.alt({c.literal("x"), c.regex("y{2}", "tail")})});
  return b;
}

TEST(GrammarCompose, LiteralsAroundSubSchemaValuesAndAPlacedToken) {
  auto v = placed_vocab();
  EXPECT_EQ(v->placed_bytes(kSpecial), std::string("\xFF\x01", 2));
  EXPECT_EQ(v->placed_bytes(kEos), "");
  EXPECT_FALSE(v->is_excluded(kSpecial));
  const int32_t byte_ff = 2 + 0xFF;  // the single-byte token of 0xFF: excluded once ids are placed
  EXPECT_TRUE(v->is_excluded(byte_ff));
  Built b = build(kSpecial);
  auto g = Grammar::compose(b.c, b.root, v);
  ASSERT_TRUE(g.is_ok()) << g.status().message();

  Matcher m(g.value());
  ASSERT_TRUE(m.accept_bytes("<"));
  std::vector<uint64_t> mask(v->mask_words());
  m.fill_mask(mask);
  // Only the placed token continues: not its text spelled by bytes, not the 0xFF byte token.
  int allowed = 0;
  for (int32_t id = 0; id < v->size(); ++id) allowed += bit(mask, id);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(bit(mask, kSpecial));
  EXPECT_FALSE(m.accept_bytes("<think>"));
  EXPECT_FALSE(m.accept_token(byte_ff));
  ASSERT_TRUE(m.accept_token(kSpecial));
  EXPECT_TRUE(m.accept_bytes("a=2;b=[1,3];yy"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.accept_token(kEos));

  // The $ref into the document's $defs holds: 4 is out of range; maxItems too.
  auto run = [&](const std::string& rest) {
    Matcher k(g.value());
    return k.accept_bytes("<") && k.accept_token(kSpecial) && k.accept_bytes(rest) &&
           k.is_complete();
  };
  EXPECT_TRUE(run("a=3;x"));
  EXPECT_FALSE(run("a=4;x"));
  EXPECT_FALSE(run("a=1;b=[1,2,3];x"));
  EXPECT_FALSE(run("a=1;b=[];y"));
  EXPECT_FALSE(run("a=1;"));

  // Random walks: every mask equals the brute force, every end is a complete text.
  std::mt19937 rng(3);
  int finished = 0;
  for (int k = 0; k < 8; ++k) {
    WalkResult w = random_walk(g.value(), rng, 60, true);
    EXPECT_EQ(w.mismatches, 0);
    finished += w.finished;
  }
  EXPECT_GT(finished, 0);
}

TEST(GrammarCompose, ErrorsNameThePieceAndTheBudgetHolds) {
  auto v = placed_vocab();
  {  // a token the vocabulary has not placed
    Built b = build(kEos);
    auto g = Grammar::compose(b.c, b.root, v);
    ASSERT_FALSE(g.is_ok());
    EXPECT_NE(g.status().message().find("not placed"), std::string::npos) << g.status().message();
  }
  {  // an unsupported keyword: the piece's name, the keyword and its path
    GrammarComposer c;
    const int doc = c.document(R"({"properties":{"q":{"not":{}}}})");
    auto g = Grammar::compose(c, c.json_value(doc, "/properties/q", "tools[2].parameters"), v);
    ASSERT_FALSE(g.is_ok());
    EXPECT_EQ(g.status().message(),
              "tools[2].parameters: json_schema: unsupported keyword \"not\" at /properties/q/not");
  }
  {  // a pathological value: kCapacity within the budget
    GrammarComposer c;
    const int doc = c.document(R"({"type":"string","pattern":"^(a|b)*a(a|b){30}$"})");
    const int root = c.seq({c.literal("k="), c.json_value(doc, "", "k")});
    GrammarOptions o;
    o.time_budget_ms = 500;
    const auto t0 = std::chrono::steady_clock::now();
    auto g = Grammar::compose(c, root, v, o);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(g.is_ok());
    EXPECT_EQ(g.status().kind(), ErrorKind::kCapacity) << g.status().message();
    EXPECT_LT(ms, 1200);
  }
  // Keys tell compositions apart (what a cache keys them by).
  Built a = build(kSpecial), b = build(kSpecial);
  EXPECT_EQ(a.c.key(a.root), b.c.key(b.root));
  GrammarComposer c2;
  const int d2 = c2.document(R"({"type":"integer"})");
  const int r2 = c2.seq({c2.literal("a"), c2.json_value(d2, "", "x")});
  GrammarComposer c3;
  const int d3 = c3.document(R"({"type":"integer"})");
  const int r3 = c3.seq({c3.literal("b"), c3.json_value(d3, "", "x")});
  EXPECT_NE(c2.key(r2), c3.key(r3));
}

}  // namespace
}  // namespace dsv41
