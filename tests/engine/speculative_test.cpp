// DSpark speculative decoding (engine/speculative.h): the verifier's rule keeps the target's
// distribution (chi-square over many draws, for drafts of high, low and zero target probability),
// greedy accepts exactly the argmax; the tracker stops drafting where it does not pay and probes
// again; end to end, sampled tokens through the engine keep the target's distribution while drafts
// are accepted and rejected, and greedy requests on the fast path give the tokens and logprobs of
// plain decoding.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include "chi_square.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "core/rng.h"
#include "engine/engine.h"
#include "io/test_util.h"
#include "model/fast/fast_model.h"
#include "model/oracle_drafter.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_converted.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

using namespace std::chrono_literals;

const std::vector<float> kSpecLogits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 1.5f, 0.2f};

std::vector<double> softmax(const std::vector<float>& l) {
  double m = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp(double(l[i]) - m));
  for (auto& v : p) v /= z;
  return p;
}

using testing::chi_square;

constexpr double kSpecChi7 = 24.3;  // 7 degrees of freedom, P(chi2 > 24.3) = 0.001

TEST(Verify, GreedyAcceptsOnlyTheArgmax) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp, 1);
  ProcessedDistribution p;
  std::vector<float> l = kSpecLogits;
  s.process(l, &p);
  ASSERT_TRUE(p.greedy);
  for (int32_t d = 0; d < int32_t(kSpecLogits.size()); ++d) {
    const VerifyOutcome v = verify_draft(p, d, s);
    EXPECT_EQ(v.accepted, d == 0) << d;
    EXPECT_EQ(v.token, 0) << d;
  }
}

TEST(Verify, OutcomesFollowTheTargetDistributionWhateverTheDraft) {
  const int n = 40000;
  const auto p_full = softmax(kSpecLogits);
  for (int32_t draft : {0, 3, 5}) {  // likely, middling, unlikely
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.seed = 77 + uint64_t(draft);
    Sampler s(sp, 1);
    ProcessedDistribution p;
    std::vector<int> h(kSpecLogits.size(), 0);
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = kSpecLogits;
      s.process(l, &p);
      const VerifyOutcome v = verify_draft(p, draft, s);
      ++h[std::size_t(v.token)];
      accepted += v.accepted;
      EXPECT_EQ(v.accepted, v.token == draft);
    }
    EXPECT_LT(chi_square(h, p_full, n), kSpecChi7) << "draft " << draft;
    // Accepted as often as the target gives the draft (binomial, 5 sigma).
    const double want = p_full[std::size_t(draft)] * n;
    EXPECT_NEAR(accepted, want, 5 * std::sqrt(want)) << "draft " << draft;
  }
  // A draft outside the processed support (top_k 3 keeps tokens 0, 6, 1) is never accepted and the
  // outcome is the top-3 distribution.
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 3;
  sp.seed = 5;
  Sampler s(sp, 1);
  ProcessedDistribution p;
  std::vector<int> h(kSpecLogits.size(), 0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = kSpecLogits;
    s.process(l, &p);
    const VerifyOutcome v = verify_draft(p, 4, s);
    EXPECT_FALSE(v.accepted);
    ++h[std::size_t(v.token)];
  }
  std::vector<double> q(kSpecLogits.size(), 0.0);
  const double z = p_full[0] + p_full[6] + p_full[1];
  for (int t : {0, 6, 1}) q[std::size_t(t)] = p_full[std::size_t(t)] / z;
  EXPECT_LT(chi_square(h, q, n), 13.8);  // 2 dof, 0.001
}

TEST(Tracker, CostModelInterpolatesMeasuredWidths) {
  SpecCosts c;
  EXPECT_DOUBLE_EQ(c.ratio(4), 2.0);  // nothing measured: the prior 1 + k / 4
  c.observe_plain(2.0);
  c.observe_spec(2, 3.0);  // width 2 costs 1.5 plain steps
  EXPECT_DOUBLE_EQ(c.ratio(0), 1.0);
  EXPECT_DOUBLE_EQ(c.ratio(2), 1.5);
  EXPECT_DOUBLE_EQ(c.ratio(1), 1.25);  // between the plain step and width 2
  EXPECT_DOUBLE_EQ(c.ratio(4), 2.0);   // beyond: the same cost per draft
  c.observe_spec(4, 3.2);
  EXPECT_DOUBLE_EQ(c.ratio(4), 1.6);
  EXPECT_DOUBLE_EQ(c.ratio(3), 1.55);
}

