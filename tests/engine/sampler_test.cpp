// Sampler: distributions against the exact softmax with a fixed seed (chi-square bounds that a
// wrong temperature, filter or off-by-one fails), filters, penalties, bias, greedy ties,
// reproducibility.
#include <gtest/gtest.h>

#include "chi_square.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace dsv41 {
namespace {

std::vector<double> softmax(const std::vector<float>& l, double t) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (std::size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= z;
  return p;
}

std::vector<int> histogram(const SamplingParams& sp, const std::vector<float>& logits, int n,
                           uint64_t seed) {
  Sampler s(sp, seed);
  std::vector<int> h(logits.size());
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++h[static_cast<std::size_t>(s.sample(l))];
  }
  return h;
}

using testing::chi_square;

const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.2f, -0.5f, -1.0f, -3.0f, 0.9f};
constexpr int kN = 40000;
// 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
constexpr double kChi7 = 24.3;

TEST(Sampler, TemperatureOneMatchesSoftmax) {
  SamplingParams sp;
  auto h = histogram(sp, kLogits, kN, 1);
  EXPECT_LT(chi_square(h, softmax(kLogits, 1.0), kN), kChi7);
  // A wrong temperature is caught by the same test.
  EXPECT_GT(chi_square(h, softmax(kLogits, 0.8), kN), 100.0);
}

TEST(Sampler, TemperatureScales) {
  for (double t : {0.5, 2.0}) {
    SamplingParams sp;
    sp.temperature = t;
    auto h = histogram(sp, kLogits, kN, 2);
    EXPECT_LT(chi_square(h, softmax(kLogits, t), kN), kChi7) << t;
  }
}

TEST(Sampler, TopKTopPMinPRenormalise) {
  auto p = softmax(kLogits, 1.0);  // sorted ids by logit: 0,1,2,7,3,4,5,6
  {
    SamplingParams sp;
    sp.top_k = 3;
    std::vector<double> q = {p[0], p[1], p[2], 0, 0, 0, 0, 0};
    double z = q[0] + q[1] + q[2];
    for (double& x : q) x /= z;
    EXPECT_LT(chi_square(histogram(sp, kLogits, kN, 3), q, kN), 13.8);  // 2 dof, 0.001
  }
  {
    // top_p just above p0+p1: three tokens are needed to reach it.
    SamplingParams sp;
    sp.top_p = p[0] + p[1] + 1e-6;
    std::vector<double> q = {p[0], p[1], p[2], 0, 0, 0, 0, 0};
    double z = q[0] + q[1] + q[2];
    for (double& x : q) x /= z;
    EXPECT_LT(chi_square(histogram(sp, kLogits, kN, 4), q, kN), 13.8);
  }
  {
    // min_p keeps tokens with p >= min_p * p_max.
    SamplingParams sp;
    sp.min_p = 0.3;
    std::vector<double> q(p.size(), 0);
    double z = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i] >= 0.3 * p[0]) z += q[i] = p[i];
    for (double& x : q) x /= z;
    int kept = 0;
    for (double x : q) kept += x > 0;
    EXPECT_EQ(kept, 4);                                                 // ids 0, 1, 2, 7
    EXPECT_LT(chi_square(histogram(sp, kLogits, kN, 5), q, kN), 16.3);  // 3 dof
  }
}

