// The grammar core on a small vocabulary: the schema corpus (tests/grammar/schemas) byte by byte,
// random generation judged by ajv, masks against the brute force, refusals and budgets, the
// matcher's API (end ids, special tokens, rollback, forced bytes), regex and choice constraints.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "grammar/grammar.h"
#include "grammar_test_util.h"

namespace dsv41 {
namespace {

using namespace grammar_test;
using json = nlohmann::ordered_json;

std::string schemas_dir() {
  return std::string(DSV41_GRAMMAR_SCHEMAS);
}

struct CorpusCase {
  std::string name;
  json schema, valid, invalid;
};

std::vector<CorpusCase> corpus() {
  std::vector<CorpusCase> out;
  for (const auto& e : std::filesystem::directory_iterator(schemas_dir())) {
    json j = json::parse(slurp(e.path().string()));
    out.push_back({e.path().stem().string(), j["schema"], j["valid"], j["invalid"]});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return out;
}

std::shared_ptr<const Grammar> compile(const json& schema,
                                       std::shared_ptr<const TokenVocab> v = small_vocab()) {
  auto g = Grammar::from_json_schema(schema.dump(), std::move(v));
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? g.value() : nullptr;
}

// Feeds a document one byte at a time; true if every byte is taken and the end is complete.
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& doc) {
  Matcher m(g);
  for (char c : doc)
    if (!m.accept_bytes(std::string(1, c))) return false;
  return m.is_complete();
}

TEST(GrammarCorpus, ValidDocumentsPassByteByByteAndInvalidOnesAreRefused) {
  auto cases = corpus();
  ASSERT_GE(cases.size(), 10u);
  json judge = json::array();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = compile(c.schema);
    ASSERT_TRUE(g);
    for (const auto& d : c.valid) EXPECT_TRUE(matches(g, d.get<std::string>())) << d;
    // Refused by the grammar: invalid under the schema, or outside the documented output policy
    // (key order, whitespace, \u surrogates).
    for (const auto& d : c.invalid) EXPECT_FALSE(matches(g, d.get<std::string>())) << d;
    judge.push_back({{"schema", c.schema}, {"docs", c.valid}});
  }
  // The corpus itself: ajv agrees that every "valid" document is valid.
  json verdict = ajv_judge(judge);
  ASSERT_EQ(verdict.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (std::size_t k = 0; k < verdict[i].size(); ++k)
      EXPECT_TRUE(verdict[i][k]["valid"].get<bool>())
          << cases[i].name << ": " << cases[i].valid[k] << ": " << verdict[i][k]["error"];
}

TEST(GrammarCorpus, RandomDocumentsAreValidUnderAjvAndMasksEqualTheBruteForce) {
  auto cases = corpus();
  std::mt19937 rng(1234);
  json judge = json::array();
  std::vector<std::vector<std::string>> texts;
  int finished = 0, total = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = compile(c.schema);
    ASSERT_TRUE(g);
    json docs = json::array();
    for (int k = 0; k < 12; ++k) {
      WalkResult w = random_walk(g, rng, 300, /*brute_force=*/k < 3);
      EXPECT_EQ(w.mismatches, 0);
      ++total;
      if (!w.finished) continue;
      ++finished;
      EXPECT_FALSE(json::parse(w.text, nullptr, false).is_discarded()) << w.text;
      docs.push_back(w.text);
    }
    judge.push_back({{"schema", c.schema}, {"docs", docs}});
  }
  EXPECT_GE(finished, total * 3 / 4) << "random walks should mostly finish";
  json verdict = ajv_judge(judge);
  ASSERT_EQ(verdict.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (std::size_t k = 0; k < verdict[i].size(); ++k)
      EXPECT_TRUE(verdict[i][k]["valid"].get<bool>())
          << cases[i].name << ": " << judge[i]["docs"][k] << ": " << verdict[i][k]["error"];
}

TEST(GrammarMatcher, JsonModeGeneratesObjectsAndMatchesTheBruteForce) {
  auto g = Grammar::any_json_object(small_vocab());
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  std::mt19937 rng(7);
  for (int k = 0; k < 6; ++k) {
    WalkResult w = random_walk(g.value(), rng, 200, true);
    EXPECT_EQ(w.mismatches, 0);
    if (!w.finished) continue;
    json j = json::parse(w.text, nullptr, false);
    EXPECT_TRUE(j.is_object()) << w.text;
  }
  EXPECT_TRUE(matches(g.value(), R"({"a":[1,-2.5e3,"x",{"b":null}],"c":true})"));
  EXPECT_FALSE(matches(g.value(), "[1]"));
  EXPECT_FALSE(matches(g.value(), "{\"a\":1} "));
}

TEST(GrammarMatcher, EndOnlyWhenCompleteSpecialNeverRollbackAndForcedBytes) {
  auto g = compile(json::parse(
      R"({"type":"object","properties":{"kind":{"const":"fixed"},"n":{"type":"integer"}},
          "required":["kind","n"],"additionalProperties":false})"));
  ASSERT_TRUE(g);
  const TokenVocab& v = g->vocab();
  Matcher m(g);
  EXPECT_EQ(m.forced_bytes(), "{\"kind\":\"fixed\",\"n\":");
  EXPECT_FALSE(m.accept_token(kEos));
  EXPECT_FALSE(m.accept_token(kSpecial));
  std::vector<uint64_t> mask(v.mask_words());
  m.fill_mask(mask);
  EXPECT_FALSE(bit(mask, kEos));
  EXPECT_FALSE(bit(mask, kSpecial));
  ASSERT_TRUE(m.accept_bytes("{\"kind\":\"fixed\",\"n\":12"));
  EXPECT_FALSE(m.is_complete());
  ASSERT_TRUE(m.accept_bytes("}"));
  EXPECT_TRUE(m.is_complete());
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, kEos));
  EXPECT_EQ(m.num_accepted(), 2);
  // Refused input leaves the state alone; rollback undoes accepted steps.
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_TRUE(m.is_complete());
  m.rollback(1);
  EXPECT_FALSE(m.is_complete());
  EXPECT_TRUE(m.accept_bytes("3}"));
  EXPECT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.is_terminated());
  m.fill_mask(mask);
  for (uint64_t w : mask) EXPECT_EQ(w, 0u);
  EXPECT_FALSE(m.accept_token(kEos));
  // A copy is an independent fork (speculation).
  Matcher a(g);
  ASSERT_TRUE(a.accept_bytes("{\"kind\":\"fixed\",\"n\":"));
  Matcher b = a;
  EXPECT_TRUE(b.accept_bytes("-7}"));
  EXPECT_FALSE(a.is_complete());
  EXPECT_TRUE(b.is_complete());
}

