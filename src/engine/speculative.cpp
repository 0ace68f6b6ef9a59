// Speculative verification and the acceptance tracker (see speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

namespace dsv41 {

VerifyOutcome verify_draft(const ProcessedDistribution& p, int32_t draft, Sampler& sampler) {
  const int32_t token = sampler.draw(p);
  return {token == draft, token};
}

namespace {
constexpr double kAlpha = 0.2;  // EWMA weight of the newest observation
constexpr double kDecay = 0.9;  // of a request's acceptance counts per verify step
void ewma(double* v, bool* have, double x) {
  *v = *have ? (1 - kAlpha) * *v + kAlpha * x : x;
  *have = true;
}
}  // namespace

void SpecCosts::observe_plain(double s) {
  ewma(&plain_, &have_plain_, s);
}
void SpecCosts::observe_spec(int64_t width, double s) {
  if (width < 1 || width > kMaxWidth) return;
  ewma(&spec_[width], &have_spec_[width], s);
}
double SpecCosts::ratio(int64_t k) const {
  if (k <= 0) return 1.0;
  k = std::min(k, kMaxWidth);
  if (!have_plain_ || plain_ <= 0) return 1.0 + double(k) / 4;
  if (have_spec_[k]) return spec_[k] / plain_;
  int64_t lo = 0, hi = 0;  // nearest measured widths below and above (0: the plain step)
  for (int64_t w = k - 1; w >= 1 && lo == 0; --w)
    if (have_spec_[w]) lo = w;
  for (int64_t w = k + 1; w <= kMaxWidth && hi == 0; ++w)
    if (have_spec_[w]) hi = w;
  const double rlo = lo ? spec_[lo] / plain_ : 1.0;
  if (hi) return rlo + (spec_[hi] / plain_ - rlo) * double(k - lo) / double(hi - lo);
  if (lo) return 1.0 + (rlo - 1.0) * double(k) / double(lo);  // beyond: the same cost per row
  return 1.0 + double(k) / 4;
}

void SpecPrior::observe(int64_t drafted, int64_t accepted) {
  if (drafted <= 0) return;
  accepted_ = 0.99 * accepted_ + double(accepted);
  rejected_ = 0.99 * rejected_ + (accepted < drafted ? 1.0 : 0.0);
}

std::pair<double, double> SpecPrior::counts() const {
  const double n = accepted_ + rejected_;
  if (n <= 0) return {1.0, 1.0};
  return {2.0 * accepted_ / n, 2.0 * rejected_ / n};
}

double SpecTracker::acceptance() const {
  return (accepted_ + prior_.first) / (accepted_ + rejected_ + prior_.first + prior_.second);
}

int64_t SpecTracker::plan(const SpecCosts& costs) {
  probe_ = false;
  if (block_ <= 0) return 0;
  if (fixed_ > 0) return fixed_;
  if (wait_ > 0) {
    --wait_;
    probing_ = wait_ == 0;
    return 0;
  }
  const double a = std::min(acceptance(), 0.999);
  int64_t best = 0, probe = 1;
  double best_value = 1.0, probe_value = 0.0, tokens = 1.0, ak = 1.0;
  for (int64_t k = 1; k <= block_; ++k) {
    ak *= a;
    tokens += ak;  // expected tokens of a step verifying k drafts: 1 + a + ... + a^k
    const double value = tokens / costs.ratio(k);
    if (value > best_value) best = k, best_value = value;
    if (value > probe_value) probe = k, probe_value = value;
  }
  // Explore, when drafts mostly land: the width above the best once while its cost is unknown
  // (above nothing: the narrowest unmeasured one, so an expensive single draft does not hide a
  // cheaper-per-token wider verify).
  if (a > 0.5) {
    int64_t k = best + 1;
    if (best == 0)
      while (k <= block_ && costs.measured(k)) ++k;
    if (k <= block_ && !costs.measured(k)) return k;
  }
  if (best > 0) return best;
  if (probing_) {  // a probe verifies the best width, whatever the estimate
    probe_ = true;
    return probe;
  }
  wait_ = interval_ - 1;  // this step is the first plain one
  interval_ = std::min<int64_t>(interval_ * 2, 512);
  return 0;
}

void SpecTracker::record(int64_t drafted, int64_t accepted) {
  if (drafted <= 0) return;
  accepted_ = kDecay * accepted_ + double(accepted);
  rejected_ = kDecay * rejected_ + (accepted < drafted ? 1.0 : 0.0);
  if (probing_ && accepted > 0) interval_ = 16;  // the probe paid off: back to the first interval
  probing_ = false;
}

}  // namespace dsv41
