// The converted checkpoint as the fast engine reads it: opened fail-closed (manifest, config,
// inventory, file sizes: model/convert/converted_checkpoint.h), every data file mapped read-only
// and lazily (nothing is read until a kernel touches it, so Engram tables stay on disk except the
// rows a step needs), tensors handed out as spans by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtypes.h"
#include "core/status.h"
#include "io/mapped_file.h"
#include "model/config.h"

namespace dsv41 {

struct WeightSpan {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  bool from_fp8 = false;  // a BF16 tensor the converter dequantized from FP8 (--fp8 bf16)
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
};

class ConvertedWeights {
 public:
  // verify: also recompute every tensor's sha256 against the manifest.
  static Result<std::unique_ptr<ConvertedWeights>> open(const std::string& dir, bool verify);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  std::string fp8_format() const { return fp8_; }  // "e4m3" or "bf16"
  uint64_t payload_bytes() const { return payload_bytes_; }
  bool has(const std::string& name) const { return spans_.count(name) != 0; }
  // The tensor's span; aborts when absent (loading checked the inventory, so a miss is a bug).
  const WeightSpan& get(const std::string& name) const;
  // Reads one byte of every page of the given byte ranges (a process's share of the weights, which
  // leaves out the Engram tables: only the rows a step hashes to are ever touched), on `threads`
  // threads, so the first steps do not fault the weights in from disk one page at a time; logs
  // progress. Returns the bytes touched.
  using Range = std::pair<const uint8_t*, uint64_t>;
  static uint64_t warm_ranges(const std::vector<Range>& ranges, std::size_t threads);
  // Every tensor by name, in no particular order.
  const std::unordered_map<std::string, WeightSpan>& spans() const { return spans_; }

 private:
  std::string dir_, fp8_;
  ModelConfig config_;
  uint64_t payload_bytes_ = 0;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::unordered_map<std::string, WeightSpan> spans_;
};

}  // namespace dsv41