TEST(GrammarSchema, UnsupportedKeywordsAreNamedWithTheirPath) {
  auto v = small_vocab();
  struct Case {
    const char* schema;
    const char* keyword;
    const char* path;
  };
  for (const Case& c : {
           Case{R"({"type":"object","properties":{"a":{"type":"object","minProperties":1}}})",
                "minProperties", "/properties/a/minProperties"},
           Case{R"({"type":"array","items":{"type":"integer","multipleOf":3}})", "multipleOf",
                "/items/multipleOf"},
           Case{R"({"anyOf":[{"type":"string"},{"not":{"type":"null"}}]})", "not", "/anyOf/1/not"},
           Case{R"({"type":"array","uniqueItems":true})", "uniqueItems", "/uniqueItems"},
           Case{R"({"type":"string","format":"hostname"})", "hostname", "/format"},
           Case{R"({"type":"string","pattern":"a+","maxLength":3})", "minLength/maxLength",
                "/pattern"},
           Case{R"({"$ref":"http://example.com/s.json"})", "$ref", "/$ref"},
           Case{R"({"type":"object","patternProperties":{"^a":{}}})", "patternProperties",
                "/patternProperties"},
       }) {
    auto g = Grammar::from_json_schema(c.schema, v);
    ASSERT_FALSE(g.is_ok()) << c.schema;
    EXPECT_NE(g.status().message().find(c.keyword), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find(c.path), std::string::npos) << g.status().message();
  }
  // Annotations are accepted.
  EXPECT_TRUE(Grammar::from_json_schema(
                  R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x",
                      "title":"t","description":"d","examples":[1],"default":1,"$comment":"c",
                      "type":"integer"})",
                  v)
                  .is_ok());
  // Malformed inputs are errors, never crashes.
  for (const char* bad : {"", "{", "[1]", "3", R"({"type":7})", R"({"type":"strin"})",
                          R"({"minLength":-1})", R"({"pattern":"(a"})", R"({"pattern":"a{5,2}"})",
                          R"({"$ref":"#/nowhere"})", R"({"enum":5})"})
    EXPECT_FALSE(Grammar::from_json_schema(bad, v).is_ok()) << bad;
}

TEST(GrammarSchema, LeftRecursionAndEmptyLanguagesAreRefused) {
  auto v = small_vocab();
  auto left = Grammar::from_json_schema(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},
      {"type":"null"}]}},"$ref":"#/$defs/a"})",
                                        v);
  ASSERT_FALSE(left.is_ok());
  EXPECT_NE(left.status().message().find("left recursion"), std::string::npos)
      << left.status().message();
  auto empty = Grammar::from_json_schema(R"({"type":"integer","minimum":5,"maximum":4})", v);
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("no output"), std::string::npos);
}

