// Reference forward implementation (see reference_model.h). Layout of one call: every backbone
// layer runs over the call's positions in order (Engram first, then per position: mHC mixes,
// attention, mHC, MoE), keeping per-sequence state — window rows, compressed entries and index keys
// of KV sources, partial compressor groups, the Engram history — and per-call state — top-k
// selections of index layers and the candidate pool, per position — as spec §7 lists.
#include "model/reference/reference_model.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "model/inventory.h"
#include "model/reference/reference_impl.h"

namespace dsv41 {

using ref::ExpertW;
using ref::LayerW;
using ref::read_layer;
using ref::SourceState;

template <typename T>
void ReferenceModel<T>::Impl::engram(const LayerPlan& p, const LayerW<T>& w, int64_t P, T* h) {
  const TextConfig& t = cfg.text;
  const int64_t D = t.hidden_size, HC = t.hc_mult, hd = t.engram_head_dim;
  const std::size_t cols = hasher->columns();
  std::vector<int64_t> rows(cols);
  hasher->hash(history, P, std::size_t(p.engram), rows.data());
  const auto codes = ckpt.bytes(w.e_table + ".weight");
  const auto scales = ckpt.bytes(w.e_table + ".scale");
  std::vector<T> emb(cols * std::size_t(hd));
  for (std::size_t c = 0; c < cols; ++c)
    for (int64_t i = 0; i < hd; ++i)
      emb[c * std::size_t(hd) + std::size_t(i)] =
          T(e4m3_to_float(codes[std::size_t(rows[c] * hd + i)])) *
          T(e8m0_to_double(scales[std::size_t(rows[c] * (hd / 32) + i / 32)]));
  std::vector<T> kv(std::size_t(w.e_wkv.rows));
  lin(w.e_wkv, emb.data(), kv.data());
  const T* value = kv.data() + HC * D;
  const T eps = T(t.rms_norm_eps);
  for (int64_t j = 0; j < HC; ++j) {
    T* hj = h + j * D;
    const T* key = kv.data() + j * D;
    const T* wj = w.e_qk.data() + j * D;
    const T g = ref::engram_gate(hj, wj, key, D, eps);
    for (int64_t c = 0; c < D; ++c) hj[c] += g * value[c];
  }
}

template <typename T>
void ReferenceModel<T>::Impl::compressor_step(const LayerPlan& p, const LayerW<T>& w, const T* x,
                                              int64_t P) {
  const TextConfig& t = cfg.text;
  const int64_t Dh = t.head_dim, r = p.compress_ratio;
  SourceState<T>& st = sources[p.index];
  std::vector<T> latent(static_cast<std::size_t>(Dh));
  if (r == 1) {
    lin(w.c_wkv, x, latent.data());
  } else {
    std::vector<T> kv(static_cast<std::size_t>(Dh)), g(static_cast<std::size_t>(Dh));
    lin(w.c_wkv, x, kv.data());
    lin(w.c_wgate, x, g.data());
    st.part_kv.push_back(kv);
    st.part_gate.push_back(g);
    if ((P + 1) % r != 0) return;
    ref::compress_pool(st.part_kv, st.part_gate, Dh, latent.data());
    st.part_kv.clear();
    st.part_gate.clear();
  }
  ref::rmsnorm(latent.data(), w.c_norm.data(), Dh, T(t.rms_norm_eps), latent.data());
  const int64_t j = P / r, entry_pos = j * r;
  // Index key from the pre-RoPE latent; then the latent itself is rotated and FP4-quantized.
  std::vector<T> key(std::size_t(t.index_head_dim));
  lin(w.i_wk, latent.data(), key.data());
  ref::rmsnorm(key.data(), w.i_k_norm.data(), t.index_head_dim, T(t.rms_norm_eps), key.data());
  rope_comp.apply(key.data(), t.index_head_dim, entry_pos);
  quant([](T* v, int64_t k, ref::QuantTrace* q) { ref::fake_fp4_pow2(v, k, 32, q); }, key.data(),
        t.index_head_dim, TraceSite::kIndexKey, P, j);
  rope_comp.apply(latent.data(), Dh, entry_pos);
  quant([](T* v, int64_t k, ref::QuantTrace* q) { ref::fake_fp4_e4m3(v, k, 16, q); }, latent.data(),
        Dh, TraceSite::kCompressedKv, P, j);
  DSV41_CHECK(int64_t(st.comp.size()) == j);
  st.comp.push_back(std::move(latent));
  st.keys.push_back(std::move(key));
}

template <typename T>
void ReferenceModel<T>::Impl::indexer(const LayerPlan& p, const LayerW<T>& w, const T* x,
                                      const T* qr, int64_t t, int64_t P, int64_t end_pos) {
  const TextConfig& tc = cfg.text;
  const int64_t r = p.compress_ratio, nvis = (P + 1) / r, n_total = end_pos / r;
  const int64_t nh = tc.index_n_heads, di = tc.index_head_dim;
  auto& sel = selections[p.index];
  sel.resize(std::size_t(t + 1));
  if (nvis == 0) return;  // nothing visible yet: the indexer is skipped
  const int keys_owner =
      (opt.index_keys == IndexKeySemantics::kVendor && slot >= 0) ? slot : p.kv_source;
  const auto& keys = sources[keys_owner].keys;
  DSV41_CHECK(int64_t(keys.size()) >= nvis);
  std::vector<T> q(std::size_t(nh * di));
  lin(w.i_wq_b, qr, q.data());
  for (int64_t h = 0; h < nh; ++h) {
    rope_comp.apply(q.data() + h * di, di, P);
    quant([](T* v, int64_t k, ref::QuantTrace* qt) { ref::fake_fp4_pow2(v, k, 32, qt); },
          q.data() + h * di, di, TraceSite::kIndexQuery, P, h);
  }
  std::vector<T> wts(static_cast<std::size_t>(nh));
  lin(w.i_wproj, x, wts.data());
  const T wscale = T(1.0 / std::sqrt(double(di)) / std::sqrt(double(nh)));
  for (auto& v : wts) v *= wscale;
  const T ninf = -std::numeric_limits<T>::infinity();
  std::vector<T> s(std::size_t(nvis), ninf);
  for (int64_t j = 0; j < nvis; ++j) {
    T acc = 0;
    for (int64_t h = 0; h < nh; ++h)
      acc += std::max(ref::dot(q.data() + h * di, keys[std::size_t(j)].data(), di), T(0)) *
             wts[std::size_t(h)];
    s[std::size_t(j)] = acc;
  }
  if (p.candidate_source) {  // publish the block pool for this query (spec §5.6.3)
    candidates.resize(std::size_t(t + 1));
    std::vector<T> bscore;
    auto kept = ref::candidate_pool(s, nvis, tc.candidate_block_size, tc.candidate_topk_blocks,
                                    &candidates[std::size_t(t)], &bscore);
    record(TraceSite::kCandidates, P, std::move(kept), bscore);
  }
  if (p.candidate_filter >= 0) {
    const auto& mask = candidates[std::size_t(t)];
    bool filtered = false;
    for (int64_t j = 0; j < nvis; ++j)
      if (!mask[std::size_t(j)]) s[std::size_t(j)] = ninf, filtered = true;
    stats.candidate_filtered += filtered;
  }
  auto& out = sel[std::size_t(t)];
  out = ref::indexer_select(s, nvis, n_total, tc.index_topk);
  record(TraceSite::kTopk, P, out, std::vector<T>(s.begin(), s.begin() + nvis));
  ++stats.indexer_queries;
  stats.topk_strict_subsets += int64_t(out.size()) < nvis;
}

template <typename T>
void ReferenceModel<T>::Impl::query(const LayerW<T>& w, const ref::Rope<T>& rope, const T* x,
                                    int64_t P, std::vector<T>* qr, std::vector<T>* q) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim;
  qr->resize(std::size_t(tc.q_lora_rank));
  lin(w.wq_a, x, qr->data());
  ref::rmsnorm(qr->data(), w.q_norm.data(), tc.q_lora_rank, T(tc.rms_norm_eps), qr->data());
  q->resize(std::size_t(H * Dh));
  lin(w.wq_b, qr->data(), q->data());
  for (int64_t h = 0; h < H; ++h) rope.apply(q->data() + h * Dh, Dh, P);
}

