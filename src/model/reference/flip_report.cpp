// Trace comparison for flip reports (see flip_report.h).
#include "model/reference/flip_report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/dtypes.h"

namespace dsv41 {
namespace {

using Key = std::tuple<int64_t, int, int, int64_t>;  // pos, layer, site, sub
Key key_of(const TraceEvent& e) {
  return {e.pos, e.layer, int(e.site), e.sub};
}

bool is_rounding(TraceSite s) {
  return s == TraceSite::kWindowKv || s == TraceSite::kCompressedKv || s == TraceSite::kIndexKey ||
         s == TraceSite::kIndexQuery || s == TraceSite::kActQuant;
}

double decode(TraceSite s, int64_t code) {
  return s == TraceSite::kWindowKv || s == TraceSite::kActQuant
             ? double(e4m3_to_float(uint8_t(code)))
             : double(e2m1_to_float(uint8_t(code)));
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

// Gap between the k-th and (k+1)-th largest score: how far the selection was from changing.
double selection_gap(const std::vector<double>& scores, std::size_t k) {
  std::vector<double> s(scores);
  std::sort(s.begin(), s.end(), std::greater<double>());
  if (k == 0 || k >= s.size()) return INFINITY;
  return s[k - 1] - s[k];
}

Divergence describe(const TraceEvent& a, const TraceEvent& b) {
  Divergence d{a.layer, a.pos, a.site, a.sub, "", 0, 0};
  if (is_rounding(a.site)) {
    for (std::size_t blk = 0; blk < std::min(a.scales.size(), b.scales.size()); ++blk)
      if (a.scales[blk] != b.scales[blk]) {
        d.what = "block " + std::to_string(blk) + " scale " + std::to_string(a.scales[blk]) +
                 " vs " + std::to_string(b.scales[blk]);
        if (!a.tensor.empty()) d.what = a.tensor + " input " + d.what;
        return d;
      }
    for (std::size_t i = 0; i < std::min(a.decision.size(), b.decision.size()); ++i)
      if (a.decision[i] != b.decision[i]) {
        const double va = decode(a.site, a.decision[i]), vb = decode(a.site, b.decision[i]);
        const double boundary = (va + vb) / 2;
        d.what = "element " + std::to_string(i) + " rounds to " + std::to_string(va) + " vs " +
                 std::to_string(vb) + " (pre-rounding " + std::to_string(a.detail[i]) + " vs " +
                 std::to_string(b.detail[i]) + ")";
        if (!a.tensor.empty()) d.what = a.tensor + " input " + d.what;
        d.margin_a = std::fabs(a.detail[i] - boundary);
        d.margin_b = std::fabs(b.detail[i] - boundary);
        return d;
      }
    d.what = "different lengths";
    return d;
  }
  std::vector<int64_t> only_a, only_b;
  std::set_difference(a.decision.begin(), a.decision.end(), b.decision.begin(), b.decision.end(),
                      std::back_inserter(only_a));
  std::set_difference(b.decision.begin(), b.decision.end(), a.decision.begin(), a.decision.end(),
                      std::back_inserter(only_b));
  d.what = "only in A " + list(only_a) + ", only in B " + list(only_b);
  d.margin_a = selection_gap(a.detail, a.decision.size());
  d.margin_b = selection_gap(b.detail, b.decision.size());
  return d;
}

}  // namespace

std::vector<Divergence> compare_traces(const std::vector<TraceEvent>& a,
                                       const std::vector<TraceEvent>& b, std::size_t max) {
  std::map<Key, const TraceEvent*> in_b;
  for (const auto& e : b) in_b[key_of(e)] = &e;
  // By position, then layer, then A's order of execution within them (the trace is appended as
  // the run decides, so an act-quant rounding sorts before the window row it feeds).
  std::vector<const TraceEvent*> sorted_a;
  for (const auto& e : a) sorted_a.push_back(&e);
  std::stable_sort(sorted_a.begin(), sorted_a.end(), [](const TraceEvent* x, const TraceEvent* y) {
    return std::tie(x->pos, x->layer) < std::tie(y->pos, y->layer);
  });
  std::vector<Divergence> out;
  for (const TraceEvent* e : sorted_a) {
    if (out.size() >= max) break;
    auto it = in_b.find(key_of(*e));
    if (it == in_b.end()) continue;  // not decided in B at all (e.g. vendor vs owner slot timing)
    const TraceEvent& o = *it->second;
    const bool same = e->decision == o.decision && (!is_rounding(e->site) || e->scales == o.scales);
    if (!same) out.push_back(describe(*e, o));
  }
  return out;
}

}  // namespace dsv41
