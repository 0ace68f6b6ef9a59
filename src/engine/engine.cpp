// Engine thread, request queue, per-request output channels, and the continuous-batching loop:
// scheduler plan -> one model step -> sampling and output per sequence.
#include "engine/engine.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>

#include "core/log.h"
#include "text/special_tokens.h"
#include "text/stream_decoder.h"

namespace dsv41 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    default:
      return "none";
  }
}

// Shared by the engine thread (producer) and the RequestHandle (consumer).
class RequestChannel {
 public:
  RequestChannel(uint64_t id, GenerationRequest req, uint64_t first_sibling = 0)
      : id_(id), first_sibling_(first_sibling), request_(std::move(req)) {}
  uint64_t id() const { return id_; }
  // Parallel samples: the id of sample 0 of the same prompt (0: none, or this is sample 0).
  uint64_t first_sibling() const { return first_sibling_; }
  const GenerationRequest& request() const { return request_; }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

  // Producer side: merge into the pending output and wake the consumer.
  void publish_prompt(std::vector<PromptLogprob>&& entries) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries) pending_.prompt_logprobs.push_back(std::move(e));
    has_news_ = true;
    cv_.notify_all();
  }
  void publish(OutputToken* token, const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    if (token) pending_.tokens.push_back(std::move(*token));
    pending_.text += text;
    // Known from the first admission on, before any token: a stream can report it at its start
    // (Anthropic's message_start usage).
    if (cached_known_) {
      pending_.cached_prompt_tokens = cached_;
      pending_.queue_seconds = queued_;
    }
    has_news_ = true;
    cv_.notify_all();
  }
  void finish(FinishReason reason, int64_t prompt_tokens, int64_t completion_tokens,
              std::string stop = {}, std::string error = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.finished = true;
    pending_.reason = reason;
    pending_.stop = std::move(stop);
    pending_.error = std::move(error);
    pending_.prompt_tokens = prompt_tokens;
    pending_.completion_tokens = completion_tokens;
    pending_.cached_prompt_tokens = cached_;
    pending_.queue_seconds = queued_;
    has_news_ = true;
    cv_.notify_all();
  }
  bool next(RequestOutput& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return has_news_; })) return false;
    out = std::move(pending_);
    pending_ = RequestOutput();
    has_news_ = false;
    return true;
  }

  // Engine thread only: prompt tokens its first admission found in the prefix cache.
  void set_cached(int64_t n) { cached_ = n; }
  bool cached_known() const { return cached_known_; }
  // ... and the time it waited for that admission.
  void mark_cached_known() {
    cached_known_ = true;
    queued_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
  }

 private:
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  double queued_ = -1;
  int64_t cached_ = 0;
  bool cached_known_ = false;
  uint64_t id_;
  uint64_t first_sibling_;
  GenerationRequest request_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  RequestOutput pending_;
  bool has_news_ = false;
};

uint64_t RequestHandle::id() const {
  return ch_->id();
}
bool RequestHandle::next(RequestOutput& out, std::chrono::milliseconds timeout) {
  return ch_->next(out, timeout);
}
void RequestHandle::cancel() {
  ch_->cancel();
}

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  const std::string tok_path =
      (std::filesystem::path(options.model_dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tok_path))
    return Status::error(tok_path + ": not found (the model needs its tokenizer)");
  auto tok = Tokenizer::load(tok_path);
  if (!tok) return tok.status();
  FastRunnerOptions fast = options.fast;
  fast.dspark = fast.dspark || options.speculative;
  auto runner = options.path == "reference"
                    ? load_reference_runner(options.model_dir, options.speculative)
                    : load_fast_runner(options.model_dir, fast);
  if (!runner) return runner.status();
  return create(std::move(*runner), std::move(*tok), options);
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<ModelRunner> backend,
                                               std::unique_ptr<Tokenizer> tokenizer,
                                               const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->vocab_size_ = backend->vocab_size();
  if (tokenizer->vocab_size() < e->vocab_size_)
    return Status::error(fmt::format("tokenizer.json: {} ids, fewer than the model's vocab_size {}",
                                     tokenizer->vocab_size(), e->vocab_size_));
  e->max_context_ = backend->max_context();
  if (options.max_context > 0) e->max_context_ = std::min(e->max_context_, options.max_context);
  e->eos_id_ = tokenizer->token_id(tokens::kEos);
  e->think_end_id_ = tokenizer->token_id(tokens::kThinkEnd);
  e->backend_ = std::move(backend);
  e->tokenizer_ = std::move(tokenizer);
  e->options_ = options;
  e->limits_.max_batched_tokens = std::max<int64_t>(1, options.max_num_batched_tokens);
  // More running sequences than the token budget could never all decode in one step (vLLM
  // refuses that configuration; here the cap is clamped).
  e->limits_.max_seqs =
      int(std::min<int64_t>(e->limits_.max_batched_tokens,
                            std::max(1, options.path == "reference" ? 1 : options.max_num_seqs)));
  e->kv_total_ = e->backend_->kv_blocks_total();
  if (options.speculative && e->backend_->draft_block_size() <= 0)
    return Status::error(
        "--speculative dspark: the model was loaded without a DSpark drafter (its config has "
        "num_nextn_predict_layers 0, or this path has none)");
  e->thread_ = std::thread([p = e.get()] { p->loop(); });
  return e;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& ch : queue_) ch->cancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<RequestHandle> Engine::submit(GenerationRequest request) {
  auto handles = submit(std::move(request), 1);
  if (!handles) return handles.status();
  return handles->front();
}