template <typename T>
std::vector<T> ReferenceModel<T>::Impl::window_row(const LayerW<T>& w, const ref::Rope<T>& rope,
                                                   const T* x, int64_t P) {
  const int64_t Dh = cfg.text.head_dim;
  std::vector<T> kv(static_cast<std::size_t>(Dh));
  lin(w.wkv, x, kv.data());
  ref::rmsnorm(kv.data(), w.kv_norm.data(), Dh, T(cfg.text.rms_norm_eps), kv.data());
  rope.apply(kv.data(), Dh, P);
  quant([](T* v, int64_t k, ref::QuantTrace* qt) { ref::fake_fp8_pow2(v, k, 32, qt); }, kv.data(),
        Dh, TraceSite::kWindowKv, P, -1);
  return kv;
}

template <typename T>
void ReferenceModel<T>::Impl::attend(const LayerW<T>& w, const ref::Rope<T>& rope,
                                     const std::vector<T>& q, const std::vector<const T*>& rows,
                                     int64_t P, T* out) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim;
  const T scale = T(1.0 / std::sqrt(double(Dh)));
  std::vector<T> o(std::size_t(H * Dh));
  for (int64_t h = 0; h < H; ++h) {
    ref::sparse_attention_head(q.data() + h * Dh, rows, Dh, scale, w.attn_sink[std::size_t(h)],
                               o.data() + h * Dh);
    rope.apply(o.data() + h * Dh, Dh, P, /*inverse=*/true);
  }
  // Grouped low-rank output: group g (heads g*H/G ..) through its own [o_lora, H/G*Dh] block of
  // wo_a.
  const int64_t G = tc.o_groups, R = tc.o_lora_rank, gin = H * Dh / G;
  std::vector<T> u(std::size_t(G * R));
  for (int64_t g = 0; g < G; ++g) {
    lin(w.wo_a, o.data() + g * gin, u.data() + g * R, g * R, R, /*act=*/false);
  }
  lin(w.wo_b, u.data(), out);
}

