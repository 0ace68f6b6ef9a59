// Engine: request lifecycle over a scripted backend (exact token chains), stop tokens and strings,
// length and context limits, cancellation, FIFO order, seeded requests independent of what ran
// before them, submission errors; and the reference backend on a tiny checkpoint, whose greedy
// output must be the argmax chain of the reference's own teacher-forced logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/scripted_runner.h"
#include "io/test_util.h"
#include "model/fast/fast_model.h"
#include "model/reference/reference_model.h"
#include "model/tiny_converted.h"
#include "text/tokenizer_file.h"

namespace dsv41 {
namespace {

using namespace std::chrono_literals;

// Next-token logits depend only on the last token: a peak of `peak` at next_of(last) over a gentle
// slope, so greedy decoding follows a known chain and sampling has a known distribution.
class ChainBackend final : public testing::ScriptedRunner {
 public:
  ChainBackend(int32_t vocab, int64_t ctx, std::map<int32_t, int32_t> next, int sleep_ms = 0)
      : vocab_(vocab), ctx_(ctx), next_(std::move(next)), sleep_ms_(sleep_ms) {}
  int32_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return ctx_; }
  void on_step() override {
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
  }
  Status forward(SeqId, int64_t first_pos, const std::vector<int32_t>& tokens,
                 std::vector<float>& logits) override {
    const int64_t pos = first_pos + static_cast<int64_t>(tokens.size());
    if (pos > ctx_) return Status::error("context exceeded");
    const int32_t last = tokens.back();
    auto it = next_.find(last);
    int32_t nxt = it != next_.end() ? it->second : (last * 7 + 3) % vocab_;
    // A script, when set, fixes the token after position p (a one-token prompt starts it).
    if (pos >= 1 && static_cast<std::size_t>(pos - 1) < script.size())
      nxt = script[static_cast<std::size_t>(pos - 1)];
    logits.assign(static_cast<std::size_t>(vocab_), 0.f);
    for (int32_t i = 0; i < vocab_; ++i)
      logits[static_cast<std::size_t>(i)] = -0.001f * static_cast<float>(i % 13);
    logits[static_cast<std::size_t>(nxt)] = 12.f;
    ++calls;
    return Status::ok();
  }
  int calls = 0;
  std::vector<int32_t> script;

