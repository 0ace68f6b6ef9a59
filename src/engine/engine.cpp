// The engine's lifecycle and its thread: loading, submission (validation, the request queue,
// parallel samples), stats, taking submissions into the scheduler (each request's sampler,
// decoder, speculation tracker and grammar state), the loop that runs steps (step.cpp) and drops
// what finished or was cancelled.
#include "engine/engine.h"
#include "engine/active.h"
#include "engine/request_channel.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>

#include "core/log.h"
#include "text/special_tokens.h"
#include "text/stream_decoder.h"

namespace dsv41 {

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
  e->image_token_id_ = tokenizer->token_id(tokens::kImage);
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
  if (!request.images.empty()) {
    SeqSlice first;
    first.tokens = request.prompt;
    first.images = request.images;
    DSV41_RETURN_IF_ERROR(check_slice_images(first, 0, image_token_id_, backend_->hidden_size())
                              .with_context("images: "));
    for (const SliceImage& im : request.images)
      if (im.span() > limits_.max_batched_tokens)
        return Status::error(fmt::format(
            "images: an image's span of {} positions is longer than the {} tokens a step takes "
            "(--max-num-batched-tokens): a span goes into the model in one step",
            im.span(), limits_.max_batched_tokens));
  }
  if (request.sampling.thinking_token_budget >= 0 &&
      (think_end_id_ < 0 || think_end_id_ >= vocab_size_))
    return Status::error(
        "thinking_token_budget: this model's tokenizer has no </think> token to end the reasoning "
        "with");
  if (request.constraint) {
    // The grammar's ids must be this tokenizer's: a mask over another vocabulary is nonsense.
    if (request.constraint->vocab().size() != tokenizer_->vocab_size())
      return Status::error(fmt::format(
          "constraint: the grammar was compiled for a vocabulary of {} ids, this model's "
          "tokenizer has {}",
          request.constraint->vocab().size(), tokenizer_->vocab_size()));
    if (request.constraint_after_reasoning && (think_end_id_ < 0 || think_end_id_ >= vocab_size_))
      return Status::error(
          "constraint: this model's tokenizer has no </think> token after which a constraint "
          "could start");
    if (request.constraint_trigger >= vocab_size_)
      return Status::error(fmt::format(
          "constraint: the trigger token {} is outside this model's vocabulary of {} ids",
          request.constraint_trigger, vocab_size_));
  }
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
    for (const SliceImage& im : a->ch->request().images)
      a->sched.spans.push_back({im.start, im.start + im.span()});
    a->sampler = std::make_unique<Sampler>(req.sampling,
                                           options_.seed ^ (a->ch->id() * 0x9E3779B97F4A7C15ull));
    a->sampler->set_context(req.prompt, req.sampling.ignore_eos ? -1 : eos_id_, think_end_id_);
    a->decoder = std::make_unique<StreamDecoder>(*tokenizer_, req.sampling.stop,
                                                 req.sampling.skip_special_tokens);
    a->decoder->set_include_stop(req.sampling.include_stop_str_in_output);
    if (req.constraint)
      a->constraint = std::make_unique<SequenceConstraint>(
          req.constraint,
          SequenceConstraint::Start{req.constraint_after_reasoning ? think_end_id_ : -1,
                                    req.constraint_trigger, req.constraint_trigger_after},
          vocab_size_);
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

}  // namespace dsv41
