// A drafter that knows the answer, for measuring and testing speculative decoding apart from the
// drafter's quality: it wraps a runner with a real drafter, lets that drafter run (so a draft costs
// what it costs), then replaces the chain ids with the continuation of whichever known token
// stream the sequence's tokens so far are a prefix of (the plain greedy run's own output, say).
// `corrupt(position)` may mark positions whose draft is made wrong, to exercise rejections.
// Used by `bench decode --speculative on` (its "oracle" mode: the speed-up when every draft is
// right) and by the engine's tests.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/forwarding_runner.h"

namespace dsv41 {

class OracleDrafter final : public ForwardingRunner {
 public:
  OracleDrafter(std::unique_ptr<ModelRunner> inner, std::vector<std::vector<int32_t>> streams,
                std::function<bool(std::size_t)> corrupt = {})
      : ForwardingRunner(std::move(inner)),
        streams_(std::move(streams)),
        corrupt_(std::move(corrupt)) {}

  Status open(SeqId s) override {
    fed_[s].clear();
    return ForwardingRunner::open(s);
  }
  void free(SeqId s) override {
    fed_.erase(s);
    ForwardingRunner::free(s);
  }
  int64_t attach_cached_prefix(SeqId s, const std::vector<int32_t>& tokens,
                               const std::string& salt) override {
    const int64_t n = ForwardingRunner::attach_cached_prefix(s, tokens, salt);
    fed_[s].assign(tokens.begin(), tokens.begin() + n);
    return n;
  }
  Status truncate(SeqId s, int64_t n) override {
    DSV41_RETURN_IF_ERROR(ForwardingRunner::truncate(s, n));
    fed_[s].resize(std::size_t(n));
    return Status::ok();
  }
  Status step(const StepBatch& b, StepOutput* out) override {
    DSV41_RETURN_IF_ERROR(ForwardingRunner::step(b, out));
    for (const auto& sl : b.slices)
      fed_[sl.seq].insert(fed_[sl.seq].end(), sl.tokens.begin(), sl.tokens.end());
    return Status::ok();
  }
  Status draft(const std::vector<DraftQuery>& q, std::vector<DraftResult>* out) override {
    DSV41_RETURN_IF_ERROR(ForwardingRunner::draft(q, out));
    const int64_t B = draft_block_size();
    for (std::size_t i = 0; i < q.size(); ++i) {
      std::vector<int32_t> ctx = fed_[q[i].seq];
      ctx.push_back(q[i].next);
      for (const auto& st : streams_) {
        if (st.size() < ctx.size() || !std::equal(ctx.begin(), ctx.end(), st.begin())) continue;
        for (int64_t j = 1; j <= B; ++j) {
          const std::size_t at = ctx.size() - 1 + std::size_t(j);
          int32_t t = at < st.size() ? st[at] : 0;
          if (corrupt_ && corrupt_(at)) t = (t + 1) % vocab_size();
          (*out)[i].ids[std::size_t(j)] = t;
        }
        ++known_drafts;
        break;
      }
    }
    return Status::ok();
  }
  // The streams to draft from (none: the inner drafter's own chains). Not while the engine runs.
  void set_streams(std::vector<std::vector<int32_t>> streams) { streams_ = std::move(streams); }
  int64_t known_drafts = 0;  // drafts whose stream was known

 private:
  std::vector<std::vector<int32_t>> streams_;
  std::function<bool(std::size_t)> corrupt_;
  std::map<SeqId, std::vector<int32_t>> fed_;
};

}  // namespace dsv41
