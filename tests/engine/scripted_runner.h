// A ModelRunner test double (model/seam.h) for scripted models: any number of open sequences, any
// number of slices per step (the engine batches them). A subclass says what the logits after a
// slice's tokens are (forward, per sequence) and may keep per-sequence state (reset on open,
// released on free); rows before a slice's last (prompt_logprobs) come from forward token by
// token. Counts steps and the largest batch, so tests can see batching happen.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/seam.h"

namespace dsv41::testing {

class ScriptedRunner : public ModelRunner {
 public:
  int64_t hidden_size() const override { return 1; }
  Status open(SeqId s) override {
    if (lens_.count(s)) return Status::error("scripted runner: sequence is open");
    lens_[s] = 0;
    reset(s);
    return Status::ok();
  }
  void free(SeqId s) override {
    if (lens_.erase(s)) release(s);
  }
  Status truncate(SeqId, int64_t) override {
    return Status::error("scripted runner: truncate is not scripted");
  }
  int64_t length(SeqId s) const override {
    auto it = lens_.find(s);
    return it == lens_.end() ? -1 : it->second;
  }
  Status step(const StepBatch& b, StepOutput* out) override {
    DSV41_RETURN_IF_ERROR(
        check_step_batch(b, vocab_size(), max_context(), [&](SeqId id) { return length(id); }));
    on_step();
    ++steps;
    max_batch = std::max(max_batch, b.slices.size());
    out->slices.assign(b.slices.size(), {});
    for (std::size_t i = 0; i < b.slices.size(); ++i) {
      const SeqSlice& sl = b.slices[i];
      if (!sl.logits_rows.empty() &&
          sl.logits_rows != std::vector<int32_t>{int32_t(sl.tokens.size()) - 1}) {
        // Rows before the last (prompt_logprobs): the slice one token at a time, which a scripted
        // model's forward (its state advanced token by token) answers as it answers the whole.
        std::vector<float>& rows = out->slices[i].logits;
        std::size_t next = 0;
        for (std::size_t t = 0; t < sl.tokens.size(); ++t) {
          std::vector<float> logits;
          DSV41_RETURN_IF_ERROR(forward(sl.seq, sl.first_pos + int64_t(t), {sl.tokens[t]}, logits));
          if (next < sl.logits_rows.size() && sl.logits_rows[next] == int32_t(t)) {
            rows.insert(rows.end(), logits.begin(), logits.end());
            ++next;
          }
        }
        lens_[sl.seq] += int64_t(sl.tokens.size());
        continue;
      }
      std::vector<float> logits;
      DSV41_RETURN_IF_ERROR(forward(sl.seq, sl.first_pos, sl.tokens, logits));
      if (!sl.logits_rows.empty()) out->slices[i].logits = std::move(logits);
      lens_[sl.seq] += int64_t(sl.tokens.size());
    }
    return Status::ok();
  }
  int64_t open_sequences() const { return int64_t(lens_.size()); }
  int steps = 0;
  std::size_t max_batch = 0;

 protected:
  virtual void reset(SeqId) {}
  virtual void release(SeqId) {}
  virtual void on_step() {}
  // The logits after tokens (at positions first_pos ..) of sequence `seq`.
  virtual Status forward(SeqId seq, int64_t first_pos, const std::vector<int32_t>& tokens,
                         std::vector<float>& logits) = 0;

 private:
  std::map<SeqId, int64_t> lens_;
};

}  // namespace dsv41::testing
