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

void FastModel::Impl::expert_batch(const fast::ExpertW& e, const float* x_in, const float* route,
                                   int64_t m, float* out) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, I = tc.moe_intermediate_size;
  if (int64_t(hbuf.size()) < m * I) hbuf.resize(std::size_t(m * I));
  const float* xa = maybe_act_quant_rows(x_in, m, D);
  const float lim = float(tc.swiglu_limit);
  float* hb = hbuf.data();
  const ops::Kernels& kk = *kern;
  const bool i16 = opt.mxfp4_int16;
  // the act-quant GEMMs (act-quant on, avx512_bf16), else the FMA GEMMs for fp32 activations
  // (either mode: act-quant values are fp32 values), else the GEMV-shaped kernels below
  const bool aq = opt.act_quant && kk.aq_mxfp4_gemm, f32 = !aq && !i16 && kk.f32_mxfp4_gemm;
  if (aq || f32) {
    if (e.aq < 0)
      e.aq = ops::mxfp4_aq_scales_ok(e.s13, 2 * I * (D / 32)) &&
             ops::mxfp4_aq_scales_ok(e.s2, D * (I / 32));
    if (e.aq) return expert_gemm(e, xa, route, m, out, aq);
  }
  auto gu = [&](int64_t j0, int64_t j1) {
    if (i16 || m == 1) {
      for (int64_t t = 0; t < m; ++t)
        (i16 ? kk.mxfp4_gate_up : kk.mxfp4_gate_up_f32)(
            e.w13 + 2 * j0 * (D / 2), e.s13 + 2 * j0 * (D / 32), j1 - j0, D, xa + t * D, route + t,
            1, lim, hb + t * I + j0);
    } else {
      kk.mxfp4_gate_up_batch(e.w13 + 2 * j0 * (D / 2), e.s13 + 2 * j0 * (D / 32), j1 - j0, D, xa,
                             route, m, lim, hb + j0, I);
    }
  };
  par_rows(I, 32, std::ref(gu));
  const float* a = maybe_act_quant_rows(hb, m, I);
  auto down = [&](int64_t r0, int64_t r1) {
    if (i16 || m == 1) {
      for (int64_t t = 0; t < m; ++t)
        (i16 ? kk.mxfp4_gemv : kk.mxfp4_gemv_f32)(e.w2 + r0 * (I / 2), e.s2 + r0 * (I / 32),
                                                  r1 - r0, I, a + t * I, 1, out + t * D + r0);
    } else {
      kk.mxfp4_gemv_batch(e.w2 + r0 * (I / 2), e.s2 + r0 * (I / 32), r1 - r0, I, a, m, out + r0, D);
    }
  };
  par_rows(D, 32, std::ref(down));
}

namespace {

// One GEMM family's expert entries over activations packed as T: the act-quant GEMMs (bf16
// words) or the FMA GEMMs for fp32 activations (floats).
template <class T>
struct ExpertGemms {
  int64_t (*stride)(int64_t, ops::AqFormat);
  void (*pack)(const float*, int64_t, int64_t, ops::AqFormat, T*);
  void (*gate_up)(const uint8_t*, const uint8_t*, int64_t, int64_t, const T*, const float*, int64_t,
                  float, float*, int64_t);
  void (*down)(const uint8_t*, const uint8_t*, int64_t, int64_t, const T*, int64_t, float*,
               int64_t);
};

}  // namespace

