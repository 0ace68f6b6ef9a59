// The vision tower on the fast path (spec §9, §9.1; the reference is model/reference/vision_tower):
// the converted checkpoint's BF16 tower weights (vision.bin) through the kernels' BF16 GEMM, all
// of an image's patches in one call per linear, rows split over the pool's threads; RMSNorm by the
// kernels; 2-D RoPE here; the full bidirectional attention over the patches by the kernels'
// vision_attention (a blocked online softmax, about half the tower's arithmetic at the released
// shape), heads x query blocks over the threads. Deterministic: an image's rows do not depend on
// anything but its patches (no batching across images, splits that never cut a sum).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace dsv41 {

class ConvertedWeights;
class ThreadPool;
namespace ops {
struct Kernels;
}

class FastVisionTower {
 public:
  // The tower of an opened converted checkpoint (the caller keeps `w` and `pool` alive); an error
  // names the missing vision_config or tensor.
  static Result<std::unique_ptr<FastVisionTower>> create(const ConvertedWeights& w,
                                                         ThreadPool& pool);
  ~FastVisionTower();

  struct Rows {
    std::vector<float> vit;      // [vit_h * vit_w, vision width]: the final norm, reading order
    std::vector<float> aligned;  // [llm_h * llm_w, text width]: the aligner's rows
  };
  // `patches`: [vit_h * vit_w, 3 * patch * patch] bf16 (vision/preprocess.h patch_tensor).
  Rows encode(const std::vector<uint16_t>& patches, int64_t vit_w, int64_t vit_h) const;

 private:
  FastVisionTower() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41
