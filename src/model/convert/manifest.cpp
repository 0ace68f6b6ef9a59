// manifest.json serialisation (deterministic: sorted, no timestamps) and fail-closed parsing.
#include "model/convert/manifest.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/sha256.h"
#include "io/text_file.h"

namespace dsv41 {

using nlohmann::json;

std::string manifest_to_json(const Manifest& m) {
  json j;
  j["format"] = kManifestFormat;
  j["format_version"] = kManifestVersion;
  j["converter_version"] = m.converter_version;
  j["options"] = {{"fp8", m.fp8}};
  j["source"] = {{"config_sha256", m.source.config_sha256},
                 {"index_sha256", m.source.index_sha256},
                 {"tokenizer_sha256", m.source.tokenizer_sha256},
                 {"tensors", m.source.tensors},
                 {"bytes", m.source.bytes}};
  json files = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = std::move(files);
  json tensors = json::array();
  for (const auto& t : m.tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"file", t.file},
                       {"offset", t.offset},
                       {"bytes", t.bytes},
                       {"sha256", t.sha256},
                       {"layout", t.layout}});
  j["tensors"] = std::move(tensors);
  return j.dump(1) + "\n";
}

namespace {

template <typename T>
Status get(const json& o, const char* key, T& out, const std::string& ctx) {
  auto it = o.find(key);
  if (it == o.end()) return Status::error(ctx + key + ": missing");
  try {
    out = it->get<T>();
  } catch (const std::exception&) {
    return Status::error(ctx + key + ": wrong type");
  }
  return Status::ok();
}

}  // namespace

Result<Manifest> parse_manifest(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::error(where + ": not a JSON object");
  const std::string ctx = where + ": ";
  std::string format;
  int version = 0;
  DSV41_RETURN_IF_ERROR(get(j, "format", format, ctx));
  DSV41_RETURN_IF_ERROR(get(j, "format_version", version, ctx));
  if (format != kManifestFormat || version != kManifestVersion)
    return Status::error(fmt::format("{}format: '{}' version {} is not {} version {}", ctx, format,
                                     version, kManifestFormat, kManifestVersion));
  Manifest m;
  DSV41_RETURN_IF_ERROR(get(j, "converter_version", m.converter_version, ctx));
  if (!j.contains("options") || !j["options"].is_object())
    return Status::error(ctx + "options: missing");
  DSV41_RETURN_IF_ERROR(get(j["options"], "fp8", m.fp8, ctx + "options."));
  if (m.fp8 != "e4m3" && m.fp8 != "bf16")
    return Status::error(ctx + "options.fp8: '" + m.fp8 + "' is not e4m3 or bf16");
  if (!j.contains("source") || !j["source"].is_object())
    return Status::error(ctx + "source: missing");
  const json& s = j["source"];
  DSV41_RETURN_IF_ERROR(get(s, "config_sha256", m.source.config_sha256, ctx + "source."));
  DSV41_RETURN_IF_ERROR(get(s, "index_sha256", m.source.index_sha256, ctx + "source."));
  DSV41_RETURN_IF_ERROR(get(s, "tokenizer_sha256", m.source.tokenizer_sha256, ctx + "source."));
  DSV41_RETURN_IF_ERROR(get(s, "tensors", m.source.tensors, ctx + "source."));
  DSV41_RETURN_IF_ERROR(get(s, "bytes", m.source.bytes, ctx + "source."));
  if (!j.contains("files") || !j["files"].is_array()) return Status::error(ctx + "files: missing");
  for (std::size_t i = 0; i < j["files"].size(); ++i) {
    const json& f = j["files"][i];
    const std::string c = fmt::format("{}files[{}].", ctx, i);
    if (!f.is_object()) return Status::error(c + ": not an object");
    ManifestFile mf;
    DSV41_RETURN_IF_ERROR(get(f, "name", mf.name, c));
    DSV41_RETURN_IF_ERROR(get(f, "bytes", mf.bytes, c));
    if (mf.name.empty() || mf.name.find("..") != std::string::npos || mf.name[0] == '/')
      return Status::error(c + "name: '" + mf.name + "' is not a plain relative file name");
    m.files.push_back(std::move(mf));
  }
  if (!j.contains("tensors") || !j["tensors"].is_array())
    return Status::error(ctx + "tensors: missing");
  for (std::size_t i = 0; i < j["tensors"].size(); ++i) {
    const json& t = j["tensors"][i];
    std::string c = fmt::format("{}tensors[{}].", ctx, i);
    if (!t.is_object()) return Status::error(c + ": not an object");
    ManifestTensor mt;
    DSV41_RETURN_IF_ERROR(get(t, "name", mt.name, c));
    c = fmt::format("{}tensor {}: ", ctx, mt.name);
    std::string dtype;
    DSV41_RETURN_IF_ERROR(get(t, "dtype", dtype, c));
    auto d = parse_dtype(dtype);
    if (!d) return Status::error(c + "dtype: unknown '" + dtype + "'");
    mt.dtype = *d;
    DSV41_RETURN_IF_ERROR(get(t, "shape", mt.shape, c));
    DSV41_RETURN_IF_ERROR(get(t, "file", mt.file, c));
    DSV41_RETURN_IF_ERROR(get(t, "offset", mt.offset, c));
    DSV41_RETURN_IF_ERROR(get(t, "bytes", mt.bytes, c));
    DSV41_RETURN_IF_ERROR(get(t, "sha256", mt.sha256, c));
    DSV41_RETURN_IF_ERROR(get(t, "layout", mt.layout, c));
    uint64_t numel = 1;
    for (int64_t e : mt.shape) {
      if (e < 0 || (e > 0 && numel > (uint64_t(1) << 62) / static_cast<uint64_t>(e)))
        return Status::error(c + "shape: invalid");
      numel *= static_cast<uint64_t>(e);
    }
    if (numel * dtype_size(mt.dtype) != mt.bytes)
      return Status::error(fmt::format("{}bytes: {} does not match shape x dtype ({})", c, mt.bytes,
                                       numel * dtype_size(mt.dtype)));
    if (!m.tensors.empty() && !(m.tensors.back().name < mt.name))
      return Status::error(c + "tensors are not sorted by name, or a name repeats");
    m.tensors.push_back(std::move(mt));
  }
  return m;
}

Result<Manifest> read_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  if (!std::filesystem::exists(path))
    return Status::error(path +
                         ": missing (not a converted checkpoint, or an unfinished conversion)");
  auto text = read_text_file(path, std::size_t(1) << 30);
  if (!text) return text.status();
  return parse_manifest(*text, path);
}

Result<SourceIdentity> source_identity(const std::string& dir, uint64_t tensors, uint64_t bytes) {
  namespace fs = std::filesystem;
  SourceIdentity id;
  auto cfg = sha256_file((fs::path(dir) / "config.json").string());
  if (!cfg) return cfg.status();
  id.config_sha256 = *cfg;
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json")) {
    auto idx = sha256_file((fs::path(dir) / "model.safetensors.index.json").string());
    if (!idx) return idx.status();
    id.index_sha256 = *idx;
  }
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    auto tok = sha256_file((fs::path(dir) / "tokenizer.json").string());
    if (!tok) return tok.status();
    id.tokenizer_sha256 = *tok;
  }
  id.tensors = tensors;
  id.bytes = bytes;
  return id;
}

}  // namespace dsv41
