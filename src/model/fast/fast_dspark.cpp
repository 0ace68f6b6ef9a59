// The fast forward's DSpark drafter (spec §8; design.md §9 is the contract the reference follows):
// binding the stages and heads, the stages' window rows written by every step (main_hidden ->
// main_x -> each stage's packed FP8 row in the pool, beside the backbone's window rows, so
// truncate, prefix caching and preemption treat them like any window row), and draft(): the block
// [next, noise, ...] of each queried sequence through the stages with the step's kernels, the
// target's head, the Markov bias along the greedy chain and the confidence head. A draft writes no
// pool row and no sequence state; each query's arithmetic is its own (batch-invariant).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/fast/fast_internal.h"
#include "model/tensor_names.h"
#include "ops/cache_pack.h"

namespace dsv41 {

void FastModel::Impl::bind_dspark() {
  const TextConfig& tc = cfg.text;
  const DsparkTensorNames n = dspark_tensor_names(plan);
  const fast::Binder b{*wts};
  dspark.main_proj = b.lin(n.main_proj);
  dspark.main_norm = b.vec(n.main_norm);
  dspark.norm = b.vec(n.norm);
  dspark.confidence = b.vec(n.confidence);  // BF16 or F32
  // The Markov head's [vocab, rank] matrix goes through the BF16 GEMV like any linear (a BF16
  // checkpoint tensor: no activation rounding); its embedding is read row by row.
  dspark.markov_head = b.lin(n.markov_head);
  dspark.markov_head.act = false;
  const WeightSpan& e = wts->get(n.markov_embed);
  DSV41_CHECK_MSG(e.dtype == DType::kBF16, n.markov_embed.c_str());  // as the inventory has it
  dspark.markov_embed = reinterpret_cast<const uint16_t*>(e.data);
  dspark.target_slot.assign(std::size_t(plan.num_backbone), -1);
  std::vector<int64_t> ids = tc.dspark_target_layer_ids;
  std::sort(ids.begin(), ids.end());  // main_hidden concatenates in ascending layer order
  for (std::size_t i = 0; i < ids.size(); ++i) dspark.target_slot[std::size_t(ids[i])] = int64_t(i);
}

void FastModel::Impl::dspark_rows(int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, Dh = tc.head_dim;
  const int64_t NT = int64_t(tc.dspark_target_layer_ids.size());
  const float eps = float(tc.rms_norm_eps);
  if (int64_t(main_x.size()) < kChunk * D) main_x.resize(std::size_t(kChunk * D));
  if (int64_t(kvrow.size()) < kChunk * Dh) kvrow.resize(std::size_t(kChunk * Dh));
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t cn = std::min(kChunk, n - c0);
    linear_batch(dspark.main_proj, main_hidden.data() + c0 * NT * D, cn, main_x.data());
    for (int64_t t = 0; t < cn; ++t)
      kern->rmsnorm(main_x.data() + t * D, dspark.main_norm.data(), D, eps, main_x.data() + t * D);
    for (std::size_t s = 0; s < dspark.stages.size(); ++s) {
      const fast::LayerW& w = dspark.stages[s];
      const int layer = plan.num_backbone + int(s);
      linear_batch(w.wkv, main_x.data(), cn, kvrow.data());
      for (int64_t t = 0; t < cn; ++t) {
        const fast::TokenRow& row = rows[std::size_t(c0 + t)];
        float* kvt = kvrow.data() + t * Dh;
        window_row_values(w, rope_swa, row.pos, kvt);
        store_window_row(*row.seq, layer, row.pos, kvt);
      }
    }
  }
}

void FastModel::Impl::dspark_attention(const LayerPlan& p, const fast::LayerW& w, int64_t t0,
                                       int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim, D = tc.hidden_size;
  const int64_t rb = ops::window_row_bytes(Dh);
  if (int64_t(kvrow.size()) < n * Dh) kvrow.resize(std::size_t(n * Dh));
  if (int64_t(block_rows.size()) < n * rb) block_rows.resize(std::size_t(n * rb));
  attention_queries(w, rope_swa, t0, n);
  // The block's own rows: KV norm, RoPE, FP8 as a window row, kept in scratch only.
  linear_batch(w.wkv, xs.data() + t0 * D, n, kvrow.data());
  for (int64_t t = 0; t < n; ++t) {
    float* kvt = kvrow.data() + t * Dh;
    window_row_values(w, rope_swa, rows[std::size_t(t0 + t)].pos, kvt);
    kern->pack_window_row(kvt, Dh, block_rows.data() + t * rb);
  }
  // Every query of the block: the stage's rows of the last `window` consumed positions, then the
  // whole block.
  const fast::SeqState& s = *rows[std::size_t(t0)].seq;
  const int64_t P0 = rows[std::size_t(t0)].pos;  // = the sequence's length
  att_rows.clear();
  att_kinds.clear();
  for (int64_t k = std::max<int64_t>(window_floor(s, p.index), P0 - tc.sliding_window); k < P0; ++k)
    if (const uint8_t* rr = read_window_row(s, p.index, k)) {
      att_rows.push_back(rr);
      att_kinds.push_back(0);
    }
  for (int64_t t = 0; t < n; ++t) {
    att_rows.push_back(block_rows.data() + t * rb);
    att_kinds.push_back(0);
  }
  for (int64_t t = 0; t < n; ++t)
    attend_query(w, rope_swa, rows[std::size_t(t0 + t)].pos, tmp.data() + t * H * Dh);
  attention_output(w, t0, n);
}

