// The fast forward: loading and binding the converted weights, sequences and their blocks, the
// step (embedding, layers, head) and the shared helpers (see fast_model.h, fast_internal.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "core/cpu_set.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/fast/fast_internal.h"
#include "model/tensor_names.h"

namespace dsv41 {
namespace {

using fast::Linear;

// Steps of up to this many tokens get their selection scratch reserved up front (decode).
constexpr int64_t kDecodeScratchTokens = 64;

}  // namespace

// A quarter of MemAvailable, at least 64 MB.
int64_t FastModel::default_kv_budget() {
  const int64_t avail = mem_available_bytes();
  return avail < 0 ? int64_t(1) << 30 : std::max<int64_t>(int64_t(64) << 20, avail / 4);
}

namespace {

// An FP8 linear turned into BF16 (exact: an E4M3 value times a power of two has at most 4
// significant bits). Used for wo_a when o_lora_rank is not a multiple of 32: its groups' row
// ranges then start inside a 32-row scale block, which the FP8 kernels do not take.
void dequantize_to_bf16(fast::Linear* l, std::vector<uint16_t>* store) {
  store->resize(std::size_t(l->out * l->in));
  const int64_t sin = (l->in + 31) / 32;
  for (int64_t r = 0; r < l->out; ++r)
    for (int64_t c = 0; c < l->in; ++c) {
      const float s = e8m0_to_float(l->scale[(r / 32) * sin + c / 32]);
      (*store)[std::size_t(r * l->in + c)] = float_to_bf16(e4m3_to_float(l->w[r * l->in + c]) * s);
    }
  l->dtype = DType::kBF16;
  l->w = reinterpret_cast<const uint8_t*>(store->data());
  l->scale = nullptr;
}

// This process's share of a split forward (FastOptions): attention rows of heads [h0, h1) and
// groups [g0, g1), routed experts [e0, e1) of each layer's E (E * part / parts: contiguous).
struct Share {
  int64_t h0, h1, g0, g1;
  int ep_part, ep_parts;
  int64_t e0(int64_t E) const { return ep_part < 0 ? 0 : E * ep_part / ep_parts; }
  int64_t e1(int64_t E) const { return ep_part < 0 ? 0 : E * (ep_part + 1) / ep_parts; }
};

fast::LayerW bind_layer(const fast::Binder& b, const LayerPlan& p, const EngramHasher& hasher,
                        int64_t o_lora_rank, int64_t head_dim, const Share& sh) {
  const BlockTensorNames n = block_tensor_names(p);
  fast::LayerW w;
  w.attn_norm = b.vec(n.attn_norm);
  w.ffn_norm = b.vec(n.ffn_norm);
  w.hc_attn_fn = b.f32(n.hc_attn_fn);
  w.hc_attn_base = b.f32(n.hc_attn_base);
  w.hc_attn_scale = b.f32(n.hc_attn_scale);
  w.hc_ffn_fn = b.f32(n.hc_ffn_fn);
  w.hc_ffn_base = b.f32(n.hc_ffn_base);
  w.hc_ffn_scale = b.f32(n.hc_ffn_scale);
  w.attn_sink = b.f32(n.attn_sink);
  w.q_norm = b.vec(n.q_norm);
  w.kv_norm = b.vec(n.kv_norm);
  w.wq_a = b.lin(n.wq_a);
  w.wq_b = b.lin(n.wq_b);
  w.wkv = b.lin(n.wkv);
  w.wo_a = b.lin(n.wo_a);
  w.wo_a.act = false;
  if (w.wo_a.quantized() && o_lora_rank % 32 != 0) dequantize_to_bf16(&w.wo_a, &w.owned_wo_a);
  w.wo_b = b.lin(n.wo_b);
  w.wq_b_own = fast::linear_rows(w.wq_b, sh.h0 * head_dim, sh.h1 * head_dim);
  // wo_a's share boundaries are multiples of o_lora_rank: on 32-row scale blocks whenever wo_a is
  // still FP8 here (o_lora_rank % 32 == 0; otherwise it was made BF16 above).
  w.wo_a_own = fast::linear_rows(w.wo_a, sh.g0 * o_lora_rank, sh.g1 * o_lora_rank);
  w.wo_a_own.act = false;
  if (p.is_kv_source()) {
    w.c_norm = b.vec(n.c_norm);
    w.c_wkv = b.lin(n.c_wkv);
    if (p.compressor_gate) w.c_wgate = b.lin(n.c_wgate);
    w.i_wk = b.lin(n.i_wk);
    w.i_k_norm = b.vec(n.i_k_norm);
  }
  if (p.has_indexer()) {
    w.i_wq_b = b.lin(n.i_wq_b);
    w.i_wproj = b.lin(n.i_wproj);
  }
  w.gate = b.lin(n.gate);
  w.gate_bias = b.f32(n.gate_bias);
  w.gate_bias_vl = b.f32(n.gate_bias_vl);
  w.experts.resize(std::size_t(p.n_routed_experts));  // another process's experts stay unbound
  for (int e = int(sh.e0(p.n_routed_experts)); e < sh.e1(p.n_routed_experts); ++e) {
    // the converted layout's fused w13 and w2
    const std::string w13 = n.expert(e, "w13"), w2 = n.expert(e, "w2");
    w.experts[std::size_t(e)] = {b.w.get(w13 + ".weight").data, b.w.get(w13 + ".scale").data,
                                 b.w.get(w2 + ".weight").data, b.w.get(w2 + ".scale").data};
  }
  w.sh_w1 = b.lin(n.sh_w1);
  w.sh_w2 = b.lin(n.sh_w2);
  w.sh_w3 = b.lin(n.sh_w3);
  if (p.engram >= 0) {
    w.e_wkv = b.lin(n.e_wkv);
    const auto q = b.vec(n.e_q), k = b.vec(n.e_k);
    for (std::size_t i = 0; i < q.size(); ++i) w.e_qk.push_back(q[i] * k[i]);
    for (std::size_t c = 0; c < hasher.columns(); ++c) {
      const std::string B = n.engram_bucket(c);
      w.e_codes.push_back(b.w.get(B + ".weight").data);
      w.e_scales.push_back(b.w.get(B + ".scale").data);
    }
  }
  return w;
}

}  // namespace

FastModel::FastModel() = default;
FastModel::~FastModel() = default;

Result<std::unique_ptr<FastModel>> FastModel::load(const std::string& dir, const FastOptions& opt) {
  auto wts = ConvertedWeights::open(dir, /*verify=*/false);
  if (!wts) return wts.status();
  std::unique_ptr<FastModel> m(new FastModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.opt = opt;
  im.wts = std::move(*wts);
  im.cfg = im.wts->config();
  auto plan = build_layer_plan(im.cfg);
  if (!plan) return plan.status().with_context(dir + "/config.json: ");
  im.plan = *plan;
  const TextConfig& tc = im.cfg.text;
  auto cmap = load_engram_token_ids(dir, tc);
  if (!cmap) return cmap.status();
  im.cmap = std::move(*cmap);
  im.hasher = std::make_unique<EngramHasher>(tc);
  im.kern = &ops::kernels();
  if (!opt.cpus.empty()) DSV41_RETURN_IF_ERROR(pin_to_cpus(opt.cpus));
  {
    const std::vector<int> mask = allowed_cpus(), cores = one_cpu_per_core(mask);
    const std::size_t n = opt.threads > 0 ? std::size_t(opt.threads) : cores.size();
    im.pool = std::make_unique<ThreadPool>(std::max<std::size_t>(1, n));
    log::info("fast model: {} compute threads; CPUs {} ({} physical cores{}){}", im.pool->size(),
              format_cpu_list(mask), cores.size(),
              opt.cpus.empty() ? ", the affinity mask" : ", --cpu-list",
              opt.threads > 0 ? ", --threads" : "");
  }
  DSV41_RETURN_IF_ERROR(im.set_share(dir));
  // Decoder replay's split layer: the first ratio-1 layer, when no later layer owns compressed KV
  // (their caches would need every token's decoder state).
  for (int l = 0; l < im.plan.num_backbone && im.replay_split < 0; ++l)
    if (im.plan.layers[std::size_t(l)].compress_ratio == 1) im.replay_split = l;
  for (int l = im.replay_split + 1; im.replay_split >= 0 && l < im.plan.num_backbone; ++l)
    if (im.plan.layers[std::size_t(l)].is_kv_source()) im.replay_split = -1;
  if (opt.replay_margin < FastOptions::kReplayMarginExact)
    return Status::error("replay_margin " + std::to_string(opt.replay_margin) +
                         ": below 0 (kReplayMarginExact, -1, asks for the exact margin)");
  im.prefill_attention_on = opt.prefill_attention;
  if (opt.decoder_replay)
    DSV41_RETURN_IF_ERROR(m->set_decoder_replay(true).with_context(dir + ": "));
  const Share share{im.h0, im.h1, im.g0, im.g1, opt.ep_part, std::max(1, opt.ep_parts)};

  const fast::Binder b{*im.wts};
  im.embed = reinterpret_cast<const uint16_t*>(im.wts->get(kEmbedName).data);
  im.head = b.lin(kHeadName);
  im.norm = b.vec(kFinalNormName);
  im.image_start = b.vec("image_start");
  im.image_newline = b.vec("image_newline");
  im.image_end = b.vec("image_end");
  for (int l = 0; l < im.plan.num_backbone; ++l)
    im.layers.push_back(bind_layer(b, im.plan.layers[std::size_t(l)], *im.hasher, tc.o_lora_rank,
                                   tc.head_dim, share));
  if (opt.dspark) {
    const int stages = int(im.plan.layers.size()) - im.plan.num_backbone;
    if (stages <= 0)
      return Status::error(dir +
                           "/config.json: text_config.num_nextn_predict_layers is 0: the "
                           "checkpoint has no DSpark drafter");
    for (int s = 0; s < stages; ++s)
      im.dspark.stages.push_back(
          bind_layer(b, im.plan.stage(s), *im.hasher, tc.o_lora_rank, tc.head_dim, share));
    im.bind_dspark();
  }
  // The weights this process reads: everything but the Engram tables (only hashed rows are read),
  // other processes' experts, and the attention rows of other processes' heads.
  const std::vector<ConvertedWeights::Range> mine = im.share_ranges();
  for (const auto& r : mine) im.stats.share_weight_bytes += int64_t(r.second);
  if (opt.warm) {
    im.stats.huge_page_weight_bytes =
        int64_t(im.wts->warm(mine, im.pool->size(), opt.huge_pages).huge);
  }
  const RopeScaling rs = tc.rope_scaling.value_or(RopeScaling{});
  im.rope_swa = ref::Rope<float>::make(tc.qk_rope_head_dim, tc.rope_theta, false, 1, 1, 1, 1);
  im.rope_comp = ref::Rope<float>::make(
      tc.qk_rope_head_dim, tc.compress_rope_theta, tc.rope_scaling.has_value(), rs.factor,
      double(rs.original_max_position_embeddings), rs.beta_fast, rs.beta_slow);

  std::vector<std::pair<int, int>> sources;
  im.source_of_layer.assign(std::size_t(im.plan.num_backbone), -1);
  for (int l = 0; l < im.plan.num_backbone; ++l) {
    const LayerPlan& p = im.plan.layers[std::size_t(l)];
    if (!p.is_kv_source()) continue;
    im.source_of_layer[std::size_t(l)] = int(sources.size());
    sources.emplace_back(l, p.compress_ratio);
  }
  // The drafter's stages keep window rows too, as pool layers after the backbone's.
  const int window_layers = im.plan.num_backbone + int(im.dspark.stages.size());
  KvLayout lay = make_kv_layout(tc.sliding_window, window_layers, tc.head_dim, tc.index_head_dim,
                                sources, opt.window_block_tokens);
  const int64_t budget = opt.kv_cache_bytes > 0 ? opt.kv_cache_bytes : default_kv_budget();
  im.kv = std::make_unique<KvPool>(std::move(lay), budget, opt.isolation);
  if (im.kv->blocks_total() < 2)
    return Status::error("--kv-cache-gb: " + std::to_string(budget) +
                         " bytes hold fewer than two KV blocks of " +
                         std::to_string(im.kv->layout().block_bytes) + " bytes");
  return m;
}

Status FastModel::Impl::set_share(const std::string& dir) {
  const TextConfig& tc = cfg.text;
  const int64_t H = tc.num_attention_heads, G = tc.o_groups;
  const int tp = std::max(1, opt.tp_parts), ep = std::max(1, opt.ep_parts);
  if ((tp > 1 || ep > 1) && !opt.comm)
    return Status::error("--tp/--ep: a split forward needs the process group (run under mpirun)");
  if (G % tp != 0)
    return Status::error(dir + "/config.json: text_config.o_groups " + std::to_string(G) +
                         " is not a multiple of --tp " + std::to_string(tp) +
                         " (attention is split on whole output groups)");
  if (opt.tp_part >= tp || opt.ep_part >= ep)
    return Status::error("--tp/--ep: part index beyond the split");
  g0 = opt.tp_part < 0 ? 0 : G * opt.tp_part / tp;
  g1 = opt.tp_part < 0 ? 0 : G * (opt.tp_part + 1) / tp;
  h0 = g0 * (H / G);
  h1 = g1 * (H / G);
  // Every part's wq_b rows must start on a 32-row scale block (checked for all parts, so every
  // rank refuses the same split).
  for (int p = 1; p < tp; ++p)
    if ((G * p / tp) * (H / G) * tc.head_dim % 32 != 0)
      return Status::error(dir + "/config.json: --tp " + std::to_string(tp) +
                           " would split wq_b inside a 32-row scale block (head_dim " +
                           std::to_string(tc.head_dim) + ")");
  return Status::ok();
}

std::vector<ConvertedWeights::Range> FastModel::Impl::share_ranges() const {
  std::unordered_map<const uint8_t*, bool> skip;  // tensors read only in part, or not at all
  auto drop = [&](const Linear& l) {
    skip[l.w] = true;
    if (l.scale) skip[l.scale] = true;
  };
  std::vector<ConvertedWeights::Range> out;
  auto keep = [&](const Linear& l) {
    if (l.out == 0) return;
    const uint64_t nr = uint64_t(l.out), in = uint64_t(l.in);
    out.emplace_back(l.w, l.quantized() ? nr * in : nr * in * 2);
    if (l.quantized()) out.emplace_back(l.scale, (nr + 31) / 32 * ((in + 31) / 32));
  };
  auto layer = [&](const fast::LayerW& w) {
    drop(w.wq_b);
    drop(w.wo_a);
    keep(w.wq_b_own);
    if (w.owned_wo_a.empty()) keep(w.wo_a_own);  // a BF16 copy in memory otherwise
  };
  std::unordered_map<const uint8_t*, bool> owned_experts;
  for (const auto* set : {&layers, &dspark.stages})
    for (const auto& w : *set) {
      layer(w);
      for (const auto& e : w.experts)
        for (const uint8_t* ptr : {e.w13, e.s13, e.w2, e.s2})
          if (ptr) owned_experts[ptr] = true;
    }
  for (const auto& [name, span] : wts->spans()) {
    if (name.find(".engram.embed.bucket.") != std::string::npos || skip.count(span.data)) continue;
    // Routed experts: only those this process bound (its share of each layer).
    if (name.find("ffn.experts.") != std::string::npos && !owned_experts.count(span.data)) continue;
    out.emplace_back(span.data, span.bytes);
  }
  return out;
}

int32_t FastModel::vocab_size() const {
  return int32_t(impl_->cfg.text.vocab_size);
}
int64_t FastModel::hidden_size() const {
  return impl_->cfg.text.hidden_size;
}
int64_t FastModel::max_context() const {
  return impl_->cfg.text.max_position_embeddings;
}
const KvPool& FastModel::pool() const {
  return *impl_->kv;
}
const char* FastModel::isa() const {
  return ops::isa_name(impl_->kern->isa);
}
int64_t FastModel::foreign_reads() const {
  return impl_->kv->foreign_reads();
}
FastStats FastModel::stats() const {
  FastStats s = impl_->stats;
  s.foreign_reads = impl_->kv->foreign_reads();
  return s;
}

Status FastModel::open(SeqId seq) {
  Impl& im = *impl_;
  if (im.seqs.count(seq)) return Status::error("sequence " + std::to_string(seq) + " is open");
  auto s = std::make_unique<fast::SeqState>();
  s->id = seq;
  s->tag = im.next_tag++;
  const int64_t Dh = im.cfg.text.head_dim, R = std::max<int64_t>(1, im.opt.max_rollback);
  for (const auto& src : im.kv->layout().sources) {
    fast::SourceSeq ss;
    if (src.ratio > 1) {
      ss.part_kv.assign(std::size_t((src.ratio - 1) * Dh), 0.0f);
      ss.part_g.assign(std::size_t((src.ratio - 1) * Dh), 0.0f);
      ss.roll_kv.assign(std::size_t(R * Dh), 0.0f);
      ss.roll_g.assign(std::size_t(R * Dh), 0.0f);
      ss.roll_pos.assign(std::size_t(R), -1);
    }
    s->src.push_back(std::move(ss));
  }
  im.seqs[seq] = std::move(s);
  return Status::ok();
}

void FastModel::free(SeqId seq) {
  Impl& im = *impl_;
  auto it = im.seqs.find(seq);
  if (it == im.seqs.end()) return;
  for (BlockRef b : it->second->win)
    if (b.valid()) im.kv->release(b);
  for (BlockRef b : it->second->glob)
    if (b.valid()) im.kv->release(b);
  im.seqs.erase(it);
}

int64_t FastModel::length(SeqId seq) const {
  auto it = impl_->seqs.find(seq);
  return it == impl_->seqs.end() ? -1 : it->second->len;
}

Status FastModel::truncate(SeqId seq, int64_t length) {
  Impl& im = *impl_;
  auto it = im.seqs.find(seq);
  if (it == im.seqs.end()) return Status::error("sequence " + std::to_string(seq) + " is not open");
  fast::SeqState& s = *it->second;
  if (length < 0 || length > s.len)
    return Status::error("truncate: length " + std::to_string(length) + " is outside [0, " +
                         std::to_string(s.len) + "]");
  if (length == s.len) return Status::ok();
  const KvLayout& L = im.kv->layout();
  const int64_t R = std::max<int64_t>(1, im.opt.max_rollback);
  // Positions attached from the prefix cache are not this sequence's to roll back. Past them, the
  // block holding position `length` is written again from there: when the cache shares it, the
  // sequence continues in a private copy (copy-on-write, below); blocks wholly past the new end are
  // only given back.
  if (length < s.shared_len)
    return Status::error("truncate: sequence " + std::to_string(seq) + " took positions below " +
                         std::to_string(s.shared_len) + " from the prefix cache; free and " +
                         "recompute");
  auto cow_index = [&](const std::vector<BlockRef>& table, int64_t per_block) -> int64_t {
    const int64_t i = length / per_block;
    if (length % per_block == 0 || i >= int64_t(table.size())) return -1;
    const BlockRef b = table[std::size_t(i)];
    return b.valid() && im.kv->refs(b.block) > 1 ? i : -1;
  };
  const int64_t cow_win = cow_index(s.win, L.window_tokens);
  const int64_t cow_glob = cow_index(s.glob, L.global_tokens);
  if ((cow_win >= 0) + (cow_glob >= 0) > kv_blocks_free())
    return Status::error("truncate: KV cache full (a shared block needs a private copy)");
  // The window rows of positions length - window .. length - 1 must still be held, and every
  // reopened compressor group's projections must still be in the rollback ring.
  const int64_t need_win = std::max<int64_t>(0, length - L.window);
  if (need_win / L.window_tokens < int64_t(s.win.size()) && need_win < length &&
      !s.win[std::size_t(need_win / L.window_tokens)].valid())
    return Status::error("truncate: sequence " + std::to_string(seq) + " no longer holds the " +
                         "window rows of position " + std::to_string(need_win) +
                         " (exact rollback reaches " + std::to_string(R) + " tokens back)");
  if (s.len - length > R)
    return Status::error("truncate: rolling back " + std::to_string(s.len - length) +
                         " tokens exceeds the rollback margin of " + std::to_string(R));
  // Every position of a group to reopen must still be in its ring slot (a slot holds the latest
  // position written there; earlier truncates and steps may have overwritten older ones).
  for (std::size_t si = 0; si < L.sources.size(); ++si) {
    const int r = L.sources[si].ratio;
    if (r <= 1) continue;
    for (int64_t pos = length - length % r; pos < length; ++pos)
      if (s.src[si].roll_pos[std::size_t(pos % R)] != pos)
        return Status::error("truncate: sequence " + std::to_string(seq) +
                             " no longer holds the compressor projections of position " +
                             std::to_string(pos) + " (layer " +
                             std::to_string(L.sources[si].layer) + "); free and recompute");
  }
  if (cow_win >= 0)
    s.win[std::size_t(cow_win)] = im.private_copy(s.win[std::size_t(cow_win)], /*window=*/true);
  if (cow_glob >= 0)
    s.glob[std::size_t(cow_glob)] = im.private_copy(s.glob[std::size_t(cow_glob)], false);
  const int64_t Dh = im.cfg.text.head_dim;
  for (std::size_t si = 0; si < L.sources.size(); ++si) {
    const int r = L.sources[si].ratio;
    if (r <= 1) continue;
    fast::SourceSeq& ss = s.src[si];
    ss.part_n = int(length % r);
    for (int k = 0; k < ss.part_n; ++k) {
      const int64_t pos = length - ss.part_n + k, slot = pos % R;
      std::copy_n(ss.roll_kv.begin() + slot * Dh, Dh, ss.part_kv.begin() + k * Dh);
      std::copy_n(ss.roll_g.begin() + slot * Dh, Dh, ss.part_g.begin() + k * Dh);
    }
  }
  // Blocks wholly past the new end go back; rows past it inside kept blocks lose their tags, so a
  // read of them before they are written again counts as foreign.
  auto trim = [&](std::vector<BlockRef>& table, int64_t per_block) {
    const int64_t keep = (length + per_block - 1) / per_block;
    for (int64_t i = keep; i < int64_t(table.size()); ++i)
      if (table[std::size_t(i)].valid()) im.kv->release(table[std::size_t(i)]);
    if (int64_t(table.size()) > keep) table.resize(std::size_t(keep));
  };
  trim(s.win, L.window_tokens);
  trim(s.glob, L.global_tokens);
  s.dec_floor = std::min(s.dec_floor, length);  // rows from `length` on are computed again
  // Compressed entries from the one straddling the new end (completed by a removed position).
  for (std::size_t si = 0; si < L.sources.size(); ++si) {
    const int r = L.sources[si].ratio;
    for (int64_t p = length / r * r; p < s.len; p += r) {
      if (p / L.global_tokens >= int64_t(s.glob.size())) break;
      RowTag* t;
      im.comp_row(s, int(si), p / r, false, &t);
      *t = RowTag{};
      im.comp_row(s, int(si), p / r, true, &t);
      *t = RowTag{};
    }
  }
  for (int64_t p = length; p < s.len; ++p) {
    if (p / L.window_tokens < int64_t(s.win.size()))
      for (int l = 0; l < L.num_layers; ++l) {
        RowTag* t;
        im.window_row(s, l, p, &t);
        *t = RowTag{};
      }
  }
  if (length == 0) s.vendor_slot = -1;  // vendor keys: nothing published any more
  s.history.resize(std::size_t(length));
  s.tokens.resize(std::size_t(length));
  // Blocks from length on will hold other rows: none of them may be registered with the old ones'
  // hash chain.
  const std::size_t keep_chain = std::size_t(length / L.global_tokens);
  if (s.chain.size() > keep_chain) s.chain.resize(keep_chain);
  s.len = length;
  return Status::ok();
}

int64_t FastModel::kv_blocks_total() const {
  return impl_->kv->blocks_total();
}
int64_t FastModel::kv_blocks_free() const {
  return impl_->kv->blocks_free() + impl_->prefix_evictable();
}
int64_t FastModel::kv_blocks_to_grow(SeqId seq, int64_t new_len) const {
  auto it = impl_->seqs.find(seq);
  static const fast::SeqState kEmpty;
  return impl_->blocks_needed(it == impl_->seqs.end() ? kEmpty : *it->second, new_len);
}

// Global blocks for the whole context; window blocks only for the window, the rollback margin and
// one step's tokens (older ones go back after each step: release_old_window).
int64_t FastModel::kv_blocks_peak(int64_t length, int64_t step_tokens) const {
  const KvLayout& L = impl_->kv->layout();
  const int64_t R = std::max<int64_t>(1, impl_->opt.max_rollback);
  const int64_t nw = (length + L.window_tokens - 1) / L.window_tokens;
  const int64_t ng = L.sources.empty() ? 0 : (length + L.global_tokens - 1) / L.global_tokens;
  const int64_t live = (L.window + R + std::max<int64_t>(1, step_tokens)) / L.window_tokens + 2;
  return ng + std::min(nw, live);
}

Status FastModel::fill_random_context(SeqId seq, int64_t length, uint64_t seed) {
  Impl& im = *impl_;
  auto it = im.seqs.find(seq);
  if (it == im.seqs.end()) return Status::error("sequence " + std::to_string(seq) + " is not open");
  fast::SeqState& s = *it->second;
  if (s.len != 0) return Status::error("fill_random_context: sequence is not empty");
  if (length < 0 || length > max_context())
    return Status::error("fill_random_context: length " + std::to_string(length) +
                         " is outside [0, " + std::to_string(max_context()) + "]");
  const KvLayout& L = im.kv->layout();
  // Only the window blocks decode will still read are allocated (what release_old_window keeps).
  const int64_t keep_from =
      std::max<int64_t>(0, length - L.window - std::max<int64_t>(1, im.opt.max_rollback));
  const int64_t first_win = keep_from / L.window_tokens;
  const int64_t nw = (length + L.window_tokens - 1) / L.window_tokens;
  const int64_t ng = L.sources.empty() ? 0 : (length + L.global_tokens - 1) / L.global_tokens;
  if (nw - first_win + ng > kv_blocks_free())
    return Status::error("KV cache full: context " + std::to_string(length) + " needs " +
                         std::to_string(nw - first_win + ng) + " blocks, " +
                         std::to_string(kv_blocks_free()) + " free (raise --kv-cache-gb)");
  s.win.assign(std::size_t(nw), BlockRef{});
  for (int64_t i = first_win; i < nw; ++i) s.win[std::size_t(i)] = im.alloc_block(s.tag);
  for (int64_t i = 0; i < ng; ++i) s.glob.push_back(im.alloc_block(s.tag));
  const TextConfig& tc = im.cfg.text;
  const int64_t Dh = tc.head_dim, di = tc.index_head_dim;
  Rng rng(seed);
  std::vector<float> row(std::size_t(std::max(Dh, di)));
  auto fill = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) row[std::size_t(i)] = float(rng.uniform(-1.0, 1.0));
  };
  RowTag* tag;
  for (int64_t p = first_win * L.window_tokens; p < length; ++p)
    for (int l = 0; l < L.num_layers; ++l) {
      fill(Dh);
      im.kern->pack_window_row(row.data(), Dh, im.window_row(s, l, p, &tag));
      *tag = RowTag{s.tag, im.window_block(s, p).epoch, int32_t(p)};
    }
  for (std::size_t si = 0; si < L.sources.size(); ++si) {
    const int r = L.sources[si].ratio;
    for (int64_t j = 0; j < length / r; ++j) {
      const BlockRef b = im.global_block(s, j * r);
      fill(di);
      im.kern->pack_index_key(row.data(), di, im.comp_row(s, int(si), j, true, &tag));
      *tag = RowTag{s.tag, b.epoch, int32_t(j * r)};
      fill(Dh);
      im.kern->pack_compressed_row(row.data(), Dh, im.comp_row(s, int(si), j, false, &tag));
      *tag = RowTag{s.tag, b.epoch, int32_t(j * r)};
    }
    fast::SourceSeq& ss = s.src[si];
    ss.part_n = int(length % r);  // the open group's members, random too (never rolled back)
    for (auto& v : ss.part_kv) v = float(rng.uniform(-1.0, 1.0));
    for (auto& v : ss.part_g) v = float(rng.uniform(-1.0, 1.0));
  }
  s.history.resize(std::size_t(length));
  for (auto& h : s.history) h = im.cmap[std::size_t(rng.below(im.cmap.size()))];
  s.cacheable = false;  // random rows: nothing a later sequence may take as its prefix
  s.len = length;
  return Status::ok();
}

