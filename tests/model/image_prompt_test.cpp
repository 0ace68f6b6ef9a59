// Images merged into the reference's prompt (spec §9.1), on the tiny preset: the span's layout;
// the delimiter vectors and the aligner's rows reach exactly the positions they fill; image
// positions select experts with gate.bias_vl (text never does); Engram passes image positions
// unchanged; the result does not depend on how the prompt is split into calls around the spans;
// fp32 tracks fp64 with the tower's own rows; misuse is refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/test_util.h"
#include "model/config.h"
#include "model/layer_plan.h"
#include "model/reference/reference_model.h"
#include "model/reference/vision_tower.h"
#include "model/tensor_names.h"
#include "model/tiny_checkpoint.h"
#include "patch_checkpoint.h"
#include "vision/preprocess.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using testing::patch_tensor;
using testing::TempDir;

class ImagePrompt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    MakeTinyOptions o;
    o.out_dir = dir_->path() + "/ck";
    o.seed = 31;
    ASSERT_TRUE(make_tiny_checkpoint(o).is_ok());
    cfg_ = new ModelConfig(load_config(o.out_dir + "/config.json").value());
    plan_ = new ModelPlan(build_layer_plan(*cfg_).value());
  }
  static void TearDownTestSuite() {
    delete plan_;
    delete cfg_;
    delete dir_;
  }
  static std::string ck() { return dir_->path() + "/ck"; }
  // A copy of the checkpoint to patch.
  static std::string copy(const std::string& name) {
    const std::string to = dir_->path() + "/" + name;
    fs::remove_all(to);
    fs::copy(ck(), to, fs::copy_options::recursive);
    return to;
  }
  static int64_t D() { return cfg_->text.hidden_size; }
  static int32_t img_id() { return int32_t(cfg_->image_token_id); }

  // An image of llm_w x llm_h rows of random values at `start`, and the prompt around it:
  // `before` text tokens, the span, `after` text tokens.
  template <typename T>
  static PromptImage<T> image(int64_t start, int64_t w, int64_t h, uint64_t seed) {
    PromptImage<T> im;
    im.start = start, im.llm_w = w, im.llm_h = h;
    Rng rng(seed);
    for (int64_t i = 0; i < w * h * D(); ++i) im.rows.push_back(T(rng.uniform() * 2 - 1));
    return im;
  }
  static std::vector<int32_t> prompt(const std::vector<int32_t>& before, int64_t span,
                                     const std::vector<int32_t>& after) {
    std::vector<int32_t> ids = before;
    ids.insert(ids.end(), std::size_t(span), img_id());
    ids.insert(ids.end(), after.begin(), after.end());
    return ids;
  }

  template <typename T>
  static std::vector<T> run(const std::string& dir, const std::vector<int32_t>& ids,
                            const std::vector<PromptImage<T>>& images,
                            std::vector<TraceEvent>* trace = nullptr, int64_t first_call = -1) {
    auto m = ReferenceModel<T>::load(dir, {});
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    if (!m.is_ok()) return {};
    (*m)->set_trace(trace);
    std::vector<T> logits;
    const std::size_t n0 = first_call < 0 ? ids.size() : std::size_t(first_call);
    Status st = (*m)->forward({ids.begin(), ids.begin() + long(n0)}, images, &logits);
    EXPECT_TRUE(st.is_ok()) << st.message();
    for (std::size_t t = n0; t < ids.size(); ++t)  // the rest one token at a time
      EXPECT_TRUE((*m)->forward({ids[t]}, &logits).is_ok());
    return logits;
  }

  // Rows [0, n) of two logits matrices: equal (bit for bit) before `from`, different at `from`.
  template <typename T>
  static void equal_before_different_at(const std::vector<T>& a, const std::vector<T>& b,
                                        int64_t from) {
    const int64_t V = cfg_->text.vocab_size;
    ASSERT_EQ(a.size(), b.size());
    for (int64_t t = 0; t < from; ++t)
      EXPECT_EQ(0, std::memcmp(a.data() + t * V, b.data() + t * V, std::size_t(V) * sizeof(T)))
          << "row " << t;
    EXPECT_NE(0, std::memcmp(a.data() + from * V, b.data() + from * V, std::size_t(V) * sizeof(T)))
        << "row " << from;
  }

  static TempDir* dir_;
  static ModelConfig* cfg_;
  static ModelPlan* plan_;
};
TempDir* ImagePrompt::dir_ = nullptr;
ModelConfig* ImagePrompt::cfg_ = nullptr;
ModelPlan* ImagePrompt::plan_ = nullptr;

