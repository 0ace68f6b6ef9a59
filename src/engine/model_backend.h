// The engine's view of a model: one sequence at a time, tokens in, next-token logits out. The
// reference forward and the fast forward (through the model seam, engine/runner_backend.cpp)
// implement it; tests plug scripted backends in to drive the server through exact token
// sequences. The scheduler of continuous batching will drive the seam directly.
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

struct FastBackendOptions {
  int threads = 0;         // 0: every core
  bool act_quant = false;  // DeepSeek's E4M3 activation rounding (spec §3.3)
  double kv_cache_gb = 0;  // 0: a quarter of available memory
};
// The fast forward (model/fast) on a converted checkpoint.
Result<std::unique_ptr<ModelBackend>> load_fast_backend(const std::string& converted_dir,
                                                        const FastBackendOptions& o);

}  // namespace dsv41