TEST(Tracker, StopsDraftingWhereItDoesNotPayAndProbesAgain) {
  SpecCosts costs;
  costs.observe_plain(1.0);
  costs.observe_spec(1, 2.0);  // one draft doubles the step: only a sure draft would pay
  SpecTracker t(5);
  // Prior acceptance 1/2: 1.5 tokens for 2 steps' time does not pay, but a new request probes
  // first (its own acceptance decides), with the width of the best ratio: one draft here.
  EXPECT_EQ(t.plan(costs), 1);
  t.record(1, 0);
  int plain = 0;
  int64_t k = 0;
  while ((k = t.plan(costs)) == 0) {
    ++plain;
    EXPECT_EQ(t.drafting(), plain == 16);  // drafting again once the wait is over
  }
  EXPECT_EQ(plain, 16);  // 16 plain steps, then a probe of one draft
  EXPECT_EQ(k, 1);
  t.record(1, 0);
  plain = 0;
  while (t.plan(costs) == 0) ++plain;
  EXPECT_EQ(plain, 32);  // the interval doubled
  // Probes that land raise the request's acceptance; one draft still does not pay here (1.85
  // tokens for 2 steps), but with acceptance above 1/2 the unmeasured width 2 is tried at once
  // instead of waiting.
  SpecTracker lucky(5);
  EXPECT_EQ(lucky.plan(costs), 1);
  for (int i = 0; i < 6; ++i) lucky.record(1, 1);
  EXPECT_GT(lucky.acceptance(), 0.8);
  EXPECT_EQ(lucky.plan(costs), 2);
  // A drafter that is always right, on a model whose extra rows cost little: the whole block.
  SpecCosts cheap;
  cheap.observe_plain(1.0);
  cheap.observe_spec(1, 1.1);
  cheap.observe_spec(5, 1.5);
  SpecTracker good(5);
  // The prior 1/2 with these costs: 1 + 1/2 + 1/4 tokens for 1.2 steps' time (width 2) is best.
  EXPECT_EQ(good.plan(cheap), 2);
  for (int i = 0; i < 10; ++i) good.record(5, 5);
  EXPECT_GT(good.acceptance(), 0.9);
  EXPECT_EQ(good.plan(cheap), 5);
  // Each draft accepted half the time: width 2 again (1.75 / 1.2 beats 1.97 / 1.5 for 5).
  SpecTracker half(5);
  for (int i = 0; i < 30; ++i) half.record(3, 1);
  EXPECT_NEAR(half.acceptance(), 0.5, 0.01);
  EXPECT_EQ(half.plan(cheap), 2);
}

// probe() marks exactly the widths planned to learn the acceptance (drafting does not pay at the
// estimate), which the engine may run as shadows; widths that pay or explore are not probes.
TEST(Tracker, ProbesAreMarked) {
  SpecCosts costs;
  costs.observe_plain(1.0);
  costs.observe_spec(1, 2.0);
  SpecTracker t(5);
  EXPECT_EQ(t.plan(costs), 1);  // the first probe of a request with an even prior
  EXPECT_TRUE(t.probe());
  t.record(3, 0);  // a shadow probe's whole chain compared: the first draft missed
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(t.plan(costs), 0);
    EXPECT_FALSE(t.probe());
  }
  EXPECT_EQ(t.plan(costs), 1);
  EXPECT_TRUE(t.probe());
  SpecTracker pays(5);
  for (int i = 0; i < 10; ++i) pays.record(2, 2);
  EXPECT_GT(pays.plan(costs), 0);  // drafting pays, or a wider width is explored: not a probe
  EXPECT_FALSE(pays.probe());
}

