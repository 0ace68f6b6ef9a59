// The fast forward's attention (spec §5.6): low-rank q, the packed FP8 window row, the compressor
// of KV sources (ratio 2 with partial groups, ratio 1), packed FP4 compressed rows and index keys,
// the indexer with the layer-20 candidate pool, sort-free top-k, sparse attention with the sink
// over packed rows, inverse RoPE and the grouped output. One token at a time, in sequence order
// (a token's rows are written before any later token of its sequence reads them); the linears
// split their rows over the thread pool, the attention its heads.
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/fast/fast_internal.h"
#include "model/reference/ref_blocks.h"
#include "ops/cache_pack.h"
#include "ops/select.h"

namespace dsv41 {

using fast::SeqState;

namespace {
// Capacity grows geometrically (assign alone reallocates to the exact size each time the
// selection grows by one, i.e. on every decode step).
template <typename V>
void reserve_geometric(V& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
}
}  // namespace

void FastModel::Impl::compressor_step(const LayerPlan& p, const fast::LayerW& w, SeqState& s,
                                      int64_t P, const float* xt) {
  const TextConfig& tc = cfg.text;
  const int64_t Dh = tc.head_dim, r = p.compress_ratio, di = tc.index_head_dim;
  const int si = source_of_layer[std::size_t(p.index)];
  fast::SourceSeq& ss = s.src[std::size_t(si)];
  if (int64_t(lat.size()) < 4 * Dh) lat.resize(std::size_t(4 * Dh));
  float* latent = lat.data();
  if (r == 1) {
    linear(w.c_wkv, xt, latent);
  } else {
    float* kvp = lat.data() + Dh;
    float* g = lat.data() + 2 * Dh;
    linear(w.c_wkv, xt, kvp);
    linear(w.c_wgate, xt, g);
    const int64_t R = std::max<int64_t>(1, opt.max_rollback), slot = P % R;
    std::copy_n(kvp, Dh, ss.roll_kv.begin() + slot * Dh);
    std::copy_n(g, Dh, ss.roll_g.begin() + slot * Dh);
    if ((P + 1) % r != 0) {
      std::copy_n(kvp, Dh, ss.part_kv.begin() + ss.part_n * Dh);
      std::copy_n(g, Dh, ss.part_g.begin() + ss.part_n * Dh);
      ++ss.part_n;
      return;
    }
    DSV41_CHECK(ss.part_n == r - 1);
    // The reference's pooling (ref::compress_pool) over the open group plus this token, per
    // channel in group order.
    for (int64_t c = 0; c < Dh; ++c) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t m = 0; m < r; ++m)
        mx = std::max(mx, m < r - 1 ? ss.part_g[std::size_t(m * Dh + c)] : g[c]);
      float den = 0, num = 0;
      for (int64_t m = 0; m < r; ++m) {
        const float gk = m < r - 1 ? ss.part_g[std::size_t(m * Dh + c)] : g[c];
        const float vk = m < r - 1 ? ss.part_kv[std::size_t(m * Dh + c)] : kvp[c];
        const float e = std::exp(gk - mx);
        den += e;
        num += e * vk;
      }
      latent[c] = num / den;
    }
    ss.part_n = 0;
  }
  kern->rmsnorm(latent, w.c_norm.data(), Dh, float(tc.rms_norm_eps), latent);
  const int64_t j = P / r, entry_pos = j * r;
  // Index key from the pre-RoPE latent; then the latent itself is rotated and packed (FP4).
  float* key = lat.data() + 3 * Dh;
  linear(w.i_wk, latent, key);
  kern->rmsnorm(key, w.i_k_norm.data(), di, float(tc.rms_norm_eps), key);
  rope_table(rope_comp, entry_pos);
  kern->rope(key, di, rope_comp.dim, cosb.data(), sinb.data(), false);
  RowTag* tag;
  uint8_t* kr = comp_row(s, si, j, true, &tag);
  kern->pack_index_key(key, di, kr);
  *tag = RowTag{s.tag, global_block(s, entry_pos).epoch, int32_t(entry_pos)};
  kern->rope(latent, Dh, rope_comp.dim, cosb.data(), sinb.data(), false);
  uint8_t* cr = comp_row(s, si, j, false, &tag);
  kern->pack_compressed_row(latent, Dh, cr);
  *tag = RowTag{s.tag, global_block(s, entry_pos).epoch, int32_t(entry_pos)};
}