Status FastModel::debug_plant_foreign_block(SeqId victim, SeqId owner, int64_t index) {
  Impl& im = *impl_;
  auto a = im.seqs.find(victim), b = im.seqs.find(owner);
  if (a == im.seqs.end() || b == im.seqs.end()) return Status::error("unknown sequence");
  if (index >= int64_t(a->second->glob.size()) || index >= int64_t(b->second->glob.size()))
    return Status::error("no such global block");
  // The victim's own block stays allocated (leaked to it) so the pool's accounting holds; its table
  // takes no reference to the planted block (test hook: the victim must not be freed after).
  // The victim's table points at the other block but still expects its own rows (owner): what a
  // table corrupted by a bug would do; a prefix-cache share would carry the writer as owner.
  const uint64_t expected = a->second->glob[std::size_t(index)].owner;
  a->second->glob[std::size_t(index)] = b->second->glob[std::size_t(index)];
  a->second->glob[std::size_t(index)].owner = expected;
  a->second->cacheable = false;  // the planted table must never reach the prefix cache
  return Status::ok();
}

// ---- helpers ----

void FastModel::Impl::reduce(float* data, int64_t n) {
  if (!opt.comm || opt.comm->size() <= 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  opt.comm->allreduce_sum(data, n);  // throws CollectiveFailure
  stats.collective_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats.collectives;
  stats.collective_bytes += n * int64_t(sizeof(float));
}

void FastModel::Impl::par_rows(int64_t n, int64_t align,
                               const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t parts = int64_t(pool->size());
  const int64_t chunk = ((n + parts - 1) / parts + align - 1) / align * align;
  if (parts == 1 || chunk >= n) return fn(0, n);
  const int64_t nchunks = (n + chunk - 1) / chunk;
  auto job = [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t c = b; c < e; ++c) fn(int64_t(c) * chunk, std::min(n, int64_t(c + 1) * chunk));
  };
  pool->parallel_for(std::size_t(nchunks), std::ref(job));
}

