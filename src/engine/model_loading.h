// The models the engine drives, all through the model seam (model/seam.h): the fast forward on a
// converted checkpoint, or the reference forward (fp32) on the official layout. Tests plug
// scripted ModelRunners in to drive the engine and the server through exact token sequences.
// Each request is one sequence of the seam (open, steps, free); the
// scheduler (engine/scheduler.h) puts several in one step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/seam.h"

namespace dsv41 {

// The reference forward (fp32) on a checkpoint in the official layout.
// dspark: also load the DSpark drafter (ModelRunner::draft).
Result<std::unique_ptr<ModelRunner>> load_reference_runner(const std::string& model_dir,
                                                           bool dspark = false);

struct FastRunnerOptions {
  int threads = 0;                  // 0: one per physical core of the affinity mask (or cpus)
  std::vector<int> cpus;            // --cpu-list: pinned to these first (FastOptions::cpus)
  bool act_quant = false;           // DeepSeek's E4M3 activation rounding (spec §3.3)
  double kv_cache_gb = 0;           // 0: a quarter of available memory
  bool warm = true;                 // fault the weights in at load (Engram tables excepted)
  bool huge_pages = true;           // FastOptions::huge_pages
  std::string isolation = "count";  // count | mask | off (model/fast/kv_pool.h)
  bool prefix_cache = true;         // model/fast/prefix_cache.cpp
  bool dspark = false;              // load the DSpark drafter (ModelRunner::draft)
  bool decoder_replay = false;      // FastOptions::decoder_replay (an approximation; spec §10.3)
  int64_t replay_margin = 12;       // FastOptions::replay_margin (-1: kReplayMarginExact)
  // Split over the ranks of an mpirun job (parallel/distributed_runner.h; 0: the default split):
  // attention over tp ranks, routed experts over ep ranks; a rank waits rank_timeout_s for the
  // others inside a step before the model is declared failed.
  int tp = 0, ep = 0;
  double rank_timeout_s = 60;
};
// The fast forward (model/fast) on a converted checkpoint; under mpirun, this rank's share of it
// (on ranks other than 0 the call follows rank 0 and never returns: parallel::load_split).
Result<std::unique_ptr<ModelRunner>> load_fast_runner(const std::string& converted_dir,
                                                      const FastRunnerOptions& o);

}  // namespace dsv41
