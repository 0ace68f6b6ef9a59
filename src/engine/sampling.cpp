// Sampling with grammar masks, and publishing each sampled token (Engine::advance, Engine::emit):
// a constrained sequence's mask (constraint.h) turns the logits it disallows to -inf before the
// sampler sees them, every sequence of the batch from its own row and its own state, so a request
// gives the same tokens alone or among others; the sampled token is accepted into the grammar,
// published (logprobs, text, stop strings), and ends the request on a stop token, a stop string,
// a complete constrained document, max_tokens or the context. A constrained state that allows no
// token ends the request at once (stop when the document is complete, else an error): never a
// draw outside the mask, never a hang.
#include <algorithm>
#include <chrono>

#include "engine/active.h"
#include "engine/engine.h"

namespace dsv41 {

bool Engine::constrain(Active& a, std::vector<float>& logits) {
  return !a.constraint || a.constraint->apply(logits);
}

bool Engine::end_unsatisfiable(Active& a) {
  StreamDecoder::Step tail = a.decoder->finish();
  a.ch->publish(nullptr, tail.text);
  if (a.constraint->complete())
    a.ch->finish(FinishReason::kStop, a.prompt_len, a.generated);
  else
    a.ch->finish(FinishReason::kError, a.prompt_len, a.generated, {},
                 "structured output: no token the model may sample continues the constrained "
                 "output here (the grammar allows none of them)");
  return true;
}

bool Engine::advance(Active& a, const std::vector<float>& logits) {
  std::vector<float> scratch = logits;
  if (!constrain(a, scratch)) return end_unsatisfiable(a);
  const int32_t tok = a.sampler->sample(scratch);
  // The sampler's own masks (min_tokens, bad_words) may have removed the last allowed token: its
  // fallback draw is then outside the grammar.
  if (a.constraint && !a.constraint->allows(tok)) return end_unsatisfiable(a);
  return emit(a, tok, logits);
}

bool Engine::emit(Active& a, int32_t tok, const std::vector<float>& logits) {
  if (!a.shadow.empty()) resolve_shadow(a, tok);
  if (a.constraint) a.constraint->accept(tok);  // allowed by the mask the draw was taken under
  RequestChannel& ch = *a.ch;
  const SamplingParams& sp = ch.request().sampling;
  OutputToken out;
  out.token = tok;
  out.emitted = std::chrono::steady_clock::now();
  if (sp.logprobs >= 0) {
    out.logprob = token_logprob(logits, tok);
    out.top = top_logprobs(logits, sp.logprobs);
  }
  ++a.generated;
  generated_tokens_total_.fetch_add(1);
  const bool is_stop_token =
      (!sp.ignore_eos && tok == eos_id_) ||
      std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) != sp.stop_token_ids.end();
  if (is_stop_token) {
    // The stop token itself is not part of the text (its logprob is still reported).
    StreamDecoder::Step tail = a.decoder->finish();
    ch.publish(&out, tail.text);
    ch.finish(FinishReason::kStop, a.prompt_len, a.generated, tokenizer_->token_bytes(tok));
    return true;
  }
  a.sampler->accept(tok);
  StreamDecoder::Step s = a.decoder->push(tok);
  if (s.stopped) {
    ch.publish(&out, s.text);
    ch.finish(FinishReason::kStop, a.prompt_len, a.generated, s.stop);
    return true;
  }
  // A constrained document that is over (an end id accepted under ignore_eos), or complete with
  // nothing but an end id allowed next: it ends here, without a step to sample the end id.
  if (a.constraint && (a.constraint->terminated() || a.constraint->must_end())) {
    StreamDecoder::Step tail = a.decoder->finish();
    ch.publish(&out, s.text + tail.text);
    ch.finish(FinishReason::kStop, a.prompt_len, a.generated,
              a.constraint->terminated() ? tokenizer_->token_bytes(tok) : std::string());
    return true;
  }
  if (a.generated >= sp.max_tokens || a.prompt_len + a.generated >= max_context_) {
    StreamDecoder::Step tail = a.decoder->finish();
    ch.publish(&out, s.text + tail.text);
    ch.finish(FinishReason::kLength, a.prompt_len, a.generated);
    return true;
  }
  ch.publish(&out, s.text);
  a.tokens.push_back(tok);  // fed by the next step
  ++a.sched.known;
  return false;
}

}  // namespace dsv41
