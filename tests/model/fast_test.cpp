// The fast forward (model/fast) against the reference on the tiny preset (design.md §7 fast-path
// gates), its own consistency (decode vs prefill), batch invariance (alone vs among companions:
// bit-identical), the KV pool (allocation, truncate rollback, a planted foreign read counted and
// masked) and the decode hot path's allocations (none after warm-up).
#include "model/fast/fast_model.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/test_util.h"
#include "model/config.h"
#include "model/convert/converter.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "model/reference/reference_runner.h"
#include "model/reference/vision_tower.h"
#include "model/tiny_checkpoint.h"
#include "model/tiny_converted.h"
#include "vision/preprocess.h"

// Counts heap allocations of this test program (the hot-path test reads the counter). Every
// unaligned form is replaced, plain and array, throwing and nothrow (std::stable_sort's buffer is a
// nothrow new), so that each allocation is freed by its own family; under ASan a form left to the
// runtime would be freed here with free() and reported as a mismatch. The aligned forms stay the
// runtime's, new and delete alike.
static std::atomic<int64_t> g_allocations{0};
static void* counted_alloc(std::size_t n) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace dsv41 {
namespace {

using testing::TempDir;

struct Checkpoints {
  TempDir official, converted;
};

// One tiny checkpoint and its conversion for the whole program.
const Checkpoints& tiny() {
  static Checkpoints* c = [] {
    auto* k = new Checkpoints();
    MakeTinyOptions o;
    o.out_dir = k->official.path() + "/m";
    o.preset = "tiny";
    o.seed = 7;
    o.force = true;
    EXPECT_TRUE(make_tiny_checkpoint(o).is_ok());
    ConvertOptions co;
    co.from = o.out_dir;
    co.to = k->converted.path() + "/c";
    auto r = convert_checkpoint(co);
    EXPECT_TRUE(r.is_ok()) << (r ? "" : r.status().message());
    return k;
  }();
  return *c;
}
std::string official_dir() {
  return tiny().official.path() + "/m";
}
std::string converted_dir() {
  return tiny().converted.path() + "/c";
}

int32_t image_token_id() {
  static const int32_t id = int32_t(load_config(official_dir() + "/config.json")->image_token_id);
  return id;
}

std::unique_ptr<FastModel> load_fast(FastOptions o = {}) {
  if (o.kv_cache_bytes == 0) o.kv_cache_bytes = int64_t(64) << 20;
  auto m = FastModel::load(converted_dir(), o);
  EXPECT_TRUE(m.is_ok()) << (m ? "" : m.status().message());
  return m ? std::move(*m) : nullptr;
}

std::vector<int32_t> random_tokens(uint64_t seed, int n, int32_t vocab) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = int32_t(rng.next_u64() % uint64_t(vocab));
  return t;
}

// Logits of every position of `tokens` fed in chunks of `chunk` (0: one call).
std::vector<float> run(ModelRunner& m, SeqId id, const std::vector<int32_t>& tokens, int chunk) {
  EXPECT_TRUE(m.open(id).is_ok());
  std::vector<float> all;
  const int n = int(tokens.size()), c = chunk > 0 ? chunk : n;
  for (int b = 0; b < n; b += c) {
    StepBatch batch;
    SeqSlice s;
    s.seq = id;
    s.first_pos = b;
    s.tokens.assign(tokens.begin() + b, tokens.begin() + std::min(n, b + c));
    for (int r = 0; r < int(s.tokens.size()); ++r) s.logits_rows.push_back(r);
    batch.slices.push_back(s);
    StepOutput out;
    const Status st = m.step(batch, &out);
    EXPECT_TRUE(st.is_ok()) << (st ? "" : st.message());
    all.insert(all.end(), out.slices[0].logits.begin(), out.slices[0].logits.end());
  }
  return all;
}

std::vector<double> log_softmax(const float* x, int64_t v) {
  double mx = x[0];
  for (int64_t i = 1; i < v; ++i) mx = std::max(mx, double(x[i]));
  double s = 0;
  for (int64_t i = 0; i < v; ++i) s += std::exp(double(x[i]) - mx);
  std::vector<double> out(static_cast<std::size_t>(v));
  for (int64_t i = 0; i < v; ++i) out[std::size_t(i)] = double(x[i]) - mx - std::log(s);
  return out;
}

struct Agreement {
  double argmax = 0, mean_dlogprob = 0, first_rel_l2 = 0;
};

// Teacher-forced comparison of two [T, vocab] logit sets: argmax agreement, mean |delta logprob|
// of the next token, and the largest relative L2 over the first `early` rows.
Agreement compare(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<int32_t>& tokens, int64_t v, int early) {
  Agreement g;
  const int64_t T = int64_t(tokens.size());
  int64_t same = 0, nlp = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* ra = a.data() + t * v;
    const float* rb = b.data() + t * v;
    same += std::max_element(ra, ra + v) - ra == std::max_element(rb, rb + v) - rb;
    if (t + 1 < T) {
      const auto la = log_softmax(ra, v), lb = log_softmax(rb, v);
      g.mean_dlogprob += std::fabs(la[std::size_t(tokens[std::size_t(t + 1)])] -
                                   lb[std::size_t(tokens[std::size_t(t + 1)])]);
      ++nlp;
    }
    if (t < early) {
      double d = 0, n = 0;
      for (int64_t i = 0; i < v; ++i)
        d += (double(ra[i]) - rb[i]) * (double(ra[i]) - rb[i]), n += double(rb[i]) * rb[i];
      g.first_rel_l2 = std::max(g.first_rel_l2, std::sqrt(d / n));
    }
  }
  g.argmax = double(same) / double(T);
  g.mean_dlogprob /= double(std::max<int64_t>(1, nlp));
  return g;
}

std::vector<float> reference_logits(const std::vector<int32_t>& tokens,
                                    IndexKeySemantics keys = IndexKeySemantics::kOwner,
                                    bool act_quant = false) {
  ReferenceOptions ro;
  ro.index_keys = keys;
  ro.act_quant = act_quant;
  auto r = ReferenceRunner<float>::load(official_dir(), ro);
  EXPECT_TRUE(r.is_ok());
  return run(**r, 1, tokens, 0);
}

TEST(FastModel, LoadsAndReportsPool) {
  auto m = load_fast();
  ASSERT_TRUE(m);
  EXPECT_GT(m->pool().blocks_total(), 2);
  EXPECT_GT(m->pool().layout().global_bytes_per_token(), 0);
  EXPECT_EQ(m->stats().foreign_reads, 0);
}

TEST(FastModel, RefusesOfficialLayoutNamingIt) {
  auto m = FastModel::load(official_dir(), {});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("manifest"), std::string::npos) << m.status().message();
}

std::vector<float> reference64_logits(const std::vector<int32_t>& tokens, IndexKeySemantics keys,
                                      bool act_quant) {
  ReferenceOptions ro;
  ro.index_keys = keys;
  ro.act_quant = act_quant;
  auto r = ReferenceRunner<double>::load(official_dir(), ro);
  EXPECT_TRUE(r.is_ok());
  return run(**r, 1, tokens, 0);  // the runner hands out fp32 copies of the fp64 logits
}

