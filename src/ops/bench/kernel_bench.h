// `dsv41 bench kernels` (design.md §8): the decode kernels at the model's real shapes, timed on all
// threads, each beside a streaming-read probe so achieved weight bandwidth is reported as a
// fraction of what the machine delivered in the same seconds; 16-token cost against 1-token cost;
// CPU time of other processes during the run (/proc/stat); oneDNN's bf16 matmul at prefill shapes
// for reference.
#pragma once

#include <cstddef>
#include <string>

namespace dsv41::ops {

struct KernelBenchOptions {
  std::size_t threads = 0;      // 0: all cores
  std::size_t probe_mb = 1024;  // read-probe buffer
  std::size_t min_set_mb =
      512;             // each kernel cycles through copies of its weights to exceed caches
  int reps = 3;        // best of
  bool quick = false;  // one small shape per kernel (tests)
};

// The JSON document (one object).
std::string run_kernel_bench(const KernelBenchOptions& opt);

}  // namespace dsv41::ops
