// `dsv41 image-embed --model DIR --image FILE --out F [--stage patches|vit|aligner]
// [--precision fp32|fp64]` (issue 33 item 6): what the vision path makes of an image, for checking
// against other implementations: the image decoded, planned by the model's vision_config (spec
// §9.1), resized or letterboxed and cut into the ViT's patch rows (`patches`), then through the
// reference tower (`vit`: the final norm's rows; `aligner`: the rows that fill the span's IMAGE
// positions). Written as little-endian f32, row-major, with one JSON line on stdout giving the
// plan and the matrix's shape. --path fast runs the fast tower (model/fast/fast_vision.h).
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/fast_model_dir.h"
#include "cli/prompt_images.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/fast/converted_weights.h"
#include "model/fast/fast_vision.h"
#include "model/inventory.h"
#include "model/reference/vision_tower.h"

namespace dsv41::cli {
namespace {

struct ImageEmbedArgs {
  std::string model, image, out, stage = "patches", precision = "fp32", path = "reference";
  std::string converted_dir;
  int threads = 0;
};

// The tower's rows of `patches` on the fast path (the converted layout, converted first if
// --model is official), as the stage's matrix.
Result<std::vector<float>> fast_tower_rows(const ImageEmbedArgs& a,
                                           const std::vector<uint16_t>& patches,
                                           const ImagePlan& plan, int64_t* cols) {
  auto dir = ensure_converted(a.model, a.converted_dir);
  if (!dir) return dir.status();
  auto w = ConvertedWeights::open(*dir, false);
  if (!w) return w.status();
  ThreadPool pool(std::size_t(a.threads));
  auto tower = FastVisionTower::create(**w, pool);
  if (!tower) return tower.status();
  FastVisionTower::Rows r = (*tower)->encode(patches, plan.vit_w, plan.vit_h);
  const bool vit = a.stage == "vit";
  std::vector<float>& m = vit ? r.vit : r.aligned;
  *cols = int64_t(m.size()) / (vit ? plan.vit_w * plan.vit_h : plan.llm_w * plan.llm_h);
  return std::move(m);
}

// The tower's rows of `patches` in the reference at precision T, as f32 (the stage's matrix).
template <typename T>
std::vector<float> tower_rows(const Checkpoint& ck, const ModelConfig& cfg,
                              const std::vector<uint16_t>& patches, const ImagePlan& plan,
                              const std::string& stage, int64_t* cols) {
  const ref::VisionRows<T> r = ref::vision_tower<T>(ck, cfg, patches, plan.vit_w, plan.vit_h);
  const ref::Mat<T>& m = stage == "vit" ? r.vit : r.aligned;
  *cols = m.cols;
  return std::vector<float>(m.v.begin(), m.v.end());
}

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
  auto planned = load_planned_image(a.image, *cfg->vision);
  if (!planned) {
    log::error("image-embed: --image: {}", planned.status().message());
    return kExitInvalid;
  }
  const RgbImage* img = &planned->decoded;
  const ImagePlan& plan = planned->plan;
  const std::vector<uint16_t>& bf16 = planned->patches;
  const int64_t patch = cfg->vision->patch_size;
  std::vector<float> f32;
  int64_t cols = 3 * patch * patch;
  if (a.stage == "patches") {
    f32.resize(bf16.size());
    for (std::size_t i = 0; i < bf16.size(); ++i) {
      const uint32_t bits = uint32_t(bf16[i]) << 16;
      std::memcpy(&f32[i], &bits, 4);
    }
  } else if (a.path == "fast") {
    auto rows = fast_tower_rows(a, bf16, plan, &cols);
    if (!rows) {
      log::error("image-embed: --model {}: {}", a.model, rows.status().message());
      return kExitInvalid;
    }
    f32 = std::move(*rows);
  } else {
    // The tower's rows, in the reference (the official layout, its vision tensors checked).
    auto ck = Checkpoint::open(a.model);
    if (!ck) {
      log::error(
          "image-embed: --stage {} runs the reference, which reads the official layout: "
          "--model {}: {}",
          a.stage, a.model, ck.status().message());
      return kExitInvalid;
    }
    const InventoryReport rep = check_inventory(expected_vision_tensors(*cfg), *ck);
    if (!rep.missing.empty() || !rep.wrong_shape.empty() || !rep.wrong_dtype.empty()) {
      log::error("image-embed: --model {}: the vision tower's tensors: {}", a.model, rep.summary());
      return kExitInvalid;
    }
    f32 = a.precision == "fp64" ? tower_rows<double>(*ck, *cfg, bf16, plan, a.stage, &cols)
                                : tower_rows<float>(*ck, *cfg, bf16, plan, a.stage, &cols);
  }
  std::ofstream out(a.out, std::ios::binary);
  out.write(reinterpret_cast<const char*>(f32.data()), std::streamsize(f32.size() * 4));
  if (!out) {
    log::error("image-embed: --out {}: cannot be written", a.out);
    return kExitInvalid;
  }
  nlohmann::ordered_json j = {{"stage", a.stage},
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
                              {"precision", a.stage == "patches" ? "bf16"
                                            : a.path == "fast"   ? "fp32"
                                                                 : a.precision},
                              {"path", a.stage == "patches" ? "preprocess" : a.path},
                              {"out", a.out}};
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

}  // namespace

void add_image_embed(CLI::App& app, Runner* run) {
  auto a = std::make_shared<ImageEmbedArgs>();
  CLI::App* sub = app.add_subcommand(
      "image-embed",
      "What the vision path makes of an image (docs/vision.md), as little-endian f32 rows: "
      "--stage patches the ViT's input after DeepSeek's resize plan, vit the tower's output, "
      "aligner the rows of the span's IMAGE positions (the reference tower, fp32 or fp64); the "
      "plan and the shape as one JSON line.");
  sub->add_option("--model", a->model, "Model directory (its config.json's vision_config)")
      ->required();
  sub->add_option("--image", a->image, "PNG, JPEG, WebP or GIF file")->required();
  sub->add_option("--out", a->out, "Output file")->required();
  sub->add_option("--stage", a->stage,
                  "patches (the ViT's input) | vit (the tower's final norm, one row per patch) | "
                  "aligner (one row of the text width per IMAGE position); vit and aligner run "
                  "the reference on the official layout")
      ->capture_default_str()
      ->check(CLI::IsMember({"patches", "vit", "aligner"}));
  sub->add_option("--precision", a->precision, "fp32 | fp64 (the reference's scalar type)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp64"}));
  sub->add_option("--path", a->path,
                  "reference (the official layout, plain loops) | fast (the converted layout: "
                  "BF16 GEMM kernels, fp32; an official --model is converted first)")
      ->capture_default_str()
      ->check(CLI::IsMember({"reference", "fast"}));
  sub->add_option("--converted", a->converted_dir,
                  "--path fast, official-layout --model: where its one-time conversion goes "
                  "(default: DIR.dsv41-converted beside it)");
  sub->add_option("--threads", a->threads, "--path fast: threads (0: every core)")
      ->check(CLI::Range(0, 4096));
  sub->callback([a, run] { *run = [a] { return run_image_embed(*a); }; });
}

}  // namespace dsv41::cli