TEST(Tracker, WiderWidthsAreTriedWhileDraftsLand) {
  SpecCosts costs;
  costs.observe_plain(1.0);
  costs.observe_spec(1, 1.6);  // extrapolated: width 2 would cost 2.2, width 3 2.8
  SpecTracker t(5);
  for (int i = 0; i < 10; ++i) t.record(1, 1);  // every draft accepted
  // The best by the extrapolated costs is width 2; width 3, unmeasured, is tried first.
  EXPECT_EQ(t.plan(costs), 3);
  costs.observe_spec(3, 2.0);  // cheaper than extrapolated (2.8): rows share experts
  const int64_t next = t.plan(costs);
  EXPECT_GE(next, 4);  // the measured width 3 makes wider ones look better, and 4 is unmeasured
  costs.observe_spec(2, 1.8);
  costs.observe_spec(4, 2.3);
  costs.observe_spec(5, 2.6);
  EXPECT_EQ(t.plan(costs), 5);  // a ~ 0.9: 1 + a + ... + a^5 = 4.5 tokens for 2.6 steps
  // One draft costing more than it returns does not stop a drafter that lands from trying two.
  SpecCosts dear;
  dear.observe_plain(1.0);
  dear.observe_spec(1, 2.0);
  SpecTracker lands(5);
  for (int i = 0; i < 10; ++i) lands.record(1, 1);
  EXPECT_EQ(lands.plan(dear), 2);
  dear.observe_spec(2, 2.1);  // 1 + a + a^2 = 2.65 tokens for 2.1 steps: drafting pays
  EXPECT_GE(lands.plan(dear), 2);
  // Drafts that mostly miss explore nothing.
  SpecTracker miss(5);
  for (int i = 0; i < 10; ++i) miss.record(1, 0);
  EXPECT_EQ(miss.plan(costs), 0);
}

TEST(Tracker, NewRequestsStartFromTheEnginesAcceptanceAndAFixedWidthIsKept) {
  SpecCosts costs;
  costs.observe_plain(1.0);
  costs.observe_spec(1, 1.3);
  SpecPrior prior;
  EXPECT_EQ(prior.counts(), std::make_pair(1.0, 1.0));
  SpecTracker fresh(5, prior.counts());
  EXPECT_EQ(fresh.plan(costs), 1);                   // 1.5 tokens for 1.3 steps: worth a draft
  for (int i = 0; i < 50; ++i) prior.observe(3, 0);  // the drafter always misses
  EXPECT_NEAR(prior.counts().first, 0.0, 1e-12);
  SpecTracker warned(5, prior.counts());
  EXPECT_EQ(warned.plan(costs), 0);  // it does not pay to learn that again
  EXPECT_FALSE(warned.drafting());
  SpecTracker fixed(5, prior.counts(), 3);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(fixed.plan(costs), 3);
    fixed.record(3, 0);
  }
}