 private:
  int32_t vocab_;
  int64_t ctx_;
  std::map<int32_t, int32_t> next_;
  int sleep_ms_;
};

std::unique_ptr<Tokenizer> tiny_tokenizer() {
  auto t = Tokenizer::from_json(make_tiny_tokenizer().tokenizer_json, "tiny");
  EXPECT_TRUE(t.is_ok());
  return std::move(*t);
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  RequestOutput last;
  int outputs = 0;
};

Collected collect(RequestHandle h, std::chrono::seconds wait = 5s) {
  Collected c;
  for (int guard = 0; guard < 100000; ++guard) {
    RequestOutput o;
    if (!h.next(o, wait)) {
      ADD_FAILURE() << "no output within " << wait.count() << " s";
      break;
    }
    ++c.outputs;
    for (const auto& t : o.tokens) {
      c.tokens.push_back(t.token);
      c.logprobs.push_back(t.logprob);
    }
    c.text += o.text;
    if (o.finished) {
      c.last = std::move(o);
      break;
    }
  }
  return c;
}

// The engine's gauges once its thread has taken in the last step's results (a consumer can see a
// request finish before the loop updates them).
EngineStats settled(const Engine& e) {
  for (int i = 0; i < 200; ++i) {
    const EngineStats s = e.stats();
    if (s.running == 0 && s.queued == 0 && s.kv_blocks_used == 0) return s;
    std::this_thread::sleep_for(10ms);
  }
  return e.stats();
}

std::unique_ptr<Engine> chain_engine(std::map<int32_t, int32_t> next = {}, int64_t ctx = 4096,
                                     int sleep_ms = 0, EngineOptions opt = {},
                                     ChainBackend** backend = nullptr) {
  auto tok = tiny_tokenizer();
  int32_t vocab = tok->vocab_size();
  auto b = std::make_unique<ChainBackend>(vocab, ctx, std::move(next), sleep_ms);
  if (backend) *backend = b.get();
  auto e = Engine::create(std::move(b), std::move(tok), opt);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return std::move(*e);
}

TEST(Engine, GreedyFollowsTheChainAndStopsAtLength) {
  auto e = chain_engine();
  GenerationRequest r;
  r.prompt = {5, 6};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 7;
  r.sampling.ignore_eos = true;
  Collected c = collect(*e->submit(r));
  std::vector<int32_t> expected;
  int32_t last = 6;
  for (int i = 0; i < 7; ++i) expected.push_back(last = (last * 7 + 3) % e->vocab_size());
  EXPECT_EQ(c.tokens, expected);
  EXPECT_EQ(c.last.reason, FinishReason::kLength);
  EXPECT_EQ(c.last.prompt_tokens, 2);
  EXPECT_EQ(c.last.completion_tokens, 7);
  EXPECT_EQ(c.text, *e->tokenizer().decode(expected, true));
}

TEST(Engine, StopTokenEndsWithoutItsText) {
  auto tok = tiny_tokenizer();
  const int32_t eos = tok->token_id("<｜end▁of▁sentence｜>");
  auto e = chain_engine({{10, 11}, {11, eos}});
  GenerationRequest r;
  r.prompt = {10};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 50;
  r.sampling.logprobs = 2;
  Collected c = collect(*e->submit(r));
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{11, eos}));
  EXPECT_EQ(c.last.reason, FinishReason::kStop);
  EXPECT_EQ(c.text, *e->tokenizer().decode({11}, true));
  // stop_token_ids stop too.
  r.sampling.stop_token_ids = {11};
  Collected d = collect(*e->submit(r));
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{11}));
  EXPECT_EQ(d.last.reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "");
}

TEST(Engine, StopStringCutsTextAcrossTokens) {
  auto tok = tiny_tokenizer();
  auto ids = tok->encode(" the cat and a dog");
  ASSERT_GE(ids.size(), 4u);
  const int32_t start = 3;
  auto backend =
      std::make_unique<ChainBackend>(tok->vocab_size(), 4096, std::map<int32_t, int32_t>{});
  backend->script = ids;
  auto made = Engine::create(std::move(backend), std::move(tok), EngineOptions{});
  ASSERT_TRUE(made.is_ok());
  auto& e = *made;
  GenerationRequest r;
  r.prompt = {start};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = static_cast<int>(ids.size()) + 5;
  r.sampling.stop = {"and a d"};
  Collected c = collect(*e->submit(r));
  EXPECT_EQ(c.text, " the cat ");
  EXPECT_EQ(c.last.reason, FinishReason::kStop);
  EXPECT_EQ(c.last.stop, "and a d");
}

TEST(Engine, LogprobsAccompanyTokens) {
  auto e = chain_engine();
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 3;
  r.sampling.logprobs = 3;
  auto h = *e->submit(r);
  RequestOutput all;
  for (;;) {
    RequestOutput o;
    ASSERT_TRUE(h.next(o, 5s));
    for (auto& t : o.tokens) all.tokens.push_back(t);
    if (o.finished) break;
  }
  ASSERT_EQ(all.tokens.size(), 3u);
  for (const auto& t : all.tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].token, t.token);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
    EXPECT_LT(t.logprob, 0.f);
    EXPECT_GT(t.logprob, -0.1f);  // the peak holds almost all the mass
  }
}

