// DeepSeek-V4.1's image preprocessing after decoding (spec §9.1): the resize plan (the image's
// size in pixels, a multiple of the patch on each side, and its grid of ViT patches and LLM
// tokens), the pixels at that size (a plain BICUBIC resize for images wider than the configured
// ratio, else a letterbox on grey 127), and the patch tensor the ViT reads.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "vision/image.h"

namespace dsv41 {

// The model's vision_config (defaults: the released model's).
struct ImagePlanOptions {
  int64_t patch = 14;           // patch_size
  int64_t downsample = 3;       // downsample_ratio: the aligner's 3x3 blocks
  int64_t min_pixels = 295936;  // min_pixels (544 x 544)
  int64_t max_tokens = 1024;    // max_image_tokens: the whole span at most
  double max_wh_ratio = 0;      // max_wh_ratio; 0: null (not set)
};

struct ImagePlan {
  int64_t width = 0, height = 0;  // pixels fed to the ViT (multiples of patch)
  int64_t vit_w = 0, vit_h = 0;   // patches per row / column
  int64_t llm_w = 0, llm_h = 0;   // LLM tokens per row / column (ceil(vit / downsample))
  int64_t span = 0;               // positions of the span: llm_h * (llm_w + 1) + 2
  bool plain_resize = false;      // a resize to the plan's size; else the letterbox
};

// The plan for an image of w x h pixels (both >= 1).
ImagePlan plan_image_grid(int64_t w, int64_t h, const ImagePlanOptions& o = {});

// The image at the plan's size.
RgbImage plan_pixels(const RgbImage& in, const ImagePlan& plan);

// The ViT's input: one row of 3 * patch * patch bf16 values per patch, patches in reading order,
// inside a patch channel, then pixel row, then column; each value bf16(((u / 255) - 0.5) / 0.5)
// computed in fp32.
std::vector<uint16_t> patch_tensor(const RgbImage& pixels, int64_t patch);

}  // namespace dsv41
