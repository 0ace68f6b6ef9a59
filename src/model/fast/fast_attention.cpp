// The fast forward's attention (spec §5.6): low-rank q, the packed FP8 window row, the compressor
// of KV sources (ratio 2 with partial groups, ratio 1), packed FP4 compressed rows and index keys,
// the indexer with the layer-20 candidate pool, sort-free top-k, sparse attention with the sink
// over packed rows, inverse RoPE and the grouped output. The step's tokens go in chunks: the
// chunk's projections through the batch kernels (each token's bits those of a one-token call),
// its window rows and compressor entries written in token order, then each token's indexer and
// attention (it reads only positions up to its own); the linears split their rows over the
// thread pool, the attention its heads.
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/fast/fast_internal.h"
#include "model/reference/ref_blocks.h"
#include "ops/cache_pack.h"
#include "ops/select.h"

namespace dsv41 {

using fast::SeqState;

void FastModel::Impl::compressor_step(const LayerPlan& p, const fast::LayerW& w, SeqState& s,
                                      int64_t P, const float* kvp, const float* g) {
  const TextConfig& tc = cfg.text;
  const int64_t Dh = tc.head_dim, r = p.compress_ratio, di = tc.index_head_dim;
  const int si = source_of_layer[std::size_t(p.index)];
  fast::SourceSeq& ss = s.src[std::size_t(si)];
  if (int64_t(lat.size()) < 2 * Dh) lat.resize(std::size_t(2 * Dh));
  float* latent = lat.data();
  if (r == 1) {
    std::copy_n(kvp, Dh, latent);
  } else {
    const int64_t R = std::max<int64_t>(1, opt.max_rollback), slot = P % R;
    std::copy_n(kvp, Dh, ss.roll_kv.begin() + slot * Dh);
    std::copy_n(g, Dh, ss.roll_g.begin() + slot * Dh);
    ss.roll_pos[std::size_t(slot)] = P;
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
  float* key = lat.data() + Dh;
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

void FastModel::Impl::indexer(const LayerPlan& p, int64_t t, float* qi, float* wq) {
  const int64_t kb = ops::index_key_bytes(cfg.text.index_head_dim);
  if (int64_t(qpack.size()) < cfg.text.index_n_heads * kb)
    qpack.resize(std::size_t(cfg.text.index_n_heads * kb));
  const int64_t nvis = indexer_prep(p, t, qi, wq, qpack.data());
  if (int64_t(scores.size()) < nvis) scores.resize(std::size_t(nvis));
  indexer_span_scores(p, t, qpack.data(), wq, 0, nvis, scores.data());
  indexer_select(p, t, nvis, scores.data());
}

int64_t FastModel::Impl::indexer_prep(const LayerPlan& p, int64_t t, float* qi, float* wq,
                                      uint8_t* qp) {
  const TextConfig& tc = cfg.text;
  const int64_t P = rows[std::size_t(t)].pos, nvis = (P + 1) / p.compress_ratio;
  const int64_t nh = tc.index_n_heads, di = tc.index_head_dim;
  if (nvis == 0) return 0;  // nothing visible yet: the indexer is skipped
  // Queries (wq_b . qr, computed for the chunk), RoPE at P, each head packed as an index-key row
  // (the fake FP4 of the reference, bit for bit).
  rope_table(rope_comp, P);
  const int64_t kb = ops::index_key_bytes(di);
  for (int64_t hh = 0; hh < nh; ++hh) {
    kern->rope(qi + hh * di, di, rope_comp.dim, cosb.data(), sinb.data(), false);
    kern->pack_index_key(qi + hh * di, di, qp + hh * kb);
  }
  const float wscale = float(1.0 / std::sqrt(double(di)) / std::sqrt(double(nh)));
  for (int64_t hh = 0; hh < nh; ++hh) wq[hh] *= wscale;
  return nvis;
}

int FastModel::Impl::index_source(const LayerPlan& p, const SeqState& s) const {
  int owner_layer = p.kv_source;
  if (opt.index_keys == IndexKeySemantics::kVendor && s.vendor_slot >= 0)
    owner_layer = s.vendor_slot;
  return source_of_layer[std::size_t(owner_layer)];
}

void FastModel::Impl::indexer_span_scores(const LayerPlan& p, int64_t t, const uint8_t* qp,
                                          const float* wq, int64_t j0, int64_t j1,
                                          float* sc) const {
  const TextConfig& tc = cfg.text;
  const SeqState& s = *rows[std::size_t(t)].seq;
  const int src = index_source(p, s);
  const int64_t per = kv->layout().sources[std::size_t(src)].entries;
  const float ninf = -std::numeric_limits<float>::infinity();
  // One contiguous span per global block.
  for (int64_t a = j0; a < j1; a += per - (a % per)) {
    const int64_t b = std::min(j1, a - a % per + per);
    bool ok = true;
    for (int64_t j = a; j < b; ++j) ok &= read_comp_row(s, src, j, true) != nullptr;
    const uint8_t* keys = ok ? read_comp_row(s, src, a, true) : nullptr;
    if (!keys) {  // masked (foreign) keys score nothing
      std::fill(sc + a, sc + b, ninf);
      continue;
    }
    kern->indexer_scores(qp, wq, tc.index_n_heads, tc.index_head_dim, keys, b - a, sc + a);
  }
}

void FastModel::Impl::indexer_run(const LayerPlan& p, int64_t t0, int64_t a, int64_t b) {
  const TextConfig& tc = cfg.text;
  const int64_t nh = tc.index_n_heads, di = tc.index_head_dim, kb = ops::index_key_bytes(di);
  // Groups of queries bound the scores' scratch (group x visible keys floats); tiles of whole
  // global blocks of keys (about 256 entries) are the GEMM's tiles, read once per group from
  // cache. Whole blocks: each kernel call covers the span the one-query path's call covers.
  constexpr int64_t kGroup = 64;
  const int64_t per =
      kv->layout().sources[std::size_t(index_source(p, *rows[std::size_t(t0 + a)].seq))].entries;
  const int64_t kKeyTile = per * std::max<int64_t>(1, 256 / per);
  for (int64_t q0 = a; q0 < b; q0 += kGroup) {
    const int64_t q1 = std::min(b, q0 + kGroup), ng = q1 - q0;
    if (int64_t(run_qpack.size()) < ng * nh * kb) run_qpack.resize(std::size_t(ng * nh * kb));
    run_nvis.resize(std::size_t(ng));  // capacity kept
    int64_t maxvis = 0;
    for (int64_t i = 0; i < ng; ++i) {  // serial: RoPE tables are shared scratch
      const int64_t t = q0 + i;
      run_nvis[std::size_t(i)] = indexer_prep(p, t0 + t, iq.data() + t * nh * di,
                                              tmp2.data() + t * nh, run_qpack.data() + i * nh * kb);
      maxvis = std::max(maxvis, run_nvis[std::size_t(i)]);
    }
    if (int64_t(run_scores.size()) < ng * maxvis) run_scores.resize(std::size_t(ng * maxvis));
    pool->parallel_for(std::size_t(ng), [&](std::size_t i0, std::size_t i1, std::size_t) {
      for (int64_t k0 = 0; k0 < maxvis; k0 += kKeyTile)
        for (std::size_t i = i0; i < i1; ++i) {
          const int64_t k1 = std::min(run_nvis[i], k0 + kKeyTile);
          if (k1 <= k0) continue;
          const int64_t t = q0 + int64_t(i);
          indexer_span_scores(p, t0 + t, run_qpack.data() + int64_t(i) * nh * kb,
                              tmp2.data() + t * nh, k0, k1,
                              run_scores.data() + int64_t(i) * maxvis);
        }
    });
    for (int64_t i = 0; i < ng; ++i)
      indexer_select(p, t0 + q0 + i, run_nvis[std::size_t(i)], run_scores.data() + i * maxvis);
  }
}

void FastModel::Impl::indexer_select(const LayerPlan& p, int64_t t, int64_t nvis, float* sc) {
  const TextConfig& tc = cfg.text;
  auto& out = sel[std::size_t(t)];
  out.clear();
  if (nvis == 0) return;
  const float ninf = -std::numeric_limits<float>::infinity();
  if (p.candidate_source) {  // publish the block pool for this query (spec §5.6.3)
    // Block score = max over its entries; the block of the newest visible entry pinned to +inf;
    // the best candidate_topk_blocks blocks with a score above -inf are kept (ties: lower block,
    // as ref::candidate_pool).
    const int64_t bs = tc.candidate_block_size, nb = (nvis + bs - 1) / bs;
    if (int64_t(bscore.size()) < nb) bscore.resize(std::size_t(nb));
    for (int64_t b = 0; b < nb; ++b) {
      float m = ninf;
      for (int64_t j = b * bs; j < std::min(nvis, (b + 1) * bs); ++j)
        m = std::max(m, sc[std::size_t(j)]);
      bscore[std::size_t(b)] = m;
    }
    bscore[std::size_t(nb - 1)] = std::numeric_limits<float>::infinity();
    const int64_t kb2 = std::min<int64_t>(tc.candidate_topk_blocks, nb);
    if (int64_t(topk_out.size()) < kb2) topk_out.resize(std::size_t(kb2));
    const int64_t got = ops::topk_threshold(bscore.data(), nb, kb2, topk_out.data());
    auto& c = cand[std::size_t(t)];
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
      if (j >= int64_t(mask.size()) || !mask[std::size_t(j)]) sc[std::size_t(j)] = ninf;
  }
  // Top-k of the visible scores (ties: lower entry), which is the reference's selection: entries
  // not yet visible score -inf and sort after every visible one, so they are never kept.
  const int64_t kk = std::min<int64_t>(tc.index_topk, nvis);
  if (int64_t(topk_out.size()) < kk) topk_out.resize(std::size_t(kk));
  const int64_t got = ops::topk_threshold(sc, nvis, kk, topk_out.data());
  out.assign(topk_out.begin(), topk_out.begin() + got);
}

void FastModel::Impl::attention_queries(const fast::LayerW& w, const ref::Rope<float>& rope,
                                        int64_t t0, int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim, D = tc.hidden_size;
  const int64_t QL = tc.q_lora_rank;
  if (int64_t(qr.size()) < n * QL) qr.resize(std::size_t(n * QL));
  if (int64_t(tmp.size()) < n * H * Dh) tmp.resize(std::size_t(n * H * Dh));
  linear_batch(w.wq_a, xs.data() + t0 * D, n, qr.data());
  for (int64_t t = 0; t < n; ++t)
    kern->rmsnorm(qr.data() + t * QL, w.q_norm.data(), QL, float(tc.rms_norm_eps),
                  qr.data() + t * QL);
  if (h1 - h0 == H) {
    linear_batch(w.wq_b, qr.data(), n, tmp.data());
  } else if (h1 > h0) {  // this process's heads only, placed at their offsets of tmp
    const int64_t own = (h1 - h0) * Dh;
    if (int64_t(att_o.size()) < n * own) att_o.resize(std::size_t(n * own));
    linear_batch(w.wq_b_own, qr.data(), n, att_o.data());
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(att_o.data() + t * own, own, tmp.data() + t * H * Dh + h0 * Dh);
  }
  for (int64_t t = 0; t < n; ++t) {
    rope_table(rope, rows[std::size_t(t0 + t)].pos);
    for (int64_t hh = h0; hh < h1; ++hh)
      kern->rope(tmp.data() + (t * H + hh) * Dh, Dh, rope.dim, cosb.data(), sinb.data(), false);
  }
}

void FastModel::Impl::attention_output(const fast::LayerW& w, int64_t t0, int64_t n) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim, D = tc.hidden_size;
  const int64_t G = tc.o_groups, R = tc.o_lora_rank, gin = H * Dh / G;
  if (int64_t(ubuf.size()) < n * G * R) ubuf.resize(std::size_t(n * G * R));
  if (int64_t(att_o.size()) < n * (gin + R)) att_o.resize(std::size_t(n * (gin + R)));
  // Grouped low-rank output: group g (heads g*H/G ..) through rows [g*R, (g+1)*R) of wo_a, the
  // chunk's group inputs gathered contiguous.
  linear_count(w.wo_a_own);
  float* gin_x = att_o.data();
  float* gin_y = att_o.data() + n * gin;
  // Split over processes: each fills its own groups' columns, the others' stay 0 until the sum
  // over processes (exact: one non-zero term per element); then wo_b on every process.
  const bool split = opt.tp_parts > 1;
  if (split) std::fill_n(ubuf.data(), n * G * R, 0.0f);
  for (int64_t g = g0; g < g1; ++g) {
    Linear part = w.wo_a;
    part.stamp = count_epoch;  // counted whole above
    part.out = R;
    if (part.quantized()) {
      part.w += g * R * part.in;
      part.scale += (g * R / 32) * ((part.in + 31) / 32);
    } else {
      part.w += g * R * part.in * 2;
    }
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(tmp.data() + t * H * Dh + g * gin, gin, gin_x + t * gin);
    linear_batch(part, gin_x, n, gin_y);
    for (int64_t t = 0; t < n; ++t) std::copy_n(gin_y + t * R, R, ubuf.data() + t * G * R + g * R);
  }
  if (split) reduce(ubuf.data(), n * G * R);
  linear_batch(w.wo_b, ubuf.data(), n, ys.data() + t0 * D);
}

void FastModel::Impl::window_row_values(const fast::LayerW& w, const ref::Rope<float>& rope,
                                        int64_t pos, float* kvt) {
  const int64_t Dh = cfg.text.head_dim;
  kern->rmsnorm(kvt, w.kv_norm.data(), Dh, float(cfg.text.rms_norm_eps), kvt);
  rope_table(rope, pos);
  kern->rope(kvt, Dh, rope.dim, cosb.data(), sinb.data(), false);
}

void FastModel::Impl::store_window_row(SeqState& s, int layer, int64_t pos, const float* kvt) {
  RowTag* tag;
  uint8_t* wr = window_row(s, layer, pos, &tag);
  kern->pack_window_row(kvt, cfg.text.head_dim, wr);
  *tag = RowTag{s.tag, window_block(s, pos).epoch, int32_t(pos)};
}

void FastModel::Impl::attend_query(const fast::LayerW& w, const ref::Rope<float>& rope, int64_t pos,
                                   float* q) {
  const int64_t H = cfg.text.num_attention_heads, Dh = cfg.text.head_dim;
  const int64_t nrows = int64_t(att_rows.size());
  const float scale = float(1.0 / std::sqrt(double(Dh)));
  if (int64_t(att_o.size()) < H * Dh) att_o.resize(std::size_t(H * Dh));
  // This process's heads [h0, h1) (all of them in one process), split over the thread pool by
  // heads, which changes no head's arithmetic.
  auto heads = [&](int64_t a, int64_t b) {
    const int64_t hs0 = h0 + a, hend = h0 + b;
    // Output over the query of the same heads: each head reads only its own query first.
    kern->sparse_attention(q + hs0 * Dh, hend - hs0, Dh, att_rows.data(), att_kinds.data(), nrows,
                           scale, w.attn_sink + hs0, att_o.data() + hs0 * Dh);
    std::copy_n(att_o.data() + hs0 * Dh, (hend - hs0) * Dh, q + hs0 * Dh);
  };
  if (h1 > h0) par_rows(h1 - h0, 1, std::ref(heads));
  rope_table(rope, pos);
  for (int64_t hh = h0; hh < h1; ++hh)
    kern->rope(q + hh * Dh, Dh, rope.dim, cosb.data(), sinb.data(), true);
}

void FastModel::Impl::attention_chunk(const LayerPlan& p, const fast::LayerW& w, int64_t t0,
                                      int64_t n, AttnPart part) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim, D = tc.hidden_size;
  const int64_t G = tc.o_groups, gin = H * Dh / G;
  const ref::Rope<float>& rope = p.compress_ratio > 0 ? rope_comp : rope_swa;
  auto grow = [](std::vector<float>& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  grow(kvrow, 2 * n * Dh);
  grow(att_o, std::max(H * Dh, n * (gin + tc.o_lora_rank)));
  const float* xt = xs.data() + t0 * D;
  if (part != AttnPart::kCompressorOnly) {
    // Queries and window rows of the chunk (every token's row is written before any is read).
    attention_queries(w, rope, t0, n);
    linear_batch(w.wkv, xt, n, kvrow.data());
    for (int64_t t = 0; t < n; ++t) {
      const fast::TokenRow& row = rows[std::size_t(t0 + t)];
      float* kvt = kvrow.data() + t * Dh;
      window_row_values(w, rope, row.pos, kvt);
      store_window_row(*row.seq, p.index, row.pos, kvt);
    }
  }
  if (p.is_kv_source() && part != AttnPart::kNoCompressor) {
    // Compressor: projections for the chunk, then each token in order.
    float* kvp = kvrow.data();
    float* g = kvrow.data() + n * Dh;
    linear_batch(w.c_wkv, xt, n, kvp);
    if (p.compress_ratio > 1) linear_batch(w.c_wgate, xt, n, g);
    for (int64_t t = 0; t < n; ++t) {
      const fast::TokenRow& row = rows[std::size_t(t0 + t)];
      compressor_step(p, w, *row.seq, row.pos, kvp + t * Dh, g + t * Dh);
    }
  }
  if (part == AttnPart::kCompressorOnly) return;
  const int64_t nh = tc.index_n_heads, di = tc.index_head_dim;
  if (p.has_indexer()) {
    grow(iq, n * nh * di);
    grow(tmp2, n * nh);
    linear_batch(w.i_wq_b, qr.data(), n, iq.data());
    linear_batch(w.i_wproj, xt, n, tmp2.data());
  }
  // Prefill kernel: runs of a sequence's consecutive positions through ops' banded prefill
  // attention (the same bits as the one-query path, tested; faster because each window row is
  // unpacked once for the run), the other tokens one by one.
  prefill_done.assign(std::size_t(n), 0);  // capacity kept: no allocation once grown
  // (Not in mask mode: a masked row must leave exactly the queries that read it, which the
  // one-query path does; not with the heads split over processes: the kernel takes every head.)
  if (prefill_attention_on && opt.isolation != IsolationMode::kMask && h0 == 0 && h1 == H) {
    for (int64_t a = 0; a < n;) {
      int64_t b = a + 1;
      while (b < n && rows[std::size_t(t0 + b)].seq == rows[std::size_t(t0 + a)].seq &&
             rows[std::size_t(t0 + b)].pos == rows[std::size_t(t0 + b - 1)].pos + 1)
        ++b;
      if (b - a >= 2 && prefill_run(p, w, rope, t0, a, b))
        std::fill(prefill_done.begin() + a, prefill_done.begin() + b, uint8_t(1));
      a = b;
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    const fast::TokenRow& row = rows[std::size_t(t0 + t)];
    SeqState& s = *row.seq;
    const int64_t P = row.pos;
    if (prefill_done[std::size_t(t)]) continue;
    att_rows.clear();
    att_kinds.clear();
    // (decoder replay: not below the first row the decoder layers computed)
    for (int64_t k0 = std::max<int64_t>(window_floor(s, p.index), P - tc.sliding_window + 1);
         k0 <= P; ++k0)
      if (const uint8_t* rr = read_window_row(s, p.index, k0)) {
        att_rows.push_back(rr);
        att_kinds.push_back(0);
      }
    if (p.compress_ratio > 0) {
      if (p.has_indexer()) indexer(p, t0 + t, iq.data() + t * nh * di, tmp2.data() + t * nh);
      const int src = source_of_layer[std::size_t(p.kv_source)];
      for (int64_t j : sel[std::size_t(t0 + t)])
        if (const uint8_t* rr = read_comp_row(s, src, j, false)) {
          att_rows.push_back(rr);
          att_kinds.push_back(1);
        }
    }
    attend_query(w, rope, P, tmp.data() + t * H * Dh);
  }
  attention_output(w, t0, n);
}

// Tokens [t0 + a, t0 + b) of one sequence at consecutive positions: each one's indexer, then all
// of them through ops' prefill attention (banded window rows gathered contiguous, each query's
// compressed rows), queries split over the pool, then each one's inverse RoPE. Returns false (and
// does nothing) when a row the band needs is not readable or the window is floored inside the band
// (decoder replay): the one-query path then handles those tokens.
bool FastModel::Impl::prefill_run(const LayerPlan& p, const fast::LayerW& w,
                                  const ref::Rope<float>& rope, int64_t t0, int64_t a, int64_t b) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, Dh = tc.head_dim, win = tc.sliding_window;
  const fast::TokenRow& first = rows[std::size_t(t0 + a)];
  SeqState& s = *first.seq;
  const int64_t P0 = first.pos, nq = b - a;
  const int64_t wpos0 = std::max<int64_t>(0, P0 - win + 1), nwin = P0 + nq - wpos0;
  if (window_floor(s, p.index) > wpos0) return false;
  const int64_t rb = ops::window_row_bytes(Dh);
  if (int64_t(pre_win.size()) < nwin * rb) pre_win.resize(std::size_t(nwin * rb));
  for (int64_t k = 0; k < nwin; ++k) {
    const uint8_t* r = read_window_row(s, p.index, wpos0 + k);
    if (!r) return false;
    std::memcpy(pre_win.data() + k * rb, r, std::size_t(rb));
  }
  // Each query's compressed rows (its indexer's selection), after the indexer of every query.
  pre_comp.clear();
  pre_cofs.assign(1, 0);
  if (p.compress_ratio > 0 && p.has_indexer()) indexer_run(p, t0, a, b);
  for (int64_t t = a; t < b; ++t) {
    if (p.compress_ratio > 0) {
      const int src = source_of_layer[std::size_t(p.kv_source)];
      for (int64_t j : sel[std::size_t(t0 + t)])
        if (const uint8_t* rr = read_comp_row(s, src, j, false)) pre_comp.push_back(rr);
    }
    pre_cofs.push_back(int64_t(pre_comp.size()));
  }
  const float scale = float(1.0 / std::sqrt(double(Dh)));
  if (int64_t(pre_out.size()) < nq * H * Dh) pre_out.resize(std::size_t(nq * H * Dh));
  float* q = tmp.data() + a * H * Dh;
  auto queries = [&](int64_t i0, int64_t i1) {
    kern->prefill_attention(q + i0 * H * Dh, i1 - i0, H, Dh, pre_win.data(), wpos0, nwin, P0 + i0,
                            win, pre_comp.data(), pre_cofs.data() + i0, scale, w.attn_sink,
                            pre_out.data() + i0 * H * Dh);
  };
  par_rows(nq, 1, std::ref(queries));
  std::copy_n(pre_out.data(), nq * H * Dh, q);
  for (int64_t i = 0; i < nq; ++i) {
    rope_table(rope, P0 + i);
    for (int64_t hh = 0; hh < H; ++hh)
      kern->rope(q + (i * H + hh) * Dh, Dh, rope.dim, cosb.data(), sinb.data(), true);
  }
  return true;
}

}  // namespace dsv41
