// Layer plan derivation and the config's cross-layer validation (see layer_plan.h).
#include "model/layer_plan.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "model/engram_layout.h"

namespace dsv41 {
namespace {

// Strictly increasing ids inside [0, n); otherwise an error naming the field.
void check_ids(const std::vector<int64_t>& ids, int64_t n, const char* field,
               std::vector<std::string>* errors) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= n)
      errors->push_back(std::string("text_config.") + field + ": layer " + std::to_string(ids[i]) +
                        " is not a backbone layer (num_hidden_layers = " + std::to_string(n) + ")");
    if (i && ids[i] <= ids[i - 1])
      errors->push_back(std::string("text_config.") + field + ": ids must be strictly increasing");
  }
}

bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Latest id <= layer, or -1.
int latest_at_or_below(const std::vector<int64_t>& ids, int layer) {
  int best = -1;
  for (int64_t s : ids)
    if (s <= layer) best = int(s);
  return best;
}

}  // namespace

std::string_view attn_mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::kSwaOnly:
      return "SWA-only";
    case AttnMode::kFull:
      return "Full";
    case AttnMode::kReuse:
      return "Reuse";
    case AttnMode::kReindex:
      return "Reindex";
  }
  return "?";
}

std::string LayerPlan::tensor_prefix() const {
  return dspark_stage >= 0 ? "mtp." + std::to_string(dspark_stage) + "."
                           : "layers." + std::to_string(index) + ".";
}

void yarn_bounds(double base, const RopeScaling& rs, int rope_dim, int* low, int* high) {
  const double d = rope_dim;
  auto corr = [&](double r) {
    return d * std::log(double(rs.original_max_position_embeddings) / (2 * std::numbers::pi * r)) /
           (2 * std::log(base));
  };
  *low = std::max(int(std::floor(corr(rs.beta_fast))), 0);
  *high = std::min(int(std::ceil(corr(rs.beta_slow))), rope_dim - 1);
}

Result<ModelPlan> build_layer_plan(const ModelConfig& c) {
  const TextConfig& t = c.text;
  const int n = int(t.num_hidden_layers);
  std::vector<std::string> errors;
  check_ids(t.kv_source_layer_ids, n, "kv_source_layer_ids", &errors);
  check_ids(t.index_source_layer_ids, n, "index_source_layer_ids", &errors);
  check_ids(t.engram_layer_ids, n, "engram_layer_ids", &errors);
  check_ids(t.dspark_target_layer_ids, n, "dspark_target_layer_ids", &errors);
  if (int64_t(t.compress_ratios.size()) != t.total_layers())
    errors.push_back("text_config.compress_ratios: wrong length");
  if (!errors.empty()) {
    std::string m = "invalid layer plan:";
    for (auto& e : errors) m += "\n  " + e;
    return Status::error(m);
  }
  auto ratio = [&](int64_t l) { return int(t.compress_ratios[std::size_t(l)]); };
  for (int64_t s : t.kv_source_layer_ids) {
    if (ratio(s) == 0)
      errors.push_back("text_config.kv_source_layer_ids: layer " + std::to_string(s) +
                       " has compress ratio 0");
    if (!contains(t.index_source_layer_ids, s))
      errors.push_back("text_config.index_source_layer_ids: KV source layer " + std::to_string(s) +
                       " must also be an index source (it owns the index keys)");
  }
  for (int64_t s : t.index_source_layer_ids)
    if (ratio(s) == 0)
      errors.push_back("text_config.index_source_layer_ids: layer " + std::to_string(s) +
                       " has compress ratio 0");
  if (t.candidate_source_layer_id && !contains(t.kv_source_layer_ids, *t.candidate_source_layer_id))
    errors.push_back("text_config.candidate_source_layer_id: layer " +
                     std::to_string(*t.candidate_source_layer_id) + " is not a KV source");
  if (t.num_nextn_predict_layers > 0 && t.dspark_target_layer_ids.empty())
    errors.push_back("text_config.dspark_target_layer_ids: empty but num_nextn_predict_layers > 0");
  if (Status s = check_engram_tables(t); !s.is_ok()) errors.push_back(s.message());

  ModelPlan plan;
  plan.num_backbone = n;
  for (int l = 0; l < int(t.total_layers()); ++l) {
    LayerPlan p;
    p.index = l;
    p.compress_ratio = ratio(l);
    const bool stage = l >= n;
    if (stage) {
      p.dspark_stage = l - n;
      p.n_routed_experts = int(t.dspark_n_routed_experts);
      p.experts_per_tok = int(t.dspark_num_experts_per_tok);
      if (p.compress_ratio != 0)
        errors.push_back("text_config.compress_ratios: DSpark stage " +
                         std::to_string(p.dspark_stage) + " (entry " + std::to_string(l) +
                         ") must be 0 (window-only)");
    } else {
      p.n_routed_experts = int(t.n_routed_experts);
      p.experts_per_tok = int(t.num_experts_per_tok);
      for (std::size_t i = 0; i < t.engram_layer_ids.size(); ++i)
        if (t.engram_layer_ids[i] == l) p.engram = int(i);
      for (std::size_t i = 0; i < t.dspark_target_layer_ids.size(); ++i)
        if (t.dspark_target_layer_ids[i] == l) p.dspark_target = int(i);
    }
    if (p.compress_ratio == 0 || stage) {
      p.mode = AttnMode::kSwaOnly;
      p.rope_theta = t.rope_theta;
    } else {
      p.rope_theta = t.compress_rope_theta;
      p.kv_source = latest_at_or_below(t.kv_source_layer_ids, l);
      p.index_source = latest_at_or_below(t.index_source_layer_ids, l);
      const std::string where = "layer " + std::to_string(l) + " (compress ratio " +
                                std::to_string(p.compress_ratio) + ")";
      if (p.kv_source < 0) {
        errors.push_back(where +
                         ": no KV source layer at or below it in text_config.kv_source_layer_ids");
      } else if (ratio(p.kv_source) != p.compress_ratio) {
        errors.push_back(where + ": its KV source layer " + std::to_string(p.kv_source) +
                         " has compress ratio " + std::to_string(ratio(p.kv_source)));
      }
      if (p.kv_source == l) {
        p.mode = AttnMode::kFull;
        p.compressor_gate = p.compress_ratio > 1;
      } else if (p.index_source == l) {
        p.mode = AttnMode::kReindex;
      } else {
        p.mode = AttnMode::kReuse;
      }
      p.candidate_source = t.candidate_source_layer_id && *t.candidate_source_layer_id == l;
      // Reindex layers whose keys come from the candidate source are filtered by its pool.
      if (p.mode == AttnMode::kReindex && t.candidate_source_layer_id &&
          p.kv_source == *t.candidate_source_layer_id)
        p.candidate_filter = p.kv_source;
      if (t.rope_scaling) {
        p.yarn = true;
        yarn_bounds(t.compress_rope_theta, *t.rope_scaling, int(t.qk_rope_head_dim), &p.yarn_low,
                    &p.yarn_high);
      }
    }
    plan.layers.push_back(p);
  }
  if (!errors.empty()) {
    std::string m = "invalid layer plan:";
    for (auto& e : errors) m += "\n  " + e;
    return Status::error(m);
  }
  return plan;
}

}  // namespace dsv41