int64_t FastModel::draft_block_size() const {
  return impl_->opt.dspark ? impl_->cfg.text.dspark_block_size : 0;
}

Status FastModel::draft(const std::vector<DraftQuery>& queries, std::vector<DraftResult>* out) {
  Impl& im = *impl_;
  const TextConfig& tc = im.cfg.text;
  if (!im.opt.dspark) return Status::error("draft: the model was loaded without its drafter");
  ++im.count_epoch;  // its weights count apart from the step's (FastStats::weight_bytes)
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, V = tc.vocab_size;
  const int64_t B = tc.dspark_block_size, R = tc.dspark_markov_rank;
  im.rows.clear();
  for (std::size_t qi = 0; qi < queries.size(); ++qi) {
    const DraftQuery& q = queries[qi];
    auto it = im.seqs.find(q.seq);
    if (it == im.seqs.end() || it->second->len < 1)
      return Status::error("draft: query " + std::to_string(qi) + ": sequence " +
                           std::to_string(q.seq) + " is not open or has consumed no token");
    if (q.next < 0 || q.next >= V)
      return Status::error("draft: query " + std::to_string(qi) + ": token " +
                           std::to_string(q.next) + " is outside the vocabulary");
    for (std::size_t j = 0; j < qi; ++j)
      if (queries[j].seq == q.seq)
        return Status::error("draft: sequence " + std::to_string(q.seq) + " queried twice");
    for (int64_t b = 0; b < B; ++b)
      im.rows.push_back({it->second.get(), it->second->len + b,
                         b == 0 ? q.next : int32_t(tc.dspark_noise_token_id), int(qi), int(b)});
  }
  const int64_t n = int64_t(im.rows.size());
  im.embed_rows();
  const float eps = float(tc.rms_norm_eps);
  const ops::Kernels& kk = *im.kern;
  for (std::size_t si = 0; si < im.dspark.stages.size(); ++si) {
    const LayerPlan& p = im.plan.stage(int(si));
    const fast::LayerW& w = im.dspark.stages[si];
    for (int64_t t = 0; t < n; ++t) im.mhc_attention_input(w, t);
    for (int64_t t0 = 0; t0 < n; t0 += B) im.dspark_attention(p, w, t0, B);  // one block each
    for (int64_t t = 0; t < n; ++t) im.mhc_ffn_input(w, t);
    im.moe(p, w, n);
    for (int64_t t = 0; t < n; ++t) im.mhc_ffn_output(t);
  }
  auto grow = [](std::vector<float>& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  // The head on every block row (x before the norm kept for the confidence), then per query the
  // Markov bias and the argmax, row after row (row j's bias reads the draft of row j - 1).
  out->resize(queries.size());
  grow(im.draft_x, n * (D + R));
  grow(im.gx, Impl::kChunk * D);
  grow(im.gy, std::max<int64_t>(Impl::kChunk * V, V));
  for (std::size_t qi = 0; qi < queries.size(); ++qi) {
    DraftResult& r = (*out)[qi];
    r.logits.resize(std::size_t(B * V));
    r.ids.assign(std::size_t(B + 1), queries[qi].next);
    r.confidence.assign(std::size_t(B), 0.0f);
  }
  for (int64_t c0 = 0; c0 < n; c0 += Impl::kChunk) {
    const int64_t cn = std::min(Impl::kChunk, n - c0);
    for (int64_t t = c0; t < c0 + cn; ++t) {
      const float* ht = im.hs.data() + t * HC * D;
      const float* pw = im.pre.data() + t * HC;
      float* x = im.draft_x.data() + t * (D + R);
      for (int64_t i = 0; i < D; ++i) {  // the collapse in copy order (the reference's)
        float s = 0;
        for (int64_t j = 0; j < HC; ++j) s += pw[j] * ht[j * D + i];
        x[i] = s;
      }
      kk.hc_collapse_rmsnorm(ht, pw, HC, D, im.dspark.norm.data(), eps,
                             im.gx.data() + (t - c0) * D);
    }
    im.linear_batch(im.head, im.gx.data(), cn, im.gy.data());
    for (int64_t t = c0; t < c0 + cn; ++t) {
      const fast::TokenRow& row = im.rows[std::size_t(t)];
      std::copy_n(im.gy.data() + (t - c0) * V, V,
                  (*out)[std::size_t(row.slice)].logits.data() + row.row_in_slice * V);
    }
  }
  for (std::size_t qi = 0; qi < queries.size(); ++qi) {
    DraftResult& r = (*out)[qi];
    for (int64_t j = 0; j < B; ++j) {
      float* x = im.draft_x.data() + (int64_t(qi) * B + j) * (D + R);
      const uint16_t* e = im.dspark.markov_embed + int64_t(r.ids[std::size_t(j)]) * R;
      for (int64_t k = 0; k < R; ++k) x[D + k] = bf16_to_float(e[k]);
      im.linear(im.dspark.markov_head, x + D, im.gy.data());
      float* row = r.logits.data() + j * V;
      int64_t best = 0;
      for (int64_t v = 0; v < V; ++v) {
        row[v] += im.gy[std::size_t(v)];
        if (row[v] > row[best]) best = v;  // ties: the lowest id
      }
      r.ids[std::size_t(j + 1)] = int32_t(best);
      float c = 0;
      for (int64_t k = 0; k < D + R; ++k) c += im.dspark.confidence[std::size_t(k)] * x[k];
      r.confidence[std::size_t(j)] = c;
    }
  }
  return Status::ok();
}

}  // namespace dsv41