const float* FastModel::Impl::maybe_act_quant_rows(const float* x, int64_t rows_n, int64_t n) {
  if (!opt.act_quant) return x;
  if (int64_t(xq.size()) < rows_n * n) xq.resize(std::size_t(rows_n * n));
  // act_quant's rule is the window rows' FP8 rule, per row (the kernel is the reference's
  // fake_fp8_pow2 bit for bit)
  for (int64_t r = 0; r < rows_n; ++r) kern->act_quant_fp8(x + r * n, n, xq.data() + r * n);
  return xq.data();
}

void FastModel::Impl::linear_count(const Linear& l) {
  if (l.stamp == count_epoch) return;
  l.stamp = count_epoch;
  stats.weight_bytes +=
      l.quantized() ? l.out * l.in + ((l.out + 31) / 32) * ((l.in + 31) / 32) : l.out * l.in * 2;
}

// One token goes through the one-token kernels, several through the batch kernels (which give
// each token the one-token bits while reading the weights once).
void FastModel::Impl::linear_batch(const Linear& l, const float* x_in, int64_t n, float* out) {
  const float* xin = l.act ? maybe_act_quant_rows(x_in, n, l.in) : x_in;
  linear_count(l);
  stats.macs += l.out * l.in * n;
  const ops::Kernels& kk = *kern;
  if (l.quantized() && l.act && opt.act_quant && l.aq_ok && kk.aq_fp8_gemm) {
    // Act-quant GEMM: exact products, one fixed order of sums per output whatever n is.
    const int64_t sin = (l.in + 31) / 32, st = kk.aq_act_stride(l.in, ops::AqFormat::kFp8);
    uint16_t* xp = xpk_words(n * st);
    kk.aq_pack_act(xin, n, l.in, ops::AqFormat::kFp8, xp);
    auto fn = [&](int64_t r0, int64_t r1) {
      kk.aq_fp8_gemm(l.w + r0 * l.in, l.scale + (r0 / 32) * sin, r1 - r0, l.in, xp, n, out + r0,
                     l.out);
    };
    par_rows(l.out, 32, std::ref(fn));
  } else if (l.quantized() && l.aq_ok && kk.f32_fp8_gemm) {
    // fp32 inputs (act-quant off; wo_a's with act-quant on; every input with act-quant on where
    // the tier has no act-quant GEMMs, e.g. avx2): exact products on FMAs, one fixed order of
    // sums per output whatever n is.
    const int64_t sin = (l.in + 31) / 32, st = kk.f32_act_stride(l.in, ops::AqFormat::kFp8);
    float* xp = xpk_floats(n * st);
    kk.f32_pack_act(xin, n, l.in, ops::AqFormat::kFp8, xp);
    auto fn = [&](int64_t r0, int64_t r1) {
      kk.f32_fp8_gemm(l.w + r0 * l.in, l.scale + (r0 / 32) * sin, r1 - r0, l.in, xp, n, out + r0,
                      l.out);
    };
    par_rows(l.out, 32, std::ref(fn));
  } else if (l.quantized()) {
    const int64_t sin = (l.in + 31) / 32;
    auto fn = [&](int64_t r0, int64_t r1) {
      const uint8_t *w = l.w + r0 * l.in, *sc = l.scale + (r0 / 32) * sin;
      if (n == 1)
        kk.fp8_gemv(w, sc, r1 - r0, l.in, xin, 1, out + r0);
      else
        kk.fp8_gemv_batch(w, sc, r1 - r0, l.in, xin, n, out + r0, l.out);
    };
    par_rows(l.out, 32, std::ref(fn));
  } else {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(l.w);
    auto fn = [&](int64_t r0, int64_t r1) {
      if (n == 1)
        kk.bf16_gemv(w + r0 * l.in, r1 - r0, l.in, xin, out + r0);
      else
        kk.bf16_gemv_batch(w + r0 * l.in, r1 - r0, l.in, xin, n, out + r0, l.out);
    };
    par_rows(l.out, 32, std::ref(fn));
  }
}