// Every row's logits are kSpecLogits over a vocabulary of 8 (padded to the tokenizer's size with
// -inf), whatever the context; the drafter proposes `draft` every time. Generated tokens are then
// independent draws of softmax(kSpecLogits) when the verifier is right.
class FixedBackend final : public ModelRunner {
 public:
  FixedBackend(int32_t vocab, int32_t draft) : vocab_(vocab), draft_(draft) {}
  int32_t vocab_size() const override { return vocab_; }
  int64_t hidden_size() const override { return 1; }
  int64_t max_context() const override { return 1 << 20; }
  Status open(SeqId s) override {
    len_[s] = 0;
    return Status::ok();
  }
  void free(SeqId s) override { len_.erase(s); }
  Status truncate(SeqId s, int64_t n) override {
    if (!len_.count(s) || n > len_[s]) return Status::error("bad truncate");
    len_[s] = n;
    ++truncates;
    return Status::ok();
  }
  int64_t length(SeqId s) const override { return len_.count(s) ? len_.at(s) : -1; }
  Status step(const StepBatch& b, StepOutput* out) override {
    DSV41_RETURN_IF_ERROR(
        check_step_batch(b, vocab_, max_context(), [&](SeqId id) { return length(id); }));
    out->slices.assign(b.slices.size(), {});
    for (std::size_t i = 0; i < b.slices.size(); ++i) {
      for (std::size_t r = 0; r < b.slices[i].logits_rows.size(); ++r) {
        std::vector<float> row(std::size_t(vocab_), -std::numeric_limits<float>::infinity());
        std::copy(kSpecLogits.begin(), kSpecLogits.end(), row.begin());
        out->slices[i].logits.insert(out->slices[i].logits.end(), row.begin(), row.end());
      }
      len_[b.slices[i].seq] += int64_t(b.slices[i].tokens.size());
    }
    return Status::ok();
  }
  int64_t draft_block_size() const override { return 3; }
  Status draft(const std::vector<DraftQuery>& q, std::vector<DraftResult>* out) override {
    out->assign(q.size(), {});
    for (std::size_t i = 0; i < q.size(); ++i) {
      if (length(q[i].seq) < 1) return Status::error("draft before any token");
      (*out)[i].ids = {q[i].next, draft_, draft_, draft_};
      (*out)[i].logits.assign(std::size_t(3 * vocab_), 0.0f);
      (*out)[i].confidence.assign(3, 0.0f);
    }
    ++drafts;
    return Status::ok();
  }
  int truncates = 0, drafts = 0;

 private:
  int32_t vocab_, draft_;
  std::map<SeqId, int64_t> len_;
};

std::unique_ptr<Tokenizer> spec_tiny_tokenizer() {
  auto t = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
  EXPECT_TRUE(t.is_ok());
  return std::move(*t);
}

std::vector<int32_t> run(Engine& e, GenerationRequest r) {
  auto h = e.submit(std::move(r));
  EXPECT_TRUE(h.is_ok()) << h.status().message();
  std::vector<int32_t> toks;
  for (int guard = 0; guard < 100000; ++guard) {
    RequestOutput o;
    if (!h->next(o, 20s)) {
      ADD_FAILURE() << "no output within 20 s";
      break;
    }
    for (const auto& t : o.tokens) toks.push_back(t.token);
    if (o.finished) break;
  }
  return toks;
}

TEST(Engine, SpeculativeSampledTokensKeepTheTargetDistribution) {
  for (int32_t draft : {0, 4}) {  // a draft the target likes, one it rarely takes
    auto tok = spec_tiny_tokenizer();
    auto b = std::make_unique<FixedBackend>(tok->vocab_size(), draft);
    FixedBackend* backend = b.get();
    EngineOptions opt;
    opt.speculative = true;
    // Probes verify here: the subject is the verifier's output distribution, and with shadow
    // probes a draft the target rarely takes is seldom verified at all (its probes are shadows).
    opt.speculative_shadow_probes = false;
    auto e = Engine::create(std::move(b), std::move(tok), opt);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    std::vector<int> h(kSpecLogits.size(), 0);
    int n = 0;
    for (int r = 0; r < 40; ++r) {
      GenerationRequest q;
      q.prompt = {5};
      q.sampling.temperature = 1.0;
      q.sampling.max_tokens = 250;
      q.sampling.ignore_eos = true;
      q.sampling.seed = uint64_t(1000 * draft + r);
      for (int32_t t : run(**e, q)) {
        ASSERT_LT(t, int32_t(kSpecLogits.size()));
        ++h[std::size_t(t)];
        ++n;
      }
    }
    ASSERT_EQ(n, 40 * 250);
    EXPECT_LT(chi_square(h, softmax(kSpecLogits), n), kSpecChi7) << "draft " << draft;
    const EngineStats s = (*e)->stats();
    EXPECT_GT(s.spec_steps, 0);
    EXPECT_GT(s.spec_accepted_tokens, 0);
    EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);  // rejections happened too
    EXPECT_GT(backend->truncates, 0);
  }
}

