// Layer plan: the released config reproduces spec §2.3 exactly; smaller consistent configs work;
// inconsistent ones are refused with the layer and field named. Engram primes (spec §6.2).
#include "model/layer_plan.h"

#include <gtest/gtest.h>

#include "model/engram_layout.h"
#include "model/test_config.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;

ModelConfig released() {
  auto r = parse_config(testing::released_config_json(), "config.json");
  DSV41_CHECK(r.is_ok());
  return r.value();
}

TEST(LayerPlan, ReleasedConfigMatchesSpecTable) {
  auto plan = build_layer_plan(released());
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto& L = plan->layers;
  ASSERT_EQ(L.size(), 43u);
  ASSERT_EQ(plan->num_backbone, 40);
  // Spec §2.3, row by row: (ratio, mode, kv source, top-k source).
  for (int l = 0; l < 40; ++l) {
    const LayerPlan& p = L[std::size_t(l)];
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(p.index, l);
    EXPECT_EQ(p.dspark_stage, -1);
    if (l < 2) {
      EXPECT_EQ(p.compress_ratio, 0);
      EXPECT_EQ(p.mode, AttnMode::kSwaOnly);
      EXPECT_EQ(p.kv_source, -1);
      EXPECT_EQ(p.index_source, -1);
      EXPECT_EQ(p.rope_theta, 10000);
      EXPECT_FALSE(p.yarn);
      continue;
    }
    EXPECT_EQ(p.rope_theta, 160000);
    EXPECT_TRUE(p.yarn);
    EXPECT_EQ(p.yarn_low, 15);
    EXPECT_EQ(p.yarn_high, 25);
    EXPECT_EQ(p.compress_ratio, l < 20 ? 2 : 1);
    const int kv = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    const int idx = l < 24 ? kv : 24 + 4 * ((l - 24) / 4);
    EXPECT_EQ(p.kv_source, kv);
    EXPECT_EQ(p.index_source, idx);
    const bool full = l == 2 || l == 8 || l == 14 || l == 20;
    const bool reindex = l == 24 || l == 28 || l == 32 || l == 36;
    EXPECT_EQ(p.mode, full ? AttnMode::kFull : reindex ? AttnMode::kReindex : AttnMode::kReuse);
    EXPECT_EQ(p.compressor_gate, l == 2 || l == 8 || l == 14);
    EXPECT_EQ(p.candidate_source, l == 20);
    EXPECT_EQ(p.candidate_filter, reindex ? 20 : -1);
  }
  for (int l = 0; l < 40; ++l) {
    EXPECT_EQ(L[std::size_t(l)].engram, l == 1 ? 0 : l == 14 ? 1 : -1) << l;
    EXPECT_EQ(L[std::size_t(l)].dspark_target, l >= 37 ? l - 37 : -1) << l;
    EXPECT_EQ(L[std::size_t(l)].n_routed_experts, 384);
    EXPECT_EQ(L[std::size_t(l)].experts_per_tok, 6);
  }
  for (int s = 0; s < 3; ++s) {
    const LayerPlan& p = plan->stage(s);
    EXPECT_EQ(p.dspark_stage, s);
    EXPECT_EQ(p.mode, AttnMode::kSwaOnly);
    EXPECT_EQ(p.rope_theta, 10000);
    EXPECT_FALSE(p.yarn);
    EXPECT_EQ(p.n_routed_experts, 128);
    EXPECT_EQ(p.experts_per_tok, 3);
    EXPECT_EQ(p.tensor_prefix(), "mtp." + std::to_string(s) + ".");
  }
  EXPECT_EQ(L[7].tensor_prefix(), "layers.7.");
}

