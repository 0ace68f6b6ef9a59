// `dsv41 logits --path fast`: teacher-forced logits from the fast engine (model/fast), optionally
// among random companion sequences (the batch-invariance check: the output must equal the solo
// run byte for byte).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/seam.h"

namespace dsv41::cli {

struct FastLogitsArgs {
  std::string model, converted_dir, out, mode, index_keys = "owner", act_quant = "off";
  int companions = 0;
  uint64_t companion_seed = 1;
  int threads = 0;
  double kv_cache_gb = 0;
  std::string decoder_replay = "off";    // on: FastOptions::decoder_replay
  std::string prefill_attention = "on";  // FastOptions::prefill_attention
  std::string replay_margin = "12";      // N | exact (add_replay_margin_option)
  int tp = 0, ep = 0;                    // under mpirun: the split (parallel/)
  double rank_timeout_s = 60;
};

// `images`: spans (of the image rows already computed) merged in the first call, which then
// holds at least every span.
int run_fast_logits(const FastLogitsArgs& a, const std::vector<int32_t>& ids, int64_t chunk,
                    const std::vector<SliceImage>& images = {});

}  // namespace dsv41::cli
