// Step assembly (Engine::run_step): the scheduler's plan, the drafts speculation adds to it, one
// model step over every planned slice, then each sequence whose tokens are all computed gets its
// next token(s) (sampling.cpp, speculation.cpp), prompt_logprobs are published, the step's
// timings recorded and finished sequences dropped.
#include <algorithm>
#include <unordered_map>

#include "core/log.h"
#include "engine/active.h"
#include "engine/engine.h"

namespace dsv41 {

// One scheduler plan, one model step, then each sequence whose tokens are all computed samples its
// next token.
void Engine::run_step(std::vector<std::unique_ptr<Active>>& active) {
  const auto t_plan = std::chrono::steady_clock::now();
  std::unordered_map<SeqId, Active*> by_id;
  for (auto& a : active) by_id[a->sched.id] = a.get();
  // A waiting sequence about to be sized: opened, and given what the prefix cache holds of it.
  auto admit = [&](SchedSeq& s) {
    Active& a = *by_id.at(s.id);
    if (Status st = backend_->open(s.id); !st) return;  // opened at slice time, failing there
    s.open = true;
    // prompt_logprobs needs every prompt row computed: no cached prefix. It still hands the model
    // its salt (a one-token prefix attaches nothing, the last token always being left to compute),
    // so the blocks it registers for later requests stay in its salt's partition.
    const std::string& salt = a.ch->request().cache_salt;
    // An image prompt is looked up by its key tokens (each span's positions stand for its image:
    // seam.h image_key_token); a hit may end inside a span (the next slice carries the rest of
    // it, SliceImage::first). An unkeyed image takes nothing.
    const auto& images = a.ch->request().images;
    std::vector<int32_t> keys;
    bool keyed = true;
    if (!images.empty()) {
      keys = a.tokens;
      for (const SliceImage& im : images) {
        keyed = keyed && im.key != 0;
        for (int64_t i = 0; i < im.span(); ++i)
          keys[std::size_t(im.start + i)] = image_key_token(im.key, i);
      }
    }
    const std::vector<int32_t>& ids = images.empty() ? a.tokens : keys;
    if (a.ch->request().sampling.prompt_logprobs >= 0 || !keyed)
      s.computed = backend_->attach_cached_prefix(
          s.id, std::vector<int32_t>(ids.begin(), ids.begin() + 1), salt);
    else
      s.computed = backend_->attach_cached_prefix(s.id, ids, salt);
    if (!a.ch->cached_known()) {  // the first admission's hit (a preempted one re-attaches its own)
      a.ch->set_cached(std::min(s.computed, a.prompt_len));
      a.ch->mark_cached_known();
    }
  };
  const StepPlan plan = sched_.plan(limits_, *backend_, admit);
  preemptions_.fetch_add(plan.preempted);
  // The counts submit() checks the queue against, as of this plan: this step publishes outputs,
  // and a client that sees its request's first token must find it counted as running, not as
  // still waiting (the loop's own update comes after the step; found by the sanitized build,
  // whose slower steps widened the gap). The blocks the plan reserved are published with them, so
  // a scrape that counts a request running also counts its blocks (a short request used to be
  // seen running with 0 blocks used, its blocks published only after its step).
  running_.store(sched_.running());
  waiting_.store(sched_.waiting());
  kv_used_.store(kv_total_.load() - backend_->kv_blocks_free());
  if (plan.run.empty()) {
    // Nothing fits although no sequence runs: the waiting head cannot run (submission refuses
    // such requests, so this is a guard against a hang, not a path).
    const SchedSeq* head = sched_.waiting_head();
    if (plan.preempted == 0 && sched_.running() == 0 && head) {
      for (std::size_t i = 0; i < active.size(); ++i)
        if (&active[i]->sched == head) {
          Active& a = *active[i];
          a.ch->finish(FinishReason::kError, a.prompt_len, a.generated, {},
                       "engine: the KV cache cannot hold this request");
          drop(active, i);
          break;
        }
    }
    return;
  }
  std::vector<Active*> planned;
  for (const Scheduled& sc : plan.run) planned.push_back(by_id.at(sc.seq->id));
  // Drafting is part of the step's time (t_plan): the cost model compares whole steps.
  int64_t shadows = 0;
  const std::vector<std::vector<int32_t>> drafts = draft_for(plan, planned, &shadows);
  StepBatch batch;
  std::vector<Active*> in_batch;
  std::vector<const std::vector<int32_t>*> batch_drafts;
  for (std::size_t pi = 0; pi < plan.run.size(); ++pi) {
    const Scheduled& sc = plan.run[pi];
    Active& a = *planned[pi];
    if (!a.sched.open) {
      if (Status st = backend_->open(a.sched.id); !st) {
        a.ch->finish(FinishReason::kError, a.prompt_len, a.generated, {}, st.message());
        a.failed = true;
        continue;
      }
      a.sched.open = true;
    }
    SeqSlice sl;
    sl.seq = a.sched.id;
    sl.first_pos = a.sched.computed;
    sl.tokens.assign(a.tokens.begin() + a.sched.computed,
                     a.tokens.begin() + a.sched.computed + sc.tokens);
    // The spans in this slice: whole (the scheduler never cuts one), or the rest of one a prefix
    // hit ended inside.
    for (const SliceImage& im : a.ch->request().images)
      if (im.start + im.span() > sl.first_pos && im.start < sl.first_pos + sc.tokens) {
        SliceImage part = im;
        part.first = int32_t(std::max<int64_t>(0, sl.first_pos - im.start));
        part.start = int32_t(std::max<int64_t>(0, im.start - sl.first_pos));
        sl.images.push_back(std::move(part));
      }
    // prompt_logprobs: a row for every prompt position whose next token is still unpublished,
    // on the full stack (decoder replay would leave them without logits).
    if (a.ch->request().sampling.prompt_logprobs >= 0 && a.sched.computed < a.prompt_len) {
      for (int64_t r = 0; r < sc.tokens; ++r) {
        const int64_t p = a.sched.computed + r;
        if (p + 1 < a.prompt_len && p + 1 >= a.prompt_lp_next) sl.logits_rows.push_back(int32_t(r));
      }
      sl.full_stack = true;
    }
    if (a.sched.computed + sc.tokens == a.sched.known &&
        (sl.logits_rows.empty() || sl.logits_rows.back() != int32_t(sc.tokens) - 1))
      sl.logits_rows.push_back(int32_t(sc.tokens) - 1);
    // A verify step has a logits row per token: the full stack (decoder replay must not skip
    // any of them, whatever the window).
    if (!drafts[pi].empty()) sl.full_stack = true;
    for (std::size_t j = 0; j < drafts[pi].size(); ++j) {  // a verify step: a row per token
      sl.tokens.push_back(drafts[pi][j]);
      sl.logits_rows.push_back(int32_t(j + 1));
    }
    batch.slices.push_back(std::move(sl));
    in_batch.push_back(&a);
    batch_drafts.push_back(&drafts[pi]);
  }
  StepOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = backend_->step(batch, &out);
  {
    std::lock_guard<std::mutex> lock(hist_mu_);
    step_seconds_.observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    batch_tokens_.observe(double(batch.tokens()));
    batch_sequences_.observe(double(batch.slices.size()));
  }
  steps_.fetch_add(1);
  if (!st) {  // a broken step (it changes nothing) fails what was in it; the others go on
    log::error("engine: step of {} sequences failed: {}", in_batch.size(), st.message());
    for (Active* a : in_batch) {
      a->ch->finish(FinishReason::kError, a->prompt_len, a->generated, {}, st.message());
      a->failed = true;
    }
    return;
  }
  bool decodes_only = true;
  int64_t drafting = 0, emitted = 0, widths = 0;
  for (std::size_t k = 0; k < in_batch.size(); ++k) {
    widths += int64_t(batch_drafts[k]->size());
    decodes_only = decodes_only && batch.slices[k].tokens.size() == 1 + batch_drafts[k]->size() &&
                   in_batch[k]->sched.computed >= in_batch[k]->prompt_len;
    drafting += !batch_drafts[k]->empty();
  }
  std::vector<SeqId> finished;
  for (std::size_t k = 0; k < in_batch.size(); ++k) {
    Active& a = *in_batch[k];
    const int64_t before = a.generated;
    if (!batch_drafts[k]->empty()) {
      if (verify(a, *batch_drafts[k], out.slices[k].logits)) finished.push_back(a.sched.id);
      emitted += a.generated - before;
      continue;
    }
    const SeqSlice& sl = batch.slices[k];
    const int64_t first = a.sched.computed, ntok = int64_t(sl.tokens.size());
    a.sched.computed += ntok;
    if (sl.logits_rows.empty()) continue;
    const int prompt_top = a.ch->request().sampling.prompt_logprobs;
    if (prompt_top >= 0 && a.prompt_lp_next < a.prompt_len)
      publish_prompt_logprobs(a, sl, first, out.slices[k].logits, prompt_top);
    if (sl.logits_rows.back() != int32_t(ntok) - 1 || a.sched.computed != a.sched.known) continue;
    if (!a.prompt_counted) {
      prompt_tokens_total_.fetch_add(a.prompt_len);
      a.prompt_counted = true;
    }
    const std::size_t V = std::size_t(vocab_size_);
    if (sl.logits_rows.size() == 1) {
      if (advance(a, out.slices[k].logits)) finished.push_back(a.sched.id);
    } else {  // the last row samples
      const std::vector<float> last(out.slices[k].logits.end() - std::ptrdiff_t(V),
                                    out.slices[k].logits.end());
      if (advance(a, last)) finished.push_back(a.sched.id);
    }
    emitted += a.generated - before;
  }
  if (decodes_only) {
    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_plan).count();
    decode_steps_ns_.fetch_add(int64_t(step_s * 1e9));
    decode_steps_tokens_.fetch_add(emitted);
    // The cost model's measurements: steps where every sequence drafted, or none did.
    const double per_seq = step_s / double(std::max<std::size_t>(1, in_batch.size()));
    // (A step that drafted shadows paid the drafter: neither a plain step's cost nor a verify's.)
    if (shadows == 0 && drafting == int64_t(in_batch.size()))
      spec_costs_.observe_spec((widths + drafting / 2) / std::max<int64_t>(1, drafting), per_seq);
    else if (shadows == 0 && drafting == 0)
      spec_costs_.observe_plain(per_seq);
  }