template <typename T>
void ReferenceModel<T>::Impl::attention(const LayerPlan& p, const LayerW<T>& w, const T* x,
                                        int64_t t, int64_t P, int64_t end_pos, T* out) {
  const TextConfig& tc = cfg.text;
  const ref::Rope<T>& rope = p.compress_ratio > 0 ? rope_comp : rope_swa;
  std::vector<T> qr, q;
  query(w, rope, x, P, &qr, &q);
  auto& win = window[std::size_t(p.index)];
  DSV41_CHECK(int64_t(win.size()) == P);
  win.push_back(window_row(w, rope, x, P));

  std::vector<const T*>
      rows;  // the window (positions P-W+1 .. P), then the selected compressed entries
  for (int64_t k = std::max<int64_t>(0, P - tc.sliding_window + 1); k <= P; ++k)
    rows.push_back(win[std::size_t(k)].data());
  if (p.compress_ratio > 0) {
    if (p.is_kv_source()) compressor_step(p, w, x, P);
    if (p.has_indexer()) indexer(p, w, x, qr.data(), t, P, end_pos);
    const auto& sel = selections[p.index_source][std::size_t(t)];
    const auto& comp = sources[p.kv_source].comp;
    for (int64_t j : sel) rows.push_back(comp[std::size_t(j)].data());
  }
  attend(w, rope, q, rows, P, out);
}

