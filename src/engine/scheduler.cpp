// The step scheduler (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace dsv41 {

void Scheduler::add(SchedSeq* s) {
  waiting_.push_back(s);
}

void Scheduler::remove(SchedSeq* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
}

const SchedSeq* Scheduler::waiting_head() const {
  for (const SchedSeq* s : waiting_)
    if (!s->hold) return s;
  return nullptr;
}

void Scheduler::preempt(SchedSeq* s, ModelRunner& model) {
  model.free(s->id);
  s->open = false;
  s->computed = 0;
  ++s->preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.push_front(s);
}

StepPlan Scheduler::plan(const SchedLimits& limits, ModelRunner& model,
                         const std::function<void(SchedSeq&)>& admit) {
  StepPlan p;
  int64_t budget = std::max<int64_t>(1, limits.max_batched_tokens);
  int64_t reserved = 0;  // blocks the slices planned so far will allocate
  const bool bounded = model.kv_blocks_total() > 0;
  auto room = [&] { return model.kv_blocks_free() - reserved; };
  // Decodes (one token left to compute) are served before any prompt chunk takes the budget.
  int64_t decodes_left = 0;
  for (const SchedSeq* s : running_) decodes_left += s->known - s->computed == 1;
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    SchedSeq* s = running_[i];
    const int64_t left = s->known - s->computed;
    const bool decode = left == 1;
    decodes_left -= decode;
    // An image span goes into one slice: a chunk ends before it, or waits for room for it.
    const int64_t n = decode ? 1 : s->uncut(std::min(left, budget - decodes_left));
    if (left <= 0 || n <= 0) {
      ++i;
      continue;
    }
    // Make room by preempting the latest-arrived running sequences, possibly s itself. They sit
    // after s in arrival order, so none of them is in the plan yet.
    bool self = false;
    while (bounded && model.kv_blocks_to_grow(s->id, s->computed + n) > room()) {
      SchedSeq* victim = running_.back();
      self = victim == s;
      if (!self) decodes_left -= victim->known - victim->computed == 1;
      preempt(victim, model);
      ++p.preempted;
      if (self) break;
    }
    if (self) break;  // s was the latest: nothing after it is left to schedule
    if (bounded) reserved += model.kv_blocks_to_grow(s->id, s->computed + n);
    p.run.push_back({s, n});
    budget -= n;
    ++i;
  }
  if (p.preempted > 0) return p;
  for (std::size_t w = 0;
       w < waiting_.size() && int64_t(running_.size()) < limits.max_seqs && budget > 0;) {
    SchedSeq* s = waiting_[w];
    if (s->hold) {
      ++w;
      continue;
    }
    const bool admitted_now = !s->open && admit;
    if (admitted_now) admit(*s);
    const int64_t n = s->uncut(std::min(s->known - s->computed, budget));
    if (n <= 0) {  // its next span waits for a step with room for it (no overtaking)
      if (admitted_now && s->open) {
        model.free(s->id);
        s->open = false;
        s->computed = 0;
      }
      break;
    }
    const int64_t need = bounded ? model.kv_blocks_to_grow(s->id, s->computed + n) : 0;
    // All of its tokens must fit (bounded by what one sequence holds at once), not just this chunk.
    const int64_t need_all =
        bounded ? std::min(model.kv_blocks_to_grow(s->id, s->known),
                           model.kv_blocks_peak(s->known, limits.max_batched_tokens))
                : 0;
    if (std::max(need, need_all) > room()) {  // first come, first served: no overtaking
      // Not admitted after all: it must not pin the cached blocks it attached while it waits
      // (they were counted free when the running slices above were sized).
      if (admitted_now && s->open) {
        model.free(s->id);
        s->open = false;
        s->computed = 0;
      }
      break;
    }
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(w));
    // Running stays in arrival order (ids grow with arrival), so the latest is always last.
    running_.insert(
        std::upper_bound(running_.begin(), running_.end(), s,
                         [](const SchedSeq* a, const SchedSeq* b) { return a->id < b->id; }),
        s);
    reserved += need;
    p.run.push_back({s, n});
    budget -= n;
  }
  return p;
}

}  // namespace dsv41
