// Structured outputs in the engine (issue 32): a request carrying a grammar samples only what the
// grammar allows (temperature 1 on the tiny random model, which never writes JSON by itself) and
// finishes with "stop" once the document is complete; its tokens are the same alone and among 15
// others (greedy and seeded), and with speculative decoding on and off; a grammar that allows no
// token ends the request cleanly; in thinking mode the constraint starts after </think>.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "core/rng.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "engine/json_check.h"
#include "grammar/grammar.h"
#include "io/test_util.h"
#include "model/fast/fast_model.h"
#include "model/oracle_drafter.h"
#include "model/tiny_converted.h"
#include "text/special_tokens.h"

namespace dsv41::constrained_test {
namespace {

using namespace std::chrono_literals;

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":10},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "pet":{"enum":["cat","dog","bird"]},
  "ok":{"type":"boolean"},
  "tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},
  "required":["name","age","pet","ok","tags"],"additionalProperties":false})";

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  bool operator==(const Out& o) const {
    return tokens == o.tokens && logprobs == o.logprobs && text == o.text && reason == o.reason;
  }
};

Out run(Engine& e, const GenerationRequest& r) {
  auto h = e.submit(r);
  EXPECT_TRUE(h.is_ok()) << h.status().message();
  Out out;
  if (!h.is_ok()) return out;
  for (RequestOutput o; h->next(o, 60s);) {
    for (const auto& t : o.tokens) {
      out.tokens.push_back(t.token);
      out.logprobs.push_back(t.logprob);
    }
    out.text += o.text;
    if (o.finished) {
      out.reason = o.reason;
      out.error = o.error;
      return out;
    }
  }
  ADD_FAILURE() << "the request did not finish";
  return out;
}

class Constrained : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    conv_ = new std::string(testing::make_tiny_converted(*dir_, 3));
  }
  static void TearDownTestSuite() {
    delete conv_;
    delete dir_;
  }
  static std::unique_ptr<Engine> engine(bool speculative = false) {
    EngineOptions opt;
    opt.model_dir = *conv_;
    opt.fast.kv_cache_gb = 0.05;
    opt.max_num_batched_tokens = 64;
    opt.speculative = speculative;
    // Every decode verifies 3 drafts: the drafter of the random tiny model is mostly wrong and
    // often proposes what the grammar refuses, so cuts and rejections happen at every depth.
    if (speculative) opt.speculative_width = 3;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return std::move(*e);
  }
  static std::shared_ptr<const TokenVocab> vocab(const Engine& e) {
    auto v = TokenVocab::from_tokenizer(e.tokenizer(), {e.eos_id()});
    EXPECT_TRUE(v.is_ok()) << v.status().message();
    return *v;
  }
  static std::shared_ptr<const Grammar> schema_grammar(const Engine& e) {
    auto g = Grammar::from_json_schema(kSchema, vocab(e));
    EXPECT_TRUE(g.is_ok()) << g.status().message();
    return *g;
  }
  static GenerationRequest request(std::shared_ptr<const Grammar> g, double temperature,
                                   uint64_t seed, int prompt_seed = 0) {
    GenerationRequest r;
    Rng rng(uint64_t(100 + prompt_seed));
    for (int k = 0; k < 9 + prompt_seed % 5; ++k) r.prompt.push_back(int32_t(3 + rng.below(900)));
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_tokens = 256;
    r.sampling.logprobs = 0;
    r.constraint = std::move(g);
    return r;
  }
  static testing::TempDir* dir_;
  static std::string* conv_;
};
testing::TempDir* Constrained::dir_ = nullptr;
std::string* Constrained::conv_ = nullptr;

