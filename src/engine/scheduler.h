// The step scheduler of continuous batching (vLLM V1's policy where the issue is silent): every
// step is one batch under a token budget and a sequence cap; running decodes first, then running
// prompts' next chunks (chunked prefill), then waiting sequences in arrival order (those on hold
// passed over) while the budget, the cap and the KV pool allow. When the pool cannot hold a running
// sequence's next tokens, the latest-arrived running sequence is preempted by recompute: its cache
// is freed at once, it goes to the front of the waiting queue and later recomputes every token it
// had (prompt and generated; the fast path's prefill gives the bits its decode would, so its next
// logits are unchanged). No sequence is admitted in a step that preempted, and a waiting sequence
// is admitted only when the pool can hold all of its tokens (not just the first chunk: otherwise a
// long prompt admitted beside a running sequence could preempt itself chunk after chunk).
//
// The scheduler sees sequences only as token counts; the engine owns the tokens, sampling and
// output. Single-threaded: the engine thread calls it between steps.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "model/seam.h"

namespace dsv41 {

struct SchedLimits {
  int64_t max_batched_tokens = 512;  // tokens per step, all slices together
  int max_seqs = 64;                 // sequences per step (running ones)
};

struct SchedSeq {
  SeqId id = 0;
  int64_t known = 0;     // tokens the sequence has: prompt + generated
  int64_t computed = 0;  // of them, already in the model's caches
  bool open = false;     // opened in the model (the engine opens it before its first slice)
  int64_t preemptions = 0;
  // Not admitted while set (the engine holds a parallel sample until its first sibling has
  // computed the shared prompt); later waiting sequences pass it.
  bool hold = false;
  // Its image spans [begin, end) (positions, ascending): a slice never cuts one.
  std::vector<std::pair<int64_t, int64_t>> spans;
  // The tokens a slice from `computed` takes of the `n` the budget allows: fewer when n would end
  // inside a span (up to its start), 0 when the slice starts at a span the budget cannot hold.
  int64_t uncut(int64_t n) const {
    for (const auto& [b, e] : spans)
      if (computed < e && computed + n > b && computed + n < e)
        return b > computed ? b - computed : 0;
    return n;
  }
};

struct Scheduled {
  SchedSeq* seq = nullptr;
  int64_t tokens = 0;  // tokens [computed, computed + tokens) go into this step
};

struct StepPlan {
  std::vector<Scheduled> run;
  int preempted = 0;  // sequences preempted while building this plan
};

class Scheduler {
 public:
  void add(SchedSeq* s);     // a new sequence joins the back of the waiting queue
  void remove(SchedSeq* s);  // finished or cancelled, running or waiting (the caller frees it)
  // The next step's slices. Frees preempted sequences in `model` (their blocks are needed now).
  // `admit` is called for a waiting sequence that is not open before it is sized: the caller opens
  // it and may attach a cached prefix (setting `computed`).
  StepPlan plan(const SchedLimits& limits, ModelRunner& model,
                const std::function<void(SchedSeq&)>& admit = {});
  // The first waiting sequence not on hold (the next one admission would take), or null.
  const SchedSeq* waiting_head() const;

  int64_t waiting() const { return int64_t(waiting_.size()); }
  int64_t running() const { return int64_t(running_.size()); }
  // Preemption by recompute: frees the sequence in the model and puts it at the front of the
  // waiting queue (also the engine's way out when a speculative rollback cannot be done exactly).
  void preempt(SchedSeq* s, ModelRunner& model);

 private:
  std::vector<SchedSeq*> running_;  // arrival order (oldest first)
  std::deque<SchedSeq*> waiting_;
};

}  // namespace dsv41
