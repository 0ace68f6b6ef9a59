// Sampler implementation. All arithmetic that decides a token is done in double, in a fixed order
// (id order, or (logit desc, id asc) where a cut needs the most likely tokens first), so ties and
// rounding are resolved the same way every time. No path sorts the whole vocabulary.
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
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxTopLogprobs)
    return Status::error(
        fmt::format("prompt_logprobs: {} is outside [0, {}]", p.prompt_logprobs, kMaxTopLogprobs));
  if (p.max_tokens < 1)
    return Status::error(fmt::format("max_tokens: {} must be at least 1", p.max_tokens));
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    return Status::error(
        fmt::format("repetition_penalty: {} must be a positive number", p.repetition_penalty));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return Status::error(
        fmt::format("min_tokens: {} is outside [0, max_tokens = {}]", p.min_tokens, p.max_tokens));
  if (p.thinking_token_budget < -1)
    return Status::error(
        fmt::format("thinking_token_budget: {} must be at least 0", p.thinking_token_budget));
  for (const auto& w : p.bad_words_ids) {
    if (w.empty()) return Status::error("bad_words: a bad word must not be empty");
    for (int32_t id : w)
      if (id < 0 || id >= vocab_size)
        return Status::error(fmt::format("bad_words: token id {} is outside the vocabulary [0, {})",
                                         id, vocab_size));
  }
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
  if (token == reasoning_end_ && reasoning_end_at_ < 0 && p_.thinking_token_budget >= 0)
    reasoning_end_at_ = int64_t(generated_.size());
  generated_.push_back(token);
}

void Sampler::unaccept(int32_t token) {
  auto it = counts_.find(token);
  if (it != counts_.end() && --it->second == 0) counts_.erase(it);
  if (!generated_.empty() && generated_.back() == token) generated_.pop_back();
  if (reasoning_end_at_ >= int64_t(generated_.size())) reasoning_end_at_ = -1;
}

void Sampler::set_context(const std::vector<int32_t>& prompt, int32_t eos, int32_t reasoning_end) {
  eos_ = eos;
  reasoning_end_ = reasoning_end;
  prompt_ids_.clear();
  if (p_.repetition_penalty != 1.0) {
    prompt_ids_ = prompt;
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
  }
}

int64_t Sampler::reasoning_tokens() const {
  if (p_.thinking_token_budget < 0) return 0;
  return reasoning_end_at_ >= 0 ? reasoning_end_at_ + 1 : int64_t(generated_.size());
}

bool Sampler::process_extras(std::vector<float>& logits, ProcessedDistribution* d) {
  // The reasoning cap first: when it is reached nothing else can be drawn.
  if (p_.thinking_token_budget >= 0 && reasoning_end_ >= 0 && reasoning_end_at_ < 0 &&
      int64_t(generated_.size()) + 1 >= std::max(1, p_.thinking_token_budget)) {
    d->ids.assign(1, reasoning_end_);
    d->probs.assign(1, 1.0);
    d->greedy = true;
    return true;
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  if (int64_t(generated_.size()) < p_.min_tokens) {
    if (eos_ >= 0) logits[static_cast<std::size_t>(eos_)] = ninf;
    for (int32_t id : p_.stop_token_ids) logits[static_cast<std::size_t>(id)] = ninf;
  }
  for (const auto& w : p_.bad_words_ids) {
    const std::size_t head = w.size() - 1;  // tokens that must end the output already
    if (head > generated_.size()) continue;
    if (std::equal(w.begin(), w.begin() + std::ptrdiff_t(head),
                   generated_.end() - std::ptrdiff_t(head)))
      logits[static_cast<std::size_t>(w.back())] = ninf;
  }
  return false;
}

double ProcessedDistribution::probability(int32_t token) const {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == token) return probs[i];
  return 0.0;
}

int32_t Sampler::sample(std::vector<float>& logits) {
  process(logits, &dist_);
  return draw(dist_);
}

