// The reference vision tower (model/reference/vision_tower.h) on the tiny preset's tower: fp32
// tracks fp64, the shapes follow the plan, every patch reaches every output row (full attention),
// and the aligner's unshuffle orders features channel first with zeros past the grid.
#include <gtest/gtest.h>

#include <cmath>

#include "io/checkpoint.h"
#include "io/test_util.h"
#include "model/config.h"
#include "model/reference/vision_tower.h"
#include "model/tiny_checkpoint.h"
#include "vision/preprocess.h"

namespace dsv41 {
namespace {

using testing::TempDir;

struct Tiny {
  TempDir dir;
  ModelConfig cfg;
  std::optional<Checkpoint> ck;
  Tiny() {
    MakeTinyOptions o;
    o.out_dir = dir.path() + "/ck";
    o.seed = 5;
    o.preset = "tiny";
    o.threads = 2;
    EXPECT_TRUE(make_tiny_checkpoint(o).is_ok());
    cfg = load_config(o.out_dir + "/config.json").value();
    auto c = Checkpoint::open(o.out_dir);
    EXPECT_TRUE(c.is_ok());
    ck.emplace(std::move(*c));
  }
};

// A smooth test image of w x h with an edge, through the tiny plan to its patch rows.
std::vector<uint16_t> patches_of(int64_t w, int64_t h, const ModelConfig& cfg, ImagePlan* plan) {
  RgbImage im;
  im.width = w, im.height = h;
  im.rgb.resize(std::size_t(w * h * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) im.row(y)[x * 3 + c] = uint8_t((x * 7 + y * 3 + c * 50) % 256);
  ImagePlanOptions o;
  o.min_pixels = cfg.vision->min_pixels;
  o.max_tokens = cfg.vision->max_image_tokens;
  *plan = plan_image_grid(w, h, o);
  return patch_tensor(plan_pixels(im, *plan), 14);
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

TEST(VisionTower, Fp32TracksFp64AndTheShapesFollowThePlan) {
  Tiny t;
  ImagePlan plan;
  const auto p = patches_of(70, 50, t.cfg, &plan);
  const auto f = ref::vision_tower<float>(*t.ck, t.cfg, p, plan.vit_w, plan.vit_h);
  const auto d = ref::vision_tower<double>(*t.ck, t.cfg, p, plan.vit_w, plan.vit_h);
  EXPECT_EQ(f.vit.rows, plan.vit_w * plan.vit_h);
  EXPECT_EQ(f.vit.cols, t.cfg.vision->hidden_size);
  EXPECT_EQ(f.aligned.rows, plan.llm_w * plan.llm_h);
  EXPECT_EQ(f.aligned.cols, t.cfg.text.hidden_size);
  for (float v : f.aligned.v) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(rel_l2(f.vit.v, d.vit.v), 1e-5);
  EXPECT_LT(rel_l2(f.aligned.v, d.aligned.v), 1e-5);
  // Deterministic.
  const auto again = ref::vision_tower<float>(*t.ck, t.cfg, p, plan.vit_w, plan.vit_h);
  EXPECT_EQ(again.aligned.v, f.aligned.v);
}

TEST(VisionTower, EveryPatchReachesEveryRow) {
  Tiny t;
  ImagePlan plan;
  auto p = patches_of(70, 50, t.cfg, &plan);
  const auto base = ref::vision_tower<double>(*t.ck, t.cfg, p, plan.vit_w, plan.vit_h);
  // Change the last patch only: through full bidirectional attention the first patch's row moves.
  const std::size_t row = 588;
  for (std::size_t i = p.size() - row; i < p.size(); ++i) p[i] = 0x3f80;  // 1.0 in bf16
  const auto moved = ref::vision_tower<double>(*t.ck, t.cfg, p, plan.vit_w, plan.vit_h);
  double diff = 0;
  for (int64_t c = 0; c < base.vit.cols; ++c)
    diff = std::max(diff, std::abs(base.vit.row(0)[c] - moved.vit.row(0)[c]));
  EXPECT_GT(diff, 1e-6);
}

TEST(VisionTower, UnshuffleIsChannelFirstWithZerosPastTheGrid) {
  // A 4 x 5 grid (rows x columns) of 2-channel rows holding 100 * y + 10 * x + c.
  ref::Mat<double> vit;
  vit.rows = 20, vit.cols = 2;
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 5; ++x)
      for (int64_t c = 0; c < 2; ++c) vit.v.push_back(100.0 * y + 10.0 * x + double(c));
  std::vector<double> f(18);
  ref::unshuffle_row(vit, 5, 4, 3, 1, 1, f.data());  // rows 3-5, columns 3-5 of the grid
  EXPECT_EQ(f[0 * 9 + 0 * 3 + 0], 330);              // c 0, (y 3, x 3)
  EXPECT_EQ(f[0 * 9 + 0 * 3 + 1], 340);              // c 0, (3, 4)
  EXPECT_EQ(f[0 * 9 + 0 * 3 + 2], 0);                // x 5: past the grid
  EXPECT_EQ(f[1 * 9 + 0 * 3 + 1], 341);              // c 1, (3, 4)
  EXPECT_EQ(f[1 * 9 + 1 * 3 + 0], 0);                // y 4: past the grid
  ref::unshuffle_row(vit, 5, 4, 3, 0, 0, f.data());
  EXPECT_EQ(f[0 * 9 + 2 * 3 + 1], 210);  // c 0, (2, 1)
  EXPECT_EQ(f[1 * 9 + 1 * 3 + 2], 121);  // c 1, (1, 2)
}

}  // namespace
}  // namespace dsv41
