// A checkpoint directory in the official layout: model.safetensors.index.json + shards (or a single
// model.safetensors). Opening validates every shard header and the index against them: each indexed
// tensor lives in the shard the index names, every shard tensor is indexed, no tensor appears
// twice, shard names are plain file names inside the directory, and metadata.total_size (when
// present) equals the sum of tensor bytes. Tensor data is not read.
#pragma once

#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"

namespace dsv41 {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSingleShardName = "model.safetensors";

class Checkpoint {
 public:
  struct Entry {
    const TensorInfo* info;
    std::size_t shard;
  };

  static Result<Checkpoint> open(const std::string& dir);
  // Move-only: entries point into the shard table, whose heap storage moves with it.
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  const std::vector<std::string>& tensor_names() const { return names_; }  // sorted
  const Entry* find(const std::string& name) const;
  std::span<const uint8_t> bytes(const std::string& name) const;  // aborts if absent
  void release(
      const std::string& name) const;  // drop the tensor's resident pages (no-op if absent)
  // Drops the resident pages of part of a tensor's bytes (a sub-span of bytes(name)).
  void release_bytes(const std::string& name, const uint8_t* p, std::size_t n) const;
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  Checkpoint() = default;
  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::unordered_map<std::string, Entry> entries_;
  std::vector<std::string> names_;
  uint64_t total_bytes_ = 0;
};

// Writes model.safetensors.index.json for the given (tensor -> shard file) map.
Status write_index_json(const std::string& dir,
                        const std::vector<std::pair<std::string, std::string>>& weight_map,
                        uint64_t total_size);

}  // namespace dsv41
