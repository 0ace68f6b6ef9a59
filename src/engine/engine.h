// The narrow engine API the frontends use (design.md §2): load a model, submit a request (token ids
// + sampling parameters), read its output as it is produced (tokens, logprobs, text deltas with
// stop strings applied), cancel it. One engine thread owns the model and every sequence's state;
// callers on any thread talk to it through the request queue and per-request output channels.
// Continuous batching: each request is one sequence of the model seam; every engine step runs one
// batch the scheduler (engine/scheduler.h) builds from the running and waiting sequences, so
// requests join and leave between steps and each streams its tokens as its steps produce them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/histogram.h"
#include "core/status.h"
#include "engine/model_loading.h"  // the runners the engine loads; model/seam.h
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"

namespace dsv41 {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string cache_salt;  // prefix-cache partition: requests with other salts never share blocks
  // Structured output (docs/structured-outputs.md): the generated tokens are constrained to this
  // grammar (compiled against this engine's tokenizer, its end id EOS); the request finishes with
  // kStop once the document is complete and nothing but its end may follow. Null: unconstrained.
  std::shared_ptr<const Grammar> constraint;
  // The constraint starts after the reasoning's end token (</think>) was generated: the prompt
  // opened the reasoning (thinking mode). False: from the first generated token.
  bool constraint_after_reasoning = false;
  // >= 0: the constraint starts right after the model itself generated this token (strict tools
  // under tool_choice auto: the DSML marker), the text generated before it ending with
  // `constraint_trigger_after` ("<"); the grammar is what follows the token. Before it nothing is
  // masked and the output may end without it. With constraint_after_reasoning, it counts only
  // after the reasoning closed. -1: the grammar is the whole answer.
  int32_t constraint_trigger = -1;
  std::string constraint_trigger_after;
  // Images of the prompt (spec §9.1; SliceImage in model/seam.h, `start` a prompt position): each
  // span's positions hold the model's image_token_id. They go into the model with the prompt's
  // first slice, which the scheduler makes long enough to hold every span; such a request takes
  // nothing from the prefix cache.
  std::vector<SliceImage> images;
};

struct OutputToken {
  int32_t token = 0;
  float logprob = 0;              // set when sampling.logprobs >= 0
  std::vector<TokenLogprob> top;  // sampling.logprobs most likely tokens
  // When the engine thread emitted it: the consumer may wake for several tokens at once (a busy
  // machine, a tiny model), so per-token timing (bench decode's per-stream rates) reads this.
  std::chrono::steady_clock::time_point emitted{};
};

// A prompt token's logprob (prompt_logprobs): its distribution is the logits row of the position
// before it; rank 1 = the most likely token (vLLM's Logprob).
struct PromptLogprob {
  int32_t token = 0;
  float logprob = 0;
  int32_t rank = 0;
  std::vector<TokenLogprob> top;  // the prompt_logprobs most likely tokens, ranks 1..k
};

// What a request produced since the caller last looked.
struct RequestOutput {
  std::vector<OutputToken> tokens;
  std::string text;  // decoded text delta (complete UTF-8, stop strings cut)
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string stop;   // the stop string or token text that ended it, if any
  std::string error;  // kError
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Of the prompt, taken from the prefix cache (not computed) by the request's first admission; in
  // every output from the first token on.
  int64_t cached_prompt_tokens = 0;
  // Seconds from submission to the first admission into a step (the queue time), likewise known
  // from the first admission on; -1 before it.
  double queue_seconds = -1;
  // prompt_logprobs: entries for prompt positions 1, 2, ... in order (position 0 has none), as the
  // prompt's chunks are computed.
  std::vector<PromptLogprob> prompt_logprobs;
};

class RequestChannel;  // engine-side state shared with a RequestHandle

class RequestHandle {
 public:
  explicit RequestHandle(std::shared_ptr<RequestChannel> ch) : ch_(std::move(ch)) {}
  uint64_t id() const;
  // Waits up to `timeout` for new output; returns false when nothing arrived. After an output with
  // finished == true, there is nothing more.
  bool next(RequestOutput& out, std::chrono::milliseconds timeout);
  // Asks the engine to stop the request; it finishes with kCancelled (idempotent, any thread).
  void cancel();

 private:
  std::shared_ptr<RequestChannel> ch_;
};