TEST(Engine, CancelStopsPromptlyAndQueuedRequestsRunInOrder) {
  EngineOptions opt;
  opt.max_num_seqs = 1;  // one running sequence: the second request waits in the queue
  auto e = chain_engine({}, 100000, /*sleep_ms=*/5, opt);
  GenerationRequest slow;
  slow.prompt = {1};
  slow.sampling.max_tokens = 100000;
  slow.sampling.ignore_eos = true;
  auto h = *e->submit(slow);
  GenerationRequest quick;
  quick.prompt = {2};
  quick.sampling.max_tokens = 2;
  quick.sampling.ignore_eos = true;
  auto q = *e->submit(quick);
  RequestOutput o;
  ASSERT_TRUE(h.next(o, 5s));
  EXPECT_FALSE(o.finished);
  // The quick request waits behind the slow one.
  RequestOutput qo;
  EXPECT_FALSE(q.next(qo, 50ms));
  EXPECT_EQ(e->stats().queued, 1);
  h.cancel();
  Collected c = collect(h);
  EXPECT_EQ(c.last.reason, FinishReason::kCancelled);
  Collected d = collect(q);
  EXPECT_EQ(d.last.reason, FinishReason::kLength);
  EXPECT_EQ(d.tokens.size(), 2u);
}

// Continuous batching: concurrent requests run in the same steps (8 requests of 10 tokens take
// about 10 steps, not 80), each still gets its own chain, and prompts longer than the token budget
// go in chunks while the others decode.
TEST(Engine, ConcurrentRequestsShareSteps) {
  ChainBackend* backend = nullptr;
  EngineOptions opt;
  opt.max_num_batched_tokens = 16;
  auto e = chain_engine({}, 4096, /*sleep_ms=*/5, opt, &backend);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.prompt.assign(std::size_t(1 + 6 * i), int32_t(10 + i));  // up to 43 tokens: chunked
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 10;
    r.sampling.ignore_eos = true;
    hs.push_back(*e->submit(r));
  }
  for (int i = 0; i < 8; ++i) {
    Collected c = collect(hs[std::size_t(i)]);
    ASSERT_EQ(c.tokens.size(), 10u);
    int32_t t = int32_t(10 + i);
    for (int32_t got : c.tokens) {  // the chain of the last token: t -> 7t + 3
      t = (t * 7 + 3) % e->vocab_size();
      EXPECT_EQ(got, t);
    }
    EXPECT_EQ(c.last.prompt_tokens, 1 + 6 * i);
  }
  EXPECT_LE(backend->steps, 40);  // one at a time: > 80
  EXPECT_GE(backend->max_batch, 4u);
  const EngineStats st = settled(*e);  // the engine frees a sequence after its last output
  EXPECT_EQ(backend->open_sequences(), 0);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.steps_total, backend->steps);
}

TEST(Engine, SeededSamplingIndependentOfOtherRequests) {
  auto e = chain_engine();
  GenerationRequest r;
  r.prompt = {4, 9};
  r.sampling.temperature = 5.0;  // flat enough that many tokens are likely
  r.sampling.seed = 1234;
  r.sampling.max_tokens = 20;
  r.sampling.ignore_eos = true;
  Collected first = collect(*e->submit(r));
  GenerationRequest other = r;
  other.sampling.seed.reset();
  for (int i = 0; i < 3; ++i) collect(*e->submit(other));
  Collected again = collect(*e->submit(r));
  EXPECT_EQ(first.tokens, again.tokens);
  r.sampling.seed = 99;
  EXPECT_NE(collect(*e->submit(r)).tokens, first.tokens);
}

TEST(Engine, ContextLimitEndsWithLength) {
  EngineOptions opt;
  opt.max_context = 10;
  auto e = chain_engine({}, 4096, 0, opt);
  EXPECT_EQ(e->max_context(), 10);
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5, 6};
  r.sampling.max_tokens = 100;
  r.sampling.ignore_eos = true;
  Collected c = collect(*e->submit(r));
  EXPECT_EQ(c.tokens.size(), 4u);
  EXPECT_EQ(c.last.reason, FinishReason::kLength);
}

