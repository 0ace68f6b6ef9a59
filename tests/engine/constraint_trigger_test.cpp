// Trigger constraints (issue 32: strict tools under tool_choice auto): a grammar that starts only
// once the model itself sampled a trigger token (the DSML marker) right after text ending in "<",
// and after the reasoning in thinking mode. Before the trigger nothing is masked (a refused token
// and the end id are still sampled; a request that never triggers is the unconstrained request
// token for token); after it every token follows the grammar and the answer stops when it is
// complete; the same tokens alone, among others and with speculative decoding. The tiny random
// model rarely writes the marker, so logit_bias makes "<" and the marker likely at temperature 1.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <thread>

#include "core/rng.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "io/test_util.h"
#include "model/tiny_converted.h"
#include "text/special_tokens.h"

namespace dsv41::trigger_test {
namespace {

using namespace std::chrono_literals;

// What follows the trigger: the calls tag's rest, then a short code (a stand-in for the calls
// block, which the server tests cover with the real one).
const char* kAfter = " calls>\n";
const char* kCode = "[a-c]{2,5}-[0-9]{3}";

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
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
      return out;
    }
  }
  ADD_FAILURE() << "the request did not finish";
  return out;
}

class TriggerConstrained : public ::testing::Test {
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
    if (speculative) opt.speculative_width = 3;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return std::move(*e);
  }
  // The grammar after the marker, compiled as the server compiles tool grammars: the marker is a
  // placed token of that vocabulary (so its bytes are private, never "<" text).
  static std::shared_ptr<const Grammar> grammar(const Engine& e) {
    const int32_t marker = e.tokenizer().token_id(tokens::kDsml);
    auto v = TokenVocab::from_tokenizer(e.tokenizer(), {e.eos_id()}, {marker});
    EXPECT_TRUE(v.is_ok()) << v.status().message();
    GrammarComposer c;
    const int root = c.seq({c.literal(kAfter), c.regex(kCode, "code")});
    auto g = Grammar::compose(c, root, *v);
    EXPECT_TRUE(g.is_ok()) << g.status().message();
    return *g;
  }
  static int32_t marker(const Engine& e) { return e.tokenizer().token_id(tokens::kDsml); }
  static int32_t lt(const Engine& e) { return e.tokenizer().token_id("<"); }
  // Temperature 1, seeded; `bias`: "<" and the marker that much likelier.
  static GenerationRequest request(const Engine& e, std::shared_ptr<const Grammar> g, float bias,
                                   uint64_t seed, int prompt_seed = 0) {
    GenerationRequest r;
    Rng rng(uint64_t(300 + prompt_seed));
    for (int k = 0; k < 9 + prompt_seed % 5; ++k) r.prompt.push_back(int32_t(3 + rng.below(900)));
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed;
    r.sampling.max_tokens = 120;
    r.sampling.logprobs = 0;
    r.sampling.skip_special_tokens = false;
    if (bias != 0) r.sampling.logit_bias = {{lt(e), bias}, {marker(e), bias}};
    if (g) {
      r.constraint = std::move(g);
      r.constraint_trigger = marker(e);
      r.constraint_trigger_after = "<";
    }
    return r;
  }
  // Where the grammar started: one past the first marker that follows a token ending in "<"
  // (from `from` on: the answer after the reasoning); npos when it never did.
  static std::size_t trigger_end(const Engine& e, const std::vector<int32_t>& t,
                                 std::size_t from = 0) {
    for (std::size_t i = std::max<std::size_t>(from, 1); i < t.size(); ++i) {
      const std::string prev = e.tokenizer().token_bytes(t[i - 1]);
      if (t[i] == marker(e) && i - 1 >= from && !prev.empty() && prev.back() == '<') return i + 1;
    }
    return std::string::npos;
  }
  static std::string decode(const Engine& e, const std::vector<int32_t>& t, std::size_t from) {
    std::string s;
    for (std::size_t i = from; i < t.size(); ++i)
      if (t[i] != e.eos_id()) s += e.tokenizer().token_bytes(t[i]);
    return s;
  }
  static testing::TempDir* dir_;
  static std::string* conv_;
};
testing::TempDir* TriggerConstrained::dir_ = nullptr;
std::string* TriggerConstrained::conv_ = nullptr;

