// DSpark speculative decoding in the engine (spec §8; issue: lossless verification and an
// acceptance tracker). The drafter proposes a greedy chain d1..dk after the token t a sequence is
// about to feed; one step feeds [t, d1..dk] and returns the target's logits after each; the
// verifier walks them in order:
//   - the drafter's proposal is a point mass on d (its chain is argmax, design.md §9), so the
//     standard accept/resample rule becomes: accept d with probability p(d) under the target's
//     processed distribution p (greedy: iff d is p's argmax); on rejection draw from p without d,
//     renormalised. Each emitted token is then distributed exactly as p (P(d) = p(d); P(x != d) =
//     (1 - p(d)) p(x) / (1 - p(d))), so the output distribution is the target's;
//   - after k accepted drafts the last row gives one more token as a plain decode would.
// Rejected rows are rolled back with ModelRunner::truncate.
//
// Whether drafting pays is decided per request (SpecTracker) from its measured acceptance and the
// engine's measured cost of a drafting step against a plain decode step (SpecCosts), both
// per sequence: a request drafts while (1 + expected accepted drafts) exceeds that cost ratio,
// otherwise it decodes plainly and probes again after an interval that doubles with every probe
// that did not pay.
#pragma once

#include <cstdint>

#include "engine/sampler.h"

namespace dsv41 {

struct VerifyOutcome {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the token drawn from the residual
};

// The verifier's rule for one drafted token `draft` against the target's processed distribution
// `p` (Sampler::process), with the request's random stream.
VerifyOutcome verify_draft(const ProcessedDistribution& p, int32_t draft, Sampler& sampler,
                           ProcessedDistribution* scratch);

// Engine-wide cost of a step per sequence, in seconds (exponential moving averages): plain decode
// steps, and drafting steps (the draft call plus the verify step).
class SpecCosts {
 public:
  void observe_plain(double seconds_per_seq);
  void observe_spec(double seconds_per_seq);
  // Cost of a drafting step over a plain one; 1 until both have been measured.
  double ratio() const;

 private:
  double plain_ = 0, spec_ = 0;
  bool have_plain_ = false, have_spec_ = false;
};

class SpecTracker {
 public:
  explicit SpecTracker(int64_t block) : block_(block) {}
  // Drafts to verify in this decode step (0: decode plainly this time).
  int64_t plan(const SpecCosts& costs);
  // After a verify step that checked `drafted` drafts and accepted `accepted` of them.
  void record(int64_t drafted, int64_t accepted, const SpecCosts& costs);
  double expected_accepted() const { return accept_; }
  bool drafting() const { return wait_ == 0; }

 private:
  int64_t block_;
  double accept_ = -1;    // EWMA of accepted drafts per drafting step (-1: none yet)
  int64_t wait_ = 0;      // plain steps left before the next probe
  int64_t interval_ = 4;  // the next wait after a probe that did not pay
};

}  // namespace dsv41
