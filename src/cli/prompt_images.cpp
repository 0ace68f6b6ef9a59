// Images of a command line: read, decode, plan, and expand into a prompt (prompt_images.h).
#include "cli/prompt_images.h"

#include "io/checkpoint.h"
#include "io/text_file.h"
#include "model/inventory.h"
#include "model/reference/vision_tower.h"
#include "vision/image_decode.h"

namespace dsv41::cli {

ImagePlanOptions image_plan_options(const VisionConfig& v) {
  ImagePlanOptions o;
  o.patch = v.patch_size;
  o.downsample = v.downsample_ratio;
  if (v.min_pixels > 0) o.min_pixels = v.min_pixels;
  if (v.max_image_tokens > 0) o.max_tokens = v.max_image_tokens;
  return o;
}

PlannedImage plan_image(RgbImage decoded, const VisionConfig& v) {
  PlannedImage p;
  p.decoded = std::move(decoded);
  const ImagePlanOptions o = image_plan_options(v);
  p.plan = plan_image_grid(p.decoded.width, p.decoded.height, o);
  p.patches = patch_tensor(plan_pixels(p.decoded, p.plan), o.patch);
  return p;
}

Result<PlannedImage> load_planned_image(const std::string& path, const VisionConfig& v) {
  // (the decoder refuses files over its own limit; this bounds the read)
  auto bytes = read_text_file(path, std::size_t(ImageLimits{}.max_bytes) + 1);
  if (!bytes) return bytes.status();
  auto img = decode_image(*bytes);
  if (!img) return img.status().with_context(path + ": ");
  return plan_image(std::move(*img), v);
}

std::vector<ImageInput> image_files(const std::vector<std::string>& paths) {
  std::vector<ImageInput> out;
  for (const std::string& p : paths) out.push_back({"--image", p, {}});
  return out;
}

Result<PlannedImage> load_planned_image(const ImageInput& in, const VisionConfig& v) {
  if (!in.path.empty()) {
    auto p = load_planned_image(in.path, v);
    if (!p) return p.status().with_context(in.where + ": ");
    return p;
  }
  auto img = decode_image(in.bytes);
  if (!img) return img.status().with_context(in.where + ": ");
  return plan_image(std::move(*img), v);
}

namespace {
std::size_t count_holes(const std::vector<int32_t>& ids) {
  std::size_t holes = 0;
  for (int32_t id : ids) holes += id == kImagePlaceholder;
  return holes;
}
}  // namespace

template <typename T>
Result<ExpandedPrompt<T>> expand_prompt_images(
    const ModelConfig& cfg, const std::vector<int32_t>& ids, const std::vector<ImageInput>& images,
    const std::function<std::vector<T>(const PlannedImage&)>& tower) {
  const std::size_t holes = count_holes(ids);
  if (holes != images.size())
    return Status::error("the tokens hold " + std::to_string(holes) +
                         " IMG placeholder(s) but --image was given " +
                         std::to_string(images.size()) + " time(s): one image per IMG");
  ExpandedPrompt<T> out;
  if (holes > 0 && !cfg.vision)
    return Status::error("the model's config.json has no vision_config (a text-only model)");
  std::size_t next = 0;
  for (int32_t id : ids) {
    if (id != kImagePlaceholder) {
      out.ids.push_back(id);
      continue;
    }
    auto p = load_planned_image(images[next++], *cfg.vision);
    if (!p) return p.status();
    PromptImage<T> img;
    img.start = int64_t(out.ids.size());
    img.llm_w = p->plan.llm_w;
    img.llm_h = p->plan.llm_h;
    img.rows = tower(*p);
    out.ids.insert(out.ids.end(), std::size_t(img.span()), int32_t(cfg.image_token_id));
    out.images.push_back(std::move(img));
    out.plans.push_back(p->plan);
  }
  return out;
}

template <typename T>
Result<ExpandedPrompt<T>> expand_prompt_images(const std::string& model_dir,
                                               const std::vector<int32_t>& ids,
                                               const std::vector<ImageInput>& images) {
  auto cfg = load_config(model_dir + "/config.json");
  if (!cfg) return cfg.status();
  if (count_holes(ids) == 0 || !cfg->vision)
    return expand_prompt_images<T>(*cfg, ids, images, nullptr);
  auto ck = Checkpoint::open(model_dir);
  if (!ck) return ck.status();
  const InventoryReport rep = check_inventory(expected_vision_tensors(*cfg), *ck);
  if (!rep.missing.empty() || !rep.wrong_shape.empty() || !rep.wrong_dtype.empty())
    return Status::error(model_dir + ": the vision tower's tensors: " + rep.summary());
  return expand_prompt_images<T>(*cfg, ids, images, [&](const PlannedImage& p) {
    return ref::vision_tower<T>(*ck, *cfg, p.patches, p.plan.vit_w, p.plan.vit_h).aligned.v;
  });
}

template Result<ExpandedPrompt<float>> expand_prompt_images(
    const ModelConfig&, const std::vector<int32_t>&, const std::vector<ImageInput>&,
    const std::function<std::vector<float>(const PlannedImage&)>&);
template Result<ExpandedPrompt<double>> expand_prompt_images(
    const ModelConfig&, const std::vector<int32_t>&, const std::vector<ImageInput>&,
    const std::function<std::vector<double>(const PlannedImage&)>&);
template Result<ExpandedPrompt<float>> expand_prompt_images(const std::string&,
                                                            const std::vector<int32_t>&,
                                                            const std::vector<ImageInput>&);
template Result<ExpandedPrompt<double>> expand_prompt_images(const std::string&,
                                                             const std::vector<int32_t>&,
                                                             const std::vector<ImageInput>&);

}  // namespace dsv41::cli
