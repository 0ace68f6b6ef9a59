// Inventory: the released config reproduces the published totals of spec §3.6, and the check
// names every missing / unexpected / mis-shaped / mis-typed tensor.
#include "model/inventory.h"

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "model/test_config.h"

namespace dsv41 {
namespace {

struct Released {
  ModelConfig config;
  ModelPlan plan;
};

Released released_totals() {
  auto c = parse_config(testing::released_config_json(), "config.json");
  DSV41_CHECK(c.is_ok());
  auto p = build_layer_plan(c.value());
  DSV41_CHECK(p.is_ok());
  return {c.value(), p.value()};
}

TEST(Inventory, ReleasedTotalsMatchPublishedCounts) {
  const Released r = released_totals();
  const auto text = expected_text_tensors(r.config, r.plan);
  const auto vision = expected_vision_tensors(r.config);
  std::map<int, std::size_t> per_layer;
  std::size_t globals = 0, mtp = 0;
  for (const auto& t : text) {
    if (t.layer < 0)
      ++globals;
    else if (t.layer >= 40)
      ++mtp;
    else
      ++per_layer[t.layer];
  }
  EXPECT_EQ(globals, 6u);
  EXPECT_EQ(mtp, 2401u);
  EXPECT_EQ(vision.size(), 263u);
  EXPECT_EQ(per_layer[0], 2334u);      // a plain (SWA-only) layer
  EXPECT_EQ(per_layer[5], 2334u);      // Reuse adds nothing
  EXPECT_EQ(per_layer[1], 2334u + 6);  // Engram
  EXPECT_EQ(per_layer[2],
            2334u + 5 + 3);  // ratio-2 KV source: compressor (3) + keys (2) + indexer (3)
  EXPECT_EQ(per_layer[14], 2334u + 8 + 6);  // ... plus Engram
  EXPECT_EQ(per_layer[20], 2334u + 4 + 3);  // ratio-1 source: no wgate
  EXPECT_EQ(per_layer[24], 2334u + 3);      // Reindex: indexer query side only
  std::vector<ExpectedTensor> all = text;
  all.insert(all.end(), vision.begin(), vision.end());
  const InventoryTotals tot = inventory_totals(all);
  EXPECT_EQ(tot.tensors, 96085u);
  EXPECT_EQ(tot.bytes, 510286023000ull);
  EXPECT_EQ(tot.per_dtype.at("BF16"), 520u);
  EXPECT_EQ(tot.per_dtype.at("F32"), 387u);
  EXPECT_EQ(tot.per_dtype.at("F8_E4M3"), 357u);
  EXPECT_EQ(tot.per_dtype.at("F8_E8M0"), 47589u);
  EXPECT_EQ(tot.per_dtype.at("I8"), 47232u);
}

TEST(Inventory, ReleasedShapesOfSpecTable) {
  const Released r = released_totals();
  const auto text = expected_text_tensors(r.config, r.plan);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const auto& t : text) shape[t.name] = t.shape;
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape["layers.0.hc_attn_fn"], (V{24, 20480}));
  EXPECT_EQ(shape["layers.0.attn.wq_b.weight"], (V{32768, 1280}));
  EXPECT_EQ(shape["layers.0.attn.wq_b.scale"], (V{1024, 40}));
  EXPECT_EQ(shape["layers.0.attn.wo_a.weight"], (V{8192, 4096}));
  EXPECT_EQ(shape["layers.0.attn.wo_b.scale"], (V{160, 256}));
  EXPECT_EQ(shape["layers.0.ffn.experts.383.w1.weight"], (V{2304, 2560}));
  EXPECT_EQ(shape["layers.0.ffn.experts.383.w1.scale"], (V{2304, 160}));
  EXPECT_EQ(shape["layers.0.ffn.experts.0.w2.weight"], (V{5120, 1152}));
  EXPECT_EQ(shape["layers.0.ffn.experts.0.w2.scale"], (V{5120, 72}));
  EXPECT_EQ(shape["layers.0.ffn.shared_experts.w1.scale"], (V{72, 160}));
  EXPECT_EQ(shape["layers.24.attn.indexer.wq_b.scale"], (V{128, 40}));
  EXPECT_EQ(shape["layers.14.engram.embed.weight"], (V{384016682, 256}));
  EXPECT_EQ(shape["layers.1.engram.embed.scale"], (V{384006168, 8}));
  EXPECT_EQ(shape["layers.1.engram.wkv.scale"], (V{800, 192}));
  EXPECT_EQ(shape["mtp.0.main_proj.weight"], (V{5120, 15360}));
  EXPECT_EQ(shape["mtp.0.main_proj.scale"], (V{160, 480}));
  EXPECT_EQ(shape["mtp.2.confidence_head.proj.weight"], (V{1, 5376}));
  EXPECT_EQ(shape["mtp.1.ffn.gate.weight"], (V{128, 5120}));
  EXPECT_FALSE(shape.count("layers.20.attn.compressor.wgate.weight"));
  EXPECT_FALSE(shape.count("mtp.1.main_proj.weight"));
}

}  // namespace
}  // namespace dsv41
