// Images of a command line (`logits --image`, `logits --messages`, `image-embed`): an image file
// read under the decoder's size limit (or its bytes from a chat body's data: URL), decoded, planned
// by the model's vision_config (spec §9.1) and cut into the ViT's patch rows; and a token list
// whose IMG placeholders become the images' spans, with the tower's rows ready for
// ReferenceModel::forward (or the fast model's SliceImage).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/reference/reference_model.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace dsv41::cli {

// The placeholder parse_tokens(..., allow_image = true) returns for "IMG".
inline constexpr int32_t kImagePlaceholder = -1;

ImagePlanOptions image_plan_options(const VisionConfig& v);

struct PlannedImage {
  RgbImage decoded;               // as the file holds it (RGB)
  ImagePlan plan;                 // the resize plan of spec §9.1
  std::vector<uint16_t> patches;  // [vit_h * vit_w, 3 * patch * patch] bf16
};

// A decoded image planned by the model's vision_config and cut into the ViT's patches.
PlannedImage plan_image(RgbImage decoded, const VisionConfig& v);
// `path` read, decoded and planned; errors name the file.
Result<PlannedImage> load_planned_image(const std::string& path, const VisionConfig& v);

// One image of a prompt: a file to read (--image FILE) or a file's bytes already read (an image
// part of --messages), and what names it in errors.
struct ImageInput {
  std::string where;  // "--image" or "F.json: messages[0].content[1].image_url"
  std::string path;   // the file, when not empty
  std::string bytes;  // else the file's bytes
};
// --image's files, in order.
std::vector<ImageInput> image_files(const std::vector<std::string>& paths);
// `in` read (or taken), decoded and planned; errors start with in.where.
Result<PlannedImage> load_planned_image(const ImageInput& in, const VisionConfig& v);

template <typename T>
struct ExpandedPrompt {
  std::vector<int32_t> ids;            // each placeholder replaced by its span of image tokens
  std::vector<PromptImage<T>> images;  // one per placeholder, in order, with the tower's rows
  std::vector<ImagePlan> plans;
};

// `ids` (with kImagePlaceholder entries) and one image per placeholder, planned by `cfg`; `tower`
// makes an image's aligner rows ([llm_h * llm_w, hidden]).
template <typename T>
Result<ExpandedPrompt<T>> expand_prompt_images(
    const ModelConfig& cfg, const std::vector<int32_t>& ids, const std::vector<ImageInput>& images,
    const std::function<std::vector<T>(const PlannedImage&)>& tower);

// The same for the official checkpoint in `model_dir`, the tower run in the reference at T.
template <typename T>
Result<ExpandedPrompt<T>> expand_prompt_images(const std::string& model_dir,
                                               const std::vector<int32_t>& ids,
                                               const std::vector<ImageInput>& images);

extern template Result<ExpandedPrompt<float>> expand_prompt_images(const std::string&,
                                                                   const std::vector<int32_t>&,
                                                                   const std::vector<ImageInput>&);
extern template Result<ExpandedPrompt<double>> expand_prompt_images(const std::string&,
                                                                    const std::vector<int32_t>&,
                                                                    const std::vector<ImageInput>&);

}  // namespace dsv41::cli