Status Engine::health() const {
  return backend_->health();
}

Result<std::vector<RequestHandle>> Engine::submit(GenerationRequest request, int n) {
  if (Status h = backend_->health(); !h) return h;
  if (n < 1) return Status::error(fmt::format("n: must be at least 1 (got {})", n));
  if (n > max_requests())
    return Status::error(fmt::format(
        "n: {} samples exceed the {} requests the server holds at once (--max-num-seqs {} running "
        "plus --max-queue {} waiting)",
        n, max_requests(), limits_.max_seqs, options_.max_queue));
  if (request.prompt.empty()) return Status::error("prompt: must contain at least one token");
  for (std::size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab_size_)
      return Status::error(
          fmt::format("prompt: token id {} at position {} is outside the vocabulary [0, {})",
                      request.prompt[i], i, vocab_size_));
  }
  const auto prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len >= max_context_)
    return Status::error(
        fmt::format("prompt: {} tokens do not fit the context limit of {} tokens (one position "
                    "must stay free for the answer)",
                    prompt_len, max_context_));
  DSV41_RETURN_IF_ERROR(validate_sampling(request.sampling, vocab_size_));
  if (request.sampling.thinking_token_budget >= 0 &&
      (think_end_id_ < 0 || think_end_id_ >= vocab_size_))
    return Status::error(
        "thinking_token_budget: this model's tokenizer has no </think> token to end the reasoning "
        "with");
  // What no state of the pool could hold is refused now rather than left waiting forever.
  if (const int64_t total = kv_total_.load(); total > 0) {
    const int64_t longest =
        std::min<int64_t>(max_context_, prompt_len + std::max(1, request.sampling.max_tokens));
    const int64_t need = backend_->kv_blocks_peak(longest, limits_.max_batched_tokens);
    if (need > total)
      return Status::error(fmt::format(
          "max_tokens: the prompt ({} tokens) plus max_tokens need {} KV cache blocks, more than "
          "the whole pool holds ({}; raise --kv-cache-gb or lower max_tokens)",
          prompt_len, need, total));
  }
  std::vector<std::shared_ptr<RequestChannel>> chans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::error("engine: shutting down", ErrorKind::kUnavailable);
    // Free running seats are not queue: a submission may wait only until the scheduler admits it
    // there, so max_queue 0 still takes requests until max_num_seqs run (vLLM's meaning of a
    // waiting queue).
    const int64_t waiting = static_cast<int64_t>(queue_.size()) + waiting_.load();
    const int64_t free_seats = std::max<int64_t>(0, limits_.max_seqs - running_.load());
    if (waiting + n > options_.max_queue + free_seats)
      return Status::error(fmt::format("engine: queue full ({} requests waiting, {} running; "
                                       "--max-queue {})",
                                       waiting, running_.load(), options_.max_queue),
                           ErrorKind::kCapacity);
    // Ids are taken under the lock so that the samples' ids are consecutive and in queue order.
    const uint64_t first = next_id_.fetch_add(uint64_t(n));
    for (int i = 0; i < n; ++i) {
      GenerationRequest r = i + 1 < n ? request : std::move(request);
      if (r.sampling.seed) r.sampling.seed = *r.sampling.seed + uint64_t(i);
      chans.push_back(
          std::make_shared<RequestChannel>(first + uint64_t(i), std::move(r), i ? first : 0));
      queue_.push_back(chans.back());
    }
  }
  cv_.notify_one();
  std::vector<RequestHandle> handles;
  for (auto& ch : chans) handles.emplace_back(std::move(ch));
  return handles;
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queued = static_cast<int64_t>(queue_.size());
  }
  s.queued += waiting_.load();
  s.running = running_.load();
  s.max_queue = options_.max_queue;
  s.max_num_seqs = limits_.max_seqs;
  s.prompt_tokens_total = prompt_tokens_total_.load();
  s.generated_tokens_total = generated_tokens_total_.load();
  s.kv_foreign_reads = backend_->foreign_reads();
  s.kv_blocks_total = kv_total_.load();
  s.kv_blocks_used = kv_used_.load();
  s.preemptions_total = preemptions_.load();
  s.steps_total = steps_.load();
  s.decode_steps_seconds = double(decode_steps_ns_.load()) * 1e-9;
  s.decode_steps_tokens = decode_steps_tokens_.load();
  s.prefix_queries = prefix_queries_.load();
  s.prefix_query_tokens = prefix_query_tokens_.load();
  s.prefix_hit_tokens = prefix_hit_tokens_.load();
  s.prefix_evictions = prefix_evictions_.load();
  s.spec_draft_tokens = spec_draft_tokens_.load();
  s.spec_accepted_tokens = spec_accepted_tokens_.load();
  s.spec_steps = spec_steps_.load();
  s.spec_shadow_probes = spec_shadow_probes_.load();
  s.spec_shadow_draft_tokens = spec_shadow_draft_tokens_.load();
  s.spec_shadow_accepted_tokens = spec_shadow_accepted_tokens_.load();
  s.spec_draft_calls = spec_draft_calls_.load();
  s.spec_draft_seconds = double(spec_draft_ns_.load()) * 1e-9;
  std::lock_guard<std::mutex> lock(hist_mu_);
  s.step_seconds = step_seconds_;
  s.batch_tokens = batch_tokens_;
  s.batch_sequences = batch_sequences_;
  return s;
}