// top-p over a large vocabulary (the nucleus needs hundreds of 2,000 tokens, so the selection grows
// past its first batch of 64): exactly the brute-force nucleus (sorted by probability, smallest
// prefix reaching top_p) is ever drawn, each token at its renormalised probability; with min-p
// too, the nucleus is taken from what min-p keeps.
TEST(Sampler, TopPOverALargeVocabularyIsTheSortedNucleus) {
  std::vector<float> logits(2000);
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = float(std::sin(double(i) * 12.9898) * 3.0);
  for (double min_p : {0.0, 0.2}) {
    SCOPED_TRACE(min_p);
    SamplingParams sp;
    sp.top_p = 0.8;
    sp.min_p = min_p;
    const auto p = softmax(logits, 1.0);
    const double pmax = *std::max_element(p.begin(), p.end());
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < int32_t(p.size()); ++i)
      if (p[std::size_t(i)] >= min_p * pmax) ids.push_back(i);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return p[std::size_t(a)] != p[std::size_t(b)] ? p[std::size_t(a)] > p[std::size_t(b)] : a < b;
    });
    std::vector<double> q(p.size(), 0);
    double cum = 0, z = 0;
    std::size_t n = 0;
    while (n < ids.size() && cum < sp.top_p)
      z += q[std::size_t(ids[n])] = p[std::size_t(ids[n])], cum += p[std::size_t(ids[n++])];
    for (double& x : q) x /= z;
    if (min_p == 0) EXPECT_GT(n, 256u);  // the selection had to grow
    // Pool the nucleus into 20 cells of about equal mass for the chi-square.
    const int draws = 30000;
    const auto h = histogram(sp, logits, draws, 11);
    std::vector<int> ch(20, 0);
    std::vector<double> cq(20, 0);
    double acc = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t id = std::size_t(ids[k]);
      const std::size_t cell = std::min<std::size_t>(19, std::size_t(acc * 20));
      acc += q[id];
      ch[cell] += h[id];
      cq[cell] += q[id];
    }
    int outside = 0;
    for (std::size_t i = 0; i < h.size(); ++i) outside += q[i] == 0 ? h[i] : 0;
    EXPECT_EQ(outside, 0);
    EXPECT_LT(chi_square(ch, cq, draws), 43.8);  // 19 dof, 0.001
  }
}

// The processed distribution on its own (what a speculative verifier reads): the exact
// renormalised probabilities of each filter, in the order the draw walks; sample() is process()
// then draw() on the same stream; unaccept() takes a penalty count back exactly.
TEST(Sampler, ProcessedDistributionIsWhatTheDrawUses) {
  const auto p = softmax(kLogits, 1.0);  // sorted ids by logit: 0,1,2,7,3,4,5,6
  struct Case {
    SamplingParams sp;
    std::vector<int32_t> support;  // in draw order
  };
  std::vector<Case> cases(4);
  cases[0].support = {0, 1, 2, 3, 4, 5, 6, 7};  // no cut: id order
  cases[1].sp.top_k = 3;
  cases[1].support = {0, 1, 2};
  cases[2].sp.top_p = p[0] + p[1] + 1e-6;
  cases[2].support = {0, 1, 2};  // the nucleus, most likely first
  cases[3].sp.min_p = 0.3;
  cases[3].support = {0, 1, 2, 7};
  for (const Case& c : cases) {
    Sampler s(c.sp, 9), t(c.sp, 9);
    ProcessedDistribution d;
    auto l = kLogits;
    s.process(l, &d);
    EXPECT_EQ(d.ids, c.support);
    double z = 0;
    for (int32_t id : c.support) z += p[std::size_t(id)];
    for (std::size_t i = 0; i < d.ids.size(); ++i)
      EXPECT_NEAR(d.probs[i], p[std::size_t(d.ids[i])] / z, 1e-6) << "id " << d.ids[i];
    EXPECT_EQ(d.probability(6), c.support.size() == 8 ? d.probs[6] : 0.0);
    for (int i = 0; i < 50; ++i) {  // the same stream: the same tokens
      auto a = kLogits, b = kLogits;
      ProcessedDistribution e;
      t.process(b, &e);
      EXPECT_EQ(s.sample(a), t.draw(e));
    }
  }
  SamplingParams pp;
  pp.presence_penalty = 0.5;
  pp.frequency_penalty = 0.25;
  Sampler q(pp, 1);
  ProcessedDistribution before, after;
  auto l0 = kLogits, l1 = kLogits;
  q.process(l0, &before);
  q.accept(2);
  q.accept(2);
  q.unaccept(2);
  q.unaccept(2);
  q.process(l1, &after);
  EXPECT_EQ(before.ids, after.ids);
  EXPECT_EQ(before.probs, after.probs);
}

// A temperature too small for the float scale (1 / T overflows) is greedy, not a crash; so is any
// temperature below vLLM's epsilon.
TEST(Sampler, TinyTemperatureIsGreedy) {
  for (double t : {1e-40, 1e-30, 9e-6}) {
    SamplingParams sp;
    sp.temperature = t;
    for (double top_p : {1.0, 0.5}) {
      sp.top_p = top_p;
      Sampler s(sp, 3);
      auto l = kLogits;
      EXPECT_EQ(s.sample(l), 0) << t;
    }
  }
}

