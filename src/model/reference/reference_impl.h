// Internal to the reference forward: its weight bundles, per-sequence state and the Impl that
// reference_model.cpp (the backbone) and reference_dspark.cpp (the DSpark drafter) share. Not part
// of the model library's interface.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/engram_hash.h"
#include "model/reference/ref_blocks.h"
#include "model/reference/ref_ops.h"
#include "model/reference/reference_model.h"
#include "model/reference/reference_weights.h"
#include "model/tensor_names.h"

namespace dsv41 {
namespace ref {

template <typename T>
struct ExpertW {
  WeightView w1, w2, w3;
};

template <typename T>
struct LayerW {
  std::vector<T> attn_norm, ffn_norm, hc_attn_base, hc_ffn_base, hc_attn_scale, hc_ffn_scale;
  WeightView hc_attn_fn, hc_ffn_fn;
  std::vector<T> attn_sink, q_norm, kv_norm;
  WeightView wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<T> c_norm;  // compressor (KV sources)
  WeightView c_wkv, c_wgate;
  WeightView i_wk, i_wq_b, i_wproj;  // indexer
  std::vector<T> i_k_norm;
  WeightView gate;
  std::vector<T> gate_bias, gate_bias_vl;  // bias_vl: the selection bias of image positions
  std::vector<ExpertW<T>> experts;
  ExpertW<T> shared;
  WeightView e_wkv;     // Engram
  std::vector<T> e_qk;  // q_weight * k_weight, [hc, hidden]
  std::string e_table;  // tensor name of the Engram table (rows read on demand)
};

template <typename T>
struct SourceState {
  std::vector<std::vector<T>> comp;  // compressed entries (after RoPE + FP4 fake-quant)
  std::vector<std::vector<T>> keys;  // index keys (after RoPE + FP4 fake-quant)
  std::vector<std::vector<T>> part_kv, part_gate;  // the open group of a ratio > 1 compressor
};

template <typename T>
inline LayerW<T> read_layer(const ref::WeightReader& rd, const LayerPlan& p) {
  const BlockTensorNames n = block_tensor_names(p);
  auto lin = [&](const std::string& base) { return rd.mat(base + ".weight"); };
  LayerW<T> w;
  w.attn_norm = rd.template vec<T>(n.attn_norm);
  w.ffn_norm = rd.template vec<T>(n.ffn_norm);
  w.hc_attn_fn = rd.mat(n.hc_attn_fn);
  w.hc_ffn_fn = rd.mat(n.hc_ffn_fn);
  w.hc_attn_base = rd.template vec<T>(n.hc_attn_base);
  w.hc_ffn_base = rd.template vec<T>(n.hc_ffn_base);
  w.hc_attn_scale = rd.template vec<T>(n.hc_attn_scale);
  w.hc_ffn_scale = rd.template vec<T>(n.hc_ffn_scale);
  w.attn_sink = rd.template vec<T>(n.attn_sink);
  w.q_norm = rd.template vec<T>(n.q_norm);
  w.kv_norm = rd.template vec<T>(n.kv_norm);
  w.wq_a = lin(n.wq_a);
  w.wq_b = lin(n.wq_b);
  w.wkv = lin(n.wkv);
  w.wo_a = lin(n.wo_a);
  w.wo_b = lin(n.wo_b);
  if (p.is_kv_source()) {
    w.c_norm = rd.template vec<T>(n.c_norm);
    w.c_wkv = lin(n.c_wkv);
    if (p.compressor_gate) w.c_wgate = lin(n.c_wgate);
    w.i_wk = lin(n.i_wk);
    w.i_k_norm = rd.template vec<T>(n.i_k_norm);
  }
  if (p.has_indexer()) {
    w.i_wq_b = lin(n.i_wq_b);
    w.i_wproj = lin(n.i_wproj);
  }
  w.gate = lin(n.gate);
  w.gate_bias = rd.template vec<T>(n.gate_bias);
  w.gate_bias_vl = rd.template vec<T>(n.gate_bias_vl);
  for (int e = 0; e < p.n_routed_experts; ++e)
    w.experts.push_back({lin(n.expert(e, "w1")), lin(n.expert(e, "w2")), lin(n.expert(e, "w3"))});
  w.shared = {lin(n.sh_w1), lin(n.sh_w2), lin(n.sh_w3)};
  if (p.engram >= 0) {
    w.e_wkv = lin(n.e_wkv);
    const auto q = rd.template vec<T>(n.e_q), k = rd.template vec<T>(n.e_k);
    for (std::size_t i = 0; i < q.size(); ++i) w.e_qk.push_back(q[i] * k[i]);
    w.e_table = n.e_embed;
  }
  return w;
}

// The DSpark drafter's own tensors (spec §8, design.md §9): stage blocks plus stage 0's main_proj /
// main_norm and the last stage's norm, Markov head and confidence head.
template <typename T>
struct DsparkW {
  std::vector<LayerW<T>> stages;
  WeightView main_proj, markov_embed, markov_head, confidence;
  std::vector<T> main_norm, norm;
};

}  // namespace ref

template <typename T>
struct ReferenceModel<T>::Impl {
  Impl(Checkpoint c) : ckpt(std::move(c)) {}
  Checkpoint ckpt;
  ModelConfig cfg;
  ModelPlan plan;
  ReferenceOptions opt;
  std::vector<int32_t> cmap;  // token id -> Engram compressed id
  std::unique_ptr<EngramHasher> hasher;
  std::unique_ptr<ref::WeightReader> reader;
  ref::WeightView embed, head;
  std::vector<T> norm;
  std::vector<T> image_start, image_newline, image_end;  // the span's delimiter vectors [hidden]
  std::vector<ref::LayerW<T>> layers;
  ref::Rope<T> rope_swa, rope_comp;
  std::vector<std::vector<std::string>> layer_tensors;  // per backbone layer, for streaming release
  ref::DsparkW<T> dspark;  // the drafter's weights (loaded when opt.dspark)

