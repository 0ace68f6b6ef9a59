// The fast forward's MoE (spec §5.7) and Engram (spec §6.3). MoE: the router per token, then the
// step's tokens grouped by expert (ascending), so each routed expert's weights are read while hot
// for all its tokens; each (token, slot) result lands in its own buffer and a token sums its slots
// in its own selection order, then the shared expert: the order of every sum is the token's, never
// the batch's. Engram: only the table rows a token hashes to are touched (the mapping stays lazy).
#include <algorithm>
#include <cmath>

#include "model/fast/fast_internal.h"
#include "model/reference/ref_blocks.h"
#include "ops/select.h"

namespace dsv41 {

void FastModel::Impl::expert_swiglu(const fast::ExpertW& e, const float* x_in, float route,
                                    float* out) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, I = tc.moe_intermediate_size;
  if (int64_t(hbuf.size()) < I) hbuf.resize(std::size_t(I));
  const float* xa = maybe_act_quant(x_in, D);
  const float lim = float(tc.swiglu_limit);
  float* hb = hbuf.data();
  const ops::Kernels& kk = *kern;
  auto gu = [&](int64_t j0, int64_t j1) {
    (opt.mxfp4_int16 ? kk.mxfp4_gate_up : kk.mxfp4_gate_up_f32)(e.w13 + 2 * j0 * (D / 2),
                                                                e.s13 + 2 * j0 * (D / 32), j1 - j0,
                                                                D, xa, &route, 1, lim, hb + j0);
  };
  par_rows(I, 32, std::ref(gu));
  const float* a = maybe_act_quant(hb, I);
  auto down = [&](int64_t r0, int64_t r1) {
    (opt.mxfp4_int16 ? kk.mxfp4_gemv : kk.mxfp4_gemv_f32)(e.w2 + r0 * (I / 2), e.s2 + r0 * (I / 32),
                                                          r1 - r0, I, a, 1, out + r0);
  };
  par_rows(D, 32, std::ref(down));
}

void FastModel::Impl::shared_expert(const fast::LayerW& w, const float* x, float* out) {
  const TextConfig& tc = cfg.text;
  const int64_t I = w.sh_w1.out;
  if (int64_t(gbuf.size()) < 2 * I) gbuf.resize(std::size_t(2 * I));
  float* g = gbuf.data();
  float* up = gbuf.data() + I;
  linear(w.sh_w1, x, g);
  linear(w.sh_w3, x, up);
  const float lim = float(tc.swiglu_limit);
  for (int64_t i = 0; i < I; ++i) g[i] = ref::swiglu_clamped(g[i], up[i], lim, 1.0f);
  linear(w.sh_w2, g, out);
}

void FastModel::Impl::moe(const LayerPlan& p, const fast::LayerW& w, int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, E = p.n_routed_experts, K = p.experts_per_tok;
  auto grow = [](auto& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  grow(logits_e, E);
  grow(route_w, n * K);
  grow(route_e, n * K);
  grow(ybuf, n * K * D);
  grow(topk_out, K);
  grow(tmp, 2 * E);
  if (int64_t(by_expert.size()) < E) by_expert.resize(std::size_t(E));
  for (int64_t e = 0; e < E; ++e) by_expert[std::size_t(e)].clear();
  // DeepSeek's Gate renormalises the chosen weights only when norm_topk_prob and top-k > 1.
  const bool renorm = tc.norm_topk_prob && K > 1;
  const float temp = float(tc.gate_temp), rscale = float(tc.routed_scaling_factor);
  for (int64_t t = 0; t < n; ++t) {
    linear(w.gate, xs.data() + t * D, logits_e.data());
    float* score = tmp.data();
    float* biased = tmp.data() + E;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = std::sqrt(ref::softplus(logits_e[std::size_t(e)] / temp));
      biased[e] = score[e] + w.gate_bias[e];
    }
    const int64_t got = ops::topk_threshold(biased, E, K, topk_out.data());
    DSV41_CHECK(got == K);
    float sum = 0;
    for (int64_t s = 0; s < K; ++s) sum += score[topk_out[std::size_t(s)]];
    for (int64_t s = 0; s < K; ++s) {
      const int64_t e = topk_out[std::size_t(s)];
      float wt = score[e];
      if (renorm) wt = wt / (sum + 1e-20f);
      route_w[std::size_t(t * K + s)] = wt * rscale;
      route_e[std::size_t(t * K + s)] = int32_t(e);
      by_expert[std::size_t(e)].push_back(int32_t(t * K + s));
    }
  }
  const int64_t I = tc.moe_intermediate_size;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[std::size_t(e)].empty()) {
      ++stats.distinct_experts;
      stats.weight_bytes += 3 * I * (D / 2 + D / 32);  // w13 and w2 with their scales, once
    }
  for (int64_t e = 0; e < E; ++e)
    for (int32_t item : by_expert[std::size_t(e)])
      expert_swiglu(w.experts[std::size_t(e)], xs.data() + (item / K) * D,
                    route_w[std::size_t(item)], ybuf.data() + int64_t(item) * D);
  if (int64_t(ubuf.size()) < D) ubuf.resize(std::size_t(D));
  for (int64_t t = 0; t < n; ++t) {
    float* yt = ys.data() + t * D;
    std::fill_n(yt, D, 0.0f);
    for (int64_t s = 0; s < K; ++s) {
      const float* yk = ybuf.data() + (t * K + s) * D;
      for (int64_t i = 0; i < D; ++i) yt[i] += yk[i];
    }
    shared_expert(w, xs.data() + t * D, ubuf.data());
    for (int64_t i = 0; i < D; ++i) yt[i] += ubuf[std::size_t(i)];
  }
}

void FastModel::Impl::engram(const LayerPlan& p, const fast::LayerW& w, int64_t t, float* ht) {
  const TextConfig& tc = cfg.text;
  const fast::TokenRow& row = rows[std::size_t(t)];
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, hd = tc.engram_head_dim;
  const std::size_t cols = hasher->columns();
  if (topk_out.size() < cols) topk_out.resize(cols);
  hasher->hash(row.seq->history, row.pos, std::size_t(p.engram), topk_out.data());
  const auto& offsets = hasher->layouts()[std::size_t(p.engram)].offsets;
  if (int64_t(emb.size()) < int64_t(cols) * hd) emb.resize(cols * std::size_t(hd));
  stats.weight_bytes += int64_t(cols) * (hd + hd / 32);
  for (std::size_t c = 0; c < cols; ++c) {
    const int64_t r = topk_out[c] - offsets[c];  // the row inside hash column c's bucket
    const uint8_t* codes = w.e_codes[c] + r * hd;
    const uint8_t* scales = w.e_scales[c] + r * (hd / 32);
    for (int64_t i = 0; i < hd; ++i)
      emb[c * std::size_t(hd) + std::size_t(i)] =
          e4m3_to_float(codes[i]) * e8m0_to_float(scales[i / 32]);
  }
  if (int64_t(ekv.size()) < w.e_wkv.out) ekv.resize(std::size_t(w.e_wkv.out));
  linear(w.e_wkv, emb.data(), ekv.data());
  const float* value = ekv.data() + HC * D;
  const float eps = float(tc.rms_norm_eps);
  for (int64_t j = 0; j < HC; ++j) {
    float* hj = ht + j * D;
    const float g = ref::engram_gate(hj, w.e_qk.data() + j * D, ekv.data() + j * D, D, eps);
    for (int64_t c = 0; c < D; ++c) hj[c] += g * value[c];
  }
}

}  // namespace dsv41