TEST(Sampler, GreedyTakesFirstMaximum) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp, 0);
  std::vector<float> l = {0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(s.sample(l), 1);
  std::vector<float> l2 = kLogits;
  EXPECT_EQ(s.sample(l2), 0);
}

TEST(Sampler, LogitBiasAndPenalties) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.logit_bias = {{0, -100.f}, {6, 4.5f}};
  Sampler s(sp, 0);
  auto l = kLogits;
  EXPECT_EQ(s.sample(l), 1);  // id 6 reaches 1.5 and ties with id 1: the lower id wins
  sp.logit_bias = {{0, -100.f}, {6, 5.0f}};
  Sampler s2(sp, 0);
  auto l2 = kLogits;
  EXPECT_EQ(s2.sample(l2), 6);
  // Presence and frequency penalties push generated tokens down.
  SamplingParams pp;
  pp.temperature = 0;
  pp.presence_penalty = 0.4;
  pp.frequency_penalty = 0.2;
  Sampler q(pp, 0);
  auto a = kLogits;
  EXPECT_EQ(q.sample(a), 0);
  q.accept(0);  // 2.0 - 0.6 = 1.4 < 1.5
  auto b = kLogits;
  EXPECT_EQ(q.sample(b), 1);
  q.accept(1);  // id 0 at 1.4, id 1 at 0.9, id 2 at 1.0
  auto c = kLogits;
  EXPECT_EQ(q.sample(c), 0);
  q.accept(0);  // 2.0 - 0.4 - 0.4 = 1.2; id 1 at 0.9; so 0 again
  auto d = kLogits;
  EXPECT_EQ(q.sample(d), 0);
  q.accept(0);  // 2.0 - 0.4 - 0.6 = 1.0 ties with id 2 (1.0): lower id wins
  auto e = kLogits;
  EXPECT_EQ(q.sample(e), 0);
  q.accept(0);  // 0.8 < id 2's 1.0
  auto f = kLogits;
  EXPECT_EQ(q.sample(f), 2);
}

// vLLM's repetition_penalty: every token of the prompt or the output has its logit divided by
// the penalty when positive, multiplied by it otherwise; tokens never seen keep theirs.
TEST(Sampler, RepetitionPenaltyCoversPromptAndOutput) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.repetition_penalty = 1.5;
  Sampler s(sp, 0);
  s.set_context({0, 5}, -1, -1);  // id 0 (2.0) and id 5 (-1.0) in the prompt
  auto a = kLogits;
  EXPECT_EQ(s.sample(a), 1);  // 2.0 / 1.5 = 1.33 < 1.5
  EXPECT_FLOAT_EQ(a[0], 2.0f / 1.5f);
  EXPECT_FLOAT_EQ(a[5], -1.0f * 1.5f);
  EXPECT_FLOAT_EQ(a[2], 1.0f);
  s.accept(1);  // 1.5 / 1.5 = 1.0 ties id 2 (1.0) below id 0's 1.33
  auto b = kLogits;
  EXPECT_EQ(s.sample(b), 0);
  SamplingParams off = sp;
  off.repetition_penalty = 1.0;  // off: the plain argmax
  Sampler o(off, 0);
  o.set_context({0, 5}, -1, -1);
  auto c = kLogits;
  EXPECT_EQ(o.sample(c), 0);
}

// min_tokens masks EOS and the stop token ids until that many tokens were accepted; bad_words
// forbids a one-token word always and a longer word's last token after the rest of it.
TEST(Sampler, MinTokensAndBadWordsMaskTokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.min_tokens = 2;
  sp.stop_token_ids = {1};
  Sampler s(sp, 0);
  s.set_context({}, /*eos=*/0, -1);
  auto a = kLogits;
  EXPECT_EQ(s.sample(a), 2);  // EOS (0) and the stop token (1) are masked
  s.accept(2);
  auto b = kLogits;
  EXPECT_EQ(s.sample(b), 2);
  s.accept(2);
  auto c = kLogits;
  EXPECT_EQ(s.sample(c), 0);  // two tokens generated: EOS may come
  SamplingParams bw;
  bw.temperature = 0;
  bw.bad_words_ids = {{0}, {3, 1}};
  Sampler w(bw, 0);
  auto d = kLogits;
  EXPECT_EQ(w.sample(d), 1);  // 0 is banned
  w.accept(3);
  auto e = kLogits;
  EXPECT_EQ(w.sample(e), 2);  // after 3, the word's 1 is banned too
  w.accept(2);
  auto f = kLogits;
  EXPECT_EQ(w.sample(f), 1);  // no longer after 3
}

