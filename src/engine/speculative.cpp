// Speculative verification and the acceptance tracker (see speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

namespace dsv41 {

VerifyOutcome verify_draft(const ProcessedDistribution& p, int32_t draft, Sampler& sampler,
                           ProcessedDistribution* scratch) {
  if (p.greedy) return {p.ids[0] == draft, p.ids[0]};
  const double pd = p.probability(draft);
  if (pd > 0 && sampler.uniform() < pd) return {true, draft};
  // The residual max(0, p - q) with q the point mass on the draft: p without it, renormalised.
  scratch->ids.clear();
  scratch->probs.clear();
  scratch->greedy = false;
  for (std::size_t i = 0; i < p.ids.size(); ++i)
    if (p.ids[i] != draft) {
      scratch->ids.push_back(p.ids[i]);
      scratch->probs.push_back(p.probs[i] / (1.0 - pd));
    }
  if (scratch->ids.empty()) return {true, draft};  // p was the point mass on the draft
  return {false, sampler.draw(*scratch)};
}

namespace {
constexpr double kAlpha = 0.2;  // EWMA weight of the newest observation
void ewma(double* v, bool* have, double x) {
  *v = *have ? (1 - kAlpha) * *v + kAlpha * x : x;
  *have = true;
}
}  // namespace

void SpecCosts::observe_plain(double s) {
  ewma(&plain_, &have_plain_, s);
}
void SpecCosts::observe_spec(double s) {
  ewma(&spec_, &have_spec_, s);
}
double SpecCosts::ratio() const {
  return have_plain_ && have_spec_ && plain_ > 0 ? spec_ / plain_ : 1.0;
}

int64_t SpecTracker::plan(const SpecCosts& costs) {
  (void)costs;
  if (block_ <= 0) return 0;
  if (wait_ > 0) {
    --wait_;
    return 0;
  }
  // Verify as many drafts as are likely to be accepted plus one (a prefix of the chain: later
  // drafts are accepted only after earlier ones), the whole block before anything is known.
  if (accept_ < 0) return block_;
  return std::clamp<int64_t>(int64_t(std::ceil(accept_)) + 1, 1, block_);
}

void SpecTracker::record(int64_t drafted, int64_t accepted, const SpecCosts& costs) {
  if (drafted <= 0) return;
  accept_ = accept_ < 0 ? double(accepted) : (1 - kAlpha) * accept_ + kAlpha * double(accepted);
  // A drafting step emits 1 + accepted tokens for `ratio` plain steps' time.
  if (1.0 + accept_ > costs.ratio()) {
    interval_ = 4;
    return;
  }
  wait_ = interval_;
  interval_ = std::min<int64_t>(interval_ * 2, 256);
}

}  // namespace dsv41
