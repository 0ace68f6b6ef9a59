// Token sampling for one request: logit_bias, presence/frequency penalties over the generated
// tokens, then greedy (temperature 0) or temperature + top-k + top-p + min-p filtering (the
// processed distribution, available on its own for a verifier) and an inverse-CDF draw from the
// request's own seeded stream, so a seeded request reproduces exactly whatever else the engine
// runs. Penalty counts live with the request and can be taken back (rejected drafts). Logprobs are
// the model's raw distribution (log-softmax of the logits before any processing), as vLLM reports
// them by default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/status.h"

namespace dsv41 {

inline constexpr int kMaxTopLogprobs = 20;
inline constexpr double kGreedyBelowTemperature = 1e-5;  // vLLM's _SAMPLING_EPS

struct SamplingParams {
  double temperature = 1.0;  // below kGreedyBelowTemperature (0 included): greedy
  double top_p = 1.0;        // (0, 1]
  int top_k = 0;             // 0 or -1: off
  double min_p = 0.0;        // [0, 1]
  std::optional<uint64_t> seed;
  double presence_penalty = 0.0;                      // [-2, 2]
  double frequency_penalty = 0.0;                     // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // [-100, 100] each
  int logprobs = -1;  // -1: none; 0..kMaxTopLogprobs: the chosen token's logprob + that many top
  // vLLM's prompt_logprobs: -1 none; 0..kMaxTopLogprobs: each prompt token's logprob (from the
  // row before it) + that many top. Such a request runs the full stack and takes no cached prefix.
  int prompt_logprobs = -1;
  int max_tokens = 16;
  std::vector<std::string> stop;        // stop strings (matched on decoded text)
  std::vector<int32_t> stop_token_ids;  // in addition to EOS
  bool ignore_eos = false;
  // vLLM's repetition_penalty (> 0; 1: off): the logit of every token seen in the prompt or the
  // output is divided by it when positive, multiplied by it otherwise.
  double repetition_penalty = 1.0;
  // EOS and stop_token_ids cannot be drawn before this many tokens were generated (vLLM's).
  int min_tokens = 0;
  // vLLM's bad_words, tokenized: a sequence's last token cannot be drawn when the output ends with
  // the rest of it (a one-token sequence: never).
  std::vector<std::vector<int32_t>> bad_words_ids;
  // A cap on the reasoning (-1: none). With a value >= 0 the generation starts inside the
  // reasoning (the prompt opened it) and, once budget - 1 tokens of it were generated, the
  // reasoning's end token (Sampler::set_context) is the only one that can be drawn: the reasoning,
  // its end token included, holds at most max(budget, 1) tokens.
  int thinking_token_budget = -1;
  bool skip_special_tokens = true;          // special tokens are left out of the text
  bool include_stop_str_in_output = false;  // a matched stop string ends the text (not cut)
};

// Checks ranges against the vocabulary; the message names the parameter.
Status validate_sampling(const SamplingParams& p, int32_t vocab_size);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// The distribution a draw is taken from after every processing step (logit_bias, penalties,
// temperature, top-k, min-p, top-p): the tokens that can be drawn, in the order a draw walks them,
// with their probabilities (summing to 1). A speculative verifier compares a draft's and the
// target's; greedy is the first maximum with probability 1.
struct ProcessedDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  bool greedy = false;
  double probability(int32_t token) const;  // 0 outside the support
};

class Sampler {
 public:
  // `fallback_seed` seeds requests without their own seed.
  Sampler(const SamplingParams& params, uint64_t fallback_seed);

  // Picks the next token from `logits` (vocab_size values; modified in place as scratch):
  // process() then draw().
  int32_t sample(std::vector<float>& logits);
  // The processed distribution of `logits` under the accepted tokens' penalties (no randomness).
  void process(std::vector<float>& logits, ProcessedDistribution* out);
  // One draw from `d` with the request's stream (one uniform; greedy takes none).
  int32_t draw(const ProcessedDistribution& d);
  // One uniform in [0, 1) from the request's stream (a speculative verifier's accept test).
  double uniform();
  // Records a generated token (for the penalties), or takes one back (a rejected draft).
  void accept(int32_t token);
  void unaccept(int32_t token);
  // What the request's prompt-dependent processing needs: the prompt (repetition_penalty), the
  // end-of-sequence token (min_tokens; -1: none) and the reasoning's end token
  // (thinking_token_budget; -1: none).
  void set_context(const std::vector<int32_t>& prompt, int32_t eos, int32_t reasoning_end);
  // Tokens generated so far inside the reasoning, its end token included (thinking_token_budget).
  int64_t reasoning_tokens() const;

 private:
  void process_top_k(const std::vector<float>& logits, std::size_t k, ProcessedDistribution* d);
  void nucleus(const std::vector<double>& prob, ProcessedDistribution* d);

  // The masks of vLLM's min_tokens and bad_words, and the reasoning cap; true when the cap decided
  // the token (`d` holds it).
  bool process_extras(std::vector<float>& logits, ProcessedDistribution* d);

  const SamplingParams& p_;
  Rng rng_;
  std::unordered_map<int32_t, int32_t> counts_;
  std::vector<int32_t> generated_;   // accepted tokens in order (bad_words, the reasoning cap)
  std::vector<int32_t> prompt_ids_;  // distinct prompt tokens (repetition_penalty)
  int32_t eos_ = -1, reasoning_end_ = -1;
  int64_t reasoning_end_at_ = -1;  // index in generated_ of the accepted end token (-1: none yet)
  std::vector<std::pair<float, int32_t>> cand_;  // scratch (sorted candidates)
  std::vector<double> prob_;                     // scratch (their probabilities)
  std::vector<int32_t> ids_;                     // scratch (top-p selection)
  ProcessedDistribution dist_;                   // scratch of sample()
};

// log-softmax of `logits` evaluated for `token`, and the `k` most likely tokens (ties: lower id).
float token_logprob(const std::vector<float>& logits, int32_t token, double* log_z_cache = nullptr);
std::vector<TokenLogprob> top_logprobs(const std::vector<float>& logits, int k);

}  // namespace dsv41
