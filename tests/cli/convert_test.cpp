// convert / validate / converted-layout loading through the real binary: round trips on the tiny
// and small presets (0 mismatches, deterministic manifests, --fp8 bf16), -0 canonicalisation (and
// the validator catching its absence), named refusals for corrupted outputs, and a conversion
// killed midway that resumes, validates and matches a clean run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "io/checkpoint.h"
#include "io/sha256.h"
#include "io/test_util.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

json manifest_of(const std::string& dir) {
  return json::parse(testing::read_file(dir + "/manifest.json"));
}

// The manifest entry of `name`.
json entry(const std::string& dir, const std::string& name) {
  const json m = manifest_of(dir);  // kept alive: the loop below iterates inside it
  for (const auto& t : m["tensors"])
    if (t["name"] == name) return t;
  ADD_FAILURE() << name << " not in the manifest";
  return json();
}

void patch_byte(const std::string& path, uint64_t offset, uint8_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(value));
}
uint8_t read_byte(const std::string& path, uint64_t offset) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  return static_cast<uint8_t>(f.get());
}

// validate's stderr without its log lines ("[time] [level] ..."): the mismatch report.
std::vector<std::string> report_lines(const std::string& err) {
  std::vector<std::string> out;
  std::istringstream in(err);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '[') out.push_back(l);
  return out;
}

class Convert : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_EQ(run("make-tiny --preset tiny --out " + src()).code, 0);
    CliRun c = run("convert --from " + src() + " --to " + out());
    ASSERT_EQ(c.code, 0) << c.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string src() { return dir_->path() + "/src"; }
  static std::string out() { return dir_->path() + "/out"; }
  // A fresh copy of the good conversion to damage.
  static std::string copy_of_out(const std::string& name) {
    const std::string d = dir_->path() + "/" + name;
    fs::remove_all(d);
    fs::copy(out(), d, fs::copy_options::recursive);
    return d;
  }
  static TempDir* dir_;
};
TempDir* Convert::dir_ = nullptr;

TEST_F(Convert, TinyRoundTripIsExactDeterministicAndLoads) {
  CliRun v = run("validate --from " + src() + " --to " + out());
  ASSERT_EQ(v.code, 0) << v.err;
  auto vj = json::parse(v.out);
  EXPECT_EQ(vj["mismatches"], 0);
  EXPECT_EQ(vj["tensors_checked"], manifest_of(out())["tensors"].size());
  // Progress on stderr as convert prints it (every few seconds on long runs, and at the end).
  const std::string n = std::to_string(manifest_of(out())["tensors"].size());
  EXPECT_NE(v.err.find("validate: tensors " + n + "/" + n + ", "), std::string::npos) << v.err;
  CliRun i = run("inspect --model " + out() + " --verify");
  EXPECT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("converted layout"), std::string::npos);
  EXPECT_NE(i.out.find("every sha256 matches"), std::string::npos);
  // Deterministic: a second conversion writes the same manifest, byte for byte.
  ASSERT_EQ(run("convert --threads 1 --from " + src() + " --to " + dir_->path() + "/again").code,
            0);
  EXPECT_EQ(testing::read_file(out() + "/manifest.json"),
            testing::read_file(dir_->path() + "/again/manifest.json"));
  // The layouts the rules promise are all there.
  std::set<std::string> layouts;
  const json m = manifest_of(out());
  for (const auto& t : m["tensors"]) layouts.insert(t["layout"].get<std::string>());
  for (const char* l : {"copy", "mxfp4_w13", "e8m0_w13", "mxfp4_canonical", "engram_bucket"})
    EXPECT_TRUE(layouts.count(l)) << l;
  // Validation by scope.
  for (const char* scope : {"dense", "layer:1"}) {
    CliRun s =
        run("validate --scope " + std::string(scope) + " --from " + src() + " --to " + out());
    EXPECT_EQ(s.code, 0) << scope << s.err;
    EXPECT_LT(json::parse(s.out)["tensors_checked"].get<int>(), vj["tensors_checked"].get<int>());
  }
  EXPECT_EQ(run("validate --scope layers --from " + src() + " --to " + out()).code, 2);
}

