// Exact dequantization of official-layout tensors into T for the reference (spec §3.1): BF16/F32 as
// is, F8_E4M3 x E8M0 (block scales from quantization_config.weight_block_size), MXFP4 I8-packed
// experts x E8M0 per 32. All of these are exact in float and double.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "model/reference/ref_ops.h"

namespace dsv41::ref {

template <typename T>
class WeightReader {
 public:
  WeightReader(const Checkpoint& ckpt, std::vector<int64_t> block)
      : ckpt_(ckpt), block_(std::move(block)) {}

  // 1-D or any-shape BF16/F32 tensor, flattened.
  std::vector<T> vec(const std::string& name) const;
  // 2-D linear weight [out, in] in BF16, F32, F8_E4M3 (+ NAME.scale) or I8 MXFP4 (+ NAME.scale).
  // `name` is the weight tensor ("....weight" or a bare name such as "hc_attn_fn").
  Mat<T> mat(const std::string& name) const;

 private:
  const Checkpoint& ckpt_;
  std::vector<int64_t> block_;
};

extern template class WeightReader<float>;
extern template class WeightReader<double>;

}  // namespace dsv41::ref