TEST(GrammarSchema, PathologicalSchemasFailWithinTheBudget) {
  auto v = small_vocab();
  GrammarOptions o;
  o.time_budget_ms = 1000;
  // Determinization blow-up (2^30 states) and huge repetitions: refused, quickly.
  for (const std::string& s :
       {std::string(R"({"type":"string","pattern":"^(a|b)*a(a|b){30}$"})"),
        std::string(
            R"({"type":"array","items":{"type":"string","maxLength":90000},"maxItems":90000})")}) {
    auto t0 = std::chrono::steady_clock::now();
    auto g = Grammar::from_json_schema(s, v, o);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(g.is_ok()) << s.substr(0, 80);
    EXPECT_EQ(g.status().kind(), ErrorKind::kCapacity) << g.status().message();
    EXPECT_LT(ms, 1500) << g.status().message();
  }
  // 60 levels of oneOf whose branches all refer to the next level: 2^60 paths if inlined, linear
  // here (one rule per sub-schema), so it compiles well within the budget.
  json defs = json::object();
  for (int i = 0; i < 60; ++i) {
    std::string next = i + 1 < 60 ? "#/$defs/d" + std::to_string(i + 1) : "#/$defs/leaf";
    defs["d" + std::to_string(i)] =
        json::parse(R"({"oneOf":[{"type":"array","items":{"$ref":")" + next +
                    R"("},"maxItems":2},{"type":"object","properties":{"x":{"$ref":")" + next +
                    R"("},"y":{"$ref":")" + next + R"("}},"additionalProperties":false}]})");
  }
  defs["leaf"] = json::parse(R"({"type":"integer"})");
  json nested = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  auto t0 = std::chrono::steady_clock::now();
  auto g = Grammar::from_json_schema(nested.dump(), v, o);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_LT(ms, 1000);
  std::string doc = "[";
  for (int i = 1; i < 60; ++i) doc += i % 2 ? "{\"x\":" : "[";
  doc += "7";
  for (int i = 59; i >= 1; --i) doc += i % 2 ? "}" : "]";
  doc += "]";
  EXPECT_TRUE(matches(g.value(), doc)) << doc;
  // The time budget alone: a schema that fits the state budget but not 1 ms.
  o.time_budget_ms = 1;
  auto slow = Grammar::from_json_schema(
      R"({"type":"array","items":{"type":"string","maxLength":2000},"maxItems":50})", v, o);
  ASSERT_FALSE(slow.is_ok());
  EXPECT_NE(slow.status().message().find("time budget"), std::string::npos)
      << slow.status().message();
}