TEST_F(Convert, Bf16OptionIsExact) {
  const std::string d = dir_->path() + "/bf16";
  ASSERT_EQ(run("convert --fp8 bf16 --from " + src() + " --to " + d).code, 0);
  CliRun v = run("validate --from " + src() + " --to " + d);
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_EQ(run("inspect --model " + d + " --verify").code, 0);
  int bf16 = 0;
  const json m = manifest_of(d);
  for (const auto& t : m["tensors"]) bf16 += t["layout"] == "fp8_to_bf16";
  EXPECT_GT(bf16, 10);
  // A manifest of the other option in this directory: refused (file sizes differ).
  const std::string mixed = copy_of_out("mixed");
  fs::copy_file(d + "/manifest.json", mixed + "/manifest.json",
                fs::copy_options::overwrite_existing);
  CliRun i = run("inspect --model " + mixed);
  EXPECT_EQ(i.code, 2);
  EXPECT_NE(i.err.find("the manifest records"), std::string::npos) << i.err;
}

TEST_F(Convert, NegativeZeroNibblesBecomePositiveZero) {
  TempDir t;
  const std::string s = t.path() + "/src", o = t.path() + "/out";
  fs::copy(src(), s, fs::copy_options::recursive);
  const std::string name = "layers.0.ffn.experts.0.w2.weight";
  uint64_t src_off = 0;
  std::string shard;
  {
    auto ck = Checkpoint::open(s);
    ASSERT_TRUE(ck.is_ok());
    const auto* e = ck->find(name);
    ASSERT_NE(e, nullptr);
    shard = ck->shards()[e->shard].path();
    src_off = 8 + ck->shards()[e->shard].header_size() + e->info->begin;
  }
  patch_byte(shard, src_off, 0x88);      // -0, -0
  patch_byte(shard, src_off + 1, 0x18);  // -0 high nibble 1 -> low nibble -0
  patch_byte(shard, src_off + 2, 0x83);  // high -0
  ASSERT_EQ(run("convert --from " + s + " --to " + o).code, 0);
  CliRun v = run("validate --from " + s + " --to " + o);
  ASSERT_EQ(v.code, 0) << v.err;
  const json e = entry(o, name);
  const std::string file = o + "/" + e["file"].get<std::string>();
  const uint64_t off = e["offset"];
  EXPECT_EQ(read_byte(file, off), 0x00);
  EXPECT_EQ(read_byte(file, off + 1), 0x10);
  EXPECT_EQ(read_byte(file, off + 2), 0x03);
  // An output that kept a -0 is caught by the validator even with a consistent sha256.
  patch_byte(file, off, 0x08);
  json m = manifest_of(o);
  {
    std::ifstream f(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (auto& t2 : m["tensors"])
      if (t2["name"] == name)
        t2["sha256"] = sha256_hex(bytes.data() + off, t2["bytes"].get<uint64_t>());
  }
  testing::write_file(o + "/manifest.json", m.dump(1));
  CliRun bad = run("validate --from " + s + " --to " + o);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find(name + ": value differs"), std::string::npos) << bad.err;
}

TEST_F(Convert, FlippedByteIsNamedByValidateAndVerify) {
  for (const char* name :
       {"layers.0.ffn.experts.1.w13.weight", "layers.1.engram.embed.bucket.3.weight",
        "layers.0.attn.wq_a.weight", "embed.weight", "layers.2.ffn.experts.0.w13.scale"}) {
    const std::string d = copy_of_out("flip");
    const json e = entry(d, name);
    const std::string file = d + "/" + e["file"].get<std::string>();
    const uint64_t off = e["offset"].get<uint64_t>() + e["bytes"].get<uint64_t>() / 2;
    patch_byte(file, off, static_cast<uint8_t>(read_byte(file, off) ^ 0x01));
    CliRun v = run("validate --from " + src() + " --to " + d);
    EXPECT_EQ(v.code, 2) << name;
    EXPECT_NE(v.err.find(std::string(name) + ":"), std::string::npos) << v.err;
    EXPECT_EQ(run("inspect --model " + d).code, 0)
        << name;  // sizes and names still fine without --verify
    CliRun i = run("inspect --model " + d + " --verify");
    EXPECT_EQ(i.code, 2) << name;
    EXPECT_NE(i.err.find(std::string(name) + ": sha256"), std::string::npos) << i.err;
  }
}

