// The V4.1 `config.json` (spec §2.1): root fields, quantization_config, text_config and the
// optional vision_config, parsed and validated field by field. Every error names the field
// ("config.json: text_config.hidden_size: ..."); all bad fields are reported at once. Cross-layer
// consistency (sources, ratios, candidate pool) is checked by the layer plan (layer_plan.h).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

struct RopeScaling {
  std::string rope_type = "yarn";
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
};

struct QuantizationConfig {
  std::string quant_method = "fp8";
  std::string activation_scheme = "dynamic";
  std::vector<int64_t> weight_block_size = {32, 32};
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";
};

struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 0;
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string hidden_act = "silu";
  double swiglu_limit = 0.0;
  double rms_norm_eps = 0.0;
  double gate_temp = 1.0;  // not in the HF config; the reference's default
  bool attention_bias = false;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  bool use_cache = true;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  double rope_theta = 0.0;
  std::optional<RopeScaling> rope_scaling;  // applies to compressed layers only
  double compress_rope_theta = 0.0;
  int64_t sliding_window = 0;
  std::vector<int64_t> compress_ratios;  // num_hidden_layers + num_nextn_predict_layers entries
  std::vector<int64_t> kv_source_layer_ids;
  std::vector<int64_t> index_source_layer_ids;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  std::optional<int64_t> candidate_source_layer_id;
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;
  std::vector<int64_t> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int64_t engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_token_id = 0;
  int64_t engram_compressed_vocab_size = 0;
  int64_t num_nextn_predict_layers = 0;
  int64_t dspark_block_size = 0;
  int64_t dspark_noise_token_id = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int64_t dspark_n_routed_experts = 0;
  int64_t dspark_num_experts_per_tok = 0;

  // Derived sizes used everywhere (spec §5.1, §6.3).
  int64_t hc_mix() const { return (2 + hc_mult) * hc_mult; }
  int64_t total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
};

struct VisionConfig {
  int64_t num_hidden_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t patch_size = 0;
  int64_t downsample_ratio = 0;
  int64_t max_image_tokens = 0;
  int64_t min_pixels = 0;
  double rope_theta = 0.0;
};

struct ModelConfig {
  std::vector<std::string> architectures;
  std::string model_type;
  std::string dtype;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t pad_token_id = 2;
  int64_t image_token_id = 0;
  QuantizationConfig quantization;
  TextConfig text;
  std::optional<VisionConfig> vision;
};

// Parses and validates a parsed config.json; `file` names the source in error messages.
Result<ModelConfig> parse_config(const nlohmann::json& root, const std::string& file);
Result<ModelConfig> load_config(const std::string& path);
// The nested HF form again (what make-tiny writes); parse_config(to_json(c)) == c.
nlohmann::json config_to_json(const ModelConfig& c);

}  // namespace dsv41