TEST(Engine, SpeculativeNeedsADrafter) {
  testing::TempDir dir;
  EngineOptions opt;
  opt.model_dir = testing::make_tiny_converted(dir, 3);
  opt.fast.kv_cache_gb = 0.05;
  opt.speculative = true;
  auto with = Engine::load(opt);
  ASSERT_TRUE(with.is_ok()) << with.status().message();
  // A backend without a drafter is refused when speculation is asked for.
  auto tok = spec_tiny_tokenizer();
  class NoDrafter final : public ModelRunner {
   public:
    int32_t vocab_size() const override { return 8; }
    int64_t hidden_size() const override { return 1; }
    int64_t max_context() const override { return 64; }
    Status open(SeqId) override { return Status::ok(); }
    void free(SeqId) override {}
    Status truncate(SeqId, int64_t) override { return Status::ok(); }
    int64_t length(SeqId) const override { return 0; }
    Status step(const StepBatch&, StepOutput*) override { return Status::ok(); }
  };
  auto e = Engine::create(std::make_unique<NoDrafter>(), std::move(tok), opt);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("--speculative"), std::string::npos) << e.status().message();
}

// Greedy requests with speculation on give the tokens and logprobs of plain decoding (the verify
// rows are bit for bit the rows a decode step would give), alone and four at a time.
TEST(Engine, SpeculativeGreedyEqualsPlainOnTheFastPath) {
  testing::TempDir dir;
  const std::string conv = testing::make_tiny_converted(dir, 3);
  auto make = [&](bool spec) {
    EngineOptions opt;
    opt.model_dir = conv;
    opt.fast.kv_cache_gb = 0.05;
    opt.speculative = spec;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return std::move(*e);
  };
  auto plain = make(false), spec = make(true);
  Rng rng(3);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 6 + 5 * i; ++k) r.prompt.push_back(int32_t(3 + rng.below(900)));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 20;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 0;
    reqs.push_back(r);
  }
  auto produce = [](Engine& e, const GenerationRequest& r) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.is_ok());
    std::vector<std::pair<int32_t, float>> out;
    for (int guard = 0; guard < 10000; ++guard) {
      RequestOutput o;
      if (!h->next(o, 30s)) break;
      for (const auto& t : o.tokens) out.emplace_back(t.token, t.logprob);
      if (o.finished) break;
    }
    return out;
  };
  std::vector<std::vector<std::pair<int32_t, float>>> want;
  for (const auto& r : reqs) want.push_back(produce(*plain, r));
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(produce(*spec, reqs[i]), want[i]) << "request " << i << " alone";
  std::vector<RequestHandle> hs;
  std::vector<std::vector<std::pair<int32_t, float>>> got(reqs.size());
  std::vector<std::thread> th;
  for (std::size_t i = 0; i < reqs.size(); ++i)
    th.emplace_back([&, i] { got[i] = produce(*spec, reqs[i]); });
  for (auto& t : th) t.join();
  for (std::size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i], want[i]) << "request " << i << " among others";
  const EngineStats s = spec->stats();
  std::printf("fast path, greedy: %lld verify steps, %lld drafts, %lld accepted\n",
              (long long)s.spec_steps, (long long)s.spec_draft_tokens,
              (long long)s.spec_accepted_tokens);
  EXPECT_GT(s.spec_steps, 0);
  EXPECT_GT(s.spec_draft_tokens, 0);
  EXPECT_EQ(s.kv_foreign_reads, 0);
  for (int i = 0; i < 200 && spec->stats().kv_blocks_used > 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(spec->stats().kv_blocks_used, 0);
}

