// The reference's DSpark drafter (design.md §9) on the tiny preset: the target is untouched by
// drafting; the drafter depends only on consumed positions, not on how the target was split; the
// Markov bias follows the greedy chain (checked against the checkpoint's own tensors); the
// confidence reads the chain's embedding; the block attends itself non-causally; fp32 tracks fp64;
// misuse is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/test_util.h"
#include "model/config.h"
#include "model/reference/reference_model.h"
#include "model/reference/reference_weights.h"
#include "model/tiny_checkpoint.h"
#include "patch_checkpoint.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using testing::patch_tensor;
using testing::TempDir;

template <typename T>
struct Schedule {
  std::vector<T> target, drafts, confidence;
  std::vector<int32_t> ids;
};

// design.md §9's schedule: prefill tokens[0:P], then per step i = P..T-2 decode tokens[i] and draft
// with tokens[i+1].
template <typename T>
Schedule<T> run_schedule(const std::string& dir, const std::vector<int32_t>& tokens, int64_t P,
                         bool dspark = true) {
  ReferenceOptions opt;
  opt.dspark = dspark;
  auto m = ReferenceModel<T>::load(dir, opt);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  Schedule<T> s;
  if (!m.is_ok()) return s;
  EXPECT_TRUE((*m)->forward({tokens.begin(), tokens.begin() + P}, &s.target).is_ok());
  DraftStep<T> d;
  for (int64_t i = P; i + 1 < int64_t(tokens.size()); ++i) {
    EXPECT_TRUE((*m)->forward({tokens[std::size_t(i)]}, &s.target).is_ok());
    if (!dspark) continue;
    Status st = (*m)->draft(tokens[std::size_t(i + 1)], &d);
    EXPECT_TRUE(st.is_ok()) << st.message();
    s.drafts.insert(s.drafts.end(), d.logits.begin(), d.logits.end());
    s.ids.insert(s.ids.end(), d.ids.begin(), d.ids.end());
    s.confidence.insert(s.confidence.end(), d.confidence.begin(), d.confidence.end());
  }
  return s;
}

class DsparkReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    MakeTinyOptions o;
    o.out_dir = dir_->path() + "/ck";
    o.seed = 23;
    ASSERT_TRUE(make_tiny_checkpoint(o).is_ok());
    auto cfg = load_config(o.out_dir + "/config.json");
    ASSERT_TRUE(cfg.is_ok());
    tc_ = new TextConfig(cfg->text);
    ASSERT_GT(tc_->num_nextn_predict_layers, 1) << "the test wants a chain of stages";
    Rng rng(8);
    tokens_.clear();
    for (int i = 0; i < 30; ++i) tokens_.push_back(int32_t(3 + rng.below(1000)));
    base_ = new Schedule<double>(run_schedule<double>(ck(), tokens_, kP));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete tc_;
    delete base_;
  }
  static std::string ck() { return dir_->path() + "/ck"; }
  // A copy of the checkpoint to tamper with.
  static std::string copy(const std::string& name) {
    const std::string to = dir_->path() + "/" + name;
    fs::remove_all(to);
    fs::copy(ck(), to, fs::copy_options::recursive);
    return to;
  }
  static int64_t steps() { return int64_t(tokens_.size()) - 1 - kP; }

  static constexpr int64_t kP = 12;
  static TempDir* dir_;
  static TextConfig* tc_;
  static std::vector<int32_t> tokens_;
  static Schedule<double>* base_;
};
TempDir* DsparkReference::dir_ = nullptr;
TextConfig* DsparkReference::tc_ = nullptr;
std::vector<int32_t> DsparkReference::tokens_;
Schedule<double>* DsparkReference::base_ = nullptr;

TEST_F(DsparkReference, ShapesAndChainOfIds) {
  const int64_t B = tc_->dspark_block_size, V = tc_->vocab_size, N = steps();
  ASSERT_EQ(int64_t(base_->drafts.size()), N * B * V);
  ASSERT_EQ(int64_t(base_->ids.size()), N * (B + 1));
  ASSERT_EQ(int64_t(base_->confidence.size()), N * B);
  for (double v : base_->drafts) ASSERT_TRUE(std::isfinite(v));
  for (int64_t s = 0; s < N; ++s) {
    const int32_t* ids = base_->ids.data() + s * (B + 1);
    EXPECT_EQ(ids[0], tokens_[std::size_t(kP + s + 1)]) << "step " << s;
    for (int64_t j = 0; j < B; ++j) {  // ids[j+1] = argmax of row j, ties to the lowest index
      const double* row = base_->drafts.data() + (s * B + j) * V;
      EXPECT_EQ(ids[j + 1], int32_t(std::max_element(row, row + V) - row)) << s << "," << j;
    }
  }
}

