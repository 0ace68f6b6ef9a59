// The engine's view of a model: one sequence at a time, tokens in, next-token logits out. The
// reference forward implements it today; the fast engine will implement it (batched) later, and
// tests plug scripted backends in to drive the server through exact token sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace dsv41 {

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual int32_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;  // longest sequence (prompt + generated)
  // Starts a new sequence.
  virtual void reset() = 0;
  // Consumes `tokens` at the next positions; `last_logits` receives the vocab_size logits after the
  // last of them.
  virtual Status forward(const std::vector<int32_t>& tokens, std::vector<float>& last_logits) = 0;
};

// The reference forward (fp32) on a checkpoint in the official layout.
Result<std::unique_ptr<ModelBackend>> load_reference_backend(const std::string& model_dir);

}  // namespace dsv41