// design.md §7 with act_quant off (model-faithful): the fast path against the fp32 reference.
TEST(FastModel, MatchesReferenceOnShortPrefixes) {
  auto m = load_fast();
  ASSERT_TRUE(m);
  const int64_t v = m->vocab_size();
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    const auto toks = random_tokens(seed, 16, int32_t(v));
    const auto fast = run(*m, 100 + seed, toks, 0);
    const auto ref = reference_logits(toks);
    const Agreement g = compare(fast, ref, toks, v, 6);
    EXPECT_LE(g.first_rel_l2, 5e-3) << "seed " << seed;
  }
}

TEST(FastModel, MatchesReferenceOverLongSequences) {
  const auto v = load_fast()->vocab_size();
  const auto toks = random_tokens(11, 300, int32_t(v));
  for (auto keys : {IndexKeySemantics::kOwner, IndexKeySemantics::kVendor}) {
    FastOptions o;
    o.index_keys = keys;
    auto mk = load_fast(o);
    const auto fast = run(*mk, 1, toks, 0);
    const auto ref = reference_logits(toks, keys);
    const Agreement g = compare(fast, ref, toks, v, 0);
    EXPECT_GE(g.argmax, 0.97) << "vendor " << (keys == IndexKeySemantics::kVendor);
    EXPECT_LT(g.mean_dlogprob, 0.05);
  }
}

// act_quant on: E4M3 roundings before every FP8/FP4 linear make fp32 results chaotic on this
// random-weight model even for the oracle: the fp32 reference itself leaves the fp64 reference's
// row on some 16-token prefixes (0.06-0.22 relative L2 within 6 rows, seeds 1, 7, 8 of 1..12) and
// agrees on only ~86% of argmaxes over 300 tokens. So the fast path is gated against the exact
// (fp64) reference in the same mode, and must do at least as well as the fp32 reference does
// there (docs/decisions.md).
TEST(FastModel, ActQuantTracksTheExactReferenceAsWellAsFp32Does) {
  FastOptions o;
  o.act_quant = true;
  auto m = load_fast(o);
  const int64_t v = m->vocab_size();
  int fast_off = 0, ref_off = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const auto toks = random_tokens(seed, 16, int32_t(v));
    const auto fast = run(*m, 100 + seed, toks, 0);
    const auto r32 = reference_logits(toks, IndexKeySemantics::kOwner, true);
    const auto r64 = reference64_logits(toks, IndexKeySemantics::kOwner, true);
    fast_off += compare(fast, r64, toks, v, 6).first_rel_l2 > 5e-3;
    ref_off += compare(r32, r64, toks, v, 6).first_rel_l2 > 5e-3;
  }
  EXPECT_LE(fast_off, ref_off) << "prefixes off the fp64 row: fast " << fast_off << ", fp32 "
                               << ref_off;
  EXPECT_LE(fast_off, 3);
  const auto toks = random_tokens(11, 300, int32_t(v));
  const auto fast = run(*m, 1, toks, 0);
  const auto r32 = reference_logits(toks, IndexKeySemantics::kOwner, true);
  const auto r64 = reference64_logits(toks, IndexKeySemantics::kOwner, true);
  const Agreement gf = compare(fast, r64, toks, v, 0), gr = compare(r32, r64, toks, v, 0);
  EXPECT_GE(gf.argmax, gr.argmax - 0.02) << "fast " << gf.argmax << " fp32 " << gr.argmax;
  EXPECT_LE(gf.mean_dlogprob, gr.mean_dlogprob + 0.01)
      << "fast " << gf.mean_dlogprob << " fp32 " << gr.mean_dlogprob;
  EXPECT_GE(gf.argmax, 0.85);
}

// The two numerics modes really differ (so the gates above test two things).
TEST(FastModel, ActQuantChangesTheLogits) {
  FastOptions o;
  o.act_quant = true;
  auto a = load_fast(), b = load_fast(o);
  const auto toks = random_tokens(12, 8, a->vocab_size());
  const auto la = run(*a, 1, toks, 0), lb = run(*b, 1, toks, 0);
  const Agreement g = compare(la, lb, toks, a->vocab_size(), 8);
  EXPECT_GT(g.first_rel_l2, 1e-2);
}

TEST(FastModel, DecodeAndChunkedTrackPrefill) {
  auto m = load_fast();
  ASSERT_TRUE(m);
  const int64_t v = m->vocab_size();
  const auto toks = random_tokens(21, 200, int32_t(v));
  const auto pre = run(*m, 1, toks, 0);
  const auto dec = run(*m, 2, toks, 1);
  const auto chk = run(*m, 3, toks, 7);
  for (const auto* other : {&dec, &chk}) {
    const Agreement g = compare(*other, pre, toks, v, 0);
    EXPECT_LT(g.mean_dlogprob, 0.05);
    EXPECT_GE(g.argmax, 0.97);
  }
}

// Steps a target sequence (prefill chunks then decode) either alone or with companions that are
// opened, prefilled, decoded and freed around it; returns the target's logits.
// With `image`, the target's first slice (9 tokens) holds a 2 x 2 image's span at rows 1-8.
std::vector<float> target_among(int companions, uint64_t seed, bool act_quant = false,
                                const SliceImage* image = nullptr) {
  FastOptions o;
  o.act_quant = act_quant;
  auto m = load_fast(o);
  const int32_t v = m->vocab_size();
  auto toks = random_tokens(5, 60, v);
  if (image)
    for (int64_t i = 0; i < image->span(); ++i)
      toks[std::size_t(image->start + i)] = image_token_id();
  Rng rng(seed);
  EXPECT_TRUE(m->open(1).is_ok());
  std::vector<std::pair<SeqId, std::vector<int32_t>>> comp;
  for (int c = 0; c < companions; ++c) {
    comp.push_back({SeqId(10 + c), random_tokens(seed * 100 + uint64_t(c), 80, v)});
    EXPECT_TRUE(m->open(comp.back().first).is_ok());
  }
  std::vector<float> got;
  int64_t pos = 0;
  const int chunks[] = {9, 4, 1};
  int ci = 0;
  while (pos < int64_t(toks.size())) {
    StepBatch b;
    const int64_t len = std::min<int64_t>(chunks[std::min(ci++, 2)], int64_t(toks.size()) - pos);
    // Companions before and after the target, with random chunk sizes (prefill or decode).
    std::vector<SeqSlice> others;
    for (auto& [id, ct] : comp) {
      const int64_t cl = m->length(id);
      if (cl >= int64_t(ct.size()) || rng.next_u64() % 3 == 0) continue;
      SeqSlice s;
      s.seq = id;
      s.first_pos = cl;
      const int64_t n = std::min<int64_t>(1 + int64_t(rng.next_u64() % 6), int64_t(ct.size()) - cl);
      s.tokens.assign(ct.begin() + cl, ct.begin() + cl + n);
      if (rng.next_u64() % 2) s.logits_rows.push_back(int32_t(n - 1));
      others.push_back(s);
    }
    const std::size_t split = others.empty() ? 0 : rng.next_u64() % (others.size() + 1);
    for (std::size_t i = 0; i < split; ++i) b.slices.push_back(others[i]);
    SeqSlice t;
    t.seq = 1;
    t.first_pos = pos;
    t.tokens.assign(toks.begin() + pos, toks.begin() + pos + len);
    for (int r = 0; r < int(len); ++r) t.logits_rows.push_back(r);
    if (image && pos == 0) t.images.push_back(*image);
    const std::size_t me = b.slices.size();
    b.slices.push_back(t);
    for (std::size_t i = split; i < others.size(); ++i) b.slices.push_back(others[i]);
    StepOutput out;
    const Status st = m->step(b, &out);
    EXPECT_TRUE(st.is_ok()) << (st ? "" : st.message());
    got.insert(got.end(), out.slices[me].logits.begin(), out.slices[me].logits.end());
    pos += len;
    // A companion that finished leaves; its blocks go back to the pool for others.
    for (auto& [id, ct] : comp)
      if (m->length(id) == int64_t(ct.size())) {
        m->free(id);
        EXPECT_TRUE(m->open(id).is_ok());
        ct = random_tokens(rng.next_u64(), 50, v);
      }
  }
  EXPECT_EQ(m->stats().foreign_reads, 0);
  return got;
}

