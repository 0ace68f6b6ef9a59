// make-tiny size presets. Each keeps every layer mode of spec §2.3 (SWA-only, Engram, Full ratio 2,
// Reuse, Full ratio 1 + candidate source, Reindex) and DSpark stages; they differ in widths, depth
// and expert count. Candidate pools always hold at least index_topk + one block of entries, so a
// Reindex top-k never has to pick outside the pool (ties there would be implementation-defined):
//   tiny        unit tests (a few MB, hidden 64; a candidate pool of 3 x 2 entries bites past 6)
//   tiny-top1   tiny with top-1 routing (backbone and DSpark): no renormalisation of the weight
//   demo        the demo server model (hidden 256)
//   small       long-context tests (~250 MB): a candidate pool of 8 x 4 entries bites beyond 32
//   tokens real-shape  the released per-layer dimensions (5120 hidden, 64 x 512 heads, ...), 8
//   layers, 48
//               experts, one DSpark stage: ~9 GB, for benchmarks
#include <string>

#include "model/engram_layout.h"
#include "model/tiny_checkpoint.h"
#include "text/special_tokens.h"

namespace dsv41 {
namespace {

struct Dims {
  int64_t hidden, heads, head_dim, rope, q_lora, o_groups, o_lora, inter, experts, topk;
  int64_t index_heads, index_dim, index_topk, window, cand_blocks, cand_size;
  int64_t engram_prime_start, engram_heads, engram_dim;
  int64_t dspark_stages, dspark_experts, dspark_topk, markov_rank;
  int64_t original_ctx;
};

// Layer roles shared by all presets: 0 SWA, 1 SWA + Engram, 2 Full ratio 2 + Engram, 3 Reuse,
// 4 Full ratio 1 + candidate source, 5 Reuse, 6 Reindex (candidate-filtered), 7 Reuse;
// `small` adds a second ratio-2 group and two more Reindex groups.
void set_layers(TextConfig& t, const std::string& preset, const Dims& d) {
  if (preset == "small") {
    t.num_hidden_layers = 12;
    t.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1};
    t.kv_source_layer_ids = {2, 4, 6};
    t.index_source_layer_ids = {2, 4, 6, 8, 10};
    t.candidate_source_layer_id = 6;
    t.engram_layer_ids = {1, 4};
    t.dspark_target_layer_ids = {9, 10, 11};
  } else {
    t.num_hidden_layers = 8;
    t.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1};
    t.kv_source_layer_ids = {2, 4};
    t.index_source_layer_ids = {2, 4, 6};
    t.candidate_source_layer_id = 4;
    t.engram_layer_ids = {1, 2};
    t.dspark_target_layer_ids = {5, 6, 7};
  }
  t.num_nextn_predict_layers = d.dspark_stages;
  for (int64_t s = 0; s < d.dspark_stages; ++s) t.compress_ratios.push_back(0);
}

bool preset_dims(const std::string& preset, Dims* d) {
  if (preset == "tiny" || preset == "tiny-top1") {
    *d = {64, 4, 64, 32, 32, 2, 32, 32, 8, 2, 2, 64, 4, 8, 3, 2, 64, 2, 32, 3, 4, 2, 16, 256};
    if (preset == "tiny-top1") d->topk = d->dspark_topk = 1;
  } else if (preset == "demo") {
    *d = {256, 8,  128, 64, 128,  4, 128, 128, 16, 4, 4,  64,
          16,  32, 4,   4,  1000, 4, 64,  3,   8,  2, 32, 4096};
  } else if (preset == "small") {
    *d = {512, 8,  128, 64, 256,   4, 256, 256, 64, 6, 8,  64,
          16,  32, 8,   4,  20000, 4, 64,  3,   16, 3, 64, 4096};
  } else if (preset == "real-shape") {
    *d = {5120, 64,  512,  64, 1280,  8, 1024, 2304, 48, 6, 32,  128,
          512,  128, 2048, 8,  20000, 8, 256,  1,    16, 3, 256, 65536};
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "tiny-top1", "demo", "small", "real-shape"};
}

