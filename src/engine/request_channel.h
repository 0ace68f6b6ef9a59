// The channel between the engine thread and one request's caller (engine.h's RequestHandle): the
// request as submitted, its cancel flag, and the output the engine has produced since the caller
// last looked (merged under a mutex, the caller woken). Engine-internal: the frontends see only
// RequestHandle.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace dsv41 {

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

}  // namespace dsv41