template <typename T>
void ReferenceModel<T>::Impl::moe(const LayerPlan& p, const LayerW<T>& w, const T* x, T* out,
                                  bool image) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, E = p.n_routed_experts;
  std::vector<T> logits(static_cast<std::size_t>(E));
  lin(w.gate, x, logits.data());
  const auto routing = ref::route(logits, image ? w.gate_bias_vl : w.gate_bias, p.experts_per_tok,
                                  T(tc.gate_temp), tc.norm_topk_prob, T(tc.routed_scaling_factor));
  record(TraceSite::kExperts, cur_pos, routing.experts, routing.biased);
  std::vector<T> y(std::size_t(D), T(0));
  const T lim = T(tc.swiglu_limit);
  auto expert = [&](const ExpertW<T>& ew, T weight) {
    const int64_t I = ew.w1.rows;
    std::vector<T> g(static_cast<std::size_t>(I)), u(static_cast<std::size_t>(I)),
        yo(static_cast<std::size_t>(D));
    lin(ew.w1, x, g.data());
    lin(ew.w3, x, u.data());
    for (int64_t i = 0; i < I; ++i)
      g[std::size_t(i)] = ref::swiglu_clamped(g[std::size_t(i)], u[std::size_t(i)], lim, weight);
    lin(ew.w2, g.data(), yo.data());
    for (int64_t i = 0; i < D; ++i) y[std::size_t(i)] += yo[std::size_t(i)];
  };
  for (std::size_t k = 0; k < routing.experts.size(); ++k)
    expert(w.experts[std::size_t(routing.experts[k])], routing.weights[k]);
  expert(w.shared, T(1));
  std::copy(y.begin(), y.end(), out);
}

template <typename T>
ReferenceModel<T>::ReferenceModel() = default;
template <typename T>
ReferenceModel<T>::~ReferenceModel() = default;

template <typename T>
Result<std::unique_ptr<ReferenceModel<T>>> ReferenceModel<T>::load(const std::string& dir,
                                                                   const ReferenceOptions& opt) {
  namespace fs = std::filesystem;
  auto cfg = load_config((fs::path(dir) / "config.json").string());
  if (!cfg) return cfg.status();
  auto plan = build_layer_plan(cfg.value());
  if (!plan) return plan.status().with_context(dir + "/config.json: ");
  auto ck = Checkpoint::open(dir);
  if (!ck) return ck.status();
  const auto rep = check_inventory(expected_text_tensors(cfg.value(), plan.value()), ck.value());
  if (!rep.ok()) return Status::error(dir + ": inventory check failed:\n" + rep.summary());
  const TextConfig& tc = cfg->text;
  auto cmap = load_engram_token_ids(dir, tc);
  if (!cmap) return cmap.status();

  std::unique_ptr<ReferenceModel> m(new ReferenceModel());
  m->impl_ = std::make_unique<Impl>(std::move(ck.value()));
  Impl& im = *m->impl_;
  im.cfg = cfg.value();
  im.plan = plan.value();
  im.opt = opt;
  im.cmap = std::move(*cmap);
  im.hasher = std::make_unique<EngramHasher>(tc);
  im.reader = std::make_unique<ref::WeightReader>(im.ckpt, im.cfg.quantization.weight_block_size);
  const ref::WeightReader& rd = *im.reader;
  im.embed = rd.mat(kEmbedName);
  im.head = rd.mat(std::string(kHeadName) + ".weight");
  im.norm = rd.template vec<T>(kFinalNormName);
  im.image_start = rd.template vec<T>("image_start");
  im.image_newline = rd.template vec<T>("image_newline");
  im.image_end = rd.template vec<T>("image_end");
  for (int l = 0; l < im.plan.num_backbone; ++l)
    im.layers.push_back(read_layer<T>(rd, im.plan.layers[std::size_t(l)]));
  if (opt.dspark) {
    if (tc.num_nextn_predict_layers <= 0)
      return Status::error(dir +
                           "/config.json: text_config.num_nextn_predict_layers is 0: the "
                           "checkpoint has no DSpark drafter");
    im.load_dspark();
  }
  im.layer_tensors.resize(std::size_t(im.plan.num_backbone));
  for (const auto& name : im.ckpt.tensor_names()) {
    if (name.rfind("layers.", 0) != 0) continue;
    const std::size_t l = std::size_t(std::stoul(name.substr(7)));
    if (l < im.layer_tensors.size()) im.layer_tensors[l].push_back(name);
  }
  const RopeScaling rs = tc.rope_scaling.value_or(RopeScaling{});
  im.rope_swa = ref::Rope<T>::make(tc.qk_rope_head_dim, tc.rope_theta, false, 1, 1, 1, 1);
  im.rope_comp = ref::Rope<T>::make(
      tc.qk_rope_head_dim, tc.compress_rope_theta, tc.rope_scaling.has_value(), rs.factor,
      double(rs.original_max_position_embeddings), rs.beta_fast, rs.beta_slow);
  m->reset();
  return m;
}

