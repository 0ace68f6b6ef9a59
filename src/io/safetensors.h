// safetensors reader (zero-copy views into an mmap) and writer.
//
// The reader is fail-closed: the 8-byte header length must fit the file and a 100 MB cap, the
// header must be one JSON object without duplicate keys, every tensor needs a known dtype, a shape
// whose element count does not overflow, data_offsets whose length equals shape x dtype size,
// inside the data section, and the tensors must tile the data section exactly (no overlap, no gap,
// no trailing bytes). Every refusal names the file and, where there is one, the tensor. Tensor data
// is never touched while opening.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtypes.h"
#include "core/status.h"
#include "io/mapped_file.h"

namespace dsv41 {

inline constexpr uint64_t kMaxSafetensorsHeader = 100u << 20;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // Zero-copy view of a tensor's bytes (unaligned in general; copy before typed access).
  std::span<const uint8_t> bytes(const TensorInfo& t) const;
  // Drops the resident pages of a tensor's bytes (see MappedFile::release).
  void release(const TensorInfo& t) const;
  // Drops the resident pages of a sub-range of this file's mapping (bounded-memory streaming).
  void release_bytes(const uint8_t* p, std::size_t n) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_size() const { return header_size_; }

 private:
  std::shared_ptr<MappedFile> file_;
  uint64_t header_size_ = 0;
  std::vector<TensorInfo> tensors_;  // in data order
  std::unordered_map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// Fills the bytes of specs[i] into `out` (exactly nbytes long).
using TensorFiller = std::function<void(std::size_t index, std::span<uint8_t> out)>;

// Writes a safetensors file atomically (PATH.tmp, then rename). Tensors are laid out widest dtype
// first so every tensor is naturally aligned; the header is space-padded to a multiple of 8.
Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                         const TensorFiller& fill,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace dsv41
