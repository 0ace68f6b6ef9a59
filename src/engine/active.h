// Engine-internal: the engine thread's record of one request (Engine::Active), shared by the files
// the engine is split into (engine.cpp: the thread, submissions and the queue; step.cpp: step
// assembly; sampling.cpp: sampling with grammar masks and output; speculation.cpp: drafting and
// verification).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/constraint.h"
#include "engine/engine.h"
#include "engine/request_channel.h"
#include "text/stream_decoder.h"

namespace dsv41 {

// A request from submission to its last output. The scheduler sees `sched`; `tokens` holds the
// prompt then every generated token (the last one is fed by the next step).
struct Engine::Active {
  std::shared_ptr<RequestChannel> ch;
  SchedSeq sched;
  std::vector<int32_t> tokens;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  std::unique_ptr<SpecTracker> spec;               // speculative decoding on
  std::unique_ptr<SequenceConstraint> constraint;  // structured output (request.constraint)
  int prior_slot = 0;                              // the SpecPrior it started from and teaches
  // A shadow probe's chain (drafted after the token at position p: shadow[j] predicts p + 1 + j)
  // while the plain steps' tokens are compared with it; shadow_next of them matched so far.
  std::vector<int32_t> shadow;
  std::size_t shadow_next = 0;
  int64_t prompt_len = 0, generated = 0;
  int64_t prompt_lp_next = 1;  // prompt_logprobs: the next prompt position to publish
  bool prompt_counted = false;
  bool failed = false;  // finished with an error; dropped at the next sweep
};

}  // namespace dsv41