// The expert through a GEMM family (one kernel for every m, so a token's bits do not depend on
// its companions): the act-quant GEMMs (`aq`: act-quant on, exact bf16 products) or the FMA GEMMs
// for fp32 activations (act-quant off, or on where the tier has no act-quant GEMMs). x is already
// rounded to E4M3 when act-quant is on (expert_batch); the hidden h is rounded here, as
// DeepSeek's code rounds the input of w2.
void FastModel::Impl::expert_gemm(const fast::ExpertW& e, const float* x, const float* route,
                                  int64_t m, float* out, bool aq) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, I = tc.moe_intermediate_size;
  const ops::Kernels& kk = *kern;
  const float lim = float(tc.swiglu_limit);
  float* hb = hbuf.data();
  auto run = [&](const auto& f, auto* xp) {
    f.pack(x, m, D, ops::AqFormat::kMxfp4, xp);
    auto gu = [&](int64_t j0, int64_t j1) {
      f.gate_up(e.w13 + 2 * j0 * (D / 2), e.s13 + 2 * j0 * (D / 32), j1 - j0, D, xp, route, m, lim,
                hb + j0, I);
    };
    par_rows(I, 32, std::ref(gu));
    // (x is packed by now: rounding h into the act-quant scratch that held x is safe)
    f.pack(maybe_act_quant_rows(hb, m, I), m, I, ops::AqFormat::kMxfp4, xp);
    auto down = [&](int64_t r0, int64_t r1) {
      f.down(e.w2 + r0 * (I / 2), e.s2 + r0 * (I / 32), r1 - r0, I, xp, m, out + r0, D);
    };
    par_rows(D, 32, std::ref(down));
  };
  auto most = [&](auto stride) {  // the packed x or h of m tokens, whichever is longer
    return m * std::max(stride(D, ops::AqFormat::kMxfp4), stride(I, ops::AqFormat::kMxfp4));
  };
  if (aq)
    run(ExpertGemms<uint16_t>{kk.aq_act_stride, kk.aq_pack_act, kk.aq_mxfp4_gate_up,
                              kk.aq_mxfp4_gemm},
        xpk_words(most(kk.aq_act_stride)));
  else
    run(ExpertGemms<float>{kk.f32_act_stride, kk.f32_pack_act, kk.f32_mxfp4_gate_up,
                           kk.f32_mxfp4_gemm},
        xpk_floats(most(kk.f32_act_stride)));
}