TEST(Engine, SubmissionErrorsNameTheParameter) {
  EngineOptions opt;
  opt.max_context = 8;
  opt.max_queue = 1;
  opt.max_num_seqs = 1;
  auto e = chain_engine({}, 4096, 50, opt);
  GenerationRequest r;
  EXPECT_EQ(e->submit(r).status().message().rfind("prompt", 0), 0u);
  r.prompt = {1, e->vocab_size()};
  EXPECT_NE(e->submit(r).status().message().find("position 1"), std::string::npos);
  r.prompt.assign(8, 1);
  EXPECT_NE(e->submit(r).status().message().find("context limit of 8"), std::string::npos);
  r.prompt = {1};
  r.sampling.top_p = 2;
  EXPECT_EQ(e->submit(r).status().message().rfind("top_p", 0), 0u);
  r.sampling.top_p = 1;
  r.sampling.max_tokens = 1000;
  r.sampling.ignore_eos = true;
  auto a = e->submit(r);  // runs
  ASSERT_TRUE(a.is_ok());
  RequestOutput o;
  ASSERT_TRUE(a->next(o, 5s));  // a is running now, the queue is empty
  auto b = e->submit(r);        // waits
  ASSERT_TRUE(b.is_ok());
  auto c = e->submit(r);  // queue full
  EXPECT_NE(c.status().message().find("queue full"), std::string::npos);
  a->cancel();
  b->cancel();
}

// What the backends' greedy tests generate: 12 greedy tokens after a short prompt, whatever the
// random weights say (no end at an EOS).
GenerationRequest greedy_twelve_tokens(const Engine& e) {
  GenerationRequest r;
  r.prompt = e.tokenizer().encode("hello world, the");
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 12;
  r.sampling.ignore_eos = true;
  return r;
}

TEST(Engine, ReferenceBackendGreedyMatchesTeacherForcedArgmax) {
  testing::TempDir dir;
  const std::string ck = dir.path() + "/ck";
  ASSERT_TRUE(testing::make_tiny_official(ck).is_ok());
  EngineOptions opt;
  opt.model_dir = ck;
  opt.path = "reference";
  auto e = Engine::load(opt);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const GenerationRequest r = greedy_twelve_tokens(**e);
  Collected c = collect(*(*e)->submit(r));
  ASSERT_EQ(c.tokens.size(), 12u);
  // Teacher-force prompt + output through the reference and take the argmax of each row.
  auto ref = ReferenceModel<float>::load(ck, ReferenceOptions{});
  ASSERT_TRUE(ref.is_ok());
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), c.tokens.begin(), c.tokens.end() - 1);
  std::vector<float> logits;
  ASSERT_TRUE((*ref)->forward(seq, &logits).is_ok());
  const std::size_t v = static_cast<std::size_t>((*ref)->config().text.vocab_size);
  for (std::size_t k = 0; k < c.tokens.size(); ++k) {
    const std::size_t row = r.prompt.size() - 1 + k;
    const float* l = logits.data() + row * v;
    const auto best = static_cast<int32_t>(std::max_element(l, l + v) - l);
    EXPECT_EQ(c.tokens[k], best) << "token " << k;
  }
}

// The engine on the fast path (the default): greedy tokens equal the argmax of the fast model's
// own teacher-forced logits (the fast path gives a sequence the same bits whatever its chunking),
// and stay close to the reference's.
TEST(Engine, FastBackendGreedyMatchesTeacherForcedArgmax) {
  testing::TempDir dir;
  const std::string ck = dir.path() + "/ck", conv = dir.path() + "/conv";
  ASSERT_TRUE(testing::make_tiny_official_and_converted(ck, conv).is_ok());
  EngineOptions opt;
  opt.model_dir = conv;
  opt.fast.kv_cache_gb = 0.05;
  auto e = Engine::load(opt);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const GenerationRequest r = greedy_twelve_tokens(**e);
  Collected c = collect(*(*e)->submit(r));
  ASSERT_EQ(c.tokens.size(), 12u);
  EXPECT_EQ((*e)->stats().kv_foreign_reads, 0);  // the isolation counter the server exports
  FastOptions fo;
  fo.kv_cache_bytes = 50'000'000;
  auto fast = FastModel::load(conv, fo);
  ASSERT_TRUE(fast.is_ok());
  std::vector<int32_t> seq = r.prompt;
  seq.insert(seq.end(), c.tokens.begin(), c.tokens.end() - 1);
  ASSERT_TRUE((*fast)->open(1).is_ok());
  StepBatch b;
  b.slices.push_back({1, 0, seq, {}, {}});
  for (int32_t i = 0; i < int32_t(seq.size()); ++i) b.slices[0].logits_rows.push_back(i);
  StepOutput out;
  ASSERT_TRUE((*fast)->step(b, &out).is_ok());
  const std::size_t v = static_cast<std::size_t>((*fast)->vocab_size());
  for (std::size_t k = 0; k < c.tokens.size(); ++k) {
    const float* l = out.slices[0].logits.data() + (r.prompt.size() - 1 + k) * v;
    EXPECT_EQ(c.tokens[k], static_cast<int32_t>(std::max_element(l, l + v) - l)) << "token " << k;
  }
  // A converted checkpoint is refused by the reference path, an official one by the fast path.
  EngineOptions bad = opt;
  bad.path = "reference";
  EXPECT_FALSE(Engine::load(bad).is_ok());
  bad.path = "fast";
  bad.model_dir = ck;
  EXPECT_FALSE(Engine::load(bad).is_ok());
}