void FastModel::Impl::rope_table(const ref::Rope<float>& r, int64_t pos) {
  const std::size_t n = r.freq.size();
  cosb.resize(n);
  sinb.resize(n);
  for (std::size_t i = 0; i < n; ++i) {  // the reference's angles, in float
    const float th = float(pos) * r.freq[i];
    cosb[i] = std::cos(th);
    sinb[i] = std::sin(th);
  }
}

BlockRef FastModel::Impl::window_block(fast::SeqState& s, int64_t pos) {
  return s.win[std::size_t(pos / kv->layout().window_tokens)];
}
BlockRef FastModel::Impl::global_block(fast::SeqState& s, int64_t pos) {
  return s.glob[std::size_t(pos / kv->layout().global_tokens)];
}

// Every block the sequence needs to reach new_len, allocated up front so a step either has all
// its rows or fails before changing anything.
int64_t FastModel::Impl::blocks_needed(const fast::SeqState& s, int64_t new_len) const {
  const KvLayout& L = kv->layout();
  const int64_t nw = (new_len + L.window_tokens - 1) / L.window_tokens;
  const int64_t ng = L.sources.empty() ? 0 : (new_len + L.global_tokens - 1) / L.global_tokens;
  return std::max<int64_t>(0, nw - int64_t(s.win.size())) +
         std::max<int64_t>(0, ng - int64_t(s.glob.size()));
}