// A random image of llm_w x llm_h aligner rows whose span starts at slice row `start`.
SliceImage random_image(int32_t start, int32_t w, int32_t h, uint64_t seed, int64_t hidden) {
  SliceImage im;
  im.start = start, im.llm_w = w, im.llm_h = h;
  auto rows = std::make_shared<std::vector<float>>();
  Rng rng(seed);
  for (int64_t i = 0; i < int64_t(w) * h * hidden; ++i)
    rows->push_back(float(rng.uniform() * 2 - 1));
  im.rows = rows;
  return im;
}

// In both numerics modes (act-quant on runs the FP8 linears through the act-quant GEMM on tiers
// that have it).
TEST(FastModel, BatchInvariantBitForBit) {
  for (bool aq : {false, true}) {
    const auto solo = target_among(0, 1, aq);
    for (int companions : {1, 3, 15}) {
      const auto mixed = target_among(companions, uint64_t(companions), aq);
      ASSERT_EQ(solo.size(), mixed.size());
      EXPECT_EQ(std::memcmp(solo.data(), mixed.data(), solo.size() * sizeof(float)), 0)
          << companions << " companions, act-quant " << aq;
    }
  }
}

// The weights copied onto transparent huge pages at load (FastOptions::huge_pages) are the same
// bytes at the same addresses: the logits are those of the file-mapped weights, bit for bit. The
// small preset, whose expert files hold whole 2 MB pages (the tiny one's files are smaller).
TEST(FastModel, HugePageWeightsGiveTheLogitsOfFileMappedOnes) {
  TempDir dir;
  const std::string converted = dir.path() + "/c";
  const Status made =
      testing::make_tiny_official_and_converted(dir.path() + "/m", converted, 5, "small");
  ASSERT_TRUE(made.is_ok()) << made.message();
  std::vector<float> logits[2];
  int64_t huge[2] = {0, 0};
  for (int on : {0, 1}) {
    FastOptions o;
    o.warm = true;
    o.huge_pages = on == 1;
    o.act_quant = true;
    o.kv_cache_bytes = int64_t(64) << 20;
    auto m = FastModel::load(converted, o);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    logits[on] = run(**m, 1, random_tokens(11, 9, int32_t((*m)->vocab_size())), 4);
    huge[on] = (*m)->stats().huge_page_weight_bytes;
  }
  EXPECT_EQ(huge[0], 0);
  if (transparent_huge_pages_available().is_ok())
    EXPECT_GT(huge[1], 0) << "THP is on here: the experts' whole 2 MB pages should have moved";
  ASSERT_EQ(logits[0].size(), logits[1].size());
  ASSERT_FALSE(logits[0].empty());
  EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)), 0);
}

TEST(FastModel, TruncateRollsBackEveryCache) {
  auto m = load_fast();
  const int32_t v = m->vocab_size();
  const auto toks = random_tokens(31, 40, v);
  const auto alt = random_tokens(32, 7, v);
  // Reference run: 33 tokens, then the 7 alternative tokens.
  std::vector<int32_t> want(toks.begin(), toks.begin() + 33);
  want.insert(want.end(), alt.begin(), alt.end());
  const auto expect = run(*m, 1, want, 11);
  // Same through a rollback: 40 tokens (odd length 33 reopens a ratio-2 group), truncate to 33,
  // then the alternative tokens.
  run(*m, 2, toks, 11);
  ASSERT_TRUE(m->truncate(2, 33).is_ok());
  EXPECT_EQ(m->length(2), 33);
  StepBatch b;
  b.slices.push_back({2, 33, alt, {0, 1, 2, 3, 4, 5, 6}, {}});
  StepOutput out;
  ASSERT_TRUE(m->step(b, &out).is_ok());
  // The rows after the rollback equal the straight run's (its chunks of 11 put rows 33.. in
  // calls of their own too: positions 33..39 are rows of one chunk [33, 40) in both).
  const std::size_t off = 33 * std::size_t(v);
  ASSERT_EQ(out.slices[0].logits.size(), expect.size() - off);
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), expect.data() + off,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
  // Beyond the rollback margin: refused, nothing changed.
  FastOptions o;
  o.max_rollback = 4;
  auto m2 = load_fast(o);
  run(*m2, 1, toks, 0);
  EXPECT_FALSE(m2->truncate(1, 30).is_ok());
  EXPECT_EQ(m2->length(1), 40);
}

// A reopened compressor group whose projections the rollback ring no longer holds is refused, not
// rebuilt from overwritten slots (101 tokens, ring of 64: position 36's slot holds 100); a rollback
// the ring does cover stays exact, also after an earlier truncate.
TEST(FastModel, TruncateRefusesOverwrittenRingSlots) {
  FastOptions o;
  o.prefix_cache = false;  // (truncating into cached blocks is refused for that reason first)
  auto m = load_fast(o);
  const int32_t v = m->vocab_size();
  const auto toks = random_tokens(61, 101, v);
  run(*m, 1, toks, 0);
  const Status st = m->truncate(1, 37);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("compressor projections of position 36"), std::string::npos)
      << st.message();
  EXPECT_EQ(m->length(1), 101);
  // 101 -> 90 -> 81 (odd: reopens the group of position 80, written at step 81 and still held).
  ASSERT_TRUE(m->truncate(1, 90).is_ok());
  ASSERT_TRUE(m->truncate(1, 81).is_ok());
  const auto alt = random_tokens(62, 5, v);
  StepBatch b;
  b.slices.push_back({1, 81, alt, {0, 1, 2, 3, 4}, {}});
  StepOutput out;
  ASSERT_TRUE(m->step(b, &out).is_ok());
  std::vector<int32_t> want(toks.begin(), toks.begin() + 81);
  want.insert(want.end(), alt.begin(), alt.end());
  const auto expect = run(*m, 2, want, 0);
  const std::size_t off = 81 * std::size_t(v);
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), expect.data() + off,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
}

