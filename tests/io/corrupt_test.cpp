// The corrupt-input suite: every malformed file or index is refused with a message naming the file
// and (where one is involved) the tensor. Built twice: plain and under ASan+UBSan (test_io_asan).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/test_util.h"

namespace dsv41 {
namespace {

using testing::raw_safetensors;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

// A valid two-tensor header: "a" F32 [2,3] at [0,24), "b" BF16 [4] at [24,32); 32 data bytes.
const std::string kA = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
const std::string kB = R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]})";
const std::string kB0 =
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]})";  // alone in a shard
std::string hdr(const std::string& body) {
  return "{" + body + "}";
}

struct FileCase {
  std::string name;
  std::string bytes;
  std::vector<std::string> must_mention;  // besides the file name
};

std::vector<FileCase> file_cases() {
  const std::string valid = raw_safetensors(hdr(kA + "," + kB), 32);
  const uint64_t hn = hdr(kA + "," + kB).size();
  std::vector<FileCase> c;
  auto with_len = [](uint64_t n, const std::string& rest) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xFF);
    return s + rest;
  };
  c.push_back({"empty_file", "", {"too small"}});
  c.push_back({"seven_bytes", valid.substr(0, 7), {"too small"}});
  c.push_back({"trunc_at_8", valid.substr(0, 8), {"exceeds the file size"}});
  c.push_back({"trunc_mid_header", valid.substr(0, 8 + hn / 2), {"exceeds the file size"}});
  c.push_back({"trunc_at_header_end", valid.substr(0, 8 + hn), {"'a'", "beyond the data section"}});
  c.push_back({"trunc_mid_data", valid.substr(0, 8 + hn + 28), {"'b'", "beyond the data section"}});
  c.push_back(
      {"trunc_last_byte", valid.substr(0, valid.size() - 1), {"'b'", "beyond the data section"}});
  c.push_back({"header_len_zero", with_len(0, "{}"), {"header length is 0"}});
  c.push_back({"header_len_huge", with_len(1ull << 40, "{}"), {"100 MB"}});
  c.push_back({"header_len_max", with_len(~0ull, "{}"), {"100 MB"}});
  c.push_back({"header_not_json", raw_safetensors("{not json at all}", 0), {"not valid JSON"}});
  c.push_back(
      {"header_truncated_json", raw_safetensors(R"({"a":{"dtype":"F32")", 0), {"not valid JSON"}});
  c.push_back({"header_array", raw_safetensors("[1,2,3]", 0), {"does not start with '{'"}});
  c.push_back({"header_leading_space", raw_safetensors(" {}", 0), {"does not start with '{'"}});
  c.push_back({"header_binary_garbage",
               raw_safetensors(std::string("{\x01\xff\xfe", 4), 0),
               {"not valid JSON"}});
  c.push_back({"duplicate_tensor", raw_safetensors(hdr(kA + "," + kA), 24), {"duplicate key 'a'"}});
  c.push_back(
      {"duplicate_field",
       raw_safetensors(
           hdr(R"("a":{"dtype":"F32","dtype":"I8","shape":[2,3],"data_offsets":[0,24]})"), 24),
       {"duplicate key 'dtype'"}});
  c.push_back(
      {"unknown_dtype",
       raw_safetensors(hdr(R"("a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,24]})"), 24),
       {"'a'", "unknown dtype 'F4'"}});
  c.push_back({"dtype_not_string",
               raw_safetensors(hdr(R"("a":{"dtype":4,"shape":[2,3],"data_offsets":[0,24]})"), 24),
               {"'a'", "dtype"}});
  c.push_back({"missing_dtype",
               raw_safetensors(hdr(R"("a":{"shape":[2,3],"data_offsets":[0,24]})"), 24),
               {"'a'", "dtype"}});
  c.push_back({"missing_shape",
               raw_safetensors(hdr(R"("a":{"dtype":"F32","data_offsets":[0,24]})"), 24),
               {"'a'", "shape"}});
  c.push_back({"shape_not_array",
               raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":6,"data_offsets":[0,24]})"), 24),
               {"'a'", "shape"}});
  c.push_back(
      {"shape_negative",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[-2,-3],"data_offsets":[0,24]})"), 24),
       {"'a'", "non-negative"}});
  c.push_back(
      {"shape_float",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]})"), 24),
       {"'a'", "non-negative integers"}});
  c.push_back(
      {"shape_overflow",
       raw_safetensors(
           hdr(R"("a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,24]})"),
           24),
       {"'a'", "overflows"}});
  c.push_back(
      {"shape_bytes_overflow",
       raw_safetensors(
           hdr(R"("a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,24]})"), 24),
       {"'a'", "overflows"}});
  c.push_back({"missing_offsets",
               raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3]})"), 24),
               {"'a'", "data_offsets"}});
  c.push_back(
      {"offsets_three",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12,24]})"), 24),
       {"'a'", "data_offsets"}});
  c.push_back(
      {"offsets_negative",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[-24,0]})"), 24),
       {"'a'", "data_offsets"}});
  c.push_back(
      {"offsets_reversed",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]})"), 24),
       {"'a'", "begin > end"}});
  c.push_back(
      {"range_size_mismatch",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})"), 20),
       {"'a'", "needs 24"}});
  c.push_back(
      {"range_beyond_file",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]})"), 24),
       {"'a'", "beyond the data section"}});
  c.push_back(
      {"overlap",
       raw_safetensors(hdr(kA + R"(,"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]})"), 24),
       {"overlaps"}});
  c.push_back(
      {"gap",
       raw_safetensors(hdr(kA + R"(,"b":{"dtype":"BF16","shape":[4],"data_offsets":[28,36]})"), 36),
       {"gap", "'b'"}});
  c.push_back(
      {"gap_at_start",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]})"), 28),
       {"gap", "'a'"}});
  c.push_back({"trailing_bytes", raw_safetensors(hdr(kA + "," + kB), 40), {"trailing bytes"}});
  c.push_back({"metadata_not_object",
               raw_safetensors(hdr(R"("__metadata__":[1],)" + kA), 24),
               {"__metadata__"}});
  c.push_back({"metadata_non_string",
               raw_safetensors(hdr(R"("__metadata__":{"format":1},)" + kA), 24),
               {"__metadata__", "format"}});
  c.push_back(
      {"unknown_field",
       raw_safetensors(hdr(R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"x":1})"), 24),
       {"'a'", "unknown field 'x'"}});
  c.push_back(
      {"entry_not_object", raw_safetensors(hdr(R"("a":[1,2])"), 0), {"'a'", "not an object"}});
  c.push_back({"empty_name",
               raw_safetensors(hdr(R"("":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})"), 0),
               {"empty name"}});
  c.push_back(
      {"too_many_dims",
       raw_safetensors(
           hdr(R"("a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]})"),
           4),
       {"'a'", "dimensions"}});
  return c;
}