TEST_F(Constrained, EveryAnswerIsAValidDocumentAndStops) {
  auto e = engine();
  const auto schema = nlohmann::json::parse(kSchema);
  auto g = schema_grammar(*e);
  // The same prompts unconstrained: the random model writes no JSON.
  int unconstrained_json = 0;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = request(nullptr, 1.0, uint64_t(i), i);
    r.sampling.max_tokens = 40;
    unconstrained_json += testing::json_text_check(schema, run(*e, r).text).empty();
  }
  EXPECT_EQ(unconstrained_json, 0);
  for (int i = 0; i < 8; ++i) {
    const Out o = run(*e, request(g, i == 0 ? 0.0 : 1.0, uint64_t(i), i));
    EXPECT_EQ(o.reason, FinishReason::kStop) << o.text << " " << o.error;
    EXPECT_EQ(testing::json_text_check(schema, o.text), "") << "answer " << i;
    EXPECT_LT(o.tokens.size(), 256u);
    if (i < 2) std::printf("answer %d (%zu tokens): %s\n", i, o.tokens.size(), o.text.c_str());
  }
  // A choice list and a regex.
  auto choices = Grammar::from_choices({"alpha", "beta", "gamma delta"}, vocab(*e));
  ASSERT_TRUE(choices.is_ok());
  auto regex = Grammar::from_regex("[a-c]{2,5}-[0-9]{3}", vocab(*e));
  ASSERT_TRUE(regex.is_ok());
  for (int i = 0; i < 6; ++i) {
    const Out c = run(*e, request(*choices, 1.0, uint64_t(i), i));
    EXPECT_EQ(c.reason, FinishReason::kStop);
    EXPECT_TRUE(c.text == "alpha" || c.text == "beta" || c.text == "gamma delta") << c.text;
    const Out x = run(*e, request(*regex, 1.0, uint64_t(i), i));
    EXPECT_EQ(x.reason, FinishReason::kStop);
    const std::size_t dash = x.text.find('-');
    EXPECT_TRUE(dash >= 2 && dash <= 5 && x.text.size() == dash + 4) << x.text;
  }
  // max_tokens cuts a document: "length", the text a prefix of a valid one.
  GenerationRequest cut = request(g, 1.0, 5, 5);
  cut.sampling.max_tokens = 3;
  const Out c = run(*e, cut);
  EXPECT_EQ(c.reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 3u);
  EXPECT_EQ(
      c.text.rfind("{\"name\":\"", 0) == 0 || std::string("{\"name\":\"").rfind(c.text, 0) == 0,
      true)
      << c.text;
}

// Batch invariance: a constrained request gives the same tokens and logprobs alone and among 15
// concurrent others (constrained with other grammars, or not), greedy and seeded at temperature 1.
TEST_F(Constrained, SameTokensAloneAndAmongFifteenOthers) {
  auto e = engine();
  auto g = schema_grammar(*e);
  auto other = Grammar::from_regex("[a-z ]{3,40}\\.", vocab(*e));
  ASSERT_TRUE(other.is_ok());
  const std::vector<GenerationRequest> targets = {request(g, 0.0, 1, 1), request(g, 1.0, 77, 2)};
  std::vector<Out> solo;
  for (const auto& t : targets) solo.push_back(run(*e, t));
  Rng rng(5);
  std::vector<std::thread> th;
  std::vector<Out> crowd(targets.size());
  std::vector<Out> others(15);
  for (int i = 0; i < 15; ++i) {
    GenerationRequest r =
        request(i % 3 == 0 ? nullptr : (i % 3 == 1 ? g : *other), 0.8, uint64_t(1000 + i), 10 + i);
    r.sampling.max_tokens = 8 + int(rng.below(40));
    th.emplace_back([&, i, r] { others[std::size_t(i)] = run(*e, r); });
    if (i == 4 || i == 9) {
      const std::size_t k = i == 4 ? 0 : 1;
      th.emplace_back([&, k] { crowd[k] = run(*e, targets[k]); });
    }
  }
  for (auto& t : th) t.join();
  for (std::size_t k = 0; k < targets.size(); ++k) {
    EXPECT_EQ(solo[k].reason, FinishReason::kStop);
    EXPECT_TRUE(crowd[k] == solo[k])
        << "target " << k << ": " << crowd[k].text << " vs " << solo[k].text;
  }
  EXPECT_EQ(e->stats().kv_foreign_reads, 0);
}

// Speculative decoding with a constraint: the same tokens and logprobs as without it (greedy and
// seeded), with drafts verified (the grammar cuts those it refuses).
TEST_F(Constrained, SpeculationGivesThePlainTokens) {
  auto plain = engine(false);
  auto spec = engine(true);
  auto g = schema_grammar(*plain);
  auto choices = Grammar::from_choices({"the cat sat", "the dog ran", "a bird"}, vocab(*plain));
  ASSERT_TRUE(choices.is_ok());
  std::vector<GenerationRequest> reqs = {request(g, 0.0, 1, 1), request(g, 1.0, 9, 2),
                                         request(g, 1.0, 10, 3), request(*choices, 1.0, 3, 4)};
  // Thinking mode: drafts run unconstrained through the reasoning and are checked after </think>.
  for (uint64_t seed : {5, 6}) {
    reqs.push_back(request(g, 1.0, seed, int(seed)));
    reqs.back().constraint_after_reasoning = true;
    reqs.back().sampling.thinking_token_budget = 8;
  }
  std::vector<Out> want;
  for (const auto& r : reqs) want.push_back(run(*plain, r));
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(run(*spec, reqs[i]) == want[i]) << "request " << i << " alone";
    EXPECT_EQ(want[i].reason, FinishReason::kStop);
  }
  std::vector<Out> got(reqs.size());
  std::vector<std::thread> th;
  for (std::size_t i = 0; i < reqs.size(); ++i)
    th.emplace_back([&, i] { got[i] = run(*spec, reqs[i]); });
  for (auto& t : th) t.join();
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_TRUE(got[i] == want[i]) << "request " << i << " among others";
  const EngineStats s = spec->stats();
  std::printf("random drafter: %lld verify steps, %lld drafts, %lld accepted\n",
              (long long)s.spec_steps, (long long)s.spec_draft_tokens,
              (long long)s.spec_accepted_tokens);
  EXPECT_GT(s.spec_steps, 0);
  EXPECT_GT(s.spec_draft_tokens, 0);
  EXPECT_EQ(s.kv_foreign_reads, 0);
}

