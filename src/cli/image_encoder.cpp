// The image encoder of `serve` (image_encoder.h).
#include "cli/image_encoder.h"

#include <mutex>

#include "cli/prompt_images.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "model/inventory.h"
#include "model/reference/vision_tower.h"
#include "server/image_inputs.h"
#include "vision/image_decode.h"

namespace dsv41::cli {
namespace {

// What one encoder holds: the tower and what it reads, and a lock (one image at a time: the
// tower's buffers are per call, but two images at once would only share the cores).
struct TowerState {
  ModelConfig cfg;
  std::unique_ptr<ConvertedWeights> weights;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<FastVisionTower> fast;
  std::optional<Checkpoint> official;  // --path reference
  std::mutex mu;
};

Result<EncodedImage> encode(TowerState& s, std::string_view file) {
  auto img = decode_image(file);
  if (!img) return img.status();
  const ImagePlanOptions o = image_plan_options(*s.cfg.vision);
  const ImagePlan plan = plan_image_grid(img->width, img->height, o);
  const std::vector<uint16_t> patches = patch_tensor(plan_pixels(*img, plan), o.patch);
  std::vector<float> rows;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    rows = s.fast ? s.fast->encode(patches, plan.vit_w, plan.vit_h).aligned
                  : ref::vision_tower<float>(*s.official, s.cfg, patches, plan.vit_w, plan.vit_h)
                        .aligned.v;
  }
  EncodedImage e;
  e.llm_w = int32_t(plan.llm_w);
  e.llm_h = int32_t(plan.llm_h);
  e.rows = std::make_shared<const std::vector<float>>(std::move(rows));
  return e;
}

}  // namespace

Result<std::shared_ptr<const ImageEncoder>> make_image_encoder(const EngineOptions& eo) {
  auto s = std::make_shared<TowerState>();
  auto cfg = load_config(eo.model_dir + "/config.json");
  if (!cfg) return cfg.status();
  if (!cfg->vision) return std::shared_ptr<const ImageEncoder>();
  s->cfg = *cfg;
  if (eo.path == "reference") {
    auto ck = Checkpoint::open(eo.model_dir);
    if (!ck) return ck.status();
    const InventoryReport rep = check_inventory(expected_vision_tensors(s->cfg), *ck);
    if (!rep.missing.empty() || !rep.wrong_shape.empty() || !rep.wrong_dtype.empty())
      return Status::error(eo.model_dir + ": the vision tower's tensors: " + rep.summary());
    s->official.emplace(std::move(*ck));
  } else {
    auto w = ConvertedWeights::open(eo.model_dir, false);
    if (!w) return w.status();
    s->weights = std::move(*w);
    s->pool = std::make_unique<ThreadPool>(std::size_t(std::max(0, eo.fast.threads)));
    auto t = FastVisionTower::create(*s->weights, *s->pool);
    if (!t) return t.status();
    s->fast = std::move(*t);
  }
  return std::make_shared<const ImageEncoder>(
      [s](std::string_view file) { return encode(*s, file); });
}

}  // namespace dsv41::cli
