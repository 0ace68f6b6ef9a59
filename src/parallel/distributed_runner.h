// The fast forward split over the ranks of an mpirun job (issue 17, docs/parallel.md).
//
// Rank 0 runs everything a single process runs (HTTP, tokenizer, scheduler, sampler) and drives
// its model through a LeadRunner: every call that changes the model's state (open, free, truncate,
// step, draft, attaching a cached prefix, the bench's random fill) is first broadcast to the other
// ranks as plain data, then applied locally; each rank's FastModel computes its share and the
// shares meet in the forward's collectives. So every rank holds the same sequences and the same
// cache blocks, and rank 0 answers the read-only questions (lengths, free blocks) alone. The other
// ranks only follow: they apply what rank 0 sends until it says stop.
//
// Faults: a rank that dies or stops answering makes a collective time out (World::timeout); the
// step fails, the LeadRunner turns unhealthy (health(): the server answers 503 and refuses new
// requests) and stays so; `serve` then exits non-zero.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "model/fast/fast_model.h"
#include "parallel/world.h"

namespace dsv41::parallel {

struct SplitOptions {
  int tp = 0, ep = 0;     // 0: not given (one process: 1; under mpirun: tp 1, ep = ranks)
  double timeout_s = 60;  // how long a rank waits for the others inside a step
};

// Checks a split against the world: tp and ep each divide the number of ranks, and the larger of
// the two equals it. Fills the defaults.
Status resolve_split(const World& w, SplitOptions* s);

// What one rank holds and did (LeadRunner::reports, `bench decode` under mpirun).
struct RankReport {
  int rank = 0;
  int64_t share_weight_bytes = 0;  // weights this rank reads (FastStats::share_weight_bytes)
  int64_t rss_bytes = 0;           // resident set (VmRSS of /proc/self/status)
  int64_t rss_file_bytes = 0;      // of it, file-backed pages (the mapped weights)
  // Weights copied onto transparent huge pages at load (FastStats::huge_page_weight_bytes) and
  // the anonymous memory the kernel backs with huge pages now (AnonHugePages of smaps_rollup).
  int64_t huge_page_weight_bytes = 0, anon_huge_bytes = 0;
  int64_t kv_pool_bytes = 0;  // the KV pool's size
  int64_t collectives = 0, collective_bytes = 0;
  double collective_seconds = 0;
};
RankReport own_report(const FastModel& m, int rank);

class LeadRunner final : public ModelRunner {
 public:
  LeadRunner(std::unique_ptr<FastModel> local, World& world);
  ~LeadRunner() override;  // tells the followers to stop

  FastModel& local() { return *local_; }
  const SplitOptions& split() const { return split_; }
  void set_split(const SplitOptions& s) { split_ = s; }
  int32_t vocab_size() const override { return local_->vocab_size(); }
  int64_t hidden_size() const override { return local_->hidden_size(); }
  int64_t max_context() const override { return local_->max_context(); }
  Status open(SeqId seq) override;
  void free(SeqId seq) override;
  Status truncate(SeqId seq, int64_t length) override;
  int64_t length(SeqId seq) const override { return local_->length(seq); }
  Status step(const StepBatch& batch, StepOutput* out) override;
  int64_t draft_block_size() const override { return local_->draft_block_size(); }
  Status draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) override;
  int64_t foreign_reads() const override { return local_->foreign_reads(); }
  int64_t kv_blocks_total() const override { return local_->kv_blocks_total(); }
  int64_t kv_blocks_free() const override { return local_->kv_blocks_free(); }
  int64_t kv_blocks_to_grow(SeqId seq, int64_t new_len) const override {
    return local_->kv_blocks_to_grow(seq, new_len);
  }
  int64_t kv_blocks_peak(int64_t length, int64_t step_tokens) const override {
    return local_->kv_blocks_peak(length, step_tokens);
  }
  int64_t attach_cached_prefix(SeqId seq, const std::vector<int32_t>& tokens,
                               const std::string& salt) override;
  bool prefix_caching() const override { return local_->prefix_caching(); }
  PrefixCacheCounts prefix_cache_counts() const override { return local_->prefix_cache_counts(); }
  Status health() const override;
  Status fill_random_context(SeqId seq, int64_t length, uint64_t seed);
  Status set_decoder_replay(bool on);   // on every rank (FastModel::set_decoder_replay)
  void set_prefill_attention(bool on);  // on every rank (FastModel::set_prefill_attention)
  // Every rank's report, rank-major (a collective: the followers answer between steps).
  Result<std::vector<RankReport>> reports();

 private:
  // Broadcasts cmd_; false (and unhealthy) when the other ranks do not take it.
  bool send();
  void fail(const std::string& why);
  template <typename Fn>
  auto guarded(Fn&& fn, decltype(fn()) on_failure) -> decltype(fn());
  // The status a failed call returns (health() once fail() has run; evaluated before it has).
  Status health_error() const {
    return Status::error("model ranks: failed", ErrorKind::kUnavailable);
  }
  std::vector<uint8_t> cmd_;  // the command being sent (its capacity reused)
  std::unique_ptr<FastModel> local_;
  World& world_;
  SplitOptions split_;
  std::atomic<bool> failed_{false};
  mutable std::mutex why_mu_;
  std::string why_;
};

// Loads this rank's share of a converted checkpoint under the world's split (opt's comm and parts
// are filled here), after checking that every rank loads the same model with the same version and
// options (a mismatch names the rank). Rank 0 gets its LeadRunner; every other rank follows rank 0
// until it stops and then ends the process (World::exit_now): this call returns only on rank 0 or
// with an error. In a world of one it is FastModel::load.
Result<std::unique_ptr<ModelRunner>> load_split(const std::string& dir, FastOptions opt,
                                                SplitOptions split);

// The LeadRunner behind a runner load_split returned, or nullptr (one process).
LeadRunner* as_lead(ModelRunner* r);

}  // namespace dsv41::parallel
