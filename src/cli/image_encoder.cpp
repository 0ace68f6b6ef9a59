// The image encoder of `serve` (image_encoder.h).
#include "cli/image_encoder.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "cli/prompt_images.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/sha256.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "model/inventory.h"
#include "model/reference/vision_tower.h"
#include "server/image_inputs.h"
#include "vision/image_decode.h"

namespace dsv41::cli {
namespace {

// What one encoder holds: the tower and what it reads, a lock (one image at a time: two at once
// would only share the cores), and the cache of encoded images by the file's SHA-256.
struct TowerState {
  ModelConfig cfg;
  std::unique_ptr<ConvertedWeights> weights;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<FastVisionTower> fast;
  std::optional<Checkpoint> official;  // --path reference
  std::mutex mu;
  int64_t cache_budget = 0, cache_used = 0;
  std::list<std::pair<std::string, EncodedImage>> lru;  // most recent first
  std::unordered_map<std::string, decltype(lru)::iterator> by_file;
};

int64_t rows_bytes(const EncodedImage& e) {
  return int64_t(e.rows->size() * sizeof(float)) + 256;
}

// The prefix cache's key of an image: its decoded pixels (and size), whatever file held them.
uint64_t pixel_key(const RgbImage& img) {
  Sha256 h;
  const int64_t dims[2] = {img.width, img.height};
  h.update(dims, sizeof dims);
  h.update(img.rgb.data(), img.rgb.size());
  const uint64_t k = std::stoull(h.hex().substr(0, 16), nullptr, 16);
  return k == 0 ? 1 : k;  // 0 means unkeyed
}

Result<EncodedImage> encode(TowerState& s, std::string_view file) {
  const std::string id = sha256_hex(file.data(), file.size());
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.by_file.find(id); it != s.by_file.end()) {
      s.lru.splice(s.lru.begin(), s.lru, it->second);
      EncodedImage e = it->second->second;
      e.cached = true;
      return e;
    }
  }
  auto img = decode_image(file);
  if (!img) return img.status();
  const PlannedImage p = plan_image(std::move(*img), *s.cfg.vision);
  const ImagePlan& plan = p.plan;
  const std::vector<uint16_t>& patches = p.patches;
  EncodedImage e;
  e.llm_w = int32_t(plan.llm_w);
  e.llm_h = int32_t(plan.llm_h);
  e.key = pixel_key(p.decoded);
  std::lock_guard<std::mutex> lock(s.mu);
  e.rows = std::make_shared<const std::vector<float>>(
      s.fast ? s.fast->encode(patches, plan.vit_w, plan.vit_h).aligned
             : ref::vision_tower<float>(*s.official, s.cfg, patches, plan.vit_w, plan.vit_h)
                   .aligned.v);
  if (rows_bytes(e) <= s.cache_budget && !s.by_file.count(id)) {
    s.lru.emplace_front(id, e);
    s.by_file[id] = s.lru.begin();
    s.cache_used += rows_bytes(e);
    while (s.cache_used > s.cache_budget) {  // the least recently used out
      s.cache_used -= rows_bytes(s.lru.back().second);
      s.by_file.erase(s.lru.back().first);
      s.lru.pop_back();
    }
  }
  return e;
}

}  // namespace

Result<ImageEncoder> make_image_encoder(const EngineOptions& eo, int64_t cache_bytes) {
  auto s = std::make_shared<TowerState>();
  s->cache_budget = std::max<int64_t>(0, cache_bytes);
  auto cfg = load_config(eo.model_dir + "/config.json");
  if (!cfg) return cfg.status();
  if (!cfg->vision) return ImageEncoder();
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
  return ImageEncoder([s](std::string_view file) { return encode(*s, file); });
}

}  // namespace dsv41::cli