TEST_F(DsparkReference, DraftingLeavesTheTargetBitIdentical) {
  const auto plain = run_schedule<double>(ck(), tokens_, kP, /*dspark=*/false);
  ASSERT_EQ(plain.target.size(), base_->target.size());
  EXPECT_EQ(plain.target, base_->target);
  // ... and the target's own logits equal a single prefill's (the schedule changes nothing).
  auto m = ReferenceModel<double>::load(ck(), {});
  ASSERT_TRUE(m.is_ok());
  std::vector<double> prefill;
  ASSERT_TRUE((*m)->forward({tokens_.begin(), tokens_.end() - 1}, &prefill).is_ok());
  EXPECT_EQ(prefill, base_->target);
}

TEST_F(DsparkReference, DrafterDependsOnPositionsNotOnThePrefillSplit) {
  // P = 4 drafts more steps; from step i = kP on, both must agree bit for bit (the drafter reads
  // the target only through its consumed positions).
  const auto early = run_schedule<double>(ck(), tokens_, 4);
  const int64_t B = tc_->dspark_block_size, V = tc_->vocab_size, skip = kP - 4;
  ASSERT_EQ(int64_t(early.drafts.size()), (steps() + skip) * B * V);
  EXPECT_TRUE(
      std::equal(base_->drafts.begin(), base_->drafts.end(), early.drafts.begin() + skip * B * V));
  EXPECT_TRUE(std::equal(base_->ids.begin(), base_->ids.end(), early.ids.begin() + skip * (B + 1)));
  EXPECT_TRUE(std::equal(base_->confidence.begin(), base_->confidence.end(),
                         early.confidence.begin() + skip * B));
}

TEST_F(DsparkReference, MarkovBiasFollowsTheChain) {
  // With markov_head.head zeroed the bias vanishes and nothing else changes: the difference of the
  // two runs' rows must be markov_head.head . markov_head.embed[ids[j]], with ids the chain of the
  // run that has the bias (ids[0] the next token, ids[j] the previous row's draft).
  const int S = int(tc_->num_nextn_predict_layers);
  const std::string last = "mtp." + std::to_string(S - 1) + ".";
  const std::string flat = copy("no_markov");
  patch_tensor(flat, last + "markov_head.head.weight",
               [](std::vector<uint8_t>* b) { std::fill(b->begin(), b->end(), uint8_t(0)); });
  const auto plain = run_schedule<double>(flat, tokens_, kP);
  auto ckpt = Checkpoint::open(ck());
  ASSERT_TRUE(ckpt.is_ok());
  const ref::WeightReader rd(*ckpt, {128, 128});
  const ref::WeightView emb = rd.mat(last + "markov_head.embed.weight");
  const ref::WeightView head = rd.mat(last + "markov_head.head.weight");
  const int64_t B = tc_->dspark_block_size, V = tc_->vocab_size, R = tc_->dspark_markov_rank;
  std::vector<double> e(static_cast<std::size_t>(R)), bias(static_cast<std::size_t>(V));
  double worst = 0, scale = 0;
  for (int64_t s = 0; s < steps(); ++s)
    for (int64_t j = 0; j < B; ++j) {
      emb.row(base_->ids[std::size_t(s * (B + 1) + j)], e.data());
      ref::matvec(head, e.data(), bias.data());
      for (int64_t v = 0; v < V; ++v) {
        const std::size_t i = std::size_t((s * B + j) * V + v);
        worst =
            std::max(worst, std::fabs(base_->drafts[i] - plain.drafts[i] - bias[std::size_t(v)]));
        scale = std::max(scale, std::fabs(bias[std::size_t(v)]));
      }
    }
  ASSERT_GT(scale, 1e-3);
  EXPECT_LE(worst, 1e-12 * std::max(1.0, scale));
  // Row 0 of a chain whose first id differs gets a different bias: the chain matters.
  EXPECT_NE(base_->drafts, plain.drafts);
}

TEST_F(DsparkReference, ConfidenceReadsTheChainEmbedding) {
  // With the confidence head's hidden part zeroed, confidence[j] = proj[D:] . embed[ids[j]].
  const int S = int(tc_->num_nextn_predict_layers);
  const std::string last = "mtp." + std::to_string(S - 1) + ".";
  const int64_t D = tc_->hidden_size, B = tc_->dspark_block_size, R = tc_->dspark_markov_rank;
  const std::string half = copy("embed_only_confidence");
  patch_tensor(half, last + "confidence_head.proj.weight", [&](std::vector<uint8_t>* b) {
    std::fill(b->begin(), b->begin() + D * 2, uint8_t(0));  // bf16: the first D values
  });
  const auto c = run_schedule<double>(half, tokens_, kP);
  EXPECT_EQ(c.ids, base_->ids);  // the chain does not read the confidence head
  auto ckpt = Checkpoint::open(half);
  ASSERT_TRUE(ckpt.is_ok());
  const ref::WeightReader rd(*ckpt, {128, 128});
  std::vector<double> proj(std::size_t(D + R)), e(static_cast<std::size_t>(R));
  rd.mat(last + "confidence_head.proj.weight").row(0, proj.data());
  const ref::WeightView emb = rd.mat(last + "markov_head.embed.weight");
  for (int64_t s = 0; s < steps(); ++s)
    for (int64_t j = 0; j < B; ++j) {
      emb.row(c.ids[std::size_t(s * (B + 1) + j)], e.data());
      double want = 0;
      for (int64_t r = 0; r < R; ++r) want += proj[std::size_t(D + r)] * e[std::size_t(r)];
      EXPECT_NEAR(c.confidence[std::size_t(s * B + j)], want, 1e-12 * (1 + std::fabs(want)))
          << s << "," << j;
    }
  EXPECT_NE(c.confidence, base_->confidence);  // the hidden part counted before
}