// The fast model with a drafter that knows the answer (model/oracle_drafter.h): its drafts are a
// plain run's own tokens, those of every fifth position made wrong, so verify steps accept 0 .. B
// drafts and roll back at every depth. The tokens, logprobs and finish must still be those of the
// plain run: greedy, seeded sampling with penalties (the verifier draws as plain decoding does,
// one uniform per token in order), and a stop token met inside an accepted chain.
class OracleRuns : public ::testing::Test {
 protected:
  struct Out {
    std::vector<std::pair<int32_t, float>> tokens;
    FinishReason reason = FinishReason::kNone;
    bool operator==(const Out&) const = default;
  };
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    conv_ = new std::string(testing::make_tiny_converted(*dir_, 3));
  }
  static void TearDownTestSuite() {
    delete conv_;
    delete dir_;
  }
  static EngineOptions options() {
    EngineOptions opt;
    opt.model_dir = *conv_;
    opt.fast.kv_cache_gb = 0.05;
    return opt;
  }
  static Out produce(Engine& e, const GenerationRequest& r) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().message();
    Out out;
    for (RequestOutput o; h->next(o, 30s);) {
      for (const auto& t : o.tokens) out.tokens.emplace_back(t.token, t.logprob);
      if (o.finished) {
        out.reason = o.reason;
        break;
      }
    }
    return out;
  }
  // The plain runs of `reqs`, one at a time: their outputs and each request's whole stream (the
  // prompt, then the tokens).
  static void plain_runs(const std::vector<GenerationRequest>& reqs, std::vector<Out>& want,
                         std::vector<std::vector<int32_t>>& streams) {
    auto plain = Engine::load(options());
    ASSERT_TRUE(plain.is_ok()) << plain.status().message();
    for (const auto& r : reqs) {
      want.push_back(produce(**plain, r));
      streams.push_back(r.prompt);
      for (const auto& [t, lp] : want.back().tokens) streams.back().push_back(t);
    }
  }
  // A speculative engine with options `so` whose drafter knows `streams` (every fifth position
  // wrong); `oracle` and `block` (the drafter's block size, capped at the widest verify) are
  // set when given.
  static std::unique_ptr<Engine> oracle_engine(const std::vector<std::vector<int32_t>>& streams,
                                               EngineOptions so, OracleDrafter** oracle = nullptr,
                                               int64_t* block = nullptr) {
    FastOptions fo;
    fo.kv_cache_bytes = 50'000'000;
    fo.dspark = true;
    auto fast = FastModel::load(*conv_, fo);
    EXPECT_TRUE(fast.is_ok());
    if (!fast.is_ok()) return nullptr;
    if (block) *block = std::min<int64_t>((*fast)->draft_block_size(), SpecCosts::kMaxWidth);
    auto backend = std::make_unique<OracleDrafter>(std::move(*fast), streams,
                                                   [](std::size_t at) { return at % 5 == 0; });
    if (oracle) *oracle = backend.get();
    auto tok = Tokenizer::load(*conv_ + "/tokenizer.json");
    EXPECT_TRUE(tok.is_ok());
    if (!tok.is_ok()) return nullptr;
    so.speculative = true;
    auto spec = Engine::create(std::move(backend), std::move(*tok), so);
    EXPECT_TRUE(spec.is_ok()) << spec.status().message();
    return spec.is_ok() ? std::move(*spec) : nullptr;
  }
  // The plain runs of `reqs` (one at a time), then the same through a speculative engine whose
  // drafter knows them, all at once; returns the speculative engine's stats.
  static EngineStats compare(const std::vector<GenerationRequest>& reqs) {
    std::vector<Out> want;
    std::vector<std::vector<int32_t>> streams;
    plain_runs(reqs, want, streams);
    OracleDrafter* oracle = nullptr;
    auto spec = oracle_engine(streams, options(), &oracle);
    if (!spec || want.size() != reqs.size()) return {};
    std::vector<Out> got(reqs.size());
    std::vector<std::thread> th;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      th.emplace_back([&, i] { got[i] = produce(*spec, reqs[i]); });
    for (auto& t : th) t.join();
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
    EXPECT_GT(oracle->known_drafts, 0);
    const EngineStats s = spec->stats();
    EXPECT_EQ(s.kv_foreign_reads, 0);
    return s;
  }
  static std::vector<GenerationRequest> requests(double temperature) {
    Rng rng(9);
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r;
      for (int k = 0; k < 5 + 7 * i; ++k) r.prompt.push_back(int32_t(3 + rng.below(900)));
      r.sampling.temperature = temperature;
      r.sampling.max_tokens = 24;
      r.sampling.ignore_eos = true;
      r.sampling.logprobs = 0;
      r.sampling.seed = uint64_t(40 + i);
      reqs.push_back(r);
    }
    return reqs;
  }
  static testing::TempDir* dir_;
  static std::string* conv_;
};
testing::TempDir* OracleRuns::dir_ = nullptr;
std::string* OracleRuns::conv_ = nullptr;