template <typename T>
const ModelConfig& ReferenceModel<T>::config() const {
  return impl_->cfg;
}
template <typename T>
const ModelPlan& ReferenceModel<T>::plan() const {
  return impl_->plan;
}
template <typename T>
int64_t ReferenceModel<T>::position() const {
  return impl_->pos;
}
template <typename T>
const ReferenceStats& ReferenceModel<T>::stats() const {
  return impl_->stats;
}
template <typename T>
void ReferenceModel<T>::set_trace(std::vector<TraceEvent>* trace) {
  impl_->trace = trace;
}

std::string_view trace_site_name(TraceSite s) {
  switch (s) {
    case TraceSite::kWindowKv:
      return "window-kv-fp8";
    case TraceSite::kCompressedKv:
      return "compressed-kv-fp4";
    case TraceSite::kIndexKey:
      return "index-key-fp4";
    case TraceSite::kIndexQuery:
      return "index-query-fp4";
    case TraceSite::kTopk:
      return "indexer-topk";
    case TraceSite::kCandidates:
      return "candidate-blocks";
    case TraceSite::kExperts:
      return "expert-selection";
    case TraceSite::kActQuant:
      return "act-quant-e4m3";
  }
  return "?";
}

template <typename T>
void ReferenceModel<T>::reset() {
  Impl& im = *impl_;
  im.pos = 0;
  im.history.clear();
  im.window.assign(std::size_t(im.plan.num_backbone), {});
  im.sources.clear();
  im.slot = -1;
  im.ring.assign(im.dspark.stages.size(), {});
}

template <typename T>
std::vector<SpanKind> span_kinds(const std::vector<PromptImage<T>>& images, int64_t first,
                                 int64_t n) {
  std::vector<SpanKind> k(std::size_t(n), SpanKind::kText);
  for (const PromptImage<T>& im : images)
    for (int64_t i = 0; i < im.span(); ++i) {
      const int64_t t = im.start + i - first;
      if (t < 0 || t >= n) continue;
      k[std::size_t(t)] = span_position_kind(i, im.llm_w, im.span());
    }
  return k;
}