TEST(CorruptSafetensors, AtLeastThirtyCases) {
  EXPECT_GE(file_cases().size(), 30u);
}

TEST(CorruptSafetensors, ValidBaselineOpens) {
  TempDir dir;
  write_file(dir.file("ok.safetensors"), raw_safetensors(hdr(kA + "," + kB), 32));
  auto f = SafetensorsFile::open(dir.file("ok.safetensors"));
  ASSERT_TRUE(f.is_ok()) << f.status().message();
}

TEST(CorruptSafetensors, EveryCaseRefusedWithNamedError) {
  TempDir dir;
  for (const auto& c : file_cases()) {
    const std::string path = dir.file(c.name + ".safetensors");
    write_file(path, c.bytes);
    auto f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.is_ok()) << c.name << " was accepted";
    const std::string& msg = f.status().message();
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    for (const auto& s : c.must_mention)
      EXPECT_NE(msg.find(s), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(CorruptSafetensors, MissingFileAndDirectory) {
  TempDir dir;
  auto f = SafetensorsFile::open(dir.file("nope.safetensors"));
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("nope.safetensors"), std::string::npos);
  auto d = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos);
}

// ---- multi-shard checkpoints ----

struct IndexCase {
  std::string name;
  std::string index;                                        // model.safetensors.index.json content
  std::vector<std::pair<std::string, std::string>> shards;  // file -> raw bytes
  std::vector<std::string> must_mention;
};