TEST(FastModel, TapsAreTheMeanOfTheStreamEnteringALayer) {
  auto m = load_fast();
  const int32_t v = m->vocab_size();
  ASSERT_TRUE(m->open(1).is_ok());
  StepBatch b;
  b.slices.push_back({1, 0, random_tokens(71, 6, v), {5}, {3, 5}});
  StepOutput out;
  ASSERT_TRUE(m->step(b, &out).is_ok());
  ASSERT_EQ(out.slices[0].taps.size(), 2u);
  // The reference runner taps the same stream (layers without Engram), statistically equal.
  auto r = ReferenceRunner<float>::load(official_dir(), {});
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE((*r)->open(1).is_ok());
  StepOutput ro;
  ASSERT_TRUE((*r)->step(b, &ro).is_ok());
  for (std::size_t k = 0; k < 2; ++k) {
    double d = 0, n = 0;
    for (std::size_t i = 0; i < out.slices[0].taps[k].size(); ++i) {
      d += std::pow(out.slices[0].taps[k][i] - ro.slices[0].taps[k][i], 2);
      n += std::pow(ro.slices[0].taps[k][i], 2);
    }
    EXPECT_LT(std::sqrt(d / n), 1e-4) << "tap " << k;
    EXPECT_GT(n, 0);
  }
  StepBatch bad;
  bad.slices.push_back({1, 6, {1}, {}, {5, 3}});
  EXPECT_FALSE(m->step(bad, &out).is_ok());
}

// bench decode --context: the random fill gives a sequence the blocks a prefill of the same length
// holds, with rows tagged as its own (decode after it reads no foreign row), and refuses a
// non-empty sequence.
TEST(FastModel, RandomContextFillHoldsWhatAPrefillHolds) {
  FastOptions o;
  o.prefix_cache = false;  // the prefill's blocks would stay cached
  auto m = load_fast(o);
  ASSERT_TRUE(m);
  const int64_t free0 = m->pool().blocks_free();
  const auto toks = random_tokens(31, 150, m->vocab_size());
  run(*m, 1, toks, 0);
  const int64_t used_prefill = free0 - m->pool().blocks_free();
  m->free(1);
  ASSERT_TRUE(m->open(2).is_ok());
  ASSERT_TRUE(m->fill_random_context(2, 150, 9).is_ok());
  EXPECT_EQ(free0 - m->pool().blocks_free(), used_prefill);
  EXPECT_EQ(m->length(2), 150);
  for (int i = 0; i < 20; ++i) {
    StepBatch b;
    b.slices.push_back({2, m->length(2), {int32_t(i)}, {0}, {}});
    StepOutput out;
    ASSERT_TRUE(m->step(b, &out).is_ok());
    for (float v : out.slices[0].logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(m->stats().foreign_reads, 0);
  EXPECT_FALSE(m->fill_random_context(2, 10, 1).is_ok());  // not empty
  EXPECT_FALSE(m->fill_random_context(7, 10, 1).is_ok());  // not open
}

// The prefix cache: a sequence attached to another's cached blocks gives, bit for bit, the logits
// it gives computing everything itself (the first G-block boundaries shared, the rest computed);
// other salts and other tokens do not hit; the whole prompt is never attached (its last token is
// computed); truncating below the attached prefix is refused.
TEST(FastModel, PrefixCacheHitGivesTheLogitsOfAMiss) {
  auto m = load_fast();
  FastOptions off;
  off.prefix_cache = false;
  auto plain = load_fast(off);
  const int32_t v = m->vocab_size();
  const int64_t G = m->pool().layout().global_tokens;
  auto prefix = random_tokens(71, int(3 * G + 5), v);
  auto a = prefix, b = prefix;
  const auto ta = random_tokens(72, 20, v), tb = random_tokens(73, 30, v);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  run(*m, 1, a, 17);  // chunks of 17: the cached rows do not depend on the chunking
  m->free(1);
  ASSERT_TRUE(m->open(2).is_ok());
  EXPECT_EQ(m->attach_cached_prefix(2, b, "other salt"), 0);
  m->free(2);
  ASSERT_TRUE(m->open(2).is_ok());
  ASSERT_EQ(m->attach_cached_prefix(2, b, ""), 3 * G);
  EXPECT_EQ(m->length(2), 3 * G);
  StepBatch sb;
  sb.slices.push_back({2, 3 * G, std::vector<int32_t>(b.begin() + 3 * G, b.end()), {}, {}});
  for (int32_t r = 0; r < int32_t(b.size() - 3 * G); ++r) sb.slices[0].logits_rows.push_back(r);
  StepOutput out;
  ASSERT_TRUE(m->step(sb, &out).is_ok());
  const auto full = run(*plain, 1, b, 0);
  ASSERT_EQ(out.slices[0].logits.size(), full.size() - std::size_t(3 * G) * std::size_t(v));
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), full.data() + 3 * G * v,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
  EXPECT_FALSE(m->truncate(2, 3 * G - 1).is_ok());  // into the attached prefix
  EXPECT_EQ(m->stats().foreign_reads, 0);
  EXPECT_EQ(m->stats().prefix_hit_tokens, 3 * G);
  // Exactly 2G tokens: one block is attached, the last token's block is computed.
  ASSERT_TRUE(m->open(3).is_ok());
  EXPECT_EQ(m->attach_cached_prefix(3, std::vector<int32_t>(a.begin(), a.begin() + 2 * G), ""), G);
  // Other tokens in the first block: no hit.
  auto c = a;
  c[5] = (c[5] + 1) % v;
  ASSERT_TRUE(m->open(4).is_ok());
  EXPECT_EQ(m->attach_cached_prefix(4, c, ""), 0);
}

// Decoder replay and the prefix cache: a hit stops before blocks that end inside a chunk's skipped
// rows (their decoder window rows were never computed); blocks ending where a replayed chunk ended
// are attached, and the sequence then gives, bit for bit, the logits of one that ran the same
// chunks itself.
TEST(FastModel, PrefixCacheHitsStopBeforeRowsDecoderReplaySkipped) {
  FastOptions rep;
  rep.decoder_replay = true;
  auto m = load_fast(rep);
  auto plain = load_fast([] {
    FastOptions o;
    o.decoder_replay = true;
    o.prefix_cache = false;
    return o;
  }());
  const int32_t v = m->vocab_size();
  const int64_t G = m->pool().layout().global_tokens;
  const int64_t len = m->pool().layout().window + m->replay_margin();  // 8 + 12 on tiny
  ASSERT_GT(G, len) << "the chunks of G below must replay";
  const auto prefix = random_tokens(91, int(3 * G), v);
  auto a = prefix, b = prefix;
  const auto ta = random_tokens(92, int(len) + 10, v), tb = random_tokens(93, 11, v);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  // One chunk: every block ends among skipped rows (the replayed rows start 10 tokens after the
  // last block), nothing is attached.
  run(*m, 1, a, 0);
  ASSERT_TRUE(m->open(2).is_ok());
  EXPECT_EQ(m->attach_cached_prefix(2, b, ""), 0);
  EXPECT_EQ(m->stats().prefix_replay_capped_tokens, 3 * G);
  m->free(2);
  m->free(1);
  // Chunks of G (each replayed, ending on a block end): the blocks are attached.
  auto m2 = load_fast(rep);
  run(*m2, 1, a, int(G));
  ASSERT_TRUE(m2->open(2).is_ok());
  ASSERT_EQ(m2->attach_cached_prefix(2, b, ""), 3 * G);
  StepBatch sb;
  sb.slices.push_back({2, 3 * G, std::vector<int32_t>(b.begin() + 3 * G, b.end()), {}, {}});
  for (int32_t r = 0; r < int32_t(b.size() - 3 * G); ++r) sb.slices[0].logits_rows.push_back(r);
  StepOutput out;
  ASSERT_TRUE(m2->step(sb, &out).is_ok());
  const auto full = run(*plain, 1, b, int(G));  // chunks of G, then the 11 new tokens
  ASSERT_EQ(out.slices[0].logits.size(), full.size() - std::size_t(3 * G) * std::size_t(v));
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), full.data() + 3 * G * v,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
  EXPECT_EQ(m2->stats().foreign_reads, 0);
  // The boundary: block 3's last window row position 3G - window + 1 is the first one a later
  // token reads; a floor there still attaches, one past it does not.
  const int64_t w = m->pool().layout().window;
  for (const int64_t tail : {len - w + 1, len - w + 2}) {
    auto m3 = load_fast(rep);
    auto c = prefix;
    const auto tc = random_tokens(94, int(tail), v);
    c.insert(c.end(), tc.begin(), tc.end());
    run(*m3, 1, c, 0);  // floor 3G + tail - len
    ASSERT_TRUE(m3->open(2).is_ok());
    EXPECT_EQ(m3->attach_cached_prefix(2, b, ""), tail == len - w + 1 ? 3 * G : 0) << tail;
  }
}

