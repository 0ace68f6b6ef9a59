// make-tiny: the tiny preset covers every layer mode, passes the inventory check, is deterministic
// from the seed, and its weights have the intended scale; the inventory check names tampering.
#include "model/tiny_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "io/checkpoint.h"
#include "io/test_util.h"
#include "model/engram_layout.h"
#include "model/inventory.h"
#include "model/layer_plan.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

struct Loaded {
  ModelConfig config;
  ModelPlan plan;
};

Loaded load(const std::string& dir) {
  auto c = load_config(dir + "/config.json");
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  auto p = build_layer_plan(c.value());
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return {c.value(), p.value()};
}

Result<MakeTinyResult> make(const std::string& dir, uint64_t seed,
                            const std::string& preset = "tiny") {
  MakeTinyOptions o;
  o.out_dir = dir;
  o.seed = seed;
  o.preset = preset;
  o.threads = 2;
  return make_tiny_checkpoint(o);
}

TEST(MakeTiny, TinyCoversEveryModeAndPassesInventory) {
  TempDir dir;
  auto r = make(dir.path(), 1);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_GE(r->shards, 2u);
  Loaded m = load(dir.path());
  std::set<std::string> modes;
  bool engram = false, cand_src = false, cand_filter = false, gate = false, ratio1_full = false;
  for (const auto& p : m.plan.layers) {
    modes.insert(std::string(attn_mode_name(p.mode)));
    engram |= p.engram >= 0;
    cand_src |= p.candidate_source;
    cand_filter |= p.candidate_filter >= 0;
    gate |= p.compressor_gate;
    ratio1_full |= p.mode == AttnMode::kFull && p.compress_ratio == 1;
  }
  EXPECT_EQ(modes, (std::set<std::string>{"SWA-only", "Full", "Reuse", "Reindex"}));
  EXPECT_TRUE(engram && cand_src && cand_filter && gate && ratio1_full);
  EXPECT_EQ(m.config.text.num_nextn_predict_layers, 3);
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  // The text model's tensors and the preset's vision tower (2 blocks) are all there.
  ASSERT_TRUE(m.config.vision.has_value());
  EXPECT_EQ(m.config.vision->num_hidden_layers, 2);
  auto expected = expected_text_tensors(m.config, m.plan);
  const auto vision = expected_vision_tensors(m.config);
  EXPECT_EQ(vision.size(), 2u + 2 * 8 + 1 + 4);
  expected.insert(expected.end(), vision.begin(), vision.end());
  const auto rep = check_inventory(expected, ck.value());
  EXPECT_TRUE(rep.ok()) << rep.summary();
  EXPECT_EQ(rep.matched, ck->tensor_names().size());
  EXPECT_EQ(rep.ignored_vision, 0u);
  // Tokenizer-derived fields are consistent with the files written.
  auto tok = read_tokenizer_file(dir.path() + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_EQ(m.config.text.vocab_size, tok->size);
  auto map = build_engram_token_map(tok->texts);
  ASSERT_TRUE(map.is_ok());
  EXPECT_EQ(m.config.text.engram_compressed_vocab_size, map->size);
  EXPECT_LT(map->size, tok->size);  // case/space variants share compressed ids
  EXPECT_TRUE(check_engram_tables(m.config.text).is_ok());
}

TEST(MakeTiny, DeterministicFromSeed) {
  TempDir a, b, c;
  ASSERT_TRUE(make(a.path(), 7).is_ok());
  ASSERT_TRUE(make(b.path(), 7).is_ok());
  ASSERT_TRUE(make(c.path(), 8).is_ok());
  std::size_t files = 0, differing = 0;
  for (const auto& e : fs::directory_iterator(a.path())) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(testing::read_file(a.file(name)), testing::read_file(b.file(name))) << name;
    if (name.find(".safetensors") != std::string::npos && name.find("index") == std::string::npos)
      differing += testing::read_file(a.file(name)) != testing::read_file(c.file(name));
    ++files;
  }
  EXPECT_GE(files, 6u);
  EXPECT_GE(differing, 1u);
}

