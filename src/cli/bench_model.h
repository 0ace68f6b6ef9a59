// What `bench decode`, `bench prefill` and `bench serve` share (cli/cmd_bench_model.cpp,
// cli/cmd_bench_serve.cpp): their options, list parsing, the read probe, loading the fast model
// for a benchmark and one decode point.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/huge_alloc.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/fast/fast_model.h"
#include "parallel/distributed_runner.h"

namespace dsv41::cli {

using Clock = std::chrono::steady_clock;
inline double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct BenchArgs {
  std::string model, converted, streams = "1,4,16", context = "0", lengths = "512,4096,16384";
  std::string context_fill = "random";
  int steps = 8, threads = 0;
  double kv_cache_gb = 0;
  std::string act_quant = "off";
  std::string huge_pages = "on";
  std::size_t probe_mb = 1024;
  std::string speculative = "off";  // bench decode: on = the DSpark A/B (cli/cmd_bench_spec.cpp)
  int64_t spec_tokens = 48;         // ... tokens each request generates
  int64_t spec_width = 0;           // ... drafts verified per step (0: the engine's cost model)
  int64_t spec_repeats = 3;         // ... repetitions of the modes, alternating
  std::string spec_modes = "off,on,oracle";  // ... which modes (off always; on and/or oracle)
  bool spec_paired = false;  // ... off and on at the same time on two engines (modes off,on)
  std::string spec_probe = "shadow";     // ... how trackers probe (add_spec_probe_option)
  std::string decoder_replay = "off";    // bench prefill: off | on | ab (both, alternating)
  std::string replay_margin = "12";      // bench prefill: N | exact (add_replay_margin_option)
  std::string prefill_attention = "on";  // bench prefill: off | on | ab
  bool extremes = false;  // bench prefill with both ab: only everything off and everything on
  int64_t chunk = 0;      // bench prefill: tokens per step (0: the whole prompt)
  std::string images;     // bench prefill: WxH,... the vision tower's points instead
  int tp = 0, ep = 0;     // under mpirun: the split (parallel/)
  double rank_timeout_s = 60;
};

// A benchmark's fast model: one process's FastModel, or under mpirun rank 0's LeadRunner (the
// other ranks follow inside load_for_bench and never return from it).
struct BenchModel {
  std::unique_ptr<ModelRunner> runner;
  FastModel* local = nullptr;            // this process's model (stats, isa, pool)
  parallel::LeadRunner* lead = nullptr;  // nullptr: one process
  void set_prefill_attention(bool on) {
    if (lead)
      lead->set_prefill_attention(on);
    else
      local->set_prefill_attention(on);
  }
  Status set_decoder_replay(bool on) {
    return lead ? lead->set_decoder_replay(on) : local->set_decoder_replay(on);
  }
  Status fill_random_context(SeqId seq, int64_t length, uint64_t seed) {
    return lead ? lead->fill_random_context(seq, length, seed)
                : local->fill_random_context(seq, length, seed);
  }
};

// "1,4,16" -> {1, 4, 16}; the error names `what`.
Result<std::vector<int64_t>> parse_list(const std::string& s, const std::string& what);

// Streaming-read bandwidth (GB/s) of all threads over a buffer larger than the caches: the best
// of three passes (one pass read 23-58 GB/s from run to run on the same machine).
class ReadProbe {
 public:
  ReadProbe(std::size_t mb, std::size_t threads);
  double gb_per_s();

 private:
  HugeVector<float> buf_;  // on huge pages, as the engine's weights (core/huge_alloc.h)
  ThreadPool pool_;
};

// The fast model of a.model (converted once if official), weights faulted in.
Result<BenchModel> load_for_bench(const BenchArgs& a);

// --model, --converted, --threads, --kv-cache-gb, --act-quant of every `bench` model command.
void add_common(CLI::App* sub, BenchArgs* a);

// `bench decode --speculative on`: the engine's drafting on vs suppressed (cmd_bench_spec.cpp).
int run_bench_speculative(const BenchArgs& a);

// One decode point: `streams` sequences at `context` tokens (random rows, or a real prefill), a
// warm-up step, then `steps` timed steps of one token each; JSON with tok_s, bytes, the probe.
Result<nlohmann::ordered_json> decode_point(BenchModel& bm, ReadProbe& probe, int64_t streams,
                                            int64_t context, int steps, bool prefill_context,
                                            Rng& rng);

}  // namespace dsv41::cli
