// The reference's attention/MoE/Engram mechanisms as standalone functions of plain vectors, so each
// can be checked against hand-computed values (spec §5.6, §5.7, §6.3). Templated on the scalar T;
// arithmetic order is the reference's.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "model/reference/ref_ops.h"

namespace dsv41::ref {

// Ratio-r compressor pooling: per channel c, softmax over the group's r gate values, then the
// weighted sum of the r projections (an independent r-way softmax for every channel).
template <typename T>
void compress_pool(const std::vector<std::vector<T>>& kv, const std::vector<std::vector<T>>& gate,
                   int64_t dim, T* out) {
  const std::size_t r = kv.size();
  for (int64_t c = 0; c < dim; ++c) {
    T mx = -std::numeric_limits<T>::infinity();
    for (std::size_t k = 0; k < r; ++k) mx = std::max(mx, gate[k][std::size_t(c)]);
    T den = 0, num = 0;
    for (std::size_t k = 0; k < r; ++k) {
      const T e = std::exp(gate[k][std::size_t(c)] - mx);
      den += e;
      num += e * kv[k][std::size_t(c)];
    }
    out[c] = num / den;
  }
}

// Candidate block pool (spec §5.6.3) over the first nvis scores: block score = max of its entries,
// the block holding the newest visible entry pinned to +inf, the top `blocks` blocks with a finite
// or pinned score kept. Returns the kept blocks (ascending) and fills mask[nvis].
template <typename T>
std::vector<int64_t> candidate_pool(const std::vector<T>& s, int64_t nvis, int64_t block_size,
                                    int64_t blocks, std::vector<char>* mask,
                                    std::vector<T>* block_scores = nullptr) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t nb = (nvis + block_size - 1) / block_size;
  std::vector<T> bscore(std::size_t(nb), ninf);
  for (int64_t j = 0; j < nvis; ++j)
    bscore[std::size_t(j / block_size)] =
        std::max(bscore[std::size_t(j / block_size)], s[std::size_t(j)]);
  bscore[std::size_t((nvis - 1) / block_size)] = std::numeric_limits<T>::infinity();
  mask->assign(std::size_t(nvis), 0);
  std::vector<int64_t> kept;
  for (int64_t b : topk_indices(bscore, blocks))
    if (bscore[std::size_t(b)] > ninf) {
      kept.push_back(b);
      for (int64_t j = b * block_size; j < std::min(nvis, (b + 1) * block_size); ++j)
        (*mask)[std::size_t(j)] = 1;
    }
  if (block_scores) *block_scores = std::move(bscore);
  return kept;
}

// Indexer selection: k = min(topk, max(n_total, nvis)) over s (entries >= nvis count as -inf), then
// picks a query cannot see yet (>= nvis) are dropped. Ascending entry order.
template <typename T>
std::vector<int64_t> indexer_select(std::vector<T> s, int64_t nvis, int64_t n_total, int64_t topk) {
  const int64_t n = std::max(n_total, nvis);
  s.resize(std::size_t(n), -std::numeric_limits<T>::infinity());
  for (int64_t j = nvis; j < n; ++j) s[std::size_t(j)] = -std::numeric_limits<T>::infinity();
  std::vector<int64_t> out;
  for (int64_t j : topk_indices(s, std::min(topk, n)))
    if (j < nvis) out.push_back(j);
  return out;
}

// One head of sparse attention over `rows` (K = V): softmax of q.row * scale with the sink in the
// denominator only (the maximum is over the rows); out = sum p_t row_t. No rows: out = 0.
template <typename T>
void sparse_attention_head(const T* q, const std::vector<const T*>& rows, int64_t dim, T scale,
                           T sink, T* out) {
  for (int64_t i = 0; i < dim; ++i) out[i] = 0;
  if (rows.empty()) return;
  std::vector<T> z(rows.size());
  T mx = -std::numeric_limits<T>::infinity();
  for (std::size_t k = 0; k < rows.size(); ++k)
    mx = std::max(mx, z[k] = dot(q, rows[k], dim) * scale);
  T den = std::exp(sink - mx);
  for (std::size_t k = 0; k < rows.size(); ++k) den += (z[k] = std::exp(z[k] - mx));
  for (std::size_t k = 0; k < rows.size(); ++k)
    for (int64_t i = 0; i < dim; ++i) out[i] += z[k] * rows[k][i];
  for (int64_t i = 0; i < dim; ++i) out[i] /= den;
}

// Router (spec §5.7): scores sqrt(softplus(logit / temp)); the k best of score + bias are chosen;
// their weights are the unbiased scores, renormalised (sum + 1e-20) when `renorm` and k > 1 (as
// DeepSeek's Gate: a single expert keeps its score), times `scale`. Backbone layers and DSpark
// stages both route here, each with its own k (num_experts_per_tok, dspark_num_experts_per_tok).
template <typename T>
struct Routing {
  std::vector<int64_t> experts;
  std::vector<T> weights;
  std::vector<T> biased;  // score + bias, what the selection ranked
};

template <typename T>
Routing<T> route(const std::vector<T>& logits, const std::vector<T>& bias, int64_t k, T temp,
                 bool renorm, T scale) {
  Routing<T> r;
  std::vector<T> score(logits.size());
  r.biased.resize(logits.size());
  for (std::size_t e = 0; e < logits.size(); ++e) {
    score[e] = std::sqrt(softplus(logits[e] / temp));
    r.biased[e] = score[e] + bias[e];
  }
  r.experts = topk_indices(r.biased, k);
  T sum = 0;
  for (int64_t e : r.experts) sum += score[std::size_t(e)];
  for (int64_t e : r.experts) {
    T w = score[std::size_t(e)];
    if (renorm && k > 1) w = w / (sum + T(1e-20));
    r.weights.push_back(w * scale);
  }
  return r;
}

// Clamped SwiGLU with the routing weight applied before the down projection:
// silu(min(g, limit)) * clamp(u, -limit, limit) * weight.
template <typename T>
T swiglu_clamped(T g, T u, T limit, T weight) {
  return silu(std::min(g, limit)) * clamp(u, -limit, limit) * weight;
}

// Engram gate of one residual copy (spec §6.3): d = <h, w * key> / rms(h) / rms(key) / sqrt(dim),
// gate = sigmoid(sign(d) * sqrt(max(|d|, 1e-6))).
template <typename T>
T engram_gate(const T* h, const T* w, const T* key, int64_t dim, T eps) {
  T s = 0;
  for (int64_t c = 0; c < dim; ++c) s += h[c] * w[c] * key[c];
  const T d = s * rms_inv(h, dim, eps) * rms_inv(key, dim, eps) / std::sqrt(T(dim));
  const T sgn = d > 0 ? T(1) : d < 0 ? T(-1) : T(0);
  return sigmoid(sgn * std::sqrt(std::max(std::fabs(d), T(1e-6))));
}

}  // namespace dsv41::ref