TEST_F(DsparkReference, BlockAttendsItselfNotCausally) {
  // Another noise id changes only rows 1.. of the block's input; row 0 (the next token's) still
  // changes, because every block position attends every other.
  const std::string other = copy("other_noise");
  const std::string path = other + "/config.json";
  std::string cfg = testing::read_file(path);
  const std::string key = "\"dspark_noise_token_id\": ";
  const std::size_t at = cfg.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::size_t end = cfg.find_first_of(",\n}", at + key.size());
  const int64_t noise = std::stoll(cfg.substr(at + key.size(), end - at - key.size()));
  ASSERT_EQ(noise, tc_->dspark_noise_token_id);
  cfg.replace(at + key.size(), end - at - key.size(), std::to_string(noise == 7 ? 8 : 7));
  testing::write_file(path, cfg);
  const auto n = run_schedule<double>(other, tokens_, kP);
  EXPECT_EQ(n.target, base_->target);
  const int64_t B = tc_->dspark_block_size, V = tc_->vocab_size;
  for (int64_t s = 0; s < steps(); ++s) {
    const std::size_t r0 = std::size_t(s * B * V);
    EXPECT_FALSE(std::equal(n.drafts.begin() + long(r0), n.drafts.begin() + long(r0 + V),
                            base_->drafts.begin() + long(r0)))
        << "step " << s << ": row 0 did not see the rest of the block";
  }
}

TEST_F(DsparkReference, Fp32TracksFp64) {
  const auto f = run_schedule<float>(ck(), tokens_, kP);
  const int64_t B = tc_->dspark_block_size, V = tc_->vocab_size;
  ASSERT_EQ(f.drafts.size(), base_->drafts.size());
  // Early steps, before any rounding flip: relative error per row small; ids identical.
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t j = 0; j < B; ++j) {
      double num = 0, den = 0;
      for (int64_t v = 0; v < V; ++v) {
        const std::size_t i = std::size_t((s * B + j) * V + v);
        num = std::max(num, std::fabs(double(f.drafts[i]) - base_->drafts[i]));
        den = std::max(den, std::fabs(base_->drafts[i]));
      }
      EXPECT_LE(num / den, 1e-4) << "step " << s << " row " << j;
    }
  EXPECT_TRUE(std::equal(f.ids.begin(), f.ids.begin() + 3 * (B + 1), base_->ids.begin()));
}

TEST_F(DsparkReference, MisuseIsRefused) {
  auto plain = ReferenceModel<double>::load(ck(), {});
  ASSERT_TRUE(plain.is_ok());
  DraftStep<double> d;
  std::vector<double> l;
  ASSERT_TRUE((*plain)->forward({5, 6}, &l).is_ok());
  Status st = (*plain)->draft(7, &d);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("without its DSpark drafter"), std::string::npos) << st.message();
  ReferenceOptions opt;
  opt.dspark = true;
  auto m = ReferenceModel<double>::load(ck(), opt);
  ASSERT_TRUE(m.is_ok());
  st = (*m)->draft(7, &d);
  EXPECT_NE(st.message().find("consumed no token"), std::string::npos) << st.message();
  ASSERT_TRUE((*m)->forward({5}, &l).is_ok());
  st = (*m)->draft(int32_t(tc_->vocab_size), &d);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  EXPECT_TRUE((*m)->draft(7, &d).is_ok());
  // A checkpoint without stages refuses to load the drafter, naming the field.
  TempDir none;
  MakeTinyOptions o;
  o.out_dir = none.path() + "/ck";
  o.config_patch = R"({"text_config": {"num_hidden_layers": 6, "num_nextn_predict_layers": 0,
      "compress_ratios": [0, 1, 1, 1, 1, 1], "kv_source_layer_ids": [1],
      "index_source_layer_ids": [1, 3], "candidate_source_layer_id": null,
      "engram_layer_ids": [], "dspark_target_layer_ids": []}})";
  auto made = make_tiny_checkpoint(o);
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  auto refused = ReferenceModel<double>::load(o.out_dir, opt);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("num_nextn_predict_layers"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace dsv41