void FastModel::Impl::indexer(const LayerPlan& p, const fast::LayerW& w, int64_t t, const float* xt,
                              const float* qr_in) {
  const TextConfig& tc = cfg.text;
  const fast::TokenRow& row = rows[std::size_t(t)];
  SeqState& s = *row.seq;
  const int64_t P = row.pos, r = p.compress_ratio, nvis = (P + 1) / r;
  const int64_t nh = tc.index_n_heads, di = tc.index_head_dim;
  auto& out = sel[std::size_t(t)];
  out.clear();
  if (nvis == 0) return;  // nothing visible yet: the indexer is skipped
  int owner_layer = p.kv_source;
  if (opt.index_keys == IndexKeySemantics::kVendor && s.vendor_slot >= 0)
    owner_layer = s.vendor_slot;
  const int src = source_of_layer[std::size_t(owner_layer)];
  const KvLayout::Source& so = kv->layout().sources[std::size_t(src)];
  // Queries: wq_b . qr, RoPE at P, each head packed as an index-key row (the fake FP4 of the
  // reference, bit for bit).
  if (int64_t(iq.size()) < nh * di) iq.resize(std::size_t(nh * di));
  linear(w.i_wq_b, qr_in, iq.data());
  rope_table(rope_comp, P);
  const int64_t kb = ops::index_key_bytes(di);
  if (int64_t(qpack.size()) < nh * kb) qpack.resize(std::size_t(nh * kb));
  for (int64_t hh = 0; hh < nh; ++hh) {
    kern->rope(iq.data() + hh * di, di, rope_comp.dim, cosb.data(), sinb.data(), false);
    kern->pack_index_key(iq.data() + hh * di, di, qpack.data() + hh * kb);
  }
  if (int64_t(tmp2.size()) < nh) tmp2.resize(std::size_t(nh));
  linear(w.i_wproj, xt, tmp2.data());
  const float wscale = float(1.0 / std::sqrt(double(di)) / std::sqrt(double(nh)));
  for (int64_t hh = 0; hh < nh; ++hh) tmp2[std::size_t(hh)] *= wscale;
  const float ninf = -std::numeric_limits<float>::infinity();
  // Scores over the visible keys, one contiguous span per global block.
  if (int64_t(scores.size()) < nvis) scores.resize(std::size_t(nvis));
  const int64_t per = so.entries;
  for (int64_t j0 = 0; j0 < nvis; j0 += per - (j0 % per)) {
    const int64_t j1 = std::min(nvis, j0 - j0 % per + per);
    bool ok = true;
    for (int64_t j = j0; j < j1; ++j) ok &= read_comp_row(s, src, j, true) != nullptr;
    const uint8_t* keys = ok ? read_comp_row(s, src, j0, true) : nullptr;
    if (!keys) {  // masked (foreign) keys score nothing
      std::fill(scores.begin() + j0, scores.begin() + j1, ninf);
      continue;
    }
    kern->indexer_scores(qpack.data(), tmp2.data(), nh, di, keys, j1 - j0, scores.data() + j0);
  }
  if (p.candidate_source) {  // publish the block pool for this query (spec §5.6.3)
    // Block score = max over its entries; the block of the newest visible entry pinned to +inf;
    // the best candidate_topk_blocks blocks with a score above -inf are kept (ties: lower block,
    // as ref::candidate_pool).
    const int64_t bs = tc.candidate_block_size, nb = (nvis + bs - 1) / bs;
    if (int64_t(bscore.size()) < nb) bscore.resize(std::size_t(nb));
    for (int64_t b = 0; b < nb; ++b) {
      float m = ninf;
      for (int64_t j = b * bs; j < std::min(nvis, (b + 1) * bs); ++j)
        m = std::max(m, scores[std::size_t(j)]);
      bscore[std::size_t(b)] = m;
    }
    bscore[std::size_t(nb - 1)] = std::numeric_limits<float>::infinity();
    const int64_t kb2 = std::min<int64_t>(tc.candidate_topk_blocks, nb);
    if (int64_t(topk_out.size()) < kb2) topk_out.resize(std::size_t(kb2));
    const int64_t got = ops::topk_threshold(bscore.data(), nb, kb2, topk_out.data());
    auto& c = cand[std::size_t(t)];
    reserve_geometric(c, std::size_t(nvis));
    c.assign(std::size_t(nvis), 0);
    for (int64_t i = 0; i < got; ++i) {
      const int64_t b = topk_out[std::size_t(i)];
      if (!(bscore[std::size_t(b)] > ninf)) continue;
      for (int64_t j = b * bs; j < std::min(nvis, (b + 1) * bs); ++j) c[std::size_t(j)] = 1;
    }
  }
  if (p.candidate_filter >= 0) {
    const auto& mask = cand[std::size_t(t)];
    for (int64_t j = 0; j < nvis; ++j)
      if (j >= int64_t(mask.size()) || !mask[std::size_t(j)]) scores[std::size_t(j)] = ninf;
  }
  // Top-k of the visible scores (ties: lower entry), which is the reference's selection: entries
  // not yet visible score -inf and sort after every visible one, so they are never kept.
  const int64_t kk = std::min<int64_t>(tc.index_topk, nvis);
  if (int64_t(topk_out.size()) < kk) topk_out.resize(std::size_t(kk));
  const int64_t got = ops::topk_threshold(scores.data(), nvis, kk, topk_out.data());
  reserve_geometric(out, std::size_t(got));
  out.assign(topk_out.begin(), topk_out.begin() + got);
}