// A request from submission to its last output. The scheduler sees `sched`; `tokens` holds the
// prompt then every generated token (the last one is fed by the next step).
struct Engine::Active {
  std::shared_ptr<RequestChannel> ch;
  SchedSeq sched;
  std::vector<int32_t> tokens;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  std::unique_ptr<SpecTracker> spec;  // speculative decoding on
  int prior_slot = 0;                 // the SpecPrior it started from and teaches
  // A shadow probe's chain (drafted after the token at position p: shadow[j] predicts p + 1 + j)
  // while the plain steps' tokens are compared with it; shadow_next of them matched so far.
  std::vector<int32_t> shadow;
  std::size_t shadow_next = 0;
  int64_t prompt_len = 0, generated = 0;
  int64_t prompt_lp_next = 1;  // prompt_logprobs: the next prompt position to publish
  bool prompt_counted = false;
  bool failed = false;  // finished with an error; dropped at the next sweep
};

// Moves new submissions into the scheduler's waiting queue; waits when there is nothing to do.
// Returns false when the engine is stopping.
bool Engine::take_submissions(std::vector<std::unique_ptr<Active>>& active) {
  std::unique_lock<std::mutex> lock(mu_);
  if (active.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  if (stopping_) {
    for (auto& ch : queue_) ch->finish(FinishReason::kCancelled, 0, 0);
    queue_.clear();
    return false;
  }
  while (!queue_.empty()) {
    auto a = std::make_unique<Active>();
    a->ch = std::move(queue_.front());
    queue_.pop_front();
    const GenerationRequest& req = a->ch->request();
    a->tokens = req.prompt;
    a->prompt_len = int64_t(req.prompt.size());
    a->sched.id = a->ch->id();
    a->sched.known = a->prompt_len;
    a->sampler = std::make_unique<Sampler>(req.sampling,
                                           options_.seed ^ (a->ch->id() * 0x9E3779B97F4A7C15ull));
    a->sampler->set_context(req.prompt, req.sampling.ignore_eos ? -1 : eos_id_, think_end_id_);
    a->decoder = std::make_unique<StreamDecoder>(*tokenizer_, req.sampling.stop,
                                                 req.sampling.skip_special_tokens);
    a->decoder->set_include_stop(req.sampling.include_stop_str_in_output);
    if (options_.speculative) {
      a->prior_slot = acceptance_slot_.load();
      a->spec = std::make_unique<SpecTracker>(backend_->draft_block_size(),
                                              spec_priors_[a->prior_slot].counts(),
                                              options_.speculative_width);
    }
    sched_.add(&a->sched);
    active.push_back(std::move(a));
  }
  waiting_.store(sched_.waiting());  // still under mu_: submit() counts them as waiting at once
  return true;
}

// A parallel sample waits while its sample 0 has not yet computed the prompt, so that it then
// finds the prompt's blocks in the prefix cache instead of computing them again. Released as soon
// as sample 0 is past its prompt or gone (finished, cancelled, failed); without a cache, never
// held.
void Engine::hold_parallel_samples(std::vector<std::unique_ptr<Active>>& active) {
  const bool caching = backend_->prefix_caching();
  for (std::size_t i = 0; i < active.size(); ++i) {
    Active& a = *active[i];
    const uint64_t first = a.ch->first_sibling();
    a.sched.hold = false;
    if (!caching || first == 0 || a.sched.open) continue;
    // Sample 0 arrived just before its siblings: search backwards from this one.
    for (std::size_t j = i; j-- > 0;) {
      const Active& f = *active[j];
      if (f.ch->id() != first) continue;
      a.sched.hold = !f.failed && !f.ch->cancelled() && f.sched.computed < f.prompt_len;
      break;
    }
  }
}

void Engine::drop(std::vector<std::unique_ptr<Active>>& active, std::size_t i) {
  Active& a = *active[i];
  // A shadow chain cut off by the request's end: what matched counts, as a verify step's drafts
  // cut off by the end count neither as accepted nor rejected.
  if (!a.shadow.empty() && a.shadow_next > 0)
    record_shadow(a, int64_t(a.shadow_next), int64_t(a.shadow_next));
  sched_.remove(&a.sched);
  if (a.sched.open) backend_->free(a.sched.id);
  active.erase(active.begin() + std::ptrdiff_t(i));
}

void Engine::loop() {
  std::vector<std::unique_ptr<Active>> active;  // arrival order
  for (;;) {
    if (!take_submissions(active)) break;
    for (std::size_t i = active.size(); i-- > 0;)
      if (active[i]->failed || active[i]->ch->cancelled()) {
        Active& a = *active[i];
        if (!a.failed) a.ch->finish(FinishReason::kCancelled, a.prompt_len, a.generated);
        drop(active, i);
      }
    if (!active.empty()) {
      hold_parallel_samples(active);
      try {
        run_step(active);
      } catch (const std::exception& e) {  // a bug, never input: fail the requests, keep serving
        log::error("engine: step failed: {}", e.what());
        for (auto& a : active)
          if (!a->failed && a->sched.open) {
            a->ch->finish(FinishReason::kError, a->prompt_len, a->generated, {},
                          std::string("engine: ") + e.what());
            a->failed = true;
          }
      }
    }
    const ModelRunner::PrefixCacheCounts pc = backend_->prefix_cache_counts();
    prefix_queries_.store(pc.queries);
    prefix_query_tokens_.store(pc.query_tokens);
    prefix_hit_tokens_.store(pc.hit_tokens);
    prefix_evictions_.store(pc.evictions);
    running_.store(sched_.running());
    waiting_.store(sched_.waiting());
    kv_used_.store(kv_total_.load() - backend_->kv_blocks_free());
  }
  for (auto& a : active)
    if (!a->failed) a->ch->finish(FinishReason::kCancelled, a->prompt_len, a->generated);
  while (!active.empty()) drop(active, active.size() - 1);
}

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
    s.computed = a.ch->request().sampling.prompt_logprobs >= 0
                     ? backend_->attach_cached_prefix(
                           s.id, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + 1), salt)
                     : backend_->attach_cached_prefix(s.id, a.tokens, salt);
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

