// One sequence's structured-output state (issue 32; docs/structured-outputs.md): the grammar
// Matcher of a constrained request, the mask of the tokens it allows next (kept current after
// every accepted token, so a step reads it without recomputing), and the rules the engine applies
// with it: disallowed logits become -inf before sampling, a draft the grammar refuses is cut before
// verification, the output ends when the grammar is complete and allows nothing but an end id.
// In thinking mode the constraint waits for the reasoning's end token, then starts; meanwhile only
// the end ids are refused (the output may not end inside the reasoning). Owned by the
// engine thread (Engine::Active); the Grammar itself is shared and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/grammar.h"

namespace dsv41 {

class SequenceConstraint {
 public:
  // `reasoning_end` >= 0: the constraint starts after that token was generated (thinking mode);
  // -1: from the first generated token. `vocab_size`: the model's logits row width.
  SequenceConstraint(std::shared_ptr<const Grammar> grammar, int32_t reasoning_end,
                     int32_t vocab_size);

  // Whether the mask applies to the next token (false while the reasoning runs).
  bool active() const { return reasoning_end_ < 0; }
  // Sets every logit the grammar disallows to -inf; while the reasoning runs, the end ids' (the
  // output may not end before its constrained answer). False when the grammar allows none of the
  // model's tokens: a dead state the engine ends cleanly.
  bool apply(std::vector<float>& logits) const;
  // Whether `token` may come next (while inactive: anything but an end id).
  bool allows(int32_t token) const;
  // A generated token: advances the matcher (active), or starts the constraint when it is the
  // reasoning's end. Tokens come from masked draws, so the grammar never refuses one; if it does
  // (a caller's bug), the state is left as it was and false is returned.
  bool accept(int32_t token);
  // The grammar accepted an end id (the output is over).
  bool terminated() const { return active() && matcher_.is_terminated(); }
  // The document is complete and nothing but an end id may follow: the output can end now
  // without a step to sample the end token.
  bool must_end() const { return active() && ends_only_; }
  bool complete() const { return active() && matcher_.is_complete(); }
  // The longest prefix of `drafts` (tokens proposed after the last accepted one) the grammar
  // accepts, the state left unchanged (accept_token then rollback). While inactive: all of it up
  // to the reasoning's end, then checked from there.
  std::size_t admissible_prefix(const std::vector<int32_t>& drafts);

 private:
  void refresh();  // the mask of the current state

  Matcher matcher_;
  std::shared_ptr<const Grammar> grammar_;
  int32_t reasoning_end_;
  int32_t vocab_size_;
  std::vector<uint64_t> mask_;  // the grammar vocabulary's words (at least the model's)
  bool any_allowed_ = false;    // some id < vocab_size_ is allowed
  bool ends_only_ = false;      // complete, and only end ids are allowed
};

}  // namespace dsv41
