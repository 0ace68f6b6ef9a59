// `dsv41 image-embed --model DIR --image FILE --out F [--stage patches]` (issue 33 item 6): what
// the vision path makes of an image, for checking against other implementations. Today the stage
// `patches`: the image decoded, planned by the model's vision_config (spec §9.1), resized or
// letterboxed, cut into the ViT's patch rows; written as little-endian f32 (the bf16 values,
// exactly), row-major [patches, 3 * patch * patch], with one JSON line on stdout giving the plan.
// The tower's stages (`vit`, `aligner`) come with the tower.
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/log.h"
#include "model/config.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"

namespace dsv41::cli {
namespace {

struct ImageEmbedArgs {
  std::string model, image, out, stage = "patches";
};

int run_image_embed(const ImageEmbedArgs& a) {
  auto cfg = load_config(a.model + "/config.json");
  if (!cfg) {
    log::error("image-embed: --model: {}", cfg.status().message());
    return kExitInvalid;
  }
  if (!cfg->vision) {
    log::error("image-embed: --model {}: config.json has no vision_config (a text-only model)",
               a.model);
    return kExitInvalid;
  }
  if (a.stage != "patches") {
    log::error(
        "image-embed: --stage {}: not available yet (the vision tower is not implemented; "
        "--stage patches is)",
        a.stage);
    return kExitUsage;
  }
  std::ifstream in(a.image, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) {
    log::error("image-embed: --image {}: cannot be read", a.image);
    return kExitInvalid;
  }
  auto img = decode_image(ss.str());
  if (!img) {
    log::error("image-embed: --image {}: {}", a.image, img.status().message());
    return kExitInvalid;
  }
  const VisionConfig& v = *cfg->vision;
  ImagePlanOptions o;
  o.patch = v.patch_size;
  o.downsample = v.downsample_ratio;
  if (v.min_pixels > 0) o.min_pixels = v.min_pixels;
  if (v.max_image_tokens > 0) o.max_tokens = v.max_image_tokens;
  const ImagePlan plan = plan_image_grid(img->width, img->height, o);
  const std::vector<uint16_t> bf16 = patch_tensor(plan_pixels(*img, plan), o.patch);
  std::vector<float> f32(bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) {
    const uint32_t bits = uint32_t(bf16[i]) << 16;
    std::memcpy(&f32[i], &bits, 4);
  }
  std::ofstream out(a.out, std::ios::binary);
  out.write(reinterpret_cast<const char*>(f32.data()), std::streamsize(f32.size() * 4));
  if (!out) {
    log::error("image-embed: --out {}: cannot be written", a.out);
    return kExitInvalid;
  }
  const int64_t cols = 3 * o.patch * o.patch;
  nlohmann::ordered_json j = {{"stage", "patches"},
                              {"image_width", img->width},
                              {"image_height", img->height},
                              {"width", plan.width},
                              {"height", plan.height},
                              {"resize", plan.plain_resize ? "plain" : "letterbox"},
                              {"vit_w", plan.vit_w},
                              {"vit_h", plan.vit_h},
                              {"llm_w", plan.llm_w},
                              {"llm_h", plan.llm_h},
                              {"span", plan.span},
                              {"rows", int64_t(f32.size()) / cols},
                              {"cols", cols},
                              {"dtype", "f32"},
                              {"out", a.out}};
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

}  // namespace

void add_image_embed(CLI::App& app, Runner* run) {
  auto a = std::make_shared<ImageEmbedArgs>();
  CLI::App* sub = app.add_subcommand(
      "image-embed",
      "What the vision path makes of an image (docs/vision.md): --stage patches writes the ViT's "
      "input rows (little-endian f32 of the bf16 values, [patches, 3 * patch * patch]) after "
      "DeepSeek's resize plan, and prints the plan as one JSON line.");
  sub->add_option("--model", a->model, "Model directory (its config.json's vision_config)")
      ->required();
  sub->add_option("--image", a->image, "PNG, JPEG, WebP or GIF file")->required();
  sub->add_option("--out", a->out, "Output file")->required();
  sub->add_option("--stage", a->stage, "patches (vit, aligner: with the tower, not yet)")
      ->capture_default_str()
      ->check(CLI::IsMember({"patches", "vit", "aligner"}));
  sub->callback([a, run] { *run = [a] { return run_image_embed(*a); }; });
}

}  // namespace dsv41::cli