struct EngineOptions {
  std::string model_dir;  // path "fast": a converted checkpoint; "reference": the official layout
  std::string path = "fast";
  FastRunnerOptions fast;
  uint64_t seed = 0;  // seeds requests that carry no seed of their own
  // Submissions waiting beyond the free running seats (max_num_seqs minus running) that are
  // refused (kCapacity; the server's 429). 0: none wait, a request beyond max_num_seqs running is
  // refused at once.
  int max_queue = 256;
  int64_t max_context = 0;  // 0: the model's limit
  // Per step: tokens of all slices together (decodes first, then prompt chunks), and sequences.
  // The reference path runs one sequence at a time whatever max_num_seqs says (it replays a
  // sequence's whole history when the sequence changes).
  int64_t max_num_batched_tokens = 512;
  int max_num_seqs = 64;
  // DSpark speculative decoding (engine/speculative.h): the model loads its drafter and decode
  // steps verify its drafts where the per-request tracker finds that it pays. Greedy requests
  // give the same tokens as without it; sampled ones the same distribution.
  bool speculative = false;
  // Verify exactly this many drafts at every decode step instead of what the cost model picks
  // (0): for measuring what each width costs (`bench decode --speculative on --spec-width K`).
  int64_t speculative_width = 0;
  // A tracker's probes (steps where drafting does not pay at its estimate, run to learn the
  // acceptance) as shadows: draft, decode plainly, count what the next tokens accept (the count a
  // verify step would have recorded, at the drafter's cost only; engine/speculative.h), but for
  // every 8th probe, which verifies to keep the cost model's verify costs measured. Off: every
  // probe verifies its drafts (`--spec-probe verify`).
  bool speculative_shadow_probes = true;
  // Every drafting decision as a shadow: nothing is verified, the drafter's acceptance is still
  // measured (tests; measuring a drafter on live traffic at the drafter's cost only).
  bool speculative_shadow_only = false;
};

struct EngineStats {
  int64_t queued = 0;   // submitted, not yet running (including preempted ones)
  int64_t running = 0;  // sequences the scheduler runs
  // The limits those are held to: max_queue waiting beyond the free seats of max_num_seqs running
  // (the effective one: the reference path runs 1).
  int64_t max_queue = 0, max_num_seqs = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  int64_t kv_foreign_reads = 0;  // the model's isolation counter (must stay 0)
  int64_t kv_blocks_total = 0;   // the KV pool (0: the path has no bounded pool)
  int64_t kv_blocks_used = 0;
  int64_t preemptions_total = 0;
  int64_t steps_total = 0;
  // Steps whose batch held only decodes (one generated token per sequence): their wall time from
  // planning to the last sampled token published, and their tokens (the engine's decode rate while
  // serving, prefill excluded).
  double decode_steps_seconds = 0;
  int64_t decode_steps_tokens = 0;
  // Prefix cache: lookups, prompt tokens looked up, tokens found cached (not recomputed), cached
  // blocks evicted to make room (the pool had been filled).
  int64_t prefix_queries = 0, prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t prefix_evictions = 0;
  // Speculative decoding: drafts verified, drafts accepted, decode steps that verified drafts.
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_steps = 0;
  // Shadow probes: chains drafted and compared with the tokens plain steps emitted, their drafts
  // compared (up to the first mismatch, which counts) and those that matched.
  int64_t spec_shadow_probes = 0, spec_shadow_draft_tokens = 0, spec_shadow_accepted_tokens = 0;
  // Drafter calls (one per step that drafted, for every drafting sequence together) and their
  // wall time: what a shadow probe costs, and a verify step's drafting share.
  int64_t spec_draft_calls = 0;
  double spec_draft_seconds = 0;
  Histogram step_seconds{Histogram::seconds()};
  Histogram batch_tokens{Histogram::powers_of_two(12)};
  Histogram batch_sequences{Histogram::powers_of_two(8)};
};