void FastModel::Impl::attention(const LayerPlan& p, const fast::LayerW& w, int64_t t,
                                const float* xt, float* out) {
  const TextConfig& tc = cfg.text;
  const fast::TokenRow& row = rows[std::size_t(t)];
  SeqState& s = *row.seq;
  const int64_t P = row.pos, H = tc.num_attention_heads, Dh = tc.head_dim;
  const float eps = float(tc.rms_norm_eps);
  const ref::Rope<float>& rope = p.compress_ratio > 0 ? rope_comp : rope_swa;
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(std::size_t(n));
  };
  grow(qr, tc.q_lora_rank);
  grow(att_o, H * Dh);
  grow(kvrow, Dh);
  grow(ubuf, tc.o_groups * tc.o_lora_rank);
  linear(w.wq_a, xt, qr.data());
  kern->rmsnorm(qr.data(), w.q_norm.data(), tc.q_lora_rank, eps, qr.data());
  // q lives in `o` until the attention reads it (its heads are then overwritten in place by
  // their outputs: each head reads only its own query).
  std::vector<float>& qh = tmp;
  grow(qh, H * Dh);
  linear(w.wq_b, qr.data(), qh.data());
  rope_table(rope, P);
  for (int64_t hh = 0; hh < H; ++hh)
    kern->rope(qh.data() + hh * Dh, Dh, rope.dim, cosb.data(), sinb.data(), false);
  linear(w.wkv, xt, kvrow.data());
  kern->rmsnorm(kvrow.data(), w.kv_norm.data(), Dh, eps, kvrow.data());
  kern->rope(kvrow.data(), Dh, rope.dim, cosb.data(), sinb.data(), false);
  RowTag* tag;
  uint8_t* wr = window_row(s, p.index, P, &tag);
  kern->pack_window_row(kvrow.data(), Dh, wr);
  *tag = RowTag{s.tag, window_block(s, P).epoch, int32_t(P)};

  att_rows.clear();
  att_kinds.clear();
  for (int64_t k0 = std::max<int64_t>(0, P - tc.sliding_window + 1); k0 <= P; ++k0)
    if (const uint8_t* rr = read_window_row(s, p.index, k0)) {
      att_rows.push_back(rr);
      att_kinds.push_back(0);
    }
  if (p.compress_ratio > 0) {
    if (p.is_kv_source()) compressor_step(p, w, s, P, xt);
    if (p.has_indexer()) indexer(p, w, t, xt, qr.data());
    const int src = source_of_layer[std::size_t(p.kv_source)];
    for (int64_t j : sel[std::size_t(t)])
      if (const uint8_t* rr = read_comp_row(s, src, j, false)) {
        att_rows.push_back(rr);
        att_kinds.push_back(1);
      }
  }
  const float scale = float(1.0 / std::sqrt(double(Dh)));
  const int64_t nrows = int64_t(att_rows.size());
  auto heads = [&](int64_t h0, int64_t hend) {
    kern->sparse_attention(qh.data() + h0 * Dh, hend - h0, Dh, att_rows.data(), att_kinds.data(),
                           nrows, scale, w.attn_sink + h0, att_o.data() + h0 * Dh);
  };
  par_rows(H, 1, std::ref(heads));
  rope_table(rope, P);
  for (int64_t hh = 0; hh < H; ++hh)
    kern->rope(att_o.data() + hh * Dh, Dh, rope.dim, cosb.data(), sinb.data(), true);
  // Grouped low-rank output: group g (heads g*H/G ..) through rows [g*R, (g+1)*R) of wo_a.
  const int64_t G = tc.o_groups, R = tc.o_lora_rank, gin = H * Dh / G;
  linear_count(w.wo_a);
  for (int64_t g = 0; g < G; ++g) {
    Linear part = w.wo_a;
    part.stamp = stats.steps;  // counted whole above
    part.out = R;
    if (part.quantized()) {
      part.w += g * R * part.in;
      part.scale += (g * R / 32) * ((part.in + 31) / 32);
    } else {
      part.w += g * R * part.in * 2;
    }
    linear(part, att_o.data() + g * gin, ubuf.data() + g * R);
  }
  linear(w.wo_b, ubuf.data(), out);
}

}  // namespace dsv41