void FastModel::Impl::reserve_blocks(fast::SeqState& s, int64_t new_len) {
  const KvLayout& L = kv->layout();
  DSV41_CHECK(blocks_needed(s, new_len) <= kv->blocks_free() + prefix_evictable());
  while (int64_t(s.win.size()) * L.window_tokens < new_len) s.win.push_back(alloc_block(s.tag));
  if (!L.sources.empty())
    while (int64_t(s.glob.size()) * L.global_tokens < new_len) s.glob.push_back(alloc_block(s.tag));
}

// Window blocks whose every position is older than the window plus the rollback margin go back.
void FastModel::Impl::release_old_window(fast::SeqState& s) {
  const KvLayout& L = kv->layout();
  const int64_t keep_from = s.len - L.window - std::max<int64_t>(1, opt.max_rollback);
  for (int64_t i = 0; i < int64_t(s.win.size()); ++i) {
    if ((i + 1) * L.window_tokens > keep_from) break;
    if (s.win[std::size_t(i)].valid()) {
      kv->release(s.win[std::size_t(i)]);
      s.win[std::size_t(i)] = BlockRef{};
    }
  }
}

// A private copy of a shared block: the same bytes in a fresh block, the writer's row tags
// re-stamped with the new epoch (rows stay the writer's), the shared one's reference dropped.
BlockRef FastModel::Impl::private_copy(BlockRef b, bool window) {
  const KvLayout& L = kv->layout();
  BlockRef n = alloc_block(b.owner);
  DSV41_CHECK(n.valid());  // the caller checked a block is free or evictable
  std::memcpy(kv->data(n), kv->data(b), std::size_t(L.block_bytes));
  auto restamp = [&](int64_t off, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      RowTag* t = kv->tag_at(n, off + i * int64_t(sizeof(RowTag)));
      if (t->seq == b.owner && t->epoch == b.epoch) t->epoch = n.epoch;
    }
  };
  if (window) {
    restamp(L.window_tag_off, L.window_tokens * L.num_layers);
  } else {
    for (const auto& so : L.sources) {
      restamp(so.comp_tag_off, so.entries);
      restamp(so.key_tag_off, so.entries);
    }
  }
  kv->release(b);
  return n;
}

