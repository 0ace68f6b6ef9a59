// Speculation bookkeeping (engine/speculative.h has the rules): which planned decodes draft and
// how many drafts fit the step's token budget and the KV pool, shadow probes and their outcome,
// and the verification of a drafted step's rows in order. With a structured-output constraint a
// draft the grammar refuses is cut before verification (it could never be accepted: its masked
// probability is 0), so the verify rows are not spent on it.
#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "engine/active.h"
#include "engine/engine.h"

namespace dsv41 {

void Engine::resolve_shadow(Active& a, int32_t tok) {
  const bool hit = tok == a.shadow[a.shadow_next];
  if (hit && ++a.shadow_next < a.shadow.size()) return;  // still matching
  const int64_t accepted = int64_t(a.shadow_next);
  record_shadow(a, accepted + (hit ? 0 : 1), accepted);
}

void Engine::record_shadow(Active& a, int64_t examined, int64_t accepted) {
  a.spec->record(examined, accepted);
  spec_priors_[a.prior_slot].observe(examined, accepted);
  spec_shadow_draft_tokens_.fetch_add(examined);
  spec_shadow_accepted_tokens_.fetch_add(accepted);
  a.shadow.clear();
  a.shadow_next = 0;
}

std::vector<std::vector<int32_t>> Engine::draft_for(const StepPlan& plan,
                                                    const std::vector<Active*>& planned,
                                                    int64_t* shadows) {
  std::vector<std::vector<int32_t>> drafts(plan.run.size());
  if (!options_.speculative || !drafting_.load()) return drafts;
  // The verify rows must fit what the plan left of the token budget and of the pool.
  int64_t spare_tokens = limits_.max_batched_tokens, spare_blocks = backend_->kv_blocks_free();
  const bool bounded = backend_->kv_blocks_total() > 0;
  for (std::size_t i = 0; i < plan.run.size(); ++i) {
    spare_tokens -= plan.run[i].tokens;
    if (bounded)
      spare_blocks -= backend_->kv_blocks_to_grow(planned[i]->sched.id,
                                                  planned[i]->sched.computed + plan.run[i].tokens);
  }
  // Per query: which planned sequence, and its width: the drafts a verify step checks, or for a
  // shadow the most drafts its chain may compare.
  struct Use {
    std::size_t seq;
    int64_t width;
    bool shadow;
  };
  std::vector<DraftQuery> queries;
  std::vector<Use> uses;
  for (std::size_t i = 0; i < plan.run.size(); ++i) {
    Active& a = *planned[i];
    const SchedSeq& s = a.sched;
    // Decodes only: one token left to feed, the prompt done, something generated already.
    if (!a.spec || plan.run[i].tokens != 1 || s.known - s.computed != 1 || a.generated == 0)
      continue;
    if (!a.shadow.empty()) continue;  // a shadow probe still comparing: no new plan meanwhile
    const SamplingParams& sp = a.ch->request().sampling;
    int64_t k = a.spec->plan(spec_costs_);
    // Never past max_tokens or the context: a verify step emits up to k + 1 tokens; a shadow
    // compares no more drafts than a verify step could check here.
    const int64_t room =
        std::min(int64_t(sp.max_tokens) - a.generated - 1, max_context_ - (s.computed + 1) - 1);
    // Probes are shadows, but every kVerifyingProbeEvery-th verifies: the cost model's verify
    // costs come from verify steps only, and a width measured dear once would otherwise never be
    // measured again while the acceptance stays low.
    if (k > 0 && room > 0 &&
        (options_.speculative_shadow_only ||
         (a.spec->probe() && options_.speculative_shadow_probes &&
          ++probes_ % kVerifyingProbeEvery != 0))) {
      queries.push_back({s.id, a.tokens.back()});  // no verify rows: nothing to reserve
      uses.push_back({i, room, true});
      continue;
    }
    k = std::min({k, room, spare_tokens});
    // A rollback into a block the prefix cache shares needs a private copy (up to a window and
    // a global block): reserved with the verify rows, so a rejection never finds the pool full.
    const int64_t cow = backend_->prefix_caching() ? 2 : 0;
    int64_t extra = 0;
    for (; k > 0 && bounded; --k) {
      extra = backend_->kv_blocks_to_grow(s.id, s.computed + 1 + k) -
              backend_->kv_blocks_to_grow(s.id, s.computed + 1) + cow;
      if (extra <= spare_blocks) break;
    }
    if (k <= 0) continue;
    queries.push_back({s.id, a.tokens.back()});
    uses.push_back({i, k, false});
    spare_tokens -= k;
    spare_blocks -= extra;
  }
  if (queries.empty()) return drafts;
  std::vector<DraftResult> results;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = backend_->draft(queries, &results);
  spec_draft_calls_.fetch_add(1);
  spec_draft_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  if (!st) {
    log::warn("engine: drafting failed, decoding plainly this step: {}", st.message());
    return drafts;
  }
  for (std::size_t q = 0; q < queries.size(); ++q) {
    const std::vector<int32_t>& ids = results[q].ids;
    const Use& u = uses[q];
    if (u.shadow) {  // the chain up to the tracker's widest width and the room
      Active& a = *planned[u.seq];
      const std::size_t n = std::min<std::size_t>(
          {ids.size() - 1, std::size_t(SpecCosts::kMaxWidth), std::size_t(u.width)});
      a.shadow.assign(ids.begin() + 1, ids.begin() + 1 + std::ptrdiff_t(n));
      a.shadow_next = 0;
      ++*shadows;
      spec_shadow_probes_.fetch_add(1);
      continue;
    }
    drafts[u.seq].assign(ids.begin() + 1, ids.begin() + 1 + u.width);
    // A draft the grammar refuses, and every one after it, could never be accepted.
    if (SequenceConstraint* c = planned[u.seq]->constraint.get())
      drafts[u.seq].resize(c->admissible_prefix(drafts[u.seq]));
  }
  return drafts;
}

bool Engine::verify(Active& a, const std::vector<int32_t>& drafts,
                    const std::vector<float>& logits) {
  const int64_t V = vocab_size_, k = int64_t(drafts.size());
  const int64_t base = a.sched.computed;  // the fed token's position
  std::vector<float> row(static_cast<std::size_t>(V)), scratch;
  ProcessedDistribution p;
  int64_t accepted = 0, examined = 0;
  bool done = false;
  for (int64_t j = 0; j <= k && !done; ++j) {
    row.assign(logits.begin() + j * V, logits.begin() + (j + 1) * V);
    if (j == k) {  // every draft accepted: the last row gives one more token
      done = advance(a, row);
      break;
    }
    scratch = row;
    // The row's mask is the grammar's state after the drafts accepted so far (emit advanced it).
    if (!constrain(a, scratch)) {
      done = end_unsatisfiable(a);
      break;
    }
    a.sampler->process(scratch, &p);
    const VerifyOutcome v = verify_draft(p, drafts[std::size_t(j)], *a.sampler);
    ++examined;
    if (a.constraint && !a.constraint->allows(v.token)) {
      done = end_unsatisfiable(a);
      break;
    }
    done = emit(a, v.token, row);
    if (!v.accepted) break;
    ++accepted;
  }
  // Drafts cut off by the request's end count as neither verified nor rejected.
  spec_steps_.fetch_add(1);
  spec_draft_tokens_.fetch_add(examined);
  spec_accepted_tokens_.fetch_add(accepted);
  a.spec->record(examined, accepted);
  spec_priors_[a.prior_slot].observe(examined, accepted);
  // The fed token and the accepted drafts stay; the rejected drafts' rows go.
  a.sched.computed = base + 1 + accepted;
  if (!done && accepted < k)
    if (Status st = backend_->truncate(a.sched.id, a.sched.computed); !st) {
      // Not exactly rollable (draft_for reserves the blocks a copy-on-write needs, so this is a
      // guard): recomputed like a preempted sequence, its prompt re-attached from the cache.
      log::warn("engine: rollback of sequence {} failed ({}); recomputing it", a.sched.id,
                st.message());
      sched_.preempt(&a.sched, *backend_);
      preemptions_.fetch_add(1);
    }
  return done;
}

}  // namespace dsv41