// Truncating into blocks the prefix cache shares (copy-on-write): the sequence goes on exactly as a
// fresh one with its new tokens, and the cached blocks keep what they held (a later sequence
// attached to them still gets the miss's logits).
TEST(FastModel, TruncateIntoCachedBlocksCopiesThem) {
  auto m = load_fast();
  FastOptions off;
  off.prefix_cache = false;
  auto plain = load_fast(off);
  const int32_t v = m->vocab_size();
  const int64_t G = m->pool().layout().global_tokens;
  const auto orig = random_tokens(81, int(2 * G + 10), v);
  run(*m, 1, orig, 0);  // blocks 0 and 1 go to the cache
  const int64_t cut = 2 * G - 5;
  ASSERT_TRUE(m->truncate(1, cut).is_ok());
  const auto alt = random_tokens(82, 12, v);
  StepBatch b;
  b.slices.push_back({1, cut, alt, {}, {}});
  for (int32_t r = 0; r < 12; ++r) b.slices[0].logits_rows.push_back(r);
  StepOutput out;
  ASSERT_TRUE(m->step(b, &out).is_ok());
  std::vector<int32_t> want(orig.begin(), orig.begin() + cut);
  want.insert(want.end(), alt.begin(), alt.end());
  const auto expect = run(*plain, 1, want, 0);
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), expect.data() + cut * v,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
  // The cache still holds the original blocks 0 and 1.
  ASSERT_TRUE(m->open(2).is_ok());
  ASSERT_EQ(m->attach_cached_prefix(2, orig, ""), 2 * G);
  StepBatch c;
  c.slices.push_back({2, 2 * G, std::vector<int32_t>(orig.begin() + 2 * G, orig.end()), {}, {}});
  for (int32_t r = 0; r < 10; ++r) c.slices[0].logits_rows.push_back(r);
  ASSERT_TRUE(m->step(c, &out).is_ok());
  const auto full = run(*plain, 2, orig, 0);
  EXPECT_EQ(std::memcmp(out.slices[0].logits.data(), full.data() + 2 * G * v,
                        out.slices[0].logits.size() * sizeof(float)),
            0);
  EXPECT_EQ(m->stats().foreign_reads, 0);
}

TEST(FastModel, PrefixCacheEvictsInsteadOfFailing) {
  FastOptions o;
  o.kv_cache_bytes = 0;  // set below: room for about three sequences of 3 global blocks
  auto probe = load_fast();
  const int64_t block = probe->pool().layout().block_bytes,
                G = probe->pool().layout().global_tokens;
  o.kv_cache_bytes = block * 3 * probe->kv_blocks_peak(3 * G, 3 * G);
  auto m = load_fast(o);
  for (int i = 0; i < 12; ++i) {  // each leaves its blocks to the cache
    const auto t = random_tokens(100 + uint64_t(i), int(3 * G), m->vocab_size());
    ASSERT_TRUE(m->open(SeqId(i + 1)).is_ok());
    StepBatch b;
    b.slices.push_back({SeqId(i + 1), 0, t, {int32_t(t.size()) - 1}, {}});
    StepOutput out;
    ASSERT_TRUE(m->step(b, &out).is_ok()) << "sequence " << i;
    m->free(SeqId(i + 1));
    EXPECT_EQ(m->kv_blocks_free(), m->kv_blocks_total());
  }
  EXPECT_GT(m->stats().prefix_entries, 0);
  EXPECT_LT(m->stats().prefix_entries, 12 * 3);  // evicted
  // Every block registered is cached now or was evicted; the counts say so.
  EXPECT_GT(m->prefix_cache_counts().evictions, 0);
  EXPECT_EQ(m->stats().prefix_evictions, m->prefix_cache_counts().evictions);
}

TEST(FastModel, PoolBlocksReturnOnFree) {
  // Without the prefix cache a freed sequence's blocks are all back in the pool; with it, the
  // cached ones are held by the cache alone and count as free (evictable).
  for (bool cache : {false, true}) {
    FastOptions o;
    o.prefix_cache = cache;
    auto m = load_fast(o);
    const int64_t free0 = m->pool().blocks_free();
    run(*m, 1, random_tokens(3, 200, m->vocab_size()), 0);
    EXPECT_LT(m->kv_blocks_free(), free0);
    m->free(1);
    EXPECT_EQ(m->kv_blocks_free(), free0) << cache;
    if (!cache) EXPECT_EQ(m->pool().blocks_free(), free0);
    if (cache) EXPECT_LT(m->pool().blocks_free(), free0);  // 200 tokens fill cacheable blocks
  }
}

