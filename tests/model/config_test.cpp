// config.json parsing: the released config's values, round trip, and one named error per bad field.
#include "model/config.h"

#include <gtest/gtest.h>

#include "model/test_config.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;
using testing::released_config_json;

TEST(Config, ParsesReleasedConfig) {
  auto r = parse_config(released_config_json(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const ModelConfig& c = r.value();
  const TextConfig& t = c.text;
  EXPECT_EQ(c.architectures, std::vector<std::string>{"DeepseekV41ForCausalLM"});
  EXPECT_EQ(c.image_token_id, 129264);
  EXPECT_EQ(c.pad_token_id, 2);
  EXPECT_EQ(c.quantization.weight_block_size, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(c.quantization.expert_dtype, "fp4");
  EXPECT_EQ(t.vocab_size, 129280);
  EXPECT_EQ(t.hidden_size, 5120);
  EXPECT_EQ(t.num_hidden_layers, 40);
  EXPECT_EQ(t.num_attention_heads, 64);
  EXPECT_EQ(t.head_dim, 512);
  EXPECT_EQ(t.qk_rope_head_dim, 64);
  EXPECT_EQ(t.q_lora_rank, 1280);
  EXPECT_EQ(t.o_lora_rank, 1024);
  EXPECT_EQ(t.o_groups, 8);
  EXPECT_EQ(t.moe_intermediate_size, 2304);
  EXPECT_EQ(t.n_routed_experts, 384);
  EXPECT_EQ(t.num_experts_per_tok, 6);
  EXPECT_DOUBLE_EQ(t.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(t.swiglu_limit, 10.0);
  EXPECT_DOUBLE_EQ(t.rms_norm_eps, 1e-20);
  EXPECT_DOUBLE_EQ(t.gate_temp, 1.0);
  EXPECT_EQ(t.max_position_embeddings, 1048576);
  ASSERT_TRUE(t.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(t.rope_scaling->factor, 16);
  EXPECT_EQ(t.rope_scaling->original_max_position_embeddings, 65536);
  EXPECT_DOUBLE_EQ(t.compress_rope_theta, 160000);
  EXPECT_EQ(t.sliding_window, 128);
  EXPECT_EQ(t.compress_ratios.size(), 43u);
  EXPECT_EQ(t.kv_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(t.index_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(t.index_topk, 512);
  EXPECT_EQ(t.candidate_source_layer_id, 20);
  EXPECT_EQ(t.candidate_topk_blocks, 2048);
  EXPECT_EQ(t.hc_mult, 4);
  EXPECT_EQ(t.hc_mix(), 24);
  EXPECT_EQ(t.hc_sinkhorn_iters, 20);
  EXPECT_EQ(t.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(t.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(t.num_nextn_predict_layers, 3);
  EXPECT_EQ(t.dspark_target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(t.dspark_n_routed_experts, 128);
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.vision->num_hidden_layers, 32);
  EXPECT_EQ(c.vision->downsample_ratio, 3);
}

TEST(Config, RoundTripsThroughJson) {
  auto a = parse_config(released_config_json(), "config.json");
  ASSERT_TRUE(a.is_ok());
  const json j = config_to_json(a.value());
  auto b = parse_config(j, "round-trip");
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(config_to_json(b.value()).dump(), j.dump());
}

struct BadField {
  const char* pointer;  // JSON pointer to edit
  json value;           // new value (null + erase=true removes the key)
  bool erase;
  const char* expect;  // substring of the error
};

TEST(Config, EveryBadFieldIsNamed) {
  const BadField cases[] = {
      {"/text_config/hidden_size", "big", false, "text_config.hidden_size: expected an integer"},
      {"/text_config/vocab_size", nullptr, true, "text_config.vocab_size: missing"},
      {"/text_config/num_hidden_layers", -3, false,
       "text_config.num_hidden_layers: value -3 out of range"},
      {"/text_config/hidden_size", 5000, false,
       "text_config.hidden_size: must be a multiple of 32"},
      {"/text_config/scoring_func", "softmax", false,
       "text_config.scoring_func: \"softmax\" is not supported"},
      {"/text_config/num_key_value_heads", 2, false, "text_config.num_key_value_heads"},
      {"/text_config/o_groups", 7, false, "text_config.o_groups: must divide"},
      {"/text_config/compress_ratios", json::array({0, 0, 2}), false,
       "text_config.compress_ratios: has 3 entries"},
      {"/text_config/compress_ratios/5", "two", false, "text_config.compress_ratios: entry 5"},
      {"/text_config/rms_norm_eps", 0.0, false, "text_config.rms_norm_eps: must be > 0"},
      {"/text_config/rope_scaling/factor", "x", false,
       "text_config.rope_scaling.factor: expected a number"},
      {"/text_config/rope_scaling/rope_type", "linear", false,
       "text_config.rope_scaling.rope_type"},
      {"/text_config/engram_num_embeddings", json::array({1}), false,
       "text_config.engram_num_embeddings: needs one entry"},
      {"/text_config/tie_word_embeddings", true, false, "text_config.tie_word_embeddings"},
      {"/text_config/num_experts_per_tok", 500, false, "text_config.num_experts_per_tok: exceeds"},
      {"/text_config/norm_topk_prob", "yes", false,
       "text_config.norm_topk_prob: expected a boolean"},
      {"/text_config/index_head_dim", 48, false, "text_config.index_head_dim"},
      {"/text_config", nullptr, true, "text_config: missing"},
      {"/quantization_config/weight_block_size", json::array({32}), false,
       "quantization_config.weight_block_size"},
      {"/quantization_config/expert_dtype", "fp8", false, "quantization_config.expert_dtype"},
      {"/architectures", json::array({"LlamaForCausalLM"}), false, "architectures"},
      {"/image_token_id", 200000, false, "not below text_config.vocab_size"},
      {"/model_type", "deepseek_v4", false, "model_type"},
  };
  for (const auto& c : cases) {
    json j = released_config_json();
    const json::json_pointer p(c.pointer);
    if (c.erase)
      j[p.parent_pointer()].erase(p.back());
    else
      j[p] = c.value;
    auto r = parse_config(j, "cfg.json");
    ASSERT_FALSE(r.is_ok()) << c.pointer << " accepted";
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.pointer << ": " << r.status().message();
    EXPECT_EQ(r.status().message().rfind("cfg.json", 0), 0u) << r.status().message();
  }
}

TEST(Config, ReportsAllBadFieldsAtOnce) {
  json j = released_config_json();
  j["text_config"]["hidden_size"] = "x";
  j["text_config"]["sliding_window"] = 0;
  auto r = parse_config(j, "cfg.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("hidden_size"), std::string::npos);
  EXPECT_NE(r.status().message().find("sliding_window"), std::string::npos);
}

TEST(Config, NotAnObjectAndMissingFile) {
  EXPECT_FALSE(parse_config(json::array(), "x.json").is_ok());
  auto r = load_config("/nonexistent/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("/nonexistent/config.json"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
