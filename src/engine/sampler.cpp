// Sampler implementation. All arithmetic that decides a token is done in double over a candidate
// list sorted by (logit desc, id asc), so ties and rounding are resolved the same way every time.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace dsv41 {

Status validate_sampling(const SamplingParams& p, int32_t vocab_size) {
  if (!(p.temperature >= 0 && p.temperature <= 100))
    return Status::error(fmt::format("temperature: {} is outside [0, 100]", p.temperature));
  if (!(p.top_p > 0 && p.top_p <= 1))
    return Status::error(fmt::format("top_p: {} is outside (0, 1]", p.top_p));
  if (p.top_k < -1)
    return Status::error(fmt::format("top_k: {} must be -1, 0 (off) or positive", p.top_k));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    return Status::error(fmt::format("min_p: {} is outside [0, 1]", p.min_p));
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    return Status::error(
        fmt::format("presence_penalty: {} is outside [-2, 2]", p.presence_penalty));
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    return Status::error(
        fmt::format("frequency_penalty: {} is outside [-2, 2]", p.frequency_penalty));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size)
      return Status::error(
          fmt::format("logit_bias: token id {} is outside the vocabulary [0, {})", id, vocab_size));
    if (!(bias >= -100 && bias <= 100))
      return Status::error(
          fmt::format("logit_bias: bias {} for token {} is outside [-100, 100]", bias, id));
  }
  if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs)
    return Status::error(
        fmt::format("logprobs: {} is outside [0, {}]", p.logprobs, kMaxTopLogprobs));
  if (p.max_tokens < 1)
    return Status::error(fmt::format("max_tokens: {} must be at least 1", p.max_tokens));
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab_size)
      return Status::error(
          fmt::format("stop_token_ids: {} is outside the vocabulary [0, {})", id, vocab_size));
  for (const auto& s : p.stop)
    if (s.empty()) return Status::error("stop: stop strings must not be empty");
  return Status::ok();
}

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : p_(params), rng_(params.seed.value_or(fallback_seed)) {}

void Sampler::accept(int32_t token) {
  ++counts_[token];
}

int32_t Sampler::sample(std::vector<float>& logits) {
  for (const auto& [id, bias] : p_.logit_bias) logits[static_cast<std::size_t>(id)] += bias;
  for (const auto& [id, n] : counts_) {
    float& l = logits[static_cast<std::size_t>(id)];
    l -= static_cast<float>(p_.presence_penalty + p_.frequency_penalty * n);
  }
  if (p_.temperature == 0) {  // greedy: the first maximum
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  // Candidates sorted by logit (desc), id (asc); top-k cuts before the softmax.
  cand_.clear();
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  if (cand_.empty()) return 0;
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::size_t k = cand_.size();
  if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < k) {
    k = static_cast<std::size_t>(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(),
                      order);
    cand_.resize(k);
  } else {
    std::sort(cand_.begin(), cand_.end(), order);
  }
  // Softmax at temperature over the kept candidates (probabilities in double).
  const double inv_t = 1.0 / p_.temperature;
  const double max_l = cand_[0].first;
  std::vector<double>& prob = prob_;
  prob.resize(k);
  double z = 0;
  for (std::size_t i = 0; i < k; ++i) z += prob[i] = std::exp((cand_[i].first - max_l) * inv_t);
  for (double& q : prob) q /= z;
  // min-p: keep tokens with p >= min_p * p_max; top-p: the smallest prefix reaching top_p.
  std::size_t keep = k;
  if (p_.min_p > 0) {
    const double floor = p_.min_p * prob[0];
    keep = 1;
    while (keep < k && prob[keep] >= floor) ++keep;
  }
  if (p_.top_p < 1) {
    double cum = 0;
    std::size_t n = 0;
    while (n < keep) {
      cum += prob[n++];
      if (cum >= p_.top_p) break;
    }
    keep = n;
  }
  double mass = 0;
  for (std::size_t i = 0; i < keep; ++i) mass += prob[i];
  const double u = rng_.uniform() * mass;
  double cum = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

namespace {
double log_partition(const std::vector<float>& logits) {
  double m = -std::numeric_limits<double>::infinity();
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - m);
  return m + std::log(z);
}
}  // namespace

float token_logprob(const std::vector<float>& logits, int32_t token, double* log_z_cache) {
  double lz = log_z_cache && !std::isnan(*log_z_cache) ? *log_z_cache : log_partition(logits);
  if (log_z_cache) *log_z_cache = lz;
  return static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(token)]) - lz);
}

std::vector<TokenLogprob> top_logprobs(const std::vector<float>& logits, int k) {
  std::vector<TokenLogprob> out;
  if (k <= 0) return out;
  const double lz = log_partition(logits);
  std::vector<int32_t> ids(logits.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](int32_t a, int32_t b) {
                      float la = logits[static_cast<std::size_t>(a)],
                            lb = logits[static_cast<std::size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(
        {ids[i],
         static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(ids[i])]) - lz)});
  return out;
}

}  // namespace dsv41