TEST_F(ImagePrompt, SpanKindsFollowTheLayout) {
  using K = SpanKind;
  PromptImage<double> im;
  im.start = 3, im.llm_w = 2, im.llm_h = 2;
  ASSERT_EQ(im.span(), 8);
  const std::vector<K> want = {K::kText,         K::kImageStart, K::kImage, K::kImage,
                               K::kImageNewline, K::kImage,      K::kImage, K::kImageNewline,
                               K::kImageEnd,     K::kText};
  EXPECT_EQ(span_kinds<double>({im}, 2, 10), want);
  // A window of the call that starts inside the span.
  EXPECT_EQ(span_kinds<double>({im}, 6, 3),
            (std::vector<K>{K::kImageNewline, K::kImage, K::kImage}));
}

TEST_F(ImagePrompt, DelimitersAndRowsFillExactlyTheirPositions) {
  // Text, a 2 x 2 image (span 8 at positions 2..9: start 2, rows 3 4, newline 5, rows 6 7,
  // newline 8, end 9), text.
  const auto img = image<double>(2, 2, 2, 7);
  const auto ids = prompt({5, 6}, img.span(), {9, 10, 11});
  const auto base = run<double>(ck(), ids, {img});
  // One aligner row changed (the second row: position 4): the same logits before it.
  auto other = img;
  for (int64_t c = 0; c < D(); ++c) other.rows[std::size_t(D() + c)] += 0.5;
  equal_before_different_at(base, run<double>(ck(), ids, {other}), 4);
  // The newline vector changed: the same logits before the first newline (position 5).
  const std::string nl = copy("newline");
  patch_tensor(nl, "image_newline", [](std::vector<uint8_t>* b) {
    for (std::size_t i = 1; i < b->size(); i += 2) (*b)[i] ^= 0x80;  // bf16 sign bits
  });
  equal_before_different_at(base, run<double>(nl, ids, {img}), 5);
  // image_start changed: differs from the span's first position.
  const std::string st = copy("start");
  patch_tensor(st, "image_start", [](std::vector<uint8_t>* b) {
    for (std::size_t i = 1; i < b->size(); i += 2) (*b)[i] ^= 0x80;
  });
  equal_before_different_at(base, run<double>(st, ids, {img}), 2);
  // Without the image the same token ids are plain text: other logits from position 2 on.
  equal_before_different_at(base, run<double>(ck(), ids, {}), 2);
}