// A drafter that knows the plain runs' answers (model/oracle_drafter.h), every fifth position made
// wrong: chains are accepted at every depth, each verify row masked by the grammar state after
// the drafts accepted before it, and the output is still the plain run's. Two of the requests
// share their prompt and their first tokens (two seeds): the drafter follows the first run's
// answer for both, so the second one's drafts are a valid document's tokens that its own draws
// reject where the runs part (a rejection the grammar cannot cut: the verifier's).
TEST_F(Constrained, KnownDraftsAreAcceptedAndTheOutputIsThePlainOne) {
  auto plain = engine(false);
  auto g = schema_grammar(*plain);
  std::vector<GenerationRequest> reqs = {request(g, 0.0, 1, 1)};
  std::vector<Out> want = {run(*plain, reqs[0])};
  // Two seeds whose answers start alike and part later (the first drafts come after the first
  // token, so they must share it).
  std::vector<Out> seeded;
  for (uint64_t seed = 20; seed < 36 && reqs.size() < 3; ++seed) {
    seeded.push_back(run(*plain, request(g, 1.0, seed, 2)));
    for (std::size_t j = 0; j + 1 < seeded.size() && reqs.size() < 3; ++j) {
      const Out& a = seeded[j];
      const Out& b = seeded.back();
      std::size_t common = 0;
      while (common < a.tokens.size() && common < b.tokens.size() &&
             a.tokens[common] == b.tokens[common])
        ++common;
      if (common >= 2 && a.tokens != b.tokens) {
        reqs.push_back(request(g, 1.0, 20 + j, 2));
        reqs.push_back(request(g, 1.0, seed, 2));
        want.push_back(a);
        want.push_back(b);
      }
    }
  }
  ASSERT_EQ(reqs.size(), 3u) << "no two seeds share a first token";
  std::vector<std::vector<int32_t>> streams;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    streams.push_back(reqs[i].prompt);
    streams.back().insert(streams.back().end(), want[i].tokens.begin(), want[i].tokens.end());
  }
  FastOptions fo;
  fo.kv_cache_bytes = 50'000'000;
  fo.dspark = true;
  auto fast = FastModel::load(*conv_, fo);
  ASSERT_TRUE(fast.is_ok());
  auto backend = std::make_unique<OracleDrafter>(std::move(*fast), streams,
                                                 [](std::size_t at) { return at % 5 == 0; });
  OracleDrafter* oracle = backend.get();
  auto tok = Tokenizer::load(*conv_ + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok());
  EngineOptions so;
  so.speculative = true;
  so.speculative_width = 3;  // chains of 3 + 1: the wrong fifth positions fall at every depth
  auto spec = Engine::create(std::move(backend), std::move(*tok), so);
  ASSERT_TRUE(spec.is_ok()) << spec.status().message();
  std::vector<Out> got(reqs.size());
  std::vector<std::thread> th;
  for (std::size_t i = 0; i < reqs.size(); ++i)
    th.emplace_back([&, i] { got[i] = run(**spec, reqs[i]); });
  for (auto& t : th) t.join();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(want[i].reason, FinishReason::kStop);
    EXPECT_TRUE(got[i] == want[i])
        << "request " << i << ": " << got[i].text << " vs " << want[i].text;
  }
  const EngineStats s = (*spec)->stats();
  std::printf("known drafts: %lld verify steps, %lld drafts, %lld accepted\n",
              (long long)s.spec_steps, (long long)s.spec_draft_tokens,
              (long long)s.spec_accepted_tokens);
  EXPECT_GT(oracle->known_drafts, 0);
  EXPECT_GT(s.spec_accepted_tokens, s.spec_steps);         // chains accepted, not single drafts
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);  // and some rejected
  EXPECT_NE(want[1].tokens, want[2].tokens);
  EXPECT_EQ(s.kv_foreign_reads, 0);
}

