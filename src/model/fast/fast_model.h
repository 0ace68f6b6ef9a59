// The fast engine's forward (spec §4-§7) behind the model seam (model/seam.h): the complete text
// model on the ops kernels over the converted layout, batched over sequence slices, packed caches
// in one tagged KV pool (model/fast/kv_pool.h), all cores through the thread pool.
//
// Batch invariance by construction: every per-token computation (each linear, norm, mHC step,
// attention, expert) runs with the same kernel, the same arguments and the same split of its rows
// over threads whatever else is in the step; tokens never share a reduction. The batch is used to
// group tokens (by layer, by expert) so weights are reused while hot, never to change an order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/collective.h"
#include "core/status.h"
#include "model/fast/kv_pool.h"
#include "model/reference/reference_model.h"  // IndexKeySemantics
#include "model/seam.h"

namespace dsv41 {

struct FastOptions {
  IndexKeySemantics index_keys = IndexKeySemantics::kOwner;
  // DeepSeek's inference numerics: every FP8/FP4 linear's input rounded to E4M3 with a
  // power-of-two scale per 32 values first (spec §3.3). Off: model-faithful, as the reference.
  bool act_quant = false;
  // The routed experts' one-token MXFP4 dots over activations rounded to int16 per 32 (faster;
  // fails the short-prefix gate on random weights, docs/decisions.md). Off: fp32 products.
  bool mxfp4_int16 = false;
  int threads = 0;  // 0: one per physical core of the affinity mask (or of `cpus`)
  // --cpu-list: the loading thread (and every thread created after it: the pool, the engine's,
  // the server's) is pinned to these CPUs first; empty: the mask the process was started with.
  std::vector<int> cpus;
  int64_t kv_cache_bytes = 0;  // 0: a quarter of the machine's available memory (at least 64 MB)
  IsolationMode isolation = IsolationMode::kCount;
  int64_t max_rollback = 64;  // truncate() is exact up to this many tokens back (beyond: refused)
  int64_t window_block_tokens = 16;
  // Cache full global blocks of every sequence (with the window rows before their end) for later
  // sequences with the same tokens (attach_cached_prefix); owner index-key semantics only (the
  // vendor quirk's state depends on how the prefix was chunked).
  bool prefix_cache = true;
  // Fault every weight page in at load (the Engram tables excepted), so steps do not wait on disk.
  bool warm = false;
  // With warm: the weights this process reads are first copied in place onto transparent huge
  // pages (ConvertedWeights::warm): fewer TLB misses, one-token decode several times faster on
  // the real-shape preset (docs/perf.md). Off: they are read through the file mapping (shared with
  // the page cache, no copy at load).
  bool huge_pages = true;
  // Load the DSpark drafter (mtp.* stages): every step then also writes each stage's window row
  // of its tokens (main_hidden -> main_x -> the stage's FP8 row), and draft() works.
  bool dspark = false;
  // Split over processes (parallel/, docs/parallel.md): this process computes attention part
  // tp_part of tp_parts (whole o_groups: the queries, attention and wo_a of its heads) and routed
  // experts part ep_part of ep_parts (a contiguous range of each layer's experts); -1: no share
  // (a rank beyond the split's size). Everything else (embedding, norms, mHC, KV projections,
  // compressor, indexer, shared expert, head) runs on every rank, so each keeps the whole KV cache.
  // The parts meet through comm->allreduce_sum of per-group and per-slot outputs in which every
  // element comes from exactly one rank: the sums are exact and every rank continues with the
  // bits one process would have (the same kernels on the same rows, the same summation order).
  // Decoder replay (spec §10.3, docs/decoder_replay.md; an approximation): in a slice longer than
  // sliding_window + replay_margin tokens, the layers before the split layer (the first ratio-1
  // layer) and the split layer's compressor and index keys run on every token; the split layer's
  // attention and FFN and every later layer run only on the slice's last window + margin tokens,
  // their windows floored at the first of them. Logits of the other rows are not computed (NaN).
  // Prefill attention through ops::prefill_attention (a run of a sequence's consecutive positions
  // at once: each window row unpacked once for the run); the same bits as the one-query path.
  bool prefill_attention = true;
  // replay_margin kReplayMarginExact: (decoder layers - 1) x (window - 1), the smallest margin at
  // which a replayed chunk's last row, its decoder window rows and so every later token are bit
  // for bit those of the full stack (each decoder layer's window reaches window - 1 positions
  // further back into rows the previous layer computed with a floored window;
  // docs/decoder_replay.md). Only the rows before the chunk's end differ.
  static constexpr int64_t kReplayMarginExact = -1;
  bool decoder_replay = false;
  int64_t replay_margin = 12;
  Collective* comm = nullptr;
  int tp_parts = 1, tp_part = 0;
  int ep_parts = 1, ep_part = 0;
};

struct FastStats {
  int64_t steps = 0;
  int64_t tokens = 0;
  // Weight bytes a step needs, counted as the kernels are handed them: each linear, mHC matrix and
  // routed expert once per step however many of the step's tokens use it (and once per draft
  // call, apart from the step's), plus each token's Engram rows; and the distinct routed experts
  // per layer, summed over the steps.
  int64_t weight_bytes = 0;
  int64_t distinct_experts = 0;
  // Multiply-adds of the linears, routed experts and mHC matrices the step's tokens went through
  // (per token: what a GEMM would compute), for a prefill's fraction of the GEMM peak.
  int64_t macs = 0;
  int64_t foreign_reads = 0;  // the isolation counter (must stay 0)
  int64_t prefix_queries = 0, prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t prefix_entries = 0;    // cached global blocks now
  int64_t prefix_evictions = 0;  // cached blocks evicted (the pool was full)
  // Matching cached tokens not attached because decoder replay skipped the rows they end in.
  int64_t prefix_replay_capped_tokens = 0;
  // Split over processes: the weight bytes this process reads (its share; the Engram tables are
  // not counted: only hashed rows are read), the collectives it took part in and their payload.
  int64_t share_weight_bytes = 0;
  // Copied onto transparent huge pages at load (the share's whole 2 MB pages and the gaps of less
  // than 2 MB between its ranges).
  int64_t huge_page_weight_bytes = 0;
  int64_t collectives = 0, collective_bytes = 0;
  int64_t replayed_slices = 0;  // slices that ran the decoder on their last window + margin only
  int64_t replay_skipped_rows = 0;  // token rows the decoder layers did not run on
  double collective_seconds = 0;
};

class FastModel final : public ModelRunner {
 public:
  // dir: a converted checkpoint (model/convert); refuses anything else, naming what is wrong.
  static Result<std::unique_ptr<FastModel>> load(const std::string& dir, const FastOptions& opt);
  // The KV budget kv_cache_bytes 0 stands for: a quarter of MemAvailable, at least 64 MB.
  static int64_t default_kv_budget();
  ~FastModel() override;

