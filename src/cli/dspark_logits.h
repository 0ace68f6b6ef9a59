// `dsv41 logits --dspark` (design.md §9): the DSpark drafter's per-step logits, chain ids and
// confidences over a teacher-forced sequence, from the reference in fp32 or fp64, or from the
// fast engine (fp32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::cli {

struct DsparkLogitsArgs {
  std::string model, out, precision = "fp32", index_keys = "owner", act_quant = "off";
  std::string path = "reference", converted;  // --path fast: the fast engine's drafter (fp32)
  int threads = 0;
  double kv_cache_gb = 0;
  int64_t prefill = 16;  // P: the target prefills tokens[0:P], then decodes one token a step
};

int run_dspark_logits(const DsparkLogitsArgs& a, const std::vector<int32_t>& ids);

}  // namespace dsv41::cli