  for (SeqId id : finished)
    for (std::size_t i = 0; i < active.size(); ++i)
      if (active[i]->sched.id == id) {
        drop(active, i);
        break;
      }
}

void Engine::publish_prompt_logprobs(Active& a, const SeqSlice& sl, int64_t first,
                                     const std::vector<float>& logits, int top) {
  const std::size_t V = std::size_t(vocab_size_);
  std::vector<PromptLogprob> entries;
  std::vector<float> row(V);
  for (std::size_t r = 0; r < sl.logits_rows.size(); ++r) {
    const int64_t next = first + sl.logits_rows[r] + 1;  // the prompt position this row predicts
    if (next >= a.prompt_len || next < a.prompt_lp_next) continue;
    std::copy_n(logits.begin() + std::ptrdiff_t(r * V), V, row.begin());
    PromptLogprob e;
    e.token = a.tokens[std::size_t(next)];
    e.logprob = token_logprob(row, e.token);
    const float lt = row[std::size_t(e.token)];
    int32_t rank =
        1;  // 1 + the tokens strictly more likely (ties: lower id first, as top_logprobs)
    for (std::size_t v = 0; v < V; ++v)
      rank += row[v] > lt || (row[v] == lt && int32_t(v) < e.token);
    e.rank = rank;
    e.top = top_logprobs(row, top);
    entries.push_back(std::move(e));
    a.prompt_lp_next = next + 1;
  }
  if (!entries.empty()) a.ch->publish_prompt(std::move(entries));
}

}  // namespace dsv41