TEST_F(OracleRuns, GreedyTokensAreThoseOfPlainDecoding) {
  const EngineStats s = compare(requests(0));
  std::printf("oracle drafts, greedy: %lld verify steps, %lld drafts, %lld accepted\n",
              (long long)s.spec_steps, (long long)s.spec_draft_tokens,
              (long long)s.spec_accepted_tokens);
  EXPECT_GT(s.spec_accepted_tokens, s.spec_steps);         // more than one token per verify step
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);  // and rejections at several depths
}

TEST_F(OracleRuns, SeededSamplingWithPenaltiesGivesThePlainTokens) {
  auto reqs = requests(0.9);
  for (auto& r : reqs) {
    r.sampling.top_p = 0.9;
    r.sampling.presence_penalty = 0.5;
    r.sampling.frequency_penalty = 0.3;
  }
  const EngineStats s = compare(reqs);
  EXPECT_GT(s.spec_accepted_tokens, 0);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
}

// vLLM's repetition_penalty and the reasoning cap are part of the processing a verify step applies
// to every row (penalties are where speculation silently drops them elsewhere): greedy and seeded
// output equal the plain runs'. A bias makes token 500 the argmax everywhere, so without the
// penalty greedy repeats it and with it the token comes once (the penalty is applied at all);
// the cap puts </think> at the budget's place.
TEST_F(OracleRuns, RepetitionPenaltyAndReasoningBudgetGiveThePlainTokens) {
  auto tok = Tokenizer::load(*conv_ + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok());
  const int32_t think_end = (*tok)->token_id("</think>");
  ASSERT_GE(think_end, 0);
  for (double temperature : {0.0, 0.9}) {
    auto reqs = requests(temperature);
    reqs[0].sampling.logit_bias = {{500, 30.f}};
    auto plain = Engine::load(options());
    ASSERT_TRUE(plain.is_ok());
    const Out unpenalised = produce(**plain, reqs[0]);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].sampling.repetition_penalty = i == 0 ? 100.0 : 1.3;
      if (i == 1) reqs[i].sampling.thinking_token_budget = 6;
    }
    const Out penalised = produce(**plain, reqs[0]);
    auto count = [](const Out& o) {
      return std::count_if(o.tokens.begin(), o.tokens.end(),
                           [](const auto& t) { return t.first == 500; });
    };
    if (temperature == 0) EXPECT_EQ(count(unpenalised), 24);
    EXPECT_EQ(count(penalised), 1);
    const Out capped = produce(**plain, reqs[1]);
    ASSERT_GE(capped.tokens.size(), 6u);
    EXPECT_EQ(capped.tokens[5].first, think_end);
    const EngineStats s = compare(reqs);
    EXPECT_GT(s.spec_accepted_tokens, 0);
  }
}

TEST_F(OracleRuns, AStopTokenInsideAnAcceptedChainEndsThere) {
  auto reqs = requests(0);
  // Each request stops at the token its free run gives 10th.
  auto plain = Engine::load(options());
  ASSERT_TRUE(plain.is_ok());
  for (auto& r : reqs) {
    const Out free = produce(**plain, r);
    ASSERT_GE(free.tokens.size(), 12u);
    r.sampling.stop_token_ids = {free.tokens[9].first};
  }
  compare(reqs);
}