TEST_F(Convert, DamagedConversionsAreRefusedWithNames) {
  {  // truncated data file
    const std::string d = copy_of_out("trunc");
    fs::resize_file(d + "/layers.0.experts.bin", fs::file_size(d + "/layers.0.experts.bin") - 100);
    CliRun i = run("inspect --model " + d);
    EXPECT_EQ(i.code, 2);
    EXPECT_NE(i.err.find("layers.0.experts.bin"), std::string::npos) << i.err;
    CliRun v = run("validate --from " + src() + " --to " + d);
    EXPECT_EQ(v.code, 2);
    EXPECT_NE(v.err.find("layers.0.experts.bin: file size"), std::string::npos) << v.err;
  }
  {  // a tensor missing from the manifest
    const std::string d = copy_of_out("missing");
    json m = manifest_of(d);
    auto& ts = m["tensors"];
    for (std::size_t k = 0; k < ts.size(); ++k)
      if (ts[k]["name"] == "layers.1.attn.wkv.weight") ts.erase(k);
    testing::write_file(d + "/manifest.json", m.dump(1));
    CliRun i = run("inspect --model " + d);
    EXPECT_EQ(i.code, 2);
    EXPECT_NE(i.err.find("layers.1.attn.wkv.weight: missing"), std::string::npos) << i.err;
    CliRun v = run("validate --from " + src() + " --to " + d);
    EXPECT_NE(v.err.find("layers.1.attn.wkv.weight: missing"), std::string::npos) << v.err;
  }
  {  // an edited manifest: a shape changed, and a malformed field
    const std::string d = copy_of_out("edited");
    json m = manifest_of(d);
    for (auto& t : m["tensors"])
      if (t["name"] == "norm.weight") t["shape"][0] = t["shape"][0].get<int>() * 2;
    testing::write_file(d + "/manifest.json", m.dump(1));
    CliRun i = run("inspect --model " + d);
    EXPECT_EQ(i.code, 2);
    EXPECT_NE(i.err.find("norm.weight"), std::string::npos) << i.err;
    testing::write_file(d + "/manifest.json", "{\"format\": \"dsv41-converted\"");
    EXPECT_EQ(run("inspect --model " + d).code, 2);
  }
  {  // the manifest of another model
    TempDir t;
    ASSERT_EQ(run("make-tiny --preset demo --out " + t.path() + "/demo").code, 0);
    ASSERT_EQ(run("convert --from " + t.path() + "/demo --to " + t.path() + "/demo_out").code, 0);
    const std::string d = copy_of_out("other");
    fs::copy_file(t.path() + "/demo_out/manifest.json", d + "/manifest.json",
                  fs::copy_options::overwrite_existing);
    CliRun i = run("inspect --model " + d);
    EXPECT_EQ(i.code, 2);
    EXPECT_NE(i.err.find("manifest and model differ"), std::string::npos) << i.err;
    CliRun v = run("validate --from " + src() + " --to " + d);
    EXPECT_EQ(v.code, 2);
    EXPECT_NE(v.err.find("source identity differs"), std::string::npos) << v.err;
    // A whole conversion of the other model: that is said in one line, first, not once per tensor.
    CliRun o = run("validate --from " + src() + " --to " + t.path() + "/demo_out");
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(o.err.rfind("mismatch: manifest.json: source identity differs", 0), 0u) << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err.substr(0, 2000);
    EXPECT_EQ(json::parse(o.out)["mismatches"], 1);
  }
}

