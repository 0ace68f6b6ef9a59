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
  // Makes the given byte ranges resident (a process's share of the weights, which leaves out the
  // Engram tables: only the rows a step hashes to are ever touched), on `threads` threads, so the
  // first steps do not fault the weights in from disk one page at a time; logs progress.
  // huge_pages: first the whole 2 MB pages of the ranges are replaced in place by copies on
  // transparent huge pages (MappedFile::make_resident_huge; skipped, with the reason logged, when
  // the kernel has THP off or MemAvailable cannot hold the copy; a range whose copy fails stays
  // file-mapped, logged). One-token decode reads every weight once per step: with 4 KB pages each
  // new page of a stream is a TLB miss (real-shape one-stream steps ran 3-5x longer file-mapped,
  // docs/perf.md). Then one byte of every page is read. Returns the bytes touched and the bytes
  // moved to huge pages (merged gaps between ranges included).
  using Range = std::pair<const uint8_t*, uint64_t>;
  struct Warmed {
    uint64_t touched = 0, huge = 0;
  };
  Warmed warm(const std::vector<Range>& ranges, std::size_t threads, bool huge_pages) const;
  // Every tensor by name, in no particular order.
  const std::unordered_map<std::string, WeightSpan>& spans() const { return spans_; }

 private:
  std::vector<std::pair<const MappedFile*, Range>> huge_pieces(
      const std::vector<Range>& ranges) const;
  std::string dir_, fp8_;
  ModelConfig config_;
  uint64_t payload_bytes_ = 0;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::unordered_map<std::string, WeightSpan> spans_;
};

// MemAvailable of /proc/meminfo in bytes (-1 when it cannot be read): what the huge-page copy
// (ConvertedWeights::warm) and the default KV budget (FastModel::default_kv_budget) size by.
int64_t mem_available_bytes();

}  // namespace dsv41