uint8_t* FastModel::Impl::window_row(fast::SeqState& s, int layer, int64_t pos, RowTag** tag) {
  const KvLayout& L = kv->layout();
  const BlockRef b = window_block(s, pos);
  DSV41_CHECK(b.valid() && kv->refs(b.block) == 1);  // never a write into a shared block
  const int64_t slot = int64_t(layer) * L.window_tokens + pos % L.window_tokens;
  *tag = kv->tag_at(b, L.window_tag_off + slot * int64_t(sizeof(RowTag)));
  return kv->data(b) + slot * L.window_row_bytes;
}

const uint8_t* FastModel::Impl::read_window_row(const fast::SeqState& s, int layer,
                                                int64_t pos) const {
  const KvLayout& L = kv->layout();
  const std::size_t bi = std::size_t(pos / L.window_tokens);
  const BlockRef b = bi < s.win.size() ? s.win[bi] : BlockRef{};
  if (!b.valid()) return nullptr;
  const int64_t slot = int64_t(layer) * L.window_tokens + pos % L.window_tokens;
  const uint8_t* d = kv->data(b);
  RowTag t;
  std::memcpy(&t, d + L.window_tag_off + slot * int64_t(sizeof(RowTag)), sizeof t);
  // Rows below what the sequence attached from the prefix cache are their writer's; every other
  // row must be the reader's own (a table entry carrying another writer is a bug, caught here).
  if (!kv->check(t, pos < s.shared_len ? b.owner : s.tag, b.epoch, pos)) return nullptr;
  return d + slot * L.window_row_bytes;
}

uint8_t* FastModel::Impl::comp_row(fast::SeqState& s, int src, int64_t entry, bool key,
                                   RowTag** tag) {
  const KvLayout::Source& so = kv->layout().sources[std::size_t(src)];
  const int64_t pos = entry * so.ratio;
  const BlockRef b = global_block(s, pos);
  DSV41_CHECK(b.valid() && kv->refs(b.block) == 1);  // never a write into a shared block
  const int64_t e = (pos % kv->layout().global_tokens) / so.ratio;
  *tag = kv->tag_at(b, (key ? so.key_tag_off : so.comp_tag_off) + e * int64_t(sizeof(RowTag)));
  return kv->data(b) + (key ? so.key_off + e * so.key_bytes : so.comp_off + e * so.comp_bytes);
}

const uint8_t* FastModel::Impl::read_comp_row(const fast::SeqState& s, int src, int64_t entry,
                                              bool key) const {
  const KvLayout& L = kv->layout();
  const KvLayout::Source& so = L.sources[std::size_t(src)];
  const int64_t pos = entry * so.ratio;
  const std::size_t bi = std::size_t(pos / L.global_tokens);
  const BlockRef b = bi < s.glob.size() ? s.glob[bi] : BlockRef{};
  if (!b.valid()) return nullptr;
  const int64_t e = (pos % L.global_tokens) / so.ratio;
  const uint8_t* d = kv->data(b);
  RowTag t;
  std::memcpy(&t, d + (key ? so.key_tag_off : so.comp_tag_off) + e * int64_t(sizeof(RowTag)),
              sizeof t);
  // Rows below what the sequence attached from the prefix cache are their writer's; every other
  // row must be the reader's own (a table entry carrying another writer is a bug, caught here).
  if (!kv->check(t, pos < s.shared_len ? b.owner : s.tag, b.epoch, pos)) return nullptr;
  return d + (key ? so.key_off + e * so.key_bytes : so.comp_off + e * so.comp_bytes);
}

// Scratch for rows.size() tokens (grows only), and each row's token embedded into every residual
// copy with the one-hot first pre-mix.
void FastModel::Impl::embed_rows() {
  const int64_t D = cfg.text.hidden_size, HC = cfg.text.hc_mult, n = int64_t(rows.size());
  auto grow = [](std::vector<float>& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  grow(hs, n * HC * D);
  grow(h1s, n * HC * D);
  grow(pre, n * HC);
  grow(pre_a, n * HC);
  grow(mix_post, n * HC);
  grow(mix_comb, n * HC * HC);
  grow(xs, n * D);
  grow(ys, n * D);
  for (int64_t t = 0; t < n; ++t) {
    float* ht = hs.data() + t * HC * D;
    const uint16_t* e = embed + int64_t(rows[std::size_t(t)].token) * D;
    for (int64_t i = 0; i < D; ++i) ht[i] = bf16_to_float(e[i]);
    for (int64_t j = 1; j < HC; ++j) std::copy_n(ht, D, ht + j * D);
    std::fill_n(pre.data() + t * HC, HC, 0.0f);
    pre[std::size_t(t * HC)] = 1.0f;
  }
}

void FastModel::Impl::merge_images(const StepBatch& batch) {
  const int64_t D = cfg.text.hidden_size, HC = cfg.text.hc_mult;
  int64_t t0 = 0;  // the slice's first row
  for (const SeqSlice& sl : batch.slices) {
    for (const SliceImage& img : sl.images) {
      for (int64_t i = 0; i < img.in_slice(); ++i) {
        float* ht = hs.data() + (t0 + img.start + i) * HC * D;
        const float* src = nullptr;
        switch (rows[std::size_t(t0 + img.start + i)].kind) {
          case SpanKind::kImageStart:
            src = image_start.data();
            break;
          case SpanKind::kImageNewline:
            src = image_newline.data();
            break;
          case SpanKind::kImageEnd:
            src = image_end.data();
            break;
          default:
            src = img.rows->data() + image_row_of(img.first + i, img.llm_w, img.span()) * D;
        }
        for (int64_t j = 0; j < HC; ++j) std::copy_n(src, D, ht + j * D);
      }
    }
    t0 += int64_t(sl.tokens.size());
  }
}

void FastModel::Impl::mhc_attention_input(const fast::LayerW& w, int64_t t) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, HC = tc.hc_mult;
  const float eps = float(tc.rms_norm_eps);
  float* ht = hs.data() + t * HC * D;
  kern->hc_mix(ht, HC, D, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, eps, float(tc.hc_eps),
               tc.hc_sinkhorn_iters, pre_a.data() + t * HC, mix_post.data() + t * HC,
               mix_comb.data() + t * HC * HC);
  kern->hc_collapse_rmsnorm(ht, pre.data() + t * HC, HC, D, w.attn_norm.data(), eps,
                            xs.data() + t * D);
}

void FastModel::Impl::mhc_ffn_input(const fast::LayerW& w, int64_t t) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, HC = tc.hc_mult;
  const float eps = float(tc.rms_norm_eps);
  float* ht = hs.data() + t * HC * D;
  float* h1t = h1s.data() + t * HC * D;
  float* post = mix_post.data() + t * HC;
  float* comb = mix_comb.data() + t * HC * HC;
  kern->hc_expand(ys.data() + t * D, ht, post, comb, HC, D, h1t);
  kern->hc_mix(h1t, HC, D, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, eps, float(tc.hc_eps),
               tc.hc_sinkhorn_iters, pre.data() + t * HC, post, comb);
  kern->hc_collapse_rmsnorm(h1t, pre_a.data() + t * HC, HC, D, w.ffn_norm.data(), eps,
                            xs.data() + t * D);
}