// A grammar no token of the vocabulary can start (every token's bytes are "x", the regex wants
// "y"): the request ends at once with an error naming structured output; the engine goes on.
TEST_F(Constrained, AGrammarThatAllowsNothingEndsTheRequest) {
  auto e = engine();
  std::vector<std::string> bytes(std::size_t(e->tokenizer().vocab_size()), "x");
  auto v = TokenVocab::create(bytes, {}, {e->eos_id()});
  ASSERT_TRUE(v.is_ok());
  auto g = Grammar::from_regex("y", *v);
  ASSERT_TRUE(g.is_ok());
  const Out o = run(*e, request(*g, 1.0, 1));
  EXPECT_EQ(o.reason, FinishReason::kError);
  EXPECT_NE(o.error.find("structured output"), std::string::npos) << o.error;
  EXPECT_TRUE(o.tokens.empty());
  auto ok = Grammar::from_choices({"fine"}, vocab(*e));
  ASSERT_TRUE(ok.is_ok());
  const Out f = run(*e, request(*ok, 1.0, 2));
  EXPECT_EQ(f.reason, FinishReason::kStop);
  EXPECT_EQ(f.text, "fine");
  // A grammar of another vocabulary is refused at submission.
  auto small = TokenVocab::create({"a", "b"}, {}, {0});
  ASSERT_TRUE(small.is_ok());
  auto wrong = Grammar::from_regex("b", *small);
  ASSERT_TRUE(wrong.is_ok());
  auto refused = e->submit(request(*wrong, 1.0, 1));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("constraint"), std::string::npos);
}

// Thinking mode: the reasoning is free, the constraint starts after </think>.
TEST_F(Constrained, StartsWhenTheReasoningCloses) {
  auto e = engine();
  const int32_t think_end = e->tokenizer().token_id(tokens::kThinkEnd);
  ASSERT_GE(think_end, 0);
  auto choices = Grammar::from_choices({"yes", "no"}, vocab(*e));
  ASSERT_TRUE(choices.is_ok());
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = request(*choices, 1.0, uint64_t(i), i);
    r.constraint_after_reasoning = true;
    r.sampling.thinking_token_budget = 6;  // closes the random model's reasoning
    r.sampling.skip_special_tokens = false;
    const Out o = run(*e, r);
    EXPECT_EQ(o.reason, FinishReason::kStop) << o.text;
    const auto at = std::find(o.tokens.begin(), o.tokens.end(), think_end);
    ASSERT_NE(at, o.tokens.end());
    EXPECT_LE(at - o.tokens.begin(), 5);
    auto answer = e->tokenizer().decode(std::vector<int32_t>(at + 1, o.tokens.end()));
    ASSERT_TRUE(answer.is_ok());
    EXPECT_TRUE(*answer == "yes" || *answer == "no") << *answer;
  }
}

// While the reasoning runs (thinking mode), the constraint refuses only the end ids: an output
// that ended inside its reasoning would have no answer for the grammar to shape.
TEST(ConstraintState, TheReasoningCannotEndTheOutput) {
  // Ids: 0 "a", 1 "b", 2 "</think>" (the reasoning's end), 3 the end id.
  auto v = TokenVocab::create({"a", "b", "</think>", "<eos>"}, {}, {3});
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  auto g = Grammar::from_choices({"ab"}, *v);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  SequenceConstraint c(*g, /*reasoning_end=*/2, /*vocab_size=*/4);
  ASSERT_FALSE(c.active());
  std::vector<float> logits = {1, 1, 1, 5};
  EXPECT_TRUE(c.apply(logits));
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[2], 1.0f);
  EXPECT_TRUE(std::isinf(logits[3]) && logits[3] < 0);
  EXPECT_TRUE(c.allows(0));
  EXPECT_FALSE(c.allows(3));
  EXPECT_EQ(c.admissible_prefix({0, 1, 3, 0}), 2u);     // a draft cut before the end id
  EXPECT_EQ(c.admissible_prefix({1, 2, 0, 1, 3}), 5u);  // after </think>: "ab", then the end
  ASSERT_TRUE(c.accept(1));
  ASSERT_TRUE(c.accept(2));  // the reasoning ends: the grammar applies
  ASSERT_TRUE(c.active());
  std::vector<float> next = {1, 1, 1, 5};
  EXPECT_TRUE(c.apply(next));
  EXPECT_EQ(next[0], 1.0f);  // "a" starts "ab"
  EXPECT_TRUE(std::isinf(next[1]) && std::isinf(next[3]));
}

}  // namespace
}  // namespace dsv41::constrained_test