  int32_t vocab_size() const override;
  int64_t hidden_size() const override;
  int64_t max_context() const override;
  Status open(SeqId seq) override;
  void free(SeqId seq) override;
  Status truncate(SeqId seq, int64_t length) override;
  int64_t length(SeqId seq) const override;
  Status step(const StepBatch& batch, StepOutput* out) override;
  int64_t draft_block_size() const override;
  Status draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) override;
  int64_t foreign_reads() const override;
  int64_t kv_blocks_total() const override;
  int64_t kv_blocks_free() const override;
  int64_t kv_blocks_to_grow(SeqId seq, int64_t new_len) const override;
  int64_t kv_blocks_peak(int64_t length, int64_t step_tokens) const override;
  int64_t attach_cached_prefix(SeqId seq, const std::vector<int32_t>& tokens,
                               const std::string& salt) override;
  PrefixCacheCounts prefix_cache_counts() const override;
  bool prefix_caching() const override;

  FastStats stats() const;
  const KvPool& pool() const;
  const char* isa() const;
  // Test hook for the isolation gate: make sequence `victim`'s global block `index` point at
  // sequence `owner`'s block of the same index (a planted foreign read).
  Status debug_plant_foreign_block(SeqId victim, SeqId owner, int64_t index);
  // Bench hook (`bench decode --context N`): an open, empty sequence is given the caches a prefill
  // of `length` tokens leaves, in shape and format (window rows, compressed rows and index keys of
  // every KV source, Engram history, open compressor groups), filled with random values instead of
  // computed ones, so decode at depth can be timed without running the prefill. The arithmetic of
  // the steps that follow does not depend on the values; their logits mean nothing. Refuses a
  // non-empty sequence and a pool too small, like a step.
  Status fill_random_context(SeqId seq, int64_t length, uint64_t seed);
  // Decoder replay on or off from the next step (bench prefill's A/B); refuses on a config without
  // a split layer (a ratio-1 layer after which no layer owns compressed KV).
  Status set_decoder_replay(bool on);
  // The margin decoder replay uses (kReplayMarginExact resolved for this config).
  int64_t replay_margin() const;
  // ops::prefill_attention on or off from the next step (bench prefill's A/B; the same bits).
  void set_prefill_attention(bool on);

 private:
  FastModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41