// The ffn mix was computed into mix_post/mix_comb by mhc_ffn_input, after attention's expand had
// consumed the attention mix.
void FastModel::Impl::mhc_ffn_output(int64_t t) {
  const int64_t D = cfg.text.hidden_size, HC = cfg.text.hc_mult;
  kern->hc_expand(ys.data() + t * D, h1s.data() + t * HC * D, mix_post.data() + t * HC,
                  mix_comb.data() + t * HC * HC, HC, D, hs.data() + t * HC * D);
}

int64_t FastModel::Impl::compact_rows(const std::vector<uint8_t>& keep) {
  const TextConfig& tc = cfg.text;
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, n = int64_t(rows.size());
  const int64_t nt = int64_t(tc.dspark_target_layer_ids.size());
  int64_t k = 0;
  for (int64_t t = 0; t < n; ++t) {
    replay_index[std::size_t(t)] = keep[std::size_t(t)] ? k : -1;
    if (!keep[std::size_t(t)]) continue;
    if (k != t) {  // k < t: moving down never overwrites a row still to be moved
      rows[std::size_t(k)] = rows[std::size_t(t)];
      std::copy_n(hs.data() + t * HC * D, HC * D, hs.data() + k * HC * D);
      std::copy_n(pre.data() + t * HC, HC, pre.data() + k * HC);
      std::copy_n(pre_a.data() + t * HC, HC, pre_a.data() + k * HC);
      std::copy_n(mix_post.data() + t * HC, HC, mix_post.data() + k * HC);
      std::copy_n(mix_comb.data() + t * HC * HC, HC * HC, mix_comb.data() + k * HC * HC);
      std::copy_n(xs.data() + t * D, D, xs.data() + k * D);
      // Selections and candidate pools too: a layer after the split may read a pool a layer
      // before it published (none does in the released config, where the split layer publishes).
      sel[std::size_t(k)].swap(sel[std::size_t(t)]);
      cand[std::size_t(k)].swap(cand[std::size_t(t)]);
      if (opt.dspark)
        std::copy_n(main_hidden.data() + t * nt * D, nt * D, main_hidden.data() + k * nt * D);
    }
    ++k;
  }
  rows.resize(std::size_t(k));
  return k;
}

void FastModel::set_prefill_attention(bool on) {
  impl_->prefill_attention_on = on;
}

int64_t FastModel::replay_margin() const {
  const Impl& im = *impl_;
  if (im.opt.replay_margin != FastOptions::kReplayMarginExact) return im.opt.replay_margin;
  if (im.replay_split < 0) return 0;
  const int64_t decoders = int64_t(im.plan.num_backbone) - im.replay_split;
  return (decoders - 1) * std::max<int64_t>(0, im.cfg.text.sliding_window - 1);
}

Status FastModel::set_decoder_replay(bool on) {
  if (on && impl_->replay_split < 0)
    return Status::error(
        "--decoder-replay on: this config has no split layer (a layer with compress ratio 1 "
        "after which no layer owns compressed KV): every layer's output is needed for every token");
  impl_->replay_on = on;
  return Status::ok();
}

// ---- the step ----