TEST_F(Convert, ConversionOfAnotherSameShapeCheckpointIsSaidInOneLine) {
  // Another seed: the same config, index and tokenizer (so the manifest's source identity
  // matches), other weights. Every weight tensor differs.
  TempDir t;
  const std::string s = t.path() + "/src", o = t.path() + "/out";
  ASSERT_EQ(run("make-tiny --preset tiny --seed 777 --out " + s).code, 0);
  ASSERT_EQ(run("convert --from " + s + " --to " + o).code, 0);
  CliRun v = run("validate --from " + src() + " --to " + o);
  EXPECT_EQ(v.code, 2);
  const json j = json::parse(v.out);
  const int checked = j["tensors_checked"], differing = j["tensors_differing"];
  EXPECT_GT(differing * 2, checked);
  EXPECT_TRUE(j["not_made_from_source"].get<bool>());
  EXPECT_EQ(j["mismatches"].get<int>(), differing);
  const std::string first =
      "mismatch: the conversion was not made from --from: " + std::to_string(differing) + " of " +
      std::to_string(checked) + " tensors differ";
  // The headline, 5 examples, the count of the rest (the progress log line aside).
  const auto lines = report_lines(v.err);
  ASSERT_EQ(lines.size(), 7u) << v.err.substr(0, 2000);
  EXPECT_EQ(lines[0].rfind(first, 0), 0u) << v.err.substr(0, 2000);
  EXPECT_EQ(lines[6], "validate: " + std::to_string(differing - 5) +
                          " more mismatches not shown (--verbose lists them all)");
  // --verbose: every mismatch, one line each, after the headline.
  CliRun all = run("validate --verbose --from " + src() + " --to " + o);
  EXPECT_EQ(all.code, 2);
  EXPECT_EQ(report_lines(all.err).size(), std::size_t(differing) + 1);
  EXPECT_EQ(all.err.find("more mismatches not shown"), std::string::npos);
  // A conversion damaged in one tensor is not taken for another checkpoint's: it is listed.
  const std::string d = copy_of_out("one_flip");
  const json e = entry(d, "embed.weight");
  const std::string file = d + "/" + e["file"].get<std::string>();
  const uint64_t off = e["offset"].get<uint64_t>() + 3;
  patch_byte(file, off, static_cast<uint8_t>(read_byte(file, off) ^ 0x01));
  CliRun one = run("validate --from " + src() + " --to " + d);
  EXPECT_EQ(one.code, 2);
  EXPECT_EQ(report_lines(one.err),
            std::vector<std::string>{
                "mismatch: embed.weight: sha256 of the bytes differs from the manifest"});
  EXPECT_FALSE(json::parse(one.out)["not_made_from_source"].get<bool>());
}

TEST(ConvertResume, KilledMidwayResumesAndMatchesACleanRun) {
  TempDir t;
  const std::string s = t.path() + "/src", o = t.path() + "/out", clean = t.path() + "/clean";
  ASSERT_EQ(run("make-tiny --preset small --out " + s).code, 0);
  pid_t pid = fork();
  if (pid == 0) {
    FILE* devnull = freopen("/dev/null", "w", stderr);
    (void)devnull;
    // The lowest priority: on a busy machine the watching test thread, not the conversion, gets
    // the core, so it sees the journal grow and kills the conversion before it ends.
    (void)!nice(19);
    execl(DSV41_BINARY, "dsv41", "convert", "--threads", "1", "--from", s.c_str(), "--to",
          o.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill it once a few files are journaled (and well before the end).
  bool killed = false;
  for (int i = 0; i < 3000 && !killed; ++i) {
    std::ifstream j(o + "/convert.journal");
    int lines = 0;
    for (std::string line; std::getline(j, line);) ++lines;
    if (lines >= 4) {
      kill(pid, SIGKILL);
      killed = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(killed) << "conversion finished before it could be interrupted";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(o + "/manifest.json"));
  CliRun i = run("inspect --model " + o);
  EXPECT_EQ(i.code, 2);  // never loads as complete
  EXPECT_NE(i.err.find("unfinished conversion"), std::string::npos) << i.err;
  CliRun again = run("convert --from " + s + " --to " + o);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_GE(json::parse(again.out)["files_resumed"].get<int>(), 3);
  CliRun v = run("validate --from " + s + " --to " + o);
  EXPECT_EQ(v.code, 0) << v.err;
  CliRun load = run("inspect --model " + o + " --verify");
  EXPECT_EQ(load.code, 0) << load.err;
  ASSERT_EQ(run("convert --from " + s + " --to " + clean).code, 0);
  EXPECT_EQ(testing::read_file(o + "/manifest.json"), testing::read_file(clean + "/manifest.json"));
  EXPECT_FALSE(fs::exists(o + "/convert.journal"));
  for (const auto& f : fs::directory_iterator(o))
    EXPECT_NE(f.path().extension(), ".partial") << f.path();
}

}  // namespace
}  // namespace dsv41
