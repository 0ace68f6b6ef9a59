// `dsv41 convert`: official checkpoint -> engine layout (converted_layout.h), streaming with
// bounded memory (source pages are dropped after use, output goes through fixed buffers),
// multi-threaded by data file, resumable (a journal records finished files; manifest.json is
// written last, so an interrupted conversion never loads as complete), deterministic (same input ->
// same manifest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace dsv41 {

struct ConvertOptions {
  std::string from;
  std::string to;
  bool fp8_to_bf16 = false;
  std::size_t threads = 0;  // 0: all cores
};

struct ConvertResult {
  std::size_t tensors = 0;
  std::size_t files = 0;
  std::size_t files_resumed = 0;  // taken over from an interrupted run
  uint64_t bytes = 0;             // payload written (or taken over)
  double seconds = 0;
};

Result<ConvertResult> convert_checkpoint(const ConvertOptions& opt);

}  // namespace dsv41
