// safetensors writer/reader round trip and multi-shard checkpoints (the happy paths).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/checkpoint.h"
#include "io/test_util.h"

namespace dsv41 {
namespace {

using testing::TempDir;

TEST(Safetensors, RoundTripZeroCopy) {
  TempDir dir;
  const std::vector<TensorSpec> specs = {
      {"w.weight", DType::kF8_E4M3, {3, 5}}, {"w.scale", DType::kF8_E8M0, {1, 1}},
      {"norm.weight", DType::kBF16, {7}},    {"hc_fn", DType::kF32, {2, 3}},
      {"empty", DType::kF32, {0, 4}},
  };
  auto fill = [&](std::size_t i, std::span<uint8_t> out) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = uint8_t(i * 31 + k);
  };
  ASSERT_TRUE(
      write_safetensors(dir.file("a.safetensors"), specs, fill, {{"format", "pt"}}).is_ok());
  auto f = SafetensorsFile::open(dir.file("a.safetensors"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), specs.size());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ((8 + f->header_size()) % 8, 0u);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo* t = f->find(specs[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->shape, specs[i].shape);
    auto b = f->bytes(*t);
    ASSERT_EQ(b.size(), specs[i].nbytes());
    for (std::size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], uint8_t(i * 31 + k));
    // Widest dtypes first: every tensor naturally aligned within the data section.
    EXPECT_EQ(t->begin % dtype_size(t->dtype), 0u) << t->name;
  }
  EXPECT_EQ(f->find("missing"), nullptr);
}

TEST(Safetensors, WriterRefusesDuplicates) {
  TempDir dir;
  std::vector<TensorSpec> specs = {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}};
  Status s =
      write_safetensors(dir.file("d.safetensors"), specs, [](std::size_t, std::span<uint8_t>) {});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'x'"), std::string::npos);
}

void write_two_shards(const TempDir& dir) {
  auto fill = [](std::size_t i, std::span<uint8_t> out) {
    std::memset(out.data(), int(i + 1), out.size());
  };
  ASSERT_TRUE(write_safetensors(dir.file("s-1.safetensors"),
                                {{"a", DType::kF32, {4}}, {"b", DType::kI8, {3}}}, fill)
                  .is_ok());
  ASSERT_TRUE(
      write_safetensors(dir.file("s-2.safetensors"), {{"c", DType::kBF16, {2, 2}}}, fill).is_ok());
  ASSERT_TRUE(write_index_json(
                  dir.path(),
                  {{"a", "s-1.safetensors"}, {"b", "s-1.safetensors"}, {"c", "s-2.safetensors"}},
                  16 + 3 + 8)
                  .is_ok());
}

TEST(Checkpoint, MultiShardThroughIndex) {
  TempDir dir;
  write_two_shards(dir);
  auto c = Checkpoint::open(dir.path());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->shards().size(), 2u);
  EXPECT_EQ(c->tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c->total_bytes(), 27u);
  EXPECT_EQ(c->bytes("c").size(), 8u);
  EXPECT_EQ(c->bytes("b")[0], 2);
  EXPECT_EQ(c->find("c")->shard, 1u);
}

TEST(Checkpoint, SingleFileWithoutIndex) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), {{"x", DType::kF32, {2}}},
                                [](std::size_t, std::span<uint8_t>) {})
                  .is_ok());
  auto c = Checkpoint::open(dir.path());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->tensor_names().size(), 1u);
}

}  // namespace
}  // namespace dsv41
