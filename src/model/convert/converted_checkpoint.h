// Fail-closed opening of a converted checkpoint (the fast engine's input): manifest present and
// well-formed, config.json the one the manifest was made from, every tensor the config needs
// present with the right dtype and shape (and nothing else), data files of exactly the recorded
// sizes, every tensor inside its file; with `verify`, every tensor's sha256 recomputed. Any failure
// refuses, naming the tensor or file.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "model/convert/manifest.h"

namespace dsv41 {

struct ConvertedCheckpoint {
  Manifest manifest;
  ModelConfig config;
  uint64_t payload_bytes = 0;
  double verify_seconds = 0;  // with verify
};

Result<ConvertedCheckpoint> open_converted_checkpoint(const std::string& dir, bool verify);

// Has a manifest.json, or the journal of an unfinished conversion (which then refuses to load).
bool is_converted_checkpoint(const std::string& dir);

}  // namespace dsv41