// Shadow drafting (every decision a shadow, EngineOptions::speculative_shadow_only): nothing is
// verified, the tokens are the plain run's, and each chain's recorded outcome is what a verify
// step of it would have recorded: the drafts matching the tokens that followed, and the first
// mismatch. With the oracle's chains (the plain stream, positions divisible by 5 wrong) that is
// computable here: a chain drafted while feeding position q predicts q + 1 .. q + B and matches up
// to the next multiple of 5; the next chain is drafted at the step after the last one resolved.
TEST_F(OracleRuns, ShadowChainsRecordWhatAVerifyWould) {
  const auto reqs = requests(0);
  std::vector<Out> want;
  std::vector<std::vector<int32_t>> streams;
  plain_runs(reqs, want, streams);
  ASSERT_EQ(want.size(), reqs.size());
  EngineOptions so = options();
  so.speculative_shadow_only = true;
  int64_t B = 0;
  auto spec = oracle_engine(streams, so, nullptr, &B);
  ASSERT_TRUE(spec);
  int64_t probes = 0, examined = 0, accepted = 0;  // the simulation's
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(produce(*spec, reqs[i]), want[i]) << "request " << i;
    const int64_t P = int64_t(reqs[i].prompt.size()), N = reqs[i].sampling.max_tokens;
    int64_t matched = -1, len = 0;                  // -1: no chain pending
    for (int64_t q = P; q + 1 <= P + N - 1; ++q) {  // a decode step feeds q and emits q + 1
      if (matched < 0) {
        // A chain has at most as many drafts as a verify step could check: the tokens left
        // after this step's (none at the last step).
        len = std::min<int64_t>(B, P + N - q - 2);
        if (len <= 0) continue;
        matched = 0, ++probes;
      }
      if ((q + 1) % 5 != 0) {
        if (++matched == len) examined += len, accepted += len, matched = -1;
      } else {
        examined += matched + 1, accepted += matched, matched = -1;
      }
    }
    if (matched > 0) examined += matched, accepted += matched;  // cut off by the request's end
  }
  // The last request's cut-off chain is recorded when the engine drops it, after its output.
  for (int i = 0; i < 200; ++i) {
    const EngineStats now = spec->stats();
    if (now.spec_shadow_draft_tokens == examined && now.spec_shadow_accepted_tokens == accepted)
      break;
    std::this_thread::sleep_for(10ms);
  }
  const EngineStats s = spec->stats();
  std::printf("shadow chains: %lld, %lld drafts compared, %lld matched (B = %lld)\n",
              (long long)s.spec_shadow_probes, (long long)s.spec_shadow_draft_tokens,
              (long long)s.spec_shadow_accepted_tokens, (long long)B);
  EXPECT_EQ(s.spec_steps, 0);  // nothing verified
  EXPECT_EQ(s.spec_draft_tokens, 0);
  EXPECT_EQ(s.spec_shadow_probes, probes);
  EXPECT_EQ(s.spec_shadow_draft_tokens, examined);
  EXPECT_EQ(s.spec_shadow_accepted_tokens, accepted);
  EXPECT_GT(s.spec_shadow_accepted_tokens, s.spec_shadow_draft_tokens / 2);  // mostly matching
  EXPECT_LT(s.spec_shadow_accepted_tokens, s.spec_shadow_draft_tokens);      // and missing
}

// The reference path drafts through ReferenceRunner::draft (its model holding the drafter) and
// rolls back by replay: greedy tokens as without speculation.
TEST(Engine, SpeculativeOnTheReferencePathGivesThePlainTokens) {
  testing::TempDir dir;
  MakeTinyOptions mt;
  mt.out_dir = dir.path() + "/ck";
  mt.seed = 5;
  ASSERT_TRUE(make_tiny_checkpoint(mt).is_ok());
  auto run_with = [&](bool spec) {
    EngineOptions opt;
    opt.model_dir = mt.out_dir;
    opt.path = "reference";
    opt.speculative = spec;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    GenerationRequest r;
    r.prompt = {11, 305, 27, 640, 9, 88};
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 10;
    r.sampling.ignore_eos = true;
    auto h = (*e)->submit(r);
    EXPECT_TRUE(h.is_ok());
    std::vector<int32_t> toks;
    for (RequestOutput o; h->next(o, 60s);) {
      for (const auto& t : o.tokens) toks.push_back(t.token);
      if (o.finished) break;
    }
    if (spec) EXPECT_GT((*e)->stats().spec_steps, 0);
    return toks;
  };
  const auto plain = run_with(false);
  ASSERT_EQ(plain.size(), 10u);
  EXPECT_EQ(run_with(true), plain);
}

}  // namespace
}  // namespace dsv41