namespace {

// The images of a call checked against its tokens (see forward): an error names the image.
template <typename T>
Status check_images(const std::vector<PromptImage<T>>& images, const std::vector<int32_t>& tokens,
                    int64_t image_token_id, int64_t D) {
  if (images.empty()) return Status::ok();
  int64_t end_prev = 0;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const PromptImage<T>& im = images[i];
    const std::string who = "image " + std::to_string(i) + ": ";
    if (im.llm_w < 1 || im.llm_h < 1 || int64_t(im.rows.size()) != im.llm_w * im.llm_h * D)
      return Status::error(who + "rows must be llm_h x llm_w x " + std::to_string(D) + " values");
    if (im.start < end_prev || im.start + im.span() > int64_t(tokens.size()))
      return Status::error(who + "its span [" + std::to_string(im.start) + ", " +
                           std::to_string(im.start + im.span()) +
                           ") overlaps the previous one or leaves the call");
    for (int64_t p = im.start; p < im.start + im.span(); ++p)
      if (tokens[std::size_t(p)] != image_token_id)
        return Status::error(who + "position " + std::to_string(p) + " of its span holds token " +
                             std::to_string(tokens[std::size_t(p)]) + ", not image_token_id " +
                             std::to_string(image_token_id));
    end_prev = im.start + im.span();
  }
  return Status::ok();
}

}  // namespace

template <typename T>
Status ReferenceModel<T>::forward(const std::vector<int32_t>& tokens, std::vector<T>* logits,
                                  std::vector<std::vector<T>>* dump) {
  return forward(tokens, {}, logits, dump);
}

