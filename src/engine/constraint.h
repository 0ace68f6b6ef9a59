// One sequence's structured-output state (issue 32; docs/structured-outputs.md): the grammar
// Matcher of a constrained request, the mask of the tokens it allows next (kept current after
// every accepted token, so a step reads it without recomputing), and the rules the engine applies
// with it: disallowed logits become -inf before sampling, a draft the grammar refuses is cut before
// verification, the output ends when the grammar is complete and allows nothing but an end id.
// In thinking mode the constraint waits for the reasoning's end token, then starts; meanwhile only
// the end ids are refused (the output may not end inside the reasoning). With a trigger token
// (strict tools under tool_choice auto) it waits, unmasked, for the model to sample that token
// itself (armed only after the reasoning closed, and only right after text ending in the
// trigger's required bytes), then the rest of the output must match the grammar; the output may
// also end without it. Owned by the engine thread (Engine::Active); the Grammar itself is shared
// and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace dsv41 {

class SequenceConstraint {
 public:
  // When the grammar starts (GenerationRequest's constraint fields).
  struct Start {
    // >= 0: not before that token was generated (thinking mode: </think>); -1: from the start.
    int32_t reasoning_end = -1;
    // >= 0: right after the model generated this token (once the reasoning closed), the text
    // generated before it ending with `trigger_after` (the bytes of the last token before it);
    // until then nothing is masked. -1: no trigger, the grammar is the whole answer.
    int32_t trigger = -1;
    std::string trigger_after;
  };
  // `vocab_size`: the model's logits row width.
  SequenceConstraint(std::shared_ptr<const Grammar> grammar, Start start, int32_t vocab_size);
  SequenceConstraint(std::shared_ptr<const Grammar> grammar, int32_t reasoning_end,
                     int32_t vocab_size)
      : SequenceConstraint(std::move(grammar), Start{reasoning_end, -1, {}}, vocab_size) {}

  // Whether the mask applies to the next token (false while the reasoning runs or the trigger
  // has not come).
  bool active() const { return phase_ == Phase::kActive; }
  // Sets every logit the grammar disallows to -inf; while the reasoning runs without a trigger,
  // the end ids' (the output may not end before its constrained answer); with a trigger, nothing
  // before it. False when the grammar allows none of the model's tokens: a dead state the engine
  // ends cleanly.
  bool apply(std::vector<float>& logits) const;
  // Whether `token` may come next (while inactive: anything but an end id; anything at all
  // before a trigger).
  bool allows(int32_t token) const;
  // A generated token: advances the matcher (active), or moves towards the start (the reasoning's
  // end, the trigger). Tokens come from masked draws, so the grammar never refuses one; if it
  // does (a caller's bug), the state is left as it was and false is returned.
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
  enum class Phase { kReasoning, kArmed, kActive };
  // What a token does before the grammar runs: `phase` and `after_ok` (the text so far ends with
  // the trigger's required bytes) advance; true when the grammar starts after it.
  bool wait_step(Phase& phase, bool& after_ok, int32_t token) const;
  void refresh();  // the mask of the current state

  Matcher matcher_;
  std::shared_ptr<const Grammar> grammar_;
  Start start_;
  Phase phase_;
  bool after_ok_ = false;  // kArmed: the generated text ends with start_.trigger_after
  int32_t vocab_size_;
  std::vector<uint64_t> mask_;  // the grammar vocabulary's words (at least the model's)
  bool any_allowed_ = false;    // some id < vocab_size_ is allowed
  bool ends_only_ = false;      // complete, and only end ids are allowed
};

}  // namespace dsv41
