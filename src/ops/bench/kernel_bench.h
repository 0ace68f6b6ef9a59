// `dsv41 bench kernels` (design.md §8): the decode kernels at the model's real shapes, timed on all
// threads, each beside a streaming-read probe so achieved weight bandwidth is reported as a
// fraction of what the machine delivered in the same seconds; 16-token cost against 1-token cost;
// CPU time of other processes during the run (/proc/stat); oneDNN's bf16 matmul at prefill shapes
// for reference.
#pragma once

#include <cstddef>
#include <cstdint>
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

// The arithmetic reference of the roofline (design.md §4): oneDNN's matmul [m, k] x [k, n] -> f32
// on every core, bf16 inputs where oneDNN has a bf16 path on this CPU (else f32, said in op),
// best of reps after a warm-up; gflop_per_s 0 when oneDNN cannot run at all.
struct ReferenceGemm {
  double gflop_per_s = 0;
  std::string op;
};
ReferenceGemm reference_gemm(int64_t m = 2048, int64_t n = 5120, int64_t k = 5120, int reps = 3);

}  // namespace dsv41::ops
