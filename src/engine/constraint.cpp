// A sequence's structured-output state (see constraint.h).
#include "engine/constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace dsv41 {

SequenceConstraint::SequenceConstraint(std::shared_ptr<const Grammar> grammar, Start start,
                                       int32_t vocab_size)
    : matcher_(grammar),
      grammar_(std::move(grammar)),
      start_(std::move(start)),
      phase_(start_.reasoning_end >= 0 ? Phase::kReasoning
             : start_.trigger >= 0     ? Phase::kArmed
                                       : Phase::kActive),
      vocab_size_(vocab_size) {
  // Ids of the model's row beyond the grammar's vocabulary are never allowed (zero words).
  mask_.assign(std::max(grammar_->vocab().mask_words(), (std::size_t(vocab_size_) + 63) / 64), 0);
  // The prompt is not generated text: a trigger sampled first has nothing before it.
  after_ok_ = start_.trigger_after.empty();
  if (active()) refresh();
}

bool SequenceConstraint::wait_step(Phase& phase, bool& after_ok, int32_t token) const {
  if (phase == Phase::kReasoning) {
    if (token != start_.reasoning_end) return false;
    if (start_.trigger < 0) return true;  // the answer starts: constrained from here
    phase = Phase::kArmed;
    after_ok = start_.trigger_after.empty();  // the reasoning's text does not lead a trigger
    return false;
  }
  // Armed: the trigger starts the grammar only where the text before it leads into what the
  // grammar continues (the DSML marker right after "<", as the calls tag has it).
  if (token == start_.trigger && after_ok) return true;
  const std::string& after = start_.trigger_after;
  if (!after.empty()) {
    const bool known = token >= 0 && token < grammar_->vocab().size();
    const std::string& b = known ? grammar_->vocab().bytes(token) : after;
    after_ok = known && b.size() >= after.size() &&
               b.compare(b.size() - after.size(), after.size(), after) == 0;
  }
  return false;
}

void SequenceConstraint::refresh() {
  matcher_.fill_mask(mask_);
  const std::size_t full = std::size_t(vocab_size_) / 64, rest = std::size_t(vocab_size_) % 64;
  // Bits at or past the model's width are not tokens the model can produce.
  if (rest) mask_[full] &= (uint64_t{1} << rest) - 1;
  for (std::size_t w = full + (rest ? 1 : 0); w < mask_.size(); ++w) mask_[w] = 0;
  int64_t allowed = 0, ends = 0;
  for (uint64_t w : mask_) allowed += std::popcount(w);
  any_allowed_ = allowed > 0;
  if (matcher_.is_complete())
    for (int32_t id : grammar_->vocab().end_ids())
      ends += id < vocab_size_ && (mask_[std::size_t(id) >> 6] >> (id & 63) & 1);
  ends_only_ = allowed > 0 && allowed == ends;
}

bool SequenceConstraint::apply(std::vector<float>& logits) const {
  if (!active() && start_.trigger >= 0) return true;  // free until the model starts it
  if (!active()) {
    // The reasoning may not end the output: the answer after it is what the constraint is for
    // (a model that stopped inside its reasoning gave an empty, invalid answer).
    for (int32_t id : grammar_->vocab().end_ids())
      if (id >= 0 && std::size_t(id) < logits.size())
        logits[std::size_t(id)] = -std::numeric_limits<float>::infinity();
    return true;
  }
  if (!any_allowed_) return false;
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::size_t n = std::min(logits.size(), std::size_t(vocab_size_));
  for (std::size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = mask_[w];
    if (bits == ~uint64_t{0}) continue;
    const std::size_t end = std::min(n, w * 64 + 64);
    if (bits == 0) {  // most words of a narrow state
      std::fill(logits.begin() + std::ptrdiff_t(w * 64), logits.begin() + std::ptrdiff_t(end),
                ninf);
      continue;
    }
    for (std::size_t i = w * 64; i < end; ++i)
      if (!(bits >> (i & 63) & 1)) logits[i] = ninf;
  }
  for (std::size_t i = n; i < logits.size(); ++i) logits[i] = ninf;
  return true;
}

bool SequenceConstraint::allows(int32_t token) const {
  if (!active()) return start_.trigger >= 0 || !grammar_->vocab().is_end(token);
  return token >= 0 && token < vocab_size_ && (mask_[std::size_t(token) >> 6] >> (token & 63) & 1);
}

bool SequenceConstraint::accept(int32_t token) {
  if (!active()) {
    if (wait_step(phase_, after_ok_, token)) {
      phase_ = Phase::kActive;
      refresh();
    }
    return true;
  }
  if (!allows(token) || !matcher_.accept_token(token)) return false;
  refresh();
  return true;
}

std::size_t SequenceConstraint::admissible_prefix(const std::vector<int32_t>& drafts) {
  std::size_t i = 0;
  if (!active()) {  // free up to the start (no end id without a trigger), checked after it
    Phase phase = phase_;
    bool after_ok = after_ok_;
    bool started = false;
    while (i < drafts.size() && !started) {
      if (start_.trigger < 0 && grammar_->vocab().is_end(drafts[i])) return i;
      started = wait_step(phase, after_ok, drafts[i]);
      ++i;
    }
    if (!started) return i;
    Matcher from_start(grammar_);
    while (i < drafts.size() && drafts[i] >= 0 && drafts[i] < vocab_size_ &&
           !from_start.is_terminated() && from_start.accept_token(drafts[i]))
      ++i;
    return i;
  }
  int accepted = 0;
  while (i < drafts.size() && drafts[i] >= 0 && drafts[i] < vocab_size_ &&
         !matcher_.is_terminated() && matcher_.accept_token(drafts[i]))
    ++i, ++accepted;
  matcher_.rollback(accepted);
  return i;
}

}  // namespace dsv41
