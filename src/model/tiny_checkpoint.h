// `dsv41 make-tiny`: random-weight checkpoints in the official layout (design.md §4, §5):
// config.json, sharded safetensors + index, tokenizer.json + tokenizer_config.json. Weights use the
// official dtypes (F8_E4M3 + E8M0 32x32 scales, I8-packed MXFP4 experts + E8M0 per 32, BF16, F32)
// and are scaled so activations stay O(1): every linear's dequantized weights have standard
// deviation about 1/sqrt(fan_in), norms are near 1, mHC and Engram gains keep their pre-activations
// near unit scale. Deterministic from --seed: each tensor's values depend only on (seed, tensor
// name), never on thread count or write order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "text/tokenizer_file.h"

namespace dsv41 {

struct MakeTinyOptions {
  std::string out_dir;
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string tokenizer_path;  // empty: generate the tiny byte-level BPE
  bool force = false;          // overwrite a directory that already holds a checkpoint
  std::size_t threads = 0;     // 0: all cores
  // A JSON merge patch (RFC 7386) applied to the preset's config.json before the weights are
  // generated: other widths and layer plans for tests. Engram table sizes are derived again from
  // the patched config unless the patch sets `text_config.engram_num_embeddings` itself.
  std::string config_patch;
};

std::vector<std::string> preset_names();
// The preset's config with tokenizer-dependent fields (vocab size, image/noise ids, Engram
// compressed vocabulary and table sizes) filled in from `tok`.
Result<ModelConfig> preset_config(const std::string& preset, const TokenizerTable& tok);

struct MakeTinyResult {
  std::size_t tensors = 0;
  uint64_t bytes = 0;
  std::size_t shards = 0;
};
Result<MakeTinyResult> make_tiny_checkpoint(const MakeTinyOptions& opt);

}  // namespace dsv41