Status FastModel::step(const StepBatch& batch, StepOutput* out) {
  Impl& im = *impl_;
  const TextConfig& tc = im.cfg.text;
  DSV41_RETURN_IF_ERROR(
      check_step_batch(batch, vocab_size(), max_context(), [&](SeqId id) { return length(id); }));
  for (std::size_t i = 0; i < batch.slices.size(); ++i)
    DSV41_RETURN_IF_ERROR(
        check_slice_images(batch.slices[i], i, int32_t(im.cfg.image_token_id), tc.hidden_size));
  ++im.count_epoch;
  for (std::size_t i = 0; i < batch.slices.size(); ++i) {
    const auto& taps = batch.slices[i].taps;
    for (std::size_t k = 0; k < taps.size(); ++k)
      if (taps[k] < 0 || taps[k] >= im.plan.num_backbone || (k > 0 && taps[k] <= taps[k - 1]))
        return Status::error("slice " + std::to_string(i) +
                             ": taps must be ascending backbone layers in [0, " +
                             std::to_string(im.plan.num_backbone) + ")");
  }
  // Blocks first: a step that cannot get its blocks changes nothing.
  int64_t need = 0;
  for (const auto& sl : batch.slices) {
    const fast::SeqState& s = *im.seqs.at(sl.seq);
    need += im.blocks_needed(s, s.len + int64_t(sl.tokens.size()));
  }
  if (need > kv_blocks_free())
    return Status::error("KV cache full: the step needs " + std::to_string(need) +
                         " more blocks, " + std::to_string(kv_blocks_free()) +
                         " are free (raise --kv-cache-gb)");
  for (const auto& sl : batch.slices) {
    fast::SeqState& s = *im.seqs.at(sl.seq);
    im.reserve_blocks(s, s.len + int64_t(sl.tokens.size()));
  }
  const int64_t D = tc.hidden_size, HC = tc.hc_mult, n = batch.tokens();
  im.rows.clear();
  for (std::size_t si = 0; si < batch.slices.size(); ++si) {
    const SeqSlice& sl = batch.slices[si];
    fast::SeqState& s = *im.seqs.at(sl.seq);
    const std::size_t r0 = im.rows.size();
    for (std::size_t t = 0; t < sl.tokens.size(); ++t) {
      im.rows.push_back({&s, sl.first_pos + int64_t(t), sl.tokens[t], int(si), int(t)});
      s.tokens.push_back(sl.tokens[t]);
    }
    for (const SliceImage& img : sl.images)
      for (int64_t i = 0; i < img.in_slice(); ++i) {  // span position img.first + i
        const int64_t p = img.first + i;
        im.rows[r0 + std::size_t(img.start + i)].kind =
            span_position_kind(p, img.llm_w, img.span());
        // The cache's chains key the span by the image (every position's id is image_token_id);
        // an unkeyed image keeps its sequence out of the cache.
        s.tokens[s.tokens.size() - sl.tokens.size() + std::size_t(img.start + i)] =
            image_key_token(img.key, p);
        if (img.key == 0) s.cacheable = false;
      }
    // Image positions are dead in the Engram history.
    for (std::size_t t = 0; t < sl.tokens.size(); ++t)
      s.history.push_back(im.rows[r0 + t].kind == SpanKind::kText
                              ? im.cmap[std::size_t(sl.tokens[t])]
                              : kEngramDead);
  }
  auto grow = [](std::vector<float>& v, int64_t sz) {
    if (int64_t(v.size()) < sz) v.resize(std::size_t(sz));
  };
  im.embed_rows();
  im.merge_images(batch);
  const int64_t n_targets = int64_t(tc.dspark_target_layer_ids.size());
  if (im.opt.dspark) grow(im.main_hidden, n * n_targets * D);
  if (int64_t(im.sel.size()) < n) im.sel.resize(std::size_t(n));
  if (int64_t(im.cand.size()) < n) im.cand.resize(std::size_t(n));
  // Selection scratch sized by the blocks the step's sequences hold, so a decode-sized step
  // allocates only when one of its sequences has just taken a new global block.
  if (n <= kDecodeScratchTokens) {
    std::size_t cap = 0;
    for (const auto& sl : batch.slices)
      cap = std::max(cap,
                     im.seqs.at(sl.seq)->glob.size() * std::size_t(im.kv->layout().global_tokens));
    for (int64_t t = 0; t < n; ++t) {
      im.sel[std::size_t(t)].reserve(std::min(cap, std::size_t(tc.index_topk)));
      im.cand[std::size_t(t)].reserve(cap);
    }
    if (im.scores.size() < cap) im.scores.resize(cap);
    if (im.bscore.size() < cap) im.bscore.resize(cap);
  }
  out->slices.resize(batch.slices.size());
  for (std::size_t si = 0; si < batch.slices.size(); ++si) {
    const SeqSlice& sl = batch.slices[si];
    out->slices[si].logits.resize(sl.logits_rows.size() * std::size_t(tc.vocab_size));
    out->slices[si].taps.resize(sl.taps.size());
    for (auto& tp : out->slices[si].taps) tp.resize(sl.tokens.size() * std::size_t(D));
  }
  // Decoder replay: which rows the decoder layers run on (a slice longer than window + margin:
  // its last window + margin rows), decided before the layers.
  const int64_t replay_len = tc.sliding_window + replay_margin();
  auto replayed = [&](const SeqSlice& sl) {
    return im.replay_on && int64_t(sl.tokens.size()) > replay_len && !sl.full_stack;
  };
  std::vector<uint8_t>& keep = im.replay_keep;
  bool replay_step = false;
  if (im.replay_on) {
    keep.assign(std::size_t(n), 1);
    int64_t t0r = 0;
    for (const auto& sl : batch.slices) {
      const int64_t len = int64_t(sl.tokens.size());
      if (replayed(sl)) {
        std::fill_n(keep.begin() + t0r, len - replay_len, uint8_t(0));
        replay_step = true;
      }
      t0r += len;
    }
  }
  int64_t n_cur = n;  // rows the layers run on (fewer from the split layer on, when replaying)
  im.replay_index.resize(std::size_t(n));
  for (int64_t t = 0; t < n; ++t) im.replay_index[std::size_t(t)] = t;
  // Vendor index keys: the sources that publish in this step, per sequence (spec §5.6.7).
  const float eps = float(tc.rms_norm_eps);
  const ops::Kernels& kk = *im.kern;
  for (int l = 0; l < im.plan.num_backbone; ++l) {
    const LayerPlan& p = im.plan.layers[std::size_t(l)];
    const fast::LayerW& w = im.layers[std::size_t(l)];
    const bool split_here = replay_step && l == im.replay_split;
    im.stats.weight_bytes += 2 * tc.hc_mix() * HC * D * 4;  // hc_attn_fn, hc_ffn_fn (F32)
    if (p.is_kv_source())
      for (const auto& sl : batch.slices)
        for (int64_t P = sl.first_pos; P < sl.first_pos + int64_t(sl.tokens.size()); ++P)
          if ((P + 1) % p.compress_ratio == 0) im.seqs.at(sl.seq)->vendor_slot = l;
    // The attention input of every row (and, at the split layer when replaying, the compressor
    // and index keys of every row), then the rows the rest of the layer runs on.
    for (int64_t c0 = 0; c0 < n_cur; c0 += Impl::kChunk) {
      const int64_t cn = std::min(Impl::kChunk, n_cur - c0);
      if (p.engram >= 0) im.engram_chunk(p, w, c0, cn);
      for (int64_t t = c0; t < c0 + cn; ++t) {
        float* ht = im.hs.data() + t * HC * D;
        const fast::TokenRow& row = im.rows[std::size_t(t)];
        const SeqSlice& sl = batch.slices[std::size_t(row.slice)];
        for (std::size_t k = 0; k < sl.taps.size(); ++k)
          if (sl.taps[k] == l)
            fast::mean_copies(
                ht, HC, D,
                out->slices[std::size_t(row.slice)].taps[k].data() + row.row_in_slice * D);
        if (im.opt.dspark && im.dspark.target_slot[std::size_t(l)] >= 0)  // main_hidden
          fast::mean_copies(
              ht, HC, D,
              im.main_hidden.data() + (t * n_targets + im.dspark.target_slot[std::size_t(l)]) * D);
        im.mhc_attention_input(w, t);
      }
      if (split_here) {
        im.attention_chunk(p, w, c0, cn, Impl::AttnPart::kCompressorOnly);
        continue;
      }
      im.attention_chunk(p, w, c0, cn);  // xs -> ys
      for (int64_t t = c0; t < c0 + cn; ++t) im.mhc_ffn_input(w, t);
    }
    if (split_here) {
      // The decoder from here on: only the kept rows, each replayed sequence's decoder windows
      // floored at its first kept row.
      for (const auto& sl : batch.slices) {
        const int64_t len = int64_t(sl.tokens.size());
        if (replayed(sl)) {
          im.seqs.at(sl.seq)->dec_floor = sl.first_pos + len - replay_len;
          ++im.stats.replayed_slices;
          im.stats.replay_skipped_rows += len - replay_len;
        }
      }
      n_cur = im.compact_rows(keep);
      for (int64_t c0 = 0; c0 < n_cur; c0 += Impl::kChunk) {
        const int64_t cn = std::min(Impl::kChunk, n_cur - c0);
        im.attention_chunk(p, w, c0, cn, Impl::AttnPart::kNoCompressor);
        for (int64_t t = c0; t < c0 + cn; ++t) im.mhc_ffn_input(w, t);
      }
    }
    // The attention mix ran on every row of the layer's start, the ffn mix on the kept ones.
    im.stats.macs += tc.hc_mix() * HC * D * ((split_here ? n : n_cur) + n_cur);
    im.moe(p, w, n_cur);  // x -> y for every row, grouped by expert
    for (int64_t t = 0; t < n_cur; ++t) im.mhc_ffn_output(t);
  }
  if (im.opt.dspark) im.dspark_rows(n_cur);
  // Head: the rows the slices want, up to kChunk at a time through the batch kernel.
  const int64_t V = tc.vocab_size;
  std::size_t nwant = 0;
  for (const auto& sl : batch.slices) nwant += sl.logits_rows.size();
  grow(im.gx, std::min<int64_t>(int64_t(nwant), Impl::kChunk) * D);
  grow(im.gy, std::min<int64_t>(int64_t(nwant), Impl::kChunk) * V);
  int64_t t0 = 0, pending = 0;
  std::size_t want_slice[Impl::kChunk], want_row[Impl::kChunk];
  auto flush = [&] {
    if (pending == 0) return;
    im.linear_batch(im.head, im.gx.data(), pending, im.gy.data());
    for (int64_t k = 0; k < pending; ++k)
      std::copy_n(im.gy.data() + k * V, V,
                  out->slices[want_slice[k]].logits.data() + want_row[k] * std::size_t(V));
    pending = 0;
  };
  for (std::size_t si = 0; si < batch.slices.size(); ++si) {
    const SeqSlice& sl = batch.slices[si];
    for (std::size_t r = 0; r < sl.logits_rows.size(); ++r) {
      const int64_t t = im.replay_index[std::size_t(t0 + sl.logits_rows[r])];
      if (t < 0) {  // a row the decoder did not run on (replay): no logits
        std::fill_n(out->slices[si].logits.data() + r * std::size_t(V), V,
                    std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      kk.hc_collapse_rmsnorm(im.hs.data() + t * HC * D, im.pre.data() + t * HC, HC, D,
                             im.norm.data(), eps, im.gx.data() + pending * D);
      want_slice[pending] = si;
      want_row[pending] = r;
      if (++pending == Impl::kChunk) flush();
    }
    t0 += int64_t(sl.tokens.size());
  }
  flush();
  for (const auto& sl : batch.slices) {
    fast::SeqState& s = *im.seqs.at(sl.seq);
    s.len += int64_t(sl.tokens.size());
    im.register_prefix(s);  // before the old window blocks go: a cache entry keeps its window
    im.release_old_window(s);
  }
  ++im.stats.steps;
  im.stats.tokens += n;
  return Status::ok();
}

}  // namespace dsv41