// The reasoning cap: once budget - 1 tokens were accepted in the reasoning, the end token is the
// only one drawn (even sampled, where it would be unlikely); after it, sampling is as before.
TEST(Sampler, ReasoningBudgetForcesTheEndToken) {
  for (double temperature : {0.0, 1.0}) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = 3;
    sp.thinking_token_budget = 3;
    sp.logit_bias = {{6, -100.f}};  // the end token (6) is never drawn by itself
    Sampler s(sp, 0);
    s.set_context({}, -1, /*reasoning_end=*/6);
    for (int i = 0; i < 2; ++i) {
      auto l = kLogits;
      const int32_t t = s.sample(l);
      EXPECT_NE(t, 6);
      s.accept(t);
      EXPECT_EQ(s.reasoning_tokens(), i + 1);
    }
    auto l = kLogits;
    EXPECT_EQ(s.sample(l), 6) << temperature;
    s.accept(6);
    EXPECT_EQ(s.reasoning_tokens(), 3);
    for (int i = 0; i < 20; ++i) {
      auto m = kLogits;
      const int32_t t = s.sample(m);
      EXPECT_NE(t, 6);
      s.accept(t);
    }
    EXPECT_EQ(s.reasoning_tokens(), 3);
  }
  SamplingParams zero;
  zero.temperature = 0;
  zero.thinking_token_budget = 0;  // at once
  Sampler z(zero, 0);
  z.set_context({}, -1, 7);
  auto l = kLogits;
  EXPECT_EQ(z.sample(l), 7);
}

TEST(Sampler, SeedReproducesAndDiffers) {
  SamplingParams sp;
  sp.seed = 42;
  auto run = [&](uint64_t fallback) {
    Sampler s(sp, fallback);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      auto l = kLogits;
      out.push_back(s.sample(l));
    }
    return out;
  };
  EXPECT_EQ(run(1), run(2));  // the request's seed wins over the engine's fallback
  sp.seed = 43;
  auto other = run(1);
  sp.seed = 42;
  EXPECT_NE(run(1), other);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  auto p = softmax(kLogits, 1.0);
  for (int32_t t = 0; t < 8; ++t)
    EXPECT_NEAR(token_logprob(kLogits, t), std::log(p[static_cast<std::size_t>(t)]), 1e-6);
  auto top = top_logprobs(kLogits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 0);
  EXPECT_EQ(top[1].token, 1);
  EXPECT_EQ(top[2].token, 2);
  EXPECT_NEAR(top[2].logprob, std::log(p[2]), 1e-6);
}

TEST(Sampler, ValidationNamesTheParameter) {
  auto err = [](auto mutate) {
    SamplingParams sp;
    mutate(sp);
    Status st = validate_sampling(sp, 100);
    return st.is_ok() ? std::string() : st.message();
  };
  EXPECT_EQ(err([](SamplingParams&) {}), "");
  EXPECT_EQ(err([](SamplingParams& s) { s.temperature = -1; }).rfind("temperature", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.top_p = 0; }).rfind("top_p", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.top_k = -2; }).rfind("top_k", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.min_p = 1.5; }).rfind("min_p", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.presence_penalty = 3; }).rfind("presence_penalty", 0),
            0u);
  EXPECT_EQ(
      err([](SamplingParams& s) { s.frequency_penalty = -2.5; }).rfind("frequency_penalty", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.logit_bias = {{100, 1.f}}; }).rfind("logit_bias", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.logit_bias = {{1, 101.f}}; }).rfind("logit_bias", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.logprobs = 21; }).rfind("logprobs", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.max_tokens = 0; }).rfind("max_tokens", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.stop_token_ids = {-1}; }).rfind("stop_token_ids", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.stop = {""}; }).rfind("stop", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.repetition_penalty = 0; }).rfind("repetition_penalty", 0),
            0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.min_tokens = 17; }).rfind("min_tokens", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.bad_words_ids = {{100}}; }).rfind("bad_words", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) { s.bad_words_ids = {{}}; }).rfind("bad_words", 0), 0u);
  EXPECT_EQ(err([](SamplingParams& s) {
              s.thinking_token_budget = -2;
            }).rfind("thinking_token_budget", 0),
            0u);
}

}  // namespace
}  // namespace dsv41
