// Reference forward: hand-checked building blocks (spec §3.4, §5) and whole-model gates on the tiny
// preset — prefill vs decode vs chunked in fp64, owner vs vendor index keys, fp32 vs fp64.
#include "model/reference/reference_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "io/test_util.h"
#include "model/config.h"
#include "model/layer_plan.h"
#include "model/reference/ref_blocks.h"
#include "model/reference/ref_ops.h"
#include "model/tiny_checkpoint.h"

namespace dsv41 {
namespace {

using testing::TempDir;

// ---------------- building blocks ----------------

TEST(RefOps, Pow2Ceil) {
  EXPECT_EQ(ref::pow2_ceil(1.0), 1.0);
  EXPECT_EQ(ref::pow2_ceil(1.0000001), 2.0);
  EXPECT_EQ(ref::pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(ref::pow2_ceil(0.5), 0.5);
  EXPECT_EQ(ref::pow2_ceil(3e-5), std::ldexp(1.0, -15));
}

TEST(RefOps, FakeFp8Window) {
  // amax 448 -> scale 1: values round to e4m3 directly; 1.0625 is a tie -> 1.0.
  std::vector<double> x(32, 0.0);
  x[0] = 448;
  x[1] = 1.0625;
  x[2] = -3.3;
  ref::fake_fp8_pow2(x.data(), 32);
  EXPECT_EQ(x[0], 448);
  EXPECT_EQ(x[1], 1.0);
  EXPECT_EQ(x[2], -3.25);
  // amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8: 1.0 / 2^-8 = 256 representable.
  std::vector<double> y(32, 0.0);
  y[5] = 1.0;
  y[6] = 0.001;  // 0.256 in scaled units -> e4m3 0.25 -> 0.25 * 2^-8
  ref::fake_fp8_pow2(y.data(), 32);
  EXPECT_EQ(y[5], 1.0);
  EXPECT_EQ(y[6], 0.25 * std::ldexp(1.0, -8));
  // All-zero block: amax floor 1e-4 keeps the scale finite, zeros stay zero.
  std::vector<double> z(32, 0.0);
  ref::fake_fp8_pow2(z.data(), 32);
  for (double v : z) EXPECT_EQ(v, 0.0);
}

TEST(RefOps, FakeFp4E4m3Scale) {
  // amax 6 -> scale e4m3(1) = 1: values round on the E2M1 grid with ties to even.
  std::vector<double> x = {6, 2.5, -1.25, 0.25, 0.26, 5.0, 3.5, 0.75, 0, 0, 0, 0, 0, 0, 0, 0};
  ref::fake_fp4_e4m3(x.data(), 16);
  EXPECT_EQ(x, (std::vector<double>{6, 2, -1, 0, 0.5, 4, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0}));
  // amax 7 -> scale e4m3(7/6 = 1.1667) = 1.125 (non power of two); 7 / 1.125 = 6.2 -> clamp 6.
  std::vector<double> y(16, 0.0);
  y[0] = 7;
  ref::fake_fp4_e4m3(y.data(), 16);
  EXPECT_EQ(y[0], 6 * 1.125);
}

TEST(RefOps, FakeFp4Pow2Scale) {
  // amax 3 -> scale 2^ceil(log2(0.5)) = 0.5: 3 / 0.5 = 6 -> 6 * 0.5 = 3; 1.1 / 0.5 = 2.2 -> 2 -> 1.
  std::vector<double> x(32, 0.0);
  x[0] = 3;
  x[1] = 1.1;
  x[2] = -0.3;  // -0.6 -> -0.5 -> -0.25
  ref::fake_fp4_pow2(x.data(), 32);
  EXPECT_EQ(x[0], 3);
  EXPECT_EQ(x[1], 1);
  EXPECT_EQ(x[2], -0.25);
}

TEST(RefOps, RopeInterleavedPairsOnLastDims) {
  auto r = ref::Rope<double>::make(4, 10000, false, 1, 1, 1, 1);
  ASSERT_EQ(r.freq.size(), 2u);
  EXPECT_DOUBLE_EQ(r.freq[0], 1.0);
  EXPECT_DOUBLE_EQ(r.freq[1], 0.01);
  std::vector<double> v = {7, 8, 1, 0, 0, 1};  // leading dims untouched, pairs (1,0) and (0,1)
  r.apply(v.data(), 6, 3);
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v[1], 8);
  EXPECT_DOUBLE_EQ(v[2], std::cos(3.0));
  EXPECT_DOUBLE_EQ(v[3], std::sin(3.0));
  EXPECT_DOUBLE_EQ(v[4], -std::sin(0.03));
  EXPECT_DOUBLE_EQ(v[5], std::cos(0.03));
  r.apply(v.data(), 6, 3, /*inverse=*/true);
  EXPECT_NEAR(v[2], 1, 1e-15);
  EXPECT_NEAR(v[3], 0, 1e-15);
  EXPECT_NEAR(v[5], 1, 1e-15);
}

TEST(RefOps, YarnReleasedBounds) {
  // Released: base 160000, 64 rotary dims, factor 16, original 65536, beta 32/1 -> low 15, high 25.
  auto plain = ref::Rope<double>::make(64, 160000, false, 1, 1, 1, 1);
  auto yarn = ref::Rope<double>::make(64, 160000, true, 16, 65536, 32, 1);
  for (int i = 0; i <= 15; ++i)
    EXPECT_EQ(yarn.freq[std::size_t(i)], plain.freq[std::size_t(i)]) << i;
  for (int i = 16; i < 25; ++i) {
    EXPECT_LT(yarn.freq[std::size_t(i)], plain.freq[std::size_t(i)]) << i;
    EXPECT_GT(yarn.freq[std::size_t(i)], plain.freq[std::size_t(i)] / 16) << i;
  }
  for (int i = 25; i < 32; ++i)
    EXPECT_DOUBLE_EQ(yarn.freq[std::size_t(i)], plain.freq[std::size_t(i)] / 16) << i;
}

TEST(RefOps, SinkhornEndsOnColumnStepAndOrientation) {
  const int64_t hc = 4, d = 3;
  ref::Mat<double> fn{24, hc * d, std::vector<double>(std::size_t(24 * hc * d))};
  Rng rng(3);
  for (auto& v : fn.v) v = rng.uniform(-1, 1);
  std::vector<double> base(24), scale = {0.7, 1.1, 0.9}, h(std::size_t(hc * d));
  for (auto& v : base) v = rng.uniform(-1, 1);
  for (auto& v : h) v = rng.uniform(-2, 2);
  auto mx = ref::hc_mixes(h.data(), hc, d, fn, base, scale, 1e-20, 1e-6, 20);
  for (int64_t k = 0; k < hc; ++k) {  // last step normalised columns: each sums to 1 - O(eps)
    double s = 0;
    for (int64_t j = 0; j < hc; ++j) s += mx.comb[std::size_t(j * hc + k)];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
  for (double p : mx.pre) EXPECT_GT(p, 1e-6);
  for (double p : mx.post) EXPECT_LT(p, 2.0);
  // Orientation: out[k] = post[k] y + sum_j comb[j][k] res[j].
  ref::HcMix<double> m;
  m.post = {0, 0};
  m.comb = {1, 2, 3, 4};  // comb[0][1] = 2, comb[1][0] = 3
  std::vector<double> res = {10, 100}, y = {0}, out(2);
  ref::hc_expand(y.data(), res.data(), m, 2, 1, out.data());
  EXPECT_EQ(out[0], 1 * 10 + 3 * 100);
  EXPECT_EQ(out[1], 2 * 10 + 4 * 100);
  std::vector<double> col(1);
  ref::hc_collapse(res.data(), std::vector<double>{0.5, 2}, 2, 1, col.data());
  EXPECT_EQ(col[0], 205);
}

TEST(RefOps, TopkTiesToLowerIndex) {
  const double ninf = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(ref::topk_indices(std::vector<double>{1, 3, 3, 2, 3}, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ref::topk_indices(std::vector<double>{ninf, 0, ninf, 0}, 3),
            (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(ref::topk_indices(std::vector<double>{5, 4}, 9), (std::vector<int64_t>{0, 1}));
}

TEST(RefBlocks, CompressorPoolIsPerChannelSoftmax) {
  const std::vector<std::vector<double>> kv = {{1, 10}, {3, 20}};
  const std::vector<std::vector<double>> gate = {{0, 0}, {std::log(3.0), 0}};
  double out[2];
  ref::compress_pool(kv, gate, 2, out);
  EXPECT_NEAR(out[0], 0.25 * 1 + 0.75 * 3, 1e-15);  // channel 0: weights 1/4, 3/4
  EXPECT_EQ(out[1], 15);                            // channel 1: equal gates
}

TEST(RefBlocks, CandidatePoolPinsNewestBlockAndBreaksTiesLow) {
  std::vector<char> mask;
  // Blocks of 2 over 7 visible entries: b0 = 5, b1 = 2, b2 = 9, b3 (newest, partial) pinned.
  auto kept = ref::candidate_pool(std::vector<double>{1, 5, 2, 2, 0, 9, 3}, 7, 2, 2, &mask);
  EXPECT_EQ(kept, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(mask, (std::vector<char>{0, 0, 0, 0, 1, 1, 1}));
  // Equal block scores: the lower block wins the last place.
  kept = ref::candidate_pool(std::vector<double>{2, 2, 2, 2, 2, 2, 2}, 7, 2, 3, &mask);
  EXPECT_EQ(kept, (std::vector<int64_t>{0, 1, 3}));
}

TEST(RefBlocks, IndexerSelectDropsInvisiblePicks) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const std::vector<double> s = {0.5, 0.1, 0.9, ninf, 0.3};  // entry 3 filtered out of the pool
  EXPECT_EQ(ref::indexer_select(s, 5, 8, 3), (std::vector<int64_t>{0, 2, 4}));
  // k = min(7, 8) exceeds the 4 finite scores: the visible -inf entry 3 is picked (official
  // semantics, lower index first among ties), the invisible 5..7 are dropped.
  EXPECT_EQ(ref::indexer_select(s, 5, 8, 7), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Decode view of the same query: n_total = nvis.
  EXPECT_EQ(ref::indexer_select(s, 5, 5, 3), (std::vector<int64_t>{0, 2, 4}));
}

TEST(RefBlocks, SparseAttentionSinkInDenominatorOnly) {
  const double q[2] = {1, 0}, r0[2] = {2, 0}, r1[2] = {0, 1};
  double out[2];
  ref::sparse_attention_head(q, {r0, r1}, 2, 1.0, 0.0, out);
  const double den = 1 + std::exp(-2.0) + std::exp(-2.0);  // rows: e^0, e^-2; sink: e^(0-2)
  EXPECT_NEAR(out[0], 2 / den, 1e-15);
  EXPECT_NEAR(out[1], std::exp(-2.0) / den, 1e-15);
  ref::sparse_attention_head(q, {}, 2, 1.0, 0.0, out);  // every slot masked: zero output
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 0);
  // A very large sink cannot raise the maximum: probabilities just shrink.
  ref::sparse_attention_head(q, {r0}, 2, 1.0, 50.0, out);
  EXPECT_NEAR(out[0], 2 / (1 + std::exp(48.0)), 1e-30);
}

TEST(RefBlocks, RouterBiasSelectsButDoesNotWeigh) {
  const std::vector<double> logits = {0, 1, 2, 3}, bias = {0, 0, 10, 0};
  auto r = ref::route(logits, bias, 2, 1.0, true, 1.5);
  EXPECT_EQ(r.experts, (std::vector<int64_t>{2, 3}));
  auto sc = [](double x) { return std::sqrt(std::log1p(std::exp(x))); };
  const double sum = sc(2) + sc(3) + 1e-20;
  EXPECT_DOUBLE_EQ(r.weights[0], sc(2) / sum * 1.5);
  EXPECT_DOUBLE_EQ(r.weights[1], sc(3) / sum * 1.5);
  auto no_renorm = ref::route(logits, bias, 2, 1.0, false, 1.5);
  EXPECT_DOUBLE_EQ(no_renorm.weights[1], sc(3) * 1.5);
  EXPECT_EQ(ref::softplus(30.0), 30.0);  // torch's threshold
}

// DeepSeek's Gate renormalises only when norm_topk_prob is set AND top-k > 1: a single chosen
// expert keeps its score (times the scaling factor) instead of becoming 1.
TEST(RefBlocks, TopOneRouteKeepsItsScore) {
  const std::vector<double> logits = {0.5, -1, 2, 0.25}, bias = {0, 0, 0, 3};
  auto sc = [](double x) { return std::sqrt(std::log1p(std::exp(x))); };
  for (bool renorm : {true, false}) {
    auto r = ref::route(logits, bias, 1, 1.0, renorm, 1.5);
    ASSERT_EQ(r.experts, (std::vector<int64_t>{3})) << renorm;  // the bias selects ...
    ASSERT_EQ(r.weights.size(), 1u);
    EXPECT_DOUBLE_EQ(r.weights[0], sc(0.25) * 1.5) << renorm;  // ... but only the score weighs
  }
  // Top-2 still renormalises.
  auto two = ref::route(logits, bias, 2, 1.0, true, 1.5);
  EXPECT_DOUBLE_EQ(two.weights[0] + two.weights[1], 1.5 * (1 - 1e-20 / (sc(0.25) + sc(2))));
}

TEST(RefBlocks, SwigluClamp) {
  EXPECT_DOUBLE_EQ(ref::swiglu_clamped(20.0, -15.0, 10.0, 0.5), ref::silu(10.0) * -10.0 * 0.5);
  EXPECT_DOUBLE_EQ(ref::swiglu_clamped(-20.0, 3.0, 10.0, 1.0),
                   ref::silu(-20.0) * 3.0);  // gate: upper clamp only
  EXPECT_DOUBLE_EQ(ref::swiglu_clamped(1.0, 12.0, 10.0, 2.0), ref::silu(1.0) * 10.0 * 2.0);
}

TEST(RefBlocks, EngramGate) {
  const double h[2] = {1, 1}, w[2] = {1, 1}, key[2] = {1, 1};
  EXPECT_NEAR(ref::engram_gate(h, w, key, 2, 1e-20), ref::sigmoid(std::sqrt(std::sqrt(2.0))),
              1e-15);
  const double neg[2] = {-1, -1};
  EXPECT_NEAR(ref::engram_gate(h, w, neg, 2, 1e-20), ref::sigmoid(-std::sqrt(std::sqrt(2.0))),
              1e-15);
  const double zero_w[2] = {0, 0};
  EXPECT_EQ(ref::engram_gate(h, zero_w, key, 2, 1e-20), 0.5);  // d = 0: sign 0
}

// ---------------- whole model on the tiny preset ----------------

class TinyReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    MakeTinyOptions o;
    o.out_dir = dir_->path() + "/ck";
    o.seed = 11;
    ASSERT_TRUE(make_tiny_checkpoint(o).is_ok());
    Rng rng(5);
    tokens_.clear();
    for (int i = 0; i < 96; ++i) tokens_.push_back(int32_t(3 + rng.below(1000)));
  }
  static void TearDownTestSuite() { delete dir_; }

  template <typename T>
  static std::vector<T> run(int64_t chunk, IndexKeySemantics keys = IndexKeySemantics::kOwner,
                            std::vector<std::vector<T>>* dump = nullptr) {
    ReferenceOptions opt;
    opt.index_keys = keys;
    auto m = ReferenceModel<T>::load(dir_->path() + "/ck", opt);
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    std::vector<T> logits;
    for (std::size_t b = 0; b < tokens_.size(); b += std::size_t(chunk)) {
      std::vector<int32_t> part(
          tokens_.begin() + long(b),
          tokens_.begin() + long(std::min(tokens_.size(), b + std::size_t(chunk))));
      EXPECT_TRUE((*m)->forward(part, &logits, dump).is_ok());
    }
    return logits;
  }

  // Max over positions of max|a-b| / max|a| of that row (design.md §7).
  static double max_rel_error(const std::vector<double>& a, const std::vector<double>& b,
                              int64_t V) {
    double worst = 0;
    for (std::size_t r = 0; r * std::size_t(V) < a.size(); ++r) {
      double num = 0, den = 0;
      for (int64_t v = 0; v < V; ++v) {
        const std::size_t i = r * std::size_t(V) + std::size_t(v);
        num = std::max(num, std::fabs(a[i] - b[i]));
        den = std::max(den, std::fabs(a[i]));
      }
      worst = std::max(worst, num / den);
    }
    return worst;
  }
  static int64_t vocab() { return int64_t(run<double>(96).size() / tokens_.size()); }

  static TempDir* dir_;
  static std::vector<int32_t> tokens_;
};
TempDir* TinyReference::dir_ = nullptr;
std::vector<int32_t> TinyReference::tokens_;

TEST_F(TinyReference, PrefillDecodeChunkedAgreeInFp64) {
  const auto prefill = run<double>(96);
  const int64_t V = int64_t(prefill.size() / tokens_.size());
  for (double v : prefill) ASSERT_TRUE(std::isfinite(v));
  for (int64_t chunk : {1, 2, 3, 7, 64}) {
    const auto other = run<double>(chunk);
    ASSERT_EQ(other.size(), prefill.size());
    EXPECT_LE(max_rel_error(prefill, other, V), 1e-9) << "chunk " << chunk;
  }
}

TEST_F(TinyReference, SequencesExerciseTopkAndCandidatePool) {
  // 96 tokens: ratio-2 layers see up to 48 entries and ratio-1 layers 96 (index_topk is 4), and the
  // candidate pool (3 blocks of 2) keeps 6 of them, so the gates above cover the top-k and
  // candidate paths. Also: logits differ between positions and are O(1).
  auto m = ReferenceModel<double>::load(dir_->path() + "/ck", {});
  ASSERT_TRUE(m.is_ok());
  std::vector<double> l;
  ASSERT_TRUE((*m)->forward(tokens_, &l).is_ok());
  const ReferenceStats& st = (*m)->stats();
  // Indexers: layers 2 (ratio 2), 4 (ratio 1, candidate source), 6 (Reindex, filtered).
  EXPECT_EQ(st.indexer_queries, 95 + 96 + 96);  // position 0 of a ratio-2 layer sees nothing
  EXPECT_GT(st.topk_strict_subsets, 200);
  EXPECT_GT(st.candidate_filtered, 80);
  const int64_t V = int64_t(l.size() / tokens_.size());
  double max_abs = 0;
  for (double v : l) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_GT(max_abs, 0.05);
  EXPECT_LT(max_abs, 100);
  EXPECT_NE(std::vector<double>(l.begin(), l.begin() + V),
            std::vector<double>(l.end() - V, l.end()));
}

TEST_F(TinyReference, ActivationsStayOrderOne) {
  std::vector<std::vector<double>> dump;
  run<double>(96, IndexKeySemantics::kOwner, &dump);
  ASSERT_EQ(dump.size(), 8u);
  for (std::size_t l = 0; l < dump.size(); ++l) {
    double s = 0;
    for (double v : dump[l]) s += v * v;
    const double rms = std::sqrt(s / double(dump[l].size()));
    EXPECT_GT(rms, 0.1) << "layer " << l;
    EXPECT_LT(rms, 20) << "layer " << l;
  }
}

TEST_F(TinyReference, VendorDiffersFromOwnerOnlyWhereSpecSays) {
  const auto owner_prefill = run<double>(96);
  const auto vendor_prefill = run<double>(96, IndexKeySemantics::kVendor);
  EXPECT_EQ(owner_prefill, vendor_prefill);  // prefill always publishes: identical
  const auto owner = run<double>(1);
  const auto vendor = run<double>(1, IndexKeySemantics::kVendor);
  const int64_t V = int64_t(owner.size() / tokens_.size());
  // First even position at which a ratio-2 layer sees more than index_topk (4) entries: P = 10.
  for (int64_t p = 0; p < 10; ++p)
    EXPECT_TRUE(
        std::equal(owner.begin() + p * V, owner.begin() + (p + 1) * V, vendor.begin() + p * V))
        << p;
  EXPECT_NE(owner, vendor);
}

TEST_F(TinyReference, Fp32TracksFp64) {
  const auto d = run<double>(96);
  const auto f = run<float>(96);
  const auto f_decode = run<float>(1);
  EXPECT_EQ(f, f_decode);  // per-position computation: fp32 is chunk-invariant too
  const int64_t V = int64_t(d.size() / tokens_.size());
  int agree = 0;
  double mean_dlp = 0;
  for (std::size_t r = 0; r < tokens_.size(); ++r) {
    auto lse = [&](auto get) {
      double mx = -1e300, s = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(get(v)));
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(get(v)) - mx);
      return mx + std::log(s);
    };
    const std::size_t o = r * std::size_t(V);
    const double ld = lse([&](int64_t v) { return d[o + std::size_t(v)]; });
    const double lf = lse([&](int64_t v) { return f[o + std::size_t(v)]; });
    int64_t ad = 0, af = 0;
    double dl = 0;
    for (int64_t v = 0; v < V; ++v) {
      if (d[o + std::size_t(v)] > d[o + std::size_t(ad)]) ad = v;
      if (f[o + std::size_t(v)] > f[o + std::size_t(af)]) af = v;
      dl += std::fabs((d[o + std::size_t(v)] - ld) - (double(f[o + std::size_t(v)]) - lf));
    }
    agree += ad == af;
    mean_dlp += dl / double(V);
  }
  mean_dlp /= double(tokens_.size());
  const double agreement = double(agree) / double(tokens_.size());
  std::printf("fp32 vs fp64 over %zu positions: argmax agreement %.4f, mean |dlogprob| %.3g\n",
              tokens_.size(), agreement, mean_dlp);
  EXPECT_GE(agreement, 0.98);
  EXPECT_LE(mean_dlp, 0.01);
}

TEST_F(TinyReference, BadTokenRefusedWithPosition) {
  auto m = ReferenceModel<double>::load(dir_->path() + "/ck", {});
  ASSERT_TRUE(m.is_ok());
  std::vector<double> logits;
  Status st = (*m)->forward({5, 1000000}, &logits);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("position 1"), std::string::npos) << st.message();
}

// The tiny-top1 preset routes to one expert in the backbone and in the DSpark stages. With top-1,
// norm_topk_prob cannot matter (DeepSeek renormalises only for top-k > 1): the logits must be the
// same with it set or cleared.
TEST(TopOneReference, NormTopkProbIsMootForOneExpert) {
  TempDir dir;
  MakeTinyOptions o;
  o.out_dir = dir.path() + "/ck";
  o.preset = "tiny-top1";
  o.seed = 4;
  ASSERT_TRUE(make_tiny_checkpoint(o).is_ok());
  const std::string cfg = testing::read_file(o.out_dir + "/config.json");
  for (const char* key : {"\"num_experts_per_tok\": 1,", "\"dspark_num_experts_per_tok\": 1,",
                          "\"norm_topk_prob\": true,"})
    ASSERT_NE(cfg.find(key), std::string::npos) << key << "\n" << cfg;
  // Backbone layers and DSpark stages alike route through ref::route with their own top-k.
  auto parsed = load_config(o.out_dir + "/config.json");
  ASSERT_TRUE(parsed.is_ok());
  auto plan = build_layer_plan(*parsed);
  ASSERT_TRUE(plan.is_ok());
  ASSERT_GT(plan->layers.size(), std::size_t(plan->num_backbone));
  for (const LayerPlan& p : plan->layers) EXPECT_EQ(p.experts_per_tok, 1) << p.index;
  const std::vector<int32_t> tokens = {5, 17, 300, 42, 9, 1000, 77, 3};
  auto logits = [&] {
    auto m = ReferenceModel<double>::load(o.out_dir, {});
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    std::vector<double> l;
    EXPECT_TRUE((*m)->forward(tokens, &l).is_ok());
    return l;
  };
  const auto with_norm = logits();
  std::string off = cfg;
  off.replace(off.find("\"norm_topk_prob\": true"), 22, "\"norm_topk_prob\": false");
  testing::write_file(o.out_dir + "/config.json", off);
  const auto without = logits();
  ASSERT_EQ(with_norm.size(), without.size());
  ASSERT_FALSE(with_norm.empty());
  EXPECT_EQ(with_norm, without);
}

}  // namespace
}  // namespace dsv41
