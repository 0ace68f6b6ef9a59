// The vision tower in the reference (spec §9, §9.1): patch rows (bf16, from vision/preprocess)
// through the ViT (patch embedding, blocks of pre-norm attention with 2-D RoPE over every patch
// of the image and a SiLU-gated MLP, the final norm) and the aligner (3 x 3 pixel-unshuffle, w1,
// exact GELU, w2) into rows of the text model's width, one per IMAGE position of the span.
// Templated on the scalar type like the rest of the oracle; plain loops, written to be read.
// Where the spec leaves the layout of a fused weight open, docs/vision.md says what is read how.
#pragma once

#include <cstdint>
#include <vector>

#include "io/checkpoint.h"
#include "model/config.h"
#include "model/reference/ref_ops.h"

namespace dsv41::ref {

template <typename T>
struct VisionRows {
  Mat<T> vit;      // [vit_h * vit_w, vision width]: the final norm's output, reading order
  Mat<T> aligned;  // [llm_h * llm_w, text width]: the aligner's rows, reading order
};

// `patches`: [vit_h * vit_w, 3 * patch * patch] bf16 words (vision/preprocess.h patch_tensor).
// The checkpoint must hold the config's vision tensors (the inventory check).
template <typename T>
VisionRows<T> vision_tower(const Checkpoint& ckpt, const ModelConfig& cfg,
                           const std::vector<uint16_t>& patches, int64_t vit_w, int64_t vit_h);

// The aligner's input row of LLM position (by, bx): the 3 x 3 block of ViT rows below and right
// of (3 by, 3 bx), features channel first (c * 9 + ky * 3 + kx), zeros past the grid's edge.
template <typename T>
void unshuffle_row(const Mat<T>& vit, int64_t vit_w, int64_t vit_h, int64_t r, int64_t by,
                   int64_t bx, T* out);

extern template VisionRows<float> vision_tower(const Checkpoint&, const ModelConfig&,
                                               const std::vector<uint16_t>&, int64_t, int64_t);
extern template VisionRows<double> vision_tower(const Checkpoint&, const ModelConfig&,
                                                const std::vector<uint16_t>&, int64_t, int64_t);

}  // namespace dsv41::ref
