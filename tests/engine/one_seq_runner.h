// A ModelRunner test double (model/seam.h) for scripted models that follow one sequence at a time:
// the engine runs a request as one sequence (open, steps, free), so a subclass only says what the
// logits after a call's tokens are (forward) and how a new sequence starts (reset).
#pragma once

#include <string>
#include <vector>

#include "model/seam.h"

namespace dsv41::testing {

class OneSeqRunner : public ModelRunner {
 public:
  int64_t hidden_size() const override { return 1; }
  Status open(SeqId s) override {
    if (open_) return Status::error("scripted runner: one sequence at a time");
    open_ = true;
    seq_ = s;
    len_ = 0;
    reset();
    return Status::ok();
  }
  void free(SeqId s) override {
    if (open_ && s == seq_) open_ = false;
  }
  Status truncate(SeqId, int64_t) override {
    return Status::error("scripted runner: truncate is not scripted");
  }
  int64_t length(SeqId s) const override { return open_ && s == seq_ ? len_ : -1; }
  Status step(const StepBatch& b, StepOutput* out) override {
    DSV41_RETURN_IF_ERROR(
        check_step_batch(b, vocab_size(), max_context(), [&](SeqId id) { return length(id); }));
    if (b.slices.size() != 1) return Status::error("scripted runner: one slice per step");
    const SeqSlice& sl = b.slices[0];
    if (sl.logits_rows != std::vector<int32_t>{int32_t(sl.tokens.size()) - 1})
      return Status::error("scripted runner: only the last row's logits");
    out->slices.assign(1, {});
    DSV41_RETURN_IF_ERROR(forward(sl.tokens, out->slices[0].logits));
    len_ += int64_t(sl.tokens.size());
    return Status::ok();
  }

 protected:
  virtual void reset() = 0;
  virtual Status forward(const std::vector<int32_t>& tokens, std::vector<float>& logits) = 0;

 private:
  bool open_ = false;
  SeqId seq_ = 0;
  int64_t len_ = 0;
};

}  // namespace dsv41::testing