// The model writes "<" and the marker often: the grammar starts at the first marker after "<",
// and every token after it follows the grammar; before it, "<" (which the grammar refuses
// everywhere) and markers after other text were sampled freely.
TEST_F(TriggerConstrained, EveryTokenAfterTheTriggerFollowsTheGrammar) {
  auto e = engine();
  auto g = grammar(*e);
  const std::regex code(kCode);
  int free_markers = 0;
  for (int i = 0; i < 8; ++i) {
    const Out o = run(*e, request(*e, g, 6.0f, uint64_t(i), i));
    const std::size_t at = trigger_end(*e, o.tokens);
    ASSERT_NE(at, std::string::npos) << "no trigger in answer " << i;
    EXPECT_EQ(o.reason, FinishReason::kStop) << o.text;
    const std::string rest = decode(*e, o.tokens, at);
    ASSERT_EQ(rest.rfind(kAfter, 0), 0u) << rest;
    EXPECT_TRUE(std::regex_match(rest.substr(std::string(kAfter).size()), code)) << rest;
    // Before it: "<" at least once (it leads the trigger), sampled although refused after it.
    EXPECT_NE(std::find(o.tokens.begin(), o.tokens.begin() + std::ptrdiff_t(at - 1), lt(*e)),
              o.tokens.begin() + std::ptrdiff_t(at - 1));
    for (std::size_t k = 0; k + 1 < at; ++k) free_markers += o.tokens[k] == marker(*e);
    if (i < 2) std::printf("answer %d: %s\n", i, o.text.c_str());
  }
  // Markers not after "<" (or first) did not start it: they are in the free text.
  EXPECT_GT(free_markers, 0);
}

// No trigger: nothing is masked, the end id included; the request is the unconstrained one.
TEST_F(TriggerConstrained, WithoutTheTriggerTheOutputIsUnconstrained) {
  auto e = engine();
  auto g = grammar(*e);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest with = request(*e, g, 0, uint64_t(i), i);
    with.sampling.max_tokens = 40;
    GenerationRequest plain = with;
    plain.constraint = nullptr;
    const Out a = run(*e, with), b = run(*e, plain);
    if (trigger_end(*e, b.tokens) != std::string::npos) continue;  // the model wrote it itself
    EXPECT_TRUE(a == b) << a.text << " vs " << b.text;
  }
  // The end id is never refused before the trigger: a strong bias on it ends the output at once.
  GenerationRequest stop = request(*e, g, 0, 1, 1);
  stop.sampling.logit_bias = {{e->eos_id(), 50.0f}};
  const Out s = run(*e, stop);
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.tokens.size(), 1u);
}

// Thinking mode: markers inside the reasoning do not start the grammar; the first one after
// </think> (after "<") does.
TEST_F(TriggerConstrained, ArmedOnlyAfterTheReasoning) {
  auto e = engine();
  auto g = grammar(*e);
  const int32_t think_end = e->tokenizer().token_id(tokens::kThinkEnd);
  ASSERT_GE(think_end, 0);
  const std::regex code(kCode);
  int reasoning_triggers = 0;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = request(*e, g, 6.0f, uint64_t(40 + i), i);
    r.constraint_after_reasoning = true;
    r.sampling.thinking_token_budget = 10;
    const Out o = run(*e, r);
    const auto te = std::find(o.tokens.begin(), o.tokens.end(), think_end);
    ASSERT_NE(te, o.tokens.end());
    const std::size_t answer = std::size_t(te - o.tokens.begin()) + 1;
    reasoning_triggers +=
        trigger_end(*e, std::vector<int32_t>(o.tokens.begin(), te)) != std::string::npos;
    const std::size_t at = trigger_end(*e, o.tokens, answer);
    ASSERT_NE(at, std::string::npos) << o.text;
    EXPECT_EQ(o.reason, FinishReason::kStop);
    const std::string rest = decode(*e, o.tokens, at);
    ASSERT_EQ(rest.rfind(kAfter, 0), 0u) << rest;
    EXPECT_TRUE(std::regex_match(rest.substr(std::string(kAfter).size()), code)) << rest;
  }
  EXPECT_GT(reasoning_triggers, 0);  // "<" + marker in the reasoning, which started nothing
}

