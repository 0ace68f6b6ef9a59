// Converted-checkpoint loading checks (see converted_checkpoint.h).
#include "model/convert/converted_checkpoint.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "model/convert/converted_layout.h"
#include "model/inventory.h"
#include "model/layer_plan.h"

namespace dsv41 {

namespace fs = std::filesystem;

bool is_converted_checkpoint(const std::string& dir) {
  return fs::exists(fs::path(dir) / "manifest.json") ||
         fs::exists(fs::path(dir) / "convert.journal");
}

Result<ConvertedCheckpoint> open_converted_checkpoint(const std::string& dir, bool verify) {
  ConvertedCheckpoint ck;
  auto m = read_manifest(dir);
  if (!m) return m.status();
  ck.manifest = std::move(*m);
  const Manifest& man = ck.manifest;
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  auto cfg_sha = sha256_file(cfg_path);
  if (!cfg_sha) return cfg_sha.status();
  if (*cfg_sha != man.source.config_sha256)
    return Status::error(cfg_path + ": sha256 " + *cfg_sha +
                         " is not the source config the manifest was made from (" +
                         man.source.config_sha256 + "): manifest and model differ");
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    auto tok = sha256_file((fs::path(dir) / "tokenizer.json").string());
    if (!tok) return tok.status();
    if (*tok != man.source.tokenizer_sha256)
      return Status::error((fs::path(dir) / "tokenizer.json").string() +
                           ": not the tokenizer the manifest records");
  }
  auto cfg = load_config(cfg_path);
  if (!cfg) return cfg.status();
  ck.config = *cfg;
  auto plan = build_layer_plan(*cfg);
  if (!plan) return plan.status();

  // What the config needs, in the converted layout.
  std::vector<SourceTensor> source;
  for (const auto& e : expected_text_tensors(*cfg, *plan))
    source.push_back({e.name, e.dtype, e.shape});
  for (const auto& e : expected_vision_tensors(*cfg)) source.push_back({e.name, e.dtype, e.shape});
  auto files = plan_conversion(source, cfg->text, man.fp8 == "bf16");
  if (!files) return files.status();
  std::map<std::string, const OutTensor*> expected;
  for (const auto& f : *files)
    for (const auto& t : f.tensors) expected[t.name] = &t;
  std::map<std::string, uint64_t> sizes;
  for (const auto& f : man.files) {
    const fs::path p = fs::path(dir) / f.name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return Status::error(p.string() + ": missing");
    if (size != f.bytes)
      return Status::error(
          fmt::format("{}: {} bytes, the manifest records {} (truncated or replaced)", p.string(),
                      size, f.bytes));
    sizes[f.name] = f.bytes;
  }
  for (const auto& t : man.tensors) {
    auto e = expected.find(t.name);
    if (e == expected.end())
      return Status::error(t.name + ": in the manifest but not part of this model");
    if (e->second->dtype != t.dtype || e->second->shape != t.shape)
      return Status::error(fmt::format("{}: {} {} in the manifest, the config needs {} {}", t.name,
                                       dtype_name(t.dtype), shape_to_string(t.shape),
                                       dtype_name(e->second->dtype),
                                       shape_to_string(e->second->shape)));
    auto s = sizes.find(t.file);
    if (s == sizes.end())
      return Status::error(t.name + ": its file " + t.file + " is not listed in the manifest");
    if (t.offset + t.bytes > s->second || t.offset % kTensorAlignment != 0)
      return Status::error(fmt::format("{}: bytes [{}, {}) do not lie aligned inside {} ({} bytes)",
                                       t.name, t.offset, t.offset + t.bytes, t.file, s->second));
    ck.payload_bytes += t.bytes;
  }
  if (man.tensors.size() != expected.size()) {
    std::map<std::string, bool> have;
    for (const auto& t : man.tensors) have[t.name] = true;
    for (const auto& [name, t] : expected)
      if (!have.count(name)) return Status::error(name + ": missing from the converted checkpoint");
  }
  if (verify) {
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, std::shared_ptr<MappedFile>> maps;
    for (const auto& [name, size] : sizes) {
      auto mf = MappedFile::open((fs::path(dir) / name).string());
      if (!mf) return mf.status();
      maps[name] = *mf;
    }
    // Hash in parallel; report the first mismatch in manifest order.
    std::vector<std::string> bad(man.tensors.size());
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < man.tensors.size();) {
        const auto& t = man.tensors[i];
        const auto& mf = maps[t.file];
        if (sha256_hex(mf->data() + t.offset, t.bytes) != t.sha256) bad[i] = t.name;
        mf->release(mf->data() + t.offset, t.bytes);
      }
    };
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i)
      pool.emplace_back(worker);
    for (auto& th : pool) th.join();
    for (const auto& b : bad)
      if (!b.empty())
        return Status::error(b +
                             ": sha256 of its bytes differs from the manifest (corrupted data)");
    ck.verify_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return ck;
}

}  // namespace dsv41
