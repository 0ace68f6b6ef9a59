// DSpark speculative decoding in the engine (spec §8; issue: lossless verification and an
// acceptance tracker). The drafter proposes a greedy chain d1..dk after the token t a sequence is
// about to feed; one step feeds [t, d1..dk] and returns the target's logits after each; the
// verifier walks them in order, drawing each position's token from the target's processed
// distribution p exactly as plain decoding would (the same sampler, the same one uniform per
// token, in the same order) and accepting the draft when the drawn token is the draft:
//   - the drafter's proposal is a point mass on d (its chain is argmax, design.md §9), and
//     accepting exactly when the target's own draw equals d accepts with probability p(d), the
//     standard rule for a point-mass proposal; the emitted token is the target's draw, so the
//     output distribution is the target's;
//   - stronger: the request's random stream is consumed as without speculation, so a seeded
//     request gives the same tokens with speculation on and off (given the same logits rows,
//     which the fast path's batch invariance provides);
//   - after k accepted drafts the last row gives one more token as a plain decode would.
// Rejected rows are rolled back with ModelRunner::truncate.
//
// Whether drafting pays is decided per request (SpecTracker) by a cost model: the request's
// per-draft acceptance probability a (estimated from its verify steps: accepted drafts against
// first rejections, with a prior of weight 2 from what the engine has seen, SpecPrior) gives the
// expected tokens of a step verifying k drafts, (1 - a^(k+1)) / (1 - a); the engine's measured cost
// of such a step over a plain decode step (SpecCosts, per width k: the wall time per sequence of
// steps where every sequence drafted, which counts the drafter, the k extra rows and the extra
// distinct experts they route to) divides it. The request verifies the k with the best ratio while
// that ratio exceeds 1; otherwise it decodes plainly and probes again after an interval that
// doubles with every probe that did not pay. A probe verifies the width of the best ratio (below 1
// by definition); the engine runs probes as shadows by default (below). A new request whose prior
// is not pessimistic (acceptance >= 1/2) probes at its first decode step rather than after the
// first interval: its own acceptance is what decides, and learning it costs one step, not 16 plain
// ones (where the engine already saw the drafter miss, the prior is low and the request waits).
// While drafts are accepted more than half the time, the width one above the best is tried once
// when its cost has not been measured yet (an extrapolated cost is only a guess: where rows share
// experts, wider verification costs less than linearly).
//
// Shadow probes: the verifier accepts a draft exactly when the target's own draw at that position
// equals it, and plain decoding makes the same draws (same rows bit for bit, same random stream).
// So a probe need not verify: the engine drafts, decodes plainly, and compares the chain with the
// tokens the next plain steps emit; the first mismatch is the rejection a verify step would have
// seen, and the accepted count is the one it would have recorded. A probe then costs the drafter
// alone instead of the drafter plus a verify step's extra rows and the experts they route to (paid
// for the one token a plain step gives anyway), and it checks the drafter's whole chain rather
// than one width.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "engine/sampler.h"

namespace dsv41 {

struct VerifyOutcome {
  bool accepted = false;
  int32_t token = 0;  // the target's draw (the draft when accepted)
};

// The verifier's rule for one drafted token `draft` against the target's processed distribution
// `p` (Sampler::process): the target's own draw, accepted when it is the draft.
VerifyOutcome verify_draft(const ProcessedDistribution& p, int32_t draft, Sampler& sampler);

// Engine-wide cost of a step per sequence (exponential moving averages of seconds): plain decode
// steps, and drafting steps by their width k (drafts per sequence).
class SpecCosts {
 public:
  static constexpr int64_t kMaxWidth = 16;
  void observe_plain(double seconds_per_seq);
  void observe_spec(int64_t width, double seconds_per_seq);
  // Cost of a step verifying k drafts over a plain one: measured where both were, else linear
  // between the nearest measured widths (1 at width 0) or beyond the widest at the same cost per
  // draft, else the prior 1 + k / 4.
  double ratio(int64_t k) const;
  bool measured(int64_t k) const { return k >= 1 && k <= kMaxWidth && have_spec_[k]; }

 private:
  double plain_ = 0;
  bool have_plain_ = false;
  double spec_[kMaxWidth + 1] = {};
  bool have_spec_[kMaxWidth + 1] = {};
};

// The engine-wide acceptance seen so far (decayed counts over every request's verify steps), the
// prior a new request starts from: once the drafter is known to miss on this traffic, new
// requests do not pay for learning it again.
class SpecPrior {
 public:
  void observe(int64_t drafted, int64_t accepted);
  // (accepted, rejected) pseudo-counts of total weight 2: (1, 1) before anything was seen.
  std::pair<double, double> counts() const;

 private:
  double accepted_ = 0, rejected_ = 0;
};

class SpecTracker {
 public:
  // `fixed_width` > 0: always verify that many drafts (benchmarks); 0: the cost model decides.
  SpecTracker(int64_t block, std::pair<double, double> prior = {1, 1}, int64_t fixed_width = 0)
      : block_(std::min(block, SpecCosts::kMaxWidth)),
        prior_(prior),
        fixed_(std::min(fixed_width, block_)),
        probing_(prior.first >= prior.second) {}
  // Drafts to verify in this decode step (0: decode plainly this time).
  int64_t plan(const SpecCosts& costs);
  // After a verify step that checked `drafted` drafts and accepted `accepted` of them.
  void record(int64_t drafted, int64_t accepted);
  double acceptance() const;  // the per-draft acceptance probability estimate
  bool drafting() const { return wait_ == 0; }
  // Whether the width the last plan() returned is a probe (drafting does not pay at the estimate;
  // the step is for learning the acceptance). The engine may run such a probe as a shadow: draft,
  // decode plainly, and record() what the following tokens accept (the same count a verify
  // would have, at the drafter's cost alone).
  bool probe() const { return probe_; }

 private:
  int64_t block_;
  std::pair<double, double> prior_;
  int64_t fixed_;
  double accepted_ = 0, rejected_ = 0;  // decayed counts (first rejections)
  int64_t wait_ = 0;                    // plain steps left before the next probe
  int64_t interval_ = 16;               // the next wait once drafting does not pay
  bool probing_ = false;
  bool probe_ = false;  // the last plan() returned a probe
};

}  // namespace dsv41
