// The reference's DSpark drafter (spec §8; design.md §9 is the contract, what DeepSeek's
// `forward_spec` computes): the target's taps into main_hidden, each stage's window rows made from
// main_x, and one drafting step — the block [next, noise, ...] through every stage (window-only
// attention over the stage's rows plus the whole block, not causal inside it), the target's head,
// the Markov head's bias applied row by row along the greedy chain, and the confidence head.
// Everything in T, like the backbone; the drafter never writes target state, and a step keeps
// nothing (the block's own rows are not written into the rings).
#include <algorithm>

#include "model/reference/reference_impl.h"

namespace dsv41 {

using ref::LayerW;

template <typename T>
void ReferenceModel<T>::Impl::load_dspark() {
  const ref::WeightReader& rd = *reader;
  const int S = int(plan.layers.size()) - plan.num_backbone;
  for (int s = 0; s < S; ++s) dspark.stages.push_back(ref::read_layer<T>(rd, plan.stage(s)));
  const DsparkTensorNames n = dspark_tensor_names(plan);
  dspark.main_proj = rd.mat(n.main_proj + ".weight");
  dspark.main_norm = rd.template vec<T>(n.main_norm);
  dspark.norm = rd.template vec<T>(n.norm);
  dspark.markov_embed = rd.mat(n.markov_embed);
  dspark.markov_head = rd.mat(n.markov_head + ".weight");
  dspark.confidence = rd.mat(n.confidence);
}

// main_hidden(p) holds, per target layer in ascending layer order, the mean over the hc copies of
// the stream entering that layer (after its Engram, before its mixes).
template <typename T>
void ReferenceModel<T>::Impl::dspark_tap(const LayerPlan& p, int64_t t, const T* h) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, HC = tc.hc_mult;
  const auto& ids = tc.dspark_target_layer_ids;
  const int64_t at = std::count_if(ids.begin(), ids.end(), [&](int64_t l) { return l < p.index; });
  if (int64_t(taps.size()) <= t) taps.resize(std::size_t(t + 1));
  auto& tap = taps[std::size_t(t)];
  tap.resize(ids.size() * std::size_t(D));
  for (int64_t c = 0; c < D; ++c) {
    T s = 0;
    for (int64_t j = 0; j < HC; ++j) s += h[j * D + c];
    tap[std::size_t(at * D + c)] = s / T(HC);
  }
}

// After a call over [start, start + n): main_x(p) = main_norm(main_proj . main_hidden(p)), made
// once with stage 0's weights, becomes each stage's window row for p (its own wkv and kv_norm, RoPE
// at p without YaRN, FP8 fake-quant).
template <typename T>
void ReferenceModel<T>::Impl::dspark_context(int64_t start, int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size;
  DSV41_CHECK(int64_t(taps.size()) == n);
  std::vector<T> main_x(static_cast<std::size_t>(D));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t P = start + t;
    lin(dspark.main_proj, taps[std::size_t(t)].data(), main_x.data());
    ref::rmsnorm(main_x.data(), dspark.main_norm.data(), D, T(tc.rms_norm_eps), main_x.data());
    for (std::size_t s = 0; s < dspark.stages.size(); ++s) {
      cur_layer = plan.stage(int(s)).index;
      DSV41_CHECK(int64_t(ring[s].size()) == P);
      ring[s].push_back(window_row(dspark.stages[s], rope_swa, main_x.data(), P));
    }
  }
}

