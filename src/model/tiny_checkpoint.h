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
  // Make the target a strong bigram model whose drafter predicts it, for speculative-decoding
  // speed tests (random weights otherwise give a drafter that predicts nothing): each ordinary
  // token v gets a fixed random successor g(v); v's embedding row is the output-head row of g(v),
  // so the last token's embedding dominates the final hidden state's alignment with the head and
  // greedy decoding follows g whatever the context; the drafter's Markov head (rows of equal
  // norm) gets `markov_embed[v] = s * markov_head[g(v)]` with s large, so its chain is g too. The
  // layers, experts and drafter stages keep their random weights and their full cost.
  bool bigram = false;
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