// Batch invariance end to end on the fast path: a request's tokens and logprobs (greedy, and
// seeded sampling) are the same alone, among 15 concurrent others (some cancelled midway), and when
// a pool too small for all of them forces preemptions (recompute) along the way; no foreign read,
// and nothing is left in the pool after.
std::string tiny_converted(const testing::TempDir& dir) {
  return testing::make_tiny_converted(dir, 3);
}

// The fast engine on a converted checkpoint, a 50 MB pool, the prefix cache on or off.
std::unique_ptr<Engine> cached_engine(const std::string& conv, bool cache, int64_t budget,
                                      int max_queue = 256) {
  EngineOptions opt;
  opt.model_dir = conv;
  opt.fast.kv_cache_gb = 0.05;
  opt.fast.prefix_cache = cache;
  opt.max_num_batched_tokens = budget;
  opt.max_queue = max_queue;
  auto e = Engine::load(opt);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return std::move(*e);
}

struct Produced {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool operator==(const Produced&) const = default;
};

Produced produce(RequestHandle h) {
  Collected c = collect(std::move(h), 20s);
  return {c.tokens, c.logprobs};
}

// A sampled request on a random prompt of `n` tokens (ignore_eos, logprobs of the chosen token).
GenerationRequest random_sampled_request(Rng& rng, int32_t vocab, std::size_t n, int max_tokens,
                                         double temperature, uint64_t seed) {
  GenerationRequest r;
  r.prompt.resize(n);
  for (auto& t : r.prompt) t = int32_t(rng.below(uint64_t(vocab)));
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.logprobs = 0;
  return r;
}