class Engine {
 public:
  // Loads the tokenizer and the model from options.model_dir (path "fast": a converted checkpoint;
  // "reference": the official layout, the plain oracle).
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  // With an explicit backend (tests, other model paths).
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<ModelRunner> backend,
                                                std::unique_ptr<Tokenizer> tokenizer,
                                                const EngineOptions& options);
  ~Engine();  // cancels what is left and joins the engine thread

  // Validates and queues a request. Errors (bad ids, prompt too long, bad sampling, full queue)
  // name the parameter and never reach the engine thread.
  Result<RequestHandle> submit(GenerationRequest request);
  // `n` parallel samples of one prompt (OpenAI's `n`), queued together or not at all: sample i is
  // the request with seed + i when a seed is given (vLLM's rule), so each equals a request of its
  // own. Where the model caches prefixes, samples 1..n-1 wait until sample 0 has computed the
  // prompt and then take its blocks from the cache (the prompt is computed once, up to its last
  // partial block).
  Result<std::vector<RequestHandle>> submit(GenerationRequest request, int n);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int32_t vocab_size() const { return vocab_size_; }
  int64_t max_context() const { return max_context_; }
  // Requests the engine holds at once at most: running (max_num_seqs) plus waiting (max_queue).
  int64_t max_requests() const { return int64_t(limits_.max_seqs) + options_.max_queue; }
  int32_t eos_id() const { return eos_id_; }
  // The id every position of an image span carries (-1: the tokenizer has no image token).
  int32_t image_token_id() const { return image_token_id_; }
  EngineStats stats() const;
  // The model's health (ModelRunner::health): not ok once a split model's ranks stopped answering;
  // submissions are then refused as unavailable. Any thread.
  Status health() const;
  // With speculative decoding loaded: whether decode steps draft at all (off: every step decodes
  // plainly, the drafter's rows still kept; the control of `bench decode --speculative on`).
  void set_drafting(bool on) { drafting_.store(on); }
  // The engine-wide acceptance a new request starts from (SpecPrior) is kept per slot; requests
  // taken in from now on start from, and teach, slot `slot` (0 by default; a bench switching
  // drafters gives each its own, so one drafter's acceptance is not another's prior; the measured
  // costs are shared).
  static constexpr int kAcceptanceSlots = 4;
  void select_acceptance_slot(int slot) {
    acceptance_slot_.store(std::clamp(slot, 0, kAcceptanceSlots - 1));
  }

 private:
  struct Active;  // a running or waiting request: its sequence, tokens, sampler, decoder
  Engine() = default;
  void loop();
  bool take_submissions(std::vector<std::unique_ptr<Active>>& active);
  void hold_parallel_samples(std::vector<std::unique_ptr<Active>>& active);
  void run_step(std::vector<std::unique_ptr<Active>>& active);
  // After a step gave a sequence its next-token logits: sample, publish, maybe finish.
  bool advance(Active& a, const std::vector<float>& logits);
  // prompt_logprobs: the entries of a prefill slice's rows (first: the slice's first position).
  void publish_prompt_logprobs(Active& a, const SeqSlice& sl, int64_t first,
                               const std::vector<float>& logits, int top);
  // Publishes `tok` (drawn from `logits`) as the sequence's next token; true when that finished it.
  bool emit(Active& a, int32_t tok, const std::vector<float>& logits);
  // A constrained sequence's mask applied to a logits row (-inf where the grammar refuses); false
  // when it allows no token. Unconstrained sequences: true, the row unchanged.
  bool constrain(Active& a, std::vector<float>& logits);
  // Ends a constrained sequence whose grammar allows no token the model may sample (true).
  bool end_unsatisfiable(Active& a);
  // Speculation: the drafts each planned decode verifies this step (empty: none), drafted now.
  // Shadow probes are drafted in the same call and kept in their Active; `*shadows` counts them.
  std::vector<std::vector<int32_t>> draft_for(const StepPlan& plan,
                                              const std::vector<Active*>& planned,
                                              int64_t* shadows);
  // A token `a` emitted while a shadow chain is pending: compare, and record the probe's outcome
  // in the tracker and the prior once the chain is matched or missed.
  void resolve_shadow(Active& a, int32_t tok);
  void record_shadow(Active& a, int64_t examined, int64_t accepted);
  // After a verify step of [t, drafts...] with a logits row per token: accept/resample in order,
  // roll the rejected rows back; true when the request finished.
  bool verify(Active& a, const std::vector<int32_t>& drafts, const std::vector<float>& logits);
  void drop(std::vector<std::unique_ptr<Active>>& active, std::size_t i);

  std::unique_ptr<ModelRunner> backend_;  // the model seam (model/seam.h)
  std::unique_ptr<Tokenizer> tokenizer_;
  EngineOptions options_;
  int32_t vocab_size_ = 0;
  int64_t max_context_ = 0;
  int32_t eos_id_ = -1;
  int32_t think_end_id_ = -1;    // the reasoning's end (thinking_token_budget)
  int32_t image_token_id_ = -1;  // every position of an image span (GenerationRequest::images)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<RequestChannel>> queue_;
  bool stopping_ = false;
  Scheduler sched_;  // engine thread only
  SchedLimits limits_;
  std::atomic<int64_t> running_{0}, waiting_{0}, preemptions_{0}, steps_{0};
  std::atomic<int64_t> decode_steps_ns_{0}, decode_steps_tokens_{0};
  std::atomic<int64_t> kv_total_{0}, kv_used_{0};
  std::atomic<int64_t> prefix_queries_{0}, prefix_query_tokens_{0}, prefix_hit_tokens_{0};
  std::atomic<int64_t> prefix_evictions_{0};
  SpecCosts spec_costs_;                     // engine thread only
  SpecPrior spec_priors_[kAcceptanceSlots];  // engine thread only
  std::atomic<bool> drafting_{true};
  std::atomic<int> acceptance_slot_{0};
  std::atomic<int64_t> spec_draft_tokens_{0}, spec_accepted_tokens_{0}, spec_steps_{0};
  std::atomic<int64_t> spec_shadow_probes_{0}, spec_shadow_draft_tokens_{0},
      spec_shadow_accepted_tokens_{0};
  std::atomic<int64_t> spec_draft_calls_{0}, spec_draft_ns_{0};
  static constexpr int64_t kVerifyingProbeEvery = 8;  // of the probes (shadows otherwise)
  int64_t probes_ = 0;                                // engine thread only
  mutable std::mutex hist_mu_;                        // the step histograms below
  Histogram step_seconds_{Histogram::seconds()};
  Histogram batch_tokens_{Histogram::powers_of_two(12)};
  Histogram batch_sequences_{Histogram::powers_of_two(8)};
  std::atomic<int64_t> prompt_tokens_total_{0};
  std::atomic<int64_t> generated_tokens_total_{0};
  std::atomic<uint64_t> next_id_{1};
  std::thread thread_;
};

}  // namespace dsv41
