// manifest.json of a converted checkpoint (design.md §5): every output tensor (name, dtype, shape,
// file, offset, bytes, sha256, layout), every data file with its size, the source checkpoint's
// identity and the converter's version and options. Shared by the converter (writes), the loader
// and the validator (read); it holds no layout rules.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "core/status.h"

namespace dsv41 {

inline constexpr const char* kManifestFormat = "dsv41-converted";
inline constexpr int kManifestVersion = 1;
inline constexpr const char* kConverterVersion = "dsv41-convert/1";

struct SourceIdentity {
  std::string config_sha256;
  std::string index_sha256;      // model.safetensors.index.json ("" for a single-file checkpoint)
  std::string tokenizer_sha256;  // "" when the source has no tokenizer.json
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  bool operator==(const SourceIdentity&) const = default;
};

struct ManifestTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  std::string file;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string sha256;
  std::string layout;  // how it was derived: copy, mxfp4_w13, e8m0_w13, mxfp4_canonical,
                       // fp8_to_bf16, engram_bucket
};

struct ManifestFile {
  std::string name;
  uint64_t bytes = 0;
};

struct Manifest {
  std::string converter_version = kConverterVersion;
  std::string fp8 = "e4m3";  // "e4m3" (kept) or "bf16" (dequantized)
  SourceIdentity source;
  std::vector<ManifestTensor> tensors;  // sorted by name
  std::vector<ManifestFile> files;      // sorted by name
};

std::string manifest_to_json(const Manifest& m);
// Fail-closed parse: every field present with the right type; errors name the field (and tensor).
Result<Manifest> parse_manifest(const std::string& json_text, const std::string& where);
Result<Manifest> read_manifest(const std::string& dir);

// The identity of an official-layout checkpoint directory (hashes of its small files).
Result<SourceIdentity> source_identity(const std::string& dir, uint64_t tensors, uint64_t bytes);

}  // namespace dsv41