bool Engine::advance(Active& a, const std::vector<float>& logits) {
  std::vector<float> scratch = logits;
  return emit(a, a.sampler->sample(scratch), logits);
}

bool Engine::emit(Active& a, int32_t tok, const std::vector<float>& logits) {
  if (!a.shadow.empty()) resolve_shadow(a, tok);
  RequestChannel& ch = *a.ch;
  const SamplingParams& sp = ch.request().sampling;
  OutputToken out;
  out.token = tok;
  out.emitted = std::chrono::steady_clock::now();
  if (sp.logprobs >= 0) {
    out.logprob = token_logprob(logits, tok);
    out.top = top_logprobs(logits, sp.logprobs);
  }
  ++a.generated;
  generated_tokens_total_.fetch_add(1);
  const bool is_stop_token =
      (!sp.ignore_eos && tok == eos_id_) ||
      std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) != sp.stop_token_ids.end();
  if (is_stop_token) {
    // The stop token itself is not part of the text (its logprob is still reported).
    StreamDecoder::Step tail = a.decoder->finish();
    ch.publish(&out, tail.text);
    ch.finish(FinishReason::kStop, a.prompt_len, a.generated, tokenizer_->token_bytes(tok));
    return true;
  }
  a.sampler->accept(tok);
  StreamDecoder::Step s = a.decoder->push(tok);
  if (s.stopped) {
    ch.publish(&out, s.text);
    ch.finish(FinishReason::kStop, a.prompt_len, a.generated, s.stop);
    return true;
  }
  if (a.generated >= sp.max_tokens || a.prompt_len + a.generated >= max_context_) {
    StreamDecoder::Step tail = a.decoder->finish();
    ch.publish(&out, s.text + tail.text);
    ch.finish(FinishReason::kLength, a.prompt_len, a.generated);
    return true;
  }
  ch.publish(&out, s.text);
  a.tokens.push_back(tok);  // fed by the next step
  ++a.sched.known;
  return false;
}

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
    a.sampler->process(scratch, &p);
    const VerifyOutcome v = verify_draft(p, drafts[std::size_t(j)], *a.sampler);
    ++examined;
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
