// The engine layout (design.md §5) as rules from source tensors to output tensors and data files.
// Used by the converter (what to write) and by the loader (what a converted directory must hold for
// a config). The validator deliberately does not use this file: it re-derives the mapping itself.
//
//   routed experts  X.experts.E.w1/w3.{weight,scale} -> X.experts.E.w13.{weight,scale}: rows
//                   interleaved (row 2i = w1 row i, 2i+1 = w3 row i); weights' -0 nibbles -> +0;
//                   X.experts.E.w2.weight: -0 nibbles -> +0; scales copied
//   FP8 linears     kept (E4M3 + E8M0 32x32 scales, row-major), or exact BF16 with --fp8 bf16
//   Engram tables   P.engram.embed.{weight,scale} -> P.engram.embed.bucket.C.{weight,scale}: the
//                   rows of hash column C (prime-sized), one data file per bucket
//   everything else copied byte for byte
// Files: globals.bin, vision.bin, P.bin (a layer's dense tensors), P.experts.bin,
// P.engram.bucket.CC.bin.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "core/status.h"
#include "model/config.h"

namespace dsv41 {

struct SourceTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

enum class OutKind { kCopy, kW13Weight, kW13Scale, kMxfp4Canonical, kFp8ToBf16, kEngramBucket };

struct OutTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  OutKind kind = OutKind::kCopy;
  std::string src;        // main source tensor (w1 for w13; the weight for fp8_to_bf16)
  std::string src2;       // w3 for w13; the scale for fp8_to_bf16
  int64_t row_begin = 0;  // engram bucket rows [row_begin, row_begin + shape[0])
  uint64_t bytes() const;
  const char* layout() const;  // the manifest's layout string
};

struct OutFile {
  std::string name;
  std::vector<OutTensor> tensors;  // sorted by name
  uint64_t payload_bytes() const;
};

// Files sorted by name. Errors name a source tensor whose shape or sibling does not fit its rule.
Result<std::vector<OutFile>> plan_conversion(const std::vector<SourceTensor>& source,
                                             const TextConfig& text, bool fp8_to_bf16);

// Tensors in a data file start at multiples of this.
inline constexpr uint64_t kTensorAlignment = 64;

}  // namespace dsv41