TEST(LayerPlan, SmallerConsistentConfigWorks) {
  json j = testing::released_config_json();
  auto& t = j["text_config"];
  t["num_hidden_layers"] = 6;
  t["compress_ratios"] = {0, 2, 2, 1, 1, 1, 0};
  t["kv_source_layer_ids"] = {1, 3};
  t["index_source_layer_ids"] = {1, 3, 5};
  t["candidate_source_layer_id"] = 3;
  t["engram_layer_ids"] = {0};
  t["engram_vocab_size"] = 100;
  t["engram_n_heads"] = 2;
  t["engram_num_embeddings"] = {101 + 103 + 107 + 109 + 113 + 127};
  t["num_nextn_predict_layers"] = 1;
  t["dspark_target_layer_ids"] = {4, 5};
  auto c = parse_config(j, "small.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  auto plan = build_layer_plan(c.value());
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const auto& L = plan->layers;
  ASSERT_EQ(L.size(), 7u);
  EXPECT_EQ(L[0].mode, AttnMode::kSwaOnly);
  EXPECT_EQ(L[0].engram, 0);
  EXPECT_EQ(L[1].mode, AttnMode::kFull);
  EXPECT_TRUE(L[1].compressor_gate);
  EXPECT_EQ(L[2].mode, AttnMode::kReuse);
  EXPECT_EQ(L[2].kv_source, 1);
  EXPECT_EQ(L[3].mode, AttnMode::kFull);
  EXPECT_FALSE(L[3].compressor_gate);
  EXPECT_TRUE(L[3].candidate_source);
  EXPECT_EQ(L[4].mode, AttnMode::kReuse);
  EXPECT_EQ(L[5].mode, AttnMode::kReindex);
  EXPECT_EQ(L[5].candidate_filter, 3);
  EXPECT_EQ(L[5].kv_source, 3);
  EXPECT_EQ(L[6].dspark_stage, 0);
  EXPECT_EQ(L[4].dspark_target, 0);
}

struct BadPlan {
  const char* what;
  std::function<void(json&)> edit;
  const char* expect;
};

TEST(LayerPlan, InconsistentConfigsAreRefused) {
  const BadPlan cases[] = {
      {"kv source with ratio 0",
       [](json& t) {
         t["kv_source_layer_ids"] = {1, 2, 8, 14, 20};
       },
       "layer 1 has compress ratio 0"},
      {"kv source not an index source",
       [](json& t) { t["index_source_layer_ids"] = {2, 8, 20, 24, 28, 32, 36}; },
       "KV source layer 14 must also be an index source"},
      {"compressed layer before any source", [](json& t) { t["compress_ratios"][1] = 2; },
       "layer 1 (compress ratio 2): no KV source"},
      {"ratio differs from its source", [](json& t) { t["compress_ratios"][19] = 1; },
       "layer 19 (compress ratio 1): its KV source layer 14 has compress ratio 2"},
      {"candidate source not a kv source", [](json& t) { t["candidate_source_layer_id"] = 24; },
       "candidate_source_layer_id: layer 24"},
      {"DSpark stage compressed", [](json& t) { t["compress_ratios"][41] = 1; }, "DSpark stage 1"},
      {"ids not increasing",
       [](json& t) {
         t["kv_source_layer_ids"] = {2, 14, 8, 20};
       },
       "strictly increasing"},
      {"id beyond the backbone",
       [](json& t) {
         t["engram_layer_ids"] = {1, 40};
       },
       "engram_layer_ids: layer 40"},
      {"engram rows not the prime sum",
       [](json& t) {
         t["engram_num_embeddings"] = {384006168, 384016683};
       },
       "engram_num_embeddings[1]: 384016683 rows, but the hash primes of Engram layer 14 sum to "
       "384016682"},
  };
  for (const auto& c : cases) {
    json j = testing::released_config_json();
    c.edit(j["text_config"]);
    auto cfg = parse_config(j, "cfg.json");
    ASSERT_TRUE(cfg.is_ok()) << c.what << ": " << cfg.status().message();
    auto plan = build_layer_plan(cfg.value());
    ASSERT_FALSE(plan.is_ok()) << c.what << " accepted";
    EXPECT_NE(plan.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << plan.status().message();
  }
}

TEST(EngramLayout, ReleasedPrimesAndOffsets) {
  const auto layouts = engram_layouts(released().text);
  ASSERT_EQ(layouts.size(), 2u);
  const std::vector<int64_t> l1 = {16000057, 16000079, 16000081, 16000097, 16000121, 16000129,
                                   16000133, 16000183, 16000189, 16000207, 16000211, 16000253,
                                   16000277, 16000289, 16000307, 16000321, 16000339, 16000381,
                                   16000393, 16000399, 16000403, 16000409, 16000447, 16000463};
  const std::vector<int64_t> l14 = {16000477, 16000487, 16000499, 16000507, 16000511, 16000573,
                                    16000609, 16000627, 16000667, 16000669, 16000693, 16000697,
                                    16000711, 16000729, 16000759, 16000769, 16000781, 16000799,
                                    16000813, 16000819, 16000841, 16000877, 16000879, 16000889};
  EXPECT_EQ(layouts[0].primes, l1);
  EXPECT_EQ(layouts[1].primes, l14);
  EXPECT_EQ(layouts[0].rows(), 384006168);
  EXPECT_EQ(layouts[1].rows(), 384016682);
  EXPECT_EQ(layouts[0].offsets[0], 0);
  EXPECT_EQ(layouts[0].offsets[1], 16000057);
  EXPECT_EQ(layouts[1].offsets[23], 384016682 - 16000889);
  EXPECT_TRUE(check_engram_tables(released().text).is_ok());
}

TEST(EngramLayout, Primality) {
  EXPECT_FALSE(is_prime_u64(0));
  EXPECT_FALSE(is_prime_u64(1));
  EXPECT_TRUE(is_prime_u64(2));
  EXPECT_TRUE(is_prime_u64(16000057));
  EXPECT_FALSE(is_prime_u64(16000059));
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));  // largest 64-bit prime
  EXPECT_FALSE(is_prime_u64(3215031751ull));           // strong pseudoprime to bases 2, 3, 5, 7
  int count = 0;
  for (uint64_t n = 0; n < 10000; ++n) count += is_prime_u64(n);
  EXPECT_EQ(count, 1229);
}

}  // namespace
}  // namespace dsv41