std::vector<IndexCase> index_cases() {
  const std::string s1 = raw_safetensors(hdr(kA), 24);
  const std::string s2 = raw_safetensors(hdr(kB0), 8);
  const std::string both =
      R"({"metadata":{"total_size":32},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})";
  std::vector<IndexCase> c;
  c.push_back({"missing_shard",
               both,
               {{"s1.safetensors", s1}},
               {"'b'", "s2.safetensors", "does not exist"}});
  c.push_back({"index_not_json",
               "{weight_map:",
               {{"s1.safetensors", s1}},
               {"index.json", "not a JSON object"}});
  c.push_back(
      {"index_no_weight_map", R"({"metadata":{}})", {{"s1.safetensors", s1}}, {"weight_map"}});
  c.push_back(
      {"index_empty_weight_map", R"({"weight_map":{}})", {{"s1.safetensors", s1}}, {"empty"}});
  c.push_back({"shard_path_traversal",
               R"({"weight_map":{"a":"../s1.safetensors"}})",
               {{"s1.safetensors", s1}},
               {"'a'", "plain file name"}});
  c.push_back({"shard_name_too_long",  // found by fuzz_checkpoint_index: it threw
               R"({"weight_map":{"a":")" + std::string(300, 'x') + R"(.safetensors"}})",
               {{"s1.safetensors", s1}},
               {"'a'", "cannot be looked up"}});
  c.push_back({"shard_name_not_string",
               R"({"weight_map":{"a":7}})",
               {{"s1.safetensors", s1}},
               {"'a'", "not a string"}});
  c.push_back({"tensor_not_indexed",
               R"({"weight_map":{"a":"s1.safetensors"}})",
               {{"s1.safetensors", raw_safetensors(hdr(kA + "," + kB), 32)}},
               {"'b'", "not listed"}});
  c.push_back({"indexed_tensor_missing",
               R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})",
               {{"s1.safetensors", s1}},
               {"'z'", "missing from shard"}});
  c.push_back({"tensor_in_wrong_shard",
               R"({"weight_map":{"a":"s2.safetensors","b":"s1.safetensors"}})",
               {{"s1.safetensors", s1}, {"s2.safetensors", s2}},
               {"'a'", "indexed in shard"}});
  c.push_back(
      {"total_size_mismatch",
       R"({"metadata":{"total_size":33},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})",
       {{"s1.safetensors", s1}, {"s2.safetensors", s2}},
       {"total_size 33", "32"}});
  c.push_back({"total_size_negative",
               R"({"metadata":{"total_size":-1},"weight_map":{"a":"s1.safetensors"}})",
               {{"s1.safetensors", s1}},
               {"total_size"}});
  c.push_back({"truncated_shard",
               both,
               {{"s1.safetensors", s1}, {"s2.safetensors", s2.substr(0, s2.size() - 3)}},
               {"s2.safetensors", "'b'"}});
  return c;
}

TEST(CorruptCheckpoint, EveryCaseRefusedWithNamedError) {
  for (const auto& c : index_cases()) {
    TempDir dir;
    write_file(dir.file("model.safetensors.index.json"), c.index);
    for (const auto& [file, bytes] : c.shards) write_file(dir.file(file), bytes);
    auto ck = Checkpoint::open(dir.path());
    ASSERT_FALSE(ck.is_ok()) << c.name << " was accepted";
    for (const auto& s : c.must_mention)
      EXPECT_NE(ck.status().message().find(s), std::string::npos)
          << c.name << ": " << ck.status().message();
  }
}

TEST(CorruptCheckpoint, DuplicateAcrossShardsAndEmptyDir) {
  TempDir dir;
  write_file(dir.file("s1.safetensors"), raw_safetensors(hdr(kA), 24));
  write_file(dir.file("s2.safetensors"), raw_safetensors(hdr(kA), 24));
  // Without an index the only candidate is model.safetensors: absent -> named refusal.
  auto none = Checkpoint::open(dir.path());
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("model.safetensors"), std::string::npos);
  write_file(dir.file("model.safetensors.index.json"),
             R"({"weight_map":{"a":"s1.safetensors","x":"s2.safetensors"}})");
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("'a'"), std::string::npos) << ck.status().message();
}

TEST(CorruptCheckpoint, ValidBaselineOpens) {
  TempDir dir;
  write_file(dir.file("s1.safetensors"), raw_safetensors(hdr(kA), 24));
  write_file(dir.file("s2.safetensors"), raw_safetensors(hdr(kB0), 8));
  write_file(
      dir.file("model.safetensors.index.json"),
      R"({"metadata":{"total_size":32},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
}

}  // namespace
}  // namespace dsv41