TEST(Engine, FastRequestsAreTheSameAloneBatchedAndPreempted) {
  testing::TempDir dir;
  const std::string conv = tiny_converted(dir);
  auto make = [&](double kv_gb) {
    EngineOptions opt;
    opt.model_dir = conv;
    opt.fast.kv_cache_gb = kv_gb;
    opt.max_num_batched_tokens = 24;
    auto e = Engine::load(opt);
    EXPECT_TRUE(e.is_ok()) << e.status().message();
    return std::move(*e);
  };
  std::vector<GenerationRequest> targets(2);
  for (std::size_t k = 0; k < targets.size(); ++k) {
    targets[k].prompt = {3, 17, 99, 5, 250, 31, 8, 77, 12, 64, 1, 9, 40};
    targets[k].sampling.max_tokens = 24;
    targets[k].sampling.ignore_eos = true;
    targets[k].sampling.logprobs = 0;
  }
  targets[0].sampling.temperature = 0;
  targets[1].sampling.temperature = 0.9;
  targets[1].sampling.seed = 77;
  auto solo_engine = make(0.05);
  std::vector<Produced> solo;
  for (const auto& t : targets) solo.push_back(produce(*solo_engine->submit(t)));
  ASSERT_EQ(solo[0].tokens.size(), 24u);
  // The pool of the crowded run: room for about three of the requests at once.
  FastOptions fo;
  fo.kv_cache_bytes = int64_t(0.05e9);
  auto probe = FastModel::load(conv, fo);
  ASSERT_TRUE(probe.is_ok());
  const double block_gb = double((*probe)->pool().layout().block_bytes) / 1e9;
  // The crowded run's pool holds about one and a half of the longest requests: the companions are
  // preempted first (they arrive later), then the second target while the first grows.
  const double small_gb = block_gb * 1.5 * double((*probe)->kv_blocks_peak(41, 24));
  for (double kv_gb : {0.05, small_gb}) {
    SCOPED_TRACE(kv_gb == 0.05 ? "ample pool" : "small pool");
    auto e = make(kv_gb);
    Rng rng(5);
    std::vector<RequestHandle> others;
    std::vector<RequestHandle> mine;
    const bool ample = kv_gb == 0.05;
    if (!ample)
      for (const auto& t : targets) mine.push_back(*e->submit(t));
    for (int i = 0; i < 15; ++i) {
      GenerationRequest r;
      r.prompt.resize(5 + rng.below(20));
      for (auto& t : r.prompt) t = int32_t(rng.below(uint64_t(e->vocab_size())));
      r.sampling.max_tokens = 4 + int(rng.below(12));
      r.sampling.ignore_eos = true;
      r.sampling.temperature = 0.7;
      others.push_back(*e->submit(r));
      if (ample && (i == 4 || i == 9)) mine.push_back(*e->submit(targets[mine.size()]));
    }
    // Every third companion is cancelled once it has produced something (its blocks go back at
    // the next step, preempted or not).
    for (std::size_t i = 0; i < others.size(); i += 3) {
      RequestOutput o;
      if (others[i].next(o, 20s)) others[i].cancel();
    }
    for (std::size_t k = 0; k < mine.size(); ++k)
      EXPECT_TRUE(produce(mine[k]) == solo[k]) << "target " << k;
    for (std::size_t i = 0; i < others.size(); ++i)
      if (i % 3) EXPECT_FALSE(produce(others[i]).tokens.empty());
    const EngineStats st = settled(*e);
    EXPECT_EQ(st.kv_foreign_reads, 0);
    EXPECT_EQ(st.kv_blocks_used, 0);
    if (!ample) EXPECT_GT(st.preemptions_total, 0);
  }
}

// Prefix caching through the engine: a second request with the same long prompt attaches the
// cached blocks (hit tokens counted) and answers exactly what the first did and what an engine
// without the cache answers; another cache_salt never hits.
TEST(Engine, PrefixCacheHitsAnswerExactlyAndSkipThePrompt) {
  testing::TempDir dir;
  const std::string conv = tiny_converted(dir);
  auto make = [&](bool cache) { return cached_engine(conv, cache, 64); };
  Rng rng(8);
  auto e = make(true);
  const GenerationRequest r = random_sampled_request(rng, e->vocab_size(), 400, 10, 0.8, 5);
  const Produced first = produce(*e->submit(r));
  EXPECT_EQ(settled(*e).prefix_hit_tokens, 0);
  const Produced second = produce(*e->submit(r));
  const EngineStats st = settled(*e);
  EXPECT_GE(st.prefix_hit_tokens, 200) << "of " << r.prompt.size();
  EXPECT_EQ(st.prefix_queries, 2);
  EXPECT_TRUE(first == second);
  // The request's own output says how much of its prompt came from the cache.
  const Collected third = collect(*e->submit(r), 20s);
  EXPECT_GE(third.last.cached_prompt_tokens, 200);
  EXPECT_LT(third.last.cached_prompt_tokens, int64_t(r.prompt.size()));
  // It says so from its first output on (a stream reports it at its start), not only at the end.
  GenerationRequest longer = r;
  longer.sampling.max_tokens = 300;
  longer.sampling.ignore_eos = true;
  RequestHandle early = *e->submit(longer);
  RequestOutput first_out;
  ASSERT_TRUE(early.next(first_out, 20s));
  EXPECT_FALSE(first_out.finished);
  EXPECT_EQ(first_out.cached_prompt_tokens, third.last.cached_prompt_tokens);
  early.cancel();
  EXPECT_EQ(collect(early, 20s).last.reason, FinishReason::kCancelled);
  GenerationRequest salted = r;
  salted.cache_salt = "tenant-b";
  const Collected other = collect(*e->submit(salted), 20s);
  EXPECT_EQ(other.last.cached_prompt_tokens, 0);
  EXPECT_EQ(other.tokens, first.tokens);
  EXPECT_EQ(settled(*e).prefix_hit_tokens, st.prefix_hit_tokens + third.last.cached_prompt_tokens +
                                               first_out.cached_prompt_tokens);
  auto plain = make(false);
  EXPECT_TRUE(produce(*plain->submit(r)) == first);
  EXPECT_EQ(settled(*plain).prefix_hit_tokens, 0);
  EXPECT_EQ(settled(*e).kv_foreign_reads, 0);
}

