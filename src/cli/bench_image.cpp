// The vision tower's bench points (bench_image.h).
#include "cli/bench_image.h"

#include <chrono>
#include <cstdio>

#include "cli/fast_model_dir.h"
#include "cli/prompt_images.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "ops/bench/kernel_bench.h"

namespace dsv41::cli {
namespace {

// Multiply-adds x 2 of one image through the tower (fast_vision.cpp's steps): the patch
// embedding, per block the four linears and the attention (q.k and p.v over every pair of
// patches), the aligner's two linears.
double tower_flops(const VisionConfig& v, int64_t text_width, const ImagePlan& p) {
  const double n = double(p.vit_w * p.vit_h), W = double(v.hidden_size);
  const double I = double(v.intermediate_size), in = 3.0 * double(v.patch_size * v.patch_size);
  const double r2 = double(v.downsample_ratio * v.downsample_ratio), D = double(text_width);
  const double block = n * (3 * W * W + W * W + 2 * I * W + I * W) + 2 * n * n * W;
  return 2 * (n * in * W + double(v.num_hidden_layers) * block +
              double(p.llm_w * p.llm_h) * (r2 * W * D + D * D));
}

}  // namespace

Result<nlohmann::ordered_json> bench_image_points(const std::string& model,
                                                  const std::string& converted,
                                                  const std::string& sizes, int threads) {
  auto dir = ensure_converted(model, converted);
  if (!dir) return dir.status();
  auto w = ConvertedWeights::open(*dir, false);
  if (!w) return w.status();
  ThreadPool pool(std::size_t(std::max(0, threads)));
  auto tower = FastVisionTower::create(**w, pool);
  if (!tower) return tower.status();
  const ModelConfig& cfg = (*w)->config();
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  std::size_t at = 0;
  while (at <= sizes.size()) {
    const std::size_t comma = std::min(sizes.find(',', at), sizes.size());
    const std::string one = sizes.substr(at, comma - at);
    at = comma + 1;
    int64_t iw = 0, ih = 0;
    if (std::sscanf(one.c_str(), "%ldx%ld", &iw, &ih) != 2 || iw < 1 || ih < 1 || iw > 20000 ||
        ih > 20000)
      return Status::error("--images: '" + one + "' is not WIDTHxHEIGHT (1 to 20000 each)");
    RgbImage img;  // smooth gradients with noise: a photograph's kind of content
    img.width = iw, img.height = ih;
    img.rgb.resize(std::size_t(iw * ih * 3));
    Rng rng(uint64_t(iw * 7919 + ih));
    for (int64_t y = 0; y < ih; ++y)
      for (int64_t x = 0; x < iw; ++x)
        for (int c = 0; c < 3; ++c)
          img.row(y)[x * 3 + c] =
              uint8_t((x * 255 / iw + y * 97 / ih + c * 60 + rng.below(24)) % 256);
    const PlannedImage planned = plan_image(std::move(img), *cfg.vision);
    const ImagePlan& plan = planned.plan;
    const std::vector<uint16_t>& patches = planned.patches;
    const auto t0 = std::chrono::steady_clock::now();
    (void)(*tower)->encode(patches, plan.vit_w, plan.vit_h);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ops::ReferenceGemm ref = ops::reference_gemm();  // beside the point
    const double flops = tower_flops(*cfg.vision, cfg.text.hidden_size, plan);
    points.push_back(
        {{"image", one},
         {"width", plan.width},
         {"height", plan.height},
         {"patches", plan.vit_w * plan.vit_h},
         {"llm_tokens", plan.llm_w * plan.llm_h},
         {"span", plan.span},
         {"tower_ms", s * 1e3},
         {"flops", flops},
         {"gflop_per_s", flops / s / 1e9},
         {"reference_gflop_per_s", ref.gflop_per_s},
         {"reference_op", ref.op},
         {"fraction_of_roofline", ref.gflop_per_s > 0 ? flops / 1e9 / ref.gflop_per_s / s : 0.0}});
    if (comma == sizes.size()) break;
  }
  return points;
}

}  // namespace dsv41::cli