TEST(MakeTiny, WeightsHaveTheIntendedScale) {
  TempDir dir;
  ASSERT_TRUE(make(dir.path(), 3).is_ok());
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.is_ok());
  // FP8 linear: dequantized std ~ 1/sqrt(in), no NaN codes.
  const auto w = ck->bytes("layers.3.attn.wq_a.weight");
  const auto s = ck->bytes("layers.3.attn.wq_a.scale");
  const auto* info = ck->find("layers.3.attn.wq_a.weight")->info;
  const int64_t out = info->shape[0], in = info->shape[1], sb = (in + 31) / 32;
  double sum2 = 0;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      const float v = e4m3_to_float(w[std::size_t(o * in + i)]);
      ASSERT_FALSE(std::isnan(v));
      const double x = double(v) * e8m0_to_double(s[std::size_t((o / 32) * sb + i / 32)]);
      sum2 += x * x;
    }
  const double stddev = std::sqrt(sum2 / double(out * in));
  EXPECT_GT(stddev, 0.4 / std::sqrt(double(in)));
  EXPECT_LT(stddev, 2.5 / std::sqrt(double(in)));
  // Scales vary between blocks (so block indexing bugs show up).
  std::set<uint8_t> distinct(s.begin(), s.end());
  EXPECT_GE(distinct.size(), 2u);
  // MXFP4 expert: packed nibbles with per-32 scales, same target.
  const auto ew = ck->bytes("layers.0.ffn.experts.1.w1.weight");
  const auto es = ck->bytes("layers.0.ffn.experts.1.w1.scale");
  const auto* einfo = ck->find("layers.0.ffn.experts.1.w1.weight")->info;
  const int64_t ein = einfo->shape[1] * 2;
  sum2 = 0;
  for (int64_t k = 0; k < einfo->shape[0] * ein; ++k) {
    const double x = e2m1_to_float(e2m1_nibble(ew.data(), std::size_t(k))) *
                     e8m0_to_double(es[std::size_t((k / ein) * (ein / 32) + (k % ein) / 32)]);
    sum2 += x * x;
  }
  const double estd = std::sqrt(sum2 / double(einfo->shape[0] * ein));
  EXPECT_GT(estd, 0.4 / std::sqrt(double(ein)));
  EXPECT_LT(estd, 2.5 / std::sqrt(double(ein)));
}

TEST(MakeTiny, RefusesNonEmptyDirAndUnknownPreset) {
  TempDir dir;
  testing::write_file(dir.file("something"), "x");
  auto r = make(dir.path(), 0);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not empty"), std::string::npos);
  TempDir d2;
  auto p = make(d2.path(), 0, "huge");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("--preset: unknown preset 'huge'"), std::string::npos);
}

// Rewrites the shard holding `name` with that tensor dropped (and the index updated), or with its
// shape / dtype changed; the inventory check must name it.
TEST(Inventory, CheckNamesTamperedTensors) {
  TempDir dir;
  ASSERT_TRUE(make(dir.path(), 5).is_ok());
  Loaded m = load(dir.path());
  const auto expected = expected_text_tensors(m.config, m.plan);
  struct Item {
    TensorSpec spec;
    std::span<const uint8_t> data;  // empty for added tensors (written as zeros)
  };
  auto tampered = [&](std::function<void(std::vector<Item>&)> edit) {
    auto ck = Checkpoint::open(dir.path());
    EXPECT_TRUE(ck.is_ok());
    const auto& shard = ck->shards()[0];
    std::vector<Item> items;
    for (const auto& t : shard.tensors())
      items.push_back({{t.name, t.dtype, t.shape}, shard.bytes(t)});
    edit(items);
    std::vector<TensorSpec> specs;
    std::vector<std::pair<std::string, std::string>> wm;
    uint64_t total = 0;
    for (const auto& it : items) {
      specs.push_back(it.spec);
      wm.emplace_back(it.spec.name, "a.safetensors");
      total += it.spec.nbytes();
    }
    TempDir out;
    EXPECT_TRUE(write_safetensors(out.file("a.safetensors"), specs,
                                  [&](std::size_t i, std::span<uint8_t> o) {
                                    std::memcpy(o.data(), items[i].data.data(),
                                                std::min(o.size(), items[i].data.size()));
                                  })
                    .is_ok());
    EXPECT_TRUE(write_index_json(out.path(), wm, total).is_ok());
    auto ck2 = Checkpoint::open(out.path());
    EXPECT_TRUE(ck2.is_ok()) << ck2.status().message();
    // Only the first shard's tensors are present: compare against the expected subset of that
    // shard.
    std::vector<ExpectedTensor> subset;
    for (const auto& e : expected)
      if (shard.find(e.name)) subset.push_back(e);
    return check_inventory(subset, ck2.value());
  };
  auto ok = tampered([](std::vector<Item>&) {});
  EXPECT_TRUE(ok.ok()) << ok.summary();
  auto missing = tampered([](std::vector<Item>& s) { s.erase(s.begin() + 1); });
  ASSERT_EQ(missing.missing.size(), 1u);
  auto shape = tampered([](std::vector<Item>& s) { s[0].spec.shape[0] += 1; });
  ASSERT_EQ(shape.wrong_shape.size(), 1u);
  EXPECT_NE(shape.wrong_shape[0].find("expected"), std::string::npos);
  auto dtype = tampered([](std::vector<Item>& s) { s[0].spec.dtype = DType::kF16; });
  ASSERT_EQ(dtype.wrong_dtype.size(), 1u);
  EXPECT_NE(dtype.wrong_dtype[0].find("found F16"), std::string::npos);
  auto extra = tampered([](std::vector<Item>& s) {
    s.push_back({{"layers.0.bogus", DType::kF32, {2}}, {}});
  });
  ASSERT_EQ(extra.extra, std::vector<std::string>{"layers.0.bogus"});
  auto vision = tampered([](std::vector<Item>& s) {
    s.push_back({{"vision.blocks.99.norm1.weight", DType::kBF16, {8}}, {}});
  });
  EXPECT_TRUE(vision.ok());
  EXPECT_EQ(vision.ignored_vision, 1u);
}

}  // namespace
}  // namespace dsv41