// Batch invariance and speculation: the same tokens and logprobs alone, among others (some
// constrained, some triggered, some plain) and with DSpark drafts on (the grammar cuts drafts it
// refuses once the trigger is in them or before).
TEST_F(TriggerConstrained, SameTokensAloneAmongOthersAndWithSpeculation) {
  auto plain = engine(false);
  auto spec = engine(true);
  auto g = grammar(*plain);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(request(*plain, g, 6.0f, uint64_t(60 + i), i));
  GenerationRequest greedy = request(*plain, g, 3.0f, 0, 7);
  greedy.sampling.temperature = 0;
  reqs.push_back(greedy);
  GenerationRequest thinking = request(*plain, g, 6.0f, 70, 8);
  thinking.constraint_after_reasoning = true;
  thinking.sampling.thinking_token_budget = 8;
  reqs.push_back(thinking);
  std::vector<Out> want;
  for (const auto& r : reqs) want.push_back(run(*plain, r));
  int triggered = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    triggered += trigger_end(*plain, want[i].tokens) != std::string::npos;
    EXPECT_TRUE(run(*spec, reqs[i]) == want[i]) << "request " << i << " alone, speculative";
  }
  EXPECT_GE(triggered, 4);
  // Among each other and 6 more (unconstrained, or biased without a constraint), both engines.
  for (Engine* e : {plain.get(), spec.get()}) {
    std::vector<Out> got(reqs.size());
    std::vector<std::thread> th;
    for (int k = 0; k < 6; ++k) {
      GenerationRequest o = request(*plain, k % 2 ? g : nullptr, k % 3 ? 6.0f : 0, 900 + k, 20 + k);
      o.sampling.max_tokens = 10 + 7 * k;
      th.emplace_back([e, o] { run(*e, o); });
    }
    for (std::size_t i = 0; i < reqs.size(); ++i)
      th.emplace_back([&, e, i] { got[i] = run(*e, reqs[i]); });
    for (auto& t : th) t.join();
    for (std::size_t i = 0; i < reqs.size(); ++i)
      EXPECT_TRUE(got[i] == want[i])
          << "request " << i << " among others" << (e == spec.get() ? ", speculative" : "");
    EXPECT_EQ(e->stats().kv_foreign_reads, 0);
  }
  EXPECT_GT(spec->stats().spec_draft_tokens, 0);
}

// The state machine on a 7-token vocabulary: 0 "a", 1 "<", 2 the marker (trigger), 3 "</think>",
// 4 the end id, 5 "x", 6 "b"; the grammar after the trigger is "ab".
TEST(ConstraintState, TriggerStartsTheGrammarOnlyAfterItsLeadingText) {
  auto v = TokenVocab::create({"a", "<", "M", "</think>", "<eos>", "x", "b"}, {2, 3}, {4});
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  auto g = Grammar::from_choices({"ab"}, *v);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  SequenceConstraint c(*g, SequenceConstraint::Start{-1, 2, "<"}, 7);
  ASSERT_FALSE(c.active());
  std::vector<float> logits = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<float> before = logits;
  EXPECT_TRUE(c.apply(logits));
  EXPECT_EQ(logits, before);  // nothing masked, the end id included
  for (int32_t t = 0; t < 7; ++t) EXPECT_TRUE(c.allows(t));
  EXPECT_EQ(c.admissible_prefix({5, 4}), 2u);           // free text, then the end
  EXPECT_EQ(c.admissible_prefix({1, 2, 0, 6, 4}), 5u);  // "<" trigger "ab" end
  EXPECT_EQ(c.admissible_prefix({1, 2, 5}), 2u);        // "x" refused after the trigger
  EXPECT_EQ(c.admissible_prefix({0, 2, 5, 1, 2, 0}), 6u);
  ASSERT_TRUE(c.accept(2));  // first: the prompt is not "<"
  EXPECT_FALSE(c.active());
  ASSERT_TRUE(c.accept(0));
  ASSERT_TRUE(c.accept(2));  // after "a"
  EXPECT_FALSE(c.active());
  ASSERT_TRUE(c.accept(1));
  ASSERT_TRUE(c.accept(2));  // after "<": the grammar starts
  ASSERT_TRUE(c.active());
  std::vector<float> next = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(c.apply(next));
  EXPECT_EQ(next[0], 1.0f);
  for (int t : {1, 2, 3, 4, 5, 6}) EXPECT_TRUE(std::isinf(next[std::size_t(t)])) << t;
  ASSERT_TRUE(c.accept(0));
  ASSERT_TRUE(c.accept(6));
  EXPECT_TRUE(c.must_end());

  // With a reasoning: a trigger inside it counts for nothing, and the end id is never refused.
  SequenceConstraint r(*g, SequenceConstraint::Start{3, 2, "<"}, 7);
  std::vector<float> free = before;
  EXPECT_TRUE(r.apply(free));
  EXPECT_EQ(free, before);
  EXPECT_EQ(r.admissible_prefix({1, 2, 5, 3, 1, 2, 0, 6}), 8u);
  EXPECT_EQ(r.admissible_prefix({1, 2, 5, 3, 1, 2, 5}), 6u);
  EXPECT_EQ(r.admissible_prefix({1, 3, 2, 5}), 4u);  // "<" before </think> leads nothing
  ASSERT_TRUE(r.accept(1));
  ASSERT_TRUE(r.accept(2));
  EXPECT_FALSE(r.active());
  ASSERT_TRUE(r.accept(3));
  ASSERT_TRUE(r.accept(1));
  ASSERT_TRUE(r.accept(2));
  EXPECT_TRUE(r.active());
}

}  // namespace
}  // namespace dsv41::trigger_test