template <typename T>
Status ReferenceModel<T>::draft(int32_t next, DraftStep<T>* out) {
  Impl& im = *impl_;
  const TextConfig& tc = im.cfg.text;
  if (!im.opt.dspark)
    return Status::error("draft: the model was loaded without its DSpark drafter");
  if (im.pos < 1) return Status::error("draft: the target has consumed no token yet");
  if (next < 0 || next >= tc.vocab_size)
    return Status::error("draft: token " + std::to_string(next) + " is outside the vocabulary");
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, V = tc.vocab_size;
  const int64_t B = tc.dspark_block_size, R = tc.dspark_markov_rank, P0 = im.pos;
  const T eps = T(tc.rms_norm_eps), hc_eps = T(tc.hc_eps);
  // The block: the next token then noise ids, embedded, copied to every stream, pre-mix one-hot.
  std::vector<std::vector<T>> h(static_cast<std::size_t>(B),
                                std::vector<T>(static_cast<std::size_t>(HC * D)));
  std::vector<std::vector<T>> pre(static_cast<std::size_t>(B),
                                  std::vector<T>(static_cast<std::size_t>(HC), T(0)));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t id = b == 0 ? next : tc.dspark_noise_token_id;
    im.embed.row(id, h[std::size_t(b)].data());
    for (int64_t j = 1; j < HC; ++j)
      std::copy_n(h[std::size_t(b)].begin(), D, h[std::size_t(b)].begin() + j * D);
    pre[std::size_t(b)][0] = T(1);
  }
  std::vector<T> x(static_cast<std::size_t>(D)), a(static_cast<std::size_t>(D)),
      h1(std::size_t(HC * D));
  for (std::size_t s = 0; s < im.dspark.stages.size(); ++s) {
    const LayerPlan& p = im.plan.stage(int(s));
    const LayerW<T>& w = im.dspark.stages[s];
    im.cur_layer = p.index;
    // Every block position's query and row first: each query attends the whole block.
    std::vector<ref::HcMix<T>> mix(static_cast<std::size_t>(B));
    std::vector<std::vector<T>> q(static_cast<std::size_t>(B)), kv(static_cast<std::size_t>(B));
    std::vector<T> qr;
    for (int64_t b = 0; b < B; ++b) {
      T* hb = h[std::size_t(b)].data();
      mix[std::size_t(b)] = ref::hc_mixes(hb, HC, D, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale,
                                          eps, hc_eps, tc.hc_sinkhorn_iters);
      ref::hc_collapse(hb, pre[std::size_t(b)], HC, D, x.data());
      ref::rmsnorm(x.data(), w.attn_norm.data(), D, eps, x.data());
      im.query(w, im.rope_swa, x.data(), P0 + b, &qr, &q[std::size_t(b)]);
      kv[std::size_t(b)] = im.window_row(w, im.rope_swa, x.data(), P0 + b);
    }
    std::vector<const T*> rows;  // the stage's rows of the last W consumed positions, the block
    for (int64_t k = std::max<int64_t>(0, P0 - tc.sliding_window); k < P0; ++k)
      rows.push_back(im.ring[s][std::size_t(k)].data());
    for (const auto& r : kv) rows.push_back(r.data());
    for (int64_t b = 0; b < B; ++b) {
      T* hb = h[std::size_t(b)].data();
      im.cur_pos = P0 + b;
      im.attend(w, im.rope_swa, q[std::size_t(b)], rows, P0 + b, a.data());
      ref::hc_expand(a.data(), hb, mix[std::size_t(b)], HC, D, h1.data());
      const auto mix_f = ref::hc_mixes(h1.data(), HC, D, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale,
                                       eps, hc_eps, tc.hc_sinkhorn_iters);
      ref::hc_collapse(h1.data(), mix[std::size_t(b)].pre, HC, D, x.data());
      ref::rmsnorm(x.data(), w.ffn_norm.data(), D, eps, x.data());
      im.moe(p, w, x.data(), a.data());
      ref::hc_expand(a.data(), h1.data(), mix_f, HC, D, hb);
      pre[std::size_t(b)] = mix_f.pre;
    }
  }
  // Head, then the Markov bias along the greedy chain and the confidence, row by row.
  out->logits.assign(std::size_t(B * V), T(0));
  out->ids.assign(std::size_t(B + 1), 0);
  out->confidence.assign(std::size_t(B), T(0));
  out->ids[0] = next;
  std::vector<T> cat(std::size_t(D + R)), bias(static_cast<std::size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    ref::hc_collapse(h[std::size_t(b)].data(), pre[std::size_t(b)], HC, D, cat.data());
    ref::rmsnorm(cat.data(), im.dspark.norm.data(), D, eps, x.data());
    T* row = out->logits.data() + b * V;
    im.lin(im.head, x.data(), row);
    im.dspark.markov_embed.row(out->ids[std::size_t(b)], cat.data() + D);
    im.lin(im.dspark.markov_head, cat.data() + D, bias.data());
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      row[v] += bias[std::size_t(v)];
      if (row[v] > row[best]) best = v;  // ties: the lowest index
    }
    out->ids[std::size_t(b + 1)] = int32_t(best);
    im.lin(im.dspark.confidence, cat.data(), &out->confidence[std::size_t(b)]);
  }
  return Status::ok();
}

template void ReferenceModel<float>::Impl::load_dspark();
template void ReferenceModel<double>::Impl::load_dspark();
template void ReferenceModel<float>::Impl::dspark_tap(const LayerPlan&, int64_t, const float*);
template void ReferenceModel<double>::Impl::dspark_tap(const LayerPlan&, int64_t, const double*);
template void ReferenceModel<float>::Impl::dspark_context(int64_t, int64_t);
template void ReferenceModel<double>::Impl::dspark_context(int64_t, int64_t);
template Status ReferenceModel<float>::draft(int32_t, DraftStep<float>*);
template Status ReferenceModel<double>::draft(int32_t, DraftStep<double>*);

}  // namespace dsv41