  // Sequence state.
  int64_t pos = 0;
  std::vector<int32_t> history;
  std::vector<std::vector<std::vector<T>>> window;  // [layer][position] -> kv row
  std::map<int, ref::SourceState<T>> sources;
  int slot = -1;  // vendor semantics: the KV source whose index keys were published last
  ReferenceStats stats;
  std::vector<TraceEvent>* trace = nullptr;
  int cur_layer = 0;
  int64_t cur_pos = 0;
  // DSpark (opt.dspark): each stage's window rows made from main_x, one per consumed position
  // ([stage][position] -> row); the reference keeps them all, as it keeps the backbone's windows.
  std::vector<std::vector<std::vector<T>>> ring;

  // Fake-quantizes in place, recording the decision when tracing.
  template <typename F>
  void quant(F fn, T* x, int64_t n, TraceSite site, int64_t at, int64_t sub) {
    if (!trace) return fn(x, n, nullptr);
    ref::QuantTrace qt;
    fn(x, n, &qt);
    trace->push_back({cur_layer,
                      at,
                      site,
                      sub,
                      std::move(qt.codes),
                      std::move(qt.scaled),
                      std::move(qt.scales),
                      {}});
  }
  void record(TraceSite site, int64_t at, std::vector<int64_t> decision,
              const std::vector<T>& scores) {
    if (!trace) return;
    trace->push_back({cur_layer,
                      at,
                      site,
                      -1,
                      std::move(decision),
                      std::vector<double>(scores.begin(), scores.end()),
                      {},
                      {}});
  }

  // A linear layer; with act_quant, an FP8/FP4 weight's input is first rounded to E4M3 with a
  // power-of-two scale per 32 values, as DeepSeek's inference code does (spec §3.3; the rule is the
  // window rows' FP8 fake-quant). `act` = false for wo_a, which DeepSeek's converter dequantizes to
  // BF16 for a grouped einsum (no activation rounding there).
  void lin(const ref::WeightView& w, const T* x, T* y, int64_t r0 = 0, int64_t n = -1,
           bool act = true) {
    using K = ref::WeightView::Kind;
    if (!opt.act_quant || !act || (w.kind != K::kFP8 && w.kind != K::kFP4))
      return ref::matvec(w, x, y, r0, n);
    std::vector<T> q(x, x + w.cols);
    if (trace) {  // numbered in call order within (layer, position)
      if (aq_layer != cur_layer || aq_pos != cur_pos)
        aq_layer = cur_layer, aq_pos = cur_pos, aq_sub = 0;
      quant([](T* v, int64_t k, ref::QuantTrace* tr) { ref::fake_fp8_pow2(v, k, 32, tr); },
            q.data(), w.cols, TraceSite::kActQuant, cur_pos, aq_sub++);
      trace->back().tensor = w.name;
    } else {
      ref::fake_fp8_pow2(q.data(), w.cols, 32);
    }
    ref::matvec(w, q.data(), y, r0, n);
  }
  int aq_layer = -1;
  int64_t aq_pos = -1, aq_sub = 0;

  // Per-call state, indexed by position within the call.
  std::map<int, std::vector<std::vector<int64_t>>> selections;  // index layer -> [t] -> entries
  std::vector<std::vector<char>> candidates;                    // [t] -> mask over entries
  std::vector<std::vector<T>> taps;  // [t] -> main_hidden (DSpark target layers' mean copies)

  void engram(const LayerPlan& p, const ref::LayerW<T>& w, int64_t P, T* h);
  void attention(const LayerPlan& p, const ref::LayerW<T>& w, const T* x, int64_t t, int64_t P,
                 int64_t end_pos, T* out);
  void compressor_step(const LayerPlan& p, const ref::LayerW<T>& w, const T* x, int64_t P);
  void indexer(const LayerPlan& p, const ref::LayerW<T>& w, const T* x, const T* qr, int64_t t,
               int64_t P, int64_t end_pos);
  // `image`: the position is in an image span (experts selected with gate.bias_vl).
  void moe(const LayerPlan& p, const ref::LayerW<T>& w, const T* x, T* out, bool image = false);
  // Pieces of attention shared by the backbone and the DSpark stages: qr and the RoPE'd query;
  // a window row (kv_norm, RoPE, FP8 fake-quant); softmax over rows with the sink, inverse RoPE
  // and the grouped output projection.
  void query(const ref::LayerW<T>& w, const ref::Rope<T>& rope, const T* x, int64_t P,
             std::vector<T>* qr, std::vector<T>* q);
  std::vector<T> window_row(const ref::LayerW<T>& w, const ref::Rope<T>& rope, const T* x,
                            int64_t P);
  void attend(const ref::LayerW<T>& w, const ref::Rope<T>& rope, const std::vector<T>& q,
              const std::vector<const T*>& rows, int64_t P, T* out);
  // DSpark (reference_dspark.cpp): keep a target layer's input for main_hidden; after a call,
  // turn each position's main_hidden into every stage's window row.
  void load_dspark();
  void dspark_tap(const LayerPlan& p, int64_t t, const T* h);
  void dspark_context(int64_t start, int64_t n);
};

}  // namespace dsv41