TEST_F(ImagePrompt, ImagePositionsSelectExpertsWithBiasVl) {
  // A copy whose bias_vl equals bias in every layer: image positions then select as text does.
  const std::string same = copy("same_bias");
  for (const LayerPlan& p : plan_->layers) {
    if (p.dspark_stage >= 0) continue;
    const BlockTensorNames n = block_tensor_names(p);
    auto ckpt = Checkpoint::open(ck());
    ASSERT_TRUE(ckpt.is_ok());
    const auto bias = ckpt->bytes(n.gate_bias);
    std::vector<uint8_t> copy_of(bias.begin(), bias.end());
    patch_tensor(same, n.gate_bias_vl, [&](std::vector<uint8_t>* b) { *b = copy_of; });
  }
  const auto img = image<double>(1, 2, 2, 9);
  const auto ids = prompt({5}, img.span(), {9, 10});
  // Text alone: bias_vl is never read.
  const std::vector<int32_t> text = {5, 6, 7, 8, 9, 10};
  const auto ta = run<double>(ck(), text, {}), tb = run<double>(same, text, {});
  EXPECT_EQ(0, std::memcmp(ta.data(), tb.data(), ta.size() * sizeof(double)));
  // With the image: layer 0's MoE inputs are the same in both runs, so its scores are; the
  // selection ranked score + bias_vl at image positions and score + bias at text ones.
  std::vector<TraceEvent> tra, trb;
  const auto la = run<double>(ck(), ids, {img}, &tra);
  const auto lb = run<double>(same, ids, {img}, &trb);
  EXPECT_NE(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(double)))
      << "bias_vl and bias select the same experts everywhere: the test shows nothing";
  const LayerPlan& p0 = plan_->layers[0];
  auto ckpt = Checkpoint::open(ck());
  ASSERT_TRUE(ckpt.is_ok());
  auto f32s = [&](const std::string& name) {
    const auto b = ckpt->bytes(name);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  const auto bias = f32s(block_tensor_names(p0).gate_bias);
  const auto bias_vl = f32s(block_tensor_names(p0).gate_bias_vl);
  const std::vector<SpanKind> kind = span_kinds<double>({img}, 0, int64_t(ids.size()));
  int checked_image = 0, checked_text = 0;
  for (std::size_t i = 0; i < tra.size(); ++i) {
    const TraceEvent &a = tra[i], &b = trb[i];
    ASSERT_EQ(a.site, b.site);
    if (a.site != TraceSite::kExperts || a.layer != 0) continue;
    const bool image_pos = kind[std::size_t(a.pos)] != SpanKind::kText;
    for (std::size_t e = 0; e < a.detail.size(); ++e) {
      if (image_pos)
        EXPECT_NEAR(a.detail[e] - bias_vl[e], b.detail[e] - bias[e], 1e-12) << a.pos << " " << e;
      else
        EXPECT_EQ(a.detail[e], b.detail[e]) << a.pos << " " << e;
    }
    ++(image_pos ? checked_image : checked_text);
  }
  EXPECT_EQ(checked_image, img.span());
  EXPECT_EQ(checked_text, 3);
}

TEST_F(ImagePrompt, EngramPassesImagePositionsUnchanged) {
  // Every Engram table's values negated: text positions change, a span at position 0 does not.
  const std::string neg = copy("engram");
  int tables = 0;
  for (const LayerPlan& p : plan_->layers) {
    if (p.engram < 0 || p.dspark_stage >= 0) continue;
    patch_tensor(neg, block_tensor_names(p).e_embed + ".weight", [](std::vector<uint8_t>* b) {
      for (auto& c : *b) c ^= 0x80;  // E4M3 sign bits
    });
    ++tables;
  }
  ASSERT_GT(tables, 0) << "the tiny preset has no Engram layer";
  const auto img = image<double>(0, 3, 2, 11);
  const auto ids = prompt({}, img.span(), {9, 10});
  equal_before_different_at(run<double>(ck(), ids, {img}), run<double>(neg, ids, {img}),
                            img.span());
}

TEST_F(ImagePrompt, TheCallsAfterTheSpansDoNotChangeTheResult) {
  const auto a = image<double>(1, 2, 1, 3), b = image<double>(7, 1, 2, 4);
  const auto ids = [&] {
    auto v = prompt({5}, a.span(), {7});
    v.insert(v.end(), std::size_t(b.span()), img_id());
    for (int32_t t : {9, 10, 11}) v.push_back(t);
    return v;
  }();
  ASSERT_EQ(b.start, 1 + a.span() + 1);
  const int64_t spans_end = b.start + b.span();
  const auto whole = run<double>(ck(), ids, {a, b});
  const auto stepped = run<double>(ck(), ids, {a, b}, nullptr, spans_end);
  ASSERT_EQ(whole.size(), stepped.size());
  EXPECT_EQ(0, std::memcmp(whole.data(), stepped.data(), whole.size() * sizeof(double)));
}

