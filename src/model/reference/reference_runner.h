// The reference forward behind the model seam (model/seam.h), for tests, `logits` and the server's
// `--path reference`. One ReferenceModel holds one sequence's caches, so the runner keeps every
// open sequence's tokens and, when a step names a sequence other than the one the model holds (or
// after a truncate), replays that sequence's tokens first. The reference's results do not depend
// on how a sequence is split into calls (owner index keys), so a replay is exact; it is slow by
// design (the oracle is written to be read, not to serve).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/reference/reference_model.h"
#include "model/seam.h"

namespace dsv41 {

template <typename T>
class ReferenceRunner final : public ModelRunner {
 public:
  static Result<std::unique_ptr<ReferenceRunner>> load(const std::string& dir,
                                                       const ReferenceOptions& opt);
  int32_t vocab_size() const override;
  int64_t hidden_size() const override;
  int64_t max_context() const override;
  Status open(SeqId seq) override;
  void free(SeqId seq) override;
  Status truncate(SeqId seq, int64_t length) override;
  int64_t length(SeqId seq) const override;
  // Taps are supported at layers without Engram (the stream entering them is the previous layer's
  // output); a tap at an Engram layer is refused.
  Status step(const StepBatch& batch, StepOutput* out) override;
  // With ReferenceOptions::dspark: ReferenceModel::draft on each queried sequence in turn
  // (replaying it first when the model holds another).
  int64_t draft_block_size() const override;
  Status draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) override;
  // Logits in T of the last step, slice-major (what `logits --precision fp64` writes).
  const std::vector<std::vector<T>>& logits_t() const { return logits_t_; }

 private:
  ReferenceRunner(std::unique_ptr<ReferenceModel<T>> m, bool dspark)
      : model_(std::move(m)), dspark_(dspark) {}
  // Makes the model hold `seq` with all its tokens consumed.
  Status hold(SeqId seq);
  std::unique_ptr<ReferenceModel<T>> model_;
  std::map<SeqId, std::vector<int32_t>> tokens_;
  // A sequence's images (its first slice's), merged again whenever its tokens are replayed.
  std::map<SeqId, std::vector<PromptImage<T>>> images_;
  SeqId held_ = 0;
  bool holding_ = false;
  bool dspark_ = false;
  std::vector<std::vector<T>> logits_t_;
};

extern template class ReferenceRunner<float>;
extern template class ReferenceRunner<double>;

}  // namespace dsv41