void FastModel::Impl::moe(const LayerPlan& p, const fast::LayerW& w, int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, E = p.n_routed_experts, K = p.experts_per_tok;
  const int64_t I = tc.moe_intermediate_size;
  auto grow = [](auto& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  grow(logits_e, kMoeChunk * E);
  grow(route_w, n * K);
  grow(ybuf, n * K * D);
  grow(topk_out, K);
  grow(tmp, 2 * E);
  grow(gx, kMoeChunk * D);
  grow(gr, kMoeChunk);
  grow(gy, kMoeChunk * D);
  grow(gbuf, 2 * kMoeChunk * w.sh_w1.out);
  if (int64_t(by_expert.size()) < E) by_expert.resize(std::size_t(E));
  for (int64_t e = 0; e < E; ++e) by_expert[std::size_t(e)].clear();
  // DeepSeek's Gate renormalises the chosen weights only when norm_topk_prob and top-k > 1.
  const bool renorm = tc.norm_topk_prob && K > 1;
  const float temp = float(tc.gate_temp), rscale = float(tc.routed_scaling_factor);
  const int64_t tok_chunk = even_chunk(n, kMoeChunk);
  for (int64_t c0 = 0; c0 < n; c0 += tok_chunk) {
    const int64_t cn = std::min(tok_chunk, n - c0);
    linear_batch(w.gate, xs.data() + c0 * D, cn, logits_e.data());
    for (int64_t t = c0; t < c0 + cn; ++t) {
      const float* lg = logits_e.data() + (t - c0) * E;
      float* score = tmp.data();
      float* biased = tmp.data() + E;
      // Image positions select with bias_vl (spec §9.1); the weights come from the scores.
      const float* bias =
          rows[std::size_t(t)].kind == SpanKind::kText ? w.gate_bias : w.gate_bias_vl;
      for (int64_t e = 0; e < E; ++e) {
        score[e] = std::sqrt(ref::softplus(lg[e] / temp));
        biased[e] = score[e] + bias[e];
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
        by_expert[std::size_t(e)].push_back(int32_t(t * K + s));
      }
    }
  }
  // Each expert's weights once per chunk of its tokens; every (token, slot) result in its own row.
  // Split over processes, each computes its own experts' rows and the others' stay 0 here: the
  // sum over processes then gives every process every row exactly (one non-zero term each).
  const bool split = opt.ep_parts > 1;
  if (split) std::fill_n(ybuf.data(), n * K * D, 0.0f);
  for (int64_t e = expert_lo(E); e < expert_hi(E); ++e) {
    const auto& items = by_expert[std::size_t(e)];
    if (items.empty()) continue;
    ++stats.distinct_experts;
    stats.weight_bytes += 3 * I * (D / 2 + D / 32);  // w13 and w2 with their scales, once
    stats.macs += 3 * I * D * int64_t(items.size());
    const int64_t item_chunk = even_chunk(int64_t(items.size()), kMoeChunk);
    for (std::size_t c0 = 0; c0 < items.size(); c0 += std::size_t(item_chunk)) {
      const int64_t m = std::min<int64_t>(item_chunk, int64_t(items.size() - c0));
      for (int64_t k = 0; k < m; ++k) {
        const int32_t item = items[c0 + std::size_t(k)];
        std::copy_n(xs.data() + (item / K) * D, D, gx.data() + k * D);
        gr[std::size_t(k)] = route_w[std::size_t(item)];
      }
      expert_batch(w.experts[std::size_t(e)], gx.data(), gr.data(), m, gy.data());
      for (int64_t k = 0; k < m; ++k)
        std::copy_n(gy.data() + k * D, D, ybuf.data() + int64_t(items[c0 + std::size_t(k)]) * D);
    }
  }
  if (split) reduce(ybuf.data(), n * K * D);
  // Shared expert per chunk, then each token's sum in its own slot order.
  const int64_t Is = w.sh_w1.out;
  const float lim = float(tc.swiglu_limit);
  for (int64_t c0 = 0; c0 < n; c0 += tok_chunk) {
    const int64_t cn = std::min(tok_chunk, n - c0);
    float* g = gbuf.data();
    float* up = gbuf.data() + cn * Is;
    linear_batch(w.sh_w1, xs.data() + c0 * D, cn, g);
    linear_batch(w.sh_w3, xs.data() + c0 * D, cn, up);
    for (int64_t i = 0; i < cn * Is; ++i) g[i] = ref::swiglu_clamped(g[i], up[i], lim, 1.0f);
    linear_batch(w.sh_w2, g, cn, gy.data());
    for (int64_t t = c0; t < c0 + cn; ++t) {
      float* yt = ys.data() + t * D;
      std::fill_n(yt, D, 0.0f);
      for (int64_t s = 0; s < K; ++s) {
        const float* yk = ybuf.data() + (t * K + s) * D;
        for (int64_t i = 0; i < D; ++i) yt[i] += yk[i];
      }
      const float* sh = gy.data() + (t - c0) * D;
      for (int64_t i = 0; i < D; ++i) yt[i] += sh[i];
    }
  }
}

void FastModel::Impl::engram_chunk(const LayerPlan& p, const fast::LayerW& w, int64_t t0,
                                   int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, hd = tc.engram_head_dim;
  const std::size_t cols = hasher->columns();
  const int64_t width = int64_t(cols) * hd;
  if (topk_out.size() < cols) topk_out.resize(cols);
  const auto& offsets = hasher->layouts()[std::size_t(p.engram)].offsets;
  if (int64_t(emb.size()) < n * width) emb.resize(std::size_t(n * width));
  for (int64_t t = 0; t < n; ++t) {
    const fast::TokenRow& row = rows[std::size_t(t0 + t)];
    float* et = emb.data() + t * width;
    if (row.kind != SpanKind::kText) {  // an image position: no lookup (its gate is 0 below)
      std::fill_n(et, width, 0.0f);
      continue;
    }
    hasher->hash(row.seq->history, row.pos, std::size_t(p.engram), topk_out.data());
    stats.weight_bytes += int64_t(cols) * (hd + hd / 32);
    for (std::size_t c = 0; c < cols; ++c) {
      const int64_t r = topk_out[c] - offsets[c];  // the row inside hash column c's bucket
      const uint8_t* codes = w.e_codes[c] + r * hd;
      const uint8_t* scales = w.e_scales[c] + r * (hd / 32);
      for (int64_t i = 0; i < hd; ++i)
        et[c * std::size_t(hd) + std::size_t(i)] =
            e4m3_to_float(codes[i]) * e8m0_to_float(scales[i / 32]);
    }
  }
  if (int64_t(ekv.size()) < n * w.e_wkv.out) ekv.resize(std::size_t(n * w.e_wkv.out));
  linear_batch(w.e_wkv, emb.data(), n, ekv.data());
  const float eps = float(tc.rms_norm_eps);
  for (int64_t t = 0; t < n; ++t) {
    if (rows[std::size_t(t0 + t)].kind != SpanKind::kText) continue;  // passes unchanged
    float* ht = hs.data() + (t0 + t) * HC * D;
    const float* ek = ekv.data() + t * w.e_wkv.out;
    const float* value = ek + HC * D;
    for (int64_t j2 = 0; j2 < HC; ++j2) {
      float* hj = ht + j2 * D;
      const float g = ref::engram_gate(hj, w.e_qk.data() + j2 * D, ek + j2 * D, D, eps);
      for (int64_t c = 0; c < D; ++c) hj[c] += g * value[c];
    }
  }
}

}  // namespace dsv41