TEST(FastModel, KvCacheFullIsAnErrorNotACrash) {
  FastOptions o;
  auto probe = load_fast();
  o.kv_cache_bytes = probe->pool().layout().block_bytes * 3;
  auto m = load_fast(o);
  ASSERT_TRUE(m->open(1).is_ok());
  StepBatch b;
  b.slices.push_back({1, 0, random_tokens(4, 200, m->vocab_size()), {0}, {}});
  StepOutput out;
  const Status st = m->step(b, &out);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("KV cache full"), std::string::npos);
  EXPECT_EQ(m->length(1), 0);
}

TEST(FastModel, PlantedForeignReadIsCountedAndMasked) {
  for (auto mode : {IsolationMode::kCount, IsolationMode::kMask}) {
    FastOptions o;
    o.isolation = mode;
    auto m = load_fast(o);
    const int32_t v = m->vocab_size();
    const auto a = random_tokens(41, 30, v), b = random_tokens(42, 30, v);
    run(*m, 1, a, 0);
    run(*m, 2, b, 0);
    EXPECT_EQ(m->stats().foreign_reads, 0);
    ASSERT_TRUE(m->debug_plant_foreign_block(1, 2, 0).is_ok());
    StepBatch s;
    s.slices.push_back({1, 30, {5}, {0}, {}});
    StepOutput out;
    ASSERT_TRUE(m->step(s, &out).is_ok());
    EXPECT_GT(m->stats().foreign_reads, 0) << isolation_mode_name(mode);
  }
}

// Decode steps after a warm-up allocate nothing (g_allocations counts every operator new).
void decode_allocates_nothing(std::unique_ptr<FastModel> m) {
  const int32_t v = m->vocab_size();
  // With the prefix cache holding blocks (its free-block accounting is on the step's path too).
  run(*m, 9, random_tokens(50, int(2 * m->pool().layout().global_tokens + 3), v), 0);
  m->free(9);
  ASSERT_GT(m->stats().prefix_entries, 0);
  ASSERT_TRUE(m->open(1).is_ok());
  ASSERT_TRUE(m->open(2).is_ok());
  StepBatch b;
  b.slices.push_back({1, 0, random_tokens(51, 20, v), {19}, {}});
  b.slices.push_back({2, 0, random_tokens(52, 20, v), {19}, {}});
  StepOutput out;
  ASSERT_TRUE(m->step(b, &out).is_ok());
  StepBatch d;
  d.slices.push_back({1, 20, {7}, {0}, {}});
  d.slices.push_back({2, 20, {9}, {0}, {}});
  ASSERT_TRUE(m->step(d, &out).is_ok());  // warm-up: scratch reaches its decode size
  // Decode steps within the same blocks allocate nothing.
  for (int i = 1; i < 6; ++i) {
    d.slices[0].first_pos = d.slices[1].first_pos = 20 + i;
    const int64_t before = g_allocations.load();
    ASSERT_TRUE(m->step(d, &out).is_ok());
    EXPECT_EQ(g_allocations.load() - before, 0) << "decode step " << i;
  }
}

TEST(FastModel, DecodeHotPathAllocatesNothing) {
  for (bool aq : {false, true}) {
    SCOPED_TRACE(aq ? "act-quant on" : "act-quant off");
    FastOptions o;
    o.act_quant = aq;
    decode_allocates_nothing(load_fast(o));
  }
}

TEST(FastModel, BadBatchesAreRefusedNamingTheSlice) {
  auto m = load_fast();
  ASSERT_TRUE(m->open(1).is_ok());
  StepOutput out;
  StepBatch wrong_pos;
  wrong_pos.slices.push_back({1, 3, {1, 2}, {}, {}});
  Status st = m->step(wrong_pos, &out);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("first_pos"), std::string::npos);
  StepBatch unknown;
  unknown.slices.push_back({9, 0, {1}, {}, {}});
  EXPECT_FALSE(m->step(unknown, &out).is_ok());
  StepBatch bad_tok;
  bad_tok.slices.push_back({1, 0, {m->vocab_size()}, {}, {}});
  st = m->step(bad_tok, &out);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos);
  EXPECT_EQ(m->length(1), 0);
}

// An image span (spec §9.1) through the fast path: gated against the reference given the same
// aligner rows (design.md §7, fp32, the rows before the first rounding flip), different from the
// same ids as text, batch-invariant among companions in both numerics modes, and misuse refused.
TEST(FastModel, ImageSpansMatchTheReferenceAndStayBatchInvariant) {
  auto m = load_fast();
  ASSERT_TRUE(m);
  const int64_t v = m->vocab_size(), D = m->hidden_size();
  const SliceImage img = random_image(1, 2, 2, 3, D);
  ASSERT_EQ(img.span(), 8);
  auto toks = random_tokens(21, 14, int32_t(v));
  for (int64_t i = 0; i < img.span(); ++i) toks[std::size_t(1 + i)] = image_token_id();
  // The span in the first call, then one token a call.
  auto run_img = [&](ModelRunner& r, SeqId id, bool with_image) {
    EXPECT_TRUE(r.open(id).is_ok());
    std::vector<float> all;
    for (int64_t b = 0; b < int64_t(toks.size());) {
      SeqSlice s;
      s.seq = id;
      s.first_pos = b;
      const int64_t n = b == 0 ? 9 : 1;
      s.tokens.assign(toks.begin() + b, toks.begin() + b + n);
      for (int r = 0; r < int(n); ++r) s.logits_rows.push_back(r);
      if (b == 0 && with_image) s.images.push_back(img);
      StepBatch batch;
      batch.slices.push_back(s);
      StepOutput out;
      const Status st = r.step(batch, &out);
      EXPECT_TRUE(st.is_ok()) << st.message();
      if (!st.is_ok()) return all;
      all.insert(all.end(), out.slices[0].logits.begin(), out.slices[0].logits.end());
      b += n;
    }
    return all;
  };
  const auto fast = run_img(*m, 1, true);
  auto ref = ReferenceRunner<float>::load(official_dir(), {});
  ASSERT_TRUE(ref.is_ok());
  const auto want = run_img(**ref, 1, true);
  const Agreement g = compare(fast, want, toks, v, 12);
  EXPECT_LE(g.first_rel_l2, 5e-3);
  // The reference runner replays a sequence with its image after another one ran.
  EXPECT_EQ(run_img(**ref, 2, false).size(), want.size());
  StepBatch next;
  next.slices.push_back({1, int64_t(toks.size()), {5}, {0}, {}});
  StepOutput o1;
  ASSERT_TRUE((*ref)->step(next, &o1).is_ok());
  EXPECT_FALSE((*ref)->truncate(1, 4).is_ok()) << "a truncation into the span is refused";
  // The same ids without the image are plain text: other logits from the span on.
  const auto text = run_img(*m, 2, false);
  EXPECT_EQ(0, std::memcmp(fast.data(), text.data(), std::size_t(v) * sizeof(float)));
  EXPECT_NE(0, std::memcmp(fast.data() + v, text.data() + v, std::size_t(v) * sizeof(float)));
  // Batch invariance with the image's sequence among others, both numerics modes.
  const SliceImage first = random_image(1, 2, 2, 9, D);
  for (bool aq : {false, true}) {
    const auto solo = target_among(0, 1, aq, &first);
    const auto mixed = target_among(7, 7, aq, &first);
    ASSERT_EQ(solo.size(), mixed.size());
    EXPECT_EQ(0, std::memcmp(solo.data(), mixed.data(), solo.size() * sizeof(float)))
        << "act-quant " << aq;
  }
  // Misuse: an image after position 0, a span over text, rows of the wrong size.
  ASSERT_TRUE(m->open(5).is_ok());
  StepOutput out;
  auto refused = [&](SeqSlice s, const std::string& words) {
    StepBatch b;
    b.slices.push_back(std::move(s));
    const Status st = m->step(b, &out);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
  };
  SeqSlice bad;
  bad.seq = 5;
  bad.tokens.assign(toks.begin(), toks.begin() + 9);
  bad.images.push_back(img);
  bad.images[0].start = 0;
  refused(bad, "is not image_token_id");
  bad.images[0] = img;
  bad.images[0].rows = std::make_shared<std::vector<float>>(3, 0.0f);
  refused(bad, "rows must be");
  EXPECT_EQ(m->length(5), 0);
  // A span in a later slice (the text before it computed first): the same logits.
  StepBatch one;
  one.slices.push_back({5, 0, {toks[0]}, {0}, {}});
  ASSERT_TRUE(m->step(one, &out).is_ok());
  std::vector<float> split = out.slices[0].logits;
  SeqSlice later;
  later.seq = 5;
  later.first_pos = 1;
  later.tokens.assign(toks.begin() + 1, toks.begin() + 9);
  for (int r = 0; r < 8; ++r) later.logits_rows.push_back(r);
  later.images.push_back(img);
  later.images[0].start = 0;
  StepBatch b2;
  b2.slices.push_back(later);
  ASSERT_TRUE(m->step(b2, &out).is_ok());
  split.insert(split.end(), out.slices[0].logits.begin(), out.slices[0].logits.end());
  EXPECT_EQ(0, std::memcmp(split.data(), fast.data(), split.size() * sizeof(float)));
}