template <typename T>
Status ReferenceModel<T>::forward(const std::vector<int32_t>& tokens,
                                  const std::vector<PromptImage<T>>& images, std::vector<T>* logits,
                                  std::vector<std::vector<T>>* dump) {
  Impl& im = *impl_;
  const TextConfig& tc = im.cfg.text;
  const int64_t n = int64_t(tokens.size()), D = tc.hidden_size, HC = tc.hc_mult, V = tc.vocab_size;
  for (int64_t t = 0; t < n; ++t)
    if (tokens[std::size_t(t)] < 0 || tokens[std::size_t(t)] >= V)
      return Status::error("token " + std::to_string(tokens[std::size_t(t)]) + " at position " +
                           std::to_string(im.pos + t) + " is outside the vocabulary [0, " +
                           std::to_string(V) + ")");
  if (Status st = check_images(images, tokens, im.cfg.image_token_id, D); !st.is_ok()) return st;
  const int64_t start = im.pos, end_pos = start + n;
  const std::vector<SpanKind> kind = span_kinds(images, 0, n);
  for (int64_t t = 0; t < n; ++t)  // image positions are dead in the Engram history
    im.history.push_back(kind[std::size_t(t)] == SpanKind::kText
                             ? im.cmap[std::size_t(tokens[std::size_t(t)])]
                             : kEngramDead);
  std::vector<std::vector<T>> h(static_cast<std::size_t>(n)), pre(static_cast<std::size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    auto& ht = h[std::size_t(t)];
    ht.resize(std::size_t(HC * D));
    im.embed.row(tokens[std::size_t(t)], ht.data());
    pre[std::size_t(t)].assign(std::size_t(HC), T(0));
    pre[std::size_t(t)][0] = T(1);
  }
  // The merge: delimiters take their learned vectors, IMAGE slots the aligner's rows.
  for (const PromptImage<T>& img : images) {
    int64_t row = 0;
    for (int64_t i = 0; i < img.span(); ++i) {
      T* ht = h[std::size_t(img.start + i)].data();
      switch (kind[std::size_t(img.start + i)]) {
        case SpanKind::kImageStart:
          std::copy_n(im.image_start.begin(), D, ht);
          break;
        case SpanKind::kImageNewline:
          std::copy_n(im.image_newline.begin(), D, ht);
          break;
        case SpanKind::kImageEnd:
          std::copy_n(im.image_end.begin(), D, ht);
          break;
        default:
          std::copy_n(img.rows.begin() + (row++) * D, D, ht);
      }
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    auto& ht = h[std::size_t(t)];
    for (int64_t j = 1; j < HC; ++j) std::copy_n(ht.begin(), D, ht.begin() + j * D);
  }
  im.selections.clear();
  im.candidates.clear();
  im.taps.clear();
  const T eps = T(tc.rms_norm_eps), hc_eps = T(tc.hc_eps);
  std::vector<T> x(static_cast<std::size_t>(D)), a(static_cast<std::size_t>(D)),
      h1(std::size_t(HC * D));
  for (int l = 0; l < im.plan.num_backbone; ++l) {
    const LayerPlan& p = im.plan.layers[std::size_t(l)];
    const LayerW<T>& w = im.layers[std::size_t(l)];
    // Vendor semantics: a KV source publishes its index keys to the shared slot only in calls where
    // it produces new entries; every indexer then reads the slot (spec §5.6.7).
    if (p.is_kv_source())
      for (int64_t P = start; P < end_pos; ++P)
        if ((P + 1) % p.compress_ratio == 0) im.slot = l;
    for (int64_t t = 0; t < n; ++t) {
      T* ht = h[std::size_t(t)].data();
      const int64_t P = start + t;
      im.cur_layer = l;
      im.cur_pos = P;
      const bool image = kind[std::size_t(t)] != SpanKind::kText;
      if (p.engram >= 0 && !image) im.engram(p, w, P, ht);  // gate 0 at image positions
      if (p.dspark_target >= 0 && im.opt.dspark) im.dspark_tap(p, t, ht);
      const auto mix_a = ref::hc_mixes(ht, HC, D, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale,
                                       eps, hc_eps, tc.hc_sinkhorn_iters);
      ref::hc_collapse(ht, pre[std::size_t(t)], HC, D, x.data());
      ref::rmsnorm(x.data(), w.attn_norm.data(), D, eps, x.data());
      im.attention(p, w, x.data(), t, P, end_pos, a.data());
      ref::hc_expand(a.data(), ht, mix_a, HC, D, h1.data());
      const auto mix_f = ref::hc_mixes(h1.data(), HC, D, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale,
                                       eps, hc_eps, tc.hc_sinkhorn_iters);
      ref::hc_collapse(h1.data(), mix_a.pre, HC, D, x.data());
      ref::rmsnorm(x.data(), w.ffn_norm.data(), D, eps, x.data());
      im.moe(p, w, x.data(), a.data(), image);
      ref::hc_expand(a.data(), h1.data(), mix_f, HC, D, ht);
      pre[std::size_t(t)] = mix_f.pre;
    }
    if (im.opt.streaming)  // this layer's pages leave memory before the next layer's arrive
      for (const auto& name : im.layer_tensors[std::size_t(l)]) im.ckpt.release(name);
    if (dump) {
      dump->resize(std::size_t(im.plan.num_backbone));
      for (int64_t t = 0; t < n; ++t)
        (*dump)[std::size_t(l)].insert((*dump)[std::size_t(l)].end(), h[std::size_t(t)].begin(),
                                       h[std::size_t(t)].end());
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    ref::hc_collapse(h[std::size_t(t)].data(), pre[std::size_t(t)], HC, D, x.data());
    ref::rmsnorm(x.data(), im.norm.data(), D, eps, x.data());
    const std::size_t off = logits->size();
    logits->resize(off + std::size_t(V));
    im.lin(im.head, x.data(), logits->data() + off);
  }
  if (im.opt.dspark) im.dspark_context(start, n);
  if (im.opt.streaming) {
    im.ckpt.release("head.weight");
    im.ckpt.release("embed.weight");
  }
  im.pos = end_pos;
  return Status::ok();
}

template class ReferenceModel<float>;
template class ReferenceModel<double>;
template std::vector<SpanKind> span_kinds(const std::vector<PromptImage<float>>&, int64_t, int64_t);
template std::vector<SpanKind> span_kinds(const std::vector<PromptImage<double>>&, int64_t,
                                          int64_t);
// (These also instantiate the Impl's members defined here, which reference_dspark.cpp calls.)

}  // namespace dsv41
