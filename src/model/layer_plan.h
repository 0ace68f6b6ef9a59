// The per-layer plan derived from the config (spec §2.3): for every backbone layer and DSpark
// stage, its compress ratio, attention mode, the layers whose compressed KV / top-k / candidate
// pool it uses, Engram and DSpark roles, and its RoPE parameters. Nothing is hard-coded; building
// the plan is also where cross-layer consistency of the config is validated.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace dsv41 {

enum class AttnMode {
  kSwaOnly,  // ratio 0: sliding window only
  kFull,     // KV source: own compressor, compressed cache, index keys and indexer
  kReuse,    // inherits compressed KV and top-k from its sources
  kReindex,  // own indexer query against its KV source's keys (and the candidate pool)
};
std::string_view attn_mode_name(AttnMode m);

struct LayerPlan {
  int index = 0;          // 0..num_hidden_layers-1 backbone, then the DSpark stages
  int dspark_stage = -1;  // stage number for DSpark stages (tensors under mtp.S), else -1
  int compress_ratio = 0;
  AttnMode mode = AttnMode::kSwaOnly;
  int kv_source = -1;             // layer owning the compressed KV this layer attends (-1: none)
  int index_source = -1;          // layer whose top-k this layer uses (-1: none)
  bool compressor_gate = false;   // KV source with ratio > 1 (softmax-pooled compressor)
  bool candidate_source = false;  // publishes the candidate block pool
  int candidate_filter = -1;      // indexer filtered by this layer's candidate pool (-1: none)
  int engram = -1;                // index into engram_layer_ids when Engram runs before this block
  int dspark_target = -1;  // slot in dspark_target_layer_ids when this layer's input feeds DSpark
  double rope_theta = 0.0;
  bool yarn = false;
  int yarn_low = -1, yarn_high = -1;  // YaRN ramp bounds over rotary pairs (spec §5.5)
  int n_routed_experts = 0;
  int experts_per_tok = 0;

  bool is_kv_source() const { return mode == AttnMode::kFull; }
  bool has_indexer() const { return mode == AttnMode::kFull || mode == AttnMode::kReindex; }
  std::string tensor_prefix() const;  // "layers.L." or "mtp.S."
};

struct ModelPlan {
  std::vector<LayerPlan> layers;  // backbone layers then DSpark stages
  int num_backbone = 0;
  const LayerPlan& stage(int s) const { return layers[num_backbone + s]; }
};

// YaRN correction range: low = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)),
// d/2-1) with corr(r) = d * ln(orig / (2 pi r)) / (2 ln base), d = qk_rope_head_dim.
void yarn_bounds(double base, const RopeScaling& rs, int rope_dim, int* low, int* high);

Result<ModelPlan> build_layer_plan(const ModelConfig& c);

}  // namespace dsv41