// The prefix cache keys an image span by its image (SliceImage::key): a second sequence with the
// same image takes the span from the cache and gets the logits of computing it; another image
// (or another key) takes nothing past the text before the span; an unkeyed image is never cached.
TEST(FastModel, PrefixCacheKeysImageSpansByTheirImage) {
  auto m = load_fast();
  ASSERT_TRUE(m);
  const int64_t v = m->vocab_size(), D = m->hidden_size();
  // Text long enough to fill cache blocks before and after the span.
  auto toks = random_tokens(31, 80, int32_t(v));
  SliceImage img = random_image(20, 2, 2, 5, D);
  img.key = 0xABCDEF;
  for (int64_t i = 0; i < img.span(); ++i) toks[std::size_t(20 + i)] = image_token_id();
  auto key_tokens = [&](const SliceImage& im) {
    std::vector<int32_t> k = toks;
    for (int64_t i = 0; i < im.span(); ++i)
      k[std::size_t(im.start + i)] = image_key_token(im.key, i);
    return k;
  };
  // Computes the rest of `toks` from the sequence's length on, one slice; its logits rows.
  auto finish = [&](SeqId id, const SliceImage& im) {
    const int64_t from = m->length(id);
    SeqSlice s;
    s.seq = id;
    s.first_pos = from;
    s.tokens.assign(toks.begin() + from, toks.end());
    for (int r = 0; r < int(s.tokens.size()); ++r) s.logits_rows.push_back(r);
    if (from <= im.start) {
      s.images.push_back(im);
      s.images[0].start -= int32_t(from);
    }
    StepBatch b;
    b.slices.push_back(s);
    StepOutput out;
    EXPECT_TRUE(m->step(b, &out).is_ok());
    return out.slices[0].logits;
  };
  ASSERT_TRUE(m->open(1).is_ok());
  const auto first = finish(1, img);
  ASSERT_TRUE(m->open(2).is_ok());
  const int64_t hit = m->attach_cached_prefix(2, key_tokens(img), "");
  EXPECT_GE(hit, img.start + img.span()) << "the span itself comes from the cache";
  const auto second = finish(2, img);
  const std::size_t tail = second.size();
  EXPECT_EQ(0,
            std::memcmp(second.data(), first.data() + first.size() - tail, tail * sizeof(float)));
  // A cached chain that ends inside a span: the rest of the span in the next slice (first > 0)
  // gives the logits of computing it all. The span at rows 60-67 straddles the first cache block
  // (the tiny layout's global blocks hold 64 positions).
  {
    auto t2 = random_tokens(41, 80, int32_t(v));
    SliceImage cut = random_image(60, 2, 2, 8, D);
    cut.key = 0x777;
    for (int64_t i = 0; i < cut.span(); ++i) t2[std::size_t(60 + i)] = image_token_id();
    auto run_from = [&](SeqId id, int64_t from) {
      SeqSlice s;
      s.seq = id;
      s.first_pos = from;
      s.tokens.assign(t2.begin() + from, t2.end());
      for (int r = 0; r < int(s.tokens.size()); ++r) s.logits_rows.push_back(r);
      SliceImage part = cut;
      part.first = int32_t(std::max<int64_t>(0, from - cut.start));
      part.start = int32_t(std::max<int64_t>(0, cut.start - from));
      s.images.push_back(part);
      StepBatch b;
      b.slices.push_back(s);
      StepOutput out;
      const Status st = m->step(b, &out);
      EXPECT_TRUE(st.is_ok()) << st.message();
      return out.slices[0].logits;
    };
    ASSERT_TRUE(m->open(11).is_ok());
    const auto whole = run_from(11, 0);
    std::vector<int32_t> keys = t2;
    for (int64_t i = 0; i < cut.span(); ++i)
      keys[std::size_t(60 + i)] = image_key_token(cut.key, i);
    ASSERT_TRUE(m->open(12).is_ok());
    const int64_t at = m->attach_cached_prefix(12, keys, "");
    ASSERT_GT(at, cut.start);
    ASSERT_LT(at, cut.start + cut.span()) << "the hit should end inside the span";
    const auto rest = run_from(12, at);
    ASSERT_EQ(rest.size(), std::size_t(80 - at) * std::size_t(v));
    EXPECT_EQ(0, std::memcmp(rest.data(), whole.data() + at * v, rest.size() * sizeof(float)));
  }
  // Another image's key: the cached chain stops before the span.
  SliceImage other = random_image(20, 2, 2, 6, D);
  other.key = 0x123456;
  ASSERT_TRUE(m->open(3).is_ok());
  EXPECT_LE(m->attach_cached_prefix(3, key_tokens(other), ""), img.start);
  // An unkeyed image's sequence is never cached: a later query finds nothing past its text.
  SliceImage unkeyed = random_image(20, 2, 2, 7, D);
  ASSERT_TRUE(m->open(4).is_ok());
  finish(4, unkeyed);
  ASSERT_TRUE(m->open(5).is_ok());
  EXPECT_LE(m->attach_cached_prefix(5, key_tokens(unkeyed), ""), img.start);
  EXPECT_EQ(m->stats().foreign_reads, 0);
}

