// Flip reports: given the decision traces of two reference runs (e.g. fp32 vs fp64, prefill vs
// decode, owner vs vendor), list the first places where a fake-quant rounding, an indexer top-k
// set, a candidate pool or an expert selection differs, and how close each run's pre-rounding value
// (or score) sat to the decision boundary. This is how a logit difference is traced to a mechanism.
#pragma once

#include <string>
#include <vector>

#include "model/reference/reference_model.h"

namespace dsv41 {

struct Divergence {
  int layer = 0;
  int64_t pos = 0;
  TraceSite site = TraceSite::kWindowKv;
  int64_t sub = -1;
  std::string what;     // human-readable description of the difference
  double margin_a = 0;  // distance of run A's value from the boundary between the two decisions
  double margin_b = 0;  // (scaled units for roundings; score gap at the k-th place for selections)
};

// Divergences ordered by (position, layer, A's order of execution); at most `max` of them.
std::vector<Divergence> compare_traces(const std::vector<TraceEvent>& a,
                                       const std::vector<TraceEvent>& b, std::size_t max);

}  // namespace dsv41