Result<ModelConfig> preset_config(const std::string& preset, const TokenizerTable& tok) {
  Dims d{};
  if (!preset_dims(preset, &d)) {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    return Status::error("--preset: unknown preset '" + preset + "' (expected one of " + names +
                         ")");
  }
  ModelConfig c;
  c.architectures = {"DeepseekV41ForCausalLM"};
  c.model_type = "deepseek_v41";
  c.dtype = "bfloat16";
  c.bos_token_id = tok.id_of(tokens::kBos);
  c.eos_token_id = tok.id_of(tokens::kEos);
  c.pad_token_id = tok.id_of(tokens::kPad);
  c.image_token_id = tok.id_of(tokens::kImage);
  const int64_t noise = tok.id_of(tokens::kSystem);
  for (auto [name, id] : {std::pair{tokens::kBos, c.bos_token_id},
                          {tokens::kEos, c.eos_token_id},
                          {tokens::kPad, c.pad_token_id},
                          {tokens::kImage, c.image_token_id},
                          {tokens::kSystem, noise}}) {
    if (id < 0)
      return Status::error(std::string("tokenizer: has no added token '") + name +
                           "' (needed by the config)");
  }
  TextConfig& t = c.text;
  t.vocab_size = tok.size;
  t.hidden_size = d.hidden;
  t.num_attention_heads = d.heads;
  t.head_dim = d.head_dim;
  t.qk_rope_head_dim = d.rope;
  t.q_lora_rank = d.q_lora;
  t.o_lora_rank = d.o_lora;
  t.o_groups = d.o_groups;
  t.moe_intermediate_size = d.inter;
  t.n_routed_experts = d.experts;
  t.num_experts_per_tok = d.topk;
  t.routed_scaling_factor = 1.5;
  t.swiglu_limit = 10.0;
  t.rms_norm_eps = 1e-20;
  t.max_position_embeddings = d.original_ctx * 16;
  t.rope_theta = 10000;
  t.rope_scaling = RopeScaling{"yarn", 16, 32, 1, d.original_ctx};
  t.compress_rope_theta = 160000;
  t.sliding_window = d.window;
  t.index_n_heads = d.index_heads;
  t.index_head_dim = d.index_dim;
  t.index_topk = d.index_topk;
  t.candidate_topk_blocks = d.cand_blocks;
  t.candidate_block_size = d.cand_size;
  t.hc_mult = 4;
  t.hc_sinkhorn_iters = 20;
  t.hc_eps = 1e-6;
  t.engram_max_ngram_size = 4;
  t.engram_vocab_size = d.engram_prime_start;
  t.engram_n_heads = d.engram_heads;
  t.engram_head_dim = d.engram_dim;
  t.engram_pad_token_id = c.pad_token_id;
  t.dspark_block_size = 5;
  t.dspark_noise_token_id = noise;
  t.dspark_markov_rank = d.markov_rank;
  t.dspark_n_routed_experts = d.dspark_experts;
  t.dspark_num_experts_per_tok = d.dspark_topk;
  set_layers(t, preset, d);
  for (const auto& l : engram_layouts(t)) t.engram_num_embeddings.push_back(l.rows());
  auto map = build_engram_token_map(tok.texts);
  if (!map) return map.status().with_context("tokenizer: ");
  t.engram_compressed_vocab_size = map->size;
  // A vision tower of the preset's own size (issue 33): the released one on real-shape; two
  // blocks elsewhere, narrow on tiny (whose images are planned at 56 x 56 pixels at least and
  // spans of 64 positions at most, to keep tests fast).
  VisionConfig v;
  v.patch_size = 14;
  v.downsample_ratio = 3;
  v.rope_theta = 10000;
  v.num_hidden_layers = 2;
  v.max_image_tokens = 1024;
  v.min_pixels = 295936;
  if (preset == "real-shape") {
    v.num_hidden_layers = 32, v.hidden_size = 1024, v.num_attention_heads = 16;
    v.intermediate_size = 2816;
  } else if (preset == "small") {
    v.hidden_size = 128, v.num_attention_heads = 4, v.intermediate_size = 256;
  } else if (preset == "demo") {
    v.hidden_size = 64, v.num_attention_heads = 4, v.intermediate_size = 128;
  } else {  // tiny, tiny-top1
    v.hidden_size = 32, v.num_attention_heads = 2, v.intermediate_size = 48;
    v.max_image_tokens = 64, v.min_pixels = 56 * 56;
  }
  c.vision = v;
  return c;
}

}  // namespace dsv41
