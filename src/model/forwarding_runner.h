// A ModelRunner that forwards every call to another one it owns, for wrappers that change one
// thing and keep the rest: the speculative bench's oracle drafter (cli/cmd_bench_spec.cpp), test
// doubles. Override what differs; everything else is the inner runner's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/seam.h"

namespace dsv41 {

class ForwardingRunner : public ModelRunner {
 public:
  explicit ForwardingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  ModelRunner& inner() { return *inner_; }
  const ModelRunner& inner() const { return *inner_; }

  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t hidden_size() const override { return inner_->hidden_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  Status open(SeqId seq) override { return inner_->open(seq); }
  void free(SeqId seq) override { inner_->free(seq); }
  Status truncate(SeqId seq, int64_t length) override { return inner_->truncate(seq, length); }
  int64_t length(SeqId seq) const override { return inner_->length(seq); }
  Status step(const StepBatch& batch, StepOutput* out) override { return inner_->step(batch, out); }
  int64_t draft_block_size() const override { return inner_->draft_block_size(); }
  Status draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) override {
    return inner_->draft(queries, out);
  }
  int64_t foreign_reads() const override { return inner_->foreign_reads(); }
  int64_t kv_blocks_total() const override { return inner_->kv_blocks_total(); }
  int64_t kv_blocks_free() const override { return inner_->kv_blocks_free(); }
  int64_t kv_blocks_to_grow(SeqId seq, int64_t new_len) const override {
    return inner_->kv_blocks_to_grow(seq, new_len);
  }
  int64_t kv_blocks_peak(int64_t length, int64_t step_tokens) const override {
    return inner_->kv_blocks_peak(length, step_tokens);
  }
  int64_t attach_cached_prefix(SeqId seq, const std::vector<int32_t>& tokens,
                               const std::string& salt) override {
    return inner_->attach_cached_prefix(seq, tokens, salt);
  }
  bool prefix_caching() const override { return inner_->prefix_caching(); }
  PrefixCacheCounts prefix_cache_counts() const override { return inner_->prefix_cache_counts(); }

 private:
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace dsv41