TEST(GrammarRegexAndChoice, FullMatchSubsetAndChoices) {
  auto v = small_vocab();
  auto g = Grammar::from_regex(R"(\d{3}-[a-c]+(x|yz)?\.[^0-9]\s?)", v);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  for (const char* ok : {"123-abc.é", "000-cyz.a ", "999-ax.\""})
    EXPECT_TRUE(matches(g.value(), ok)) << ok;
  for (const char* bad : {"12-a.b", "123-d.e", "123-a.5", "123-a.bb", "x123-a.b"})
    EXPECT_FALSE(matches(g.value(), bad)) << bad;
  std::mt19937 rng(3);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(random_walk(g.value(), rng, 60, true).mismatches, 0);
  for (const char* bad : {"a^b", "a$b", "(?=a)", "\\1", "a**", "[z-a]", "\\p{L}"})
    EXPECT_FALSE(Grammar::from_regex(bad, v).is_ok()) << bad;

  auto c = Grammar::from_choices({"red", "green", "gree"}, v);
  ASSERT_TRUE(c.is_ok());
  for (const char* ok : {"red", "green", "gree"}) EXPECT_TRUE(matches(c.value(), ok));
  for (const char* bad : {"re", "greenish", "blue"}) EXPECT_FALSE(matches(c.value(), bad));
  Matcher m(c.value());
  EXPECT_TRUE(m.accept_bytes("gree"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.accept_bytes("n"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(Grammar::from_choices({}, v).is_ok());
}

TEST(GrammarSchema, BoundedWhitespaceOption) {
  GrammarOptions o;
  o.max_whitespace = 2;
  auto g = Grammar::from_json_schema(
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"],"additionalProperties":false})",
      small_vocab(), o);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_TRUE(matches(g.value(), "{ \"a\" : [ 1 , 2 ] }"));
  EXPECT_TRUE(matches(g.value(), "{\n \"a\":[1,2]\t}"));
  EXPECT_FALSE(matches(g.value(), "{   \"a\":[1]}"));  // 3 > max_whitespace
  auto compact = compile(json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false})"));
  EXPECT_FALSE(matches(compact, "{ \"a\":1}"));
  EXPECT_TRUE(matches(compact, "{\"a\":1}"));
}

}  // namespace
}  // namespace dsv41

namespace dsv41 {
namespace {

using namespace grammar_test;

// Token sets derived from an equivalent node (bounded-length classes, a walk of only the subtrees
// where two nodes may differ) or shared with one equal to the plain walk, node by node: counted
// strings (the "remaining k" chains, shorter and longer than the vocabulary's longest token),
// counted patterns with multi-byte characters, raw counted regexes, and rules with calls (which
// keep plain walks).
TEST(GrammarMasks, DerivedFromEquivalentNodesEqualThePlainWalk) {
  std::mt19937 rng(7);
  GrammarOptions lazy;
  lazy.precompute_ms = 0;
  int shared = 0;
  for (
      const char* schema : {
          R"({"type":"string","maxLength":3})",
          R"({"type":"string","minLength":2,"maxLength":25})",
          R"({"type":"object","properties":{"a":{"type":"string","maxLength":40},"b":{"enum":["red","green"]},
               "c":{"type":"integer","minimum":-5,"maximum":120}},"required":["a","b"],"additionalProperties":false})",
          R"({"type":"string","pattern":"^[a-zé日]{2,30}$"})",
          R"({"type":"array","items":{"type":"string","maxLength":12},"maxItems":4})",
          R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"string","maxLength":9},"k":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},
               "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/n"})",
      }) {
    auto g = Grammar::from_json_schema(schema, small_vocab(), lazy);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    shared += expect_derived_masks_equal_walks(*g.value(), rng, 3);
    for (int walk = 0; walk < 4; ++walk)
      EXPECT_EQ(random_walk(g.value(), rng, 80, true).mismatches, 0) << schema;
  }
  auto re = Grammar::from_regex("(ab|c){0,25}d\\.x{3,40}", small_vocab(), lazy);
  ASSERT_TRUE(re.is_ok()) << re.status().message();
  shared += expect_derived_masks_equal_walks(*re.value(), rng, 3);
  // Counts far above the vocabulary's longest token: their nodes are equivalent over it.
  EXPECT_GT(shared, 0);
}

}  // namespace
}  // namespace dsv41