// OpenAI's n: the samples of one prompt are queued together; sample i is the request with seed + i
// (each equals that request run alone, on an engine without a cache), and samples 1..n-1 wait for
// sample 0's prompt and take its blocks from the prefix cache instead of computing them again.
TEST(Engine, ParallelSamplesShareThePromptAndEachEqualsItsOwnRequest) {
  testing::TempDir dir;
  const std::string conv = tiny_converted(dir);
  // Room for all three prompts in one step, a queue of 8.
  auto make = [&](bool cache) { return cached_engine(conv, cache, 2048, 8); };
  auto e = make(true);
  Rng rng(9);
  const GenerationRequest r = random_sampled_request(rng, e->vocab_size(), 400, 12, 0.9, 11);
  auto hs = e->submit(r, 3);
  ASSERT_TRUE(hs.is_ok()) << hs.status().message();
  ASSERT_EQ(hs->size(), 3u);
  std::vector<Produced> samples;
  for (auto& h : *hs) samples.push_back(produce(h));
  const EngineStats st = settled(*e);
  EXPECT_EQ(st.prefix_queries, 3);
  // Both later samples found the prompt's full blocks cached (the first computed them alone).
  EXPECT_GE(st.prefix_hit_tokens, 2 * 200) << "of " << r.prompt.size() << " per sample";
  EXPECT_EQ(st.kv_foreign_reads, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_FALSE(samples[0] == samples[1] && samples[1] == samples[2]);  // seeds 11, 12, 13
  auto plain = make(false);
  for (int i = 0; i < 3; ++i) {
    GenerationRequest one = r;
    one.sampling.seed = 11 + i;
    EXPECT_TRUE(produce(*plain->submit(one)) == samples[std::size_t(i)]) << "sample " << i;
  }
  // Greedy samples are all the same; without a cache nothing waits: both prompts run in one step,
  // so every later step decodes both (a held sample 1 would prefill in a step of sample 0's
  // decode).
  GenerationRequest g = r;
  g.sampling.temperature = 0;
  auto gs = plain->submit(g, 2);
  ASSERT_TRUE(gs.is_ok());
  const Produced g0 = produce((*gs)[0]);
  EXPECT_TRUE(produce((*gs)[1]) == g0);
  const EngineStats ps = settled(*plain);
  // Decode-only steps: 11 per 12-token request after its prompt's step (3 alone, then 2 together).
  EXPECT_EQ(ps.decode_steps_tokens, 3 * 11 + 2 * 11);
  EXPECT_GT(ps.decode_steps_seconds, 0);
  // Limits: n is at least 1 and all samples fit the engine at once (the free running seats plus
  // the queue of 8: 64 + 8 here), or none is queued.
  auto zero = plain->submit(g, 0);
  ASSERT_FALSE(zero.is_ok());
  EXPECT_EQ(zero.status().message().rfind("n:", 0), 0u) << zero.status().message();
  ASSERT_EQ(plain->max_requests(), 64 + 8);
  auto many = plain->submit(g, 64 + 8 + 1);
  ASSERT_FALSE(many.is_ok());
  EXPECT_EQ(many.status().message().rfind("n:", 0), 0u) << many.status().message();
  EXPECT_EQ(settled(*plain).queued, 0);
}

}  // namespace
}  // namespace dsv41