// The fast tower (model/fast/fast_vision.h) against the fp64 reference tower on the tiny preset's
// tower, over plans of every shape (letterbox, a grid that is not a multiple of 3, tall, square);
// and the same bits on one thread as on two (an image's rows depend on its patches only).
TEST(FastVisionTower, TracksTheFp64ReferenceAndIsDeterministic) {
  auto wts = ConvertedWeights::open(converted_dir(), false);
  ASSERT_TRUE(wts.is_ok()) << wts.status().message();
  auto ck = Checkpoint::open(official_dir());
  ASSERT_TRUE(ck.is_ok());
  const ModelConfig& cfg = (*wts)->config();
  ThreadPool two(2), one(1);
  auto t2 = FastVisionTower::create(**wts, two);
  auto t1 = FastVisionTower::create(**wts, one);
  ASSERT_TRUE(t2.is_ok() && t1.is_ok());
  ImagePlanOptions o;
  o.min_pixels = cfg.vision->min_pixels;
  o.max_tokens = cfg.vision->max_image_tokens;
  auto rel = [](const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return std::sqrt(num / den);
  };
  for (auto [w, h] : {std::pair{70, 50}, {100, 100}, {30, 90}, {56, 56}}) {
    RgbImage px;
    px.width = w, px.height = h;
    px.rgb.resize(std::size_t(w * h * 3));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) px.row(y)[x * 3 + c] = uint8_t((x * 11 + y * 7 + c * 90) % 256);
    const ImagePlan plan = plan_image_grid(w, h, o);
    const auto patches = patch_tensor(plan_pixels(px, plan), cfg.vision->patch_size);
    const auto fast = (*t2)->encode(patches, plan.vit_w, plan.vit_h);
    const auto want = ref::vision_tower<double>(*ck, cfg, patches, plan.vit_w, plan.vit_h);
    ASSERT_EQ(fast.vit.size(), want.vit.v.size());
    ASSERT_EQ(fast.aligned.size(), want.aligned.v.size());
    EXPECT_LT(rel(fast.vit, want.vit.v), 1e-5) << w << " x " << h;
    EXPECT_LT(rel(fast.aligned, want.aligned.v), 1e-5) << w << " x " << h;
    const auto single = (*t1)->encode(patches, plan.vit_w, plan.vit_h);
    EXPECT_EQ(0, std::memcmp(single.aligned.data(), fast.aligned.data(),
                             fast.aligned.size() * sizeof(float)));
  }
}

// Checkpoints of other widths and layer plans than the presets' (the outside check runs DeepSeek's
// code on such): each is generated, converted and run by the fast path against the fp64 reference.
// The widths variant has o_lora_rank 24, whose wo_a groups start inside FP8 scale blocks (the fast
// path once read them with the wrong scales: relative L2 0.93 on the first rows).
struct Variant {
  const char* name;
  const char* patch;
};
constexpr Variant kVariants[] = {
    {"widths",
     R"({"text_config": {"hidden_size": 160, "num_attention_heads": 5, "head_dim": 96,
         "qk_rope_head_dim": 16, "q_lora_rank": 40, "o_groups": 5, "o_lora_rank": 24,
         "moe_intermediate_size": 96, "n_routed_experts": 7, "num_experts_per_tok": 2,
         "index_n_heads": 5, "index_head_dim": 64, "index_topk": 3, "sliding_window": 5,
         "hc_mult": 2}})"},
    {"eleven-layers",
     R"({"text_config": {"num_hidden_layers": 11,
         "compress_ratios": [0, 2, 2, 2, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0],
         "kv_source_layer_ids": [1, 3, 4], "index_source_layer_ids": [1, 3, 4, 6, 8],
         "candidate_source_layer_id": 4, "engram_layer_ids": [0, 7],
         "dspark_target_layer_ids": [8, 9, 10], "hc_mult": 3}})"},
    {"no-candidates-engram-dspark",
     R"({"text_config": {"num_hidden_layers": 6, "num_nextn_predict_layers": 0,
         "compress_ratios": [0, 1, 1, 1, 1, 1], "kv_source_layer_ids": [1],
         "index_source_layer_ids": [1, 3], "candidate_source_layer_id": null,
         "engram_layer_ids": [], "dspark_target_layer_ids": []}})"},
    {"ratio-4-and-2",
     R"({"text_config": {"num_hidden_layers": 5, "compress_ratios": [4, 4, 2, 2, 1, 0, 0, 0],
         "kv_source_layer_ids": [0, 2, 4], "index_source_layer_ids": [0, 2, 4],
         "candidate_source_layer_id": null, "engram_layer_ids": [3],
         "dspark_target_layer_ids": [4]}})"},
};

TEST(FastModel, OtherWidthsAndLayerPlansMatchTheExactReference) {
  for (const Variant& var : kVariants) {
    SCOPED_TRACE(var.name);
    TempDir dir;
    MakeTinyOptions o;
    o.out_dir = dir.path() + "/m";
    o.seed = 4;
    o.config_patch = var.patch;
    const auto made = make_tiny_checkpoint(o);
    ASSERT_TRUE(made.is_ok()) << made.status().message();
    ConvertOptions co;
    co.from = o.out_dir;
    co.to = dir.path() + "/c";
    ASSERT_TRUE(convert_checkpoint(co).is_ok());
    FastOptions fo;
    fo.kv_cache_bytes = int64_t(64) << 20;
    auto fast = FastModel::load(co.to, fo);
    ASSERT_TRUE(fast.is_ok()) << fast.status().message();
    auto ref = ReferenceRunner<double>::load(o.out_dir, {});
    ASSERT_TRUE(ref.is_ok()) << ref.status().message();
    const int64_t v = (*fast)->vocab_size();
    const auto toks = random_tokens(9, 96, int32_t(v));
    const auto whole = run(**fast, 1, toks, 0);
    const auto exact = run(**ref, 1, toks, 0);
    const Agreement g = compare(whole, exact, toks, v, 8);
    EXPECT_LE(g.first_rel_l2, 5e-3);
    EXPECT_GE(g.argmax, 0.9);
    EXPECT_LT(g.mean_dlogprob, 0.05);
    const auto chunked = run(**fast, 2, toks, 5);
    EXPECT_EQ(std::memcmp(whole.data(), chunked.data(), whole.size() * sizeof(float)), 0);
  }
}

TEST(FastModel, ConfigPatchErrorsNameTheOption) {
  TempDir dir;
  MakeTinyOptions o;
  o.out_dir = dir.path() + "/m";
  for (const char* bad : {"[1]", "{not json", R"({"text_config": {"hidden_size": 80}})"}) {
    o.config_patch = bad;
    const auto r = make_tiny_checkpoint(o);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("--config-patch"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace dsv41