void Sampler::process(std::vector<float>& logits, ProcessedDistribution* d) {
  d->ids.clear();
  d->probs.clear();
  // Temperatures below vLLM's sampling epsilon are greedy (1 / T would overflow the float scale).
  d->greedy = p_.temperature < kGreedyBelowTemperature;
  for (const auto& [id, bias] : p_.logit_bias) logits[static_cast<std::size_t>(id)] += bias;
  // vLLM's order: the repetition penalty, then presence and frequency.
  if (p_.repetition_penalty != 1.0) {
    const auto rp = static_cast<float>(p_.repetition_penalty);
    auto penalise = [&](int32_t id) {
      float& l = logits[static_cast<std::size_t>(id)];
      l = l > 0 ? l / rp : l * rp;
    };
    for (int32_t id : prompt_ids_) penalise(id);
    for (const auto& [id, n] : counts_)
      if (!std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) penalise(id);
  }
  for (const auto& [id, n] : counts_) {
    float& l = logits[static_cast<std::size_t>(id)];
    l -= static_cast<float>(p_.presence_penalty + p_.frequency_penalty * n);
  }
  if (process_extras(logits, d)) return;
  if (d->greedy) {  // the first maximum
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    d->ids.push_back(static_cast<int32_t>(best));
    d->probs.push_back(1.0);
    return;
  }
  if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < logits.size()) {
    process_top_k(logits, static_cast<std::size_t>(p_.top_k), d);
  } else {
    // No sort of the vocabulary: the softmax over every finite logit in id order (exp in float,
    // the scale in float, deterministic; sums in double),
    // min-p as a threshold, top-p from the smallest set of most likely tokens found by selection.
    const double inv_t = 1.0 / p_.temperature;
    double max_l = -std::numeric_limits<double>::infinity();
    for (float l : logits)
      if (std::isfinite(l)) max_l = std::max(max_l, static_cast<double>(l));
    if (!std::isfinite(max_l)) {
      d->ids.push_back(0);
      d->probs.push_back(1.0);
      return;
    }
    std::vector<double>& prob = prob_;
    prob.resize(logits.size());
    double z = 0;
    const float fmax = static_cast<float>(max_l), finv_t = static_cast<float>(inv_t);
    for (std::size_t i = 0; i < logits.size(); ++i)
      z += prob[i] = std::isfinite(logits[i]) ? std::exp((logits[i] - fmax) * finv_t) : 0.0f;
    const double floor = p_.min_p > 0 ? p_.min_p / z : 0.0;  // p_max = 1 / z (the max's exp is 1)
    for (double& q : prob) q = q / z >= floor ? q / z : 0.0;
    if (p_.top_p < 1) {
      nucleus(prob, d);
    } else {
      for (std::size_t i = 0; i < prob.size(); ++i)
        if (prob[i] > 0) d->ids.push_back(static_cast<int32_t>(i)), d->probs.push_back(prob[i]);
    }
  }
  double mass = 0;
  for (double q : d->probs) mass += q;
  if (d->ids.empty() || !(mass > 0) || !std::isfinite(mass)) {  // never: a guard, not a path
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    d->ids.assign(1, static_cast<int32_t>(best));
    d->probs.assign(1, 1.0);
    d->greedy = true;
    return;
  }
  for (double& q : d->probs) q /= mass;
}

double Sampler::uniform() {
  return rng_.uniform();
}

int32_t Sampler::draw(const ProcessedDistribution& d) {
  if (d.greedy) return d.ids[0];
  const double u = rng_.uniform();
  double cum = 0;
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.probs[i];
    if (u < cum) return d.ids[i];
  }
  return d.ids.back();
}

// The k best by (logit desc, id asc), their softmax at the temperature, then min-p and top-p over
// that sorted list (unnormalised probabilities; the caller normalises).
void Sampler::process_top_k(const std::vector<float>& logits, std::size_t k,
                            ProcessedDistribution* d) {
  cand_.clear();
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  if (cand_.empty()) {
    d->ids.push_back(0);
    d->probs.push_back(1.0);
    return;
  }
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  k = std::min(k, cand_.size());
  std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(),
                    order);
  const double inv_t = 1.0 / p_.temperature;
  const double max_l = cand_[0].first;
  std::vector<double>& prob = prob_;
  prob.resize(k);
  double z = 0;
  for (std::size_t i = 0; i < k; ++i) z += prob[i] = std::exp((cand_[i].first - max_l) * inv_t);
  for (double& q : prob) q /= z;
  std::size_t keep = k;
  if (p_.min_p > 0) {  // keep tokens with p >= min_p * p_max
    const double floor = p_.min_p * prob[0];
    keep = 1;
    while (keep < k && prob[keep] >= floor) ++keep;
  }
  if (p_.top_p < 1) {  // the smallest prefix reaching top_p
    double cum = 0;
    std::size_t n = 0;
    while (n < keep) {
      cum += prob[n++];
      if (cum >= p_.top_p) break;
    }
    keep = n;
  }
  for (std::size_t i = 0; i < keep; ++i) {
    d->ids.push_back(cand_[i].second);
    d->probs.push_back(prob[i]);
  }
}

// top-p over probabilities in id order (0 = cut by min-p): the most likely tokens are selected in
// growing batches (nth_element, O(V) each) until they reach top_p, then sorted by (p desc, id asc)
// and cut at the smallest prefix reaching it.
void Sampler::nucleus(const std::vector<double>& prob, ProcessedDistribution* d) {
  ids_.clear();
  for (std::size_t i = 0; i < prob.size(); ++i)
    if (prob[i] > 0) ids_.push_back(static_cast<int32_t>(i));
  auto order = [&](int32_t a, int32_t b) {
    const double pa = prob[static_cast<std::size_t>(a)], pb = prob[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  };
  std::size_t m = std::min<std::size_t>(64, ids_.size());
  for (;;) {
    std::nth_element(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(m - 1), ids_.end(),
                     order);
    double top = 0;
    for (std::size_t i = 0; i < m; ++i) top += prob[static_cast<std::size_t>(ids_[i])];
    if (top >= p_.top_p || m == ids_.size()) break;
    m = std::min(ids_.size(), m * 4);
  }
  std::sort(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(m), order);
  double cum = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const double q = prob[static_cast<std::size_t>(ids_[i])];
    d->ids.push_back(ids_[i]);
    d->probs.push_back(q);
    cum += q;
    if (cum >= p_.top_p) break;
  }
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
