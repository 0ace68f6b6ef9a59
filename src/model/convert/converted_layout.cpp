// Conversion rules (see converted_layout.h).
#include "model/convert/converted_layout.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "io/safetensors.h"
#include "model/engram_layout.h"
#include "model/inventory.h"

namespace dsv41 {
namespace {

// "layers.N" / "mtp.N" prefix of a name, or "" for globals and vision.
std::string block_prefix(const std::string& name) {
  for (const char* head : {"layers.", "mtp."}) {
    const std::string h = head;
    if (name.rfind(h, 0) != 0) continue;
    std::size_t dot = name.find('.', h.size());
    if (dot == std::string::npos) return "";
    return name.substr(0, dot);
  }
  return "";
}

std::string file_for(const std::string& name, const std::string& prefix) {
  if (is_vision_tensor_name(name)) return "vision.bin";
  if (prefix.empty()) return "globals.bin";
  if (name.find(".ffn.experts.") != std::string::npos) return prefix + ".experts.bin";
  return prefix + ".bin";
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t e : shape) n *= static_cast<uint64_t>(e);
  return n;
}

}  // namespace

uint64_t OutTensor::bytes() const {
  return numel(shape) * dtype_size(dtype);
}

const char* OutTensor::layout() const {
  switch (kind) {
    case OutKind::kCopy:
      return "copy";
    case OutKind::kW13Weight:
      return "mxfp4_w13";
    case OutKind::kW13Scale:
      return "e8m0_w13";
    case OutKind::kMxfp4Canonical:
      return "mxfp4_canonical";
    case OutKind::kFp8ToBf16:
      return "fp8_to_bf16";
    case OutKind::kEngramBucket:
      return "engram_bucket";
  }
  return "?";
}

uint64_t OutFile::payload_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.bytes();
  return n;
}

Result<std::vector<OutFile>> plan_conversion(const std::vector<SourceTensor>& source,
                                             const TextConfig& text, bool fp8_to_bf16) {
  std::unordered_map<std::string, const SourceTensor*> by_name;
  for (const auto& s : source) by_name[s.name] = &s;
  std::map<std::string, std::vector<OutTensor>> files;
  const auto engram = engram_layouts(text);

  for (const SourceTensor& s : source) {
    const std::string prefix = block_prefix(s.name);
    const std::string file = file_for(s.name, prefix);
    const bool expert = s.name.find(".ffn.experts.") != std::string::npos;
    // Routed experts.
    if (expert && (s.name.ends_with(".w1.weight") || s.name.ends_with(".w1.scale"))) {
      const bool weight = s.name.ends_with(".weight");
      const std::string base =
          s.name.substr(0, s.name.size() - (weight ? 10 : 9));  // "...experts.E"
      const std::string w3 = base + (weight ? ".w3.weight" : ".w3.scale");
      auto it = by_name.find(w3);
      if (it == by_name.end()) return Status::error(s.name + ": its sibling " + w3 + " is missing");
      if (it->second->shape != s.shape || it->second->dtype != s.dtype || s.shape.size() != 2)
        return Status::error(s.name + ": shape/dtype differs from " + w3);
      OutTensor o{base + (weight ? ".w13.weight" : ".w13.scale"),
                  s.dtype,
                  {2 * s.shape[0], s.shape[1]},
                  weight ? OutKind::kW13Weight : OutKind::kW13Scale,
                  s.name,
                  w3,
                  0};
      files[file].push_back(std::move(o));
      continue;
    }
    if (expert && (s.name.ends_with(".w3.weight") || s.name.ends_with(".w3.scale")))
      continue;  // with w1
    if (expert && s.name.ends_with(".w2.weight") && s.dtype == DType::kI8) {
      files[file].push_back(
          OutTensor{s.name, s.dtype, s.shape, OutKind::kMxfp4Canonical, s.name, "", 0});
      continue;
    }
    // Engram tables: split into hash-column buckets.
    if (s.name.ends_with(".engram.embed.weight") || s.name.ends_with(".engram.embed.scale")) {
      const bool weight = s.name.ends_with(".weight");
      const int64_t layer = std::stoll(prefix.substr(prefix.find('.') + 1));
      auto lay = std::find_if(engram.begin(), engram.end(),
                              [&](const EngramLayerLayout& l) { return l.layer == layer; });
      if (lay == engram.end() || s.shape.size() != 2 || s.shape[0] != lay->rows())
        return Status::error(s.name + ": rows do not match the config's Engram hash table (" +
                             shape_to_string(s.shape) + ")");
      const std::string base = s.name.substr(0, s.name.rfind('.') + 1);  // "P.engram.embed."
      for (std::size_t c = 0; c < lay->primes.size(); ++c) {
        OutTensor o{fmt::format("{}bucket.{}.{}", base, c, weight ? "weight" : "scale"),
                    s.dtype,
                    {lay->primes[c], s.shape[1]},
                    OutKind::kEngramBucket,
                    s.name,
                    "",
                    lay->offsets[c]};
        files[fmt::format("{}.engram.bucket.{:02d}.bin", prefix, c)].push_back(std::move(o));
      }
      continue;
    }
    // FP8 linears: kept, or dequantized to bf16 (the scale is folded in and not written).
    if (fp8_to_bf16 && s.dtype == DType::kF8_E4M3 && s.name.ends_with(".weight")) {
      const std::string sc = s.name.substr(0, s.name.size() - 7) + ".scale";
      auto it = by_name.find(sc);
      if (it != by_name.end()) {
        if (s.shape.size() != 2 || it->second->shape.size() != 2 ||
            it->second->shape[0] != (s.shape[0] + 31) / 32 ||
            it->second->shape[1] != (s.shape[1] + 31) / 32)
          return Status::error(sc + ": shape " + shape_to_string(it->second->shape) +
                               " is not the 32x32 block grid of " + s.name + " " +
                               shape_to_string(s.shape));
        files[file].push_back(
            OutTensor{s.name, DType::kBF16, s.shape, OutKind::kFp8ToBf16, s.name, sc, 0});
        continue;
      }
    }
    if (fp8_to_bf16 && s.dtype == DType::kF8_E8M0 && s.name.ends_with(".scale") &&
        s.name.find(".engram.embed.") == std::string::npos &&
        s.name.find(".ffn.experts.") == std::string::npos) {
      auto it = by_name.find(s.name.substr(0, s.name.size() - 6) + ".weight");
      if (it != by_name.end() && it->second->dtype == DType::kF8_E4M3)
        continue;  // folded into the bf16 weight
    }
    files[file].push_back(OutTensor{s.name, s.dtype, s.shape, OutKind::kCopy, s.name, "", 0});
  }
  std::vector<OutFile> out;
  for (auto& [name, tensors] : files) {
    std::sort(tensors.begin(), tensors.end(),
              [](const OutTensor& a, const OutTensor& b) { return a.name < b.name; });
    out.push_back(OutFile{name, std::move(tensors)});
  }
  return out;
}

}  // namespace dsv41