TEST_F(ImagePrompt, Fp32TracksFp64WithTheTowersRows) {
  auto ckpt = Checkpoint::open(ck());
  ASSERT_TRUE(ckpt.is_ok());
  RgbImage px;
  px.width = 80, px.height = 60;
  px.rgb.resize(std::size_t(80 * 60 * 3));
  for (int64_t y = 0; y < 60; ++y)
    for (int64_t x = 0; x < 80; ++x)
      for (int c = 0; c < 3; ++c) px.row(y)[x * 3 + c] = uint8_t((x * 5 + y * 9 + c * 70) % 256);
  ImagePlanOptions o;
  o.min_pixels = cfg_->vision->min_pixels;
  o.max_tokens = cfg_->vision->max_image_tokens;
  const ImagePlan plan = plan_image_grid(80, 60, o);
  const auto patches = patch_tensor(plan_pixels(px, plan), 14);
  auto tower = [&](auto zero) {
    using T = decltype(zero);
    PromptImage<T> im;
    im.start = 2, im.llm_w = plan.llm_w, im.llm_h = plan.llm_h;
    im.rows = ref::vision_tower<T>(*ckpt, *cfg_, patches, plan.vit_w, plan.vit_h).aligned.v;
    return im;
  };
  const auto i64 = tower(0.0);
  const auto i32 = tower(0.0f);
  const auto ids = prompt({5, 6}, i64.span(), {9, 10, 11});
  const auto l64 = run<double>(ck(), ids, {i64});
  const auto l32 = run<float>(ck(), ids, {i32});
  ASSERT_EQ(l64.size(), l32.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < l64.size(); ++i)
    num += (l32[i] - l64[i]) * (l32[i] - l64[i]), den += l64[i] * l64[i];
  EXPECT_LT(std::sqrt(num / den), 1e-4);
  for (double v : l64) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(ImagePrompt, MisuseIsRefusedWithAMessage) {
  auto m = ReferenceModel<double>::load(ck(), {});
  ASSERT_TRUE(m.is_ok());
  std::vector<double> logits;
  const auto img = image<double>(1, 2, 2, 5);
  auto ids = prompt({5}, img.span(), {9});
  auto refused = [&](const std::vector<int32_t>& t, const std::vector<PromptImage<double>>& i,
                     const std::string& words) {
    (*m)->reset();
    Status st = (*m)->forward(t, i, &logits);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
  };
  auto wrong = ids;
  wrong[3] = 7;
  refused(wrong, {img}, "position 3 of its span holds token 7");
  auto short_rows = img;
  short_rows.rows.pop_back();
  refused(ids, {short_rows}, "rows must be");
  refused({ids.begin(), ids.begin() + 5}, {img}, "leaves the call");
  refused(ids, {img, img}, "overlaps");
}

// A span in a call after the first (DeepSeek merges images at position 0 only; here any call may
// carry them): the same bits as the whole prompt in one call.
TEST_F(ImagePrompt, ASpanInALaterCallGivesTheSameBits) {
  const auto img = image<double>(3, 2, 2, 8);
  const auto ids = prompt({5, 6, 7}, img.span(), {9, 10});
  const auto whole = run<double>(ck(), ids, {img});
  auto m = ReferenceModel<double>::load(ck(), {});
  ASSERT_TRUE(m.is_ok());
  std::vector<double> logits;
  ASSERT_TRUE((*m)->forward({ids.begin(), ids.begin() + 3}, &logits).is_ok());
  auto later = img;
  later.start = 0;  // the call's first token
  Status st = (*m)->forward({ids.begin() + 3, ids.end()}, {later}, &logits);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_EQ(logits.size(), whole.size());
  EXPECT_EQ(0, std::memcmp(logits.data(), whole.data(), whole.size() * sizeof(double)));
}

}  // namespace
}  // namespace dsv41
