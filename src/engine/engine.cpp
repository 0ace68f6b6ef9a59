// Engine thread, request queue and per-request output channels.
#include "engine/engine.h"

#include <algorithm>
#include <filesystem>

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
  RequestChannel(uint64_t id, GenerationRequest req) : id_(id), request_(std::move(req)) {}
  uint64_t id() const { return id_; }
  const GenerationRequest& request() const { return request_; }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

  // Producer side: merge into the pending output and wake the consumer.
  void publish(OutputToken* token, const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    if (token) pending_.tokens.push_back(std::move(*token));
    pending_.text += text;
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

 private:
  uint64_t id_;
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
  auto runner = options.path == "reference" ? load_reference_runner(options.model_dir)
                                            : load_fast_runner(options.model_dir, options.fast);
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
  e->backend_ = std::move(backend);
  e->tokenizer_ = std::move(tokenizer);
  e->options_ = options;
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
  auto ch = std::make_shared<RequestChannel>(next_id_.fetch_add(1), std::move(request));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::error("engine: shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_queue)
      return Status::error(fmt::format("engine: queue full ({} requests waiting)", queue_.size()));
    queue_.push_back(ch);
  }
  cv_.notify_one();
  return RequestHandle(ch);
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queued = static_cast<int64_t>(queue_.size());
  }
  s.running = running_.load();
  s.prompt_tokens_total = prompt_tokens_total_.load();
  s.generated_tokens_total = generated_tokens_total_.load();
  s.kv_foreign_reads = backend_->foreign_reads();
  return s;
}

void Engine::loop() {
  for (;;) {
    std::shared_ptr<RequestChannel> ch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      ch = std::move(queue_.front());
      queue_.pop_front();
      running_.store(1);
    }
    run(*ch);
    running_.store(0);
  }
}

// Prefill in chunks, then sample/decode until a stop, the length limit or cancellation.
void Engine::run(RequestChannel& ch) {
  const GenerationRequest& req = ch.request();
  const SamplingParams& sp = req.sampling;
  const auto prompt_len = static_cast<int64_t>(req.prompt.size());
  if (ch.cancelled()) return ch.finish(FinishReason::kCancelled, prompt_len, 0);
  // The request is one sequence of the seam for its lifetime (freed on every way out).
  const SeqId seq = ch.id();
  if (Status st = backend_->open(seq); !st)
    return ch.finish(FinishReason::kError, prompt_len, 0, {}, st.message());
  struct Release {
    ModelRunner& r;
    SeqId id;
    ~Release() { r.free(id); }
  } release{*backend_, seq};
  StepBatch batch;
  batch.slices.resize(1);
  StepOutput step_out;
  std::vector<float> logits;
  // One slice: the tokens at the sequence's next positions, the logits after the last of them.
  auto forward = [&](const std::vector<int32_t>& toks) -> Status {
    SeqSlice& sl = batch.slices[0];
    sl.seq = seq;
    sl.first_pos = backend_->length(seq);
    sl.tokens = toks;
    sl.logits_rows.assign(1, int32_t(toks.size()) - 1);
    DSV41_RETURN_IF_ERROR(backend_->step(batch, &step_out));
    logits = step_out.slices[0].logits;
    return Status::ok();
  };
  std::vector<int32_t> chunk;
  const std::size_t step = static_cast<std::size_t>(std::max(1, options_.prefill_chunk));
  for (std::size_t i = 0; i < req.prompt.size(); i += step) {
    if (ch.cancelled()) return ch.finish(FinishReason::kCancelled, prompt_len, 0);
    chunk.assign(
        req.prompt.begin() + static_cast<std::ptrdiff_t>(i),
        req.prompt.begin() + static_cast<std::ptrdiff_t>(std::min(req.prompt.size(), i + step)));
    Status st = forward(chunk);
    if (!st) return ch.finish(FinishReason::kError, prompt_len, 0, {}, st.message());
  }
  prompt_tokens_total_.fetch_add(prompt_len);

  Sampler sampler(sp, options_.seed ^ (ch.id() * 0x9E3779B97F4A7C15ull));
  StreamDecoder decoder(*tokenizer_, sp.stop, /*skip_special=*/true);
  std::vector<float> scratch;
  int64_t generated = 0;
  const int64_t room = max_context_ - prompt_len;
  for (;;) {
    if (ch.cancelled()) return ch.finish(FinishReason::kCancelled, prompt_len, generated);
    scratch = logits;
    const int32_t tok = sampler.sample(scratch);
    OutputToken out;
    out.token = tok;
    if (sp.logprobs >= 0) {
      out.logprob = token_logprob(logits, tok);
      out.top = top_logprobs(logits, sp.logprobs);
    }
    ++generated;
    generated_tokens_total_.fetch_add(1);
    const bool is_stop_token = (!sp.ignore_eos && tok == eos_id_) ||
                               std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) !=
                                   sp.stop_token_ids.end();
    if (is_stop_token) {
      // The stop token itself is not part of the text (its logprob is still reported).
      StreamDecoder::Step tail = decoder.finish();
      ch.publish(&out, tail.text);
      return ch.finish(FinishReason::kStop, prompt_len, generated, tokenizer_->token_bytes(tok));
    }
    sampler.accept(tok);
    StreamDecoder::Step s = decoder.push(tok);
    if (s.stopped) {
      ch.publish(&out, s.text);
      return ch.finish(FinishReason::kStop, prompt_len, generated, s.stop);
    }
    if (generated >= sp.max_tokens || generated >= room) {
      StreamDecoder::Step tail = decoder.finish();
      ch.publish(&out, s.text + tail.text);
      return ch.finish(FinishReason::kLength, prompt_len, generated);
    }
    ch.publish(&out, s.text);
    Status st = forward({tok});
    if (!st) return ch.finish(FinishReason::kError, prompt_len, generated, {}, st.message());
  }
}

}  // namespace dsv41
