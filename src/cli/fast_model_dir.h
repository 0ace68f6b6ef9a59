// Where the fast path's converted checkpoint comes from: a converted directory is used as it is;
// an official-layout directory is converted once (with progress) into the directory the user
// names, or by default into a cache beside it (`DIR.dsv41-converted`), and later runs reuse it.
#pragma once

#include <string>

#include "cli/commands.h"
#include "core/status.h"
#include "engine/engine.h"

namespace dsv41::cli {

// The forward-path options of `generate` and `serve`.
struct PathArgs {
  std::string path = "fast", converted, act_quant = "off", isolation = "count", prefix_cache = "on";
  std::string huge_pages = "on";
  std::string speculative = "off", spec_probe = "shadow";
  std::string decoder_replay = "off", replay_margin = "12";
  int threads = 0;
  std::string cpu_list;  // --cpu-list (empty: the affinity mask)
  double kv_cache_gb = 0;
  int tp = 0, ep = 0;  // under mpirun (parallel/): 0 = the default split
  double rank_timeout_s = 60;
};
void add_path_options(CLI::App* sub, PathArgs* a);
// An error when the process runs under mpirun with more than one rank: for what has no split
// (the reference path, `logits --dspark`, `bench serve`, the speculative bench); `what` names it.
Status one_process_only(const std::string& what);
// --spec-probe shadow|verify (EngineOptions::speculative_shadow_probes), stored as text.
void add_spec_probe_option(CLI::App* sub, std::string* probe);
// --replay-margin N|exact (FastOptions::replay_margin; exact = kReplayMarginExact), stored as
// text in *margin and read back with replay_margin_value.
void add_replay_margin_option(CLI::App* sub, std::string* margin);
int64_t replay_margin_value(const std::string& margin);
// --tp, --ep and --rank-timeout (part of add_path_options; `logits --path fast` takes them too).
void add_split_options(CLI::App* sub, int* tp, int* ep, double* timeout_s);
// Fills eo.path / eo.fast / eo.model_dir from the options (converting an official-layout model
// for the fast path first).
Status apply_path_options(const PathArgs& a, const std::string& model_dir, EngineOptions* eo);

// A model that cannot be prepared or loaded, for the log: the message as it is when it already
// names a flag ("--converted: ..."), else attributed to --model.
std::string model_error(const Status& st);

// Returns the converted directory to load; says on stderr what it found and did.
Result<std::string> ensure_converted(const std::string& model_dir,
                                     const std::string& converted_dir);

}  // namespace dsv41::cli
